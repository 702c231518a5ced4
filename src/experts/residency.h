// Residency: the state machine of the expert arena, as pure bookkeeping over
// slot numbers (no memory, no I/O), so that the engine and `moetier simulate`
// run the same code.
//
// Slots. The arena has hot_slots + transient_slots physical slots of equal
// size. At any time a slot is free, holds a hot-set expert, or holds a
// transient-ring expert; at most hot_slots are hot and at most transient_slots
// are transient (roles move with the slot, so promotion never copies).
// The optional host tier has host_slots slots of the same size.
//
// States of one expert key:
//   Absent --plan/prefetch miss--> Loading(slot) --commit--> Hot(slot) | Transient(slot)
//   Loading --abort--> Absent             (a failed read leaves nothing behind)
//   Hot --evict--> Absent (+ host copy)    Transient --recycle--> Absent (+ host copy)
//   Transient --decode use--> Hot          (promotion: the slot changes role)
// A Loading key already has its slot and its role (it counts in hot_count() or
// ring_count() and is in the policy's resident set from plan() on), but its
// slot is never evicted or recycled, and a plan that uses it marks the step
// in_flight: the use must wait for that load (no second read).
//
// References. hold(p) adds one reference to every slot of plan p, release(p)
// removes them; the provider holds a plan from submit until its views are
// released, and a prefetch's plan until its reads are committed. A slot with
// references is never evicted or recycled, so its bytes stay put while any
// sequence computes with them. Several holds may share a slot (reference
// count). The simulator never holds: its loads commit at once.
//
// Rules of one plan:
//   - Keys of the batch are locked for its duration: none of them is evicted
//     to make room for another. Held and Loading slots are never victims.
//   - Decode: a miss (or a transient hit) enters the hot set; when the hot set
//     is full, the policy's victim leaves it.
//   - Prefill: hits stay where they are. A miss takes a free hot slot if the
//     hot set is not full, else a transient ring slot, recycling the ring's
//     least recently used evictable slot. Prefill never evicts a hot expert.
//     (With transient_slots == 0, prefill follows the decode rule.)
//   - The policy sees every use (prefill and decode) through on_use().
//   - Every expert leaving the arena is copied to the host tier (if any), which
//     is an LRU cache; a host hit copies it back into an arena slot.
//
// Placement guarantee. plan() succeeds whenever the distinct slots held by
// others plus the batch are at most max_batch() (docs/cache-protocol.md,
// "Batch limit"). fits(keys) says more: plan(keys) made now takes exactly the
// decisions it would take with no slot held and none loading (none of its
// victims is held), so overlapping a batch with the holds of the previous one
// changes no counter (the engine overlaps only then).
//
// Prefetch (a hint, not a use): prefetch() starts Loading absent keys where
// the rules above allow without touching a locked, held or Loading slot and
// without ever evicting a hot expert in prefill; what does not fit is dropped.
// The first later use of a prefetched key is marked `prefetched` (accurate);
// a prefetched key that leaves the arena unused counts in prefetch_wasted.
//
// Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "experts/policy.h"
#include "experts/provider.h"

namespace moetier {

enum class Tier : uint8_t { Hot, Transient, Host, Storage };
const char* tier_name(Tier t);

enum class KeyState : uint8_t { Absent, Loading, Hot, Transient };

struct ResidencyConfig {
  size_t num_keys = 0;
  size_t hot_slots = 0;
  size_t transient_slots = 0;
  size_t host_slots = 0;
};

// What one key of a plan needs.
struct PlanStep {
  ExpertKey key = 0;
  Tier found = Tier::Storage;  // where the bytes were found
  int32_t slot = -1;           // arena slot that holds them after the plan
  int32_t host_slot = -1;      // Tier::Host: copy from this host slot
  bool hot = false;            // in the hot set after the plan (else the ring)
  bool loading = false;        // slot content is written by this plan
  bool in_flight = false;      // found Loading: the use waits for an earlier load
  bool prefetched = false;     // first use of a key that a prefetch brought in
};
// Copy arena slot -> host slot; must happen before anything writes the slot.
struct Spill {
  ExpertKey key = 0;
  int32_t slot = -1;
  int32_t host_slot = -1;
};
struct Plan {
  Phase phase = Phase::Decode;
  std::vector<PlanStep> steps;  // one per key, in the order given
  std::vector<Spill> spills;
  uint64_t hot_evictions = 0;    // hot-set experts that left the arena
  uint64_t ring_evictions = 0;   // transient experts whose slot was recycled
  uint64_t prefetch_wasted = 0;  // of those, prefetched experts never used

  void clear(Phase ph);  // empty, keeping the vectors' capacity
};

// What prefetch() did not start.
struct PrefetchSkips {
  size_t redundant = 0;  // already resident or loading
  size_t dropped = 0;    // no slot the rules allow (or over the limit)
};

class Residency {
 public:
  Residency(const ResidencyConfig& cfg, std::unique_ptr<Policy> policy);

  // Largest batch plan() accepts: the hot slots the policy may evict, and the
  // transient ring (when there is one).
  size_t max_batch() const;

  // Decides where every key lives (see the rules above). Keys must be distinct
  // and at most max_batch(); throws Error otherwise, or when held slots leave
  // no room. Evictions happen here.
  void plan(std::span<const ExpertKey> keys, Phase phase, Plan& out);
  // True when plan(keys, phase) now succeeds and evicts or recycles no held or
  // Loading slot (so it decides as if nothing were held). Pure.
  bool fits(std::span<const ExpertKey> keys, Phase phase) const;
  // Starts loads of up to `limit` absent keys (a hint; no use is counted; see
  // above). out.steps lists the loads started (all `loading`).
  PrefetchSkips prefetch(std::span<const ExpertKey> keys, Phase phase, size_t limit, Plan& out);
  // The host tier takes absent key k (no arena slot, no host copy yet): returns
  // the free host slot the caller fills with its bytes, or -1 when none is free
  // or k has one. For the set-up of a host tier that holds every expert.
  int32_t host_insert(ExpertKey k);
  // The loading slots of `p` now hold their bytes (Loading -> Hot/Transient).
  void commit(const Plan& p);
  // The loading slots of `p` did not get their bytes: their keys become absent.
  // Also valid for a plan that plan() left half-built by throwing. A held plan
  // must be released first.
  void abort(const Plan& p);
  // One reference more / less on every slot of `p` (see "References").
  void hold(const Plan& p);
  void release(const Plan& p);

  Tier where(ExpertKey k) const;  // Tier::Storage when absent; a Loading key's role
  KeyState state(ExpertKey k) const;
  bool loading(ExpertKey k) const { return state(k) == KeyState::Loading; }
  int32_t slot_of(ExpertKey k) const { return slot_of_.at(k); }
  int32_t host_slot_of(ExpertKey k) const { return host_of_.at(k); }
  uint32_t refs(int32_t slot) const { return refs_.at(size_t(slot)); }
  size_t held_slots() const { return held_slots_; }  // slots with references
  size_t hot_count() const { return hot_count_; }
  size_t ring_count() const { return ring_.size(); }
  size_t host_count() const { return host_lru_.size(); }
  std::vector<ExpertKey> hot_keys() const;  // sorted
  const ResidencyConfig& config() const { return cfg_; }
  const Policy& policy() const { return *policy_; }

 private:
  enum class State : uint8_t { Absent, Hot, Transient };  // the role; Loading is per slot
  bool slot_locked(int32_t s) const { return s >= 0 && slot_lock_[s] == gen_; }
  // May the plan in progress evict or recycle slot s?
  bool evictable(int32_t s) const { return !slot_locked(s) && refs_[s] == 0 && !loading_[s]; }
  void classify(ExpertKey k, Phase phase, PlanStep& st);
  void place(PlanStep& st, Plan& out);
  void make_hot_room(Plan& out);
  bool try_hot_room(Plan& out);  // false: no evictable hot key
  int32_t ring_slot(Plan& out);
  int32_t try_ring_slot(Plan& out);  // -1: no evictable ring slot
  int32_t take_free();
  void occupy(PlanStep& st, int32_t s);  // st.key moves into slot s, Loading
  void drop(ExpertKey k, Plan& out);     // k leaves the arena; spills to the host tier
  void spill(ExpertKey k, int32_t slot, Plan& out);
  void ring_remove(int32_t slot);
  bool find_host(ExpertKey k, PlanStep& st);  // a host-tier copy: lock and refresh it

  ResidencyConfig cfg_;
  std::unique_ptr<Policy> policy_;
  std::vector<State> state_;         // [num_keys]
  std::vector<int32_t> slot_of_;     // [num_keys] arena slot or -1
  std::vector<int32_t> host_of_;     // [num_keys] host slot or -1
  std::vector<uint64_t> key_gen_;    // [num_keys] last plan generation that used it
  std::vector<uint8_t> prefetched_;  // [num_keys] brought in by a prefetch, not used yet
  std::vector<int64_t> key_of_;      // [slots] key or -1
  std::vector<uint64_t> slot_lock_;  // [slots] generation that locked it
  std::vector<uint32_t> refs_;       // [slots] references (holds)
  std::vector<uint8_t> loading_;     // [slots] written by a plan not committed yet
  std::vector<int32_t> free_;        // free arena slots (stack)
  size_t hot_count_ = 0;
  size_t held_slots_ = 0;
  std::list<int32_t> ring_;  // transient slots, front = least recently used
  std::vector<std::list<int32_t>::iterator> ring_pos_;  // [slots]
  std::list<int32_t> host_lru_;  // occupied host slots, front = least recently used
  std::vector<std::list<int32_t>::iterator> host_pos_;  // [host_slots]
  std::vector<int64_t> host_key_;                       // [host_slots] key or -1
  std::vector<uint64_t> host_lock_;                     // [host_slots]
  std::vector<int32_t> host_free_;
  uint64_t gen_ = 0;
};

}  // namespace moetier
