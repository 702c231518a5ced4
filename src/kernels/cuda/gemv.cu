// y (+)= x w^T for small n (decode, short chunks), any weight encoding; and
// the conversions the tensor-core GEMM path needs.
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/rowdot.cuh"

namespace moetier::cuda {
namespace {

constexpr int kWarps = 8;  // rows per block

// Rows per warp: MXFP4 rows share their activation loads four at a time.
template <int ENC, bool VEC>
constexpr int kRowsPerWarp = (ENC == kMXFP4 && VEC) ? 4 : 1;

template <int ENC, bool VEC, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const uint8_t* w, const uint8_t* sc, int64_t rows, int64_t cols, const float* x,
                int64_t n, float* y, int accumulate) {
  constexpr int R = kRowsPerWarp<ENC, VEC>;
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= rows) return;
  for (int64_t t0 = 0; t0 < n; t0 += NT) {
    const int nt = int(n - t0 < NT ? n - t0 : NT);
    const float* xs[NT];
    float acc[R][NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      xs[t] = x + (t0 + (t < nt ? t : 0)) * cols;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] = 0.0f;
    }
    if constexpr (R > 1) {
      const uint4* wr[R];
      const uint8_t* sr[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool live = row0 + r < rows;
        wr[r] = live ? reinterpret_cast<const uint4*>(w + (row0 + r) * (cols / 2)) : nullptr;
        sr[r] = live ? sc + (row0 + r) * (cols / 32) : nullptr;
      }
      mxfp4_rows_dot<R, NT>(wr, sr, cols / 32, xs, nt, acc, lut);
    } else {
      row_dot<ENC, VEC, NT>(w, sc, row0, cols, xs, nt, acc[0], lut);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= rows) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        const float v = warp_sum(acc[r][t]);
        if ((threadIdx.x & 31) == 0) {
          float* out = y + (t0 + t) * rows + row0 + r;
          *out = accumulate ? *out + v : v;
        }
      }
    }
  }
}

template <int ENC, bool VEC>
void launch_nt(const MatView& w, const float* x, int64_t n, float* y, bool acc, cudaStream_t s) {
  constexpr int per_block = kWarps * kRowsPerWarp<ENC, VEC>;
  const dim3 grid(unsigned((w.rows + per_block - 1) / per_block)), block(kWarps * 32);
  const auto* wp = static_cast<const uint8_t*>(w.data);
  if (n == 1)
    gemv_kernel<ENC, VEC, 1><<<grid, block, 0, s>>>(wp, w.scales, w.rows, w.cols, x, n, y, acc);
  else if (n <= 4)
    gemv_kernel<ENC, VEC, 4><<<grid, block, 0, s>>>(wp, w.scales, w.rows, w.cols, x, n, y, acc);
  else
    gemv_kernel<ENC, VEC, 8><<<grid, block, 0, s>>>(wp, w.scales, w.rows, w.cols, x, n, y, acc);
}

}  // namespace

bool vectorizable(const MatView& w) {
  const auto a = reinterpret_cast<uintptr_t>(w.data);
  switch (w.enc) {
    case WeightEncoding::F32:
      return a % 16 == 0 && w.cols % 4 == 0;
    case WeightEncoding::BF16:
      return a % 16 == 0 && w.cols % 8 == 0;
    case WeightEncoding::MXFP4:
      return a % 16 == 0 && w.cols % 32 == 0;
    case WeightEncoding::CB3:
      return false;
  }
  return false;
}

void gemv(const MatView& w, const float* x, int64_t n, float* y, bool acc, cudaStream_t s) {
  if (n <= 0 || w.rows <= 0) return;
  const bool vec = vectorizable(w);
  switch (w.enc) {
    case WeightEncoding::F32:
      return vec ? launch_nt<kF32, true>(w, x, n, y, acc, s)
                 : launch_nt<kF32, false>(w, x, n, y, acc, s);
    case WeightEncoding::BF16:
      return vec ? launch_nt<kBF16, true>(w, x, n, y, acc, s)
                 : launch_nt<kBF16, false>(w, x, n, y, acc, s);
    case WeightEncoding::MXFP4:
      return vec ? launch_nt<kMXFP4, true>(w, x, n, y, acc, s)
                 : launch_nt<kMXFP4, false>(w, x, n, y, acc, s);
    case WeightEncoding::CB3:
      return launch_nt<kCB3, false>(w, x, n, y, acc, s);
  }
}

namespace {

template <int ENC>
__global__ void decode_kernel(const uint8_t* w, const uint8_t* sc, int64_t rows, int64_t cols,
                              uint16_t* dst) {
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int64_t total = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = weight_at<ENC>(w, sc, i / cols, i % cols, cols, lut);
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

__global__ void f32_bf16_kernel(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
}

unsigned blocks_for(int64_t n) { return unsigned(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535); }

}  // namespace

void decode_to_bf16(const MatView& w, uint16_t* dst, cudaStream_t s) {
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const unsigned g = blocks_for(w.rows * w.cols);
  switch (w.enc) {
    case WeightEncoding::F32:
      return decode_kernel<kF32><<<g, 256, 0, s>>>(wp, w.scales, w.rows, w.cols, dst);
    case WeightEncoding::BF16:
      return decode_kernel<kBF16><<<g, 256, 0, s>>>(wp, w.scales, w.rows, w.cols, dst);
    case WeightEncoding::MXFP4:
      return decode_kernel<kMXFP4><<<g, 256, 0, s>>>(wp, w.scales, w.rows, w.cols, dst);
    case WeightEncoding::CB3:
      return decode_kernel<kCB3><<<g, 256, 0, s>>>(wp, w.scales, w.rows, w.cols, dst);
  }
}

void f32_to_bf16(const float* src, int64_t n, uint16_t* dst, cudaStream_t s) {
  f32_bf16_kernel<<<blocks_for(n), 256, 0, s>>>(src, n, dst);
}

}  // namespace moetier::cuda
