// Equality with Hugging Face tokenizers. For every tests/data/tokenizer_refs/*.json
// (written by scripts/tokenizer_refs.py from tokenizers.Tokenizer.from_file), the
// matching tokenizer.json must give exactly the reference ids, with and without
// special tokens, and the same decoded strings. The real Qwen3 and DeepSeek-V3
// tokenizer files come from scripts/fetch_tokenizers.sh (tests/data/external/);
// a missing one is a failure, never a silent pass.
//
// MOETIER_TOKENIZER_REFS=DIR reads the refs from DIR instead (e.g. the interim
// JavaScript refs of scripts/tokenizer_refs_js.mjs).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "format/tokenizer.h"
#include "format/unicode.h"

using namespace moetier;
using nlohmann::json;
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kRoot = MOETIER_SOURCE_DIR;
const char* kFetchHint = "run scripts/fetch_tokenizers.sh (CI runs it before the tests)";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// SHA-256 (FIPS 180-4), to tie refs to the exact tokenizer.json and corpus.
std::string sha256_hex(const std::string& data) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
      0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
      0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
      0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
      0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
      0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
      0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
      0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
      0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string msg = data;
  uint64_t bits = uint64_t(data.size()) * 8;
  msg.push_back(char(0x80));
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 7; i >= 0; --i) msg.push_back(char(bits >> (8 * i)));
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  for (size_t off = 0; off < msg.size(); off += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + off + 4 * i);
      w[i] = uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 =
          hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    uint32_t add[8] = {a, b, c, d, e, f, g, hh};
    for (int i = 0; i < 8; ++i) h[i] += add[i];
  }
  std::string out;
  for (uint32_t x : h) out += fmt::format("{:08x}", x);
  return out;
}

fs::path refs_dir() {
  const char* env = std::getenv("MOETIER_TOKENIZER_REFS");
  return env && *env ? fs::path(env) : kRoot / "tests/data/tokenizer_refs";
}

fs::path tokenizer_path(const std::string& name, const std::string& source) {
  std::string sub = source == "fixtures" ? "tests/data/fixtures" : "tests/data/external";
  return kRoot / sub / name / "tokenizer.json";
}

// The text of a case: a corpus file, one of its lines, or inline text.
std::string case_text(const json& c, const fs::path& corpus) {
  if (c.contains("text")) return c["text"].get<std::string>();
  std::string text = unicode::utf8_sanitize(read_bytes(corpus / c["file"].get<std::string>()));
  if (!c.contains("line")) return text;
  size_t want = c["line"].get<size_t>(), line = 0, begin = 0;
  while (line < want) {
    begin = text.find('\n', begin);
    if (begin == std::string::npos) return "<no such line>";
    ++begin, ++line;
  }
  size_t end = text.find('\n', begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string describe(const json& c) {
  if (c.contains("text")) return "text " + json(c["text"]).dump();
  std::string s = "file " + c["file"].get<std::string>();
  if (c.contains("line")) s += " line " + std::to_string(c["line"].get<int>());
  return s;
}

// "ids differ at index I: got [..] want [..]" with the tokens around I.
std::string diff_ids(const Tokenizer& tok, const Ids& got, const Ids& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  auto around = [&](const Ids& v) {
    std::string s;
    for (size_t k = i > 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k) {
      s += fmt::format("{}{}={}", s.empty() ? "" : " ", v[k], json(tok.token_text(v[k])).dump());
    }
    return s;
  };
  return fmt::format("ids differ at index {} (got {} ids, want {}): got [{}] want [{}]", i,
                     got.size(), want.size(), around(got), around(want));
}

struct RefStats {
  int cases = 0, failures = 0;
};

void check_case(const Tokenizer& tok, const json& c, const fs::path& corpus, RefStats& st) {
  std::string text = case_text(c, corpus);
  Ids want = c["ids"].get<Ids>(), want_ns = c["ids_no_special"].get<Ids>();
  Ids got = tok.encode(text, true), got_ns = tok.encode(text, false);
  ++st.cases;
  bool ok = got == want && got_ns == want_ns;
  if (got != want) ADD_FAILURE() << describe(c) << ": " << diff_ids(tok, got, want);
  if (got_ns != want_ns) {
    ADD_FAILURE() << describe(c) << " (no special): " << diff_ids(tok, got_ns, want_ns);
  }
  if (c.contains("decoded")) {
    std::string d = tok.decode(want), ds = tok.decode(want, true);
    if (d != c["decoded"].get<std::string>()) ok = false, ADD_FAILURE() << describe(c) << ": decode differs";
    if (ds != c["decoded_skip_special"].get<std::string>()) {
      ok = false, ADD_FAILURE() << describe(c) << ": decode(skip_special_tokens) differs";
    }
    StreamDecoder sd(tok);
    std::string streamed;
    for (int32_t id : want) streamed += sd.push(id);
    streamed += sd.finish();
    if (streamed != d) ok = false, ADD_FAILURE() << describe(c) << ": stream decode differs";
  }
  // Round trip for text the normalizer leaves alone.
  if (unicode::normalize(text, unicode::NormForm::NFC) == text && tok.decode(got_ns) != text) {
    ok = false, ADD_FAILURE() << describe(c) << ": decode(encode(x)) != x";
  }
  if (!ok) ++st.failures;
}

void check_ref_file(const fs::path& ref_path) {
  SCOPED_TRACE(ref_path.string());
  json ref = json::parse(read_bytes(ref_path));
  std::string name = ref["tokenizer"].get<std::string>();
  fs::path tok_path = tokenizer_path(name, ref.value("source", "external"));
  ASSERT_TRUE(fs::exists(tok_path))
      << tok_path.string() << " is missing: "
      << (ref.value("source", "") == "fixtures" ? "the fixture was not generated" : kFetchHint);
  ASSERT_EQ(sha256_hex(read_bytes(tok_path)), ref["sha256"].get<std::string>())
      << tok_path.string() << " differs from the file the refs were made from";
  fs::path corpus = kRoot / "tests/data/tokenizer_corpus";
  for (auto& [file, sha] : ref["corpus"].items()) {
    ASSERT_EQ(sha256_hex(read_bytes(corpus / file)), sha.get<std::string>())
        << "corpus file " << file << " changed since the refs were made: rerun "
        << "scripts/tokenizer_refs.py";
  }
  Tokenizer tok = Tokenizer::load(tok_path);
  RefStats st;
  for (const json& c : ref["cases"]) {
    check_case(tok, c, corpus, st);
    if (st.failures >= 20) {
      ADD_FAILURE() << "stopping after 20 failing cases";
      break;
    }
  }
  std::printf("tokenizer refs %s (%s): %d cases, %d failing\n", name.c_str(),
              ref.value("tokenizers_version", "?").c_str(), st.cases, st.failures);
  EXPECT_GT(st.cases, 0);
}

std::vector<fs::path> ref_files() {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(refs_dir(), ec)) {
    if (e.path().extension() == ".json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tokenizer load_external(const std::string& name) {
  fs::path p = kRoot / "tests/data/external" / name / "tokenizer.json";
  if (!fs::exists(p)) throw std::runtime_error(p.string() + " is missing: " + kFetchHint);
  return Tokenizer::load(p);
}

}  // namespace

TEST(TokenizerRefs, Sha256) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(TokenizerRefs, MatchHuggingFaceTokenizers) {
  auto files = ref_files();
  if (files.empty()) {
    GTEST_SKIP() << "no refs in " << refs_dir().string()
                 << " yet: generate them with scripts/tokenizer_refs.py (see docs/tokenizer.md)";
  }
  for (const auto& f : files) check_ref_file(f);
}

TEST(TokenizerRefs, Qwen3Basics) {
  Tokenizer t = load_external("qwen3");
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.eos_id(), 151645);  // tokenizer_config.json: <|im_end|>
  EXPECT_EQ(t.encode("Hello, world!"), (Ids{9707, 11, 1879, 0}));
  EXPECT_EQ(t.encode("<|im_start|>user\nhi<|im_end|>").front(), 151644);
  EXPECT_EQ(t.encode("<|im_start|>user\nhi<|im_end|>").back(), 151645);
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
}

TEST(TokenizerRefs, DeepSeekV3Basics) {
  Tokenizer t = load_external("deepseek_v3");
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.add_bos_token());
  EXPECT_EQ(t.encode("<\uff5cbegin\u2581of\u2581sentence\uff5c>", false), (Ids{0}));
  // tokenizer.json's post_processor is ByteLevel only: no BOS from encode().
  Ids ids = t.encode("Hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids.front(), 0);
  EXPECT_EQ(t.encode("1234567", false).size(), 3u);  // \p{N}{1,3}: 123 456 7
}

TEST(TokenizerRefs, CorpusRoundTripAndThroughput) {
  for (const char* name : {"qwen3", "deepseek_v3"}) {
    SCOPED_TRACE(name);
    Tokenizer t = load_external(name);
    std::string all;
    for (const auto& e : fs::directory_iterator(kRoot / "tests/data/tokenizer_corpus")) {
      if (e.path().extension() != ".txt") continue;
      std::string text = unicode::utf8_sanitize(read_bytes(e.path()));
      Ids ids = t.encode(text, false);
      std::string nfc =
          name == std::string("qwen3") ? unicode::normalize(text, unicode::NormForm::NFC) : text;
      EXPECT_EQ(t.decode(ids), nfc) << e.path().filename();
      all += text;
    }
    std::string big;
    while (big.size() < (2u << 20)) big += all;  // 2 MiB; the cache helps after a pass
    auto t0 = std::chrono::steady_clock::now();
    Ids ids = t.encode(big, false);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: encoded %.1f MiB into %zu ids in %.3f s (%.1f MiB/s)\n", name,
                big.size() / 1048576.0, ids.size(), s, big.size() / 1048576.0 / s);
    EXPECT_GT(ids.size(), big.size() / 8);
  }
}
