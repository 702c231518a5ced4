// Decode (one token) kernels: a GEMV whose blocks own a few weight rows and
// whose threads split the columns (so even a 512-row projection spreads over
// every SM), and the resident MoE step in two launches: gate/up of every
// selected expert (grid: row tiles x k) and the down projections of all k
// experts summed with their routing weights inside one kernel (the weighted
// sum fused into the down projection), reading expert ids, weights and
// pointers from device memory so the step can be captured in a CUDA graph.
//
// A thread takes 16-byte weight chunks i, i + blockDim, ... of a row (bf16: 8
// columns, f32: 4, MXFP4: one 32-column block and its scale); partial sums are
// reduced by warp butterflies and then across warps in a fixed order, so every
// result is deterministic. Experts are summed in ascending id order.
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/decode_chunk.cuh"

namespace moetier::cuda {
namespace {

template <int ENC, int R>
__global__ void __launch_bounds__(kMaxThreads)
    gemv1_kernel(const uint8_t* w, const uint8_t* sc, int64_t rows, int64_t cols, const float* x,
                 float* y, int accumulate) {
  using C = Chunk<ENC>;
  __shared__ float lut[16];
  __shared__ float red[R][kMaxThreads / 32];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int64_t row0 = int64_t(blockIdx.x) * R;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t i = threadIdx.x; i < cols / C::kCols; i += blockDim.x) {
    float xv[C::kCols];
    load_x<C::kCols>(x, i, xv);
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < rows) acc[r] += C::dot(w, sc, row0 + r, cols, i, xv, lut);
  }
  const float t = block_sum<R>(acc, red);
  if (threadIdx.x < R && row0 + threadIdx.x < rows) {
    float* o = y + row0 + threadIdx.x;
    *o = accumulate ? *o + t : t;
  }
}

// h[slot] = silu(gate x) * up x for expert ids[slot] (grid: row tiles x k).
template <int ENC, int R>
__global__ void __launch_bounds__(kMaxThreads)
    moe_gate_up_kernel(const ExpertPtrs* table, const int32_t* ids, const float* x,
                       int64_t hidden, int64_t inter, float* h) {
  using C = Chunk<ENC>;
  __shared__ float lut[16];
  __shared__ float red[2 * R][kMaxThreads / 32];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int slot = int(blockIdx.y);
  const ExpertPtrs& ex = table[ids[slot]];
  const auto* gw = static_cast<const uint8_t*>(ex.w[0]);
  const auto* uw = static_cast<const uint8_t*>(ex.w[1]);
  const int64_t row0 = int64_t(blockIdx.x) * R;
  float acc[2 * R];  // gate rows, then up rows
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden / C::kCols; i += blockDim.x) {
    float xv[C::kCols];
    load_x<C::kCols>(x, i, xv);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= inter) break;
      acc[r] += C::dot(gw, ex.s[0], row0 + r, hidden, i, xv, lut);
      acc[R + r] += C::dot(uw, ex.s[1], row0 + r, hidden, i, xv, lut);
    }
  }
  const float t = block_sum<2 * R>(acc, red);
  __shared__ float gs[R];
  if (threadIdx.x < R) gs[threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x >= R && threadIdx.x < 2 * R) {
    const int r = int(threadIdx.x) - R;
    const float g = gs[r];
    if (row0 + r < inter) h[int64_t(slot) * inter + row0 + r] = g / (1.0f + expf(-g)) * t;
  }
}

// out[row] = sum over the k experts in ascending id order of
// weights[j] * (down_{ids[j]} h[j])[row] (grid: row tiles).
template <int ENC, int R>
__global__ void __launch_bounds__(kMaxThreads)
    moe_down_kernel(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
                    const float* h, int64_t hidden, int64_t inter, float* out) {
  using C = Chunk<ENC>;
  __shared__ float lut[16];
  __shared__ float red[R][kMaxThreads / 32];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  int order[32];  // slots by ascending expert id (k <= 32)
  for (int j = 0; j < k; ++j) {
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += ids[i] < ids[j] || (ids[i] == ids[j] && i < j);
    order[rank] = j;
  }
  const int64_t row0 = int64_t(blockIdx.x) * R;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int q = 0; q < k; ++q) {
    const int j = order[q];
    const ExpertPtrs& ex = table[ids[j]];
    const auto* dw = static_cast<const uint8_t*>(ex.w[2]);
    const float wj = weights[j];
    const float* hj = h + int64_t(j) * inter;
    for (int64_t i = threadIdx.x; i < inter / C::kCols; i += blockDim.x) {
      float hv[C::kCols];
      load_x<C::kCols>(hj, i, hv);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < hidden) acc[r] += wj * C::dot(dw, ex.s[2], row0 + r, inter, i, hv, lut);
    }
  }
  const float t = block_sum<R>(acc, red);
  if (threadIdx.x < R && row0 + threadIdx.x < hidden) out[row0 + threadIdx.x] = t;
}

int enc_cols(WeightEncoding e) {
  return e == WeightEncoding::F32 ? 4 : e == WeightEncoding::BF16 ? 8 : 32;
}

// Threads for `chunks` 16-byte chunks per row: a multiple of 32, at most 256.
unsigned threads_for(int64_t chunks) {
  const int64_t t = (chunks + 31) / 32 * 32;
  return unsigned(t < 32 ? 32 : t > kMaxThreads ? kMaxThreads : t);
}

template <int ENC>
void gemv1_enc(const MatView& w, const float* x, float* y, bool acc, cudaStream_t s) {
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const unsigned t = threads_for(w.cols / Chunk<ENC>::kCols);
  if (w.rows >= 2048) {
    const unsigned g = unsigned((w.rows + 1) / 2);
    gemv1_kernel<ENC, 2><<<g, t, 0, s>>>(wp, w.scales, w.rows, w.cols, x, y, acc);
  } else {
    gemv1_kernel<ENC, 1><<<unsigned(w.rows), t, 0, s>>>(wp, w.scales, w.rows, w.cols, x, y, acc);
  }
}

template <int ENC>
void moe_enc(const ExpertPtrs* table, const int32_t* ids, const float* weights, int k,
             const float* x, int64_t hidden, int64_t inter, float* h, float* out, cudaStream_t s) {
  constexpr int kUp = 4, kDown = 2;
  const dim3 g1(unsigned((inter + kUp - 1) / kUp), unsigned(k));
  moe_gate_up_kernel<ENC, kUp>
      <<<g1, threads_for(hidden / Chunk<ENC>::kCols), 0, s>>>(table, ids, x, hidden, inter, h);
  const unsigned g2 = unsigned((hidden + kDown - 1) / kDown);
  moe_down_kernel<ENC, kDown><<<g2, threads_for(inter / Chunk<ENC>::kCols), 0, s>>>(
      table, ids, weights, k, h, hidden, inter, out);
}

}  // namespace

bool gemv1(const MatView& w, const float* x, float* y, bool accumulate, cudaStream_t s) {
  if (w.enc == WeightEncoding::CB3 || !vectorizable(w) || w.rows <= 0) return false;
  switch (w.enc) {
    case WeightEncoding::F32:
      return gemv1_enc<kF32>(w, x, y, accumulate, s), true;
    case WeightEncoding::BF16:
      return gemv1_enc<kBF16>(w, x, y, accumulate, s), true;
    case WeightEncoding::MXFP4:
      return gemv1_enc<kMXFP4>(w, x, y, accumulate, s), true;
    default:
      return false;
  }
}

bool moe_decode(const ExpertPtrs* table, WeightEncoding enc, bool vec, const int32_t* ids,
                const float* weights, int k, const float* x, int64_t hidden, int64_t inter,
                float* h, float* out, cudaStream_t s) {
  const int64_t m = enc_cols(enc);
  if (!vec || enc == WeightEncoding::CB3 || hidden % m || inter % m || k < 1 || k > 32)
    return false;
  switch (enc) {
    case WeightEncoding::F32:
      return moe_enc<kF32>(table, ids, weights, k, x, hidden, inter, h, out, s), true;
    case WeightEncoding::BF16:
      return moe_enc<kBF16>(table, ids, weights, k, x, hidden, inter, h, out, s), true;
    case WeightEncoding::MXFP4:
      return moe_enc<kMXFP4>(table, ids, weights, k, x, hidden, inter, h, out, s), true;
    default:
      return false;
  }
}

}  // namespace moetier::cuda
