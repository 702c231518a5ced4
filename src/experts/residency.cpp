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
  key_of_.assign(slots, -1);
  slot_lock_.assign(slots, 0);
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

std::vector<ExpertKey> Residency::hot_keys() const {
  std::vector<ExpertKey> out;
  for (size_t k = 0; k < state_.size(); ++k) {
    if (state_[k] == State::Hot) out.push_back(ExpertKey(k));
  }
  return out;
}

void Residency::plan(std::span<const ExpertKey> keys, Phase phase, Plan& out) {
  out = Plan{};
  out.phase = phase;
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
  } else if (host_of_[k] >= 0) {
    st.found = Tier::Host;
    st.host_slot = host_of_[k];
    host_lock_[st.host_slot] = gen_;
    host_lru_.splice(host_lru_.end(), host_lru_, host_pos_[st.host_slot]);
  } else {
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
    state_[k] = State::Hot;
    ++hot_count_;
    policy_->on_insert(k);
  } else {
    s = ring_slot(out);
    state_[k] = State::Transient;
    ring_pos_[s] = ring_.insert(ring_.end(), s);
  }
  slot_of_[k] = s;
  key_of_[s] = k;
  slot_lock_[s] = gen_;
  st.slot = s;
  st.loading = true;
}

void Residency::make_hot_room(Plan& out) {
  if (hot_count_ < cfg_.hot_slots) return;
  auto v = policy_->victim([&](ExpertKey key) { return slot_locked(slot_of_[key]); });
  check(v.has_value(), "expert arena: no evictable hot slot (batch too large for {} slots)",
        cfg_.hot_slots);
  int32_t s = slot_of_[*v];
  drop(*v, out);
  free_.push_back(s);
  ++out.hot_evictions;
}

int32_t Residency::ring_slot(Plan& out) {
  if (ring_.size() < cfg_.transient_slots) return take_free();
  for (int32_t s : ring_) {
    if (slot_locked(s)) continue;
    drop(ExpertKey(key_of_[s]), out);  // removes s from the ring
    ++out.ring_evictions;
    return s;
  }
  fail("expert arena: every transient slot is in use by this acquire");
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

void Residency::commit(const Plan&) {}

void Residency::abort(const Plan& p) {
  for (const PlanStep& st : p.steps) {
    if (!st.loading) continue;
    ExpertKey k = st.key;
    if (state_[k] == State::Hot) {
      --hot_count_;
      policy_->on_erase(k);
    } else {
      ring_remove(st.slot);
    }
    state_[k] = State::Absent;
    slot_of_[k] = -1;
    key_of_[st.slot] = -1;
    free_.push_back(st.slot);
  }
}

}  // namespace moetier
