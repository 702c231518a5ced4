// The golden fixtures of tests/data/fixtures/<name>/ (made by
// scripts/gen_fixtures.py): reference.json + reference.safetensors (input ids,
// logits at every prompt position, greedy continuation per prompt), read for
// the CPU golden test and the CUDA model test. Including it pins the exact
// f32 activations (golden/exact_activations.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "golden/exact_activations.h"

namespace moetier::testing {

namespace fs = std::filesystem;

inline fs::path fixtures_root() { return fs::path(MOETIER_SOURCE_DIR) / "tests/data/fixtures"; }

inline std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (!fs::is_directory(fixtures_root(), ec)) return dirs;
  for (const auto& e : fs::directory_iterator(fixtures_root()))
    if (e.is_directory() && fs::exists(e.path() / "reference.json")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// reference.safetensors, read whole: name -> (shape, raw bytes).
struct RefTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

inline std::map<std::string, RefTensor> read_reference(const fs::path& file) {
  Shard shard;
  std::vector<std::string> problems;
  auto infos = parse_safetensors_header(file, 0, shard, problems);
  if (!problems.empty()) throw Error(problems.front());
  std::ifstream in(file, std::ios::binary);
  std::map<std::string, RefTensor> out;
  for (const auto& t : infos) {
    RefTensor r{t.dtype, t.shape, std::vector<char>(t.nbytes())};
    in.seekg(std::streamoff(shard.data_offset + t.begin));
    in.read(r.bytes.data(), std::streamsize(r.bytes.size()));
    if (!in) throw Error(file.string() + ": cannot read tensor " + t.name);
    out.emplace(t.name, std::move(r));
  }
  return out;
}

inline std::vector<int32_t> as_ids(const RefTensor& t) {
  EXPECT_EQ(t.dtype, DType::I64);
  std::vector<int32_t> ids(t.bytes.size() / 8);
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t v;
    std::memcpy(&v, t.bytes.data() + 8 * i, 8);
    ids[i] = int32_t(v);
  }
  return ids;
}

inline std::vector<float> as_f32(const RefTensor& t) {
  EXPECT_EQ(t.dtype, DType::F32);
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), v.size() * 4);
  return v;
}

struct Fixture {
  fs::path dir;
  nlohmann::json meta;
  std::map<std::string, RefTensor> ref;
  std::unique_ptr<Checkpoint> ck;

  explicit Fixture(const fs::path& d) : dir(d) {
    std::ifstream f(d / "reference.json");
    meta = nlohmann::json::parse(f);
    ref = read_reference(d / "reference.safetensors");
    ck = Checkpoint::open(d);
  }
  size_t prompts() const { return meta.at("prompts").size(); }
  const RefTensor& get(size_t i, const std::string& what) const {
    return ref.at("p" + std::to_string(i) + "." + what);
  }
};

}  // namespace moetier::testing
