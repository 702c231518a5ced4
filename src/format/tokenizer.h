// Hugging Face tokenizer.json byte-level BPE tokenizer (Qwen2/3, DeepSeek-V3,
// GPT-2 style). encode() gives the same ids as tokenizers'
// Tokenizer.from_file(path).encode(text, add_special_tokens=...) with text =
// bytes.decode('utf-8', errors='replace'); decode() the same string as
// Tokenizer.decode(ids, skip_special_tokens=...). See docs/tokenizer.md.
//
// Pipeline of encode():
//   invalid UTF-8 -> U+FFFD (Python 'replace' rules)
//   -> split out added tokens with normalized=false (raw text)
//   -> normalizer on the rest -> split out added tokens with normalized=true
//   -> pre_tokenizer (Split regexes, ByteLevel) -> BPE per word
//   -> post_processor (TemplateProcessing etc.) when add_special_tokens.
//
// Errors: load() throws moetier::Error with one line naming the file and the
// field for a missing file, bad JSON or an unsupported component.
//
// Thread-safety: a Tokenizer is immutable after load() (its word cache is
// internally locked): encode/decode may run concurrently. A StreamDecoder is
// single-threaded and must not outlive its Tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moetier {

namespace tok {
struct AddedToken;
}

class Tokenizer {
 public:
  // path: a tokenizer.json, or a directory holding one ("PATH: no such file or
  // directory", "DIR: no tokenizer.json" otherwise). A tokenizer_config.json
  // next to it, if present, supplies eos/bos tokens and add_bos_token.
  static Tokenizer load(const std::filesystem::path& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The vocabulary string of id (HF id_to_token; byte-level form, e.g. "Ġthe");
  // empty for an id that names no token.
  std::string token_text(int32_t id) const;
  // One past the largest token id (model vocabulary and added tokens).
  int32_t vocab_size() const;
  // HF token_to_id: added tokens first, then the model vocabulary.
  std::optional<int32_t> token_id(std::string_view token) const;
  // tokenizer_config.json's eos_token if present, else the first added token
  // among <|endoftext|>, <｜end▁of▁sentence｜>, </s>, <|end_of_text|>.
  std::optional<int32_t> eos_id() const;
  // tokenizer_config.json's bos_token, if present and known.
  std::optional<int32_t> bos_id() const;
  // tokenizer_config.json's add_bos_token (false when absent). transformers'
  // Llama-class tokenizers (DeepSeek-V3) prepend bos_id() on top of the
  // tokenizer.json post_processor; encode() does not (it matches tokenizers).
  bool add_bos_token() const;
  bool is_special(int32_t id) const;
  const std::vector<tok::AddedToken>& added_tokens() const;

  // The bytes the decoder produces for one token (possibly a partial UTF-8
  // character); empty when the id names no token or is skipped.
  std::string token_bytes(int32_t id, bool skip_special_tokens = false) const;
  // True when the decoder joins tokens with " " (no decoder in the file).
  bool joins_with_space() const;
  // The tokenizer.json it was loaded from.
  const std::string& file() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A tokenizer whose ids reach past the model's vocabulary would index past
// its embedding and LM head: the one line refusing it, "TOKENIZER.json: token
// ids reach N - 1 (a vocabulary of N ids), past the model's vocab_size V
// (DIR/config.json)", or nullopt when they fit (model_dir: the checkpoint).
std::optional<std::string> tokenizer_vocab_problem(const Tokenizer& tok, int64_t vocab_size,
                                                   const std::filesystem::path& model_dir);
// Throws Error with that line.
void check_tokenizer_fits(const Tokenizer& tok, int64_t vocab_size,
                          const std::filesystem::path& model_dir);

// Emits decoded text as token ids arrive, holding back a trailing partial
// UTF-8 character until it completes. The concatenation of all push() results
// and finish() equals Tokenizer::decode() of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false);
  // The text that became final with this token (often empty or one token's text).
  std::string push(int32_t id);
  // Flushes what is held back (an incomplete character becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;  // bytes not yet emitted (an incomplete character)
};

}  // namespace moetier
