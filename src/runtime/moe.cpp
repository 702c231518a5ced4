// The sparse MoE block of one layer: route the chunk, group its tokens by
// expert, acquire the distinct experts from the ExpertProvider (at most
// max_batch() per call) and run each on its token group:
//   out[t] += w(t, e) * down(silu(gate x_t) * up x_t)
// Experts are applied in ascending id order, as transformers' index_add_ loop,
// so every token's sum has the reference's order.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "runtime/model.h"

namespace moetier {
namespace {

void check_expert(const ExpertView& v, int64_t layer, int32_t id, int64_t h, int64_t in) {
  check(v.gate.rows == in && v.gate.cols == h && v.up.rows == in && v.up.cols == h &&
            v.down.rows == h && v.down.cols == in,
        "layer {} expert {}: provider returned shapes gate [{}, {}] up [{}, {}] down [{}, {}], "
        "expected [{}, {}], [{}, {}], [{}, {}]",
        layer, id, v.gate.rows, v.gate.cols, v.up.rows, v.up.cols, v.down.rows, v.down.cols, in, h,
        in, h, h, in);
}

// Scratch reused across the experts of one block.
struct ExpertScratch {
  std::vector<float> xs, g, u, ys;  // [m, H], [m, I], [m, I], [m, H]
};

// Runs one expert on group i of g and accumulates into out [n, H].
void run_expert(const ExpertView& v, const ExpertGroups& g, size_t i, const Routing& r,
                const float* xn, int64_t h, float* out, ExpertScratch& s) {
  const int64_t in = v.gate.rows;
  const int64_t b = g.offsets[i], m = g.offsets[i + 1] - b;
  s.xs.resize(static_cast<size_t>(m * h));
  s.ys.resize(static_cast<size_t>(m * h));
  s.g.resize(static_cast<size_t>(m * in));
  s.u.resize(static_cast<size_t>(m * in));
  for (int64_t j = 0; j < m; ++j)
    std::copy_n(xn + g.tokens[size_t(b + j)] * h, h, s.xs.data() + j * h);
  cpu::matmul(v.gate, s.xs.data(), m, s.g.data());
  cpu::matmul(v.up, s.xs.data(), m, s.u.data());
  cpu::silu_mul(s.g.data(), s.u.data(), m * in);
  cpu::matmul(v.down, s.g.data(), m, s.ys.data());
  for (int64_t j = 0; j < m; ++j) {
    const int64_t t = g.tokens[size_t(b + j)];
    const float w = r.weights[size_t(t * r.k + g.slots[size_t(b + j)])];
    const float* yj = s.ys.data() + j * h;
    float* ot = out + t * h;
    for (int64_t c = 0; c < h; ++c) ot[c] += yj[c] * w;
  }
}

}  // namespace

void Qwen3MoeModel::moe(int64_t layer, const float* xn, std::span<const int32_t> tokens,
                        int64_t start_pos, ExpertProvider& experts, const ForwardOptions& opt,
                        float* out) const {
  const Qwen3MoeConfig& c = cfg_;
  const int64_t n = int64_t(tokens.size()), h = c.hidden_size;
  const Phase phase = n > 1 ? Phase::Prefill : Phase::Decode;
  const Routing r =
      route(layers_[size_t(layer)].router, xn, n, c.num_experts_per_tok, c.norm_topk_prob);
  if (opt.observer && *opt.observer) (*opt.observer)({layer, start_pos, phase, &r, tokens, xn});

  const ExpertGroups g = group_by_expert(r);
  std::fill(out, out + n * h, 0.0f);
  const int64_t batch = experts.max_batch();
  check(batch >= 1, "layer {}: expert provider max_batch() is {}", layer, batch);
  std::vector<ExpertView> views;
  ExpertScratch scratch;
  for (size_t b0 = 0; b0 < g.ids.size(); b0 += size_t(batch)) {
    const size_t cnt = std::min(g.ids.size() - b0, size_t(batch));
    std::span<const int32_t> ids(g.ids.data() + b0, cnt);
    experts.acquire(layer, ids, phase, views);
    check(views.size() == cnt, "layer {}: expert provider returned {} views for {} experts", layer,
          views.size(), cnt);
    for (size_t i = 0; i < cnt; ++i) {
      check_expert(views[i], layer, ids[i], h, c.moe_intermediate_size);
      run_expert(views[i], g, b0 + i, r, xn, h, out, scratch);
    }
  }
  experts.note_routing(layer, r.experts, r.k);  // accounting (all-k-hit share)
}

}  // namespace moetier
