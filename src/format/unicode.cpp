#include "format/unicode.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"

namespace moetier::unicode {

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  Utf8Step r;
  if (i >= n) return r;
  unsigned b = p[i];
  if (b < 0x80) return {1, true, false, b};
  int need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  char32_t cp = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1, cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2, cp = b & 0x0F;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3, cp = b & 0x07;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {1, false, false, 0};  // 80..C1, F5..FF: never valid
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= n) return {j - i, false, true, 0};
    unsigned c = p[j];
    if (c < lo || c > hi) return {j - i, false, false, 0};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (c & 0x3F);
  }
  return {j - i, true, false, cp};
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Step st = utf8_step(s, i);
    if (!st.complete) return false;
    i += st.len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    Utf8Step st = utf8_step(s, i);
    if (st.complete) {
      out.append(s.substr(i, st.len));
    } else {
      out.append(kReplacement);
    }
    i += st.len;
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last maximal subpart can be a truncated prefix; it starts at most
  // three bytes before the end.
  size_t start = s.size() > 4 ? s.size() - 4 : 0;
  // Re-synchronise: step from a position that is not a continuation byte.
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t i = start;
  while (i < s.size()) {
    Utf8Step st = utf8_step(s, i);
    if (st.truncated) return i;
    i += st.len;
  }
  return s.size();
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t next_cp(std::string_view s, size_t& i) {
  Utf8Step st = utf8_step(s, i);
  if (st.len == 0) return 0;
  i += st.len;
  return st.complete ? st.cp : 0xFFFD;
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> b2u{};
  std::array<int16_t, 512> u2b{};  // every table code point is < 512
  ByteTables() {
    u2b.fill(-1);
    auto printable = [](unsigned b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    unsigned n = 0;
    for (unsigned b = 0; b < 256; ++b) {
      b2u[b] = printable(b) ? b : 256 + n++;
      u2b[b2u[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() { return byte_tables().b2u; }

int unicode_to_byte(char32_t cp) { return cp < 512 ? byte_tables().u2b[cp] : -1; }

std::string bytes_to_byte_level(std::string_view raw) {
  const auto& t = byte_tables().b2u;
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) append_utf8(out, t[b]);
  return out;
}

std::string normalize(std::string_view s, NormForm form) {
  bool ascii = true;
  for (unsigned char c : s) ascii = ascii && c < 0x80;
  if (ascii) return std::string(s);  // ASCII is invariant under every form
  int opts = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC:
      opts |= UTF8PROC_COMPOSE;
      break;
    case NormForm::NFD:
      opts |= UTF8PROC_DECOMPOSE;
      break;
    case NormForm::NFKC:
      opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormForm::NFKD:
      opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(opts));
  if (n < 0) {
    std::free(dst);
    fail("unicode normalization failed: {}", utf8proc_errmsg(n));
  }
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace moetier::unicode
