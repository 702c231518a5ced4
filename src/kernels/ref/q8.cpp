// The q8 activation rule (kernels/cpu/q8.h) in plain scalar code.
#include <cfloat>
#include <cmath>
#include <vector>

#include "kernels/matview.h"
#include "kernels/ref/ref.h"

namespace moetier::ref {

void quantize_q8(const float* x, int64_t blocks, int8_t* q, float* d) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      finite = finite && std::isfinite(xb[j]);
      amax = std::fmax(amax, std::fabs(xb[j]));
    }
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = finite ? amax / 127.0f : NAN;
    for (int k = 0; k < 32; ++k) {
      const int c = k < 16 ? 2 * k : 2 * (k - 16) + 1;
      const float v = xb[c] * id;
      q[32 * b + k] = finite ? int8_t(std::nearbyint(v)) : int8_t(0);
    }
  }
}

void matmul_q8(const MatView& w, const float* x, int64_t n, float* y) {
  kernels::check_matview(w, "ref::matmul_q8");
  const int64_t blocks = w.cols / 32;
  std::vector<int8_t> q(static_cast<size_t>(w.cols));
  std::vector<float> d(static_cast<size_t>(blocks));
  std::vector<double> xd(static_cast<size_t>(w.cols));  // the dequantized row, natural order
  for (int64_t t = 0; t < n; ++t) {
    quantize_q8(x + t * w.cols, blocks, q.data(), d.data());
    for (int64_t b = 0; b < blocks; ++b)
      for (int k = 0; k < 32; ++k) {
        const int c = k < 16 ? 2 * k : 2 * (k - 16) + 1;
        xd[size_t(32 * b + c)] = double(q[size_t(32 * b + k)]) * double(d[size_t(b)]);
      }
    for (int64_t r = 0; r < w.rows; ++r) {
      double acc = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) acc += double(weight_at(w, r, c)) * xd[size_t(c)];
      y[t * w.rows + r] = float(acc);
    }
  }
}

}  // namespace moetier::ref
