// moetier synth: a checkpoint with the shapes of a real model (an
// architecture's preset, model/architecture.h) and random weights whose router
// has a realistic skew, for benchmarks of models that are not on the machine.
//
// Weights (seeded, reproducible; never zeros):
//   - embeddings: e_t = 0.8 m + 0.6 n_t, a shared direction m plus a random
//     one per token, both of norm sqrt(H) (elements ~1, far above what the
//     layers add);
//   - norms 1; attention and dense matrices N(0, 0.02); the matrices that
//     write the residual stream (o_proj, down_proj, experts' down) 100x
//     smaller, so every layer's router sees x ~ 0.8 m^ + 0.6 n^ (measured:
//     docs/synth.md);
//   - router row e = (tau q_e / (0.8 sqrt(H))) m^ + (1 / 0.6) r_e (r_e a random
//     unit vector), so its logit is tau q_e + N(0, 1) for a random token: q_e
//     are the expert's standard-normal popularity scores (a fresh permutation
//     per layer) and tau is calibrated so that the top `hot_share` of experts
//     take `hot_calls` of the routed calls (by default 26% take 74%, the
//     reference report's measurement);
//   - experts: MXFP4 (random codes, e8m0 scales 2^-6; down 2^-16) or bf16.
// The checkpoint is written shard by shard (at most ~4 GiB each) into a
// temporary directory renamed to OUT at the end (convert/output.h's rules).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace moetier {

struct SynthOptions {
  std::string preset;             // e.g. "qwen3-30b-a3b"
  std::string experts = "mxfp4";  // mxfp4 | bf16
  int64_t layers = 0;             // 0: the preset's
  uint64_t seed = 1;
  double hot_share = 0.26, hot_calls = 0.74;
  std::filesystem::path tokenizer;  // a directory with tokenizer.json (+ _config)
  // KEY=VALUE: the preset's integer config.json field KEY set to VALUE (> 0)
  // before the checkpoint is planned (e.g. num_experts=384), in order
  std::vector<std::string> set;
  std::function<void(const std::string&)> log;
};

struct SynthReport {
  uint64_t bytes = 0;  // tensor bytes written
  int64_t shards = 0;
  double tau = 0;        // the calibrated router scale
  double hot_calls = 0;  // the top hot_share's share of calls, as calibrated
};

SynthReport write_synthetic(const std::filesystem::path& out, const SynthOptions& opt);

// The top `share` of experts' share of routed calls when logits are
// tau * q_e + N(0, 1) (q_e standard-normal quantiles), top-k of e experts,
// estimated from `samples` random tokens (seeded).
double hot_call_share(double tau, int64_t experts, int64_t k, double share, int samples,
                      uint64_t seed);

}  // namespace moetier
