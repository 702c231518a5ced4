#include "format/bpe.h"

#include <queue>

#include "core/error.h"
#include "format/unicode.h"

namespace moetier::tok {

namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// Reads an optional string option: null/absent -> "".
std::string opt_string(const nlohmann::json& m, const char* key, const std::string& file) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return {};
  check(it->is_string(), "{}: field 'model.{}' must be a string or null", file, key);
  return it->get<std::string>();
}

bool opt_bool(const nlohmann::json& m, const char* key, const std::string& file) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return false;
  check(it->is_boolean(), "{}: field 'model.{}' must be a boolean or null", file, key);
  return it->get<bool>();
}

}  // namespace

Bpe::Bpe(const nlohmann::json& m, const std::string& file, bool byte_level)
    : byte_level_(byte_level) {
  check(m.is_object(), "{}: field 'model' must be an object", file);
  auto type = m.find("type");
  check(type != m.end() && type->is_string() && *type == "BPE",
        "{}: field 'model.type': unsupported model type {} (only BPE)", file,
        type == m.end() ? std::string("(missing)") : type->dump());
  auto dropout = m.find("dropout");
  check(dropout == m.end() || dropout->is_null() ||
            (dropout->is_number() && dropout->get<double>() == 0.0),
        "{}: field 'model.dropout': BPE dropout is not supported", file);
  check(opt_string(m, "continuing_subword_prefix", file).empty(),
        "{}: field 'model.continuing_subword_prefix': a non-empty prefix is not supported", file);
  check(opt_string(m, "end_of_word_suffix", file).empty(),
        "{}: field 'model.end_of_word_suffix': a non-empty suffix is not supported", file);
  fuse_unk_ = opt_bool(m, "fuse_unk", file);
  byte_fallback_ = opt_bool(m, "byte_fallback", file);
  ignore_merges_ = opt_bool(m, "ignore_merges", file);

  parse_vocab(m, file);
  std::string unk = opt_string(m, "unk_token", file);
  if (!unk.empty()) {
    auto id = token_to_id(unk);
    check(id.has_value(), "{}: field 'model.unk_token': '{}' is not in the vocabulary", file, unk);
    unk_id_ = id;
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(s, unicode::byte_to_unicode()[b]);
    byte_ids_[b] = token_to_id(s).value_or(-1);
  }

  parse_merges(m, file);
}

void Bpe::parse_vocab(const nlohmann::json& m, const std::string& file) {
  auto vocab = m.find("vocab");
  check(vocab != m.end() && vocab->is_object(), "{}: field 'model.vocab' must be an object", file);
  vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    check(it->is_number_integer() && it->get<int64_t>() >= 0 &&
              it->get<int64_t>() < (int64_t(1) << 31) - 1,
          "{}: field 'model.vocab': id of token {} must be a non-negative 32-bit integer", file,
          nlohmann::json(it.key()).dump());
    int64_t id = it->get<int64_t>();
    vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : vocab_) {
    id_to_token_[id] = tok;
    has_id_[id] = true;
  }
}

void Bpe::parse_merges(const nlohmann::json& m, const std::string& file) {
  auto merges = m.find("merges");
  check(merges != m.end() && merges->is_array(), "{}: field 'model.merges' must be an array", file);
  merges_.reserve(merges->size());
  uint32_t rank = 0;
  for (size_t i = 0; i < merges->size(); ++i) {
    const auto& e = (*merges)[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      if (s.starts_with("#version")) continue;
      size_t sp = s.find(' ');
      check(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
            "{}: field 'model.merges[{}]': '{}' is not two tokens separated by one space", file, i,
            s);
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      check(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
            "{}: field 'model.merges[{}]' must be \"a b\" or [\"a\", \"b\"]", file, i);
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    }
    auto ia = token_to_id(a), ib = token_to_id(b), inew = token_to_id(a + b);
    check(ia && ib && inew, "{}: field 'model.merges[{}]': token '{}' is not in the vocabulary",
          file, i,
          !ia   ? a
          : !ib ? b
                : a + b);
    merges_[pair_key(*ia, *ib)] = MergeVal{rank++, *inew};
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_bound() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

const Bpe::MergeVal* Bpe::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  if (byte_level_) {
    bool all = true;
    for (unsigned char c : word) {
      if (byte_ids_[c] < 0) {
        all = false;
        break;
      }
      syms.push_back(byte_ids_[c]);
    }
    if (all) return;
    syms.clear();
  }
  // General path: one symbol per character of the model string.
  std::string mapped = byte_level_ ? unicode::bytes_to_byte_level(word) : std::string(word);
  int32_t pending_unk = -1;
  size_t i = 0;
  while (i < mapped.size()) {
    size_t len = unicode::utf8_step(mapped, i).len;
    std::string_view ch(mapped.data() + i, len);
    i += len;
    if (auto id = token_to_id(ch)) {
      if (pending_unk >= 0) syms.push_back(pending_unk), pending_unk = -1;
      syms.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char c : ch) {
        auto id = token_to_id(fmt::format("<0x{:02X}>", c));
        if (!id) break;
        bytes.push_back(*id);
      }
      if (bytes.size() == ch.size()) {
        syms.insert(syms.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) syms.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without unk_token the character is dropped, as tokenizers does.
  }
  if (pending_unk >= 0) syms.push_back(pending_unk);
}

void Bpe::merge(std::vector<int32_t>& syms) const {
  const int32_t n = static_cast<int32_t>(syms.size());
  if (n < 2) return;
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
  std::vector<int32_t> prev(n), next(n);  // [n] linked list; next == n means none
  std::vector<bool> alive(n, true);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1, next[i] = i + 1;
    if (i + 1 < n) {
      if (const MergeVal* mv = find_merge(syms[i], syms[i + 1])) {
        queue.push({mv->rank, i, mv->new_id});
      }
    }
  }
  while (!queue.empty()) {
    Cand top = queue.top();
    queue.pop();
    int32_t p = top.pos;
    if (!alive[p] || next[p] >= n) continue;
    int32_t q = next[p];
    const MergeVal* mv = find_merge(syms[p], syms[q]);
    if (!mv || mv->new_id != top.new_id) continue;  // stale entry
    syms[p] = top.new_id;
    alive[q] = false;
    next[p] = next[q];
    if (next[q] < n) prev[next[q]] = p;
    if (prev[p] >= 0) {
      if (const MergeVal* l = find_merge(syms[prev[p]], syms[p])) {
        queue.push({l->rank, prev[p], l->new_id});
      }
    }
    if (next[p] < n) {
      if (const MergeVal* r = find_merge(syms[p], syms[next[p]])) {
        queue.push({r->rank, p, r->new_id});
      }
    }
  }
  int32_t k = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (alive[i]) syms[k++] = syms[i];
  }
  syms.resize(k);
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string mapped = byte_level_ ? unicode::bytes_to_byte_level(word) : std::string(word);
    if (auto id = token_to_id(mapped)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWord;
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  initial_symbols(word, syms);
  merge(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(syms));
  }
}

}  // namespace moetier::tok
