// The CPU backend: host memory, kernels/cpu on the global thread pool. Ops run
// synchronously on the calling thread (and the pool), so to_host and
// synchronize have nothing to wait for. Weights are used in place.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/atomic_file.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/units.h"
#include "io/sysinfo.h"
#include "kernels/cpu/cpu.h"

namespace moetier {
namespace {

// MOETIER_CPU_TIMING=FILE (a measurement aid): the wall time of each op,
// summed per op and shape, written to FILE when the backend goes (the CPU
// counterpart of MOETIER_CUDA_TIMING; ops run synchronously, so wall time is
// the op's time, threads and all).
class OpTimes {
 public:
  OpTimes() {
    if (const char* p = std::getenv("MOETIER_CPU_TIMING")) path_ = p;
  }
  ~OpTimes() {
    if (path_.empty()) return;
    std::string out;
    for (const auto& [name, t] : times_)
      out += fmt::format("{:>12.1f} us {:>8} x {:>9.2f} us  {}\n", 1e6 * t.first, t.second,
                         1e6 * t.first / double(t.second), name);
    try {
      write_file_atomic(path_, out);
    } catch (const std::exception&) {  // a measurement aid never takes the run down
    }
  }
  bool on() const { return !path_.empty(); }
  void add(const std::string& name, double s) {
    auto& t = times_[name];
    t.first += s, ++t.second;
  }

 private:
  std::string path_;
  std::map<std::string, std::pair<double, int64_t>> times_;  // name -> (seconds, calls)
};

// Times the enclosing op when timing is on; name() builds its key only then.
template <class Name>
class OpScope {
 public:
  OpScope(OpTimes& t, Name name) : t_(t), name_(std::move(name)) {
    if (t_.on()) t0_ = std::chrono::steady_clock::now();
  }
  ~OpScope() {
    if (t_.on())
      t_.add(name_(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpTimes& t_;
  Name name_;
  std::chrono::steady_clock::time_point t0_;
};

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
  void copy(void* dst, const void* src, size_t n) override {
    OpScope op(times_, [] { return std::string("copy"); });
    std::memmove(dst, src, n);
  }
  void fill_zero(float* x, int64_t n) override { std::fill(x, x + n, 0.0f); }
  void synchronize() override {}

  MatView weights(const MatView& host, WeightStore&) override { return host; }
  const float* vector(std::span<const float> host, WeightStore&) override { return host.data(); }

  void embed(const MatView& table, std::span<const int32_t> tokens, float* out) override {
    OpScope op(times_, [] { return std::string("embed"); });
    for (size_t t = 0; t < tokens.size(); ++t)
      cpu::get_row(table, tokens[t], out + int64_t(t) * table.cols);
  }
  void matmul(const MatView& w, const float* x, int64_t n, float* y) override {
    OpScope op(times_, [&] {
      return fmt::format("matmul {} [{}, {}] n {}", encoding_name(w.enc), w.rows, w.cols, n);
    });
    cpu::matmul(w, x, n, y);
  }
  void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps,
               float* y) override {
    OpScope op(times_, [&] { return fmt::format("rmsnorm n {}", n); });
    cpu::rmsnorm(x, w, n, dim, eps, y);
  }
  void rope(float* x, int64_t n, int64_t heads, int64_t hd, int64_t pos0,
            const float* inv_freq) override {
    OpScope op(times_, [&] { return fmt::format("rope n {}", n); });
    cpu::rope(x, n, heads, hd, pos0, inv_freq);
  }
  void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
                 int64_t heads, int64_t kv_heads, int64_t hd, float scale, float* out) override {
    OpScope op(times_, [&] { return fmt::format("attention n {}", n_q); });
    cpu::attention(q, k, v, n_q, first_pos, heads, kv_heads, hd, scale, out);
  }
  void add(float* x, const float* y, int64_t n) override {
    OpScope op(times_, [] { return std::string("add"); });
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }
  void add_rows(float* y, const float* b, int64_t n, int64_t dim) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += b[i];
  }
  void silu_mul(float* g, const float* u, int64_t n) override { cpu::silu_mul(g, u, n); }
  // One parallel run for the q/k/v projections (one wait instead of three).
  void matmul_multi(std::span<const MatView> ws, const float* x, int64_t n,
                    std::span<float* const> ys) override {
    OpScope op(times_, [&] { return fmt::format("matmul_multi {} n {}", ws.size(), n); });
    check(ws.size() == ys.size(), "matmul_multi: {} matrices for {} outputs", ws.size(), ys.size());
    multi_.clear();
    for (size_t i = 0; i < ws.size(); ++i) {
      check(ws[i].cols == ws[0].cols, "matmul_multi: matrix {} has {} columns, matrix 0 {}", i,
            ws[i].cols, ws[0].cols);
      multi_.push_back({ws[i], x, n, ys[i]});
    }
    cpu::matmul_many(multi_);
  }
  void softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renormalize,
                    float* probs, int32_t* ids, float* weights) override;
  void expert_batch(const ExpertBatch& b) override;

 private:
  // First member: destroyed last, after every buffer the backend owns is freed.
  DeviceMemoryCounter memory_;          // alloc()'s buffers
  OpTimes times_;                       // MOETIER_CPU_TIMING
  std::vector<int32_t> order_;          // [e] router scratch
  std::vector<float> xs_, g_, u_, ys_;  // [pairs, H], [pairs, I] x2, [pairs, H]: a batch's
  std::vector<cpu::GluTask> glu_;       // [experts]
  std::vector<cpu::MatmulTask> down_;   // [experts]
  std::vector<cpu::MatmulTask> multi_;  // [matrices] of matmul_multi
};

void CpuBackend::softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k,
                              bool renormalize, float* probs, int32_t* ids, float* weights) {
  check(k >= 1 && k <= e, "router: top-k {} outside [1, {}] experts", k, e);
  OpScope op(times_, [] { return std::string("softmax_topk"); });
  order_.resize(size_t(e));
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs + t * e;
    if (p != logits + t * e) std::copy_n(logits + t * e, e, p);
    cpu::softmax(p, e);
    std::iota(order_.begin(), order_.end(), 0);
    // A NaN probability (a NaN logit makes every one NaN) ranks as 0 does (the
    // CUDA router's order), so the order stays strict and the lowest ids win.
    auto key = [p](int32_t a) { return std::isnan(p[a]) ? 0.0f : p[a]; };
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), [&](int32_t a, int32_t b) {
      return key(a) > key(b) || (key(a) == key(b) && a < b);
    });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[order_[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = order_[size_t(j)];
      ids[t * k + j] = id;
      weights[t * k + j] = renormalize ? p[id] / sum : p[id];
    }
  }
}

// Every expert of the batch in two parallel runs: gate, up and silu of all
// of them, then all their down projections; then the outputs added to out in
// the batch's order (ascending expert id), so each token's sum has the same
// order whatever ran where. An expert whose tokens are consecutive rows of x
// (every expert at decode) reads them in place; gate and up of one input
// quantize it once (cpu::matmul_many).
void CpuBackend::expert_batch(const ExpertBatch& b) {
  check(b.offsets.size() == b.experts.size() + 1, "expert batch: {} offsets for {} experts",
        b.offsets.size(), b.experts.size());
  const int64_t h = b.hidden, in = b.intermediate, pairs = b.offsets.back();
  OpScope op(times_, [&] {
    return fmt::format("expert_batch {} experts {} pairs", b.experts.size(), pairs);
  });
  g_.resize(size_t(pairs * in));
  u_.resize(size_t(pairs * in));
  ys_.resize(size_t(pairs * h));
  glu_.clear();
  down_.clear();
  for (size_t i = 0; i < b.experts.size(); ++i) {
    const int64_t p0 = b.offsets[i], m = b.offsets[i + 1] - p0;
    if (m == 0) continue;
    bool consecutive = true;
    for (int64_t j = 1; j < m; ++j)
      consecutive = consecutive && b.tokens[size_t(p0 + j)] == b.tokens[size_t(p0)] + j;
    const float* x = b.x + b.tokens[size_t(p0)] * h;
    if (!consecutive) {  // [pairs, H], only when an expert's tokens are not consecutive rows
      if (xs_.size() < size_t(pairs * h)) xs_.resize(size_t(pairs * h));
      for (int64_t j = 0; j < m; ++j)
        std::copy_n(b.x + b.tokens[size_t(p0 + j)] * h, h, &xs_[size_t((p0 + j) * h)]);
      x = &xs_[size_t(p0 * h)];
    }
    const ExpertView& v = b.experts[i];
    glu_.push_back({v.gate, v.up, x, m, &g_[size_t(p0 * in)], &u_[size_t(p0 * in)]});
    down_.push_back({v.down, &g_[size_t(p0 * in)], m, &ys_[size_t(p0 * h)]});
  }
  cpu::matmul_glu(glu_);
  cpu::matmul_many(down_);
  // Columns [c0, c1) of every pair in pair order (a prompt's sum is large).
  auto add = [&](int64_t c0, int64_t c1) {
    for (int64_t p = 0; p < pairs; ++p) {
      const float w = b.weights[size_t(p)];
      const float* yp = ys_.data() + p * h;
      float* ot = b.out + b.tokens[size_t(p)] * h;
      for (int64_t c = c0; c < c1; ++c) ot[c] += yp[c] * w;
    }
  };
  constexpr int64_t kCols = 256;
  if (pairs * h >= (int64_t(1) << 17))
    global_pool().parallel_for((h + kCols - 1) / kCols, 1, [&](int64_t i0, int64_t i1) {
      add(i0 * kCols, std::min(h, i1 * kCols));
    });
  else
    add(0, h);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace moetier
