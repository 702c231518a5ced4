#include "experts/policy.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace moetier {

// ---- LRU ----

LruPolicy::LruPolicy(size_t num_keys) : pos_(num_keys), resident_(num_keys, 0) {}

void LruPolicy::on_use(ExpertKey k) {
  if (resident_.at(k)) order_.splice(order_.end(), order_, pos_[k]);
}

void LruPolicy::on_insert(ExpertKey k) {
  if (resident_.at(k)) return;
  resident_[k] = 1;
  pos_[k] = order_.insert(order_.end(), k);
}

void LruPolicy::on_erase(ExpertKey k) {
  if (!resident_.at(k)) return;
  resident_[k] = 0;
  order_.erase(pos_[k]);
}

std::optional<ExpertKey> LruPolicy::victim(const std::function<bool(ExpertKey)>& locked) const {
  for (ExpertKey k : order_) {
    if (!locked(k)) return k;
  }
  return std::nullopt;
}

// ---- LFU ----

LfuPolicy::LfuPolicy(size_t num_keys)
    : uses_(num_keys, 0), last_(num_keys, 0), resident_(num_keys, 0) {}

void LfuPolicy::on_use(ExpertKey k) {
  if (resident_.at(k)) order_.erase(entry(k));
  uses_[k]++;
  last_[k] = ++tick_;
  if (resident_[k]) order_.insert(entry(k));
}

void LfuPolicy::on_insert(ExpertKey k) {
  if (resident_.at(k)) return;
  resident_[k] = 1;
  order_.insert(entry(k));
}

void LfuPolicy::on_erase(ExpertKey k) {
  if (!resident_.at(k)) return;
  resident_[k] = 0;
  order_.erase(entry(k));
}

std::optional<ExpertKey> LfuPolicy::victim(const std::function<bool(ExpertKey)>& locked) const {
  for (const Entry& e : order_) {
    if (!locked(std::get<2>(e))) return std::get<2>(e);
  }
  return std::nullopt;
}

// ---- pinned + LRU ----

PinnedLruPolicy::PinnedLruPolicy(size_t num_keys, const std::vector<ExpertKey>& ranking,
                                 size_t max_pinned)
    : lru_(num_keys), pinned_(num_keys, 0) {
  for (ExpertKey k : ranking) {
    if (n_pinned_ >= max_pinned) break;
    check(k < num_keys, "ranking: expert key {} out of range ({} keys)", k, num_keys);
    if (pinned_[k]) continue;  // duplicates count once
    pinned_[k] = 1;
    pinned_list_.push_back(k);
    ++n_pinned_;
  }
}

std::optional<ExpertKey> PinnedLruPolicy::victim(
    const std::function<bool(ExpertKey)>& locked) const {
  return lru_.victim([&](ExpertKey k) { return pinned_[k] || locked(k); });
}

// ---- factory, ranking files ----

PolicyKind parse_policy_kind(const std::string& s) {
  if (s == "lru") return PolicyKind::Lru;
  if (s == "lfu") return PolicyKind::Lfu;
  if (s == "pinned") return PolicyKind::Pinned;
  fail("--policy: unknown policy '{}' (lru, lfu, pinned)", s);
}

const char* policy_kind_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::Lru:
      return "lru";
    case PolicyKind::Lfu:
      return "lfu";
    case PolicyKind::Pinned:
      return "pinned";
  }
  return "?";
}

std::vector<ExpertKey> read_ranking(const std::filesystem::path& file, int64_t num_layers,
                                    int64_t num_experts) {
  std::ifstream in(file);
  check(bool(in), "{}: cannot open ranking file", file.string());
  std::vector<ExpertKey> keys;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream ss(line);
    int64_t layer = 0, expert = 0;
    if (!(ss >> layer)) {
      check(line.find_first_not_of(" \t\r") == std::string::npos, "{}:{}: expected 'LAYER EXPERT'",
            file.string(), lineno);
      continue;
    }
    check(bool(ss >> expert), "{}:{}: expected 'LAYER EXPERT'", file.string(), lineno);
    check(layer >= 0 && layer < num_layers && expert >= 0 && expert < num_experts,
          "{}:{}: layer {} expert {} out of range ({} layers, {} experts)", file.string(), lineno,
          layer, expert, num_layers, num_experts);
    keys.push_back(ExpertKey(layer * num_experts + expert));
  }
  return keys;
}

std::unique_ptr<Policy> make_policy(PolicyKind kind, size_t num_keys,
                                    const std::vector<ExpertKey>& ranking, size_t max_pinned) {
  switch (kind) {
    case PolicyKind::Lru:
      return std::make_unique<LruPolicy>(num_keys);
    case PolicyKind::Lfu:
      return std::make_unique<LfuPolicy>(num_keys);
    case PolicyKind::Pinned:
      return std::make_unique<PinnedLruPolicy>(num_keys, ranking, max_pinned);
  }
  fail("unknown policy");
}

}  // namespace moetier
