// Qwen3MoeModel::forward: embeddings, decoder layers, final norm, LM head.
// Each decoder layer: x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)), where mlp
// is the sparse MoE block or the dense MLP (config.is_moe_layer).
#include <algorithm>

#include "core/error.h"
#include "format/safetensors.h"
#include "kernels/cpu/cpu.h"
#include "runtime/model.h"

namespace moetier {

std::vector<float> Qwen3MoeModel::forward(std::span<const int32_t> tokens, int64_t start_pos,
                                          KvCache& kv, ExpertProvider& experts,
                                          const ForwardOptions& opt) const {
  const Qwen3MoeConfig& c = cfg_;
  const int64_t n = int64_t(tokens.size()), h = c.hidden_size;
  const std::string where = ck_->dir().string();
  check(n > 0, "{}: forward of an empty chunk", where);
  check(kv.layers() == c.num_hidden_layers && kv.kv_heads() == c.num_key_value_heads &&
            kv.head_dim() == c.head_dim,
        "{}: kv cache shape does not match the model", where);
  check(start_pos >= 0 && start_pos <= kv.size(),
        "{}: forward at position {} but the kv cache holds {} positions", where, start_pos,
        kv.size());
  check(start_pos + n <= kv.capacity(), "{}: positions {}..{} exceed the kv cache capacity {}",
        where, start_pos, start_pos + n - 1, kv.capacity());
  for (int32_t t : tokens)
    check(t >= 0 && t < c.vocab_size, "{}: token id {} outside the vocabulary [0, {})", where, t,
          c.vocab_size);
  kv.set_size(start_pos);  // positions past start_pos are being rewritten

  std::vector<float> x(static_cast<size_t>(n * h));   // [n, hidden] residual stream
  std::vector<float> xn(static_cast<size_t>(n * h));  // [n, hidden] normalized
  std::vector<float> y(static_cast<size_t>(n * h));   // [n, hidden] block output
  for (int64_t t = 0; t < n; ++t) cpu::get_row(embed_, tokens[size_t(t)], x.data() + t * h);

  const float eps = float(c.rms_norm_eps);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    attention(l, x.data(), n, start_pos, kv);
    cpu::rmsnorm(x.data(), layers_[size_t(l)].post_attention_norm.data(), n, h, eps, xn.data());
    if (layers_[size_t(l)].moe)
      moe(l, xn.data(), tokens, start_pos, experts, opt, y.data());
    else
      dense_mlp(l, xn.data(), n, y.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  kv.set_size(start_pos + n);

  const int64_t first = opt.all_logits ? 0 : n - 1, rows = n - first;
  cpu::rmsnorm(x.data() + first * h, final_norm_.data(), rows, h, eps, xn.data());
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab_size));  // [rows, vocab]
  cpu::matmul(lm_head_, xn.data(), rows, logits.data());
  return logits;
}

void Qwen3MoeModel::dense_mlp(int64_t layer, const float* xn, int64_t n, float* out) const {
  const LayerWeights& l = layers_[size_t(layer)];
  const int64_t in = l.gate.rows;
  std::vector<float> g(static_cast<size_t>(n * in)), u(static_cast<size_t>(n * in));  // [n, I]
  cpu::matmul(l.gate, xn, n, g.data());
  cpu::matmul(l.up, xn, n, u.data());
  cpu::silu_mul(g.data(), u.data(), n * in);
  cpu::matmul(l.down, g.data(), n, out);
}

}  // namespace moetier
