#include "convert/output.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <map>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/check.h"

namespace moetier {
namespace fs = std::filesystem;

namespace {

constexpr const char* kMarker = ".moetier-writer";  // PID of the writer, inside OUT.tmp-*

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  check(bool(in), "{}: cannot read", p.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Removes OUT.tmp-* directories whose writer (marker PID) is gone.
void sweep_stale(const fs::path& out) {
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const std::string prefix = out.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(prefix) || !e.is_directory(ec)) continue;
    std::ifstream in(e.path() / kMarker);
    long pid = 0;
    if (!(in >> pid) || pid <= 0) continue;  // not ours, or not yet marked: leave it
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // writer alive (or unknown)
    fs::remove_all(e.path(), ec);
  }
}

// MOETIER_CONVERT_FAULT=KIND:N (error, sigint, sigkill).
void parse_fault(std::string& kind, int64_t& at) {
  const char* env = std::getenv("MOETIER_CONVERT_FAULT");
  if (!env || !*env) return;
  std::string_view s(env);
  const size_t colon = s.find(':');
  int64_t n = -1;
  if (colon != std::string_view::npos) {
    auto [p, err] = std::from_chars(s.data() + colon + 1, s.data() + s.size(), n);
    if (err != std::errc() || p != s.data() + s.size()) n = -1;
  }
  kind = std::string(s.substr(0, colon));
  check(n >= 0 && (kind == "error" || kind == "sigint" || kind == "sigkill"),
        "MOETIER_CONVERT_FAULT: '{}' is not error:N, sigint:N or sigkill:N", s);
  at = n;
}

// Side files worth carrying over: not config/weights/index, not references of
// the source's outputs, not hidden.
bool is_side_file(const fs::directory_entry& e) {
  const std::string n = e.path().filename().string();
  std::error_code ec;
  return e.is_regular_file(ec) && n != "config.json" && n != "model.safetensors.index.json" &&
         !n.ends_with(".safetensors") && !n.starts_with("reference") && !n.starts_with(".");
}

}  // namespace

namespace {
std::optional<int64_t> take_number(std::string_view& s) {
  int64_t v = 0;
  auto [p, err] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (err != std::errc() || p == s.data() || p == s.data() + s.size() || *p != '.' || v < 0)
    return std::nullopt;
  s.remove_prefix(size_t(p - s.data()) + 1);
  return v;
}
}  // namespace

std::optional<LayerTensorName> parse_layer_tensor(std::string_view name,
                                                  const MoeTensorNames& names) {
  if (!name.starts_with(names.layers)) return std::nullopt;
  std::string_view s = name.substr(names.layers.size());
  auto layer = take_number(s);
  if (!layer) return std::nullopt;
  LayerTensorName n;
  n.layer = *layer;
  n.rest = std::string(s);
  if (s.starts_with(names.experts)) {
    s.remove_prefix(names.experts.size());
    if (auto e = take_number(s)) {
      n.expert = *e;
      n.part = std::string(s);
    }
  }
  return n;
}

std::vector<const TensorInfo*> tensors_in_file_order(const Checkpoint& ck) {
  std::vector<const TensorInfo*> order;
  for (const auto& t : ck.tensors()) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->shard, a->begin) < std::tie(b->shard, b->begin);
  });
  return order;
}

bool is_expert_rest(const std::string& rest, const MoeTensorNames& names) {
  return rest.starts_with(names.experts);
}

bool is_stacked_rest(const std::string& rest, const MoeTensorNames& names) {
  return rest == names.experts + names.stacked_gate_up ||
         rest == names.experts + names.stacked_down;
}

std::map<int64_t, uint32_t> record_shards(const std::vector<const TensorInfo*>& order,
                                          int64_t num_experts, const MoeTensorNames& names) {
  std::map<int64_t, uint32_t> out;
  for (const TensorInfo* t : order) {
    const auto n = parse_layer_tensor(t->name, names);
    if (!n || !is_expert_rest(n->rest, names)) continue;
    if (n->expert >= 0) {
      out.emplace(record_key(n->layer, n->expert), t->shard);
    } else if (is_stacked_rest(n->rest, names)) {
      for (int64_t e = 0; e < num_experts; ++e) out.emplace(record_key(n->layer, e), t->shard);
    }
  }
  return out;
}

void require_valid(const fs::path& dir) {
  const auto problems = check_checkpoint(dir);
  if (problems.empty()) return;
  fail("{}{}", problems.front(),
       problems.size() > 1 ? fmt::format(" (and {} more problems; see 'moetier check {}')",
                                         problems.size() - 1, dir.string())
                           : std::string());
}

std::string shard_file_name(const Checkpoint& src, uint32_t shard) {
  return src.shards().at(shard).path.filename().string();
}

nlohmann::json derived_config(const nlohmann::json& src, const nlohmann::json& patch) {
  nlohmann::json c = src;
  if (!c.contains("moetier") || !c["moetier"].is_object()) c["moetier"] = nlohmann::json::object();
  for (const auto& [k, v] : patch.items()) c["moetier"][k] = v;
  return c;
}

DerivedCheckpointWriter::DerivedCheckpointWriter(const Checkpoint& src, fs::path out,
                                                 ConvertControl control)
    : src_(src), out_(std::move(out)), control_(control) {
  check(!out_.empty() && out_.filename() != "." && out_.filename() != "..",
        "-o: '{}' is not a directory name", out_.string());
  std::error_code ec;
  check(!fs::exists(out_, ec), "{}: already exists (choose a new output directory)", out_.string());
  const fs::path parent = out_.parent_path().empty() ? fs::path(".") : out_.parent_path();
  check(fs::is_directory(parent, ec), "{}: parent directory {} does not exist", out_.string(),
        parent.string());
  parse_fault(fault_kind_, fault_at_);
  sweep_stale(out_);
  dir_.emplace(out_);
  write_file_atomic(tmp() / kMarker, fmt::format("{}\n", ::getpid()));
}

DerivedCheckpointWriter::~DerivedCheckpointWriter() = default;

void DerivedCheckpointWriter::tick() {
  ++ticks_;
  if (control_.cancel && control_.cancel->load())
    fail("{}: interrupted; no output written", out_.string());
  if (control_.fail_after >= 0 && ticks_ >= control_.fail_after)
    fail("{}: injected fault after {} tensors", out_.string(), ticks_);
  if (fault_at_ < 0 || ticks_ < fault_at_) return;
  if (fault_kind_ == "sigint") {
    ::raise(SIGINT);  // the InterruptGuard turns it into a cancel, polled just below
    if (control_.cancel && control_.cancel->load())
      fail("{}: interrupted; no output written", out_.string());
    return;
  }
  if (fault_kind_ == "sigkill") ::raise(SIGKILL);
  fail("{}: injected fault after {} tensors (MOETIER_CONVERT_FAULT)", out_.string(), ticks_);
}

uint64_t DerivedCheckpointWriter::write_shard(uint32_t shard, std::vector<OutTensor> tensors) {
  // Records stay together, in the order of their first tensor.
  std::map<int64_t, size_t> first;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].record >= 0) first.emplace(tensors[i].record, i);
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto rank = [&](size_t i) { return tensors[i].record >= 0 ? first[tensors[i].record] : i; };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rank(a) < rank(b); });
  std::vector<TensorToWrite> out;
  out.reserve(tensors.size());
  int64_t prev = -2;
  for (size_t i : order) {
    TensorToWrite t = tensors[i].t;
    if (tensors[i].record >= 0)
      t.align = tensors[i].record == prev ? kPackedAlign : kRecordAlign;
    else
      t.align = t.data.size() >= kRecordAlign ? kRecordAlign : kPackedAlign;
    prev = tensors[i].record;
    out.push_back(std::move(t));
  }
  const std::string name = shard_file_name(src_, shard);
  SafetensorsWriteOptions opt;
  opt.align = kRecordAlign;
  opt.metadata["format"] = "pt";
  opt.metadata["producer"] = "moetier";
  const uint64_t bytes = write_safetensors(tmp() / name, out, opt);
  for (const auto& t : out) weight_map_[t.name] = name;
  total_bytes_ += bytes;
  return bytes;
}

void DerivedCheckpointWriter::commit(const nlohmann::json& config) {
  if (control_.cancel && control_.cancel->load())
    fail("{}: interrupted; no output written", out_.string());
  write_file_atomic(tmp() / "config.json", config.dump(2) + "\n");
  std::error_code ec;
  if (fs::exists(src_.dir() / "model.safetensors.index.json", ec))
    write_safetensors_index(tmp() / "model.safetensors.index.json", weight_map_, total_bytes_);
  for (const auto& e : fs::directory_iterator(src_.dir()))
    if (is_side_file(e)) write_file_atomic(tmp() / e.path().filename(), slurp(e.path()));
  fs::remove(tmp() / kMarker);
  const mode_t mask = ::umask(0);  // mkdtemp made it 0700; give OUT the usual mode
  ::umask(mask);
  ::chmod(tmp().c_str(), 0777 & ~mask);
  dir_->commit();
}

namespace {
std::atomic<bool> g_interrupted{false};
volatile sig_atomic_t g_signal = 0;
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};

extern "C" void on_interrupt(int sig) {
  g_signal = sig;
  g_interrupted.store(true);
}
}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted.store(false);
  g_signal = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
}

InterruptGuard::~InterruptGuard() {
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
}

const std::atomic<bool>* InterruptGuard::flag() const { return &g_interrupted; }
int InterruptGuard::signal() const { return g_signal; }

}  // namespace moetier
