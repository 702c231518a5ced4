// Causal GQA attention over the KV cache, parallel over (query, head) pairs.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/simd.h"

namespace moetier::cpu {
namespace {

// One (query, head): scores [n_pos] in p, output [head_dim] in o.
MOETIER_CLONES void attend_one(const float* qh, const float* k, const float* v, int64_t n_pos,
                               int64_t kv_stride, int64_t head_dim, float scale, float* p,
                               float* o) {
  for (int64_t t = 0; t < n_pos; ++t) {
    const float* kt = k + t * kv_stride;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < head_dim; ++d) s += qh[d] * kt[d];
    p[t] = s * scale;
  }
  softmax(p, n_pos);
  for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
  for (int64_t t = 0; t < n_pos; ++t) {
    const float* vt = v + t * kv_stride;
    const float pt = p[t];
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) o[d] += pt * vt[d];
  }
}

}  // namespace

void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale, float* out) {
  const int64_t group = n_heads / n_kv;
  const int64_t kv_stride = n_kv * head_dim;
  const int64_t pairs = n_q * n_heads;
  const bool parallel = pairs > 1 && (first_pos + n_q) * head_dim * pairs >= (int64_t(1) << 17);
#pragma omp parallel if (parallel)
  {
    std::vector<float> p(static_cast<size_t>(first_pos + n_q));
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads;
      const int64_t kvh = h / group;
      attend_one(q + i * head_dim, k + kvh * head_dim, v + kvh * head_dim, first_pos + t + 1,
                 kv_stride, head_dim, scale, p.data(), out + i * head_dim);
    }
  }
}

}  // namespace moetier::cpu
