// Loads of the weight streams (the decode kernels' weight rows and e8m0
// scales): on sm_80 and later they carry an evict-first L2 policy, so the
// ~100 MB of weights a DeepSeek-shaped layer streams do not push the kernels'
// code, the KV cache, the norms, the expert tables and the activations out of
// L2, and the register loads do not allocate in L1 (read once), which keeps
// L1 for the activations every warp reads. Decode of the DeepSeek-shaped model
// was 2.0% faster with the L2 policy and 3.0% with both, one H100, stop 51
// (docs/cuda.md). A build configured with -DMOETIER_CUDA_L2_PLAIN=ON (A/B), or
// for an older architecture, gets plain __ldg / cp.async.cg; -DMOETIER_CUDA_L1_ALLOC
// (a compile definition) keeps the L2 policy and allocates in L1. The values
// loaded are the same either way.
//
// The register loads are not volatile asm (CUDA's own __ldg is), so the
// compiler may schedule them before a kernel's grid_wait() where their
// address allows. That is sound under the PDL protocol (launch.cuh): no
// kernel of a decode step writes weights, and a routed expert's address
// comes from ids read after the wait or two launches back, so its loads
// cannot move above the read of those ids.
#pragma once

#include <cstdint>

namespace moetier::cuda {

#if defined(MOETIER_CUDA_L1_ALLOC)
#define MOETIER_LDW "ld.global.nc.L2::cache_hint"
#else
#define MOETIER_LDW "ld.global.nc.L1::no_allocate.L2::cache_hint"
#endif

#if !defined(MOETIER_CUDA_L2_PLAIN) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint4 ldg_w(const uint4* a) {
  uint4 v;
  asm(MOETIER_LDW ".v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(a), "l"(l2_evict_first()));
  return v;
}
__device__ __forceinline__ float4 ldg_w(const float4* a) {
  float4 v;
  asm(MOETIER_LDW ".v4.f32 {%0, %1, %2, %3}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(a), "l"(l2_evict_first()));
  return v;
}
__device__ __forceinline__ uint8_t ldg_w(const uint8_t* a) {
  uint16_t v;
  asm(MOETIER_LDW ".u8 %0, [%1], %2;" : "=h"(v) : "l"(a), "l"(l2_evict_first()));
  return uint8_t(v);
}
// 16 bytes global -> shared by cp.async (L2 only), evict-first.
__device__ __forceinline__ void cp_async16_w(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(smem),
               "l"(gmem), "l"(l2_evict_first())
               : "memory");
}
#else
template <typename T>
__device__ __forceinline__ T ldg_w(const T* a) {
  return __ldg(a);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16_w(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
#endif
#endif
#undef MOETIER_LDW

}  // namespace moetier::cuda
