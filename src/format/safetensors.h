// Safetensors checkpoints: one file, or shards named by
// model.safetensors.index.json. Headers are parsed and validated once at open;
// tensor bytes are read through a read-only mmap of each shard.
//
// Thread-safety: a Checkpoint is immutable after open(); concurrent readers of
// bytes() are safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace moetier {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint32_t shard = 0;  // index into Checkpoint::shards()
  uint64_t begin = 0;  // byte offsets inside the shard's data section
  uint64_t end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct Shard {
  std::filesystem::path path;
  uint64_t file_size = 0;
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts
};

// Parses one safetensors header. Appends one line per problem to `problems`
// (each naming the file and tensor); returns the tensors that parsed.
// Never throws on bad input; never reads past the file.
std::vector<TensorInfo> parse_safetensors_header(const std::filesystem::path& file,
                                                 uint32_t shard_index, Shard& shard,
                                                 std::vector<std::string>& problems);

// Why DIR is not a checkpoint directory, in one line, or nullopt when it is a
// directory holding a config.json: "DIR: no such directory", "DIR is a file,
// not a checkpoint directory", "DIR is not a directory", "DIR: no config.json
// (not a checkpoint directory)" or "DIR: cannot access: REASON". Checkpoint::open
// reports this line alone.
std::optional<std::string> checkpoint_dir_problem(const std::filesystem::path& dir);

class Checkpoint {
 public:
  // Opens DIR (config.json + model.safetensors or an index and its shards).
  // Throws Error with the first problem found; use check_checkpoint for all.
  static std::unique_ptr<Checkpoint> open(const std::filesystem::path& dir);
  // Like open(), but appends every problem found to `problems` instead of
  // throwing at the first. Returns what could be built from the parts that
  // parsed: config() is null when config.json did not parse; tensors() holds
  // the tensors whose entries are valid; bytes() of a shard that could not be
  // mapped throws. Padding tensors (named __pad_*, see docs/formats.md) are
  // validated but not listed in tensors().
  static std::unique_ptr<Checkpoint> open(const std::filesystem::path& dir,
                                          std::vector<std::string>& problems);
  ~Checkpoint();

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  const std::vector<Shard>& shards() const { return shards_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  // Throws "DIR: missing tensor 'NAME'".
  const TensorInfo& get(std::string_view name) const;
  // The tensor's bytes, mapped read-only.
  std::span<const std::byte> bytes(const TensorInfo& t) const;
  // Absolute file offset of the tensor's first byte (for direct reads).
  uint64_t file_offset(const TensorInfo& t) const { return shards_[t.shard].data_offset + t.begin; }

 private:
  Checkpoint() = default;
  std::filesystem::path dir_;
  nlohmann::json config_;
  std::vector<Shard> shards_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::vector<std::span<const std::byte>> maps_;  // one mmap per shard
  friend struct CheckpointLoader;
};

}  // namespace moetier
