// Asynchronous 16-byte copies global -> shared (cp.async, sm_80+; a plain
// copy below): each thread commits its copies as groups and waits for all of
// its groups but the newest N. A thread sees only its own copies after its
// wait: other threads' copies need a barrier after their waits.
#pragma once
#include <cstdint>

namespace moetier::cuda {

// 16 bytes global -> shared, asynchronously (L2 only); committed as one group
// per pass (cp_async_commit), waited for with cp_async_wait<N> (all of this
// thread's groups but the newest N).
__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
  *smem = __ldg(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// cp_async_wait<n> for n in [0, 3] given at run time (constant-folded where
// the caller's loop is unrolled): all of this thread's groups but the newest n.
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  if (n >= 3)
    cp_async_wait<3>();
  else if (n == 2)
    cp_async_wait<2>();
  else if (n == 1)
    cp_async_wait<1>();
  else
    cp_async_wait<0>();
}

}  // namespace moetier::cuda
