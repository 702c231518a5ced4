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
//    decode_q8.cu; the predicted experts of cuda_predict.cpp, whose o
//    projection reads q/k/v's logits and writes the ids before its wait, which
//    only the router, after its wait, and gate/up, one launch later, read):
//    what a kernel two or more launches back wrote may be read
//    before the wait, through L2 (ld.global.cg), and scratch that only later
//    kernels of the sequence read may be written: that kernel has completed,
//    because the one in between calls grid_launch_dependents only after its
//    own grid_wait.
//    This holds while no kernel triggers before its wait and the kernel in
//    between writes nothing the early reads read (the router writes only its
//    probs, ids and weights, and with RouterQ8 x's q8 blocks, which gate/up
//    reads after its wait; x is the router's input);
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

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda.h"

namespace moetier::cuda {

// Decode timeline (MOETIER_CUDA_TRACE, a measurement aid; cuda.h trace_begin):
// while a buffer is set, thread 0 of every block of a kernel that calls
// grid_wait() records a TraceRow: its launch (%gridid), and %globaltimer on
// entering and on leaving the wait. The row's slot is taken (atomicAdd) before
// the wait and written after it, so the block's work after the wait is not
// delayed by the count's round trip. c_trace lives in each translation unit
// that includes this header (no relocatable device code); each copy is set by
// the setter it registers in trace_setters() (trace.cu sets them). Only a build
// configured with -DMOETIER_CUDA_TRACE=ON (MOETIER_CUDA_TRACE_BUILD) records:
// the recording's instructions in every wait cost the DeepSeek-shaped decode
// 4% even while off (docs/cuda.md).
struct TraceBuf {          // all null / 0: not recording
  TraceRow* rows;          // [cap]; row 0 unused (slot 0 means "none")
  unsigned long long* n;   // the next free row, from 1; it may pass cap (rows dropped)
  unsigned long long cap;  // below 2^32
};
// The setters of every translation unit's c_trace (an inline function: one
// registry in a program, whichever of its objects include this header; empty
// in a build without the recording).
inline std::vector<void (*)(const TraceBuf&)>& trace_setters() {
  static std::vector<void (*)(const TraceBuf&)> s;
  return s;
}
#ifdef MOETIER_CUDA_TRACE_BUILD
static __constant__ TraceBuf c_trace;
namespace {
struct TraceSetter {
  TraceSetter() {
    trace_setters().push_back([](const TraceBuf& b) { cudaMemcpyToSymbol(c_trace, &b, sizeof b); });
  }
};
[[maybe_unused]] TraceSetter g_trace_setter;
}  // namespace
#endif

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// %globaltimer where the trace build records (thread 0; else 0): a kernel's
// start, given to grid_wait (TraceRow::t_start).
__device__ __forceinline__ unsigned long long trace_clock() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(MOETIER_CUDA_TRACE_BUILD)
  if (c_trace.rows != nullptr && threadIdx.x + threadIdx.y + threadIdx.z == 0) return global_ns();
#endif
  return 0;
}

// grid_wait<M>() also reserves M more rows for trace_mark(slot, 1..M) and
// returns the slot (thread 0, while recording; else 0). t_start: the
// kernel's trace_clock() at its start, recorded with the row (0: none).
template <int M = 0>
__device__ __forceinline__ unsigned grid_wait(unsigned long long t_start = 0) {
  (void)t_start;
  unsigned slot = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(MOETIER_CUDA_TRACE_BUILD)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool tr = c_trace.rows != nullptr && threadIdx.x + threadIdx.y + threadIdx.z == 0;
  unsigned long long t0 = 0, at = 0;
  // The count is the trace's own: written before the wait, read by nothing of the step.
  if (tr) t0 = global_ns(), at = atomicAdd(c_trace.n, 1ull + M);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (tr && at < c_trace.cap && c_trace.cap - at > M) {
    slot = unsigned(at);
    unsigned long long g;
    unsigned sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    c_trace.rows[slot] = TraceRow{g,
                                  t0,
                                  global_ns(),
                                  blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
                                  gridDim.x * gridDim.y * gridDim.z,
                                  sm,
                                  0,
                                  t_start};
  } else {
    slot = 0;
  }
#endif
  return slot;
}

// Records the time this block's thread 0 reaches mark id (1..M of the
// grid_wait<M>() that returned slot) into the row reserved for it (only the
// time and id: no load on the block's path; trace_end copies the rest from
// the block's row, slot).
__device__ __forceinline__ void trace_mark(unsigned slot, unsigned id) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(MOETIER_CUDA_TRACE_BUILD)
  if (slot == 0 || threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
  const unsigned long long t = global_ns();
  c_trace.rows[slot + id] = TraceRow{0, t, t, 0, 0, 0, id, 0};  // trace_end fills in the rest
#endif
}

__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether this block is the last of n to arrive at the counter *ctr (the
// caller's last block resets it to 0 when done). Every thread of the block calls it;
// what any of them wrote before the call is visible to every thread of the
// last block after it: a barrier orders the writes before thread 0's
// acquire-release add at gpu scope, and in the last block a barrier after
// that add orders it before the reads (a counted semaphore, as CUTLASS's
// barrier: one gpu-scope atomic a block, no fence in every thread).
__device__ __forceinline__ bool last_block_arrive(unsigned* ctr, unsigned n) {
  __shared__ unsigned last;
  __syncthreads();
  if (threadIdx.x + threadIdx.y + threadIdx.z == 0) {
    unsigned old = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(ctr) : "memory");
#else
    __threadfence();
    old = atomicAdd(ctr, 1u);
    __threadfence();
#endif
    last = old == n - 1 ? 1u : 0u;
  }
  __syncthreads();
  return last != 0;
}

#ifndef MOETIER_CUDA_MIN_ARCH
#define MOETIER_CUDA_MIN_ARCH 0
#endif

// Whether launch() asks for PDL (MOETIER_CUDA_PDL=0 turns it off; read once).
bool pdl_enabled();
// The shared-memory carveout every kernel started by launch() asks for, in
// percent of the largest (set once per kernel, at its first launch; cuda.h
// set_carveout). An SM runs blocks of several kernels at once only under one
// split of its L1 and shared memory, so a PDL launch whose kernel's carveout
// differs from the running kernel's becomes resident only as that kernel's
// blocks leave their SMs (docs/cuda.md, "The carveout").
void apply_carveout(const void* kernel);

// compute(device) for the current device, computed once per device ordinal
// and kept (0 where the device is unknown); one cache per F (each caller's
// lambda). Threads that reach a device first at the same time each compute
// and store the same value (relaxed atomics: the race is defined, harmless).
template <typename F>
int per_device_once(F compute) {
  static std::atomic<int> cache[64]{};  // per device ordinal: 0 unread, else value + 1
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  int c = cache[dev].load(std::memory_order_relaxed);
  if (c == 0) {
    c = compute(dev) + 1;
    cache[dev].store(c, std::memory_order_relaxed);
  }
  return c - 1;
}

// The current device's multiprocessor count (0 where unknown; an inline
// function: one cache in a program).
inline int current_device_sms() {
  return per_device_once([](int dev) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? n : 0;
  });
}

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed =
      MOETIER_CUDA_MIN_ARCH >= 90 && pdl_enabled() ? 1 : 0;
  apply_carveout(reinterpret_cast<const void*>(kernel));
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
