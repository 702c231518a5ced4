#include "format/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include "core/error.h"

namespace moetier::tok {

namespace {

// Unicode White_Space, the set Oniguruma's \s matches (PCRE2's \s also has U+180E).
constexpr std::string_view kWhiteSpaceSet =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}";
// Oniguruma (Ruby and Oniguruma syntax) reads \h as a hex digit, PCRE2 as
// horizontal space.
constexpr std::string_view kHexSet = "0-9a-fA-F";
// Oniguruma's \w is Unicode "Word" (Alphabetic, marks, decimal digits,
// connector punctuation); PCRE2 10.42 lacks the marks. Outside a class
// Oniguruma's \w also takes the Latin-1 digits/fractions (checked by
// scripts/regex_onig_xcheck.cpp).
constexpr std::string_view kWordSet = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kWordExtra = "\\x{b2}\\x{b3}\\x{b9}\\x{bc}-\\x{be}";

// GPT-2's pattern, used by ByteLevel with use_regex = true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Per-thread PCRE2 scratch: match data and a JIT stack large enough for long
// whitespace runs.
struct Scratch {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  Scratch() {
    check(md && mc && js, "tokenizer: out of memory for regex scratch");
    pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~Scratch() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buf));
}

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  bool class_start = false;  // right after '[' or '[^': a ']' is literal
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[++i];
      class_start = false;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceSet) : fmt::format("[{}]", kWhiteSpaceSet);
      } else if (e == 'S' && !in_class) {
        out += fmt::format("[^{}]", kWhiteSpaceSet);
      } else if (e == 'h') {
        out += in_class ? std::string(kHexSet) : fmt::format("[{}]", kHexSet);
      } else if (e == 'H' && !in_class) {
        out += fmt::format("[^{}]", kHexSet);
      } else if (e == 'w') {
        out += in_class ? std::string(kWordSet) : fmt::format("[{}{}]", kWordSet, kWordExtra);
      } else if (e == 'W' && !in_class) {
        out += fmt::format("[^{}{}]", kWordSet, kWordExtra);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class) {
      if (c == '[') in_class = class_start = true;
      out += c;
      if (c == '[' && i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      continue;
    }
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        class_start = false;
        continue;
      }
    }
    if (c == ']' && !class_start) in_class = false;
    class_start = false;
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, bool literal, const std::string& where) : where_(where) {
  std::string translated = literal ? std::string(pattern) : translate_pattern(pattern);
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  if (literal) opts = PCRE2_UTF | PCRE2_LITERAL;
  int err = 0;
  PCRE2_SIZE off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             opts, &err, &off, nullptr);
  if (!code) {
    fail("{}: pattern does not compile at offset {}: {}", where, off, pcre2_message(err));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  Scratch& sc = scratch();
  auto* code = static_cast<pcre2_code*>(code_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= s.size()) {
    int rc = pcre2_match(code, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK, sc.md, sc.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      fail("{}: regex match failed on a {}-byte piece: {}", where_, s.size(), pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
    size_t b = ov[0], e = ov[1];
    if (b == e && last_match_end == e) {  // empty match adjacent to the last one
      if (last_end >= s.size()) break;
      last_end += unicode::utf8_step(s, last_end).len;
      continue;
    }
    last_end = e;
    last_match_end = e;
    out.emplace_back(b, e);
    if (b == e && e == s.size()) break;
  }
  return out;
}

// --- normalizer -------------------------------------------------------------

Normalizer::Normalizer(const nlohmann::json& j, const std::string& file) {
  add(j, file, "normalizer");
}

void Normalizer::add(const nlohmann::json& j, const std::string& file, const std::string& field) {
  if (j.is_null()) return;
  check(j.is_object() && j.contains("type") && j["type"].is_string(),
        "{}: field '{}' must be an object with a string 'type'", file, field);
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto& list = j.value("normalizers", nlohmann::json());
    check(list.is_array(), "{}: field '{}.normalizers' must be an array", file, field);
    for (size_t i = 0; i < list.size(); ++i) {
      add(list[i], file, fmt::format("{}.normalizers[{}]", field, i));
    }
  } else if (type == "NFC") {
    forms_.push_back(unicode::NormForm::NFC);
  } else if (type == "NFD") {
    forms_.push_back(unicode::NormForm::NFD);
  } else if (type == "NFKC") {
    forms_.push_back(unicode::NormForm::NFKC);
  } else if (type == "NFKD") {
    forms_.push_back(unicode::NormForm::NFKD);
  } else {
    fail("{}: field '{}': unsupported normalizer type '{}'", file, field, type);
  }
}

std::string Normalizer::apply(std::string_view s) const {
  std::string out(s);
  for (auto f : forms_) out = unicode::normalize(out, f);
  return out;
}

// --- pre-tokenizer ----------------------------------------------------------

struct PreTokenizer::Step {
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool prefix_space = false;  // ByteLevel add_prefix_space (regex then is GPT-2's)
  bool is_byte_level = false;

  // Appends the pieces of `s` to `out`.
  void apply(std::string_view s, std::vector<std::string>& out) const;
};

namespace {

SplitBehavior parse_behavior(const nlohmann::json& j, const std::string& file,
                             const std::string& field) {
  check(j.is_string(), "{}: field '{}' must be a string", file, field);
  std::string b = j.get<std::string>();
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: field '{}': unknown split behavior '{}'", file, field, b);
}

struct Span {
  size_t b, e;
  bool flag;  // is_match, then "remove"
};

// HF NormalizedString::split: turns (offsets, is_match) into (offsets, remove).
std::vector<Span> apply_behavior(std::vector<Span> m, SplitBehavior behavior) {
  std::vector<Span> acc;
  bool prev = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (auto& s : m) s.flag = false;
      return m;
    case SplitBehavior::Removed:
      return m;
    case SplitBehavior::Contiguous:
      for (const auto& s : m) {
        if (s.flag == prev && !acc.empty()) {
          acc.back().e = s.e;
        } else {
          acc.push_back({s.b, s.e, false});
        }
        prev = s.flag;
      }
      return acc;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& s : m) {
        if (s.flag && !prev && !acc.empty()) {
          acc.back().e = s.e;
        } else {
          acc.push_back({s.b, s.e, false});
        }
        prev = s.flag;
      }
      return acc;
    case SplitBehavior::MergedWithNext:
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->flag && !prev && !acc.empty()) {
          acc.back().b = it->b;
        } else {
          acc.push_back({it->b, it->e, false});
        }
        prev = it->flag;
      }
      return {acc.rbegin(), acc.rend()};
  }
  return m;
}

}  // namespace

void PreTokenizer::Step::apply(std::string_view s, std::vector<std::string>& out) const {
  std::string prefixed;
  if (prefix_space && (s.empty() || s[0] != ' ')) {
    prefixed = " ";
    prefixed += s;
    s = prefixed;
  }
  if (!regex) {
    if (!s.empty()) out.emplace_back(s);
    return;
  }
  // HF Pattern::find_matches: the matches plus the gaps between them.
  std::vector<Span> m;
  if (s.empty()) {
    m.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (auto [b, e] : regex->find_all(s)) {
      if (prev != b) m.push_back({prev, b, false});
      m.push_back({b, e, true});
      prev = e;
    }
    if (prev != s.size()) m.push_back({prev, s.size(), false});
  }
  if (invert) {
    for (auto& x : m) x.flag = !x.flag;
  }
  for (const auto& x : apply_behavior(std::move(m), behavior)) {
    if (!x.flag && x.e > x.b) out.emplace_back(s.substr(x.b, x.e - x.b));
  }
}

PreTokenizer::PreTokenizer(const nlohmann::json& j, const std::string& file) {
  add(j, file, "pre_tokenizer");
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::add(const nlohmann::json& j, const std::string& file, const std::string& field) {
  if (j.is_null()) return;
  check(j.is_object() && j.contains("type") && j["type"].is_string(),
        "{}: field '{}' must be an object with a string 'type'", file, field);
  std::string type = j["type"].get<std::string>();
  auto step = std::make_unique<Step>();
  if (type == "Sequence") {
    const auto& list = j.value("pretokenizers", nlohmann::json());
    check(list.is_array(), "{}: field '{}.pretokenizers' must be an array", file, field);
    for (size_t i = 0; i < list.size(); ++i) {
      add(list[i], file, fmt::format("{}.pretokenizers[{}]", field, i));
    }
    return;
  } else if (type == "Split") {
    check(!byte_level_, "{}: field '{}': a Split after ByteLevel is not supported", file, field);
    const auto& pat = j.value("pattern", nlohmann::json());
    bool literal = pat.is_object() && pat.contains("String") && pat["String"].is_string();
    bool regex = pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string();
    check(literal || regex,
          "{}: field '{}.pattern' must be {{\"Regex\": ..}} or {{\"String\": ..}}", file, field);
    std::string text = pat[literal ? "String" : "Regex"].get<std::string>();
    check(!text.empty(), "{}: field '{}.pattern' is empty", file, field);
    step->regex =
        std::make_unique<Regex>(text, literal, fmt::format("{}: field '{}.pattern'", file, field));
    step->behavior =
        parse_behavior(j.value("behavior", nlohmann::json()), file, field + ".behavior");
    const auto& inv = j.value("invert", nlohmann::json(false));
    check(inv.is_boolean(), "{}: field '{}.invert' must be a boolean", file, field);
    step->invert = inv.get<bool>();
  } else if (type == "ByteLevel") {
    const auto& aps = j.value("add_prefix_space", nlohmann::json());
    check(aps.is_boolean(), "{}: field '{}.add_prefix_space' must be a boolean", file, field);
    const auto& ur = j.value("use_regex", nlohmann::json(true));
    check(ur.is_boolean(), "{}: field '{}.use_regex' must be a boolean", file, field);
    step->prefix_space = aps.get<bool>();
    if (ur.get<bool>()) {
      step->regex = std::make_unique<Regex>(kGpt2Pattern, false, "ByteLevel GPT-2 pattern");
    }
    step->is_byte_level = true;
    byte_level_ = true;
    if (!step->regex && !step->prefix_space) return;  // splits nothing: only maps bytes
  } else {
    fail("{}: field '{}': unsupported pre_tokenizer type '{}'", file, field, type);
  }
  steps_.push_back(std::move(step));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& words) const {
  if (steps_.empty()) {
    if (!text.empty()) words.emplace_back(text);
    return;
  }
  std::vector<std::string> cur, next;
  steps_[0]->apply(text, steps_.size() == 1 ? words : cur);
  for (size_t k = 1; k < steps_.size(); ++k) {
    bool last = k + 1 == steps_.size();
    std::vector<std::string>& dst = last ? words : next;
    for (const auto& piece : cur) steps_[k]->apply(piece, dst);
    if (!last) std::swap(cur, next), next.clear();
  }
}

}  // namespace moetier::tok
