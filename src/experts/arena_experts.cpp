// ArenaExperts: construction, memory, and the request side of the protocol
// (submit, wait, release, can_overlap, prefetch). Loads and their reaping:
// arena_loads.cpp.
#include "experts/arena_experts.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/units.h"
#include "experts/arena_job.h"
#include "experts/loader.h"

namespace moetier {

namespace {

void allocate(AlignedBuffer& buf, size_t slots, size_t slot_bytes, const char* what) {
  if (slots == 0) return;
  check(slots <= SIZE_MAX / slot_bytes, "expert {}: {} slots of {} bytes overflow", what, slots,
        slot_bytes);
  try {
    buf.reset(slots * slot_bytes);
  } catch (const std::bad_alloc&) {
    fail("expert {}: cannot allocate {} slots x {} ({}); give a smaller size", what, slots,
         format_bytes(slot_bytes), format_bytes(uint64_t(slots) * slot_bytes));
  }
}

// Backend memory: device (alloc) or host (alloc_host) slots; the backend's
// Error names the size.
std::byte* allocate(Backend& be, DeviceBuffer& buf, size_t slots, size_t slot_bytes, bool host,
                    const char* what) {
  if (slots == 0) return nullptr;
  check(slots <= SIZE_MAX / slot_bytes, "expert {}: {} slots of {} bytes overflow", what, slots,
        slot_bytes);
  try {
    buf = host ? be.alloc_host(slots * slot_bytes) : be.alloc(slots * slot_bytes);
  } catch (const Error& e) {
    fail("expert {}: {} slots x {}: {}", what, slots, format_bytes(slot_bytes), e.what());
  }
  return buf.as<std::byte>();
}

}  // namespace

ArenaExperts::ArenaExperts(ExpertIndex index, const ArenaConfig& cfg, ExpertStats* stats)
    : index_(std::move(index)),
      res_(ResidencyConfig{index_.num_keys(), cfg.hot_slots, cfg.transient_slots, cfg.host_slots},
           make_policy(cfg.policy, index_.num_keys(), cfg.ranking, cfg.max_pinned)),
      slot_bytes_(index_.slot_bytes()),
      backend_(cfg.backend),
      device_(cfg.backend && !cfg.backend->is_host()),
      note_(cfg.note),
      validate_(cfg.validate),
      async_copies_(cfg.async_host_copies),
      stats_(stats ? stats : &own_stats_) {
  prefetch_limit_ = cfg.prefetch_limit ? cfg.prefetch_limit : size_t(max_batch());
  cfg_next_layer_hints_ = cfg.next_layer_hints;
  const auto t0 = std::chrono::steady_clock::now();
  allocate_memory(cfg);
  if (cfg.prefault) prefault_all(cfg.huge_pages);
  setup_.ns = uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  arena_job_.assign(cfg.hot_slots + cfg.transient_slots, nullptr);
  host_job_.assign(cfg.host_slots, nullptr);
  for (const std::string& p : index_.shard_paths())
    files_.push_back(io::DirectFile::open(p, cfg.direct));
  fallback_noted_.assign(files_.size(), 0);
  loader_ = std::make_unique<Loader>(io::make_reader(cfg.reader, cfg.io_depth));
  reader_name_ = loader_->reader_name();
  loading_job_.assign(index_.num_keys(), nullptr);
  last_hit_.assign(index_.num_keys(), 0);
  pf_cost_.assign(index_.num_keys(), 0);
  key_seen_.assign(index_.num_keys(), 0);
  key_pos_.assign(index_.num_keys(), 0);
  setup_mapped(cfg);  // its reads are set-up: before the counters start

  ExpertStats& s = *stats_;
  s.provider = "arena";
  s.policy = res_.policy().name();
  s.reader = reader_name_;
  s.expert_bytes = index_.expert_bytes();
  s.slot_bytes = slot_bytes_;
  s.hot_slots = cfg.hot_slots;
  s.transient_slots = cfg.transient_slots;
  s.host_slots = cfg.host_slots;
  s.total_experts = index_.total_experts();
  s.pinned = res_.policy().pinned_count();
  s.setup_ns = setup_.ns;
  s.prefault_bytes = setup_.prefault.bytes;
  s.huge_pages = setup_.prefault.huge;
  s.resize_layers(size_t(index_.num_layers()));
  s.start_process_io();
  note_fallbacks();
}

ArenaExperts::~ArenaExperts() {
  try {
    drain();
  } catch (...) {  // reaping does not throw for I/O; never throw from a destructor
  }
  loader_.reset();  // joins the loader thread before any memory goes
}

void ArenaExperts::allocate_memory(const ArenaConfig& cfg) {
  const size_t slots = cfg.hot_slots + cfg.transient_slots;
  if (!backend_) {
    allocate(arena_host_, slots, slot_bytes_, "arena");
    allocate(host_host_, cfg.host_slots, slot_bytes_, "host tier");
    arena_base_ = arena_host_.as<std::byte>();
    host_base_ = host_host_.as<std::byte>();
    return;
  }
  // On a host backend the slots are read into directly: they need alloc_host's 4 KiB alignment.
  arena_base_ = allocate(*backend_, arena_dev_, slots, slot_bytes_, !device_, "arena");
  host_base_ = allocate(*backend_, host_dev_, cfg.host_slots, slot_bytes_, true, "host tier");
  if (!device_) return;
  const size_t staging =
      cfg.staging_slots ? cfg.staging_slots : size_t(max_batch()) + prefetch_limit_;
  check(staging >= size_t(max_batch()),
        "expert arena: {} staging slots are fewer than a batch ({})", staging, max_batch());
  staging_base_ = allocate(*backend_, staging_dev_, staging, slot_bytes_, true, "read staging");
  for (size_t i = staging; i-- > 0;) staging_free_.push_back(int32_t(i));
}

// Host memory of the tiers is made resident now (huge pages where the kernel
// allows; none on pinned memory of a device backend), not at its first use.
void ArenaExperts::prefault_all(bool huge) {
  const size_t slots = res_.config().hot_slots + res_.config().transient_slots;
  auto one = [&](std::byte* p, size_t n, bool want_huge) {
    const PrefaultResult r = prefault(p, n, want_huge, global_pool());
    setup_.prefault.bytes += r.bytes;
    setup_.prefault.huge |= r.huge;
    setup_.prefault.populate |= r.populate;
    setup_.prefault.ns += r.ns;
  };
  if (!device_) one(arena_base_, slots * slot_bytes_, huge);
  one(host_base_, res_.config().host_slots * slot_bytes_, huge && !device_);
  if (device_) one(staging_base_, (staging_free_.size()) * slot_bytes_, false);
}

int64_t ArenaExperts::max_batch() const {
  return int64_t(std::min<size_t>(res_.max_batch(), size_t(index_.num_experts())));
}

void ArenaExperts::collect_keys(int64_t layer, std::span<const int32_t> ids) {
  check(index_.is_moe_layer(layer), "expert arena: layer {} is not a MoE layer", layer);
  ++stamp_;
  keys_.clear();
  pos_.clear();
  for (int32_t id : ids) {
    check(id >= 0 && id < index_.num_experts(), "expert arena: layer {}: expert {} outside [0, {})",
          layer, id, index_.num_experts());
    ExpertKey k = index_.key(layer, id);
    if (key_seen_[k] != stamp_) {
      key_seen_[k] = stamp_;
      key_pos_[k] = uint32_t(keys_.size());
      keys_.push_back(k);
    }
    pos_.push_back(key_pos_[k]);
  }
}

ArenaExperts::Request& ArenaExperts::request(Ticket t) {
  check(t.index < requests_.size() && requests_[t.index].open && requests_[t.index].gen == t.gen,
        "expert arena: unknown or released ticket");
  return requests_[t.index];
}

uint32_t ArenaExperts::new_request() {
  uint32_t i;
  if (!free_requests_.empty()) {
    i = free_requests_.back();
    free_requests_.pop_back();
  } else {
    i = uint32_t(requests_.size());
    requests_.emplace_back();
  }
  Request& r = requests_[i];  // reused: its vectors keep their capacity
  ++r.gen;
  r.open = true;
  r.waited = r.failed = false;
  r.layer = 0;
  r.pos.clear();
  r.job.reset();
  r.problem.clear();
  ++open_;
  return i;
}

void ArenaExperts::free_request(uint32_t i) {
  Request& r = requests_[i];
  r.open = false;
  r.job.reset();
  free_requests_.push_back(i);
  --open_;
}

bool ArenaExperts::wait_prefetches(int64_t layer) {
  bool waited = false;
  for (Job* j : std::vector<Job*>(inflight_.begin(), inflight_.end()))
    if (j->prefetch) wait_job(j, layer), waited = true;
  return waited;
}

Ticket ArenaExperts::submit(int64_t layer, std::span<const int32_t> ids, Phase phase) {
  return submit_impl(layer, ids, phase, false);
}

// can_overlap() and plan() can still disagree on a busy machine (holds of
// jobs reaped in between, a read that failed late): the overlapped submit then
// gives way, and the caller submits after releasing its open batch.
Ticket ArenaExperts::submit_overlapped(int64_t layer, std::span<const int32_t> ids, Phase phase) {
  if (!can_overlap(layer, ids, phase)) return {};
  return submit_impl(layer, ids, phase, true);
}

Ticket ArenaExperts::submit_impl(int64_t layer, std::span<const int32_t> ids, Phase phase,
                                 bool overlapped) {
  collect_keys(layer, ids);
  finish_device_copies(true);  // a prefill must not read a slot still being written
  check(int64_t(keys_.size()) <= max_batch(),
        "expert arena: layer {}: {} experts asked in one acquire, max_batch is {}", layer,
        keys_.size(), max_batch());
  reap_finished();
  wait_for_loading_keys(layer);  // no second read of an expert already on its way
  // Prefetches must not change this batch's decisions.
  if (prefetch_held_ > 0 && !res_.fits(keys_, phase)) wait_prefetches(layer);
  if (device_) make_staging_room(keys_.size());
  const bool overlapping = open_ > 0;
  const uint32_t idx = new_request();
  Request& rq = requests_[idx];
  rq.layer = layer;
  rq.pos.assign(pos_.begin(), pos_.end());
  try {
    try {
      res_.plan(keys_, phase, rq.plan);
    } catch (const Error&) {
      // Slots held by prefetches still in flight (a hint taken between the
      // caller's can_overlap() and this submit, or loads finishing late on a
      // busy machine): wait for them, as for any cramped arena, and plan again.
      if (!wait_prefetches(layer)) throw;
      res_.abort(rq.plan);
      rq.plan = Plan{};
      res_.plan(keys_, phase, rq.plan);
    }
  } catch (const std::exception& e) {
    res_.abort(rq.plan);
    free_request(idx);
    if (overlapped) return Ticket{};
    stats_->failed_acquires++;
    stats_->last_error = e.what();
    throw Error(e.what());
  }
  if (overlapping) stats_->overlapped_submits++;
  res_.hold(rq.plan);
  for (PlanStep& st : rq.plan.steps)
    if (std::find(late_.begin(), late_.end(), st.key) != late_.end()) st.in_flight = true;
  if (sync_copies()) copy_tiers(rq.plan);
  rq.job = make_job(rq.plan, layer, false);
  // No other ticket open: the caller waits for this one at once (the MoE
  // block's first batch, acquire), so copies alone are made here, on the
  // caller's threads, without a hand-off to the loader.
  if (rq.job && run_inline(*rq.job, open_ == 1)) rq.job.reset();
  if (rq.job) {
    rq.job->request = idx;
    push(rq.job.get());
  } else {
    res_.commit(rq.plan);  // hits and host-tier copies only: nothing to wait for
  }
  return Ticket{idx, rq.gen};
}

// An expert of keys_ that an earlier request (a prefetch, or another open
// ticket) is still reading or copying: wait for that job and reap it. A use
// of an expert read from storage then counts as hits.loading, or as a miss
// when that read failed; one of an expert copied from the host tier counts
// as the hit it is once copied (as when copies were synchronous).
void ArenaExperts::wait_for_loading_keys(int64_t layer) {
  late_.clear();
  for (ExpertKey k : keys_) {
    Job* j = loading_job_[k];
    if (!j) continue;
    const bool read = std::any_of(j->loads.begin(), j->loads.end(),
                                  [&](const LoadJob::Load& l) { return l.key == k; });
    wait_job(j, layer);
    if (read && res_.state(k) != KeyState::Absent) late_.push_back(k);
  }
}

// Copies on the owner's thread (a device arena: on the backend's stream; a
// host arena without async_host_copies: memcpy): spills (arena -> host)
// first, then host hits (host -> arena): a slot may be spilled and refilled
// within one plan, never the other way round. (Else: add_copies.)
void ArenaExperts::copy_tiers(const Plan& plan) {
  for (const Spill& sp : plan.spills) {
    const size_t n = index_.record(sp.key).slot_bytes;
    if (device_) {
      backend_->to_host(host_ptr(sp.host_slot), slot_ptr(sp.slot), n);
    } else {
      std::memcpy(host_ptr(sp.host_slot), slot_ptr(sp.slot), n);
    }
    stats_->host_copy_bytes += n;
  }
  for (const PlanStep& st : plan.steps) {
    if (st.found != Tier::Host) continue;
    const size_t n = index_.record(st.key).slot_bytes;
    if (device_) {
      backend_->to_device(slot_ptr(st.slot), host_ptr(st.host_slot), n);
    } else {
      std::memcpy(slot_ptr(st.slot), host_ptr(st.host_slot), n);
    }
    stats_->host_copy_bytes += n;
  }
}

void ArenaExperts::wait(Ticket t, std::vector<ExpertView>& views) {
  views.clear();
  Request& rq = request(t);
  check(!rq.waited, "expert arena: ticket waited twice");
  if (rq.job && !rq.job->reaped) wait_job(rq.job.get(), rq.layer);
  if (rq.failed) {
    const std::string problem = rq.problem;
    free_request(t.index);  // the failed read left nothing behind (reap_failed)
    throw Error(problem);
  }
  rq.waited = true;
  stats_->record(rq.layer, rq.plan, [&](ExpertKey k) { return index_.record(k).bytes; });
  for (const PlanStep& st : rq.plan.steps) {
    last_hit_[st.key] = !st.in_flight && (st.found == Tier::Hot || st.found == Tier::Transient);
    if (st.prefetched) stats_->prefetch.used_load_ns += pf_cost_[st.key];
  }
  views.reserve(rq.pos.size());
  for (uint32_t p : rq.pos) {
    const PlanStep& st = rq.plan.steps[p];
    views.push_back(index_.view(st.key, slot_ptr(st.slot)));
  }
}

void ArenaExperts::release(Ticket t) {
  Request& rq = request(t);
  if (rq.job && !rq.job->reaped) wait_job(rq.job.get(), rq.layer);  // no slot goes under a read
  if (!rq.failed) res_.release(rq.plan);
  free_request(t.index);
}

bool ArenaExperts::can_overlap(int64_t layer, std::span<const int32_t> ids, Phase phase) {
  collect_keys(layer, ids);
  finish_device_copies(true);
  reap_finished();
  return res_.fits(keys_, phase);
}

void ArenaExperts::prefetch(int64_t layer, std::span<const int32_t> ids, Phase phase) {
  collect_keys(layer, ids);
  finish_device_copies(true);
  reap_finished();
  size_t limit = prefetch_limit_ > prefetch_held_ ? prefetch_limit_ - prefetch_held_ : 0;
  if (device_) limit = std::min(limit, staging_free_.size() + staging_pending_.size());
  Plan plan;
  const PrefetchSkips skips = res_.prefetch(keys_, phase, limit, plan);
  stats_->record_prefetch(layer, keys_.size(), plan, skips,
                          [&](ExpertKey k) { return index_.record(k).bytes; });
  if (plan.steps.empty()) return;
  for (const PlanStep& st : plan.steps) pf_cost_[st.key] = 0;  // set when its read is reaped
  res_.hold(plan);
  prefetch_held_ += plan.steps.size();
  if (sync_copies()) copy_tiers(plan);
  std::unique_ptr<Job> reads = make_job(plan, layer, true);
  if (reads && run_inline(*reads, false)) reads.reset();
  if (!reads) {  // host-tier copies only, made already
    res_.commit(plan);
    res_.release(plan);
    prefetch_held_ -= plan.steps.size();
    return;
  }
  reads->plan = std::move(plan);
  push(reads.get());
  prefetch_jobs_.push_back(std::move(reads));
}

void ArenaExperts::note_routing(int64_t layer, std::span<const int32_t> topk, int64_t k) {
  check(index_.is_moe_layer(layer), "expert arena: layer {} is not a MoE layer", layer);
  check(k > 0 && topk.size() % size_t(k) == 0,
        "expert arena: note_routing: {} ids are not a multiple of k = {}", topk.size(), k);
  for (size_t t = 0; t < topk.size(); t += size_t(k)) {
    bool all_hit = true;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = topk[t + size_t(j)];
      check(e >= 0 && e < index_.num_experts(),
            "expert arena: note_routing: expert {} out of range", e);
      all_hit = all_hit && last_hit_[index_.key(layer, e)];
    }
    stats_->record_step(layer, all_hit);
  }
}

}  // namespace moetier
