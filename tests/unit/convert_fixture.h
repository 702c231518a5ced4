// Helpers shared by the prune and repack tests: fixture paths, running the
// model, the CLI in a subprocess, and checks that no output or temporary
// directory was left behind. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "numeric.h"
#include "qwen3_fixture.h"
#include "runtime/kv_cache.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"

using moetier::testing::max_rel_diff;
using moetier::testing::rms_rel_diff;

namespace moetier::testing {

inline fs::path golden(const std::string& name) {
  return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures" / name;
}
inline fs::path tiny_model() { return fs::path(MOETIER_SOURCE_DIR) / "models/moetier-tiny"; }

inline std::vector<int32_t> random_tokens(int64_t vocab, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(rng() % uint64_t(vocab));
  return p;
}

// Logits [n, vocab] of one prefill chunk with every expert mapped; optional
// observer (e.g. to record routing).
inline std::vector<float> prefill_logits(const fs::path& dir, const std::vector<int32_t>& tokens,
                                         const RoutingObserver* obs = nullptr) {
  auto ck = Checkpoint::open(dir);
  const std::unique_ptr<Model> model_owned = load_model(*ck);
  const Model& model = *model_owned;
  MappedExperts experts(*ck, model.spec());
  auto kv = model.new_state(int64_t(tokens.size()));
  ForwardOptions o;
  o.all_logits = true;
  o.observer = obs;
  return model.forward(tokens, 0, *kv, experts, o);
}

using testutil::CliResult;
using testutil::run_cli;

inline int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

// Entries of `parent` whose name is `name` or starts with `name` + ".tmp".
inline std::vector<std::string> leftovers(const fs::path& parent, const std::string& name) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string n = e.path().filename().string();
    if (n == name || n.starts_with(name + ".tmp")) out.push_back(n);
  }
  return out;
}

inline nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(read_file(p)); }

// The ModelSpec DIR/config.json describes (throws its first problem).
inline ModelSpec config_of(const fs::path& dir) {
  const nlohmann::json j = read_json(dir / "config.json");
  std::vector<std::string> problems;
  ModelSpec s = architecture_of(j, dir / "config.json").parse(j, dir / "config.json", problems);
  if (!problems.empty()) throw Error(problems.front());
  return s;
}

}  // namespace moetier::testing
