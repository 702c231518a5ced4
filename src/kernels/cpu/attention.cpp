// Causal GQA attention over the KV cache, parallel over (query, head) pairs.
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"

namespace moetier::cpu {
namespace {

// One (query, head): scores [n_pos] in p, output [head_dim] in o. The same
// code for every query, so a query's output does not depend on the chunk.
// Compiled twice: as is (portable) and for AVX2+FMA (attend_one_avx2).
[[gnu::always_inline]] inline void attend_body(const float* qh, const float* k, const float* v,
                                               int64_t n_pos, int64_t kv_stride, int64_t head_dim,
                                               float scale, float* p, float* o) {
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

void attend_one(const float* qh, const float* k, const float* v, int64_t n_pos, int64_t kv_stride,
                int64_t head_dim, float scale, float* p, float* o) {
  attend_body(qh, k, v, n_pos, kv_stride, head_dim, scale, p, o);
}

#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target("avx2,fma")]] void attend_one_avx2(const float* qh, const float* k, const float* v,
                                                 int64_t n_pos, int64_t kv_stride, int64_t head_dim,
                                                 float scale, float* p, float* o) {
  attend_body(qh, k, v, n_pos, kv_stride, head_dim, scale, p, o);
}
#else
void attend_one_avx2(const float* qh, const float* k, const float* v, int64_t n_pos,
                     int64_t kv_stride, int64_t head_dim, float scale, float* p, float* o) {
  attend_body(qh, k, v, n_pos, kv_stride, head_dim, scale, p, o);
}
#endif

}  // namespace

void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale, float* out) {
  const int64_t group = n_heads / n_kv;
  const int64_t kv_stride = n_kv * head_dim;
  const int64_t pairs = n_q * n_heads;
  const bool parallel = (first_pos + n_q) * head_dim * pairs >= (int64_t(1) << 16);
  auto one = vector_path(kernel_path()) ? attend_one_avx2 : attend_one;
  global_pool().parallel_for(pairs, parallel ? 1 : pairs, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> p;
    if (p.size() < size_t(first_pos + n_q)) p.resize(size_t(first_pos + n_q));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_heads, h = i % n_heads;
      const int64_t kvh = h / group;
      one(q + i * head_dim, k + kvh * head_dim, v + kvh * head_dim, first_pos + t + 1, kv_stride,
          head_dim, scale, p.data(), out + i * head_dim);
    }
  });
}

}  // namespace moetier::cpu
