#include "bench/http_client.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace moetier {
namespace {

// A connected socket, closed at scope exit.
struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

std::string where(const Url& u) { return fmt::format("http://{}:{}{}", u.host, u.port, u.path); }

void connect_to(Socket& s, const Url& u) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(u.host.c_str(), std::to_string(u.port).c_str(), &hints, &res);
  check(rc == 0, "{}: cannot resolve {}: {}", where(u), u.host, gai_strerror(rc));
  int err = 0;
  for (addrinfo* a = res; a; a = a->ai_next) {
    s.fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (s.fd >= 0 && ::connect(s.fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = errno;
    if (s.fd >= 0) ::close(s.fd), s.fd = -1;
  }
  ::freeaddrinfo(res);
  check(s.fd >= 0, "{}: cannot connect: {}", where(u), std::strerror(err));
}

void send_all(const Socket& s, const Url& u, const std::string& data) {
  for (size_t off = 0; off < data.size();) {
    const ssize_t n = ::send(s.fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    check(n > 0, "{}: send failed: {}", where(u), std::strerror(errno));
    off += size_t(n);
  }
}

// Reads more bytes into buf; false at end of stream. Throws on timeout/error.
bool read_more(const Socket& s, const Url& u, std::string& buf, double timeout_s) {
  pollfd p{s.fd, POLLIN, 0};
  const int r = ::poll(&p, 1, int(timeout_s * 1000));
  check(r > 0, "{}: {} waiting for the server", where(u),
        r == 0 ? fmt::format("timed out after {:g} s", timeout_s) : std::strerror(errno));
  char tmp[16384];
  const ssize_t n = ::recv(s.fd, tmp, sizeof tmp, 0);
  check(n >= 0, "{}: receive failed: {}", where(u), std::strerror(errno));
  buf.append(tmp, size_t(n));
  return n > 0;
}

// Decodes chunked transfer from `buf` (bytes after the headers), reading more
// as needed; passes each chunk's data to out.
void read_chunked(const Socket& s, const Url& u, std::string& buf, double t,
                  const std::function<bool(std::string_view)>& out) {
  for (;;) {
    size_t eol;
    while ((eol = buf.find("\r\n")) == std::string::npos)
      check(read_more(s, u, buf, t), "{}: the response ended inside a chunk header", where(u));
    size_t len = 0;
    try {
      len = std::stoul(buf.substr(0, eol), nullptr, 16);
    } catch (const std::exception&) {
      throw Error(fmt::format("{}: bad chunk size '{}'", where(u), buf.substr(0, eol)));
    }
    if (len == 0) return;
    while (buf.size() < eol + 2 + len + 2)
      check(read_more(s, u, buf, t), "{}: the response ended inside a chunk", where(u));
    if (!out(std::string_view(buf).substr(eol + 2, len))) return;
    buf.erase(0, eol + 2 + len + 2);
  }
}

}  // namespace

Url parse_url(std::string_view url) {
  const std::string_view scheme = "http://";
  check(url.substr(0, scheme.size()) == scheme,
        "--endpoint {}: only http://HOST[:PORT][/PATH] is supported", url);
  std::string_view rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  Url u;
  if (slash != std::string_view::npos) u.path = std::string(rest.substr(slash));
  while (!u.path.empty() && u.path.back() == '/') u.path.pop_back();
  const size_t colon = hostport.rfind(':');
  u.host = std::string(hostport.substr(0, colon));
  if (colon != std::string_view::npos) {
    const std::string p(hostport.substr(colon + 1));
    check(!p.empty() && p.find_first_not_of("0123456789") == std::string::npos && p.size() < 6 &&
              std::stoi(p) > 0 && std::stoi(p) < 65536,
          "--endpoint {}: bad port '{}'", url, p);
    u.port = std::stoi(p);
  }
  check(!u.host.empty(), "--endpoint {}: no host", url);
  return u;
}

HttpResponse http_post(const Url& u, const std::string& path, const std::string& body,
                       const std::function<bool(std::string_view)>& on_data, double t) {
  Socket s;
  connect_to(s, u);
  send_all(s, u,
           fmt::format("POST {}{} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\n"
                       "Accept: text/event-stream, application/json\r\nContent-Length: {}\r\n"
                       "Connection: close\r\n\r\n{}",
                       u.path, path, u.host, u.port, body.size(), body));
  std::string buf;
  size_t end;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos)
    check(read_more(s, u, buf, t), "{}: the connection closed before the response headers",
          where(u));
  const std::string head = buf.substr(0, end);
  buf.erase(0, end + 4);
  HttpResponse r;
  check(head.rfind("HTTP/1.", 0) == 0 && head.size() > 12, "{}: not an HTTP response", where(u));
  r.status = std::atoi(head.c_str() + 9);
  std::string lower = head;
  for (char& c : lower) c = char(std::tolower(uint8_t(c)));
  const bool chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
  auto out = [&](std::string_view d) {
    if (on_data && r.status == 200) return on_data(d);
    r.body.append(d);
    return true;
  };
  if (chunked) {
    read_chunked(s, u, buf, t, out);
  } else {
    bool more = out(buf);
    while (more) {
      buf.clear();
      if (!read_more(s, u, buf, t)) break;
      more = out(buf);
    }
  }
  return r;
}

}  // namespace moetier
