// Cross-check of the tokenizer's PCRE2 regexes against Oniguruma, the engine HF
// tokenizers uses (onig crate: Oniguruma 6.9.x, default syntax, no options, UTF-8).
//
// Not part of the build (it needs libonig-dev, which the project does not
// depend on). Build and run from the repo root after building build-tok:
//   apt-get install -y libonig-dev
//   g++ -std=c++20 -O2 -Isrc scripts/regex_onig_xcheck.cpp \
//     build-tok/src/format/libmoetier_format.a build-tok/src/core/libmoetier_core.a \
//     -lpcre2-8 -lutf8proc -lonig -lfmt -o /tmp/regex_xcheck && /tmp/regex_xcheck
//
// 1. Every code point against single-atom patterns (whole-string match).
// 2. Random strings drawn from a tricky alphabet against the full Qwen3,
//    DeepSeek-V3 and GPT-2 patterns (find_iter match lists must be equal).
// Prints the differences and "N passed, N failed".
#include <oniguruma.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "format/pretokenize.h"
#include "format/unicode.h"

using moetier::tok::Regex;
using Matches = std::vector<std::pair<size_t, size_t>>;

namespace {

struct Onig {
  regex_t* re = nullptr;
  explicit Onig(const std::string& p) {
    OnigErrorInfo ei;
    auto* b = reinterpret_cast<const OnigUChar*>(p.data());
    int r = onig_new(&re, b, b + p.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                     ONIG_SYNTAX_DEFAULT, &ei);
    if (r != ONIG_NORMAL) {
      std::fprintf(stderr, "onig_new failed for %s\n", p.c_str());
      std::exit(2);
    }
  }
  ~Onig() { onig_free(re); }
  // Like the onig crate's find_iter.
  Matches find_all(const std::string& s) const {
    Matches out;
    OnigRegion* region = onig_region_new();
    auto* b = reinterpret_cast<const OnigUChar*>(s.data());
    size_t last_end = 0;
    long last_match_end = -1;
    while (last_end <= s.size()) {
      int r =
          onig_search(re, b, b + s.size(), b + last_end, b + s.size(), region, ONIG_OPTION_NONE);
      if (r < 0) break;
      size_t mb = region->beg[0], me = region->end[0];
      if (mb == me && last_match_end == long(me)) {
        if (last_end >= s.size()) break;
        last_end += moetier::unicode::utf8_step(s, last_end).len;
        continue;
      }
      last_end = me;
      last_match_end = long(me);
      out.emplace_back(mb, me);
    }
    onig_region_free(region, 1);
    return out;
  }
};

int g_pass = 0, g_fail = 0;

void atom_sweep(const std::string& atom) {
  std::string whole = "\\A(?:" + atom + ")\\z";
  Onig o(whole);
  Regex p(whole, false, "xcheck");
  int diffs = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    moetier::unicode::append_utf8(s, cp);
    bool a = !o.find_all(s).empty(), b = !p.find_all(s).empty();
    if (a != b && diffs++ < 8) {
      std::printf("  atom %s U+%04X: onig %d pcre2 %d\n", atom.c_str(), unsigned(cp), a, b);
    }
  }
  std::printf("%s atom %-28s %d differing code points\n", diffs ? "FAIL" : "ok  ", atom.c_str(),
              diffs);
  (diffs ? g_fail : g_pass)++;
}

std::vector<std::string> alphabet() {
  std::vector<char32_t> cps = {
      'a',     'Z',     's',    'S',     't',    'T',    'l',    'L',      'd',    'D',    'm',
      'r',     'e',     'v',    'x',     '0',    '7',    '\'',   ' ',      ' ',    ' ',    '\t',
      '\n',    '\n',    '\r',   '\v',    '\f',   '.',    ',',    '!',      '?',    '-',    '_',
      '$',     '(',     '{',    '"',     '#',    '\\',   '/',    '@',      '~',    0x85,   0xA0,
      0x1680,  0x180E,  0x2000, 0x2009,  0x200A, 0x200B, 0x2028, 0x2029,   0x202F, 0x205F, 0x3000,
      0xFEFF,  0x1C,    0x1F,   0x0,     0x7F,   0xE9,   0x301,  0x17F,    0x212A, 0xDF,   0x130,
      0x4E2D,  0x6587,  0x3042, 0x30A2,  0xAC00, 0xFF5C, 0xFF01, 0xFF11,   0x0661, 0x00B2, 0x2163,
      0x1F600, 0x1F468, 0x200D, 0x1F1FA, 0xFE0F, 0x20AC, 0x00A7, 0x2014,   0x201C, 0x3001, 0x3002,
      0x0E01,  0x0E31,  0x0915, 0x094D,  0x05D0, 0x0627, 0xFFFD, 0x10FFFF, 0xE000, 0x0345, 0x1E9E,
      0x2126,  0xFB05};
  std::vector<std::string> out;
  for (char32_t c : cps) {
    std::string s;
    moetier::unicode::append_utf8(s, c);
    out.push_back(s);
  }
  return out;
}

void random_strings(const std::string& name, const std::string& pattern) {
  Onig o(pattern);
  Regex p(pattern, false, "xcheck");
  auto alpha = alphabet();
  std::mt19937 rng(12345);
  int diffs = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::string s;
    int len = 1 + rng() % 24;
    for (int k = 0; k < len; ++k) s += alpha[rng() % alpha.size()];
    Matches a = o.find_all(s), b = p.find_all(s);
    if (a != b && diffs++ < 5) {
      std::printf("  %s differs on:", name.c_str());
      for (unsigned char c : s) std::printf(" %02x", c);
      std::printf("\n");
    }
  }
  std::printf("%s pattern %-10s %d differing strings of 200000\n", diffs ? "FAIL" : "ok  ",
              name.c_str(), diffs);
  (diffs ? g_fail : g_pass)++;
}

}  // namespace

int main() {
  OnigEncoding enc[] = {ONIG_ENCODING_UTF8};
  onig_initialize(enc, 1);
  for (const char* atom : {R"(\s)",
                           R"(\S)",
                           R"(\p{L})",
                           R"(\p{N})",
                           R"(\p{P})",
                           R"(\p{S})",
                           R"(\p{M})",
                           R"([^\r\n\p{L}\p{N}])",
                           R"([^\s\p{L}\p{N}])",
                           R"([^\r\n\p{L}\p{P}\p{S}])",
                           R"([\p{L}\p{M}])",
                           R"([\p{P}\p{S}])",
                           R"([\r\n])",
                           R"((?i:s))",
                           R"((?i:t))",
                           R"((?i:'re))",
                           R"((?i:m))",
                           R"((?i:l))",
                           R"((?i:d))",
                           R"((?i:v))",
                           R"((?i:e))",
                           R"(\h)",
                           R"([A-Za-z])",
                           R"(\w)",
                           R"(\W)",
                           R"(\d)",
                           R"(\D)",
                           R"(.)",
                           R"([\w\s])",
                           R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])",
                           "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]"}) {
    atom_sweep(atom);
  }
  random_strings(
      "qwen3",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  random_strings("gpt2",
                 R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  random_strings("ds_num", R"(\p{N}{1,3})");
  random_strings("ds_cjk", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+");
  random_strings("ds_main",
                 "[!\"#$%&'()*+,\\-./"
                 ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                 "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+");
  random_strings("anchors", R"(^\s*\w+$|\d+)");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  onig_end();
  return g_fail ? 1 : 0;
}
