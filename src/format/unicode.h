// UTF-8 and Unicode helpers for the tokenizer.
//
// - utf8_sanitize: replaces ill-formed UTF-8 with U+FFFD exactly like Python's
//   bytes.decode('utf-8', errors='replace') and Rust's String::from_utf8_lossy
//   (one U+FFFD per "maximal subpart" of an ill-formed sequence, Unicode 3.9 / W3C).
// - utf8_complete_prefix: for streaming, how many leading bytes can be emitted
//   now because no later byte can change how they decode.
// - The GPT-2 byte <-> unicode table used by byte-level BPE.
// - Unicode normalization forms through utf8proc.
//
// Thread-safety: all functions are pure; the tables are immutable statics.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moetier::unicode {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the maximal prefix of s[i..] that is a valid UTF-8 sequence or a
// prefix of one (a "maximal subpart"), and whether it is a complete character.
// Never reads past s.size(). Returns at least 1 when i < s.size().
struct Utf8Step {
  size_t len = 0;
  bool complete = false;
  bool truncated = false;  // a valid prefix cut short by the end of s
  char32_t cp = 0;         // valid only when complete
};
Utf8Step utf8_step(std::string_view s, size_t i);

bool utf8_valid(std::string_view s);

// Python's bytes.decode('utf-8', 'replace') as UTF-8 bytes.
std::string utf8_sanitize(std::string_view s);

// The number of leading bytes of s whose decoding is final: everything except a
// trailing maximal subpart that is a strict prefix of a valid character (it may
// still be completed by bytes that have not arrived yet).
size_t utf8_complete_prefix(std::string_view s);

// Appends the UTF-8 encoding of cp (cp must be a scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes the next scalar from valid UTF-8 at s[i], advancing i.
char32_t next_cp(std::string_view s, size_t& i);

// GPT-2 bytes_to_unicode(): byte b <-> printable code point.
const std::array<char32_t, 256>& byte_to_unicode();
// The byte for a code point of that table, or -1.
int unicode_to_byte(char32_t cp);
// The byte-level string of raw bytes (each byte mapped to its code point).
std::string bytes_to_byte_level(std::string_view raw);

enum class NormForm { NFC, NFD, NFKC, NFKD };
// Normalizes valid UTF-8 (no case folding, no stripping). Throws Error on
// failure (only possible for invalid input).
std::string normalize(std::string_view s, NormForm form);

// Unicode White_Space property (what Rust's char::is_whitespace and the regex
// crate's \s match).
bool is_white_space(char32_t cp);
// The regex crate's \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
// Join_Control (approximated by general categories L*, M*, Nd, Nl, Pc, ZWJ/ZWNJ).
bool is_word_char(char32_t cp);

}  // namespace moetier::unicode
