// Writing a derived checkpoint (moetier prune, moetier repack) as a new
// directory, atomically: everything goes to OUT.tmp-XXXXXX, which is renamed
// to OUT only after every file is written and fsynced. OUT therefore either
// does not exist or is complete.
//
// Failure handling:
//   - an Error (bad input, a write failure, an injected fault) or a
//     cancellation unwinds the writer, which removes the temporary directory;
//   - a process killed outright (SIGKILL, power loss) leaves OUT.tmp-XXXXXX
//     (never OUT). The temporary directory holds a marker file with the
//     writer's PID; the next writer for the same OUT removes every
//     OUT.tmp-* whose writer process no longer exists.
//   - cancellation: tools set `ConvertControl::cancel` from a SIGINT/SIGTERM
//     handler (InterruptGuard); the converters poll it between tensors and
//     throw Error("interrupted").
//   - fault injection for tests: MOETIER_CONVERT_FAULT=error:N throws after the
//     N-th output tensor, sigint:N raises SIGINT there, sigkill:N SIGKILL
//     (ConvertControl::fail_after overrides error:N from code).
//
// Output layout: the shard structure of the source (model.safetensors, or the
// same shard names plus an index); each tensor goes to the shard its source
// tensor was in. Data start 4 KiB-aligned; each expert's tensors form one
// record that starts 4 KiB-aligned with its tensors packed at 64-byte
// boundaries (TensorToWrite::align). Side files (tokenizer.json,
// generation_config.json, ...) are copied; reference* files, which describe
// the source model's outputs, are not.
//
// Not thread-safe: one thread drives a writer.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "format/safetensors_writer.h"
#include "model/spec.h"

namespace moetier {

class Checkpoint;
struct TensorInfo;

struct ConvertControl {
  const std::atomic<bool>* cancel = nullptr;  // polled between tensors
  int64_t fail_after = -1;  // test hook: throw after this many output tensors (-1: none)
  // Optional: called with the source tensors (prune) or expert matrices
  // (repack) done so far of the total (a progress bar).
  std::function<void(int64_t done, int64_t total)> progress;
};

inline constexpr uint64_t kRecordAlign = 4096;  // start of every expert record
inline constexpr uint64_t kPackedAlign = 64;    // the other tensors of a record

// One output tensor: its bytes live in the source mmap or in `owned`.
struct OutTensor {
  TensorToWrite t;
  std::vector<std::byte> owned;  // empty when t.data points into the source
  // Expert record key (layer * 2^32 + expert), or -1 for a tensor of its own.
  int64_t record = -1;
};

class DerivedCheckpointWriter {
 public:
  // Checks that OUT does not exist and its parent does; sweeps stale
  // OUT.tmp-* of dead writers; creates OUT.tmp-XXXXXX.
  DerivedCheckpointWriter(const Checkpoint& src, std::filesystem::path out, ConvertControl control);
  ~DerivedCheckpointWriter();
  DerivedCheckpointWriter(const DerivedCheckpointWriter&) = delete;
  DerivedCheckpointWriter& operator=(const DerivedCheckpointWriter&) = delete;

  const std::filesystem::path& out() const { return out_; }
  const std::filesystem::path& tmp() const { return dir_->path(); }

  // Call once per produced output tensor: counts it, honours cancel and the
  // injected faults (throws Error).
  void tick();
  // Writes the output shard that mirrors source shard `shard`; tensors of one
  // record are laid out together (first one 4 KiB-aligned, the rest packed).
  // Returns the bytes of the tensors written.
  uint64_t write_shard(uint32_t shard, std::vector<OutTensor> tensors);
  // Writes config.json (and the index when the source had one), copies the
  // side files, renames OUT.tmp-XXXXXX to OUT.
  void commit(const nlohmann::json& config);

 private:
  const Checkpoint& src_;
  std::filesystem::path out_;
  ConvertControl control_;
  std::optional<AtomicDir> dir_;
  int64_t ticks_ = 0;
  int64_t fault_at_ = -1;
  std::string fault_kind_;
  std::map<std::string, std::string> weight_map_;  // tensor -> shard file
  uint64_t total_bytes_ = 0;
};

// A tensor name names.layers + "L.REST" split into L and REST; for REST =
// names.experts + "E.PART", expert = E and part = PART (else expert = -1).
struct LayerTensorName {
  int64_t layer = -1, expert = -1;
  std::string rest, part;
};
std::optional<LayerTensorName> parse_layer_tensor(std::string_view name,
                                                  const MoeTensorNames& names);
// Whether REST of a layer tensor is an expert tensor / a stacked expert tensor.
bool is_expert_rest(const std::string& rest, const MoeTensorNames& names);
bool is_stacked_rest(const std::string& rest, const MoeTensorNames& names);

// Record key of (layer, expert) for OutTensor::record.
inline int64_t record_key(int64_t layer, int64_t expert) { return (layer << 32) | expert; }

// Source tensors sorted by (shard, offset).
std::vector<const TensorInfo*> tensors_in_file_order(const Checkpoint& ck);

// The output shard of every expert record, by record_key(layer, source
// expert): the shard of the expert's first tensor in file order (a stacked
// tensor counts for every expert of its layer), so that a record is never
// split between shards even when the source spreads an expert over several.
std::map<int64_t, uint32_t> record_shards(const std::vector<const TensorInfo*>& order,
                                          int64_t num_experts, const MoeTensorNames& names);

// Throws the first problem `moetier check` finds in DIR (and how many more).
void require_valid(const std::filesystem::path& dir);

// Output shard file name of source shard `shard` (its own file name).
std::string shard_file_name(const Checkpoint& src, uint32_t shard);

// Source config.json with `patch` merged into its "moetier" object (created
// if absent).
nlohmann::json derived_config(const nlohmann::json& src, const nlohmann::json& patch);

// Sets an atomic flag on SIGINT, SIGTERM and SIGHUP while alive (the previous
// handlers are restored on destruction). One at a time per process.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  const std::atomic<bool>* flag() const;
  int signal() const;  // the signal received, or 0

 private:
  struct sigaction old_[3];
};

}  // namespace moetier
