#include "experts/arena_experts.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/units.h"

namespace moetier {

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

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

}  // namespace

ArenaExperts::ArenaExperts(ExpertIndex index, const ArenaConfig& cfg, ExpertStats* stats)
    : index_(std::move(index)),
      res_(ResidencyConfig{index_.num_keys(), cfg.hot_slots, cfg.transient_slots, cfg.host_slots},
           make_policy(cfg.policy, index_.num_keys(), cfg.ranking, cfg.max_pinned)),
      slot_bytes_(index_.slot_bytes()),
      validate_(cfg.validate),
      stats_(stats ? stats : &own_stats_) {
  allocate(arena_, cfg.hot_slots + cfg.transient_slots, slot_bytes_, "arena");
  allocate(host_, cfg.host_slots, slot_bytes_, "host tier");
  for (const std::string& p : index_.shard_paths())
    files_.push_back(io::DirectFile::open(p, cfg.direct));
  fallback_noted_.assign(files_.size(), 0);
  reader_ = io::make_reader(cfg.reader, cfg.io_depth);
  last_found_.assign(index_.num_keys(), Tier::Storage);
  key_seen_.assign(index_.num_keys(), 0);
  key_pos_.assign(index_.num_keys(), 0);

  ExpertStats& s = *stats_;
  s.provider = "arena";
  s.policy = res_.policy().name();
  s.reader = reader_->name();
  s.expert_bytes = index_.expert_bytes();
  s.slot_bytes = slot_bytes_;
  s.hot_slots = cfg.hot_slots;
  s.transient_slots = cfg.transient_slots;
  s.host_slots = cfg.host_slots;
  s.total_experts = index_.total_experts();
  s.pinned = res_.policy().pinned_count();
  s.resize_layers(size_t(index_.num_layers()));
  s.start_process_io();
  note_fallbacks();
}

ArenaExperts::~ArenaExperts() = default;

int64_t ArenaExperts::max_batch() const {
  return int64_t(std::min<size_t>(res_.max_batch(), size_t(index_.num_experts())));
}

void ArenaExperts::note_fallbacks() {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (fallback_noted_[i] || files_[i]->fallbacks() == 0) continue;
    fallback_noted_[i] = 1;
    std::string note = files_[i]->path().string() + ": " + files_[i]->fallback_reason() +
                       "; reading it through the page cache";
    std::fprintf(stderr, "moetier: note: %s\n", note.c_str());
    stats_->fallback_files++;
    stats_->fallback_notes.push_back(std::move(note));
  }
}

void ArenaExperts::acquire(int64_t layer, std::span<const int32_t> ids, Phase phase,
                           std::vector<ExpertView>& views) {
  views.clear();
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
  check(int64_t(keys_.size()) <= max_batch(),
        "expert arena: layer {}: {} experts asked in one acquire, max_batch is {}", layer,
        keys_.size(), max_batch());
  std::string problem;
  try {
    res_.plan(keys_, phase, plan_);
    copy_tiers(layer);
    problem = load_misses(layer);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) {
    res_.abort(plan_);
    stats_->failed_acquires++;
    stats_->last_error = problem;
    throw Error(problem);
  }
  res_.commit(plan_);
  stats_->record(layer, plan_, [&](ExpertKey k) { return index_.record(k).bytes; });
  for (const PlanStep& st : plan_.steps) last_found_[st.key] = st.found;
  views.reserve(ids.size());
  for (size_t p : pos_) {
    const PlanStep& st = plan_.steps[p];
    views.push_back(index_.view(st.key, slot_ptr(st.slot)));
  }
}

// Spills (arena -> host) first, then host hits (host -> arena): a slot may be
// spilled and refilled within one plan, never the other way round.
void ArenaExperts::copy_tiers(int64_t layer) {
  for (const Spill& sp : plan_.spills) {
    size_t n = index_.record(sp.key).slot_bytes;
    std::memcpy(host_ptr(sp.host_slot), slot_ptr(sp.slot), n);
    stats_->host_copy_bytes += n;
  }
  for (const PlanStep& st : plan_.steps) {
    if (st.found != Tier::Host) continue;
    size_t n = index_.record(st.key).slot_bytes;
    std::memcpy(slot_ptr(st.slot), host_ptr(st.host_slot), n);
    stats_->host_copy_bytes += n;
  }
}

// One batched read for every storage miss of the plan, then validation.
std::string ArenaExperts::load_misses(int64_t layer) {
  reqs_.clear();
  req_step_.clear();
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    const PlanStep& st = plan_.steps[i];
    if (st.found != Tier::Storage) continue;
    for (const Extent& e : index_.record(st.key).extents) {
      io::ReadRequest r;
      r.file = files_[e.shard].get();
      r.offset = e.offset;
      r.length = e.length;
      r.dst = slot_ptr(st.slot) + e.slot_offset;
      reqs_.push_back(r);
      req_step_.push_back(i);
    }
  }
  if (reqs_.empty()) return {};
  const io::IoCounters before = reader_->counters();
  uint64_t t0 = now_ns();
  reader_->read(reqs_);
  stats_->layers[size_t(layer)].stall_ns += now_ns() - t0;
  const io::IoCounters& after = reader_->counters();
  stats_->read_requests += after.requests - before.requests;
  stats_->aligned_read_bytes += after.bytes_aligned - before.bytes_aligned;
  stats_->direct_reads += after.direct_reads - before.direct_reads;
  stats_->buffered_reads += after.buffered_reads - before.buffered_reads;
  stats_->sample_process_io();
  note_fallbacks();
  for (size_t j = 0; j < reqs_.size(); ++j) {
    if (reqs_[j].ok()) continue;
    ExpertKey k = plan_.steps[req_step_[j]].key;
    return fmt::format("{} (layer {} expert {})", io::describe_failure(reqs_[j]),
                       index_.layer_of(k), index_.expert_of(k));
  }
  if (!validate_) return {};
  uint64_t t1 = now_ns();
  std::string bad;
  for (const PlanStep& st : plan_.steps) {
    if (st.found != Tier::Storage) continue;
    bad = index_.validate(st.key, slot_ptr(st.slot));
    if (!bad.empty()) break;
  }
  stats_->validate_ns += now_ns() - t1;
  return bad;
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
      Tier f = last_found_[index_.key(layer, e)];
      all_hit = all_hit && (f == Tier::Hot || f == Tier::Transient);
    }
    stats_->record_step(layer, all_hit);
  }
}

}  // namespace moetier
