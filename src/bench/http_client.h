// A minimal HTTP/1.1 client for `moetier bench --endpoint`: plain http:// to a
// host:port (no TLS), one request per connection, the response body handed
// to a callback as it arrives (chunked transfer decoded), so a streaming
// (server-sent events) response can be timed token by token.
//
// Errors (bad URL, connection refused, timeouts, a malformed response) throw
// Error with one line naming the URL. Not thread-safe; blocking.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace moetier {

struct Url {
  std::string host;
  int port = 80;
  std::string path;  // "/v1" (no trailing slash), "" for the root
};
// "http://HOST[:PORT][/PATH]"; throws Error naming what is wrong.
Url parse_url(std::string_view url);

struct HttpResponse {
  int status = 0;
  std::string body;  // the whole body when no callback consumed it
};

// POSTs `body` (application/json) to url.path + path. on_data gets the body's
// bytes as they arrive (return false to stop reading); without it the body is
// collected. timeout_s bounds every wait for the server.
HttpResponse http_post(const Url& url, const std::string& path, const std::string& body,
                       const std::function<bool(std::string_view)>& on_data = {},
                       double timeout_s = 600);

}  // namespace moetier
