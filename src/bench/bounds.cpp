#include "bench/bounds.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/buffer.h"
#include "core/thread_pool.h"
#include "experts/index.h"
#include "format/safetensors.h"
#include "io/reader.h"
#include "model/architecture.h"
#include "model/spec.h"

namespace moetier {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best (shortest) time of `reps` calls of f, synchronized.
template <typename F>
double best_time(Backend& be, int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    be.synchronize();
    const auto t0 = Clock::now();
    f();
    be.synchronize();
    best = std::min(best, seconds(t0));
  }
  return best;
}

}  // namespace

nlohmann::json ModelBytes::to_json() const {
  return {{"total_bytes", total},
          {"expert_total_bytes", experts},
          {"core_bytes", core},
          {"expert_bytes", expert_bytes},
          {"active_bytes_per_token", active_per_token},
          {"flops_per_token", flops_per_token}};
}

nlohmann::json Bounds::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  if (device_copy) j["device_copy_bytes_per_s"] = *device_copy;
  if (host_read) j["host_read_bytes_per_s"] = *host_read;
  if (host_to_device) j["host_to_device_bytes_per_s"] = *host_to_device;
  if (storage) j["storage_bytes_per_s"] = *storage;
  if (tensor_flops) j["tensor_flops_per_s"] = *tensor_flops;
  return j;
}

ModelBytes model_bytes(const Checkpoint& ck, const ModelSpec& spec, const ExpertIndex& index) {
  ModelBytes b;
  for (const TensorInfo& t : ck.tensors()) b.total += t.nbytes();
  b.experts = index.total_bytes();
  b.core = b.total - std::min(b.total, b.experts);
  b.expert_bytes = index.expert_bytes();
  uint64_t core_read = 0;
  double core_params = 0;
  for (const TensorSpec& s : spec.arch->core_tensors(ck.config(), ck.dir() / "config.json")) {
    const TensorInfo* t = ck.find(s.name);
    if (!t) continue;
    if (s.role == TensorRole::Embedding) {
      core_read += t->shape.empty() || t->shape[0] == 0 ? 0 : t->nbytes() / uint64_t(t->shape[0]);
      continue;
    }
    core_read += t->nbytes();
    if (t->shape.size() == 2) core_params += double(t->numel());
  }
  uint64_t experts_read = 0;
  for (int64_t l : spec.moe_layers())
    for (int64_t e = 0; e < spec.experts_per_token; ++e)
      experts_read += index.record(l, e % spec.num_experts).bytes;
  b.active_per_token = core_read + experts_read;
  const double expert_params = 3.0 * double(spec.hidden_size) * double(spec.expert_intermediate);
  b.flops_per_token = 2.0 * (core_params + double(spec.moe_layers().size()) *
                                               double(spec.experts_per_token) * expert_params);
  return b;
}

double probe_device_copy(Backend& be) {
  const size_t bytes = be.is_host() ? (64u << 20) : (1u << 30);
  DeviceBuffer a = be.alloc(bytes), b = be.alloc(bytes);
  be.copy(b.data(), a.data(), bytes);  // warm up (first touch)
  const double t = best_time(be, 5, [&] { be.copy(b.data(), a.data(), bytes); });
  return 2.0 * double(bytes) / t;
}

double probe_host_read() {
  constexpr int64_t kWords = int64_t(1) << 27, kChunk = int64_t(1) << 19;  // 1 GiB, 4 MiB
  std::unique_ptr<uint64_t[]> buf(new uint64_t[size_t(kWords)]);     // [kWords], written below
  std::vector<uint64_t> sums(static_cast<size_t>(kWords / kChunk));  // [chunks]: keeps the reads
  auto each_chunk = [&](auto&& fn) {
    global_pool().parallel_for(kWords / kChunk, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) fn(c * kChunk, (c + 1) * kChunk, size_t(c));
    });
  };
  // Written by the threads that read it (first touch: the pages of each on its memory node).
  each_chunk([&](int64_t i0, int64_t i1, size_t) {
    for (int64_t i = i0; i < i1; ++i) buf[size_t(i)] = uint64_t(i) * 0x9e3779b97f4a7c15ull;
  });
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    each_chunk([&](int64_t i0, int64_t i1, size_t c) {
      uint64_t s = 0;
      for (int64_t i = i0; i < i1; ++i) s += buf[size_t(i)];
      sums[c] = s;
    });
    best = std::min(best, seconds(t0));
  }
  volatile uint64_t keep = 0;
  for (uint64_t s : sums) keep = keep + s;
  return double(kWords * 8) / best;
}

double probe_host_to_device(Backend& be) {
  const size_t bytes = be.is_host() ? (32u << 20) : (256u << 20);
  DeviceBuffer h = be.alloc_host(bytes), d = be.alloc(bytes);
  std::memset(h.data(), 1, bytes);
  be.to_device(d.data(), h.data(), bytes);
  const double t = best_time(be, 5, [&] { be.to_device(d.data(), h.data(), bytes); });
  return double(bytes) / t;
}

double probe_tensor_flops(Backend& be) {
  const int64_t dim = be.is_host() ? 1024 : 4096, n = be.is_host() ? 128 : 4096;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> bits(0x3c00, 0x3f80);  // bf16 in [2^-7, 1.0)
  std::vector<uint16_t> w(size_t(dim * dim));
  for (auto& v : w) v = uint16_t(bits(rng));
  WeightStore store;
  const MatView dw = be.weights({WeightEncoding::BF16, dim, dim, w.data(), nullptr}, store);
  std::vector<float> x(size_t(n * dim));
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  DeviceBuffer dx = be.alloc(x.size() * 4), dy = be.alloc(size_t(n * dim) * 4);
  be.to_device(dx.data(), x.data(), x.size() * 4);
  be.matmul(dw, dx.as<float>(), n, dy.as<float>());
  const double t = best_time(be, 3, [&] { be.matmul(dw, dx.as<float>(), n, dy.as<float>()); });
  return 2.0 * double(dim) * double(dim) * double(n) / t;
}

std::optional<double> probe_storage(const Checkpoint& ck, const ExpertIndex& index) {
  std::vector<ExpertKey> keys;
  for (size_t k = 0; k < index.num_keys(); ++k)
    if (index.is_moe_layer(index.layer_of(ExpertKey(k))) && index.record(ExpertKey(k)).bytes)
      keys.push_back(ExpertKey(k));
  if (keys.empty()) return std::nullopt;
  std::shuffle(keys.begin(), keys.end(), std::mt19937(11));
  std::vector<std::unique_ptr<io::DirectFile>> files;
  for (const Shard& s : ck.shards()) files.push_back(io::DirectFile::open(s.path));
  std::vector<io::ReadRequest> reqs;
  uint64_t total = 0;
  for (ExpertKey k : keys) {
    for (const Extent& x : index.record(k).extents) {
      io::ReadRequest r;
      r.file = files[x.shard].get();
      r.offset = ck.shards()[x.shard].data_offset + x.offset;
      r.length = x.length;
      reqs.push_back(r);
      total += x.length;
    }
    if (reqs.size() >= 256 || total >= (1ull << 30)) break;
  }
  std::vector<AlignedBuffer> bufs;
  for (auto& r : reqs) {
    bufs.emplace_back(r.capacity(), io::kAlign);
    r.dst = static_cast<std::byte*>(bufs.back().data());
  }
  auto reader = io::make_reader(io::ReaderKind::Auto, 16);
  const auto t0 = Clock::now();
  reader->read(reqs);
  const double t = seconds(t0);
  for (const auto& r : reqs)
    if (!r.ok()) return std::nullopt;
  return double(total) / t;
}

}  // namespace moetier
