// `moetier bench --endpoint URL`: the same workloads driven through any
// OpenAI-compatible server (llama-server, vLLM, moetier's own later) over
// streaming /v1/completions, greedy (temperature 0) with end-of-sequence
// ignored where the server honours `ignore_eos`. Per run: TTFT (request to
// the first streamed token), decode tok/s (tokens after the first over the
// time from the first to the last), prompt tok/s (prompt tokens / TTFT) when
// the server reports usage. The result is an arm of docs/bench-format.md
// with engine "endpoint". Single-threaded, blocking.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/workloads.h"

namespace moetier {

class Tokenizer;

struct EndpointOptions {
  std::string url;    // http://HOST:PORT[/v1]
  std::string model;  // the request's "model" ("" : the server's default)
  std::string name;   // the arm's label
  std::vector<Workload> workloads;
  int runs = 3;
  uint32_t seed = 1;
  int64_t vocab = 0;               // for random prompts (token ids); 0: refused
  const Tokenizer* tok = nullptr;  // to count text prompts' tokens locally (optional)
  double timeout_s = 600;
  std::function<void(const std::string&)> on_result;
};

nlohmann::json run_endpoint(const EndpointOptions& opt);
// One greedy completion (not streamed): the text of choices[0].
std::string endpoint_complete(const EndpointOptions& opt, const std::string& prompt,
                              int64_t max_tokens);

// One streamed completion's figures from its server-sent events (exposed for
// tests): feed bytes as they arrive with the time they arrived.
class SseTimer {
 public:
  void feed(std::string_view bytes, double t_s);
  bool done() const { return done_; }
  int64_t events() const { return events_; }              // events that carried text
  double first_s() const { return first_; }               // arrival of the first text
  double last_s() const { return last_; }                 // arrival of the last text
  const nlohmann::json& usage() const { return usage_; }  // null unless sent
  const std::string& error() const { return error_; }

 private:
  std::string buf_;
  bool done_ = false;
  int64_t events_ = 0;
  double first_ = -1, last_ = -1;
  nlohmann::json usage_;
  std::string error_;
};

}  // namespace moetier
