#include "runtime/trace_recorder.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"
#include "experts/index.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "runtime/session.h"

namespace moetier {

TraceModel trace_model_of(const Model& model) {
  const ModelSpec& c = model.spec();
  TraceModel m;
  m.dir = model.checkpoint().dir().string();
  m.model_type = std::string(c.arch->name());
  m.num_layers = c.num_layers;
  m.num_experts = c.num_experts;
  m.k = c.experts_per_token;
  m.moe_layers = c.moe_layers();
  m.hidden = c.hidden_size;
  m.moe_intermediate = c.expert_intermediate;
  const ExpertIndex ix = ExpertIndex::build(model.checkpoint(), c);
  m.encoding = m.moe_layers.empty()
                   ? "unknown"
                   : std::string(encoding_name(ix.shape(m.moe_layers[0], ExpertPart::GateW).enc));
  m.expert_bytes = ix.expert_bytes();
  m.slot_bytes = ix.slot_bytes();
  m.encodings = expert_encoding_bytes(m.hidden, m.moe_intermediate, m.encoding, m.expert_bytes);
  return m;
}

TraceRecorder::TraceRecorder(TraceWriter& writer, const ModelSpec& spec)
    : writer_(writer), moe_index_(size_t(spec.num_layers), -1), k_(spec.experts_per_token) {
  for (int64_t l = 0; l < spec.num_layers; ++l)
    if (spec.is_moe_layer(l)) moe_index_[size_t(l)] = int64_t(moe_count_++);
  seen_.assign(moe_count_, 0);
  observer_ = [this](const RoutingEvent& ev) { observe(ev); };
}

void TraceRecorder::observe(const RoutingEvent& ev) {
  check(ev.layer >= 0 && size_t(ev.layer) < moe_index_.size() && moe_index_[size_t(ev.layer)] >= 0,
        "trace: routing reported for layer {}, which is not a MoE layer", ev.layer);
  const Routing& r = *ev.routing;
  check(r.k == k_, "trace: layer {} routed top-{}, the model says {}", ev.layer, r.k, k_);
  const size_t m = size_t(moe_index_[size_t(ev.layer)]);
  if (n_ < 0) {
    n_ = r.n_tokens;
    phase_ = ev.phase;
    experts_.assign(moe_count_ * size_t(n_ * k_), 0);
    weights_.assign(experts_.size(), 0.0f);
  }
  check(r.n_tokens == n_ && ev.phase == phase_ && !seen_[m],
        "trace: inconsistent routing events in one forward pass (layer {})", ev.layer);
  seen_[m] = 1;
  const size_t per = size_t(n_ * k_);
  std::copy_n(r.experts.data(), per, experts_.data() + m * per);
  std::copy_n(r.weights.data(), per, weights_.data() + m * per);
}

void TraceRecorder::end_chunk(uint32_t sequence, uint16_t corpus, int64_t start_pos,
                              std::span<const int32_t> tokens) {
  check(n_ == int64_t(tokens.size()), "trace: forward pass of {} tokens reported routing for {}",
        tokens.size(), n_);
  check(std::all_of(seen_.begin(), seen_.end(), [](uint8_t s) { return s != 0; }),
        "trace: a MoE layer reported no routing");
  writer_.add_chunk(sequence, corpus, start_pos, phase_, tokens, experts_, weights_);
  n_ = -1;
  std::fill(seen_.begin(), seen_.end(), 0);
}

void TraceRecorder::run_window(const Model& model, ExpertProvider& experts,
                               std::span<const int32_t> prompt, int64_t decode, uint32_t sequence,
                               uint16_t corpus) {
  check(!prompt.empty() && decode >= 0, "trace: empty window");
  const int64_t V = model.spec().vocab_size;
  Session session(model, experts, int64_t(prompt.size()) + decode);
  ForwardOptions fo;
  fo.observer = &observer_;
  const std::vector<float>* logits = &session.prefill(prompt, fo);
  end_chunk(sequence, corpus, 0, prompt);
  int64_t pos = int64_t(prompt.size());
  for (int64_t s = 0; s < decode; ++s, ++pos) {
    const int32_t next =
        int32_t(std::max_element(logits->begin(), logits->begin() + V) - logits->begin());
    logits = &session.decode(next, fo);
    const int32_t one[1] = {next};
    end_chunk(sequence, corpus, pos, one);
  }
}

}  // namespace moetier
