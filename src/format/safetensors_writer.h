// Writing safetensors files and checkpoint directories, atomically (through
// core/atomic_file.h: a file appears whole under its name or not at all; a
// checkpoint directory is built under a temporary name and renamed).
//
// Alignment (docs/formats.md): with `align` set, the header is padded with
// trailing spaces so that the data section starts at a multiple of `align`,
// and the gap before each tensor that would start unaligned is filled by an
// explicit padding tensor "__pad_N" (U8, 1-D, zero bytes). The file stays
// valid safetensors (no holes); moetier's loader hides __pad_* tensors. A
// tensor may ask for its own alignment (TensorToWrite::align), e.g. 4096 for
// the first tensor of an expert record and 64 for the rest.
//
// Not thread-safe: one writer per object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/atomic_file.h"  // re-exported for includers that predate it (experts/trace.h)
#include "core/dtype.h"

namespace moetier {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // dtype_size(dtype) * prod(shape) bytes, row-major
  // Where this tensor may start: 0 = SafetensorsWriteOptions::align; else a
  // power of two of its own (1 = right after the previous tensor). Lets a
  // record of several tensors (one expert) start 4 KiB-aligned and stay packed.
  uint64_t align = 0;
};

struct SafetensorsWriteOptions {
  uint64_t align = 0;  // 0: packed (header padded to 8 bytes); else a power of two
  std::map<std::string, std::string> metadata;  // written as "__metadata__"
};

// Writes one safetensors file atomically; tensors are laid out in the given
// order. Returns the bytes of the real tensors (padding excluded).
uint64_t write_safetensors(const std::filesystem::path& path,
                           std::span<const TensorToWrite> tensors,
                           const SafetensorsWriteOptions& opt = {});

// model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {...}}.
void write_safetensors_index(const std::filesystem::path& path,
                             const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

// A whole checkpoint directory, atomically: config.json plus one shard
// (model.safetensors) or several (model-0000i-of-0000n.safetensors) with an
// index. `dir` must not exist.
void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                      const std::vector<std::vector<TensorToWrite>>& shards,
                      const SafetensorsWriteOptions& opt = {});

}  // namespace moetier
