// Self-attention of one qwen3_moe decoder layer over a chunk of tokens, added
// into the residual stream: input RMSNorm and q/k/v projections (+ biases;
// one fused op), q_norm/k_norm per head (before RoPE), RoPE, KV-cache write,
// causal GQA attention, o_proj (+ bias) added to x (one fused op).
#include <cmath>

#include "runtime/qwen3_moe/model.h"

namespace moetier::qwen3_moe {
void Qwen3MoeModel::attention(int64_t layer, float* x, float* xn, int64_t n, int64_t start_pos,
                              State& st, float* o) const {
  const Qwen3MoeConfig& c = cfg_;
  const AttentionWeights& a = layers_[size_t(layer)].attn;
  Backend& be = *be_;
  Workspace& ws = st.ws;
  const int64_t h = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, qd = nh * hd, kvd = nkv * hd;
  const float eps = float(c.rms_norm_eps);

  float* q = ws.get(kQ, n * qd);   // [n, heads, hd]
  float* k = ws.get(kK, n * kvd);  // [n, kv_heads, hd]
  float* v = ws.get(kV, n * kvd);  // [n, kv_heads, hd]
  const MatView qkv[3] = {a.q, a.k, a.v};
  float* const outs[3] = {q, k, v};
  be.matmul_multi_rmsnorm(qkv, x, layers_[size_t(layer)].input_norm, eps, n, outs, xn);
  if (a.q_bias) be.add_rows(q, a.q_bias, n, qd);
  if (a.k_bias) be.add_rows(k, a.k_bias, n, kvd);
  if (a.v_bias) be.add_rows(v, a.v_bias, n, kvd);
  KvCache& kv = st.kv;
  // transformers: scaling = head_dim ** -0.5 (a double, applied to f32 scores).
  const float scale = float(std::pow(double(hd), -0.5));
  float* ctx = ws.get(kCtx, n * qd);  // [n, heads, hd]
  if (n == 1) {                       // decode: the per-head steps and attention in one backend op
    be.attend_decode(q, k, v, a.q_norm, a.k_norm, nh, nkv, hd, eps, start_pos, inv_freq_,
                     kv.keys(layer), kv.values(layer), scale, ctx);
  } else {
    be.qk_norm_rope_kv(q, k, v, a.q_norm, a.k_norm, n, nh, nkv, hd, eps, start_pos, inv_freq_,
                       kv.keys(layer), kv.values(layer));
    be.attention(q, kv.keys(layer), kv.values(layer), n, start_pos, nh, nkv, hd, scale, ctx);
  }
  if (a.o_bias) {
    be.matmul(a.o, ctx, n, o);
    be.add_rows(o, a.o_bias, n, h);
    be.add(x, o, n * h);
  } else {
    be.matmul_add(a.o, ctx, n, x, o);
  }
}

}  // namespace moetier::qwen3_moe
