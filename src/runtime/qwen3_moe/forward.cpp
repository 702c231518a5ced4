// Qwen3MoeModel::forward: embeddings, decoder layers, final norm, LM head.
// Each decoder layer: x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)), where mlp
// is the sparse MoE block or the dense MLP (config.is_moe_layer).
#include "core/error.h"
#include "format/safetensors.h"
#include "runtime/moe_block.h"
#include "runtime/qwen3_moe/model.h"

namespace moetier::qwen3_moe {
void Qwen3MoeModel::check_chunk(std::span<const int32_t> tokens, int64_t start_pos,
                                const KvCache& kv) const {
  const std::string where = ck_->dir().string();
  const int64_t n = int64_t(tokens.size());
  check(n > 0, "{}: forward of an empty chunk", where);
  check(start_pos >= 0 && start_pos <= kv.size(),
        "{}: forward at position {} but the kv cache holds {} positions", where, start_pos,
        kv.size());
  check(start_pos + n <= kv.capacity(), "{}: positions {}..{} exceed the kv cache capacity {}",
        where, start_pos, start_pos + n - 1, kv.capacity());
  for (int32_t t : tokens)
    check(t >= 0 && t < cfg_.vocab_size, "{}: token id {} outside the vocabulary [0, {})", where, t,
          cfg_.vocab_size);
}

std::vector<float> Qwen3MoeModel::forward(std::span<const int32_t> tokens, int64_t start_pos,
                                          SequenceState& state, ExpertProvider& experts,
                                          const ForwardOptions& opt) const {
  State* st = dynamic_cast<State*>(&state);
  check(st != nullptr, "{}: forward with another architecture's state", ck_->dir().string());
  KvCache& kv = st->kv;
  check_chunk(tokens, start_pos, kv);
  Backend& be = *be_;
  Workspace& ws = st->ws;
  const Qwen3MoeConfig& c = cfg_;
  const int64_t n = int64_t(tokens.size()), h = c.hidden_size;
  kv.set_size(start_pos);  // positions past start_pos are being rewritten

  float* x = ws.get(kX, n * h);        // [n, hidden] residual stream
  float* xn = ws.get(kXn, n * h);      // [n, hidden] normalized (scratch where fused)
  float* y = ws.get(kY, n * h);        // [n, hidden] block output (scratch where fused)
  float* xa = ws.get(kAttnXn, n * h);  // [n, hidden] normalized attention input (scratch)
  be.embed(embed_, tokens, x);
  // Each layer adds into x; its norms are taken in by their consumers and the
  // adds by their producers (Backend's fused ops: one launch each at decode on
  // CUDA; the defaults compute the separate steps).
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = layers_[size_t(l)];
    const int table = lw.moe ? experts.device_table(l) : -1;
    if (n == 1 && table >= 0 && !(opt.observer && *opt.observer))  // resident decode (moe())
      be.hint_experts({&lw.router, lw.post_attention_norm, table, c.num_experts_per_tok});
    attention(l, x, xa, n, start_pos, *st, y);  // x += attn(rmsnorm(x))
    if (layers_[size_t(l)].moe) {               // x += moe(rmsnorm(x))
      moe(l, x, xn, tokens, start_pos, experts, opt, y, ws);
    } else {
      be.rmsnorm(x, layers_[size_t(l)].post_attention_norm, n, h, float(c.rms_norm_eps), xn);
      dense_mlp(l, xn, n, y, ws);
      be.add(x, y, n * h);
    }
  }
  kv.set_size(start_pos + n);

  const int64_t first = opt.all_logits ? 0 : n - 1, rows = n - first;
  const float eps = float(c.rms_norm_eps);
  const float* xl = x + first * h;  // the final norm: in the LM head where the backend can
  if (opt.device_logits) {
    be.matmul_rmsnorm(lm_head_, xl, final_norm_, eps, rows, opt.device_logits, xn);
    return {};
  }
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab_size));  // [rows, vocab] host
  if (be.is_host()) {
    be.matmul_rmsnorm(lm_head_, xl, final_norm_, eps, rows, logits.data(), xn);
  } else {
    float* dl = ws.get(kLogits, rows * c.vocab_size);
    be.matmul_rmsnorm(lm_head_, xl, final_norm_, eps, rows, dl, xn);
    be.to_host(logits.data(), dl, logits.size() * sizeof(float));
  }
  return logits;
}

void Qwen3MoeModel::dense_mlp(int64_t layer, const float* xn, int64_t n, float* out,
                              Workspace& ws) const {
  const LayerWeights& l = layers_[size_t(layer)];
  const int64_t in = l.gate.rows;
  float* g = ws.get(kMlpG, n * in);  // [n, I]
  float* u = ws.get(kMlpU, n * in);  // [n, I]
  be_->matmul(l.gate, xn, n, g);
  be_->matmul(l.up, xn, n, u);
  be_->silu_mul(g, u, n * in);
  be_->matmul(l.down, g, n, out);
}

// x [n, hidden] += the MoE block of rmsnorm(x); xn and out [n, hidden] scratch.
void Qwen3MoeModel::moe(int64_t layer, float* x, float* xn, std::span<const int32_t> tokens,
                        int64_t start_pos, ExpertProvider& experts, const ForwardOptions& opt,
                        float* out, Workspace& ws) const {
  const int64_t n = int64_t(tokens.size()), h = cfg_.hidden_size;
  const Phase phase = n > 1 ? Phase::Prefill : Phase::Decode;
  const LayerWeights& lw = layers_[size_t(layer)];
  const float eps = float(cfg_.rms_norm_eps);
  const int table = experts.device_table(layer);
  if (n == 1 && table >= 0 && !(opt.observer && *opt.observer)) {  // resident decode, no host
    Backend::NextLayer next;  // the next layer's experts, staged where the provider asks
    const int64_t nl = next_moe_layer(layer);
    if (nl < cfg_.num_hidden_layers) {
      next.table = experts.device_table(nl);
      next.staged = experts.device_staged(nl);
      next.router = &layers_[size_t(nl)].router;
      next.norm = layers_[size_t(nl)].post_attention_norm;
    }
    const bool stage = next.table >= 0 && next.staged;
    route_moe_resident_add_device(*be_, lw.router, table, x, cfg_.num_experts_per_tok,
                                  cfg_.norm_topk_prob, h, cfg_.moe_intermediate_size,
                                  {lw.post_attention_norm, eps, xn, out, stage ? &next : nullptr},
                                  ws, experts.device_ids(layer));
    return;
  }
  be_->rmsnorm(x, lw.post_attention_norm, n, h, eps, xn);
  const Routing r =
      route_softmax_topk(*be_, lw.router, xn, n, cfg_.num_experts_per_tok, cfg_.norm_topk_prob, ws);
  if (opt.observer && *opt.observer) {
    std::vector<float> host;  // the observer reads host memory
    const float* hx = xn;
    if (!be_->is_host()) {
      host.resize(size_t(n * h));
      be_->to_host(host.data(), xn, host.size() * sizeof(float));
      hx = host.data();
    }
    (*opt.observer)({layer, start_pos, phase, &r, tokens, hx});
  }
  MoeBlock b;
  b.layer = layer;
  b.phase = phase;
  b.hidden = h;
  b.intermediate = cfg_.moe_intermediate_size;
  b.routing = &r;
  b.x = xn;
  b.out = out;
  if (n == 1 && experts.wants_next_layer_hints()) {  // layer L + 1's router on L's hidden state
    const int64_t next = next_moe_layer(layer);
    if (next < cfg_.num_hidden_layers)
      b.after_first_submit = [&, next] { hint_layer(next, x, experts, ws); };
  }
  run_moe_block(*be_, experts, b);
  be_->add(x, out, n * h);
}

int64_t Qwen3MoeModel::next_moe_layer(int64_t layer) const {
  int64_t next = layer + 1;
  while (next < cfg_.num_hidden_layers && !layers_[size_t(next)].moe) ++next;
  return next;
}

void Qwen3MoeModel::hint_layer(int64_t next, const float* x, ExpertProvider& experts,
                               Workspace& ws) const {
  const LayerWeights& lw = layers_[size_t(next)];
  const int64_t h = cfg_.hidden_size;
  float* xp = ws.get(kHintXn, h);  // [1, hidden]
  be_->rmsnorm(x, lw.post_attention_norm, 1, h, float(cfg_.rms_norm_eps), xp);
  const Routing r =
      route_softmax_topk(*be_, lw.router, xp, 1, cfg_.num_experts_per_tok, cfg_.norm_topk_prob, ws);
  experts.prefetch(next, r.experts, Phase::Decode);
}

}  // namespace moetier::qwen3_moe
