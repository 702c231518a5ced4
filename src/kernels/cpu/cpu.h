// Multi-threaded CPU kernels (OpenMP). Same math as kernels/ref, tested
// against it by normalized error (tests/unit/test_kernels_cpu.cpp).
//
// Threading: every kernel opens its own OpenMP parallel region over
// independent outputs (rows of W, or (query, head) pairs) and returns when all
// are written; callers need no synchronization. The thread count is OpenMP's
// (set_threads / OMP_NUM_THREADS). Kernels are reentrant, but calling them from
// several threads at once nests parallel regions (serialized by default).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moetier::cpu {

// Sets / reads the number of OpenMP threads the kernels use (n <= 0: the
// hardware concurrency).
void set_threads(int n);
int threads();

// Y [n, rows] = X [n, cols] W^T for W in f32, bf16, mxfp4 or cb3 (cb3 runs
// in kernels/cpu/cb3.cpp). Parallel over
// tiles of rows; W is decoded to f32 in registers (n small) or once per row
// tile into a per-thread scratch (n large). y must not alias x.
void matmul(const MatView& w, const float* x, int64_t n, float* y);

// out [cols] = row r of w decoded to f32 (embedding lookup).
void get_row(const MatView& w, int64_t r, float* out);

// y [n, dim]: each row x * rsqrt(mean(x^2) + eps) * weight (f32, as torch).
// y may alias x.
void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y);

// x [n, n_heads, head_dim], token t at position pos0 + t; rotate_half RoPE.
void rope(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t pos0,
          const float* inv_freq);

// In place over x [n], f32, max-subtracted.
void softmax(float* x, int64_t n);

// g [n] = silu(g) * u.
void silu_mul(float* g, const float* u, int64_t n);

// Causal GQA attention for n_q queries; query t sits at position first_pos + t
// and attends to cache positions 0..first_pos + t.
//   q   [n_q, n_heads, head_dim]
//   k,v [>= first_pos + n_q, n_kv, head_dim]
//   out [n_q, n_heads, head_dim]
// Parallel over (query, head) pairs.
void attention(const float* q, const float* k, const float* v, int64_t n_q, int64_t first_pos,
               int64_t n_heads, int64_t n_kv, int64_t head_dim, float scale, float* out);

}  // namespace moetier::cpu
