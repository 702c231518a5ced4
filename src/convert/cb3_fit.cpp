#include "convert/cb3_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cb3.h"

namespace moetier {
namespace {

constexpr int K = kernels::kCb3Centroids;
constexpr float kF16Max = 65504.0f;
constexpr int64_t kParallelMin = int64_t(1) << 16;  // elements worth a parallel region

// Sorted row and prefix sums of w and w*x in sorted order; false when every
// weight is zero.
bool prepare(const float* x, const float* w, int64_t cols, Cb3Scratch& s) {
  s.order.resize(size_t(cols));
  std::iota(s.order.begin(), s.order.end(), 0);
  std::sort(s.order.begin(), s.order.end(),
            [x](int32_t a, int32_t b) { return x[a] < x[b] || (x[a] == x[b] && a < b); });
  s.sorted.resize(size_t(cols));
  s.pw.assign(size_t(cols) + 1, 0.0);
  s.pwx.assign(size_t(cols) + 1, 0.0);
  for (int64_t i = 0; i < cols; ++i) {
    const int32_t c = s.order[size_t(i)];
    const double wi = w ? double(w[c]) : 1.0;
    s.sorted[size_t(i)] = x[c];
    s.pw[size_t(i) + 1] = s.pw[size_t(i)] + wi;
    s.pwx[size_t(i) + 1] = s.pwx[size_t(i)] + wi * double(x[c]);
  }
  return s.pw.back() > 0;
}

// Centroid k at the weighted quantile (k + 1/2) / K of the sorted row.
std::array<double, K> quantile_init(const Cb3Scratch& s) {
  std::array<double, K> c{};
  const double total = s.pw.back();
  const size_t n = s.sorted.size();
  size_t i = 0;
  for (int k = 0; k < K; ++k) {
    const double target = (k + 0.5) / K * total;
    while (i + 1 < n && s.pw[i + 1] <= target) ++i;
    c[size_t(k)] = s.sorted[i];
  }
  return c;
}

// One Lloyd step over the sorted row; returns true when a centroid moved.
bool lloyd_step(const Cb3Scratch& s, std::array<double, K>& c) {
  std::array<double, K> next = c;
  size_t lo = 0;
  const size_t n = s.sorted.size();
  for (int k = 0; k < K; ++k) {
    size_t hi = n;
    if (k + 1 < K) {
      const double mid = 0.5 * (c[size_t(k)] + c[size_t(k) + 1]);
      hi = size_t(std::upper_bound(s.sorted.begin() + std::ptrdiff_t(lo), s.sorted.end(), mid,
                                   [](double m, float v) { return m < double(v); }) -
                  s.sorted.begin());
    }
    const double wsum = s.pw[hi] - s.pw[lo];
    if (wsum > 0) next[size_t(k)] = (s.pwx[hi] - s.pwx[lo]) / wsum;
    lo = hi;
  }
  std::sort(next.begin(), next.end());
  const bool moved = next != c;
  c = next;
  return moved;
}

int nearest(float v, const float* cent) {
  int best = 0;
  float d = std::fabs(v - cent[0]);
  for (int k = 1; k < K; ++k) {
    const float e = std::fabs(v - cent[k]);
    if (e < d) d = e, best = k;
  }
  return best;
}

}  // namespace

void cb3_fit_row(const float* x, const float* w, int64_t cols, int iterations, uint16_t* codebook,
                 uint8_t* codes, Cb3Scratch& s) {
  if (!prepare(x, w, cols, s)) prepare(x, nullptr, cols, s);  // all weights zero: unit weights
  std::array<double, K> c = quantile_init(s);
  for (int it = 0; it < iterations && lloyd_step(s, c); ++it) {
  }
  std::array<uint16_t, K> bits;
  for (int k = 0; k < K; ++k)
    bits[size_t(k)] = f32_to_f16(std::clamp(float(c[size_t(k)]), -kF16Max, kF16Max));
  std::array<float, K> cent;
  std::sort(bits.begin(), bits.end(),
            [](uint16_t a, uint16_t b) { return f16_to_f32(a) < f16_to_f32(b); });
  for (int k = 0; k < K; ++k) cent[size_t(k)] = f16_to_f32(bits[size_t(k)]);
  std::memcpy(codebook, bits.data(), sizeof(bits));
  for (int64_t i = 0; i < cols; ++i) codes[i] = uint8_t(nearest(x[i], cent.data()));
}

Cb3Error cb3_encode_matrix(const float* w, int64_t rows, int64_t cols, const float* col_w,
                           int iterations, uint8_t* codes, uint8_t* codebook) {
  const int64_t rb = kernels::cb3_row_bytes(cols);
  // Small matrices run on one thread: a parallel run costs more than it saves.
  constexpr int64_t kGrain = 8;
  const int64_t grain = rows > 1 && rows * cols >= kParallelMin ? kGrain : rows;
  // Per-chunk sums, added in chunk order: the result is the same for any
  // thread count.
  const int64_t chunks = (rows + grain - 1) / grain;
  std::vector<Cb3Error> part(static_cast<size_t>(chunks));
  global_pool().parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    thread_local Cb3Scratch s;
    thread_local std::vector<uint8_t> unpacked;
    unpacked.resize(static_cast<size_t>(cols));
    Cb3Error& e = part[size_t(r0 / grain)];
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = w + r * cols;
      uint16_t bits[K];
      cb3_fit_row(x, col_w, cols, iterations, bits, unpacked.data(), s);
      std::memcpy(codebook + r * K * 2, bits, sizeof(bits));
      kernels::cb3_pack_row(unpacked.data(), cols, codes + r * rb);
      for (int64_t c = 0; c < cols; ++c) {
        const double wc = col_w ? double(col_w[c]) : 1.0;
        const double d = double(x[c]) - double(f16_to_f32(bits[unpacked[size_t(c)]]));
        e.err += wc * d * d;
        e.energy += wc * double(x[c]) * double(x[c]);
      }
    }
  });
  double err = 0, energy = 0;
  for (const Cb3Error& e : part) err += e.err, energy += e.energy;
  return {err, energy};
}

Cb3Error uniform3_error(const float* x, const float* w, int64_t cols) {
  const auto [mn, mx] = std::minmax_element(x, x + cols);
  const double lo = *mn, step = (double(*mx) - lo) / (K - 1);
  Cb3Error e;
  for (int64_t c = 0; c < cols; ++c) {
    const double q = step > 0 ? lo + step * std::round((x[c] - lo) / step) : lo;
    const double wc = w ? double(w[c]) : 1.0;
    e.err += wc * (x[c] - q) * (x[c] - q);
    e.energy += wc * double(x[c]) * double(x[c]);
  }
  return e;
}

}  // namespace moetier
