#include "experts/simulate.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "core/error.h"

namespace moetier {

Replay parse_replay(const std::string& s) {
  if (s == "chunk") return Replay::Chunk;
  if (s == "token") return Replay::Token;
  fail("--replay: unknown mode '{}' (chunk, token)", s);
}

size_t engine_max_pinned(size_t hot, int64_t k) {
  const size_t reserve = std::max<size_t>(size_t(k), (hot + 3) / 4);
  return hot > reserve ? hot - reserve : 0;
}

size_t engine_default_transient(size_t hot, int64_t num_experts, int64_t k) {
  return std::min<size_t>(size_t(num_experts), std::max<size_t>(size_t(k), hot / 8));
}

ReplayStream build_replay(const Trace& t, Replay replay) {
  const TraceModel& m = t.header.model;
  ReplayStream s;
  s.replay = replay;
  std::vector<uint8_t> want(size_t(m.num_experts), 0);
  for (size_t b = 0; b < t.size();) {
    size_t e = b + 1;
    if (replay == Replay::Chunk)
      while (e < t.size() && t.chunk[e] == t.chunk[b]) ++e;
    for (size_t l = 0; l < t.moe_count(); ++l) {
      ReplayGroup g;
      g.layer = m.moe_layers[l];
      g.moe_index = uint32_t(l);
      g.phase = t.phase[b];
      g.tok_begin = uint32_t(b);
      g.tok_end = uint32_t(e);
      g.key_begin = s.keys.size();
      for (size_t i = b; i < e; ++i)
        for (uint16_t id : t.ids(i, l)) want[id] = 1;
      for (int64_t id = 0; id < m.num_experts; ++id) {  // ascending, as group_by_expert
        if (!want[size_t(id)]) continue;
        want[size_t(id)] = 0;
        s.keys.push_back(m.key(g.layer, id));
      }
      g.key_end = s.keys.size();
      s.groups.push_back(g);
    }
    b = e;
  }
  s.next.assign(s.keys.size(), std::numeric_limits<uint64_t>::max());
  std::vector<uint64_t> last(m.num_keys(), std::numeric_limits<uint64_t>::max());
  for (uint64_t i = s.keys.size(); i-- > 0;) {
    s.next[i] = last[s.keys[i]];
    last[s.keys[i]] = i;
  }
  return s;
}

namespace {

// Counts plans and steps into the total and per-phase ExpertStats.
struct Counter {
  const Trace& t;
  SimResult& r;
  std::vector<Tier> last_found;  // [num_keys] tier of the key's latest acquire

  Counter(const Trace& tr, SimResult& res)
      : t(tr), r(res), last_found(tr.header.model.num_keys(), Tier::Storage) {
    const TraceModel& m = t.header.model;
    for (ExpertStats* st : {&r.stats, &r.phase_stats[0], &r.phase_stats[1]}) {
      st->provider = "simulate";
      st->policy = r.policy;
      st->expert_bytes = m.expert_bytes;
      st->slot_bytes = m.slot_bytes;
      st->hot_slots = r.hot_slots;
      st->transient_slots = r.transient_slots;
      st->host_slots = r.host_slots;
      st->total_experts = m.total_experts();
      st->resize_layers(size_t(m.num_layers));
    }
  }
  void plan(int64_t layer, const Plan& p) {
    const uint64_t bytes = t.header.model.expert_bytes;
    auto bytes_of = [bytes](ExpertKey) { return bytes; };
    r.stats.record(layer, p, bytes_of);
    r.phase_stats[p.phase == Phase::Prefill ? 0 : 1].record(layer, p, bytes_of);
    for (const PlanStep& st : p.steps) last_found[st.key] = st.found;
  }
  // As ArenaExperts::note_routing, for every token of the group.
  void steps(const ReplayGroup& g) {
    const TraceModel& m = t.header.model;
    for (uint32_t i = g.tok_begin; i < g.tok_end; ++i) {
      bool all_hit = true;
      for (uint16_t e : t.ids(i, g.moe_index)) {
        const Tier f = last_found[m.key(g.layer, e)];
        all_hit = all_hit && (f == Tier::Hot || f == Tier::Transient);
      }
      r.stats.record_step(g.layer, all_hit);
      r.phase_stats[g.phase == Phase::Prefill ? 0 : 1].record_step(g.layer, all_hit);
    }
  }
};

}  // namespace

SimResult simulate_policy(const Trace& t, const ReplayStream& s, const PolicySim& p) {
  const TraceModel& m = t.header.model;
  SimResult r;
  r.policy = policy_kind_name(p.kind);
  r.hot_slots = p.hot_slots;
  r.transient_slots = p.transient_slots;
  r.host_slots = p.host_slots;
  Residency res(ResidencyConfig{m.num_keys(), p.hot_slots, p.transient_slots, p.host_slots},
                make_policy(p.kind, m.num_keys(), p.ranking, p.max_pinned));
  Counter c(t, r);
  for (ExpertStats* st : {&r.stats, &r.phase_stats[0], &r.phase_stats[1]})
    st->pinned = res.policy().pinned_count();
  // As ArenaExperts::max_batch() and the runtime's batching (runtime/moe.cpp).
  const size_t batch = std::min<size_t>(res.max_batch(), size_t(m.num_experts));
  check(batch >= 1, "simulate: {} hot slots leave no room for a batch", p.hot_slots);
  Plan plan;
  for (const ReplayGroup& g : s.groups) {
    for (uint64_t b = g.key_begin; b < g.key_end; b += batch) {
      const size_t n = size_t(std::min<uint64_t>(batch, g.key_end - b));
      res.plan(std::span<const ExpertKey>(s.keys.data() + b, n), g.phase, plan);
      res.commit(plan);
      c.plan(g.layer, plan);
    }
    c.steps(g);
  }
  return r;
}

SimResult simulate_min(const Trace& t, const ReplayStream& s, size_t capacity) {
  const TraceModel& m = t.header.model;
  check(capacity >= 1, "simulate: MIN needs at least one slot");
  SimResult r;
  r.policy = "min";
  r.hot_slots = capacity;
  Counter c(t, r);
  std::vector<uint8_t> resident(m.num_keys(), 0);
  std::vector<uint64_t> cur_next(m.num_keys(), 0);
  std::priority_queue<std::pair<uint64_t, ExpertKey>> heap;  // (next use, key), lazy
  size_t count = 0;
  Plan plan;
  for (const ReplayGroup& g : s.groups) {
    plan = Plan{};
    plan.phase = g.phase;
    for (uint64_t i = g.key_begin; i < g.key_end; ++i) {
      const ExpertKey k = s.keys[i];
      PlanStep st;
      st.key = k;
      if (resident[k]) {
        st.found = Tier::Hot;
      } else {
        st.found = Tier::Storage;
        if (count == capacity) {  // evict the farthest next use
          for (;;) {
            auto [nx, v] = heap.top();
            heap.pop();
            if (!resident[v] || cur_next[v] != nx) continue;  // stale entry
            resident[v] = 0;
            --count;
            ++plan.hot_evictions;
            break;
          }
        }
        resident[k] = 1;
        ++count;
      }
      cur_next[k] = s.next[i];
      heap.push({s.next[i], k});
      plan.steps.push_back(st);
    }
    c.plan(g.layer, plan);
    c.steps(g);
    if (heap.size() > 4 * capacity + 1024) {  // drop stale entries now and then
      decltype(heap) fresh;
      for (size_t k = 0; k < resident.size(); ++k)
        if (resident[k]) fresh.push({cur_next[k], ExpertKey(k)});
      heap.swap(fresh);
    }
  }
  return r;
}

SimResult simulate_static(const Trace& t, const ReplayStream& s, const std::vector<uint8_t>& in_set,
                          const std::string& name) {
  SimResult r;
  r.policy = name;
  r.hot_slots = size_t(std::count(in_set.begin(), in_set.end(), uint8_t(1)));
  Counter c(t, r);
  Plan plan;
  for (const ReplayGroup& g : s.groups) {
    plan = Plan{};
    plan.phase = g.phase;
    for (uint64_t i = g.key_begin; i < g.key_end; ++i) {
      PlanStep st;
      st.key = s.keys[i];
      st.found = in_set.at(st.key) ? Tier::Hot : Tier::Storage;
      plan.steps.push_back(st);
    }
    c.plan(g.layer, plan);
    c.steps(g);
  }
  return r;
}

}  // namespace moetier
