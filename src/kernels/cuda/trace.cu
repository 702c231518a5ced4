// The decode timeline's buffer (launch.cuh records into it; cuda.h declares
// trace_begin / trace_end). Every translation unit that includes launch.cuh
// has its own copy of the constant c_trace and registers a setter for it at
// static initialization; trace_begin and trace_end set them all.
#include <mutex>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

struct TraceState {
  std::mutex mu;
  std::vector<void (*)(const TraceBuf&)> setters;
  TraceBuf buf{};
};
TraceState& state() {
  static TraceState s;
  return s;
}

void set_all(TraceState& s) {
  for (auto* set : s.setters) set(s.buf);
}

}  // namespace

void trace_register(void (*set)(const TraceBuf&)) {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.setters.push_back(set);
}

bool trace_begin(size_t cap) {
#ifndef MOETIER_CUDA_TRACE_BUILD
  (void)cap;
  return false;  // the kernels record nothing (launch.cuh)
#endif
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.buf.rows) return true;
  void* rows = nullptr;
  void* n = nullptr;
  if (cudaMalloc(&rows, cap * sizeof(TraceRow)) != cudaSuccess) return false;
  if (cudaMalloc(&n, sizeof(unsigned)) != cudaSuccess || cudaMemset(n, 0, sizeof(unsigned)) ||
      cudaMemset(rows, 0, cap * sizeof(TraceRow))) {
    cudaFree(rows);
    return false;
  }
  s.buf = TraceBuf{static_cast<TraceRow*>(rows), static_cast<unsigned*>(n), unsigned(cap)};
  set_all(s);
  return true;
}

std::vector<TraceRow> trace_end() {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<TraceRow> out;
  if (!s.buf.rows) return out;
  cudaDeviceSynchronize();
  unsigned n = 0;
  if (cudaMemcpy(&n, s.buf.n, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess) {
    out.resize(n < s.buf.cap ? n : s.buf.cap);
    if (cudaMemcpy(out.data(), s.buf.rows, out.size() * sizeof(TraceRow), cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      out.clear();
  }
  // Marks (trace_mark) carry only their time and id: the rest is their block's
  // row, id rows before; reserved rows never written (memset) are dropped.
  std::vector<TraceRow> kept;
  kept.reserve(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    TraceRow r = out[i];
    if (r.blocks == 0 && r.pad > 0 && r.pad <= i && out[i - r.pad].blocks > 0) {
      const TraceRow& b = out[i - r.pad];
      r.grid = b.grid, r.block = b.block, r.blocks = b.blocks, r.sm = b.sm;
    }
    if (r.blocks > 0) kept.push_back(r);
  }
  out.swap(kept);
  const TraceBuf old = s.buf;
  s.buf = TraceBuf{};
  set_all(s);
  cudaFree(old.rows);
  cudaFree(old.n);
  return out;
}

}  // namespace moetier::cuda
