// ArenaExperts: the mapped host tier (see "Mapped host tier" in
// arena_experts.h): set-up, the device tables, and the two calls around a
// decode step that runs on them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "experts/arena_experts.h"
#include "experts/loader.h"

namespace moetier {

// MOETIER_MAPPED_HOST=0 keeps every decode step on submit/wait (A/B runs).
void ArenaExperts::setup_mapped(const ArenaConfig& cfg) {
  const char* env = std::getenv("MOETIER_MAPPED_HOST");
  if (env && std::string(env) == "0") return;
  if (!device_ || !backend_->reads_host_memory() || cfg.top_k < 1 ||
      cfg.top_k > index_.num_experts() || cfg.host_slots < index_.total_experts())
    return;
  const auto t0 = std::chrono::steady_clock::now();
  fill_host_tier();
  const int64_t layers = index_.num_layers(), ne = index_.num_experts();
  tables_.assign(size_t(layers), -1);
  std::vector<ExpertView> views(static_cast<size_t>(ne));
  for (int64_t l = 0; l < layers; ++l) {
    if (!index_.is_moe_layer(l)) continue;
    for (int64_t e = 0; e < ne; ++e) {
      const ExpertKey k = index_.key(l, e);
      views[size_t(e)] = index_.view(k, host_ptr(res_.host_slot_of(k)));
    }
    tables_[size_t(l)] = backend_->register_experts(views);
    if (tables_[size_t(l)] < 0) {  // a backend without tables: submit/wait as before
      tables_.clear();
      return;
    }
  }
  top_k_ = cfg.top_k;
  routing_dev_ = backend_->alloc(size_t(layers * top_k_) * sizeof(int32_t));
  routing_host_.assign(size_t(layers * top_k_), 0);
  if (cfg_next_layer_hints_) {
    staged_none_.assign(size_t(layers * top_k_), -1);
    staged_host_ = staged_none_;
    staged_dev_ = backend_->alloc(staged_none_.size() * sizeof(int32_t));
    backend_->to_device(staged_dev_.data(), staged_none_.data(),
                        staged_none_.size() * sizeof(int32_t));
  }
  entry_slot_.assign(index_.num_keys(), -1);
  if (const char* w = std::getenv("MOETIER_MAPPED_ADMIT")) {
    char* end = nullptr;
    const long long v = std::strtoll(w, &end, 10);
    check(end != w && *end == '\0' && v >= 0, "MOETIER_MAPPED_ADMIT={}: expected steps >= 0", w);
    admit_window_ = uint64_t(v);
  }
  host_seen_.assign(index_.num_keys(), 0);
  mapped_ = true;
  setup_.ns += uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  if (note_)
    note_(
        fmt::format("expert arena: mapped host tier ({} experts read into host memory; decode "
                    "steps read the experts outside the arena in place)",
                    index_.total_experts()));
}

// Every expert into its own host slot, one load job (reads, then validation)
// per layer; a failed read or a bad expert throws its one-line error.
void ArenaExperts::fill_host_tier() {
  for (int64_t l = 0; l < index_.num_layers(); ++l) {
    if (!index_.is_moe_layer(l)) continue;
    LoadJob job;
    job.validate = validate_;
    job.index = &index_;
    for (int64_t e = 0; e < index_.num_experts(); ++e) {
      const ExpertKey k = index_.key(l, e);
      const int32_t h = res_.host_insert(k);
      check(h >= 0, "expert arena: no host slot for layer {} expert {} (internal error)", l, e);
      for (const Extent& x : index_.record(k).extents) {
        io::ReadRequest r;
        r.file = files_[x.shard].get();
        r.offset = x.offset;
        r.length = x.length;
        r.dst = host_ptr(h) + x.slot_offset;
        job.reqs.push_back(r);
        job.req_load.push_back(uint32_t(job.loads.size()));
      }
      job.loads.push_back({k, host_ptr(h)});
    }
    loader_->push(&job);
    loader_->wait(&job);
    if (!job.problem.empty()) fail("{}", job.problem);
  }
}

int ArenaExperts::device_table(int64_t layer) const {
  if (!mapped_ || layer < 0 || layer >= int64_t(tables_.size())) return -1;
  return tables_[size_t(layer)];
}

int32_t* ArenaExperts::device_ids(int64_t layer) const {
  if (!mapped_ || layer < 0 || layer >= index_.num_layers()) return nullptr;
  return routing_dev_.as<int32_t>() + layer * top_k_;
}

int32_t* ArenaExperts::device_staged(int64_t layer) const {
  if (!mapped_ || !staged_dev_.data() || layer < 0 || layer >= index_.num_layers()) return nullptr;
  return staged_dev_.as<int32_t>() + layer * top_k_;
}

// Commits the plans whose copies are done, oldest first (all of them, after
// waiting, with `wait`).
void ArenaExperts::finish_device_copies(bool wait) {
  if (copying_.empty()) return;
  if (wait) backend_->wait_copies();
  size_t i = 0;
  for (; i < copying_.size() && backend_->copy_done(copying_[i].first); ++i)
    res_.commit(copying_[i].second);
  copying_.erase(copying_.begin(), copying_.begin() + int64_t(i));
}

// The entries that differ from the residency are sent first; entry_slot_
// changes only once the backend took them.
void ArenaExperts::before_device_step() {
  if (!mapped_) return;
  reap_finished();
  finish_device_copies(false);
  updates_.clear();
  changed_.clear();
  for (int64_t l = 0; l < index_.num_layers(); ++l) {
    if (tables_[size_t(l)] < 0) continue;
    for (int64_t e = 0; e < index_.num_experts(); ++e) {
      const ExpertKey k = index_.key(l, e);
      const KeyState st = res_.state(k);
      const int32_t want = st == KeyState::Hot || st == KeyState::Transient ? res_.slot_of(k) : -1;
      if (want == entry_slot_[k]) continue;
      const std::byte* at = want >= 0 ? slot_ptr(want) : host_ptr(res_.host_slot_of(k));
      updates_.push_back({tables_[size_t(l)], int32_t(e), index_.view(k, at), want < 0});
      changed_.emplace_back(k, want);
    }
  }
  backend_->update_experts(updates_);
  for (const auto& [k, want] : changed_) entry_slot_[k] = want;
}

void ArenaExperts::after_device_step() {
  if (!mapped_) return;
  ++device_steps_;
  backend_->to_host(routing_host_.data(), routing_dev_.data(),
                    routing_host_.size() * sizeof(int32_t));  // waits for the step
  if (staged_dev_.data()) {
    const size_t bytes = staged_host_.size() * sizeof(int32_t);
    backend_->to_host(staged_host_.data(), staged_dev_.data(), bytes);
    backend_->to_device(staged_dev_.data(), staged_none_.data(), bytes);  // before the next step
  }
  for (int64_t l = 0; l < index_.num_layers(); ++l) {
    if (tables_[size_t(l)] < 0) continue;
    const auto at = [&](const std::vector<int32_t>& v) {
      return std::span<const int32_t>(v).subspan(size_t(l * top_k_), size_t(top_k_));
    };
    if (staged_dev_.data()) count_staged(l, at(staged_host_), at(routing_host_));
    device_step_layer(l, at(routing_host_));
  }
}

// Admission window (MOETIER_MAPPED_ADMIT=W device steps, default 64; 0
// admits on every host-tier use): an expert read from the host tier is
// admitted into the arena only when it was used within the last W steps; a
// use after a longer gap is counted (a host-tier hit) and not planned, so it
// takes no slot and no copy. One-off experts then cost no PCIe copy and
// evict nothing (on the H200, Qwen3-30B-A3B shapes, a 28% arena: 324 -> 400
// tok/s, host-tier share 8.7% -> 7.2%; docs/cache-protocol.md). Removes
// those keys from keys_.
void ArenaExperts::keep_admitted(int64_t layer) {
  Plan bypass;
  bypass.clear(Phase::Decode);
  size_t n = 0;
  for (const ExpertKey k : keys_) {
    const KeyState st = res_.state(k);
    const bool resident =
        st == KeyState::Hot || st == KeyState::Transient || st == KeyState::Loading;
    const uint64_t seen = host_seen_[k];
    host_seen_[k] = device_steps_;
    if (resident || (seen > 0 && device_steps_ - seen <= admit_window_)) {
      keys_[n++] = k;
      continue;
    }
    PlanStep ps;  // where the step read it, as device_step_batch counts it
    ps.key = k;
    ps.found = entry_slot_[k] < 0 ? Tier::Host : Tier::Hot;  // (evicted by an earlier plan)
    ps.host_slot = res_.host_slot_of(k);
    bypass.steps.push_back(ps);
    last_hit_[k] = ps.found == Tier::Hot;
  }
  keys_.resize(n);
  if (!bypass.steps.empty())
    stats_->record(layer, bypass, [&](ExpertKey k) { return index_.record(k).bytes; });
}

// A layer's staging report (Backend::NextLayer::staged): per predicted slot
// the id copied to device memory, -2 - id for one already there, -1 for no
// prediction. A copied expert is used when the layer's router picked it. Its
// bytes count in host_copy_bytes (PCIe bytes, as the admissions' copies).
void ArenaExperts::count_staged(int64_t layer, std::span<const int32_t> staged,
                                std::span<const int32_t> ids) {
  PrefetchCounters& c = stats_->prefetch;
  for (const int32_t s : staged) {
    if (s == -1 || c.count_in_device(s, ids)) continue;  // none, or already in device memory
    ++c.hints;
    const ExpertKey k = index_.key(layer, s);
    ++c.issued;
    stats_->host_copy_bytes += index_.record(k).slot_bytes;
    if (std::find(ids.begin(), ids.end(), s) != ids.end())
      ++c.used;
    else
      ++c.wasted;
  }
}

// One layer of a finished device step, planned and counted as the MoE block
// acquires it (runtime/moe_block.h: distinct experts in ascending id order,
// at most max_batch() at a time); the step read an expert still being copied
// in from the host tier.
void ArenaExperts::device_step_layer(int64_t layer, std::span<const int32_t> ids) {
  std::vector<int32_t>& sorted = sorted_ids_;
  sorted.assign(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const size_t batch = size_t(max_batch());
  for (size_t b0 = 0; b0 < sorted.size(); b0 += batch)
    device_step_batch(
        layer, std::span<const int32_t>(sorted).subspan(b0, std::min(batch, sorted.size() - b0)));
  note_routing(layer, ids, top_k_);
}

void ArenaExperts::device_step_batch(int64_t layer, std::span<const int32_t> ids) {
  collect_keys(layer, ids);
  if (admit_window_ > 0) keep_admitted(layer);
  Plan plan;
  try {
    res_.plan(keys_, Phase::Decode, plan);
  } catch (const Error&) {  // a small arena whose slots are all being copied into
    res_.abort(plan);
    plan = Plan{};
    if (copying_.empty()) throw;
    finish_device_copies(true);
    try {
      res_.plan(keys_, Phase::Decode, plan);
    } catch (const Error&) {
      res_.abort(plan);
      throw;
    }
  }
  if (!plan.spills.empty() || std::any_of(plan.steps.begin(), plan.steps.end(),
                                          [](auto& st) { return st.found == Tier::Storage; })) {
    res_.abort(plan);
    fail(
        "expert arena: layer {}: an expert outside the host tier that holds every expert "
        "(internal error)",
        layer);
  }
  for (PlanStep& st : plan.steps) {
    // Where the step read it: its table entry named the host copy (an expert
    // still being copied in) or an arena slot (a key another layer's plan
    // has just evicted included).
    st.found = entry_slot_[st.key] < 0 ? Tier::Host : st.found == Tier::Host ? Tier::Hot : st.found;
    st.in_flight = false;
  }
  stats_->record(layer, plan, [&](ExpertKey k) { return index_.record(k).bytes; });
  for (const PlanStep& st : plan.steps)
    last_hit_[st.key] = st.found == Tier::Hot || st.found == Tier::Transient;
  if (std::none_of(plan.steps.begin(), plan.steps.end(), [](auto& st) { return st.loading; }))
    return;
  copying_.emplace_back(0, std::move(plan));  // tracked before any copy is issued
  auto& [last, p] = copying_.back();
  try {
    for (const PlanStep& st : p.steps) {
      if (!st.loading) continue;
      const size_t n = index_.record(st.key).slot_bytes;
      last = backend_->to_device_async(slot_ptr(st.slot), host_ptr(st.host_slot), n);
      stats_->host_copy_bytes += n;
    }
  } catch (...) {  // nothing half-copied may be committed
    try {
      backend_->wait_copies();
    } catch (...) {
    }
    res_.abort(p);
    copying_.pop_back();
    throw;
  }
}

}  // namespace moetier
