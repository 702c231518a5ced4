// A synthetic qwen3_moe checkpoint (random weights, per-expert MXFP4 or bf16
// experts, 4 KiB-aligned tensors) for benchmarks on a model much larger than
// the test fixtures. Routing of random weights has no designed hot set.
#pragma once

#include <cstdint>
#include <filesystem>

namespace moetier::bench {

struct SyntheticSpec {
  int64_t layers = 8, experts = 64, top_k = 8, hidden = 1024, moe_inter = 512;
  int64_t heads = 8, kv_heads = 2, head_dim = 64, vocab = 4096;
  bool mxfp4 = true;
  uint32_t seed = 1;
  int shards = 4;
};

// Writes the checkpoint to `dir` (which must not exist).
void write_synthetic(const std::filesystem::path& dir, const SyntheticSpec& s);

}  // namespace moetier::bench
