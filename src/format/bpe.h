// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE"}).
//
// encode_word() follows tokenizers' BPE::merge_word + Word::merge_all: the word
// is split into characters (for byte-level tokenizers, one per byte through the
// GPT-2 byte map), then the adjacent pair with the lowest merge rank (leftmost
// on ties) is merged until no pair has a rank. A priority queue over a linked
// list of symbols makes one word O(n log n). Results of words shorter than
// 256 bytes are cached.
//
// Merges may be given as "a b" strings or as ["a", "b"] pairs.
// Supported options: unk_token, fuse_unk, byte_fallback, ignore_merges;
// dropout must be null or 0 and continuing_subword_prefix/end_of_word_suffix
// null or empty (other values are rejected at load).
//
// Thread-safety: immutable after construction except the word cache, which is
// guarded by a mutex; encode_word may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moetier::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // model: the "model" object. byte_level: words arrive as raw bytes and are
  // mapped through the GPT-2 byte table before the vocabulary lookup.
  Bpe(const nlohmann::json& model, const std::string& file, bool byte_level);

  // Appends the ids of one pre-tokenized word (raw UTF-8).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of id, or nullptr when the model has no such id.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t id_bound() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct MergeVal {
    uint32_t rank;
    int32_t new_id;
  };
  void parse_vocab(const nlohmann::json& m, const std::string& file);
  void parse_merges(const nlohmann::json& m, const std::string& file);
  // Initial symbols of a word (vocabulary ids, or -1 never: dropped).
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;
  void merge(std::vector<int32_t>& syms) const;
  const MergeVal* find_merge(int32_t a, int32_t b) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;  // [id_bound]; "" for unused ids
  std::vector<bool> has_id_;              // [id_bound]
  std::unordered_map<uint64_t, MergeVal> merges_;
  bool byte_level_ = false;
  std::array<int32_t, 256> byte_ids_{};  // byte-level: id of each byte's symbol, -1 if absent
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  static constexpr size_t kCacheMaxWord = 256;
  static constexpr size_t kCacheCapacity = 1 << 17;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace moetier::tok
