// Safetensors header parsing and validation (one shard). The directory-level
// loader (index, shard cross-checks, mmap) is in checkpoint.cpp.
#include "format/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include "format/header_json.h"
#include "format/json_util.h"

namespace moetier {

namespace {

using json = nlohmann::json;
constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MiB, as the safetensors crate

struct HeaderCtx {
  std::string file;  // for messages
  uint32_t shard = 0;
  uint64_t data_size = 0;  // bytes after the header
  std::vector<std::string>& problems;

  template <typename... Args>
  void add(fmt::format_string<Args...> f, Args&&... args) {
    problems.push_back(file + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
};

// Reads the 8-byte length and the header text; fills shard sizes. False on a problem.
bool read_header_text(const std::filesystem::path& path, Shard& shard, std::string& text,
                      std::vector<std::string>& problems) {
  std::string f = path.string();
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in || !std::filesystem::is_regular_file(path, ec)) {
    const int err = errno;  // (from the open, when it failed)
    problems.push_back(fmt::format("{}: cannot open: {}", f,
                                   !std::filesystem::exists(path, ec) ? "no such file"
                                   : in                               ? "not a regular file"
                                                                      : std::strerror(err)));
    return false;
  }
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    problems.push_back(fmt::format("{}: cannot stat: {}", f, ec.message()));
    return false;
  }
  shard.file_size = size;
  if (size < 8) {
    problems.push_back(fmt::format(
        "{}: file is {} bytes, too short for a safetensors header (needs at least 8)", f, size));
    return false;
  }
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8) {
    problems.push_back(fmt::format(
        "{}: header length {} is larger than the file ({} bytes after the 8-byte length)", f, n,
        size - 8));
    return false;
  }
  if (n > kMaxHeader) {
    problems.push_back(
        fmt::format("{}: header length {} exceeds the limit of {} bytes", f, n, kMaxHeader));
    return false;
  }
  shard.data_offset = 8 + n;
  text.assign(n, '\0');
  if (n && !in.read(text.data(), std::streamsize(n))) {
    problems.push_back(fmt::format("{}: cannot read the {}-byte header", f, n));
    return false;
  }
  return true;
}

// Parses the header JSON (format/header_json.h), reporting a duplicated
// top-level key (json::parse would keep the last one silently).
std::optional<detail::HeaderJson> parse_header_json(const std::string& text, HeaderCtx& c) {
  detail::HeaderJson h;
  if (!detail::parse_header_entries(text, h)) {
    auto at = h.error.find("parse error");
    c.add("header is not valid JSON: {}",
          printable(at == std::string::npos ? h.error : h.error.substr(at)));
    return std::nullopt;
  }
  if (!h.is_object) {
    c.add("header is {}, expected a JSON object", json_kind(h.other));
    return std::nullopt;
  }
  if (!h.duplicate.empty())
    c.add("tensor '{}': listed twice in the header", printable(h.duplicate));
  return h;
}

void check_metadata(const json& v, HeaderCtx& c) {
  if (!v.is_object()) {
    c.add("field '__metadata__': is {}, expected an object of strings", json_kind(v));
    return;
  }
  for (const auto& [k, x] : v.items()) {
    if (!x.is_string())
      c.add("field '__metadata__.{}': is {}, expected a string", printable(k), json_kind(x));
  }
}

bool parse_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

// dtype and shape of one entry; false after reporting a problem.
bool parse_dtype_shape(const std::string& name, const json& v, TensorInfo& t, HeaderCtx& c) {
  auto d = v.find("dtype");
  if (d == v.end() || !d->is_string()) {
    c.add("tensor '{}': missing field 'dtype' (a string)", name);
    return false;
  }
  auto dt = dtype_from_name(d->get<std::string>());
  if (!dt) {
    c.add(
        "tensor '{}': unknown dtype '{}' (supported: F32, F16, BF16, F8_E4M3, F8_E8M0, U8, "
        "I8, I32, I64)",
        name, printable(d->get<std::string>()));
    return false;
  }
  t.dtype = *dt;
  auto s = v.find("shape");
  if (s == v.end() || !s->is_array() || s->size() > 16) {
    c.add("tensor '{}': missing field 'shape' (an array of at most 16 sizes)", name);
    return false;
  }
  for (const auto& x : *s) {
    uint64_t n;
    if (!parse_u64(x, n) || n > uint64_t(INT64_MAX)) {
      c.add("tensor '{}': shape {} has a dimension that is not a non-negative integer", name,
            printable(s->dump()));
      return false;
    }
    t.shape.push_back(int64_t(n));
  }
  return true;
}

std::optional<TensorInfo> parse_entry(const std::string& raw_name, const json& v, HeaderCtx& c) {
  std::string name = printable(raw_name);
  if (!v.is_object()) {
    c.add("tensor '{}': entry is {}, expected an object", name, json_kind(v));
    return std::nullopt;
  }
  TensorInfo t;
  t.name = raw_name;
  t.shard = c.shard;
  if (!parse_dtype_shape(name, v, t, c)) return std::nullopt;
  auto o = v.find("data_offsets");
  if (o == v.end() || !o->is_array() || o->size() != 2 || !parse_u64((*o)[0], t.begin) ||
      !parse_u64((*o)[1], t.end) || t.begin > t.end) {
    c.add("tensor '{}': field 'data_offsets' must be [begin, end] with 0 <= begin <= end", name);
    return std::nullopt;
  }
  uint64_t need = dtype_size(t.dtype);
  bool overflow = false;
  for (int64_t d : t.shape) overflow |= __builtin_mul_overflow(need, uint64_t(d), &need);
  if (overflow || need != t.end - t.begin) {
    c.add("tensor '{}': dtype {} shape {} needs {} bytes, data_offsets [{}, {}] hold {}", name,
          dtype_name(t.dtype), shape_str(t.shape),
          overflow ? std::string("more than 2^64") : std::to_string(need), t.begin, t.end,
          t.end - t.begin);
    return std::nullopt;
  }
  if (t.end > c.data_size) {
    c.add(
        "tensor '{}': data_offsets [{}, {}] run past the end of the file (data section is {} "
        "bytes)",
        name, t.begin, t.end, c.data_size);
    return std::nullopt;
  }
  if (raw_name.starts_with("__pad_") && (t.dtype != DType::U8 || t.shape.size() != 1)) {
    c.add("tensor '{}': padding tensors (named __pad_*) must be 1-D U8", name);
    return std::nullopt;
  }
  return t;
}

// Sorted by offset, the tensors must tile the data section: no overlap, no hole.
void check_coverage(std::vector<const TensorInfo*> ts, HeaderCtx& c) {
  std::sort(ts.begin(), ts.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const TensorInfo* last = nullptr;
  for (const TensorInfo* t : ts) {
    if (t->begin < cursor && t->nbytes() > 0) {
      c.add("tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", printable(t->name),
            t->begin, t->end, printable(last->name), last->begin, last->end);
    } else if (t->begin > cursor) {
      c.add(
          "hole of {} bytes in the data section before tensor '{}' (bytes [{}, {}] belong to "
          "no tensor)",
          t->begin - cursor, printable(t->name), cursor, t->begin);
    }
    if (t->end > cursor || !last) {
      cursor = std::max(cursor, t->end);
      last = t;
    }
  }
  if (cursor != c.data_size) {
    c.add("{} bytes after the last tensor{} belong to no tensor (data section is {} bytes)",
          c.data_size - cursor, last ? fmt::format(" '{}'", printable(last->name)) : "",
          c.data_size);
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

std::vector<TensorInfo> parse_header(const std::filesystem::path& file, uint32_t shard_index,
                                     Shard& shard, std::vector<std::string>& problems) {
  shard.path = file;
  shard.file_size = 0;
  shard.data_offset = 0;
  std::string text;
  std::vector<TensorInfo> out;
  if (!read_header_text(file, shard, text, problems)) return out;
  HeaderCtx c{file.string(), shard_index, shard.file_size - shard.data_offset, problems};
  auto h = parse_header_json(text, c);
  if (!h) return out;
  size_t before = problems.size();
  out.reserve(h->entries.size());
  for (const auto& [name, v] : h->entries) {
    if (name == "__metadata__") {
      check_metadata(v, c);
    } else if (auto t = parse_entry(name, v, c)) {
      out.push_back(std::move(*t));
    }
  }
  // Coverage is only meaningful when every entry parsed.
  if (problems.size() == before) {
    std::vector<const TensorInfo*> ptrs;
    for (const auto& t : out) ptrs.push_back(&t);
    check_coverage(std::move(ptrs), c);
  }
  return out;
}

}  // namespace

std::vector<TensorInfo> parse_safetensors_header(const std::filesystem::path& file,
                                                 uint32_t shard_index, Shard& shard,
                                                 std::vector<std::string>& problems) {
  try {
    return parse_header(file, shard_index, shard, problems);
  } catch (const std::exception& e) {  // e.g. bad_alloc: still one line, never a throw
    problems.push_back(fmt::format("{}: cannot parse: {}", file.string(), printable(e.what())));
    return {};
  }
}

}  // namespace moetier
