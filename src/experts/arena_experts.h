// ArenaExperts: the ExpertProvider for models larger than memory. Experts live
// in an arena of fixed-size slots (hot set + transient ring, see
// experts/residency.h) and, optionally, a host-RAM tier; misses are read in
// place from the checkpoint's shards with O_DIRECT, batched.
//
// acquire(layer, ids, phase): looks every id up, evicts what the policy says,
// copies host-tier hits back, issues ONE batched read for all misses, validates
// the bytes (sizes, NaN/Inf weights, 0xff e8m0 scales), and only then marks
// them resident and returns views. Any failure (short read, EIO, truncated
// shard, validation) throws Error naming the file, tensor, layer and expert;
// the slots that were being loaded are released, nothing half-read is ever
// visible, and the next acquire works normally.
//
// Protocol: as ExpertProvider (one caller thread). The reader may use its own
// threads inside acquire(); none of them outlives the call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "experts/index.h"
#include "experts/provider.h"
#include "experts/residency.h"
#include "experts/stats.h"
#include "io/reader.h"

namespace moetier {

struct ArenaConfig {
  size_t hot_slots = 0;
  size_t transient_slots = 0;
  size_t host_slots = 0;
  PolicyKind policy = PolicyKind::Lru;
  std::vector<ExpertKey> ranking;  // PolicyKind::Pinned: hottest first
  size_t max_pinned = 0;           // PolicyKind::Pinned
  io::ReaderKind reader = io::ReaderKind::Auto;
  int io_depth = 16;   // io_uring queue depth / pread threads
  bool direct = true;  // O_DIRECT (with a counted buffered fallback)
  bool validate = true;
};

class ArenaExperts final : public ExpertProvider {
 public:
  // stats may be null (the provider then keeps its own; see stats()).
  ArenaExperts(ExpertIndex index, const ArenaConfig& cfg, ExpertStats* stats);
  ~ArenaExperts() override;

  int64_t max_batch() const override;
  void acquire(int64_t layer, std::span<const int32_t> ids, Phase phase,
               std::vector<ExpertView>& views) override;
  void note_routing(int64_t layer, std::span<const int32_t> topk, int64_t k) override;

  const ExpertIndex& index() const { return index_; }
  const Residency& residency() const { return res_; }
  const ExpertStats& stats() const { return *stats_; }
  ExpertStats& stats() { return *stats_; }
  const io::Reader& reader() const { return *reader_; }

 private:
  std::byte* slot_ptr(int32_t slot) { return arena_.as<std::byte>() + size_t(slot) * slot_bytes_; }
  std::byte* host_ptr(int32_t h) { return host_.as<std::byte>() + size_t(h) * slot_bytes_; }
  void copy_tiers(int64_t layer);
  std::string load_misses(int64_t layer);  // "" or the first problem
  void note_fallbacks();

  ExpertIndex index_;
  Residency res_;
  size_t slot_bytes_ = 0;
  AlignedBuffer arena_;                                 // [hot + transient slots, slot_bytes]
  AlignedBuffer host_;                                  // [host slots, slot_bytes]
  std::vector<std::unique_ptr<io::DirectFile>> files_;  // [shards]
  std::vector<uint8_t> fallback_noted_;                 // [shards]
  std::unique_ptr<io::Reader> reader_;
  bool validate_ = true;
  ExpertStats own_stats_;
  ExpertStats* stats_ = nullptr;
  // Scratch of one acquire.
  std::vector<ExpertKey> keys_;  // distinct keys, first-seen order
  std::vector<size_t> pos_;      // [ids] index into keys_
  Plan plan_;
  std::vector<io::ReadRequest> reqs_;
  std::vector<size_t> req_step_;    // [reqs] plan step the read belongs to
  std::vector<Tier> last_found_;    // [num_keys] tier of the key's latest acquire
  std::vector<uint64_t> key_seen_;  // [num_keys] dedupe stamp
  std::vector<uint32_t> key_pos_;   // [num_keys] index into keys_ when stamped
  uint64_t stamp_ = 0;
};

}  // namespace moetier
