// Checkpoint directories: config.json, then model.safetensors.index.json and its
// shards, or a single model.safetensors. Every shard header is validated
// (safetensors.cpp), cross-checked against the index, and mapped read-only.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "format/json_util.h"
#include "format/safetensors.h"

namespace moetier {

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool is_padding(const std::string& name) { return name.starts_with("__pad_"); }

// A shard name from the index must stay inside the checkpoint directory.
bool safe_relative(const std::string& s) {
  if (s.empty() || s.find('\0') != std::string::npos) return false;
  std::filesystem::path p(s);
  if (p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == ".." || part == ".") return false;
  return true;
}

struct Index {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::optional<uint64_t> total_size;
};

}  // namespace

struct CheckpointLoader {
  Checkpoint& ck;
  std::vector<std::string>& problems;
  uint64_t shard_bytes = 0;  // every tensor found in the shards, however the index maps it

  std::string at(const std::string& name) const { return (ck.dir_ / name).string(); }

  void load_config() {
    std::string why;
    auto j = read_json_file(ck.dir_ / "config.json", why);
    if (!j) {
      problems.push_back(why);
    } else if (!j->is_object()) {
      problems.push_back(
          fmt::format("{}: is {}, expected a JSON object", at("config.json"), json_kind(*j)));
    } else {
      ck.config_ = std::move(*j);
    }
  }

  std::optional<Index> read_index() {
    std::string why;
    auto j = read_json_file(ck.dir_ / kIndexName, why);
    if (!j) {
      problems.push_back(why);
      return std::nullopt;
    }
    std::string f = at(kIndexName);
    auto wm = j->is_object() ? j->find("weight_map") : j->end();
    if (!j->is_object() || wm == j->end() || !wm->is_object()) {
      problems.push_back(
          fmt::format("{}: field 'weight_map': missing (an object mapping tensor "
                      "names to shard files)",
                      f));
      return std::nullopt;
    }
    Index idx;
    for (const auto& [name, v] : wm->items()) {
      if (!v.is_string() || !safe_relative(v.get<std::string>())) {
        problems.push_back(
            fmt::format("{}: tensor '{}': shard {} is not a file name inside the "
                        "checkpoint directory",
                        f, printable(name), printable(v.dump())));
        continue;
      }
      idx.weight_map[name] = v.get<std::string>();
    }
    read_total_size(*j, f, idx);
    return idx;
  }

  void read_total_size(const nlohmann::json& j, const std::string& f, Index& idx) {
    auto md = j.find("metadata");
    if (md == j.end() || !md->is_object()) return;
    auto ts = md->find("total_size");
    if (ts == md->end() || ts->is_null()) return;
    if (ts->is_number_unsigned() || (ts->is_number_integer() && ts->get<int64_t>() >= 0)) {
      idx.total_size = ts->get<uint64_t>();
    } else if (ts->is_number_float() && ts->get<double>() >= 0 && ts->get<double>() < 1.8e19 &&
               ts->get<double>() == double(uint64_t(ts->get<double>()))) {
      idx.total_size = uint64_t(ts->get<double>());
    } else {
      problems.push_back(
          fmt::format("{}: field 'metadata.total_size': is {}, expected a non-negative integer", f,
                      printable(ts->dump())));
    }
  }

  // Parses one shard; returns its tensors and whether its header was clean.
  std::vector<TensorInfo> parse_shard(const std::string& name, bool& clean) {
    uint32_t idx = uint32_t(ck.shards_.size());
    ck.shards_.emplace_back();
    size_t before = problems.size();
    auto ts = parse_safetensors_header(ck.dir_ / name, idx, ck.shards_.back(), problems);
    clean = problems.size() == before;
    std::erase_if(ts, [](const TensorInfo& t) { return is_padding(t.name); });
    return ts;
  }

  void load_indexed(const Index& idx) {
    // file -> the tensors the index maps to it (so each shard's check is linear in its own)
    std::map<std::string, std::vector<const std::string*>> shard_names;
    for (const auto& [t, s] : idx.weight_map) shard_names[s].push_back(&t);
    bool all_clean = true;
    for (const auto& [shard, names] : shard_names) {
      const size_t count = names.size();
      std::error_code ec;
      if (!std::filesystem::exists(ck.dir_ / shard, ec)) {
        problems.push_back(
            fmt::format("{}: shard named by {} does not exist ({} tensors map to "
                        "it)",
                        at(shard), kIndexName, count));
        all_clean = false;
        continue;
      }
      bool clean = false;
      auto ts = parse_shard(shard, clean);
      all_clean &= clean;
      cross_check(shard, idx, names, ts, clean);
    }
    if (all_clean && idx.total_size) check_total(*idx.total_size);
  }

  void cross_check(const std::string& shard, const Index& idx,
                   const std::vector<const std::string*>& mapped, std::vector<TensorInfo>& ts,
                   bool clean) {
    std::string f = at(shard);
    std::unordered_set<std::string_view> here;  // views of idx's keys found in this shard
    for (auto& t : ts) {
      shard_bytes += t.nbytes();
      auto it = idx.weight_map.find(t.name);
      if (it != idx.weight_map.end()) here.insert(it->first);
      if (it == idx.weight_map.end()) {
        problems.push_back(
            fmt::format("{}: tensor '{}': present in this shard but not listed in "
                        "{}",
                        f, printable(t.name), kIndexName));
      } else if (it->second != shard) {
        problems.push_back(
            fmt::format("{}: tensor '{}': present in this shard but {} maps it to "
                        "'{}'",
                        f, printable(t.name), kIndexName, printable(it->second)));
      } else {
        ck.tensors_.push_back(std::move(t));
      }
    }
    if (!clean) return;  // entries that failed to parse were reported already
    for (const std::string* name : mapped) {
      if (!here.count(*name))
        problems.push_back(fmt::format("{}: tensor '{}': listed in {} but absent from this shard",
                                       f, printable(*name), kIndexName));
    }
  }

  void check_total(uint64_t total) {
    uint64_t sum = shard_bytes;
    if (sum != total)
      problems.push_back(
          fmt::format("{}: field 'metadata.total_size': {} does not match the sum "
                      "of tensor bytes {}",
                      at(kIndexName), total, sum));
  }

  void load_single() {
    bool clean = false;
    auto ts = parse_shard(kSingleName, clean);
    for (auto& t : ts) ck.tensors_.push_back(std::move(t));
  }

  void map_shards() {
    ck.maps_.assign(ck.shards_.size(), {});
    for (size_t i = 0; i < ck.shards_.size(); ++i) {
      const Shard& s = ck.shards_[i];
      if (s.file_size == 0) continue;  // missing or empty: nothing to map
      int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
      void* p = fd < 0 ? MAP_FAILED : ::mmap(nullptr, s.file_size, PROT_READ, MAP_PRIVATE, fd, 0);
      int err = errno;
      if (fd >= 0) ::close(fd);
      if (p == MAP_FAILED) {
        problems.push_back(fmt::format("{}: cannot map: {}", s.path.string(), std::strerror(err)));
        continue;
      }
      ck.maps_[i] = {static_cast<const std::byte*>(p), size_t(s.file_size)};
    }
  }

  void build_name_map() {
    std::sort(ck.tensors_.begin(), ck.tensors_.end(), [](const auto& a, const auto& b) {
      return a.shard != b.shard ? a.shard < b.shard : a.begin < b.begin;
    });
    for (size_t i = 0; i < ck.tensors_.size(); ++i) ck.by_name_[ck.tensors_[i].name] = i;
  }

  void load() {
    if (auto why = checkpoint_dir_problem(ck.dir_)) {
      problems.push_back(*why);
      return;  // not a checkpoint directory: nothing else to say about it
    }
    std::error_code ec;
    load_config();
    if (std::filesystem::exists(ck.dir_ / kIndexName, ec)) {
      if (auto idx = read_index()) load_indexed(*idx);
    } else if (std::filesystem::exists(ck.dir_ / kSingleName, ec)) {
      load_single();
    } else {
      problems.push_back(fmt::format("{}: no {} or {}", ck.dir_.string(), kSingleName, kIndexName));
    }
    map_shards();
    build_name_map();
  }
};

std::optional<std::string> checkpoint_dir_problem(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  const std::string d = dir.string();
  if (st.type() == fs::file_type::not_found) return fmt::format("{}: no such directory", d);
  if (ec) return fmt::format("{}: cannot access: {}", d, ec.message());
  if (fs::is_regular_file(st)) return fmt::format("{} is a file, not a checkpoint directory", d);
  if (!fs::is_directory(st)) return fmt::format("{} is not a directory", d);
  const fs::file_status cfg = fs::status(dir / "config.json", ec);
  if (cfg.type() == fs::file_type::not_found)
    return fmt::format("{}: no config.json (not a checkpoint directory)", d);
  return std::nullopt;  // an unreadable config.json is reported when it is read
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::filesystem::path& dir,
                                             std::vector<std::string>& problems) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  CheckpointLoader{*ck, problems}.load();
  return ck;
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::filesystem::path& dir) {
  std::vector<std::string> problems;
  auto ck = open(dir, problems);
  if (!problems.empty()) throw Error(problems.front());
  return ck;
}

Checkpoint::~Checkpoint() {
  for (auto m : maps_)
    if (!m.empty()) ::munmap(const_cast<std::byte*>(m.data()), m.size());
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("{}: missing tensor '{}'", dir_.string(), printable(name));
  return *t;
}

std::span<const std::byte> Checkpoint::bytes(const TensorInfo& t) const {
  check(t.shard < maps_.size() && !maps_[t.shard].empty(), "{}: tensor '{}': shard not mapped",
        dir_.string(), printable(t.name));
  uint64_t off = file_offset(t);
  check(off <= maps_[t.shard].size() && t.nbytes() <= maps_[t.shard].size() - off,
        "{}: tensor '{}': range outside its shard", dir_.string(), printable(t.name));
  return maps_[t.shard].subspan(off, t.nbytes());
}

}  // namespace moetier
