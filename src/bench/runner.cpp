#include "bench/runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "experts/stats.h"
#include "format/safetensors.h"
#include "io/sysinfo.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

#ifndef MOETIER_GIT_COMMIT
#define MOETIER_GIT_COMMIT "unknown"
#endif

namespace moetier {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The counters a run differences.
struct Snap {
  LayerCounters c;
  uint64_t host_copy = 0;
  uint64_t proc_read = 0;
  bool proc_ok = false;
  Clock::time_point t;
  PrefetchCounters pf;
};

Snap snap(const ExpertStats& s) {
  Snap x{s.total(), s.host_copy_bytes, 0, false, Clock::now(), s.prefetch};
  if (auto io = io::process_io()) x.proc_read = io->read_bytes, x.proc_ok = true;
  return x;
}

// posix_fadvise(DONTNEED) on every shard: true when every call succeeded.
bool drop_page_cache(const Checkpoint& ck) {
  bool ok = true;
  for (const Shard& s : ck.shards()) {
    const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      ok = false;
      continue;
    }
    ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 && ok;
    ::close(fd);
  }
  return ok;
}

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;
}

// Seconds per decode token at the bound, from the decode steps' counters: the
// active bytes at the read bandwidth of the weights' memory (every thread's
// reads on a host backend, else the device copy), or the tiers' misses.
double decode_bound_s(const ModelBytes& mb, const Bounds& b, const Snap& d0, const Snap& d1,
                      int64_t steps) {
  const std::optional<double> bw = b.host_read ? b.host_read : b.device_copy;
  double compute = bw ? double(mb.active_per_token) / *bw : 0;
  double tiers = 0;
  if (steps > 0) {
    const double host = double(d1.host_copy - d0.host_copy) / double(steps);
    const double disk = double(d1.c.read_bytes - d0.c.read_bytes) / double(steps);
    if (b.host_to_device && host > 0) tiers += host / *b.host_to_device;
    if (b.storage && disk > 0) tiers += disk / *b.storage;
  }
  return std::max(compute, tiers);
}

json run_json(const LayerCounters& d, const Snap& s0, const Snap& s2) {
  json r;
  r["expert_uses"] = d.uses;
  r["expert_reads"] = d.misses;
  r["expert_read_bytes"] = d.read_bytes;
  r["host_tier_bytes"] = s2.host_copy - s0.host_copy;
  if (s0.proc_ok && s2.proc_ok) r["physical_read_bytes"] = s2.proc_read - s0.proc_read;
  if (d.uses > 0) {
    const double u = double(d.uses);
    r["hit_rate"] = {{"hot", double(d.hits_hot) / u},
                     {"transient", double(d.hits_transient) / u},
                     {"host", double(d.hits_host) / u},
                     {"loading", double(d.hits_loading) / u},
                     {"all", double(d.hits()) / u}};
  }
  r["io_stall_s"] = double(d.stall_ns) * 1e-9;
  const PrefetchCounters &p0 = s0.pf, &p2 = s2.pf;
  if (p2.hints > p0.hints)  // the run's prefetch hints, and what came of them
    r["prefetch"] = {{"hints", p2.hints - p0.hints},
                     {"redundant", p2.redundant - p0.redundant},
                     {"redundant_used", p2.redundant_used - p0.redundant_used},
                     {"issued", p2.issued - p0.issued},
                     {"used", p2.used - p0.used},
                     {"wasted", p2.wasted - p0.wasted}};
  return r;
}

struct RunOut {
  json j;
  double decode_bound_tps = 0;
};

RunOut one_run(Engine& e, const std::vector<int32_t>& ids, const Workload& w, const ModelBytes& mb,
               const Bounds& b, const ArmOptions& opt, const std::string& tag) {
  e.backend().reset_memory_peak();  // this run's peak, its session's KV cache included
  auto session = e.new_session(int64_t(ids.size()) + w.gen_tokens + 1);
  if (opt.on_phase) opt.on_phase("prefill " + tag);
  const auto pred0 = e.backend().expert_predictions();  // (CUDA: predicted experts)
  const Snap s0 = snap(e.stats());
  int32_t next = argmax(session->prefill(ids));
  const Snap s1 = snap(e.stats());
  if (opt.on_phase) opt.on_phase("decode " + tag);
  const int64_t steps = w.gen_tokens - 1;
  session->decode_greedy_run(next, steps, [&](int32_t t) {
    next = t;
    return true;
  });
  e.backend().synchronize();
  const Snap s2 = snap(e.stats());
  RunOut out;
  json& r = out.j;
  LayerCounters d = s2.c;
  d -= s0.c;
  r = run_json(d, s0, s2);
  if (const auto pred2 = e.backend().expert_predictions(); pred0 && pred2) {
    const uint64_t issued = pred2->issued - pred0->issued, used = pred2->used - pred0->used;
    r["expert_prediction"] = {{"issued", issued}, {"used", used}};
    if (issued > 0) r["expert_prediction"]["accuracy"] = double(used) / double(issued);
  }
  const double prefill_s = seconds(s0.t, s1.t), decode_s = seconds(s1.t, s2.t);
  r["ttft_s"] = prefill_s;
  r["prompt_tps"] = double(ids.size()) / prefill_s;
  if (steps > 0) r["decode_tps"] = double(steps) / decode_s;
  r["peak_host_bytes"] = peak_rss_bytes();
  if (const auto m = e.backend().memory_use()) r["peak_device_bytes"] = m->peak;
  const double bound_s = decode_bound_s(mb, b, s1, s2, steps);
  if (bound_s > 0) out.decode_bound_tps = 1.0 / bound_s;
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// median/min/max of `key` over the runs `use` selects; absent when none has it.
void summarize(json& wl, const std::vector<json>& runs, const std::vector<size_t>& use,
               const char* key) {
  std::vector<double> v;
  for (size_t i : use)
    if (runs[i].contains(key)) v.push_back(runs[i][key].get<double>());
  if (v.empty()) return;
  wl["median"][key] = median(v);
  wl["min"][key] = *std::min_element(v.begin(), v.end());
  wl["max"][key] = *std::max_element(v.begin(), v.end());
}

}  // namespace

std::vector<size_t> summarize_runs(json& wl, const std::vector<json>& runs) {
  std::vector<size_t> use;
  for (size_t i = 0; i < runs.size(); ++i)
    if (!runs[i].value("cold", false) || runs.size() == 1) use.push_back(i);
  if (use.empty()) use.push_back(0);
  for (const char* k : {"ttft_s", "prompt_tps", "decode_tps"}) summarize(wl, runs, use, k);
  return use;
}

namespace {

json one_workload(Engine& e, const Tokenizer* tok, const ArmOptions& opt, const Workload& w,
                  const ModelBytes& mb, const Bounds& b, int64_t ctx) {
  const std::vector<int32_t> ids = prompt_ids(w, tok, e.spec().vocab_size, opt.seed);
  const int64_t need = int64_t(ids.size()) + w.gen_tokens;
  check(need <= ctx, "workload {}: prompt {} + {} generated = {} tokens exceed the context {}",
        w.name, ids.size(), w.gen_tokens, need, ctx);
  json wl = {{"name", w.name}, {"prompt_tokens", ids.size()}, {"gen_tokens", w.gen_tokens}};
  std::vector<json> runs;
  std::vector<double> bounds;
  static bool first_run = true;  // of the process: the cold one
  for (int r = 0; r < opt.runs; ++r) {
    const bool cold = first_run;
    bool dropped = false;
    if (cold && opt.drop_page_cache) dropped = drop_page_cache(e.checkpoint());
    first_run = false;
    const std::string tag = fmt::format("{} run {}/{}", w.name, r + 1, opt.runs);
    RunOut o = one_run(e, ids, w, mb, b, opt, tag);
    o.j["cold"] = cold;
    o.j["page_cache_dropped"] = dropped;
    bounds.push_back(o.decode_bound_tps);
    if (opt.on_result)
      opt.on_result(fmt::format("{}: ttft {:.3f} s, prompt {:.1f} tok/s, decode {:.2f} tok/s{}",
                                tag, o.j["ttft_s"].get<double>(), o.j["prompt_tps"].get<double>(),
                                o.j.value("decode_tps", 0.0), cold ? " (cold)" : ""));
    runs.push_back(std::move(o.j));
  }
  const std::vector<size_t> use = summarize_runs(wl, runs);
  std::vector<double> ub;
  for (size_t i : use) ub.push_back(bounds[i]);
  const double dbound = median(ub);
  if (dbound > 0) wl["bound"]["decode_tps"] = dbound;
  if (b.tensor_flops && mb.flops_per_token > 0)
    wl["bound"]["prompt_tps"] = *b.tensor_flops / mb.flops_per_token;
  for (const char* k : {"decode_tps", "prompt_tps"})
    if (wl.contains("bound") && wl["bound"].contains(k) && wl.contains("median") &&
        wl["median"].contains(k))
      wl["fraction_of_bound"][k] = wl["median"][k].get<double>() / wl["bound"][k].get<double>();
  wl["runs"] = runs;
  return wl;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

}  // namespace

json run_arm(Engine& engine, const Tokenizer* tok, const ArmOptions& opt, const ModelBytes& bytes,
             const Bounds& bounds, int64_t ctx) {
  check(opt.runs >= 1, "--runs: {} must be at least 1", opt.runs);
  json arm = {
      {"name", opt.name}, {"engine", "moetier"}, {"version", build_commit()}, {"flags", opt.flags}};
  json wls = json::array();
  for (const Workload& w : opt.workloads)
    wls.push_back(one_workload(engine, tok, opt, w, bytes, bounds, ctx));
  arm["workloads"] = std::move(wls);
  return arm;
}

json machine_json(const std::string& backend_name, uint64_t device_memory) {
  json m = {{"cpu", cpu_model()}, {"cores", std::thread::hardware_concurrency()}};
  if (auto t = io::mem_total_bytes()) m["ram_bytes"] = *t;
  m["backend"] = backend_name;
  m["device_memory_bytes"] = device_memory;
  return m;
}

std::string build_commit() { return MOETIER_GIT_COMMIT; }

}  // namespace moetier
