// Multi-threaded CPU kernels. Same math as kernels/ref, tested against it by
// normalized error (tests/unit/test_kernels_cpu.cpp), on both kernel paths
// (kernels/cpu/dispatch.h).
//
// Threading: every kernel runs one parallel_for on the global thread pool
// (core/thread_pool.h) over independent outputs (rows of W, or (query, head)
// pairs) and returns when all are written; callers need no synchronization.
// Kernels are reentrant; a kernel called while another thread's kernel holds
// the pool runs on its caller alone. Every output is a function of its inputs
// only (never of the thread count or the batch size: kernels/cpu/tile.h).
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace moetier::cpu {

// Sets / reads the number of threads the kernels use, the caller included
// (n <= 0: default_threads(), core/thread_pool.h).
void set_threads(int n);
int threads();

// Y [n, rows] = X [n, cols] W^T for W in f32, bf16, mxfp4 or cb3. Parallel
// over tiles of 4 rows; each output in the canonical order of
// kernels/cpu/tile.h. y must not alias x.
void matmul(const MatView& w, const float* x, int64_t n, float* y);

// Several matmuls in one parallel run (their tiles handed out together, so
// one wait instead of one per matmul): each y computed exactly as matmul
// computes it. Tasks with the same x, n and cols (gate and up of one input)
// prepare their activations once. No y may alias any x.
struct MatmulTask {
  MatView w;
  const float* x;  // [n, w.cols]
  int64_t n;
  float* y;  // [n, w.rows]
};
void matmul_many(std::span<const MatmulTask> tasks);

// SwiGLU's first half for several inputs in one parallel run: for each task
// g [n, rows] = silu(x gate^T) * (x up^T), computed as matmul, matmul and
// silu_mul compute it (u [n, rows] holds x up^T). gate and up of one shape.
struct GluTask {
  MatView gate, up;
  const float* x;  // [n, gate.cols]
  int64_t n;
  float* g;  // [n, gate.rows]
  float* u;  // [n, gate.rows]
};
void matmul_glu(std::span<const GluTask> tasks);

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
