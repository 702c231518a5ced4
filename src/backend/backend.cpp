#include "backend/backend.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moetier {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (owner_ && p_) owner_->release(p_, bytes_);
  owner_ = nullptr;
  p_ = nullptr;
  bytes_ = 0;
}

void DeviceMemoryCounter::on_alloc(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[p] = bytes;
  use_.now += bytes;
  use_.peak = std::max(use_.peak, use_.now);
}

bool DeviceMemoryCounter::on_release(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(p);
  if (it == live_.end()) return false;
  use_.now -= it->second;
  live_.erase(it);
  return true;
}

DeviceMemoryUse DeviceMemoryCounter::use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return use_;
}

void DeviceMemoryCounter::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  use_.peak = use_.now;
}

uint64_t WeightStore::bytes() const {
  uint64_t n = 0;
  for (const auto& b : buffers) n += b.bytes();
  return n;
}

void Backend::route_topk(const MatView& router, const float* x, int64_t n, int64_t k,
                         bool renormalize, float* probs, int32_t* ids, float* weights) {
  matmul(router, x, n, probs);  // logits [n, e]
  softmax_topk(probs, n, router.rows, k, renormalize, probs, ids, weights);
}

void Backend::route_moe_resident(const MatView& router, int table, const float* x, int64_t k,
                                 bool renormalize, float* probs, int32_t* ids, float* weights,
                                 int64_t hidden, int64_t intermediate, float* out) {
  route_topk(router, x, 1, k, renormalize, probs, ids, weights);
  moe_resident(table, ids, weights, k, x, hidden, intermediate, out);
}

void Backend::route_moe_resident_add(const MatView& router, int table, float* x, int64_t k,
                                     bool renormalize, float* probs, int32_t* ids, float* weights,
                                     int64_t hidden, int64_t intermediate, const NormAdd& f) {
  rmsnorm(x, f.norm, 1, hidden, f.eps, f.xn);
  route_moe_resident(router, table, f.xn, k, renormalize, probs, ids, weights, hidden, intermediate,
                     f.tmp);
  add(x, f.tmp, hidden);
}

void Backend::argmax(const float* x, int64_t n, int32_t* out) {
  check(n > 0, "argmax of no values");
  std::vector<float> h(static_cast<size_t>(n));
  to_host(h.data(), x, h.size() * sizeof(float));
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (h[size_t(i)] > h[size_t(best)]) best = int32_t(i);
  to_device(out, &best, sizeof best);
}

std::unique_ptr<Backend> make_backend(const std::string& spec) {
  if (spec == "cpu") return make_cpu_backend();
  if (spec == "cuda") return make_cuda_backend(0);
  if (spec.starts_with("cuda:") && spec.size() > 5) {
    char* end = nullptr;
    const long d = std::strtol(spec.c_str() + 5, &end, 10);
    if (end && *end == 0 && d >= 0) return make_cuda_backend(int(d));
  }
  fail("--backend: '{}' is not cpu, cuda or cuda:N", spec);
}

}  // namespace moetier
