// The reference of the arena tests: the CPU engine's greedy run on one
// fixture with every expert resident through the checkpoint's mmap.
// Header-only: each test_*.cpp is its own executable.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "greedy_fixture.h"
#include "model/architecture.h"
#include "runtime/mapped_experts.h"

namespace moetier::testing {

// The fixtures of the bit-identity tests (paths under the source tree).
inline const char* const kGreedyFixtures[] = {
    "tests/data/fixtures/qwen3moe-bf16", "tests/data/fixtures/qwen3moe-mxfp4",
    "tests/data/fixtures/qwen3moe-sharded", "models/moetier-tiny"};

struct CpuReference {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Model> model;  // on the CPU backend
  std::vector<int32_t> prompt;   // random tokens
  GreedyRun run;                 // prefill, then `steps` greedy decode steps
  const ModelSpec& spec() const { return model->spec(); }
};

inline CpuReference cpu_reference(const char* fixture, size_t prompt_tokens, uint32_t seed,
                                  int steps) {
  CpuReference r;
  r.ck = Checkpoint::open(std::filesystem::path(MOETIER_SOURCE_DIR) / fixture);
  r.model = load_model(*r.ck);
  r.prompt = random_tokens(r.spec().vocab_size, prompt_tokens, seed);
  MappedExperts mapped(*r.ck, r.spec());
  r.run = greedy_run(*r.model, mapped, r.prompt, steps);
  return r;
}

}  // namespace moetier::testing
