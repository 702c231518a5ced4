#include "runtime/routing.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/cpu.h"

namespace moetier {

Routing route(const MatView& router, const float* x, int64_t n, int64_t k, bool norm_topk_prob) {
  const int64_t ne = router.rows;
  check(k >= 1 && k <= ne, "router: top-k {} outside [1, {}] experts", k, ne);
  Routing r;
  r.n_tokens = n;
  r.k = k;
  r.num_experts = ne;
  r.probs.resize(static_cast<size_t>(n * ne));
  r.experts.resize(static_cast<size_t>(n * k));
  r.weights.resize(static_cast<size_t>(n * k));
  cpu::matmul(router, x, n, r.probs.data());  // logits [n, E]
  std::vector<int32_t> order(static_cast<size_t>(ne));
  for (int64_t t = 0; t < n; ++t) {
    float* p = r.probs.data() + t * ne;
    cpu::softmax(p, ne);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[order[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = order[size_t(j)];
      r.experts[size_t(t * k + j)] = e;
      r.weights[size_t(t * k + j)] = norm_topk_prob ? p[e] / sum : p[e];
    }
  }
  return r;
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
