// Programmatic dependent launch (PDL, sm_90+) for the decode kernels.
//
// launch() starts a kernel with cudaLaunchAttributeProgrammaticStreamSerialization,
// so that it may be scheduled while the kernel before it in the stream is
// still running (its blocks sit resident and can read weights). Protocol, for
// every kernel started by launch():
//  - every thread calls grid_wait() before it reads anything an earlier kernel
//    wrote and before its first global write (griddepcontrol.wait returns once
//    the previous kernel has completed and its writes are visible). Only
//    weights, which no kernel writes, may be read before it. One exception,
//    for launchers that know their sequence (route_moe_resident in
//    decode_q8.cu): what a kernel two or more launches back wrote may be read
//    before the wait, through L2 (ld.global.cg), and scratch that only later
//    kernels of the sequence read may be written: that kernel has completed,
//    because the one in between calls grid_launch_dependents only after its
//    own grid_wait.
//    This holds while no kernel triggers before its wait and the kernel in
//    between writes nothing the early reads read (the router writes only its
//    probs, ids and weights; x is the router's input);
//  - every thread calls grid_wait() unconditionally, before any early return:
//    a grid that could complete without waiting would let the kernel after it
//    run before the one before it has finished (the chain is transitive only
//    because each grid completes after its predecessor);
//  - grid_launch_dependents() comes right after grid_wait(), so at most two
//    grids (the running one and the next, waiting) hold resources at once.
//    (A persistent kernel with a grid barrier would have to call it only after
//    its barrier: a dependent started before every block of a persistent grid
//    is resident could hold the SM a missing block needs.)
// Outside a PDL launch (<<<>>>, or MOETIER_CUDA_PDL=0) both are no-ops.
// Below sm_90 they compile to nothing, so launch() asks for PDL only when the
// build targets sm_90 or later alone (MOETIER_CUDA_MIN_ARCH, from CMake's
// CMAKE_CUDA_ARCHITECTURES): a kernel JIT-compiled from older PTX would not wait.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

namespace moetier::cuda {

__device__ __forceinline__ void grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#ifndef MOETIER_CUDA_MIN_ARCH
#define MOETIER_CUDA_MIN_ARCH 0
#endif

// Whether launch() asks for PDL (MOETIER_CUDA_PDL=0 turns it off; read once).
bool pdl_enabled();

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed =
      MOETIER_CUDA_MIN_ARCH >= 90 && pdl_enabled() ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);  // checked by the backend
}

}  // namespace moetier::cuda
