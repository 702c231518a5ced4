// ExpertIndex: where every (layer, expert) lives in the checkpoint's own
// shards, so that a miss reads it in place (no conversion step).
//
// For each expert, the byte ranges of its tensors (gate/up/down weights and,
// for MXFP4, their e8m0 scales; for CB3, their f16 codebooks in the *Scale
// parts) as absolute file offsets in a shard. Stacked tensors (gate_up_proj
// [E, 2I, H], down_proj [E, H, I]) give one range per matrix cut out of the
// stacked tensor. Ranges of one expert whose 4 KiB
// supersets touch or overlap are coalesced into one read (an extent); the
// arena slot of an expert is the concatenation of its extents' supersets, so
// every tensor is at a fixed offset inside the slot and no bytes are copied.
//
// Immutable after build(); safe to share between threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "experts/policy.h"
#include "model/spec.h"

namespace moetier {

class Checkpoint;

enum class ExpertPart : uint8_t { GateW, UpW, DownW, GateScale, UpScale, DownScale };
const char* expert_part_name(ExpertPart p);

struct ByteRange {
  ExpertPart part = ExpertPart::GateW;
  uint32_t shard = 0;
  uint64_t offset = 0;       // absolute offset in the shard file
  uint64_t length = 0;       // bytes
  uint64_t slot_offset = 0;  // where the first byte lands inside the slot
  std::string tensor;        // the checkpoint tensor it comes from (for messages)
};

// One read: [offset, offset + length) of a shard, landing (4 KiB superset) at
// slot_offset (a multiple of 4096) in the slot.
struct Extent {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t slot_offset = 0;
};

struct ExpertRecord {
  std::vector<ByteRange> ranges;  // one per part present
  std::vector<Extent> extents;
  uint64_t bytes = 0;       // logical: sum of range lengths
  uint64_t slot_bytes = 0;  // sum of the extents' aligned supersets
};

// How one matrix of an expert is encoded (the same for every expert of a layer).
struct MatShape {
  WeightEncoding enc = WeightEncoding::BF16;
  DType dtype = DType::BF16;  // of the weight tensor
  int64_t rows = 0, cols = 0;
};

// What the index needs to know about the model, whatever its architecture.
struct ExpertIndexSpec {
  int64_t num_layers = 0;
  int64_t num_experts = 0;
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (per expert)
  std::function<bool(int64_t layer)> is_moe_layer;
  std::function<ExpertTensors(int64_t layer, int64_t expert)> tensors;
};

class ExpertIndex {
 public:
  // Builds the index, validating dtypes, shapes and sizes of every expert
  // tensor; throws Error naming the file and tensor.
  static ExpertIndex build(const Checkpoint& ck, const ExpertIndexSpec& spec);
  static ExpertIndex build(const Checkpoint& ck, const ModelSpec& spec);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }
  size_t num_keys() const { return size_t(num_layers_ * num_experts_); }
  bool is_moe_layer(int64_t layer) const;
  ExpertKey key(int64_t layer, int64_t expert) const {
    return ExpertKey(layer * num_experts_ + expert);
  }
  int64_t layer_of(ExpertKey k) const { return int64_t(k) / num_experts_; }
  int64_t expert_of(ExpertKey k) const { return int64_t(k) % num_experts_; }
  // Throws Error for a dense layer or an expert out of range.
  const ExpertRecord& record(int64_t layer, int64_t expert) const;
  const ExpertRecord& record(ExpertKey k) const { return records_.at(k); }
  const MatShape& shape(int64_t layer, ExpertPart weight) const;

  uint64_t slot_bytes() const { return slot_bytes_; }      // max over experts
  uint64_t expert_bytes() const { return expert_bytes_; }  // max logical bytes
  uint64_t total_bytes() const { return total_bytes_; }    // all experts, logical
  size_t total_experts() const { return total_experts_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }

  // The views of an expert whose slot starts at `slot`.
  ExpertView view(ExpertKey k, const std::byte* slot) const;
  // Checks bytes loaded into a slot: no NaN/Inf in f32/bf16 weights, no 0xff
  // (NaN) e8m0 scale, no NaN/Inf in a cb3 codebook. Returns "" or a one-line
  // problem naming file and tensor.
  std::string validate(ExpertKey k, const std::byte* slot) const;

 private:
  struct LayerShapes {
    MatShape gate, up, down;
  };
  void add_expert(const Checkpoint& ck, int64_t layer, int64_t expert, const ExpertTensors& t);

  int64_t num_layers_ = 0, num_experts_ = 0, hidden_ = 0, inter_ = 0;
  std::vector<uint8_t> moe_;           // [num_layers]
  std::vector<LayerShapes> shapes_;    // [num_layers]
  std::vector<ExpertRecord> records_;  // [num_layers * num_experts]
  std::vector<std::string> shard_paths_;
  uint64_t slot_bytes_ = 0, expert_bytes_ = 0, total_bytes_ = 0;
  size_t total_experts_ = 0;
};

}  // namespace moetier
