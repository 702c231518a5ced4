// Routing traces: the experts every token selected at every MoE layer, as
// `moetier trace` records them and `moetier simulate` replays them
// (docs/trace-and-simulate.md).
//
// File layout (little-endian):
//   0   "MOETRACE"            magic (8 bytes)
//   8   u32 version           1
//   12  u32 record_bytes      size of one record (checked against the header)
//   16  u64 header_bytes      length of the header JSON that follows
//   24  header JSON           model summary, expert bytes per encoding, corpus, settings
//   ..  records               one per token, in the order the engine ran them
//   end "MOETEND1" u64 records u32 crc32 u32 0   footer (24 bytes); crc32 (IEEE)
//                             covers every byte from offset 8 to the footer
// Record: u32 token id, u32 position, u32 chunk, u32 sequence, u16 corpus,
//   u8 phase (0 prefill, 1 decode), u8 0; then u16 expert ids [moe_layers, k]
//   (by descending router weight); then weights [moe_layers, k] as f16 or f32.
// A chunk is one forward pass (a prompt window's prefill, or one decode step);
// its tokens are consecutive records with one chunk number and one phase.
//
// The reader checks everything (magic, version, sizes, footer, checksum, ids in
// range and distinct per token, chunk contiguity) and throws Error with one
// line naming the file. Not thread-safe: one writer per object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "experts/policy.h"
#include "experts/provider.h"
#include "format/safetensors_writer.h"

namespace moetier {

// Logical bytes of one expert in one encoding ("bf16", "fp8", "mxfp4", "cb3"
// are estimates from the shapes; the model's own encoding is measured).
struct EncodingBytes {
  std::string name;
  uint64_t bytes = 0;
  bool measured = false;  // the checkpoint's own encoding (from the expert index)
};

struct TraceModel {
  std::string dir, model_type;
  int64_t num_layers = 0, num_experts = 0, k = 0;
  std::vector<int64_t> moe_layers;  // ascending
  int64_t hidden = 0, moe_intermediate = 0;
  std::string encoding;                  // the checkpoint's expert encoding
  uint64_t expert_bytes = 0;             // logical bytes of one expert as stored
  uint64_t slot_bytes = 0;               // arena slot size (4 KiB-aligned superset reads)
  std::vector<EncodingBytes> encodings;  // the model's first, then estimates

  size_t num_keys() const { return size_t(num_layers * num_experts); }
  size_t total_experts() const { return moe_layers.size() * size_t(num_experts); }
  ExpertKey key(int64_t layer, int64_t expert) const {
    return ExpertKey(layer * num_experts + expert);
  }
  // Bytes of one expert in `encoding` (throws Error naming the known ones).
  uint64_t bytes_of(const std::string& encoding) const;
};

struct TraceHeader {
  TraceModel model;
  std::vector<std::string> corpus;  // corpus names, indexed by the records' corpus field
  bool f32_weights = false;         // else f16
  nlohmann::json settings = nlohmann::json::object();  // how the trace was made

  size_t record_bytes() const;
  nlohmann::json to_json() const;
};

// The header as read back from its JSON; throws Error naming `file` and the field.
TraceHeader parse_trace_header(const nlohmann::json& j, const std::string& file);

// Per-expert byte estimates for the encodings of docs/trace-and-simulate.md;
// the measured one (the checkpoint's) first.
std::vector<EncodingBytes> expert_encoding_bytes(int64_t hidden, int64_t inter,
                                                 const std::string& native, uint64_t native_bytes);

class TraceWriter {
 public:
  // Writes to PATH.tmp.PID; commit() renames it to PATH. Destroyed before
  // commit(), it leaves nothing behind.
  TraceWriter(const std::filesystem::path& path, const TraceHeader& header);

  // One forward chunk of n = tokens.size() tokens at positions start_pos...:
  // experts and weights [moe_layers, n, k], layer-major as the forward pass
  // reports them.
  void add_chunk(uint32_t sequence, uint16_t corpus, int64_t start_pos, Phase phase,
                 std::span<const int32_t> tokens, std::span<const int32_t> experts,
                 std::span<const float> weights);
  uint64_t tokens() const { return records_; }
  uint64_t chunks() const { return chunk_; }
  void commit();

 private:
  void put(const void* p, size_t n);

  std::filesystem::path path_;
  TraceHeader header_;
  AtomicFile file_;
  uint32_t crc_ = 0;
  uint64_t records_ = 0;
  uint32_t chunk_ = 0;
  std::vector<std::byte> rec_;  // [record_bytes] scratch
};

// A trace in memory: one entry per token in file order.
struct Trace {
  std::filesystem::path file;
  TraceHeader header;
  std::vector<uint32_t> token, position, chunk, sequence;  // [n]
  std::vector<uint16_t> corpus;                            // [n]
  std::vector<Phase> phase;                                // [n]
  std::vector<uint16_t> experts;                           // [n, moe_layers, k]
  std::vector<float> weights;  // [n, moe_layers, k]; empty unless read with weights

  size_t size() const { return token.size(); }
  size_t moe_count() const { return header.model.moe_layers.size(); }
  int64_t k() const { return header.model.k; }
  // Expert ids of token t at MoE layer index m (position in moe_layers).
  std::span<const uint16_t> ids(size_t t, size_t m) const {
    size_t k = size_t(header.model.k);
    return {experts.data() + (t * moe_count() + m) * k, k};
  }
};

// Reads and validates a whole trace; throws Error with one line naming `path`.
Trace read_trace(const std::filesystem::path& path, bool with_weights = false);

// Token-level use counts: uses[key] = (token, layer) pairs that selected the
// expert; [num_keys], per phase.
struct UseCounts {
  std::vector<uint64_t> prefill, decode, total;
};
UseCounts count_uses(const Trace& t);
// Every expert of the MoE layers, by descending uses, ties to the smaller
// (layer, expert): the global frequency ranking.
std::vector<ExpertKey> rank_experts(const Trace& t, const UseCounts& u);

// The JSON summary (TRACE.json): tokens per phase and corpus, per-layer use
// counts per expert, concentration, and the global ranking.
nlohmann::json trace_summary(const Trace& t);
// The ranking as `--ranking FILE` reads it (experts/policy.h read_ranking):
// "LAYER EXPERT USES" per line, hottest first, '#' comments.
std::string ranking_text(const Trace& t);

// CRC-32 (IEEE 802.3, as zlib's crc32) of `n` bytes, continuing from `crc`.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

}  // namespace moetier
