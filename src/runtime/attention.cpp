// Self-attention of one decoder layer over a chunk of tokens (in place on the
// residual stream): q/k/v projections (+ biases), q_norm/k_norm per head
// (before RoPE), RoPE, KV-cache write, causal GQA attention, o_proj, residual.
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu.h"
#include "runtime/model.h"

namespace moetier {
namespace {

void add_bias(float* y, const std::vector<float>& b, int64_t n) {
  if (b.empty()) return;
  const int64_t d = int64_t(b.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) y[t * d + i] += b[size_t(i)];
}

}  // namespace

void Qwen3MoeModel::attention(int64_t layer, float* x, int64_t n, int64_t start_pos,
                              KvCache& kv) const {
  const Qwen3MoeConfig& c = cfg_;
  const LayerWeights& l = layers_[size_t(layer)];
  const AttentionWeights& a = l.attn;
  const int64_t h = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, qd = nh * hd, kvd = nkv * hd;
  const float eps = float(c.rms_norm_eps);

  std::vector<float> xn(static_cast<size_t>(n * h));  // [n, hidden]
  cpu::rmsnorm(x, l.input_norm.data(), n, h, eps, xn.data());
  std::vector<float> q(static_cast<size_t>(n * qd));   // [n, heads, hd]
  std::vector<float> k(static_cast<size_t>(n * kvd));  // [n, kv_heads, hd]
  std::vector<float> v(static_cast<size_t>(n * kvd));  // [n, kv_heads, hd]
  cpu::matmul(a.q, xn.data(), n, q.data());
  cpu::matmul(a.k, xn.data(), n, k.data());
  cpu::matmul(a.v, xn.data(), n, v.data());
  add_bias(q.data(), a.q_bias, n);
  add_bias(k.data(), a.k_bias, n);
  add_bias(v.data(), a.v_bias, n);
  cpu::rmsnorm(q.data(), a.q_norm.data(), n * nh, hd, eps, q.data());
  cpu::rmsnorm(k.data(), a.k_norm.data(), n * nkv, hd, eps, k.data());
  cpu::rope(q.data(), n, nh, hd, start_pos, inv_freq_.data());
  cpu::rope(k.data(), n, nkv, hd, start_pos, inv_freq_.data());
  std::memcpy(kv.keys(layer) + start_pos * kvd, k.data(), k.size() * sizeof(float));
  std::memcpy(kv.values(layer) + start_pos * kvd, v.data(), v.size() * sizeof(float));

  // transformers: scaling = head_dim ** -0.5 (a double, applied to f32 scores).
  const float scale = float(std::pow(double(hd), -0.5));
  std::vector<float> ctx(static_cast<size_t>(n * qd));  // [n, heads, hd]
  cpu::attention(q.data(), kv.keys(layer), kv.values(layer), n, start_pos, nh, nkv, hd, scale,
                 ctx.data());
  std::vector<float> o(static_cast<size_t>(n * h));  // [n, hidden]
  cpu::matmul(a.o, ctx.data(), n, o.data());
  add_bias(o.data(), a.o_bias, n);
  for (size_t i = 0; i < o.size(); ++i) x[i] += o[i];
}

}  // namespace moetier
