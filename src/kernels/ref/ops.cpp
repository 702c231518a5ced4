#include <cmath>
#include <vector>

#include "kernels/ref/ref.h"

namespace moetier::ref {

void rmsnorm(const float* x, const float* weight, int64_t dim, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < dim; ++i) ss += double(x[i]) * double(x[i]);
  double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
  for (int64_t i = 0; i < dim; ++i) y[i] = float(double(x[i]) * inv * double(weight[i]));
}

std::vector<float> rope_inv_freq(int64_t head_dim, double theta) {
  // torch: 1.0 / (base ** (arange(0, dim, 2, dtype=float) / dim)), all in f32.
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    float e = float(2 * i) / float(head_dim);
    f[size_t(i)] = 1.0f / std::pow(float(theta), e);
  }
  return f;
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq) {
  int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float angle = inv_freq[i] * float(pos);  // f32 product, as torch's freqs
    double c = std::cos(double(angle)), s = std::sin(double(angle));
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + h * head_dim;
      double a = v[i], b = v[i + half];
      v[i] = float(a * c - b * s);         // x1*cos + (-x2)*sin
      v[i + half] = float(b * c + a * s);  // x2*cos + x1*sin
    }
  }
}

void softmax(float* x, int64_t n) {
  double m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::fmax(m, double(x[i]));
  double sum = 0.0;
  std::vector<double> e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sum += e[size_t(i)] = std::exp(double(x[i]) - m);
  for (int64_t i = 0; i < n; ++i) x[i] = float(e[size_t(i)] / sum);
}

float silu(float x) { return float(double(x) / (1.0 + std::exp(-double(x)))); }

void attention(const float* q, const float* k, const float* v, int64_t n_pos, int64_t n_heads,
               int64_t n_kv, int64_t head_dim, float scale, float* out) {
  int64_t group = n_heads / n_kv;
  std::vector<float> p(static_cast<size_t>(n_pos));
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * head_dim;
    int64_t kvh = h / group;
    for (int64_t t = 0; t < n_pos; ++t) {
      const float* kt = k + (t * n_kv + kvh) * head_dim;
      double s = 0.0;
      for (int64_t d = 0; d < head_dim; ++d) s += double(qh[d]) * double(kt[d]);
      p[size_t(t)] = float(s * double(scale));
    }
    softmax(p.data(), n_pos);
    for (int64_t d = 0; d < head_dim; ++d) {
      double acc = 0.0;
      for (int64_t t = 0; t < n_pos; ++t)
        acc += double(p[size_t(t)]) * double(v[(t * n_kv + kvh) * head_dim + d]);
      out[h * head_dim + d] = float(acc);
    }
  }
}

}  // namespace moetier::ref
