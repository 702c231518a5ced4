// The decode timeline's buffer (launch.cuh records into it; cuda.h declares
// trace_begin / trace_end). Every translation unit that includes launch.cuh
// has its own copy of the constant c_trace and registers a setter for it at
// static initialization (trace_setters); trace_begin and trace_end set them all.
#include <mutex>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

struct TraceState {
  std::mutex mu;
  TraceBuf buf{};
};
TraceState& state() {
  static TraceState s;
  return s;
}

void set_all(const TraceBuf& b) {
  for (auto* set : trace_setters()) set(b);
}

}  // namespace

bool trace_begin(size_t cap) {
#ifndef MOETIER_CUDA_TRACE_BUILD
  (void)cap;
  return false;  // the kernels record nothing (launch.cuh)
#else
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.buf.rows) return true;
  if (cap < 2 || cap >= (size_t(1) << 32)) return false;
  void* rows = nullptr;
  void* n = nullptr;
  const unsigned long long first = 1;
  const bool ok = cudaMalloc(&rows, cap * sizeof(TraceRow)) == cudaSuccess &&
                  cudaMalloc(&n, sizeof first) == cudaSuccess &&
                  cudaMemcpy(n, &first, sizeof first, cudaMemcpyHostToDevice) == cudaSuccess &&
                  cudaMemset(rows, 0, cap * sizeof(TraceRow)) == cudaSuccess;
  if (!ok) {
    cudaFree(rows);
    cudaFree(n);
    return false;
  }
  s.buf = TraceBuf{static_cast<TraceRow*>(rows), static_cast<unsigned long long*>(n), cap};
  set_all(s.buf);
  return true;
#endif
}

// Marks (trace_mark) carry only their time and id: the rest is their block's
// row, id rows before; reserved rows never written (zero) are dropped.
std::vector<TraceRow> trace_end(size_t* wanted) {
  TraceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<TraceRow> out;
  if (wanted) *wanted = 0;
  if (!s.buf.rows) return out;
  cudaDeviceSynchronize();
  unsigned long long n = 0;
  if (cudaMemcpy(&n, s.buf.n, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess) {
    if (wanted) *wanted = size_t(n - 1);
    out.resize(size_t(n < s.buf.cap ? n : s.buf.cap));
    if (cudaMemcpy(out.data(), s.buf.rows, out.size() * sizeof(TraceRow), cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      out.clear();
  }
  std::vector<TraceRow> kept;
  kept.reserve(out.size());
  for (size_t i = 1; i < out.size(); ++i) {
    TraceRow r = out[i];
    if (r.blocks == 0 && r.pad > 0 && r.pad < i && out[i - r.pad].blocks > 0) {
      const TraceRow& b = out[i - r.pad];
      r.grid = b.grid, r.block = b.block, r.blocks = b.blocks, r.sm = b.sm;
    }
    if (r.blocks > 0) kept.push_back(r);
  }
  out.swap(kept);
  const TraceBuf old = s.buf;
  s.buf = TraceBuf{};
  set_all(s.buf);
  cudaFree(old.rows);
  cudaFree(old.n);
  return out;
}

}  // namespace moetier::cuda
