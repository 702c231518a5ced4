// read_trace: validates a trace file completely before anyone uses it.
#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "experts/trace.h"

namespace moetier {

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'T', 'R', 'A', 'C', 'E'};
constexpr char kEndMagic[8] = {'M', 'O', 'E', 'T', 'E', 'N', 'D', '1'};
constexpr uint64_t kPrefixBytes = 24, kFooterBytes = 24, kHeadBytes = 20;
constexpr uint64_t kMaxHeaderBytes = 64ull << 20;

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

struct Reader {
  std::string name;
  std::ifstream in;
  void read(char* dst, uint64_t n, uint64_t at) {
    in.seekg(std::streamoff(at));
    in.read(dst, std::streamsize(n));
    check(bool(in), "{}: read of {} bytes at offset {} failed", name, n, at);
  }
};

// Checks and stores the records of one block.
struct RecordParser {
  const std::string& name;
  Trace& t;
  bool weights = false;
  std::vector<uint64_t> seen;  // [num_experts] stamp per (token, layer)
  uint64_t stamp = 0;

  void parse(const char* r, size_t index);
};

void RecordParser::parse(const char* r, size_t i) {
  const TraceModel& m = t.header.model;
  const size_t M = m.moe_layers.size(), k = size_t(m.k);
  const uint32_t chunk = load<uint32_t>(r + 8), seq = load<uint32_t>(r + 12),
                 pos = load<uint32_t>(r + 4);
  const uint16_t corpus = load<uint16_t>(r + 16);
  const uint8_t phase = load<uint8_t>(r + 18);
  check(phase <= 1, "{}: record {}: phase {} is neither prefill (0) nor decode (1)", name, i,
        phase);
  check(t.header.corpus.empty() || corpus < t.header.corpus.size(),
        "{}: record {}: corpus index {} out of range ({} corpus files)", name, i, corpus,
        t.header.corpus.size());
  if (i > 0) {
    const uint32_t pc = t.chunk.back();
    check(chunk >= pc, "{}: record {}: chunk {} after chunk {} (records out of order)", name, i,
          chunk, pc);
    if (chunk == pc) {
      check(uint8_t(t.phase.back() == Phase::Decode) == phase && t.sequence.back() == seq &&
                t.position.back() + 1 == pos,
            "{}: record {}: chunk {} mixes phases, sequences or non-consecutive positions", name, i,
            chunk);
    }
  }
  t.token.push_back(load<uint32_t>(r));
  t.position.push_back(pos);
  t.chunk.push_back(chunk);
  t.sequence.push_back(seq);
  t.corpus.push_back(corpus);
  t.phase.push_back(phase == 0 ? Phase::Prefill : Phase::Decode);
  const char* ids = r + kHeadBytes;
  for (size_t l = 0; l < M; ++l) {
    ++stamp;
    for (size_t j = 0; j < k; ++j) {
      const uint16_t e = load<uint16_t>(ids + (l * k + j) * 2);
      check(e < m.num_experts, "{}: record {} layer {}: expert {} out of range ({} experts)", name,
            i, m.moe_layers[l], e, m.num_experts);
      check(seen[e] != stamp, "{}: record {} layer {}: expert {} selected twice", name, i,
            m.moe_layers[l], e);
      seen[e] = stamp;
      t.experts.push_back(e);
    }
  }
  if (!weights) return;
  const char* ws = ids + M * k * 2;
  for (size_t j = 0; j < M * k; ++j) {
    t.weights.push_back(t.header.f32_weights ? load<float>(ws + j * 4)
                                             : f16_to_f32(load<uint16_t>(ws + j * 2)));
  }
}

// Magic, version, sizes; returns the header JSON text and fills record_bytes.
std::string read_prefix(Reader& rd, uint64_t size, uint32_t& record_bytes) {
  const std::string& f = rd.name;
  char prefix[kPrefixBytes] = {};
  const uint64_t got = std::min<uint64_t>(size, kPrefixBytes);
  if (got) rd.read(prefix, got, 0);
  const bool magic_ok = std::memcmp(prefix, kMagic, std::min<uint64_t>(got, 8)) == 0;
  check(magic_ok && got > 0, "{}: not a moetier trace (no MOETRACE magic)", f);
  check(size >= kPrefixBytes + kFooterBytes,
        "{}: truncated trace: {} bytes, a trace has at least {}", f, size,
        kPrefixBytes + kFooterBytes);
  const uint32_t version = load<uint32_t>(prefix + 8);
  check(version == 1, "{}: trace version {} is not supported (this moetier reads version 1)", f,
        version);
  record_bytes = load<uint32_t>(prefix + 12);
  const uint64_t hb = load<uint64_t>(prefix + 16);
  check(hb <= kMaxHeaderBytes, "{}: trace header of {} bytes is implausible (corrupt file)", f, hb);
  check(hb <= size - kPrefixBytes - kFooterBytes,
        "{}: truncated trace: the header of {} bytes runs past the end of the file ({} bytes)", f,
        hb, size);
  std::string text(hb, '\0');
  rd.read(text.data(), hb, kPrefixBytes);
  return text;
}

}  // namespace

Trace read_trace(const std::filesystem::path& path, bool with_weights) {
  Reader rd{path.string(), std::ifstream(path, std::ios::binary)};
  const std::string& f = rd.name;
  std::error_code ec;
  check(std::filesystem::is_regular_file(path, ec), "{}: cannot open trace (not a file)", f);
  check(bool(rd.in), "{}: cannot open trace", f);
  const uint64_t size = std::filesystem::file_size(path, ec);
  check(!ec, "{}: cannot read the file size: {}", f, ec.message());
  uint32_t record_bytes = 0;
  const std::string text = read_prefix(rd, size, record_bytes);
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded(), "{}: trace header is not valid JSON", f);
  Trace t;
  t.file = path;
  t.header = parse_trace_header(j, f);
  check(record_bytes == t.header.record_bytes(),
        "{}: record size {} does not match the header ({} MoE layers x k {} -> {} bytes)", f,
        record_bytes, t.header.model.moe_layers.size(), t.header.model.k, t.header.record_bytes());
  const uint64_t body = size - kPrefixBytes - kFooterBytes - text.size();
  char footer[kFooterBytes];
  rd.read(footer, kFooterBytes, size - kFooterBytes);
  check(std::memcmp(footer, kEndMagic, 8) == 0,
        "{}: truncated trace: no end marker (the file was cut or its writer did not finish)", f);
  const uint64_t n = load<uint64_t>(footer + 8);
  check(body % record_bytes == 0 && body / record_bytes == n,
        "{}: truncated or corrupt trace: the footer counts {} records of {} bytes, the file holds "
        "{} bytes of records",
        f, n, record_bytes, body);

  char pre[kPrefixBytes];
  rd.read(pre, kPrefixBytes, 0);
  uint32_t crc = crc32_update(0, pre + 8, kPrefixBytes - 8);
  crc = crc32_update(crc, text.data(), text.size());
  const size_t per = size_t(t.header.model.moe_layers.size() * size_t(t.header.model.k));
  t.experts.reserve(n * per);
  if (with_weights) t.weights.reserve(n * per);
  RecordParser parser{f, t, with_weights,
                      std::vector<uint64_t>(size_t(t.header.model.num_experts), 0)};
  std::vector<char> block;
  const uint64_t per_block = std::max<uint64_t>(1, (4u << 20) / record_bytes);
  rd.in.seekg(std::streamoff(kPrefixBytes + text.size()));
  for (uint64_t i = 0; i < n; i += per_block) {
    const uint64_t m = std::min(per_block, n - i);
    block.resize(m * record_bytes);
    rd.in.read(block.data(), std::streamsize(block.size()));
    check(bool(rd.in), "{}: read of records {}..{} failed", f, i, i + m);
    crc = crc32_update(crc, block.data(), block.size());
    for (uint64_t r = 0; r < m; ++r) parser.parse(block.data() + r * record_bytes, size_t(i + r));
  }
  check(crc == load<uint32_t>(footer + 16),
        "{}: corrupt trace: checksum mismatch (crc32 {:08x}, footer says {:08x})", f, crc,
        load<uint32_t>(footer + 16));
  return t;
}

}  // namespace moetier
