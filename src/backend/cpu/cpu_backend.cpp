// The CPU backend: host memory, kernels/cpu on the global thread pool. Ops run
// synchronously on the calling thread (and the pool), so to_host and
// synchronize have nothing to wait for. Weights are used in place.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/units.h"
#include "io/sysinfo.h"
#include "kernels/cpu/cpu.h"

namespace moetier {
namespace {

// Scratch of one thread, reused across experts.
struct ExpertScratch {
  std::vector<float> xs, g, u;  // [m, H], [m, I], [m, I]
};

// Below this many multiply-adds per expert matmul, the experts of a batch
// run side by side (one thread each) instead of one after another with each
// matmul threaded: small experts then keep every thread busy.
constexpr int64_t kExpertParallelMax = int64_t(1) << 17;

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  uint64_t device_memory() const override { return io::mem_total_bytes().value_or(0); }

  DeviceBuffer alloc(size_t bytes) override {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    check(p != nullptr, "cpu backend: cannot allocate {}", format_bytes(bytes));
    memory_.on_alloc(p, rounded);
    return DeviceBuffer(this, p, bytes);
  }
  DeviceBuffer alloc_host(size_t bytes) override {
    const size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    void* p = std::aligned_alloc(4096, rounded);
    check(p != nullptr, "cpu backend: cannot allocate {} of host memory", format_bytes(bytes));
    return DeviceBuffer(this, p, bytes);
  }
  void release(void* p, size_t) override {
    memory_.on_release(p);
    std::free(p);
  }
  // alloc()'s buffers (host memory here: KV cache, activations, scratch; not
  // the checkpoint's mapping, which weights are used from, nor alloc_host, nor
  // the expert arena, which the expert store allocates itself on a host backend).
  std::optional<DeviceMemoryUse> memory_use() const override { return memory_.use(); }
  void reset_memory_peak() override { memory_.reset_peak(); }
  void to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void fill_zero(float* x, int64_t n) override { std::fill(x, x + n, 0.0f); }
  void synchronize() override {}

  MatView weights(const MatView& host, WeightStore&) override { return host; }
  const float* vector(std::span<const float> host, WeightStore&) override { return host.data(); }

  void embed(const MatView& table, std::span<const int32_t> tokens, float* out) override {
    for (size_t t = 0; t < tokens.size(); ++t)
      cpu::get_row(table, tokens[t], out + int64_t(t) * table.cols);
  }
  void matmul(const MatView& w, const float* x, int64_t n, float* y) override {
    cpu::matmul(w, x, n, y);
  }
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
               float* y) override {
    cpu::rmsnorm(x, w, n, dim, eps, y);
  }
  void rope(float* x, int64_t n, int64_t heads, int64_t hd, int64_t pos0,
            const float* inv_freq) override {
    cpu::rope(x, n, heads, hd, pos0, inv_freq);
  }
  void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
                 int64_t heads, int64_t kv_heads, int64_t hd, float scale, float* out) override {
    cpu::attention(q, k, v, n_q, first_pos, heads, kv_heads, hd, scale, out);
  }
  void add(float* x, const float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }
  void add_rows(float* y, const float* b, int64_t n, int64_t dim) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += b[i];
  }
  void silu_mul(float* g, const float* u, int64_t n) override { cpu::silu_mul(g, u, n); }
  void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renormalize,
                    float* probs, int32_t* ids, float* weights) override;
  void expert_batch(const ExpertBatch& b) override;

 private:
  // First member: destroyed last, after every buffer the backend owns is freed.
  DeviceMemoryCounter memory_;  // alloc()'s buffers
  void run_expert(const ExpertBatch& b, size_t i, float* ys);
  std::vector<int32_t> order_;  // [e] router scratch
  std::vector<float> ys_;       // [pairs, H] expert outputs of a batch
};

void CpuBackend::softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k,
                              bool renormalize, float* probs, int32_t* ids, float* weights) {
  check(k >= 1 && k <= e, "router: top-k {} outside [1, {}] experts", k, e);
  order_.resize(size_t(e));
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs + t * e;
    if (p != logits + t * e) std::copy_n(logits + t * e, e, p);
    cpu::softmax(p, e);
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[order_[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = order_[size_t(j)];
      ids[t * k + j] = id;
      weights[t * k + j] = renormalize ? p[id] / sum : p[id];
    }
  }
}

// Expert i of the batch: ys [m, H] = down(silu(gate x) * up x) for its m
// tokens. Each output is a function of its inputs alone (kernels/cpu), on
// whichever thread this runs.
void CpuBackend::run_expert(const ExpertBatch& b, size_t i, float* ys) {
  thread_local ExpertScratch s;
  const ExpertView& v = b.experts[i];
  const int64_t h = b.hidden, in = b.intermediate;
  const int64_t p0 = b.offsets[i], m = b.offsets[i + 1] - p0;
  s.xs.resize(size_t(m * h));
  s.g.resize(size_t(m * in));
  s.u.resize(size_t(m * in));
  for (int64_t j = 0; j < m; ++j) std::copy_n(b.x + b.tokens[size_t(p0 + j)] * h, h, &s.xs[j * h]);
  cpu::matmul(v.gate, s.xs.data(), m, s.g.data());
  cpu::matmul(v.up, s.xs.data(), m, s.u.data());
  cpu::silu_mul(s.g.data(), s.u.data(), m * in);
  cpu::matmul(v.down, s.g.data(), m, ys);
}

// The experts' outputs are computed first (side by side when they are
// small), then added to out in the batch's order (ascending expert id), so
// each token's sum has the same order whatever ran where.
void CpuBackend::expert_batch(const ExpertBatch& b) {
  check(b.offsets.size() == b.experts.size() + 1, "expert batch: {} offsets for {} experts",
        b.offsets.size(), b.experts.size());
  const int64_t h = b.hidden, pairs = b.offsets.back();
  ys_.resize(size_t(pairs * h));
  const int64_t m_max = [&] {
    int64_t m = 0;
    for (size_t i = 0; i < b.experts.size(); ++i) m = std::max(m, b.offsets[i + 1] - b.offsets[i]);
    return m;
  }();
  const bool side_by_side =
      b.experts.size() > 1 && cpu::threads() > 1 && m_max * h * b.intermediate < kExpertParallelMax;
  auto run = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) run_expert(b, size_t(i), ys_.data() + b.offsets[i] * h);
  };
  if (side_by_side)
    global_pool().parallel_for(int64_t(b.experts.size()), 1, run);
  else
    run(0, int64_t(b.experts.size()));
  for (int64_t p = 0; p < pairs; ++p) {
    const float w = b.weights[size_t(p)];
    const float* yp = ys_.data() + p * h;
    float* ot = b.out + b.tokens[size_t(p)] * h;
    for (int64_t c = 0; c < h; ++c) ot[c] += yp[c] * w;
  }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace moetier
