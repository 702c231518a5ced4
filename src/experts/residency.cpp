#include "experts/residency.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace moetier {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::Hot:
      return "hot";
    case Tier::Transient:
      return "transient";
    case Tier::Host:
      return "host";
    case Tier::Storage:
      return "storage";
  }
  return "?";
}

void Plan::clear(Phase ph) {
  phase = ph;
  steps.clear();
  spills.clear();
  hot_evictions = ring_evictions = prefetch_wasted = 0;
}

Residency::Residency(const ResidencyConfig& cfg, std::unique_ptr<Policy> policy)
    : cfg_(cfg), policy_(std::move(policy)) {
  check(cfg.hot_slots >= 1, "expert arena: needs at least one hot slot");
  check(policy_->pinned_count() < cfg.hot_slots,
        "expert arena: {} pinned experts leave no evictable slot of {}", policy_->pinned_count(),
        cfg.hot_slots);
  size_t slots = cfg.hot_slots + cfg.transient_slots;
  check(slots < size_t(std::numeric_limits<int32_t>::max()), "expert arena: too many slots");
  state_.assign(cfg.num_keys, State::Absent);
  slot_of_.assign(cfg.num_keys, -1);
  host_of_.assign(cfg.num_keys, -1);
  key_gen_.assign(cfg.num_keys, 0);
  prefetched_.assign(cfg.num_keys, 0);
  key_of_.assign(slots, -1);
  slot_lock_.assign(slots, 0);
  refs_.assign(slots, 0);
  loading_.assign(slots, 0);
  ring_pos_.resize(slots);
  for (size_t s = slots; s-- > 0;) free_.push_back(int32_t(s));  // slot 0 is taken first
  host_pos_.resize(cfg.host_slots);
  host_key_.assign(cfg.host_slots, -1);
  host_lock_.assign(cfg.host_slots, 0);
  for (size_t s = cfg.host_slots; s-- > 0;) host_free_.push_back(int32_t(s));
}

size_t Residency::max_batch() const {
  size_t b = cfg_.hot_slots - policy_->pinned_count();
  if (cfg_.transient_slots > 0) b = std::min(b, cfg_.transient_slots);
  return b;
}

Tier Residency::where(ExpertKey k) const {
  switch (state_.at(k)) {
    case State::Hot:
      return Tier::Hot;
    case State::Transient:
      return Tier::Transient;
    case State::Absent:
      break;
  }
  return host_of_[k] >= 0 ? Tier::Host : Tier::Storage;
}

KeyState Residency::state(ExpertKey k) const {
  switch (state_.at(k)) {
    case State::Hot:
      return loading_[size_t(slot_of_[k])] ? KeyState::Loading : KeyState::Hot;
    case State::Transient:
      return loading_[size_t(slot_of_[k])] ? KeyState::Loading : KeyState::Transient;
    case State::Absent:
      break;
  }
  return KeyState::Absent;
}

std::vector<ExpertKey> Residency::hot_keys() const {
  std::vector<ExpertKey> out;
  for (size_t k = 0; k < state_.size(); ++k) {
    if (state_[k] == State::Hot) out.push_back(ExpertKey(k));
  }
  return out;
}

void Residency::plan(std::span<const ExpertKey> keys, Phase phase, Plan& out) {
  out.clear(phase);
  check(keys.size() <= max_batch(), "expert arena: acquire of {} experts exceeds max_batch {}",
        keys.size(), max_batch());
  ++gen_;
  out.steps.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ExpertKey k = keys[i];
    check(k < cfg_.num_keys, "expert arena: key {} out of range", k);
    check(key_gen_[k] != gen_, "expert arena: expert key {} appears twice in one acquire", k);
    key_gen_[k] = gen_;
    policy_->on_use(k);
    out.steps[i].key = k;
    classify(k, phase, out.steps[i]);
  }
  for (auto& st : out.steps) {
    check(!(st.found == Tier::Storage && st.host_slot >= 0), "expert arena: inconsistent step");
    place(st, out);
  }
}

// Records where k is now and locks it; placement decisions come in place().
void Residency::classify(ExpertKey k, Phase phase, PlanStep& st) {
  int32_t s = slot_of_[k];
  if (state_[k] != State::Absent) {
    st.in_flight = loading_[s] != 0;
    st.prefetched = prefetched_[k] != 0;
    prefetched_[k] = 0;
  }
  if (state_[k] == State::Hot) {
    st.found = Tier::Hot;
    st.slot = s;
    st.hot = true;
    slot_lock_[s] = gen_;
  } else if (state_[k] == State::Transient) {
    st.found = Tier::Transient;
    st.slot = s;
    slot_lock_[s] = gen_;
    st.hot = phase == Phase::Decode || cfg_.transient_slots == 0;  // promote on decode use
    if (!st.hot) ring_.splice(ring_.end(), ring_, ring_pos_[s]);
  } else if (!find_host(k, st)) {
    st.found = Tier::Storage;
  }
  if (st.found == Tier::Host || st.found == Tier::Storage) {
    st.hot = phase == Phase::Decode || cfg_.transient_slots == 0;
  }
}

void Residency::place(PlanStep& st, Plan& out) {
  ExpertKey k = st.key;
  if (st.found == Tier::Hot) return;
  if (st.found == Tier::Transient) {
    if (!st.hot) return;
    make_hot_room(out);  // promotion: the slot leaves the ring and joins the hot set
    ring_remove(st.slot);
    state_[k] = State::Hot;
    ++hot_count_;
    policy_->on_insert(k);
    return;
  }
  // A miss in the arena (host hit or storage read): the bytes land in a new slot.
  if (!st.hot && hot_count_ < cfg_.hot_slots) st.hot = true;  // prefill fills free hot slots
  int32_t s;
  if (st.hot) {
    make_hot_room(out);
    s = take_free();
  } else {
    s = ring_slot(out);
  }
  occupy(st, s);
}

bool Residency::find_host(ExpertKey k, PlanStep& st) {
  if (host_of_[k] < 0) return false;
  st.found = Tier::Host;
  st.host_slot = host_of_[k];
  host_lock_[st.host_slot] = gen_;
  host_lru_.splice(host_lru_.end(), host_lru_, host_pos_[st.host_slot]);
  return true;
}

void Residency::occupy(PlanStep& st, int32_t s) {
  const ExpertKey k = st.key;
  if (st.hot) {
    state_[k] = State::Hot;
    ++hot_count_;
    policy_->on_insert(k);
  } else {
    state_[k] = State::Transient;
    ring_pos_[s] = ring_.insert(ring_.end(), s);
  }
  slot_of_[k] = s;
  key_of_[s] = k;
  slot_lock_[s] = gen_;
  loading_[s] = 1;
  st.slot = s;
  st.loading = true;
}

void Residency::make_hot_room(Plan& out) {
  check(try_hot_room(out),
        "expert arena: no evictable hot slot (batch too large for {} slots; {} held by open "
        "requests)",
        cfg_.hot_slots, held_slots_);
}

bool Residency::try_hot_room(Plan& out) {
  if (hot_count_ < cfg_.hot_slots) return true;
  auto v = policy_->victim([&](ExpertKey key) { return !evictable(slot_of_[key]); });
  if (!v) return false;
  int32_t s = slot_of_[*v];
  drop(*v, out);
  free_.push_back(s);
  ++out.hot_evictions;
  return true;
}

int32_t Residency::ring_slot(Plan& out) {
  int32_t s = try_ring_slot(out);
  check(s >= 0,
        "expert arena: every transient slot is in use by this acquire or held ({} slots held by "
        "open requests)",
        held_slots_);
  return s;
}

int32_t Residency::try_ring_slot(Plan& out) {
  if (ring_.size() < cfg_.transient_slots) return take_free();
  for (int32_t s : ring_) {
    if (!evictable(s)) continue;
    drop(ExpertKey(key_of_[s]), out);  // removes s from the ring
    ++out.ring_evictions;
    return s;
  }
  return -1;
}

int32_t Residency::take_free() {
  check(!free_.empty(), "expert arena: no free slot (internal accounting error)");
  int32_t s = free_.back();
  free_.pop_back();
  return s;
}

void Residency::drop(ExpertKey k, Plan& out) {
  int32_t s = slot_of_[k];
  if (state_[k] == State::Hot) {
    --hot_count_;
    policy_->on_erase(k);
  } else {
    ring_remove(s);
  }
  if (prefetched_[k]) {
    prefetched_[k] = 0;
    ++out.prefetch_wasted;
  }
  spill(k, s, out);
  state_[k] = State::Absent;
  slot_of_[k] = -1;
  key_of_[s] = -1;
}

void Residency::spill(ExpertKey k, int32_t slot, Plan& out) {
  if (cfg_.host_slots == 0) return;
  if (int32_t h = host_of_[k]; h >= 0) {  // already there: just refresh it
    host_lru_.splice(host_lru_.end(), host_lru_, host_pos_[h]);
    return;
  }
  int32_t h = -1;
  if (!host_free_.empty()) {
    h = host_free_.back();
    host_free_.pop_back();
  } else {
    for (int32_t c : host_lru_) {
      if (host_lock_[c] == gen_) continue;
      h = c;
      break;
    }
    if (h < 0) return;  // every host slot is busy in this acquire: do not cache
    host_of_[ExpertKey(host_key_[h])] = -1;
    host_lru_.erase(host_pos_[h]);
  }
  host_key_[h] = k;
  host_of_[k] = h;
  host_lock_[h] = gen_;
  host_pos_[h] = host_lru_.insert(host_lru_.end(), h);
  out.spills.push_back({k, slot, h});
}

void Residency::ring_remove(int32_t slot) { ring_.erase(ring_pos_[slot]); }

// A dry run of plan(keys, phase)'s placement with today's lock (the batch
// only), checking that no victim it picks is held or Loading. Victims are
// found as plan() finds them: the policy's order (the Policy contract:
// on_use/on_insert/on_erase of a key move only that key, so the batch's own
// uses do not reorder the others) and the ring from its least recent end.
bool Residency::fits(std::span<const ExpertKey> keys, Phase phase) const {
  if (keys.size() > max_batch()) return false;
  std::vector<ExpertKey> batch(keys.begin(), keys.end());
  std::sort(batch.begin(), batch.end());
  if (std::adjacent_find(batch.begin(), batch.end()) != batch.end()) return false;
  if (!batch.empty() && batch.back() >= cfg_.num_keys) return false;
  auto in_batch = [&](ExpertKey k) { return std::binary_search(batch.begin(), batch.end(), k); };
  std::vector<ExpertKey> gone;  // victims picked so far
  auto is_gone = [&](ExpertKey k) { return std::find(gone.begin(), gone.end(), k) != gone.end(); };
  auto held = [&](int32_t s) { return refs_[size_t(s)] > 0 || loading_[size_t(s)]; };
  const bool ring_rule = phase == Phase::Prefill && cfg_.transient_slots > 0;
  size_t hot = hot_count_, ring = ring_.size();
  auto ring_it = ring_.begin();
  auto hot_room = [&]() {
    if (hot < cfg_.hot_slots) return true;
    auto v = policy_->victim([&](ExpertKey k) { return in_batch(k) || is_gone(k); });
    if (!v || held(slot_of_[*v])) return false;
    gone.push_back(*v);
    --hot;
    return true;
  };
  for (ExpertKey k : keys) {
    if (state_[k] == State::Hot) continue;
    if (state_[k] == State::Transient) {
      if (ring_rule) continue;
      if (!hot_room()) return false;  // promotion
      --ring;
      ++hot;
      continue;
    }
    if (!ring_rule || hot < cfg_.hot_slots) {
      if (!hot_room()) return false;
      ++hot;
      continue;
    }
    if (ring < cfg_.transient_slots) {
      ++ring;
      continue;
    }
    while (ring_it != ring_.end() && in_batch(ExpertKey(key_of_[*ring_it]))) ++ring_it;
    if (ring_it == ring_.end() || held(*ring_it)) return false;
    ++ring_it;  // recycled: the miss takes it
  }
  return true;
}

PrefetchSkips Residency::prefetch(std::span<const ExpertKey> keys, Phase phase, size_t limit,
                                  Plan& out) {
  out.clear(phase);
  PrefetchSkips skips;
  ++gen_;
  for (ExpertKey k : keys) {
    check(k < cfg_.num_keys, "expert arena: prefetch of key {} out of range", k);
    if (key_gen_[k] == gen_) continue;  // named twice
    key_gen_[k] = gen_;
    if (state_[k] != State::Absent) {
      ++skips.redundant;
      continue;
    }
    PlanStep st;
    st.key = k;
    if (!find_host(k, st)) st.found = Tier::Storage;  // lock its host copy before any spill
    st.hot = phase == Phase::Decode || cfg_.transient_slots == 0 || hot_count_ < cfg_.hot_slots;
    int32_t s = -1;
    if (out.steps.size() < limit) {
      s = st.hot ? (try_hot_room(out) ? take_free() : -1) : try_ring_slot(out);
    }
    if (s < 0) {
      ++skips.dropped;
      continue;
    }
    occupy(st, s);
    prefetched_[k] = 1;
    out.steps.push_back(st);
  }
  return skips;
}

int32_t Residency::host_insert(ExpertKey k) {
  check(k < cfg_.num_keys, "expert residency: key {} outside [0, {})", k, cfg_.num_keys);
  if (host_of_[k] >= 0 || slot_of_[k] >= 0 || host_free_.empty()) return -1;
  const int32_t h = host_free_.back();
  host_free_.pop_back();
  host_key_[h] = k;
  host_of_[k] = h;
  host_pos_[h] = host_lru_.insert(host_lru_.end(), h);
  return h;
}

void Residency::commit(const Plan& p) {
  for (const PlanStep& st : p.steps) {
    if (st.loading && st.slot >= 0 && key_of_[st.slot] == int64_t(st.key)) loading_[st.slot] = 0;
  }
}

void Residency::abort(const Plan& p) {
  for (const PlanStep& st : p.steps) {
    if (!st.loading || st.slot < 0 || key_of_[st.slot] != int64_t(st.key) || !loading_[st.slot])
      continue;
    check(refs_[st.slot] == 0, "expert arena: abort of a held plan (release it first)");
    ExpertKey k = st.key;
    if (state_[k] == State::Hot) {
      --hot_count_;
      policy_->on_erase(k);
    } else {
      ring_remove(st.slot);
    }
    state_[k] = State::Absent;
    slot_of_[k] = -1;
    prefetched_[k] = 0;
    key_of_[st.slot] = -1;
    loading_[st.slot] = 0;
    free_.push_back(st.slot);
  }
}

void Residency::hold(const Plan& p) {
  for (const PlanStep& st : p.steps) {
    if (st.slot < 0) continue;
    if (refs_[st.slot]++ == 0) ++held_slots_;
  }
}

void Residency::release(const Plan& p) {
  for (const PlanStep& st : p.steps) {
    if (st.slot < 0) continue;
    check(refs_[st.slot] > 0, "expert arena: release of slot {} that is not held", st.slot);
    if (--refs_[st.slot] == 0) --held_slots_;
  }
}

}  // namespace moetier
