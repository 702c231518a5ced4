#include "experts/trace.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"

namespace moetier {

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'T', 'R', 'A', 'C', 'E'};
constexpr char kEndMagic[8] = {'M', 'O', 'E', 'T', 'E', 'N', 'D', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kPrefixBytes = 24;  // magic, version, record_bytes, header_bytes
constexpr size_t kFooterBytes = 24;  // magic, records, crc, reserved
constexpr size_t kHeadBytes = 20;    // token, position, chunk, sequence, corpus, phase, pad

template <typename T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int j = 0; j < 8; ++j) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// ---- header ----

uint64_t TraceModel::bytes_of(const std::string& enc) const {
  std::string known;
  for (const EncodingBytes& e : encodings) {
    if (e.name == enc) return e.bytes;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  fail("--encoding: unknown encoding '{}' (this trace knows {})", enc, known);
}

size_t TraceHeader::record_bytes() const {
  size_t n = model.moe_layers.size() * size_t(model.k);
  return kHeadBytes + n * 2 + n * (f32_weights ? 4 : 2);
}

std::vector<EncodingBytes> expert_encoding_bytes(int64_t hidden, int64_t inter,
                                                 const std::string& native, uint64_t native_bytes) {
  const uint64_t H = uint64_t(hidden), I = uint64_t(inter);
  // The three matrices of an expert: gate [I, H], up [I, H], down [H, I].
  const std::array<std::pair<uint64_t, uint64_t>, 3> mats = {{{I, H}, {I, H}, {H, I}}};
  auto sum = [&](auto per_matrix) {
    uint64_t s = 0;
    for (auto [r, c] : mats) s += per_matrix(r, c);
    return s;
  };
  std::vector<EncodingBytes> out{{native, native_bytes, true}};
  auto add = [&](const char* name, uint64_t b) {
    if (name != native) out.push_back({name, b, false});
  };
  add("bf16", sum([](uint64_t r, uint64_t c) { return r * c * 2; }));
  // e4m3 weights with one f32 scale per 128x128 block.
  add("fp8",
      sum([](uint64_t r, uint64_t c) { return r * c + ceil_div(r, 128) * ceil_div(c, 128) * 4; }));
  // e2m1 pairs with one e8m0 scale per 32 elements of a row.
  add("mxfp4",
      sum([](uint64_t r, uint64_t c) { return r * ceil_div(c, 2) + r * ceil_div(c, 32); }));
  // 3-bit codes packed per row plus an 8-entry f16 codebook per row.
  add("cb3", sum([](uint64_t r, uint64_t c) { return r * (ceil_div(c * 3, 8) + 16); }));
  return out;
}

nlohmann::json TraceHeader::to_json() const {
  nlohmann::json enc = nlohmann::json::array();
  for (const EncodingBytes& e : model.encodings)
    enc.push_back({{"name", e.name}, {"bytes", e.bytes}, {"measured", e.measured}});
  return {{"format", "moetier-trace"},
          {"version", kVersion},
          {"model",
           {{"dir", model.dir},
            {"model_type", model.model_type},
            {"num_layers", model.num_layers},
            {"num_experts", model.num_experts},
            {"k", model.k},
            {"moe_layers", model.moe_layers},
            {"hidden_size", model.hidden},
            {"moe_intermediate_size", model.moe_intermediate},
            {"encoding", model.encoding},
            {"expert_bytes", model.expert_bytes},
            {"slot_bytes", model.slot_bytes},
            {"encodings", enc}}},
          {"corpus", corpus},
          {"weights", f32_weights ? "f32" : "f16"},
          {"settings", settings}};
}

namespace {

// Reads the header JSON with one-line errors naming the file and the field.
struct HeaderReader {
  const std::string& file;
  const nlohmann::json& j;

  const nlohmann::json& at(const nlohmann::json& o, const char* where, const char* key) const {
    check(o.is_object() && o.contains(key), "{}: trace header: {}'{}' missing", file, where, key);
    return o[key];
  }
  int64_t integer(const nlohmann::json& o, const char* where, const char* key, int64_t lo,
                  int64_t hi) const {
    const auto& v = at(o, where, key);
    check(v.is_number_integer(), "{}: trace header: {}'{}' is not an integer", file, where, key);
    int64_t x = v.get<int64_t>();
    check(x >= lo && x <= hi, "{}: trace header: {}'{}' = {} outside [{}, {}]", file, where, key, x,
          lo, hi);
    return x;
  }
  std::string str(const nlohmann::json& o, const char* where, const char* key) const {
    const auto& v = at(o, where, key);
    check(v.is_string(), "{}: trace header: {}'{}' is not a string", file, where, key);
    return v.get<std::string>();
  }
  TraceModel model() const;
  TraceHeader header() const;
};

TraceModel HeaderReader::model() const {
  const auto& m = at(j, "", "model");
  const char* w = "model.";
  TraceModel tm;
  tm.dir = str(m, w, "dir");
  tm.model_type = str(m, w, "model_type");
  tm.num_layers = integer(m, w, "num_layers", 1, 1 << 16);
  tm.num_experts = integer(m, w, "num_experts", 1, 65536);
  tm.k = integer(m, w, "k", 1, tm.num_experts);
  tm.hidden = integer(m, w, "hidden_size", 1, int64_t(1) << 32);
  tm.moe_intermediate = integer(m, w, "moe_intermediate_size", 1, int64_t(1) << 32);
  tm.encoding = str(m, w, "encoding");
  tm.expert_bytes = uint64_t(integer(m, w, "expert_bytes", 1, INT64_MAX));
  tm.slot_bytes = uint64_t(integer(m, w, "slot_bytes", 1, INT64_MAX));
  const auto& ml = at(m, w, "moe_layers");
  check(ml.is_array() && !ml.empty(),
        "{}: trace header: model.'moe_layers' is not a non-empty array", file);
  for (const auto& v : ml) {
    check(v.is_number_integer(), "{}: trace header: model.'moe_layers' holds a non-integer", file);
    int64_t l = v.get<int64_t>();
    check(l >= 0 && l < tm.num_layers && (tm.moe_layers.empty() || l > tm.moe_layers.back()),
          "{}: trace header: model.'moe_layers' not ascending in [0, {})", file, tm.num_layers);
    tm.moe_layers.push_back(l);
  }
  const auto& enc = at(m, w, "encodings");
  check(enc.is_array() && !enc.empty(), "{}: trace header: model.'encodings' is not an array",
        file);
  for (const auto& e : enc) {
    EncodingBytes eb;
    eb.name = str(e, "model.encodings[].", "name");
    eb.bytes = uint64_t(integer(e, "model.encodings[].", "bytes", 1, INT64_MAX));
    const auto& me = at(e, "model.encodings[].", "measured");
    check(me.is_boolean(), "{}: trace header: model.encodings[].'measured' is not a boolean", file);
    eb.measured = me.get<bool>();
    tm.encodings.push_back(eb);
  }
  return tm;
}

TraceHeader HeaderReader::header() const {
  check(j.is_object(), "{}: trace header is not a JSON object", file);
  check(str(j, "", "format") == "moetier-trace", "{}: trace header: 'format' is not moetier-trace",
        file);
  TraceHeader h;
  h.model = model();
  const auto& c = at(j, "", "corpus");
  check(c.is_array(), "{}: trace header: 'corpus' is not an array", file);
  for (const auto& v : c) {
    check(v.is_string(), "{}: trace header: 'corpus' holds a non-string", file);
    h.corpus.push_back(v.get<std::string>());
  }
  std::string wt = str(j, "", "weights");
  check(wt == "f16" || wt == "f32", "{}: trace header: 'weights' is '{}' (f16 or f32)", file, wt);
  h.f32_weights = wt == "f32";
  if (j.contains("settings")) h.settings = j["settings"];
  return h;
}

}  // namespace

TraceHeader parse_trace_header(const nlohmann::json& j, const std::string& file) {
  return HeaderReader{file, j}.header();
}

// ---- writer ----

TraceWriter::TraceWriter(const std::filesystem::path& path, const TraceHeader& header)
    : path_(path), header_(header), file_(path) {
  const TraceModel& m = header_.model;
  check(!m.moe_layers.empty() && m.k >= 1 && m.num_experts >= 1 && m.num_experts <= 65536,
        "{}: trace: model has no MoE layer or an expert count outside [1, 65536]", path.string());
  check(header_.corpus.size() <= 65535, "{}: trace: more than 65535 corpus files", path.string());
  const std::string text = header_.to_json().dump();
  std::byte prefix[kPrefixBytes];
  std::memcpy(prefix, kMagic, 8);
  store<uint32_t>(prefix + 8, kVersion);
  store<uint32_t>(prefix + 12, uint32_t(header_.record_bytes()));
  store<uint64_t>(prefix + 16, uint64_t(text.size()));
  file_.write(std::span<const std::byte>(prefix, 8));
  put(prefix + 8, kPrefixBytes - 8);
  put(text.data(), text.size());
  rec_.resize(header_.record_bytes());
}

void TraceWriter::put(const void* p, size_t n) {
  crc_ = crc32_update(crc_, p, n);
  file_.write(std::span<const std::byte>(static_cast<const std::byte*>(p), n));
}

void TraceWriter::add_chunk(uint32_t sequence, uint16_t corpus, int64_t start_pos, Phase phase,
                            std::span<const int32_t> tokens, std::span<const int32_t> experts,
                            std::span<const float> weights) {
  const TraceModel& m = header_.model;
  const size_t n = tokens.size(), M = m.moe_layers.size(), k = size_t(m.k);
  check(n > 0, "{}: trace: empty chunk", path_.string());
  check(experts.size() == M * n * k && weights.size() == M * n * k,
        "{}: trace: chunk of {} tokens has {} expert ids, expected {} MoE layers x {} x k {}",
        path_.string(), n, experts.size(), M, n, k);
  check(corpus < header_.corpus.size() || header_.corpus.empty(),
        "{}: trace: corpus index {} out of range", path_.string(), corpus);
  std::byte* r = rec_.data();
  for (size_t t = 0; t < n; ++t) {
    store<uint32_t>(r, uint32_t(tokens[t]));
    store<uint32_t>(r + 4, uint32_t(start_pos + int64_t(t)));
    store<uint32_t>(r + 8, chunk_);
    store<uint32_t>(r + 12, sequence);
    store<uint16_t>(r + 16, corpus);
    store<uint8_t>(r + 18, phase == Phase::Prefill ? 0 : 1);
    store<uint8_t>(r + 19, 0);
    std::byte* ids = r + kHeadBytes;
    std::byte* ws = ids + M * k * 2;
    for (size_t l = 0; l < M; ++l) {
      for (size_t j = 0; j < k; ++j) {
        const size_t src = (l * n + t) * k + j, dst = l * k + j;
        const int32_t e = experts[src];
        check(e >= 0 && e < m.num_experts, "{}: trace: expert {} out of range", path_.string(), e);
        store<uint16_t>(ids + dst * 2, uint16_t(e));
        if (header_.f32_weights) {
          store<float>(ws + dst * 4, weights[src]);
        } else {
          store<uint16_t>(ws + dst * 2, f32_to_f16(weights[src]));
        }
      }
    }
    put(r, rec_.size());
    ++records_;
  }
  ++chunk_;
}

void TraceWriter::commit() {
  std::byte footer[kFooterBytes];
  std::memcpy(footer, kEndMagic, 8);
  store<uint64_t>(footer + 8, records_);
  store<uint32_t>(footer + 16, crc_);
  store<uint32_t>(footer + 20, 0);
  file_.write(std::span<const std::byte>(footer, kFooterBytes));
  file_.commit();
}

}  // namespace moetier
