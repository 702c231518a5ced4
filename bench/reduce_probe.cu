// What it costs to sum the down projection's split-K partials of one decode
// step: NB blocks (one per h block of 32 rows of one expert: k x inter / 32)
// each hold a partial [hidden] and all finish at once. Arms, us per step
// (back-to-back launches, so each figure includes a launch):
//  - none:  each block writes one float (the launch alone);
//  - red:   each thread adds its rows to out with red.global.add.f32;
//  - red4:  the same with red.global.add.v4.f32 (sm_90);
//  - redi:  fixed point: red.global.add.u64 of the partial times 2^32;
//  - part:  each block writes its partial to [NB][hidden] (f32), then a second
//           kernel sums the NB partials of each row in a fixed order
//           (deterministic), SPLIT threads a row, a warp shuffle to finish.
// Build: nvcc -O3 -std=c++20 -arch=sm_90 bench/reduce_probe.cu -o /tmp/reduce_probe
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_check.cuh"

constexpr int kThreads = 256;

// Partial of row r in block b: a cheap function of both (not zero, not constant).
__device__ __forceinline__ float part_of(int b, int r) {
  return float((b * 7 + r * 13) % 97) * 0.01f - 0.4f;
}

__global__ void __launch_bounds__(kThreads, 3) k_none(float* out, int hidden) {
  if (threadIdx.x == 0) out[blockIdx.x % hidden] = part_of(blockIdx.x, 0);
}
__global__ void __launch_bounds__(kThreads, 3) k_red(float* out, int hidden) {
  for (int r = threadIdx.x; r < hidden; r += kThreads)
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(out + r), "f"(part_of(blockIdx.x, r))
                 : "memory");
}
__global__ void __launch_bounds__(kThreads, 3) k_red4(float* out, int hidden) {
  for (int r = 4 * threadIdx.x; r < hidden; r += 4 * kThreads) {
    const float a = part_of(blockIdx.x, r), b = part_of(blockIdx.x, r + 1);
    const float c = part_of(blockIdx.x, r + 2), d = part_of(blockIdx.x, r + 3);
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(out + r), "f"(a), "f"(b),
                 "f"(c), "f"(d)
                 : "memory");
  }
}
__global__ void __launch_bounds__(kThreads, 3) k_redi(unsigned long long* out, int hidden) {
  for (int r = threadIdx.x; r < hidden; r += kThreads) {
    const long long v = __float2ll_rn(part_of(blockIdx.x, r) * 4294967296.0f);
    asm volatile("red.global.add.u64 [%0], %1;" ::"l"(out + r), "l"(v) : "memory");
  }
}
__global__ void __launch_bounds__(kThreads, 3) k_part(float* part, int hidden) {
  for (int r = threadIdx.x; r < hidden; r += kThreads)
    part[int64_t(blockIdx.x) * hidden + r] = part_of(blockIdx.x, r);
}
// SPLIT threads a row (a power of two up to 32), each summing partials j = s + SPLIT u in order.
template <int SPLIT>
__global__ void k_sum(const float* part, int nb, int hidden, float* out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x, r = t / SPLIT, s = t % SPLIT;
  float acc = 0.0f;
  if (r < hidden)
    for (int j = s; j < nb; j += SPLIT) acc += __ldcg(part + int64_t(j) * hidden + r);
#pragma unroll
  for (int o = SPLIT / 2; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o, SPLIT);
  if (s == 0 && r < hidden) out[r] = acc;
}

template <class F>
float time_us(F&& f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < 20; ++i) f();
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return 1000.0f * ms / float(reps);
}

int main() {
  const int reps = 500;
  for (int hidden : {4096, 2048}) {
    for (int nb : {384, 192, 48}) {
      float *out, *part;
      unsigned long long* outi;
      CK(cudaMalloc(&out, hidden * sizeof(float)));
      CK(cudaMalloc(&outi, hidden * sizeof(unsigned long long)));
      CK(cudaMalloc(&part, size_t(nb) * hidden * sizeof(float)));
      const float none = time_us([&] { k_none<<<nb, kThreads>>>(out, hidden); }, reps);
      const float red = time_us([&] { k_red<<<nb, kThreads>>>(out, hidden); }, reps);
      const float red4 = time_us([&] { k_red4<<<nb, kThreads>>>(out, hidden); }, reps);
      const float redi = time_us([&] { k_redi<<<nb, kThreads>>>(outi, hidden); }, reps);
      const float pw = time_us([&] { k_part<<<nb, kThreads>>>(part, hidden); }, reps);
      auto sum = [&](auto kern, int split) {
        const int threads = 256, n = hidden * split;
        return time_us(
            [&] {
              k_part<<<nb, kThreads>>>(part, hidden);
              kern<<<(n + threads - 1) / threads, threads>>>(part, nb, hidden, out);
            },
            reps);
      };
      const float s8 = sum(k_sum<8>, 8), s16 = sum(k_sum<16>, 16), s32 = sum(k_sum<32>, 32);
      CK(cudaDeviceSynchronize());
      CK(cudaGetLastError());
      std::printf(
          "hidden %d, %d blocks: none %.2f  red %.2f  red4 %.2f  redi %.2f  part-write %.2f  "
          "part+sum split 8 %.2f / 16 %.2f / 32 %.2f us\n",
          hidden, nb, none, red, red4, redi, pw, s8, s16, s32);
      cudaFree(out), cudaFree(outi), cudaFree(part);
    }
  }
  return 0;
}
