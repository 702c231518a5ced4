#include "runtime/routing.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "runtime/model.h"
#include "runtime/workspace.h"

namespace moetier {

Routing route_softmax_topk(Backend& be, const MatView& router, const float* x, int64_t n, int64_t k,
                           bool norm_topk_prob, Workspace& ws) {
  const int64_t ne = router.rows;
  check(k >= 1 && k <= ne, "router: top-k {} outside [1, {}] experts", k, ne);
  Routing r;
  r.n_tokens = n;
  r.k = k;
  r.num_experts = ne;
  r.probs.resize(static_cast<size_t>(n * ne));
  r.experts.resize(static_cast<size_t>(n * k));
  r.weights.resize(static_cast<size_t>(n * k));
  if (be.is_host()) {
    be.route_topk(router, x, n, k, norm_topk_prob, r.probs.data(), r.experts.data(),
                  r.weights.data());
    return r;
  }
  float* probs = ws.get(kRouterSlot, n * ne);         // [n, E]
  int32_t* ids = ws.get_i32(kRouterSlot + 1, n * k);  // [n, k]
  float* w = ws.get(kRouterSlot + 2, n * k);          // [n, k]
  be.route_topk(router, x, n, k, norm_topk_prob, probs, ids, w);
  be.to_host(r.probs.data(), probs, r.probs.size() * sizeof(float));
  be.to_host(r.experts.data(), ids, r.experts.size() * sizeof(int32_t));
  be.to_host(r.weights.data(), w, r.weights.size() * sizeof(float));
  return r;
}

namespace {
struct RouterOut {
  float* probs;
  int32_t* ids;
  float* w;
};
RouterOut router_slots(const MatView& router, int64_t k, Workspace& ws, int32_t* ids_out) {
  const int64_t ne = router.rows;
  check(k >= 1 && k <= ne, "router: top-k {} outside [1, {}] experts", k, ne);
  return {ws.get(kRouterSlot, ne),                             // [E]
          ids_out ? ids_out : ws.get_i32(kRouterSlot + 1, k),  // [k]
          ws.get(kRouterSlot + 2, k)};                         // [k]
}
}  // namespace

void route_moe_resident_device(Backend& be, const MatView& router, int table, const float* x,
                               int64_t k, bool norm_topk_prob, int64_t hidden, int64_t intermediate,
                               float* out, Workspace& ws, int32_t* ids_out) {
  const RouterOut r = router_slots(router, k, ws, ids_out);
  be.route_moe_resident(router, table, x, k, norm_topk_prob, r.probs, r.ids, r.w, hidden,
                        intermediate, out);
}

void route_moe_resident_add_device(Backend& be, const MatView& router, int table, float* x,
                                   int64_t k, bool norm_topk_prob, int64_t hidden,
                                   int64_t intermediate, const Backend::NormAdd& f, Workspace& ws,
                                   int32_t* ids_out) {
  const RouterOut r = router_slots(router, k, ws, ids_out);
  be.route_moe_resident_add(router, table, x, k, norm_topk_prob, r.probs, r.ids, r.w, hidden,
                            intermediate, f);
}

Routing route(const MatView& router, const float* x, int64_t n, int64_t k, bool norm_topk_prob) {
  Backend& be = default_cpu_backend();
  Workspace ws(be);
  return route_softmax_topk(be, router, x, n, k, norm_topk_prob, ws);
}

ExpertGroups group_by_expert(const Routing& r) {
  ExpertGroups g;
  std::vector<int64_t> count(static_cast<size_t>(r.num_experts), 0);
  for (int32_t e : r.experts) ++count[size_t(e)];
  std::vector<int64_t> start(count.size(), 0);
  g.offsets.push_back(0);
  for (size_t e = 0; e < count.size(); ++e) {
    if (!count[e]) continue;
    g.ids.push_back(int32_t(e));
    start[e] = g.offsets.back();
    g.offsets.push_back(g.offsets.back() + count[e]);
  }
  g.tokens.resize(r.experts.size());
  g.slots.resize(r.experts.size());
  for (int64_t t = 0; t < r.n_tokens; ++t)  // tokens ascending within each expert
    for (int64_t j = 0; j < r.k; ++j) {
      size_t e = size_t(r.experts[size_t(t * r.k + j)]);
      size_t at = size_t(start[e]++);
      g.tokens[at] = t;
      g.slots[at] = j;
    }
  return g;
}

}  // namespace moetier
