#include "experts/stats.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/units.h"
#include "io/sysinfo.h"

namespace moetier {

LayerCounters& LayerCounters::operator-=(const LayerCounters& o) {
  uses -= o.uses;
  hits_hot -= o.hits_hot;
  hits_transient -= o.hits_transient;
  hits_host -= o.hits_host;
  hits_loading -= o.hits_loading;
  misses -= o.misses;
  read_bytes -= o.read_bytes;
  hot_evictions -= o.hot_evictions;
  ring_evictions -= o.ring_evictions;
  steps -= o.steps;
  all_hit_steps -= o.all_hit_steps;
  stall_ns -= o.stall_ns;
  return *this;
}

LayerCounters& LayerCounters::operator+=(const LayerCounters& o) {
  uses += o.uses;
  hits_hot += o.hits_hot;
  hits_transient += o.hits_transient;
  hits_host += o.hits_host;
  hits_loading += o.hits_loading;
  misses += o.misses;
  read_bytes += o.read_bytes;
  hot_evictions += o.hot_evictions;
  ring_evictions += o.ring_evictions;
  steps += o.steps;
  all_hit_steps += o.all_hit_steps;
  stall_ns += o.stall_ns;
  return *this;
}

namespace {
double share(uint64_t a, uint64_t b) { return b ? double(a) / double(b) : 0.0; }

template <typename... A>
void appendln(std::string& s, fmt::format_string<A...> f, A&&... a) {
  s += fmt::format(f, std::forward<A>(a)...);
  s += '\n';
}
}  // namespace

nlohmann::json LayerCounters::to_json() const {
  nlohmann::json j;
  j["uses"] = uses;
  j["hits"] = {{"hot", hits_hot},
               {"transient", hits_transient},
               {"host", hits_host},
               {"loading", hits_loading}};
  j["misses"] = misses;
  j["hit_rate"] = share(hits(), uses);
  j["reads"] = {{"count", misses}, {"bytes", read_bytes}};
  j["evictions"] = {{"hot", hot_evictions}, {"transient", ring_evictions}};
  j["steps"] = steps;
  j["all_hit_steps"] = all_hit_steps;
  j["all_hit_share"] = steps ? nlohmann::json(share(all_hit_steps, steps)) : nlohmann::json();
  j["stall_s"] = double(stall_ns) * 1e-9;
  return j;
}

bool PrefetchCounters::count_in_device(int32_t staged, std::span<const int32_t> ids) {
  if (staged > -2) return false;
  ++hints, ++redundant;
  if (std::find(ids.begin(), ids.end(), -2 - staged) != ids.end()) ++redundant_used;
  return true;
}

nlohmann::json PrefetchCounters::to_json() const {
  return {{"hints", hints},
          {"redundant", redundant},
          {"redundant_used", redundant_used},
          {"dropped", dropped},
          {"issued", issued},
          {"read_bytes", read_bytes},
          {"used", used},
          {"late", late},
          {"wasted", wasted},
          {"failed", failed},
          {"accuracy", issued ? nlohmann::json(share(used, issued)) : nlohmann::json()},
          {"load_s", double(load_ns) * 1e-9},
          {"wait_s", double(wait_ns) * 1e-9},
          {"stall_saved_s", double(saved_ns()) * 1e-9}};
}

LayerCounters ExpertStats::total() const {
  LayerCounters t;
  for (const auto& l : layers) t += l;
  return t;
}

void ExpertStats::record(int64_t layer, const Plan& p,
                         const std::function<uint64_t(ExpertKey)>& bytes_of) {
  check(layer >= 0 && size_t(layer) < layers.size(), "expert stats: layer {} out of range", layer);
  LayerCounters& c = layers[size_t(layer)];
  for (const PlanStep& st : p.steps) {
    ++c.uses;
    prefetch.used += st.prefetched;
    prefetch.late += st.prefetched && st.in_flight;
    if (st.in_flight) {
      ++c.hits_loading;
      continue;
    }
    switch (st.found) {
      case Tier::Hot:
        ++c.hits_hot;
        break;
      case Tier::Transient:
        ++c.hits_transient;
        break;
      case Tier::Host:
        ++c.hits_host;
        break;
      case Tier::Storage:
        ++c.misses;
        c.read_bytes += bytes_of(st.key);
        break;
    }
  }
  c.hot_evictions += p.hot_evictions;
  c.ring_evictions += p.ring_evictions;
  prefetch.wasted += p.prefetch_wasted;
}

void ExpertStats::record_prefetch(int64_t layer, uint64_t hints, const Plan& p,
                                  const PrefetchSkips& skips,
                                  const std::function<uint64_t(ExpertKey)>& bytes_of) {
  check(layer >= 0 && size_t(layer) < layers.size(), "expert stats: layer {} out of range", layer);
  LayerCounters& c = layers[size_t(layer)];
  c.hot_evictions += p.hot_evictions;
  c.ring_evictions += p.ring_evictions;
  prefetch.wasted += p.prefetch_wasted;
  prefetch.hints += hints;
  prefetch.redundant += skips.redundant;
  prefetch.dropped += skips.dropped;
  prefetch.issued += p.steps.size();
  for (const PlanStep& st : p.steps)
    if (st.found == Tier::Storage) prefetch.read_bytes += bytes_of(st.key);
}

void ExpertStats::record_step(int64_t layer, bool all_hit) {
  check(layer >= 0 && size_t(layer) < layers.size(), "expert stats: layer {} out of range", layer);
  ++layers[size_t(layer)].steps;
  if (all_hit) ++layers[size_t(layer)].all_hit_steps;
}

void ExpertStats::start_process_io() {
  auto io = io::process_io();
  process_io_ok = io.has_value();
  process_read_bytes_base = io ? io->read_bytes : 0;
  process_read_bytes = 0;
}

void ExpertStats::sample_process_io() {
  if (!process_io_ok) return;
  if (auto io = io::process_io()) process_read_bytes = io->read_bytes - process_read_bytes_base;
}

void ExpertStats::reset_counters() {
  for (auto& l : layers) l = LayerCounters{};
  read_requests = aligned_read_bytes = direct_reads = buffered_reads = 0;
  host_copy_bytes = host_copy_ns = validate_ns = failed_acquires = overlapped_submits = 0;
  prefetch = PrefetchCounters{};
  last_error.clear();
  start_process_io();
}

nlohmann::json ExpertStats::to_json() const {
  nlohmann::json j;
  j["config"] = {{"provider", provider},
                 {"policy", policy},
                 {"reader", reader},
                 {"expert_bytes", expert_bytes},
                 {"slot_bytes", slot_bytes},
                 {"hot_slots", hot_slots},
                 {"transient_slots", transient_slots},
                 {"host_slots", host_slots},
                 {"total_experts", total_experts},
                 {"pinned", pinned},
                 {"setup_s", double(setup_ns) * 1e-9},
                 {"prefault_bytes", prefault_bytes},
                 {"huge_pages", huge_pages}};
  j["total"] = total().to_json();
  nlohmann::json per = nlohmann::json::array();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].uses == 0 && layers[i].steps == 0) continue;
    nlohmann::json l = layers[i].to_json();
    l["layer"] = i;
    per.push_back(std::move(l));
  }
  j["layers"] = std::move(per);
  j["io"] = {{"read_requests", read_requests},
             {"aligned_read_bytes", aligned_read_bytes},
             {"direct_reads", direct_reads},
             {"buffered_reads", buffered_reads},
             {"fallback_files", fallback_files},
             {"fallback_notes", fallback_notes},
             {"host_copy_bytes", host_copy_bytes},
             {"host_copy_s", double(host_copy_ns) * 1e-9},
             {"validate_s", double(validate_ns) * 1e-9},
             {"overlapped_submits", overlapped_submits},
             {"process_read_bytes",
              process_io_ok ? nlohmann::json(process_read_bytes) : nlohmann::json()}};
  j["prefetch"] = prefetch.to_json();
  j["errors"] = {{"failed_acquires", failed_acquires}, {"last_error", last_error}};
  return j;
}

std::string ExpertStats::format() const {
  LayerCounters t = total();
  std::string s;
  appendln(s, "experts: {} provider, policy {}, reader {}", provider, policy, reader);
  appendln(s,
           "  arena: {} hot + {} transient slots of {} ({} per expert); host tier {} slots; {} "
           "experts in the model, {} pinned",
           hot_slots, transient_slots, format_bytes(slot_bytes), format_bytes(expert_bytes),
           host_slots, total_experts, pinned);
  appendln(s, "  uses {}  hits: hot {} transient {} host {}{}  misses {}  hit rate {:.1f}%", t.uses,
           t.hits_hot, t.hits_transient, t.hits_host,
           t.hits_loading ? fmt::format(" loading {}", t.hits_loading) : std::string(), t.misses,
           100 * share(t.hits(), t.uses));
  appendln(s,
           "  reads: {} experts, {} logical; {} requested (aligned, {} requests); process read {}",
           t.misses, format_bytes(t.read_bytes), format_bytes(aligned_read_bytes), read_requests,
           process_io_ok ? format_bytes(process_read_bytes) : std::string("n/a"));
  appendln(s, "  all-k-hit steps: {}  stalled on I/O {:.3f} s  evictions: hot {} transient {}",
           t.steps ? fmt::format("{:.1f}% of {}", 100 * share(t.all_hit_steps, t.steps), t.steps)
                   : std::string("n/a"),
           double(t.stall_ns) * 1e-9, t.hot_evictions, t.ring_evictions);
  if (setup_ns || host_copy_bytes) {
    appendln(s, "  set-up {:.3f} s ({} pre-faulted{}); host-tier copies {} in {:.3f} s",
             double(setup_ns) * 1e-9, format_bytes(prefault_bytes),
             huge_pages ? ", huge pages" : "", format_bytes(host_copy_bytes),
             double(host_copy_ns) * 1e-9);
  }
  if (buffered_reads || fallback_files) {
    appendln(s, "  buffered reads {} (O_DIRECT refused on {} shard(s))", buffered_reads,
             fallback_files);
  }
  if (prefetch.hints) {
    const PrefetchCounters& f = prefetch;
    appendln(s,
             "  prefetch: {} hints, {} loads ({} read), used {} (late {}), wasted {}, failed {}; "
             "waited {:.3f} s, saved ~{:.3f} s",
             f.hints, f.issued, format_bytes(f.read_bytes), f.used, f.late, f.wasted, f.failed,
             double(f.wait_ns) * 1e-9, double(f.saved_ns()) * 1e-9);
  }
  if (failed_acquires) appendln(s, "  failed acquires {}: {}", failed_acquires, last_error);
  appendln(s, "  {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8}", "layer", "uses", "hot", "trans",
           "host", "miss", "hit%", "allhit%");
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCounters& l = layers[i];
    if (l.uses == 0) continue;
    appendln(s, "  {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6.1f}% {:>8}", i, l.uses, l.hits_hot,
             l.hits_transient, l.hits_host, l.misses, 100 * share(l.hits(), l.uses),
             l.steps ? fmt::format("{:.1f}%", 100 * share(l.all_hit_steps, l.steps)) : "n/a");
  }
  return s;
}

}  // namespace moetier
