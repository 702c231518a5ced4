#include "format/safetensors_writer.h"

#include <algorithm>

#include "core/error.h"
#include "format/json_util.h"

namespace moetier {

namespace {

struct Placed {
  const TensorToWrite* t = nullptr;  // null: padding
  std::string name;
  uint64_t begin = 0, end = 0;
};

std::vector<Placed> place(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                          uint64_t align) {
  std::vector<Placed> out;
  uint64_t off = 0;
  int pads = 0;
  for (const auto& t : tensors) {
    check(!t.name.empty() && !t.name.starts_with("__"),
          "{}: tensor '{}': names must be non-empty and not start with '__'", path.string(),
          printable(t.name));
    uint64_t need = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      check(d >= 0 && !__builtin_mul_overflow(need, uint64_t(d), &need),
            "{}: tensor '{}': bad shape {}", path.string(), t.name, shape_str(t.shape));
    }
    check(need == t.data.size(), "{}: tensor '{}': dtype {} shape {} needs {} bytes, given {}",
          path.string(), t.name, dtype_name(t.dtype), shape_str(t.shape), need, t.data.size());
    const uint64_t a = t.align ? t.align : align;
    check((a & (a - 1)) == 0, "{}: tensor '{}': alignment {} is not a power of two", path.string(),
          t.name, a);
    if (a && off % a) {
      uint64_t gap = a - off % a;
      out.push_back({nullptr, fmt::format("__pad_{}", pads++), off, off + gap});
      off += gap;
    }
    out.push_back({&t, t.name, off, off + need});
    off += need;
  }
  return out;
}

std::string header_text(const std::filesystem::path& path, const std::vector<Placed>& placed,
                        const SafetensorsWriteOptions& opt) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!opt.metadata.empty()) h["__metadata__"] = opt.metadata;
  for (const auto& p : placed) {
    check(!h.contains(p.name), "{}: tensor '{}': written twice", path.string(), p.name);
    auto& e = h[p.name];
    e["dtype"] = p.t ? dtype_name(p.t->dtype) : "U8";
    e["shape"] = p.t ? p.t->shape : std::vector<int64_t>{int64_t(p.end - p.begin)};
    e["data_offsets"] = {p.begin, p.end};
  }
  std::string text = h.dump();
  uint64_t unit = opt.align ? opt.align : 8;
  uint64_t total = (8 + text.size() + unit - 1) / unit * unit;
  text.append(total - 8 - text.size(), ' ');
  return text;
}

}  // namespace

uint64_t write_safetensors(const std::filesystem::path& path,
                           std::span<const TensorToWrite> tensors,
                           const SafetensorsWriteOptions& opt) {
  check(opt.align == 0 || (opt.align & (opt.align - 1)) == 0,
        "{}: alignment {} is not a power of two", path.string(), opt.align);
  auto placed = place(path, tensors, opt.align);
  SafetensorsWriteOptions hopt = opt;  // the data section starts at the largest alignment
  for (const auto& t : tensors) hopt.align = std::max(hopt.align, t.align);
  std::string header = header_text(path, placed, hopt);
  unsigned char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  AtomicFile f(path);
  f.write(std::as_bytes(std::span<const unsigned char>(len, 8)));
  f.write(header);
  uint64_t real = 0;
  for (const auto& p : placed) {
    if (p.t) {
      f.write(p.t->data);
      real += p.t->data.size();
    } else {
      f.write_zeros(p.end - p.begin);
    }
  }
  f.commit();
  return real;
}

void write_safetensors_index(const std::filesystem::path& path,
                             const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  nlohmann::ordered_json j;
  j["metadata"]["total_size"] = total_size;
  j["weight_map"] = weight_map;
  write_file_atomic(path, j.dump(2) + "\n");
}

void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                      const std::vector<std::vector<TensorToWrite>>& shards,
                      const SafetensorsWriteOptions& opt) {
  std::error_code ec;
  check(!std::filesystem::exists(dir, ec), "{}: already exists", dir.string());
  check(!shards.empty(), "{}: a checkpoint needs at least one shard", dir.string());
  AtomicDir out(dir);
  write_file_atomic(out.path() / "config.json", config.dump(2) + "\n");
  if (shards.size() == 1) {
    write_safetensors(out.path() / "model.safetensors", shards[0], opt);
  } else {
    std::map<std::string, std::string> weight_map;
    uint64_t total = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      total += write_safetensors(out.path() / name, shards[i], opt);
      for (const auto& t : shards[i]) weight_map[t.name] = name;
    }
    write_safetensors_index(out.path() / "model.safetensors.index.json", weight_map, total);
  }
  out.commit();
}

}  // namespace moetier
