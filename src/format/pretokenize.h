// The text stages of a Hugging Face tokenizer.json pipeline that run before the
// model: normalizer and pre-tokenizer, with the regexes run by PCRE2 (UTF+UCP,
// JIT) as the file gives them.
//
// Supported (anything else is rejected at load with a one-line Error):
//   normalizer:    null, NFC, NFD, NFKC, NFKD, Sequence of those
//   pre_tokenizer: null, Split {String|Regex, behavior, invert}, ByteLevel
//                  {add_prefix_space, use_regex}, Sequence of those (a Split may
//                  not follow a ByteLevel)
//
// Regex semantics follow Oniguruma as used by HF tokenizers; the one place
// where PCRE2 differs for these patterns (\s also matching U+180E in PCRE2) is
// rewritten, see translate_pattern().
//
// Thread-safety: all objects are immutable after construction; matching uses
// per-thread scratch (match data, JIT stack), so concurrent calls are safe.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/unicode.h"

namespace moetier::tok {

// A compiled PCRE2 pattern.
class Regex {
 public:
  // `where` names the file and field for error messages.
  Regex(std::string_view pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match of the pattern in valid UTF-8 `s`, left to right, as byte
  // ranges [begin, end), iterated like onig's find_iter (an empty match right
  // after the previous match is skipped by one character).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string where_;
};

// Rewrites an HF (Oniguruma-syntax) pattern for PCRE2: \s and \S outside
// character classes, and \s inside them, become explicit White_Space sets.
std::string translate_pattern(std::string_view pattern);

class Normalizer {
 public:
  Normalizer() = default;
  // j: the "normalizer" value (may be null).
  Normalizer(const nlohmann::json& j, const std::string& file);
  std::string apply(std::string_view s) const;
  bool empty() const { return forms_.empty(); }

 private:
  void add(const nlohmann::json& j, const std::string& file, const std::string& field);
  std::vector<unicode::NormForm> forms_;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  PreTokenizer();
  // j: the "pre_tokenizer" value (may be null).
  PreTokenizer(const nlohmann::json& j, const std::string& file);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Splits normalized text into words (raw UTF-8; empty words are dropped).
  void split(std::string_view text, std::vector<std::string>& words) const;
  // True when a ByteLevel step is present: the model sees each word's bytes
  // through the GPT-2 byte-to-unicode map.
  bool byte_level() const { return byte_level_; }

 private:
  struct Step;
  void add(const nlohmann::json& j, const std::string& file, const std::string& field);
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
};

}  // namespace moetier::tok
