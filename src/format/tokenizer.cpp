#include "format/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "format/added_tokens.h"
#include "format/bpe.h"
#include "format/pretokenize.h"
#include "format/unicode.h"

namespace moetier {

using nlohmann::json;
namespace fs = std::filesystem;

struct Tokenizer::Impl {
  std::string file;
  tok::Normalizer normalizer;
  tok::PreTokenizer pre;
  std::unique_ptr<tok::Bpe> bpe;
  std::vector<tok::AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in added
  tok::StringIdMap added_by_content;
  std::vector<const tok::AddedToken*> raw_tokens, norm_tokens;
  std::unique_ptr<tok::TokenMatcher> raw_matcher, norm_matcher;
  std::vector<int32_t> prefix, suffix;  // post_processor specials around the sequence
  bool byte_level_decoder = false;
  std::optional<int32_t> eos, bos;
  bool add_bos = false;
  int32_t vocab_size = 0;

  const tok::AddedToken* added_of(int32_t id) const {
    auto it = added_by_id.find(id);
    return it == added_by_id.end() ? nullptr : &added[it->second];
  }
  void parse_added(const json& root);
  void parse_post_processor(const json& j, const std::string& field);
  void parse_decoder(const json& j);
  void parse_config(const fs::path& config);
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
};

namespace {

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open file", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  check(!in.bad(), "{}: read error", path.string());
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: bad JSON: {}", path.string(), e.what());
  }
}

bool get_bool(const json& j, const char* key, bool dflt, const std::string& file,
              const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  check(it->is_boolean(), "{}: field '{}.{}' must be a boolean", file, field, key);
  return it->get<bool>();
}

// A special token given as "text" or {"content": "text", ...}.
std::optional<std::string> token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return std::nullopt;
}

// TemplateProcessing's "single" template: the special ids before and after "A".
void template_ids(const json& j, const std::string& file, const std::string& field,
                  std::vector<int32_t>& before, std::vector<int32_t>& after) {
  const json& single = j.value("single", json());
  const json& specials = j.value("special_tokens", json::object());
  check(single.is_array(), "{}: field '{}.single' must be an array", file, field);
  bool seen_seq = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    std::string pf = fmt::format("{}.single[{}]", field, i);
    if (piece.is_object() && piece.contains("Sequence")) {
      check(!seen_seq, "{}: field '{}': a second sequence in a single template", file, pf);
      seen_seq = true;
      continue;
    }
    check(piece.is_object() && piece.contains("SpecialToken") &&
              piece["SpecialToken"].is_object() && piece["SpecialToken"].contains("id") &&
              piece["SpecialToken"]["id"].is_string(),
          "{}: field '{}' must be {{\"Sequence\": ..}} or {{\"SpecialToken\": {{\"id\": ..}}}}",
          file, pf);
    std::string name = piece["SpecialToken"]["id"].get<std::string>();
    const json& st = specials.is_object() ? specials.value(name, json()) : json();
    const json& st_ids = st.is_object() ? st.value("ids", json()) : json();
    check(st_ids.is_array(), "{}: field '{}.special_tokens' has no ids for '{}'", file, field,
          name);
    for (const json& id : st_ids) {
      check(id.is_number_integer(), "{}: field '{}.special_tokens.{}.ids' must hold integers", file,
            field, name);
      (seen_seq ? after : before).push_back(id.get<int32_t>());
    }
  }
}

}  // namespace

void Tokenizer::Impl::parse_added(const json& root) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return;
  check(it->is_array(), "{}: field 'added_tokens' must be an array", file);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    std::string field = fmt::format("added_tokens[{}]", i);
    check(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
              t["id"].get<int64_t>() >= 0 && t["id"].get<int64_t>() < (int64_t(1) << 31) - 1,
          "{}: field '{}.id' must be a non-negative 32-bit integer", file, field);
    check(t.contains("content") && t["content"].is_string() &&
              !t["content"].get_ref<const std::string&>().empty(),
          "{}: field '{}.content' must be a non-empty string", file, field);
    tok::AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"].get<std::string>();
    check(unicode::utf8_valid(a.content), "{}: field '{}.content' is not valid UTF-8", file, field);
    a.special = get_bool(t, "special", false, file, field);
    a.single_word = get_bool(t, "single_word", false, file, field);
    a.lstrip = get_bool(t, "lstrip", false, file, field);
    a.rstrip = get_bool(t, "rstrip", false, file, field);
    a.normalized = get_bool(t, "normalized", !a.special, file, field);
    if (added_by_content.count(a.content)) continue;  // tokenizers keeps the first
    added_by_content[a.content] = a.id;
    added_by_id[a.id] = added.size();
    added.push_back(std::move(a));
  }
}

void Tokenizer::Impl::parse_post_processor(const json& j, const std::string& field) {
  if (j.is_null()) return;
  check(j.is_object() && j.contains("type") && j["type"].is_string(),
        "{}: field '{}' must be an object with a string 'type'", file, field);
  std::string type = j["type"].get<std::string>();
  std::vector<int32_t> before, after;
  if (type == "ByteLevel") {
    return;  // offsets only
  } else if (type == "Sequence") {
    const json& list = j.value("processors", json());
    check(list.is_array(), "{}: field '{}.processors' must be an array", file, field);
    for (size_t i = 0; i < list.size(); ++i) {
      parse_post_processor(list[i], fmt::format("{}.processors[{}]", field, i));
    }
    return;
  } else if (type == "TemplateProcessing") {
    template_ids(j, file, field, before, after);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const json& v = j.value(key, json());
      check(v.is_array() && v.size() == 2 && v[1].is_number_integer(),
            "{}: field '{}.{}' must be [token, id]", file, field, key);
      (std::string(key) == "cls" ? before : after).push_back(v[1].get<int32_t>());
    }
  } else {
    fail("{}: field '{}': unsupported post_processor type '{}'", file, field, type);
  }
  prefix.insert(prefix.begin(), before.begin(), before.end());
  suffix.insert(suffix.end(), after.begin(), after.end());
}

void Tokenizer::Impl::parse_decoder(const json& j) {
  if (j.is_null()) return;
  check(j.is_object() && j.contains("type") && j["type"].is_string(),
        "{}: field 'decoder' must be an object with a string 'type'", file);
  std::string type = j["type"].get<std::string>();
  check(type == "ByteLevel", "{}: field 'decoder': unsupported decoder type '{}'", file, type);
  byte_level_decoder = true;
}

void Tokenizer::Impl::parse_config(const fs::path& config) {
  std::error_code ec;
  if (!fs::exists(config, ec)) return;
  json c = read_json(config);
  check(c.is_object(), "{}: must hold a JSON object", config.string());
  auto lookup = [&](const char* key) -> std::optional<int32_t> {
    auto it = c.find(key);
    if (it == c.end()) return std::nullopt;
    auto content = token_content(*it);
    if (!content) return std::nullopt;
    auto a = added_by_content.find(*content);
    if (a != added_by_content.end()) return a->second;
    return bpe->token_to_id(*content);
  };
  eos = lookup("eos_token");
  bos = lookup("bos_token");
  auto ab = c.find("add_bos_token");
  add_bos = ab != c.end() && ab->is_boolean() && ab->get<bool>();
}

Tokenizer Tokenizer::load(const fs::path& path) {
  fs::path file = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  check(st.type() != fs::file_type::not_found, "{}: no such file or directory", path.string());
  if (fs::is_directory(st)) {
    file = path / "tokenizer.json";
    check(fs::status(file, ec).type() != fs::file_type::not_found, "{}: no tokenizer.json",
          path.string());
  }
  auto impl = std::make_unique<Impl>();
  impl->file = file.string();
  const std::string& f = impl->file;
  json root = read_json(file);
  check(root.is_object(), "{}: must hold a JSON object", f);
  for (const char* key : {"truncation", "padding"}) {
    check(!root.contains(key) || root[key].is_null(), "{}: field '{}': only null is supported", f,
          key);
  }
  impl->pre = tok::PreTokenizer(root.value("pre_tokenizer", json()), f);
  check(root.contains("model"), "{}: field 'model' is missing", f);
  impl->bpe = std::make_unique<tok::Bpe>(root["model"], f, impl->pre.byte_level());
  impl->normalizer = tok::Normalizer(root.value("normalizer", json()), f);
  impl->parse_added(root);
  impl->parse_post_processor(root.value("post_processor", json()), "post_processor");
  impl->parse_decoder(root.value("decoder", json()));

  std::vector<std::string> raw, norm;
  for (const auto& a : impl->added) {
    if (a.normalized) {
      norm.push_back(impl->normalizer.empty() ? a.content : impl->normalizer.apply(a.content));
      impl->norm_tokens.push_back(&a);
    } else {
      raw.push_back(a.content);
      impl->raw_tokens.push_back(&a);
    }
  }
  impl->raw_matcher = std::make_unique<tok::TokenMatcher>(raw);
  impl->norm_matcher = std::make_unique<tok::TokenMatcher>(norm);

  impl->vocab_size = impl->bpe->id_bound();
  for (const auto& a : impl->added) impl->vocab_size = std::max(impl->vocab_size, a.id + 1);
  impl->parse_config(file.parent_path() / "tokenizer_config.json");
  if (!impl->eos) {
    for (const char* name :
         {"<|endoftext|>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "</s>", "<|end_of_text|>"}) {
      auto it = impl->added_by_content.find(std::string_view(name));
      if (it != impl->added_by_content.end()) {
        impl->eos = it->second;
        break;
      }
    }
  }
  return Tokenizer(std::move(impl));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<tok::Segment> raw_segs, norm_segs;
  std::vector<std::string> words;
  tok::split_added(text, *raw_matcher, raw_tokens, raw_segs);
  for (const auto& seg : raw_segs) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string normalized = normalizer.empty() ? seg.text : normalizer.apply(seg.text);
    norm_segs.clear();
    tok::split_added(normalized, *norm_matcher, norm_tokens, norm_segs);
    for (const auto& piece : norm_segs) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      words.clear();
      pre.split(piece.text, words);
      for (const auto& w : words) bpe->encode_word(w, ids);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix;
  if (unicode::utf8_valid(text)) {
    impl_->encode_text(text, ids);
  } else {
    impl_->encode_text(unicode::utf8_sanitize(text), ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id, bool skip_special_tokens) const {
  const std::string* name = nullptr;
  if (const tok::AddedToken* a = impl_->added_of(id)) {
    name = &a->content;
  } else {
    name = impl_->bpe->id_to_token(id);
  }
  if (!name) return {};
  if (skip_special_tokens) {
    auto it = impl_->added_by_content.find(*name);
    if (it != impl_->added_by_content.end() &&
        impl_->added[impl_->added_by_id.at(it->second)].special) {
      return {};
    }
  }
  if (!impl_->byte_level_decoder) return *name;
  std::string out;
  out.reserve(name->size());
  size_t i = 0;
  while (i < name->size()) {
    int b = unicode::unicode_to_byte(unicode::next_cp(*name, i));
    if (b < 0) return *name;  // not a byte-level token: its text as is
    out.push_back(static_cast<char>(b));
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    std::string b = token_bytes(id, skip_special_tokens);
    if (b.empty()) continue;
    if (!impl_->byte_level_decoder && !first) out.push_back(' ');
    out += b;
    first = false;
  }
  return unicode::utf8_valid(out) ? out : unicode::utf8_sanitize(out);
}

std::string Tokenizer::token_text(int32_t id) const {
  if (const tok::AddedToken* a = impl_->added_of(id)) return a->content;
  const std::string* s = impl_->bpe->id_to_token(id);
  return s ? *s : std::string();
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

const std::string& Tokenizer::file() const { return impl_->file; }

std::optional<std::string> tokenizer_vocab_problem(const Tokenizer& tok, int64_t vocab_size,
                                                   const fs::path& model_dir) {
  if (tok.vocab_size() <= vocab_size) return std::nullopt;
  return fmt::format(
      "{}: token ids reach {} (a vocabulary of {} ids), past the model's vocab_size {} ({})",
      tok.file(), tok.vocab_size() - 1, tok.vocab_size(), vocab_size,
      (model_dir / "config.json").string());
}

void check_tokenizer_fits(const Tokenizer& tok, int64_t vocab_size, const fs::path& model_dir) {
  if (auto p = tokenizer_vocab_problem(tok, vocab_size, model_dir)) throw Error(*p);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->bpe->token_to_id(token);
}

std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }

bool Tokenizer::is_special(int32_t id) const {
  const tok::AddedToken* a = impl_->added_of(id);
  return a && a->special;
}

const std::vector<tok::AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

bool Tokenizer::joins_with_space() const { return !impl_->byte_level_decoder; }

// --- streaming --------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  std::string b = tok_->token_bytes(id, skip_special_);
  if (b.empty()) return {};
  if (tok_->joins_with_space() && !first_) pending_.push_back(' ');
  first_ = false;
  pending_ += b;
  size_t n = unicode::utf8_complete_prefix(pending_);
  std::string out = unicode::utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = unicode::utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace moetier
