// The generation loop: prefill the prompt in one chunk, then decode one token
// at a time, sampling each next token; stop at end-of-sequence or after
// max_new_tokens. Single-threaded driver (kernels use the thread pool inside).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "experts/provider.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace moetier {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  SamplerConfig sampling;
  std::vector<int32_t> eos;  // stop when one is sampled (it is not passed to on_token)
  const RoutingObserver* observer = nullptr;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;    // the prompt's forward pass (its last logits included)
  int64_t generated_tokens = 0;  // tokens passed to on_token
  int64_t decode_steps = 0;      // one-token forward passes
  double decode_seconds = 0;
  bool stopped_at_eos = false;
  std::vector<int32_t> tokens;  // the generated tokens (without eos)
};

// Prefills the prompt at the session's position, then decodes. on_token runs
// after each token is sampled, before the next forward pass. The session
// needs capacity for position + prompt + max_new_tokens - 1.
GenerateStats generate(Session& session, std::span<const int32_t> prompt,
                       const GenerateOptions& opt,
                       const std::function<void(int32_t)>& on_token = {});
// The same on a fresh session of model + experts.
GenerateStats generate(const Model& model, ExpertProvider& experts, std::span<const int32_t> prompt,
                       const GenerateOptions& opt,
                       const std::function<void(int32_t)>& on_token = {});

}  // namespace moetier
