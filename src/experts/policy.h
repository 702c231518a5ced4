// Replacement policies for the hot set of the expert arena. Pure bookkeeping:
// no I/O, no clocks, no randomness, so that `moetier simulate` can drive the
// exact code the engine runs with a recorded token stream and get identical
// counters.
//
// Keys are ExpertKey = layer * num_experts + expert. A policy sees every use of
// a key (resident or not), and is told when a key enters or leaves the hot set;
// it answers which resident key to evict next.
//
// Contract (Residency::fits relies on it): victim() depends only on the order
// the policy keeps among resident keys, and on_use / on_insert / on_erase of a
// key move only that key in that order (the others keep their relative
// order). LRU, LFU and pinned + LRU all do.
//
// Not thread-safe: owned and called by one Residency.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace moetier {

using ExpertKey = uint32_t;

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // Called once per use of `k` (hit or miss), before placement.
  virtual void on_use(ExpertKey k) = 0;
  // `k` became resident in the hot set / left it.
  virtual void on_insert(ExpertKey k) = 0;
  virtual void on_erase(ExpertKey k) = 0;
  // The resident key to evict next, skipping keys for which locked(k) is true
  // (and keys the policy never evicts); nullopt when there is none.
  virtual std::optional<ExpertKey> victim(const std::function<bool(ExpertKey)>& locked) const = 0;
  // Keys the policy never evicts once resident (pinned); 0 for LRU and LFU.
  virtual size_t pinned_count() const { return 0; }
  virtual bool is_pinned(ExpertKey) const { return false; }
};

// Least recently used.
class LruPolicy final : public Policy {
 public:
  explicit LruPolicy(size_t num_keys);
  std::string name() const override { return "lru"; }
  void on_use(ExpertKey k) override;
  void on_insert(ExpertKey k) override;
  void on_erase(ExpertKey k) override;
  std::optional<ExpertKey> victim(const std::function<bool(ExpertKey)>& locked) const override;

 private:
  std::list<ExpertKey> order_;  // front = least recently used
  std::vector<std::list<ExpertKey>::iterator> pos_;
  std::vector<uint8_t> resident_;
};

// Least frequently used, counting every use since start (resident or not);
// ties go to the least recently used, then to the smaller key.
class LfuPolicy final : public Policy {
 public:
  explicit LfuPolicy(size_t num_keys);
  std::string name() const override { return "lfu"; }
  void on_use(ExpertKey k) override;
  void on_insert(ExpertKey k) override;
  void on_erase(ExpertKey k) override;
  std::optional<ExpertKey> victim(const std::function<bool(ExpertKey)>& locked) const override;

 private:
  using Entry = std::tuple<uint64_t, uint64_t, ExpertKey>;  // (uses, last use, key)
  Entry entry(ExpertKey k) const { return {uses_[k], last_[k], k}; }
  std::set<Entry> order_;  // begin() = next victim
  std::vector<uint64_t> uses_, last_;
  std::vector<uint8_t> resident_;
  uint64_t tick_ = 0;
};

// Keys of a ranking (hottest first) are pinned: once resident they are never
// evicted. Everything else is LRU. `max_pinned` caps how many ranking entries
// are pinned (the arena keeps room for one full acquire outside the pins).
class PinnedLruPolicy final : public Policy {
 public:
  PinnedLruPolicy(size_t num_keys, const std::vector<ExpertKey>& ranking, size_t max_pinned);
  std::string name() const override { return "pinned"; }
  void on_use(ExpertKey k) override { lru_.on_use(k); }
  void on_insert(ExpertKey k) override { lru_.on_insert(k); }
  void on_erase(ExpertKey k) override { lru_.on_erase(k); }
  std::optional<ExpertKey> victim(const std::function<bool(ExpertKey)>& locked) const override;
  size_t pinned_count() const override { return n_pinned_; }
  bool is_pinned(ExpertKey k) const override { return k < pinned_.size() && pinned_[k]; }
  // The pinned keys, hottest first.
  const std::vector<ExpertKey>& pinned_keys() const { return pinned_list_; }

 private:
  LruPolicy lru_;
  std::vector<uint8_t> pinned_;
  std::vector<ExpertKey> pinned_list_;
  size_t n_pinned_ = 0;
};

enum class PolicyKind : uint8_t { Lru, Lfu, Pinned };
// "lru" | "lfu" | "pinned"; throws Error otherwise.
PolicyKind parse_policy_kind(const std::string& s);
const char* policy_kind_name(PolicyKind k);

// A ranking file (written by `moetier trace`): one "LAYER EXPERT" pair per
// line, hottest first; '#' starts a comment; extra columns (counts) are
// ignored. Throws Error naming the file and line on bad input or an expert out
// of range.
std::vector<ExpertKey> read_ranking(const std::filesystem::path& file, int64_t num_layers,
                                    int64_t num_experts);

std::unique_ptr<Policy> make_policy(PolicyKind kind, size_t num_keys,
                                    const std::vector<ExpertKey>& ranking = {},
                                    size_t max_pinned = 0);

}  // namespace moetier
