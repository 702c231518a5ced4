// Elementwise and normalization kernels. These are cheap next to the
// matmuls; rmsnorm parallelizes over rows when there are many.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu.h"

namespace moetier::cpu {

namespace {

void rmsnorm_rows(const float* x, const float* weight, int64_t t0, int64_t t1, int64_t dim,
                  float eps, float* y) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * dim;
    float* yt = y + t * dim;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += double(xt[i]) * double(xt[i]);
    // torch: variance in f32, x * rsqrt(variance + eps), then weight * that.
    float var = float(ss / double(dim));
    float r = 1.0f / std::sqrt(var + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yt[i] = weight[i] * (xt[i] * r);
  }
}

}  // namespace

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  const int64_t grain = n * dim >= (int64_t(1) << 16) ? std::max<int64_t>(1, 4096 / dim) : n;
  global_pool().parallel_for(
      n, grain, [&](int64_t t0, int64_t t1) { rmsnorm_rows(x, weight, t0, t1, dim, eps, y); });
}

void rope(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t pos0,
          const float* inv_freq) {
  const int64_t half = head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(2 * half));  // [cos(half), sin(half)]
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      float angle = inv_freq[i] * float(pos0 + t);
      cs[size_t(i)] = float(std::cos(double(angle)));
      cs[size_t(half + i)] = float(std::sin(double(angle)));
    }
    const float* c = cs.data();
    const float* s = cs.data() + half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void softmax(float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::fmax(m, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] = std::exp(x[i] - m);
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;  // divide, as torch
}

void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace moetier::cpu
