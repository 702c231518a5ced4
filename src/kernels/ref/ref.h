// Scalar reference kernels: plain loops, double accumulation, obviously
// correct. Every fast kernel (kernels/cpu, kernels/cuda) is tested against
// these. They are slow: use them in tests and as the definition of the math.
//
// Conventions (HF transformers qwen3_moe): a matrix W [rows, cols] maps
// x [cols] to y [rows] = W x. All activations are f32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace moetier::ref {

// Element (r, c) of w decoded to f32 (MXFP4: e2m1 code * e8m0 block scale;
// CB3: the row's f16 centroid that the 3-bit code selects).
float weight_at(const MatView& w, int64_t r, int64_t c);

// y [rows] = W x, x [cols]. Double accumulation.
void matvec(const MatView& w, const float* x, float* y);
// Y [n, rows] = X [n, cols] W^T (matvec per row of X).
void matmul(const MatView& w, const float* x, int64_t n, float* y);

// y [dim] = x * rsqrt(mean(x^2) + eps) * weight. y may alias x.
void rmsnorm(const float* x, const float* weight, int64_t dim, float eps, float* y);

// inv_freq [head_dim/2]: 1 / theta^(2i/head_dim), computed in f32 as torch does.
std::vector<float> rope_inv_freq(int64_t head_dim, double theta);
// Rotates x [n_heads, head_dim] in place for position pos (rotate_half
// convention: pairs (i, i + head_dim/2) share angle pos * inv_freq[i]).
void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq);

// In place over x [n], max-subtracted.
void softmax(float* x, int64_t n);
float silu(float x);

// One query over a KV cache (GQA: head h reads kv head h / (n_heads/n_kv)).
//   q   [n_heads, head_dim]
//   k,v [n_pos, n_kv, head_dim]   positions 0..n_pos-1 are attended
//   out [n_heads, head_dim]
// score = (q . k) * scale; softmax over positions; out = sum p * v.
void attention(const float* q, const float* k, const float* v, int64_t n_pos, int64_t n_heads,
               int64_t n_kv, int64_t head_dim, float scale, float* out);

}  // namespace moetier::ref

namespace moetier::ref {

// The q8 activations of MXFP4 matmuls (kernels/cpu/q8.h): x [32 * blocks] ->
// q [32 * blocks] (each block permuted, even columns first), d [blocks].
void quantize_q8(const float* x, int64_t blocks, int8_t* q, float* d);
// Y [n, rows] = X8 [n, cols] W^T where X8 is X quantized by quantize_q8 and
// dequantized (q * d) exactly: what the q8 kernels compute, in double.
void matmul_q8(const MatView& w, const float* x, int64_t n, float* y);

}  // namespace moetier::ref
