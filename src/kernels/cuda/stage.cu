// stage_experts: a later layer's predicted experts copied from host memory
// (read in place over PCIe) into device staging slots, and that layer's
// shadow table (its table with the staged entries pointing at the slots).
#include "kernels/cuda/cuda.h"

namespace moetier::cuda {
namespace {

// Bytes [0, n) of src -> dst by the threads of blocks [0, nblocks) (thread
// index t of nt), 16 at a time where both are 16-byte aligned, four loads in
// flight per thread.
__device__ void copy_bytes(uint8_t* dst, const uint8_t* src, size_t n, size_t t, size_t nt) {
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const size_t n16 = n / 16;
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    size_t i = t;
    for (; i + 3 * nt < n16; i += 4 * nt) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcs(s + i + u * nt);  // streaming: read once
#pragma unroll
      for (int u = 0; u < 4; ++u) d[i + u * nt] = v[u];
    }
    for (; i < n16; i += nt) d[i] = __ldcs(s + i);
    done = n16 * 16;
  }
  for (size_t i = done + t; i < n; i += nt) dst[i] = src[i];
}

// Grid (blocks per expert, k): blockIdx.y = predicted slot j. Block (0, 0)
// also writes the shadow table and the staged list.
__global__ void stage_experts_kernel(StageLaunch a) {
  const int j = int(blockIdx.y);
  const int id = a.ids[j];
  if (blockIdx.x == 0 && j == 0) {
    for (int e = int(threadIdx.x); e < a.num_experts; e += int(blockDim.x))
      a.shadow[e] = a.table[e];
    __syncthreads();
    if (threadIdx.x < unsigned(a.k)) {
      const int jj = int(threadIdx.x), pid = a.ids[jj];
      const bool host = a.host && a.host[pid] != 0;
      if (host) {
        uint8_t* slot = a.staging + size_t(jj) * a.slot_bytes;
        const ExpertPtrs& src = a.table[pid];
        ExpertPtrs p{};
        for (int r = 0; r < 3; ++r) {
          p.w[r] = src.w[r] ? slot + a.offset[r] : nullptr;
          p.s[r] = src.s[r] ? slot + a.offset[3 + r] : nullptr;
        }
        a.shadow[pid] = p;
      }
      if (a.staged) a.staged[jj] = host ? pid : -2 - pid;
    }
  }
  if (!a.host || !a.host[id]) return;
  const ExpertPtrs& src = a.table[id];
  uint8_t* slot = a.staging + size_t(j) * a.slot_bytes;
  const size_t t = size_t(blockIdx.x) * blockDim.x + threadIdx.x,
               nt = size_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < 6; ++r) {
    const auto* s = static_cast<const uint8_t*>(r < 3 ? src.w[r] : src.s[r - 3]);
    if (s) copy_bytes(slot + a.offset[r], s, a.bytes[r], t, nt);
  }
}

}  // namespace

void stage_experts(const StageLaunch& a, cudaStream_t s) {
  // A plain launch: it reads the ids the kernel before it wrote.
  stage_experts_kernel<<<dim3(a.blocks, unsigned(a.k)), 256, 0, s>>>(a);
}

}  // namespace moetier::cuda
