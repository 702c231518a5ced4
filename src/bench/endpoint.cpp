#include "bench/endpoint.h"

#include <fmt/format.h>

#include <chrono>

#include "bench/http_client.h"
#include "bench/runner.h"
#include "core/error.h"
#include "format/tokenizer.h"

namespace moetier {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// One completion request of workload w; prompt ids when random.
json request_body(const EndpointOptions& o, const Workload& w, const std::vector<int32_t>& ids) {
  json b = {{"max_tokens", w.gen_tokens},
            {"stream", true},
            {"temperature", 0},
            {"ignore_eos", true},
            {"n_predict", w.gen_tokens},
            {"seed", o.seed},
            {"stream_options", {{"include_usage", true}}}};
  if (!o.model.empty()) b["model"] = o.model;
  if (ids.empty())
    b["prompt"] = w.text;
  else
    b["prompt"] = ids;
  return b;
}

json one_run(const EndpointOptions& o, const Url& u, const std::string& path, const Workload& w,
             const std::vector<int32_t>& ids, int64_t local_prompt_tokens) {
  SseTimer sse;
  const std::string body = request_body(o, w, ids).dump();
  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const HttpResponse r = http_post(
      u, path, body,
      [&](std::string_view d) {
        sse.feed(d, since());
        return !sse.done();
      },
      o.timeout_s);
  check(r.status == 200, "{}{}: HTTP {}: {}", o.url, path, r.status, r.body.substr(0, 200));
  check(sse.error().empty(), "{}{}: {}", o.url, path, sse.error());
  check(sse.events() > 0, "{}{}: the stream carried no tokens", o.url, path);
  json run = {{"ttft_s", sse.first_s()}};
  int64_t gen = sse.events();
  int64_t prompt = local_prompt_tokens;
  if (sse.usage().is_object()) {
    gen = sse.usage().value("completion_tokens", gen);
    prompt = sse.usage().value("prompt_tokens", prompt);
  }
  run["gen_tokens"] = gen;
  if (prompt > 0) run["prompt_tokens"] = prompt, run["prompt_tps"] = double(prompt) / sse.first_s();
  if (gen > 1 && sse.last_s() > sse.first_s())
    run["decode_tps"] = double(gen - 1) / (sse.last_s() - sse.first_s());
  return run;
}

}  // namespace

void SseTimer::feed(std::string_view bytes, double t_s) {
  buf_.append(bytes);
  size_t end;
  while (!done_ && (end = buf_.find("\n\n")) != std::string::npos) {
    std::string ev = buf_.substr(0, end);
    buf_.erase(0, end + 2);
    for (size_t p = 0; p < ev.size();) {
      size_t nl = ev.find('\n', p);
      if (nl == std::string::npos) nl = ev.size();
      std::string line = ev.substr(p, nl - p);
      p = nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) != 0) continue;
      const std::string data = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      if (data == "[DONE]") {
        done_ = true;
        break;
      }
      const json j = json::parse(data, nullptr, false);
      if (j.is_discarded()) {
        error_ = "a streamed event is not JSON: " + data.substr(0, 80);
        done_ = true;
        break;
      }
      if (j.contains("error")) error_ = j["error"].dump().substr(0, 200);
      if (j.contains("usage") && j["usage"].is_object()) usage_ = j["usage"];
      const json* ch = j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()
                           ? &j["choices"][0]
                           : nullptr;
      std::string text;
      if (ch && ch->contains("text") && (*ch)["text"].is_string()) text = (*ch)["text"];
      if (!text.empty()) {
        if (events_++ == 0) first_ = t_s;
        last_ = t_s;
      }
    }
  }
}

namespace {
std::string completions_path(const Url& u) {
  return u.path.size() >= 3 && u.path.substr(u.path.size() - 3) == "/v1" ? "/completions"
                                                                         : "/v1/completions";
}
}  // namespace

std::string endpoint_complete(const EndpointOptions& o, const std::string& prompt,
                              int64_t max_tokens) {
  const Url u = parse_url(o.url);
  const std::string path = completions_path(u);
  json b = {{"prompt", prompt},
            {"max_tokens", max_tokens},
            {"n_predict", max_tokens},
            {"temperature", 0},
            {"stream", false}};
  if (!o.model.empty()) b["model"] = o.model;
  const HttpResponse r = http_post(u, path, b.dump(), {}, o.timeout_s);
  check(r.status == 200, "{}{}: HTTP {}: {}", o.url, path, r.status, r.body.substr(0, 200));
  const json j = json::parse(r.body, nullptr, false);
  check(!j.is_discarded() && j.contains("choices") && j["choices"].is_array() &&
            !j["choices"].empty() && j["choices"][0].contains("text"),
        "{}{}: a completion without choices[0].text", o.url, path);
  return j["choices"][0]["text"].get<std::string>();
}

json run_endpoint(const EndpointOptions& o) {
  const Url u = parse_url(o.url);
  const std::string path = completions_path(u);
  json arm = {{"name", o.name.empty() ? "endpoint " + o.url : o.name},
              {"engine", "endpoint"},
              {"version", o.url},
              {"flags", o.model.empty() ? "" : "model=" + o.model}};
  json wls = json::array();
  for (const Workload& w : o.workloads) {
    std::vector<int32_t> ids;
    int64_t local = 0;
    if (w.text.empty()) {
      check(o.vocab > 0, "workload {}: a random prompt needs token ids: pass DIR (its vocabulary)",
            w.name);
      ids = prompt_ids(w, nullptr, o.vocab, o.seed);
      local = int64_t(ids.size());
    } else if (o.tok) {
      local = int64_t(o.tok->encode(w.text).size());
    }
    json wl = {{"name", w.name}, {"gen_tokens", w.gen_tokens}};
    if (local > 0) wl["prompt_tokens"] = local;
    std::vector<json> runs;
    for (int r = 0; r < o.runs; ++r) {
      json run = one_run(o, u, path, w, ids, local);
      run["cold"] = r == 0;
      if (o.on_result)
        o.on_result(fmt::format("{} run {}/{}: ttft {:.3f} s, decode {:.2f} tok/s", w.name, r + 1,
                                o.runs, run["ttft_s"].get<double>(), run.value("decode_tps", 0.0)));
      runs.push_back(std::move(run));
    }
    summarize_runs(wl, runs);
    wl["runs"] = runs;
    wls.push_back(std::move(wl));
  }
  arm["workloads"] = std::move(wls);
  return arm;
}

}  // namespace moetier
