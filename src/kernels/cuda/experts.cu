// SwiGLU experts on grouped tokens (kernels/cuda/cuda.h ExpertLaunch): one
// kernel computes h = silu(gate x) * up x for every (expert, token) pair, a
// second the weighted down projections summed per token in the order of
// token_pairs (one accumulator per output element: deterministic, and the
// same bits whether the experts come in one batch or several).
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/rowdot.cuh"

namespace moetier::cuda {
namespace {

constexpr int kWarpsE = 8;

// Output rows per warp: MXFP4 rows share their activation loads (gate and
// up rows of 2 outputs, or 4 down rows).
template <int ENC, bool VEC>
constexpr int kRowsE = (ENC == kMXFP4 && VEC) ? 2 : 1;

template <int ENC, bool VEC, int NT>
__global__ void __launch_bounds__(kWarpsE * 32) gate_up_kernel(ExpertLaunch l) {
  constexpr int R = kRowsE<ENC, VEC>;
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int64_t row0 = (int64_t(blockIdx.x) * kWarpsE + threadIdx.x / 32) * R;
  const int e = int(blockIdx.y);
  if (row0 >= l.inter) return;
  const ExpertPtrs& ex = l.experts[e];
  const auto* gw = static_cast<const uint8_t*>(ex.w[0]);
  const auto* uw = static_cast<const uint8_t*>(ex.w[1]);
  const int32_t p_end = l.pair_offsets[e + 1];
  for (int32_t p0 = l.pair_offsets[e]; p0 < p_end; p0 += NT) {
    const int nt = p_end - p0 < NT ? p_end - p0 : NT;
    const float* xs[NT];
    float acc[2 * R][NT];  // gate rows, then up rows
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      xs[t] = l.x + int64_t(l.pair_token[p0 + (t < nt ? t : 0)]) * l.hidden;
#pragma unroll
      for (int r = 0; r < 2 * R; ++r) acc[r][t] = 0.0f;
    }
    if constexpr (R > 1) {
      const uint4* wr[2 * R];
      const uint8_t* sr[2 * R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool live = row0 + r < l.inter;
        const int64_t off = (row0 + r) * (l.hidden / 2), so = (row0 + r) * (l.hidden / 32);
        wr[r] = live ? reinterpret_cast<const uint4*>(gw + off) : nullptr;
        wr[R + r] = live ? reinterpret_cast<const uint4*>(uw + off) : nullptr;
        sr[r] = live ? ex.s[0] + so : nullptr;
        sr[R + r] = live ? ex.s[1] + so : nullptr;
      }
      mxfp4_rows_dot<2 * R, NT>(wr, sr, l.hidden / 32, xs, nt, acc, lut);
    } else {
      row_dot<ENC, VEC, NT>(gw, ex.s[0], row0, l.hidden, xs, nt, acc[0], lut);
      row_dot<ENC, VEC, NT>(uw, ex.s[1], row0, l.hidden, xs, nt, acc[1], lut);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= l.inter) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        const float gs = warp_sum(acc[r][t]), us = warp_sum(acc[R + r][t]);
        if ((threadIdx.x & 31) == 0)
          l.h[int64_t(p0 + t) * l.inter + row0 + r] = gs / (1.0f + expf(-gs)) * us;
      }
    }
  }
}

// d[p] = down_e(p) h[p] for every pair (grid: row tiles x pairs).
template <int ENC, bool VEC>
__global__ void __launch_bounds__(kWarpsE * 32) down_kernel(ExpertLaunch l) {
  constexpr int R = 2 * kRowsE<ENC, VEC>;  // 4 MXFP4 rows per warp, else 2
  __shared__ float lut[16];
  if constexpr (ENC == kMXFP4) fill_e2m1(lut);
  __syncthreads();
  const int64_t row0 = (int64_t(blockIdx.x) * kWarpsE + threadIdx.x / 32) * R;
  const int32_t p = int32_t(blockIdx.y);
  if (row0 >= l.hidden) return;
  const ExpertPtrs& ex = l.experts[l.pair_expert[p]];
  const float* hp = l.h + int64_t(p) * l.inter;
  const auto* dw = static_cast<const uint8_t*>(ex.w[2]);
  float d[R][1];
#pragma unroll
  for (int r = 0; r < R; ++r) d[r][0] = 0.0f;
  if constexpr (ENC == kMXFP4 && VEC) {
    const uint4* wr[R];
    const uint8_t* sr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool live = row0 + r < l.hidden;
      wr[r] = live ? reinterpret_cast<const uint4*>(dw + (row0 + r) * (l.inter / 2)) : nullptr;
      sr[r] = live ? ex.s[2] + (row0 + r) * (l.inter / 32) : nullptr;
    }
    mxfp4_rows_dot<R, 1>(wr, sr, l.inter / 32, &hp, 1, d, lut);
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < l.hidden)
        row_dot<ENC, VEC, 1>(dw, ex.s[2], row0 + r, l.inter, &hp, 1, d[r], lut);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(d[r][0]);
    if ((threadIdx.x & 31) == 0 && row0 + r < l.hidden) l.d[int64_t(p) * l.hidden + row0 + r] = v;
  }
}

// out[t] += sum over t's pairs, in token_pairs order: weight(p) * d[p]
// (one thread per output element: the order of the sum is fixed).
__global__ void combine_kernel(ExpertLaunch l) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (c >= l.hidden) return;
  const int64_t out_row = l.token_rows ? l.token_rows[t] : t;
  float* o = l.out + out_row * l.hidden + c;
  float acc = *o;
  for (int32_t q = l.token_offsets[t]; q < l.token_offsets[t + 1]; ++q) {
    const int32_t p = l.token_pairs[q];
    acc += l.d[int64_t(p) * l.hidden + c] * l.pair_weight[p];
  }
  *o = acc;
}

template <int ENC, bool VEC>
void launch(const ExpertLaunch& l, cudaStream_t s) {
  const dim3 block(kWarpsE * 32);
  constexpr int up_rows = kWarpsE * kRowsE<ENC, VEC>;
  constexpr int down_rows = kWarpsE * 2 * kRowsE<ENC, VEC>;
  const dim3 g1(unsigned((l.inter + up_rows - 1) / up_rows), unsigned(l.m));
  if (l.max_pairs_per_expert <= 1)
    gate_up_kernel<ENC, VEC, 1><<<g1, block, 0, s>>>(l);
  else
    gate_up_kernel<ENC, VEC, 4><<<g1, block, 0, s>>>(l);
  const int32_t pairs = l.pairs;
  const dim3 g2(unsigned((l.hidden + down_rows - 1) / down_rows), unsigned(pairs));
  down_kernel<ENC, VEC><<<g2, block, 0, s>>>(l);
  const dim3 g3(unsigned((l.hidden + 255) / 256), unsigned(l.n));
  combine_kernel<<<g3, 256, 0, s>>>(l);
}

// Experts need 16-byte aligned rows for the vector path; the caller checked
// the pointers (vec), and the widths are checked here.
bool widths_vectorizable(WeightEncoding enc, int64_t h, int64_t i) {
  const int64_t m = enc == WeightEncoding::F32 ? 4 : enc == WeightEncoding::BF16 ? 8 : 32;
  return enc != WeightEncoding::CB3 && h % m == 0 && i % m == 0;
}

__global__ void prep_kernel(const int32_t* ids, const float* weights, int k,
                            const ExpertPtrs* table, ExpertPtrs* experts, int32_t* ints,
                            float* pw) {
  if (threadIdx.x != 0) return;
  int32_t id[32];
  float w[32];
  for (int i = 0; i < k; ++i) id[i] = ids[i], w[i] = weights[i];
  for (int i = 1; i < k; ++i)  // insertion sort by id (k <= 32)
    for (int j = i; j > 0 && id[j] < id[j - 1]; --j) {
      const int32_t a = id[j];
      id[j] = id[j - 1], id[j - 1] = a;
      const float b = w[j];
      w[j] = w[j - 1], w[j - 1] = b;
    }
  int32_t* pair_offsets = ints;              // [k + 1]
  int32_t* pair_token = ints + k + 1;        // [k]
  int32_t* token_offsets = pair_token + k;   // [2]
  int32_t* token_pairs = token_offsets + 2;  // [k]
  int32_t* pair_expert = token_pairs + k;    // [k]
  for (int i = 0; i < k; ++i) {
    experts[i] = table[id[i]];
    pair_offsets[i] = i;
    pair_token[i] = 0;
    token_pairs[i] = i;
    pair_expert[i] = i;
    pw[i] = w[i];
  }
  pair_offsets[k] = k;
  token_offsets[0] = 0;
  token_offsets[1] = k;
}

__global__ void gather_kernel(const float* x, const int32_t* rows, int64_t m, int64_t cols,
                              uint16_t* dst) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] =
        __bfloat16_as_ushort(__float2bfloat16_rn(x[int64_t(rows[i / cols]) * cols + i % cols]));
}

__global__ void scatter_kernel(float* out, const float* y, const int32_t* rows, const float* w,
                               int64_t m, int64_t cols) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    float* o = out + int64_t(rows[r]) * cols + i % cols;
    *o = *o + y[i] * w[r];
  }
}

unsigned blocks(int64_t n) { return unsigned(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535); }

}  // namespace

void gather_rows_bf16(const float* x, const int32_t* rows, int64_t m, int64_t cols, uint16_t* dst,
                      cudaStream_t s) {
  gather_kernel<<<blocks(m * cols), 256, 0, s>>>(x, rows, m, cols, dst);
}

void scatter_add_rows(float* out, const float* y, const int32_t* rows, const float* weights,
                      int64_t m, int64_t cols, cudaStream_t s) {
  scatter_kernel<<<blocks(m * cols), 256, 0, s>>>(out, y, rows, weights, m, cols);
}

void experts(const ExpertLaunch& l, cudaStream_t s) {
  if (l.m <= 0 || l.n <= 0) return;
  const bool vec = l.vec_ok && widths_vectorizable(l.enc, l.hidden, l.inter);
  switch (l.enc) {
    case WeightEncoding::F32:
      return vec ? launch<kF32, true>(l, s) : launch<kF32, false>(l, s);
    case WeightEncoding::BF16:
      return vec ? launch<kBF16, true>(l, s) : launch<kBF16, false>(l, s);
    case WeightEncoding::MXFP4:
      return vec ? launch<kMXFP4, true>(l, s) : launch<kMXFP4, false>(l, s);
    case WeightEncoding::CB3:
      return launch<kCB3, false>(l, s);
  }
}

size_t expert_prep_bytes(int64_t k) {
  return size_t(k) * sizeof(ExpertPtrs) + size_t(4 * k + 3) * 4 + size_t(k) * 4 + 64;
}

ExpertLaunch prepare_decode_experts(const int32_t* ids, const float* weights, int64_t k,
                                    const ExpertPtrs* table, void* prep, cudaStream_t s) {
  auto* experts = static_cast<ExpertPtrs*>(prep);
  auto* ints = reinterpret_cast<int32_t*>(experts + k);
  float* pw = reinterpret_cast<float*>(ints + 4 * k + 3);
  prep_kernel<<<1, 32, 0, s>>>(ids, weights, int(k), table, experts, ints, pw);
  ExpertLaunch l;
  l.m = int32_t(k);
  l.experts = experts;
  l.pair_offsets = ints;
  l.pair_token = ints + k + 1;
  l.n = 1;
  l.token_offsets = ints + 2 * k + 1;
  l.token_pairs = ints + 2 * k + 3;
  l.pair_expert = ints + 3 * k + 3;
  l.pair_weight = pw;
  l.pairs = int32_t(k);
  l.max_pairs_per_expert = 1;
  return l;
}

}  // namespace moetier::cuda
