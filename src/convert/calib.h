// Calibration statistics for `moetier repack --calib CORPUS`: the mean squared
// input activation of every input column of every expert matrix, over the
// tokens routed to that expert, collected by running the model on the corpus.
//
// Collection: the corpus is tokenized (no special tokens) with the source
// checkpoint's tokenizer.json, cut into windows of `window` tokens (each a
// fresh sequence, prefilled in one forward pass) up to `max_tokens` tokens.
// A RoutingObserver (runtime/routing.h) sees, per MoE layer, the routed
// tokens and their post-attention-norm hidden states xn (the experts' input):
//   gate/up of expert e: sum of xn[t, c]^2 over the tokens t routed to e;
//   down of expert e:    sum of h[t, c]^2, h = silu(gate xn) * up xn (the
//                        down projection's input), computed from the source
//                        expert for those tokens.
// Experts that no calibration token reached fall back to the layer's mean
// xn^2 over all tokens (gate/up) and to unit weights (down).
//
// Not thread-safe; the forward passes run single-sequence, kernels use the thread pool.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "convert/output.h"

namespace moetier {

class Checkpoint;

struct CalibOptions {
  int64_t max_tokens = 8192;  // tokens of the corpus to run
  int64_t window = 256;       // tokens per sequence (capped at max_position_embeddings)
};

class CalibStats {
 public:
  CalibStats(int64_t layers, int64_t experts, int64_t hidden, int64_t inter);

  int64_t tokens() const { return tokens_; }
  int64_t windows() const { return windows_; }
  // Tokens routed to (layer, expert).
  int64_t routed(int64_t layer, int64_t expert) const;
  // Column weights [cols] for one matrix of (layer, expert): the mean squared
  // activation plus a floor of 1% of its mean (so no column is ignored); the
  // fallbacks above when the expert saw no token. down: I columns, else H.
  std::vector<float> weights(int64_t layer, int64_t expert, bool down) const;

  // Accumulation (used by collect_calibration).
  void add_layer(int64_t layer, const float* xn, int64_t n);  // xn [n, H]
  void add_expert(int64_t layer, int64_t expert, const float* xs, const float* h, int64_t m);
  void add_tokens(int64_t n) { tokens_ += n, ++windows_; }

 private:
  struct Acc {
    std::vector<double> in_sq, mid_sq;  // [H], [I]; empty until routed
    int64_t n = 0;
  };
  int64_t layers_, experts_, hidden_, inter_;
  std::vector<Acc> acc_;                       // [layer * experts + expert]
  std::vector<std::vector<double>> layer_sq_;  // [layer][H] over all tokens
  std::vector<int64_t> layer_n_;
  int64_t tokens_ = 0, windows_ = 0;
};

// Runs the model of `ck` over `corpus` and returns the statistics; throws
// Error naming the corpus when it is missing, empty, or encodes to no tokens,
// or when the checkpoint has no tokenizer.json.
CalibStats collect_calibration(const Checkpoint& ck, const std::filesystem::path& corpus,
                               const CalibOptions& opt, ConvertControl control = {});

}  // namespace moetier
