// Whether programmatic dependent launch overlaps two kernels here, in a
// stream and in a captured graph: a one-block kernel spins 20 us, the next
// (launched with PDL) records when its blocks start, before grid_wait. A
// negative gap (start minus the first kernel's end) means overlap.
#include <cuda_runtime_api.h>

#include "bench/pdl_probe.h"
#include "kernels/cuda/launch.cuh"

namespace moetier::bench {
namespace {

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long ns, unsigned long long* t) {
  cuda::grid_wait();
  cuda::grid_launch_dependents();
  const unsigned long long t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
  t[0] = now_ns();
}

__global__ void start_kernel(unsigned long long* t) {
  const unsigned long long t0 = now_ns();
  cuda::grid_wait();
  cuda::grid_launch_dependents();
  if (threadIdx.x == 0) t[1] = t0;
}

void pair(unsigned long long* t, cudaStream_t s) {
  cuda::launch(spin_kernel, 1, 32, 0, s, 20000ull, t);
  cuda::launch(start_kernel, 1, 32, 0, s, t);
}

double gap_us(unsigned long long* d) {
  unsigned long long h[2] = {0, 0};
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  return (double(h[1]) - double(h[0])) * 1e-3;
}

}  // namespace

PdlProbe pdl_probe() {
  PdlProbe r;
  cudaStream_t s = nullptr;
  unsigned long long* d = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(&d, 2 * sizeof(unsigned long long)) != cudaSuccess)
    return r;
  pair(d, s);
  cudaStreamSynchronize(s);
  r.stream_gap_us = gap_us(d);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t e = nullptr;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  pair(d, s);
  if (cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&e, g, 0) == cudaSuccess) {
    cudaGraphLaunch(e, s);
    cudaStreamSynchronize(s);
    r.graph_gap_us = gap_us(d);
    r.ok = cudaGetLastError() == cudaSuccess;
  }
  if (e) cudaGraphExecDestroy(e);
  if (g) cudaGraphDestroy(g);
  cudaFree(d);
  cudaStreamDestroy(s);
  return r;
}

}  // namespace moetier::bench
