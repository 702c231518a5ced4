// Self-attention of one qwen3_moe decoder layer over a chunk of tokens (in
// place on the residual stream): q/k/v projections (+ biases), q_norm/k_norm
// per head (before RoPE), RoPE, KV-cache write, causal GQA attention,
// o_proj (+ bias), residual.
#include <cmath>

#include "runtime/qwen3_moe/model.h"

namespace moetier::qwen3_moe {
void Qwen3MoeModel::attention(int64_t layer, float* x, int64_t n, int64_t start_pos,
                              State& st) const {
  const Qwen3MoeConfig& c = cfg_;
  const AttentionWeights& a = layers_[size_t(layer)].attn;
  Backend& be = *be_;
  Workspace& ws = st.ws;
  const int64_t h = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, qd = nh * hd, kvd = nkv * hd;
  const float eps = float(c.rms_norm_eps);

  float* xn = ws.get(kAttnXn, n * h);  // [n, hidden]
  be.rmsnorm(x, layers_[size_t(layer)].input_norm, n, h, eps, xn);
  float* q = ws.get(kQ, n * qd);   // [n, heads, hd]
  float* k = ws.get(kK, n * kvd);  // [n, kv_heads, hd]
  float* v = ws.get(kV, n * kvd);  // [n, kv_heads, hd]
  be.matmul(a.q, xn, n, q);
  be.matmul(a.k, xn, n, k);
  be.matmul(a.v, xn, n, v);
  if (a.q_bias) be.add_rows(q, a.q_bias, n, qd);
  if (a.k_bias) be.add_rows(k, a.k_bias, n, kvd);
  if (a.v_bias) be.add_rows(v, a.v_bias, n, kvd);
  be.rmsnorm(q, a.q_norm, n * nh, hd, eps, q);
  be.rmsnorm(k, a.k_norm, n * nkv, hd, eps, k);
  be.rope(q, n, nh, hd, start_pos, inv_freq_);
  be.rope(k, n, nkv, hd, start_pos, inv_freq_);
  KvCache& kv = st.kv;
  be.kv_write(kv.keys(layer), k, start_pos, kvd, n);
  be.kv_write(kv.values(layer), v, start_pos, kvd, n);

  // transformers: scaling = head_dim ** -0.5 (a double, applied to f32 scores).
  const float scale = float(std::pow(double(hd), -0.5));
  float* ctx = ws.get(kCtx, n * qd);  // [n, heads, hd]
  be.attention(q, kv.keys(layer), kv.values(layer), n, start_pos, nh, nkv, hd, scale, ctx);
  float* o = ws.get(kO, n * h);  // [n, hidden]
  be.matmul(a.o, ctx, n, o);
  if (a.o_bias) be.add_rows(o, a.o_bias, n, h);
  be.add(x, o, n * h);
}

}  // namespace moetier::qwen3_moe
