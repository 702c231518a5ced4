// The CUDA backend: plain device allocations (never managed memory), one
// non-blocking stream, cuBLAS for large matrix products, kernels/cuda for
// everything else.
//
// Precision: chunks of at most kGemvMax tokens (decode, short prompts) run
// the f32-activation kernels (the CPU's numerics up to summation order);
// longer chunks run bf16 tensor-core GEMMs with f32 accumulation (activations
// and weights rounded to bf16), as llama.cpp and vLLM do for prefill.
// MOETIER_CUDA_PREFILL=f32 keeps every chunk on the f32 path (tests).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "kernels/cb3.h"
#include "kernels/cuda/cuda.h"
#include "kernels/matview.h"

namespace moetier {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda: {}: {}", what, cudaGetErrorString(e));
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cublas: {}: status {}", what, int(s));
}

size_t scale_bytes(const MatView& w) {
  if (w.enc == WeightEncoding::MXFP4) return size_t(w.rows * (w.cols / 32));
  if (w.enc == WeightEncoding::CB3) return size_t(w.rows * 16);
  return 0;
}

CudaBackend::CudaBackend(int device) : device_(device) {
  const int n = cuda_device_count();
  check(device >= 0 && device < n, "--backend cuda:{}: {} CUDA devices present", device, n);
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp p{};
  cuda_check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  name_ = fmt::format("cuda:{} ({})", device, p.name);
  total_mem_ = p.totalGlobalMem;
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_blas(cublasCreate(&blas_), "cublasCreate");
  check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
  read_switches();
  unified_addressing_ = p.unifiedAddressing != 0;
  cuda_check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "copy stream");
  for (cudaEvent_t* e : {&copy_start_, &writes_done_})
    cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  sync_ = alloc(sizeof(Sync));
  cuda_check(cudaMemsetAsync(sync_.data(), 0, sizeof(Sync), stream_), "block counters");
  cuda_check(cudaStreamSynchronize(stream_), "block counters");
}

void CudaBackend::time_op(const std::string& what) {
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreate(&e), "timing event");
  cuda_check(cudaEventRecord(e, stream_), "timing event");
  marks_.emplace_back(what, e);
  if (marks_.size() >= 2048) flush_timing(false);
}

void CudaBackend::flush_timing(bool write) {
  if (!marks_.empty()) {
    cudaEventSynchronize(marks_.back().second);
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second);
      auto& t = op_time_[marks_[i].first];
      t.first += ms, ++t.second;
    }
    for (size_t i = 0; i + 1 < marks_.size(); ++i) cudaEventDestroy(marks_[i].second);
    marks_.erase(marks_.begin(), marks_.end() - 1);
  }
  if (!write) return;
  std::string out;
  for (const auto& [name, t] : op_time_)
    out += fmt::format("{:>12.1f} us {:>8} x {:>9.2f} us  {}\n", 1000 * t.first, t.second,
                       1000 * t.first / double(t.second), name);
  write_file_atomic(timing_path_, out);
}

namespace {

using cuda::TraceRow;

// The marks (trace_mark) of grid g between t0 and t1: [first, last) of marks
// (sorted by grid, then time).
std::pair<size_t, size_t> marks_in(const std::vector<TraceRow>& marks, unsigned long long g,
                                   unsigned long long t0, unsigned long long t1) {
  auto key = [](const TraceRow& r, const std::pair<unsigned long long, unsigned long long>& k) {
    return r.grid < k.first || (r.grid == k.first && r.t_enter < k.second);
  };
  const auto a = std::lower_bound(marks.begin(), marks.end(), std::pair(g, t0), key);
  const auto b = std::lower_bound(a, marks.end(), std::pair(g, t1), key);
  return {size_t(a - marks.begin()), size_t(b - marks.begin())};
}

// For those marks: the last block's time at each mark, in us after leave
// (" id:us" each).
std::string trace_marks(const std::vector<TraceRow>& marks, std::pair<size_t, size_t> range,
                        unsigned long long leave) {
  std::map<unsigned, unsigned long long> last;
  for (size_t i = range.first; i < range.second; ++i)
    last[marks[i].pad] = std::max(last[marks[i].pad], marks[i].t_enter);
  std::string out;
  for (const auto& [id, t] : last)
    out += fmt::format(" {}:{:.2f}", id, (double(t) - double(leave)) / 1e3);
  return out;
}

}  // namespace

// One line per launch, in order of its first block's entry: its node
// (%gridid, the same for each replay of a graph node; the replays of a node
// are its rows in entry order, a grid's worth at a time: replays run one after
// another), grid size, blocks recorded, the first / median / last block's
// entering and the first / last block's leaving of grid_wait, in ns from the
// first row, and its marks. FILE.rows: the second-to-last replay's rows of each node.
void CudaBackend::write_trace() {
  size_t wanted = 0;
  std::vector<TraceRow> rows = cuda::trace_end(&wanted), marks;
  if (wanted >= rows.size() + 64)  // (plus the reserved mark rows never written)
    std::fprintf(stderr,
                 "moetier: warning: MOETIER_CUDA_TRACE: %zu rows asked for, the first kept "
                 "(MOETIER_CUDA_TRACE_ROWS for more)\n",
                 wanted);
  if (rows.empty()) return;
  auto by_time = [](const TraceRow& a, const TraceRow& b) {
    return a.grid < b.grid || (a.grid == b.grid && a.t_enter < b.t_enter);
  };
  unsigned long long t0 = rows[0].t_enter;
  for (const auto& r : rows)
    t0 = std::min(t0, r.t_start ? std::min(r.t_start, r.t_enter) : r.t_enter);
  auto mk =
      std::stable_partition(rows.begin(), rows.end(), [](const TraceRow& r) { return r.pad == 0; });
  marks.assign(mk, rows.end());
  rows.erase(mk, rows.end());
  std::sort(rows.begin(), rows.end(), by_time);
  std::sort(marks.begin(), marks.end(), by_time);
  std::vector<std::pair<unsigned long long, std::string>> out;
  std::string raw = "grid,block,blocks,sm,mark,enter,leave,start\n";
  auto row = [&](const TraceRow& r) {  // start: the kernel's start where recorded, else empty
    raw += fmt::format("{},{},{},{},{},{},{},{}\n", r.grid, r.block, r.blocks, r.sm, r.pad,
                       r.t_enter - t0, r.t_leave - t0,
                       r.t_start ? fmt::format("{}", r.t_start - t0) : std::string());
  };
  for (size_t i = 0; i < rows.size();) {
    size_t end = i;
    while (end < rows.size() && rows[end].grid == rows[i].grid) ++end;
    const size_t per = std::max<size_t>(rows[i].blocks, 1), reps = (end - i + per - 1) / per;
    for (size_t rep = 0; rep < reps; ++rep) {
      const size_t a = i + rep * per, b = std::min(end, a + per);
      const unsigned long long next = b < end ? rows[b].t_enter : ~0ull;
      unsigned long long l0 = rows[a].t_leave, l1 = l0;
      for (size_t k = a; k < b; ++k) {
        l0 = std::min(l0, rows[k].t_leave), l1 = std::max(l1, rows[k].t_leave);
        if (rep + 2 == reps) row(rows[k]);
      }
      const auto range = marks_in(marks, rows[a].grid, rows[a].t_enter, next);
      if (rep + 2 == reps)
        for (size_t k = range.first; k < range.second; ++k) row(marks[k]);
      out.emplace_back(
          rows[a].t_enter,
          fmt::format("{},{},{},{},{},{},{},{},{}\n", rows[a].grid, rows[a].blocks, b - a,
                      rows[a].t_enter - t0, rows[a + (b - a) / 2].t_enter - t0,
                      rows[b - 1].t_enter - t0, l0 - t0, l1 - t0, trace_marks(marks, range, l0)));
    }
    i = end;
  }
  std::sort(out.begin(), out.end());
  std::string csv = "grid,blocks,rows,enter_min,enter_med,enter_max,leave_min,leave_max,marks\n";
  for (const auto& l : out) csv += l.second;
  write_file_atomic(trace_path_, csv);
  write_file_atomic(trace_path_ + ".rows", raw);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  if (!trace_path_.empty()) {
    try {
      write_trace();
    } catch (const std::exception&) {  // a measurement aid never takes the run down
    }
  }
  if (!timing_path_.empty()) {
    try {
      flush_timing(true);
    } catch (const std::exception&) {  // a measurement aid never takes the run down
    }
    for (auto& m : marks_) cudaEventDestroy(m.second);
  }
  // Everything this backend owns goes before the stream it was used on.
  for (Scratch* s : {&ids_, &attn_, &arrays_, &h_, &d_, &wbf_, &xbf_, &g_, &u_, &hbf_, &y_, &rows_,
                     &rw_, &prep_, &q8_, &stage_x_, &stage_route_, &staging_[0], &staging_[1]})
    s->buf.reset();
  sync_.reset();
  tables_.clear();
  for (cudaGraphExec_t g : graphs_)
    if (g) cudaGraphExecDestroy(g);
  for (cudaGraphExec_t g : spare_graphs_) cudaGraphExecDestroy(g);
  step_dev_.reset(), step_host_.reset(), step_ring_.reset();
  for (cudaEvent_t e : step_done_)
    if (e) cudaEventDestroy(e);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_), cudaStreamDestroy(copy_stream_);
  copy_stream_ = nullptr;
  if (writes_done_) cudaEventSynchronize(writes_done_);
  writes_host_.reset();
  for (cudaEvent_t e : {copy_start_, writes_done_})
    if (e) cudaEventDestroy(e);
  for (const auto& c : copy_events_) cudaEventDestroy(c.second);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (stage_stream_) cudaStreamSynchronize(stage_stream_), cudaStreamDestroy(stage_stream_);
  for (const auto& [table, j] : stage_join_) cudaEventDestroy(j.first);
  if (stage_fork_) cudaEventDestroy(stage_fork_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

DeviceBuffer CudaBackend::alloc(size_t bytes) {
  check(!recording_,
        "cuda graph: {} of device memory asked for while recording a decode step "
        "(a step run before must size every buffer)",
        format_bytes(bytes));
  void* p = nullptr;
  const size_t asked = std::max<size_t>(bytes, 256);
  const cudaError_t e = cudaMalloc(&p, asked);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    fail("{}: cannot allocate {} of device memory ({} free of {}): {}", name_, format_bytes(bytes),
         format_bytes(free_b), format_bytes(total), cudaGetErrorString(e));
  }
  memory_.on_alloc(p, asked);
  return DeviceBuffer(this, p, bytes);
}

DeviceBuffer CudaBackend::alloc_host(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 4096));
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("{}: cannot allocate {} of pinned host memory: {}", name_, format_bytes(bytes),
         cudaGetErrorString(e));
  }
  return DeviceBuffer(this, p, bytes);
}

void CudaBackend::release(void* p, size_t) {
  if (stream_) cudaStreamSynchronize(stream_);            // ops issued before may still use it
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);  // and copies
  if (stage_stream_) cudaStreamSynchronize(stage_stream_);
  memory_.on_release(p);  // alloc()'s only (alloc_host's are not counted)
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost)
    cudaFreeHost(p);
  else
    cudaFree(p);
  cudaGetLastError();
}

void CudaBackend::to_device(void* dst, const void* src, size_t n) {
  cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_), "copy to device");
  cudaPointerAttributes a{};
  // Pinned sources are copied asynchronously: wait so that the caller may
  // reuse src on return (pageable sources are staged before the call returns).
  if (cudaPointerGetAttributes(&a, src) == cudaSuccess && a.type == cudaMemoryTypeHost)
    synchronize();
  cudaGetLastError();
}

uint64_t CudaBackend::to_device_async(void* dst, const void* src, size_t n) {
  check(!recording_, "cuda graph: an overlapped copy while recording a decode step");
  cuda_check(cudaEventRecord(copy_start_, stream_), "copy order");
  cuda_check(cudaStreamWaitEvent(copy_stream_, copy_start_, 0), "copy order");
  cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, copy_stream_),
             "overlapped copy to device");
  cudaEvent_t e = pooled_event();
  copy_events_.emplace_back(++copies_issued_, e);  // owned by the list before the record
  cuda_check(cudaEventRecord(e, copy_stream_), "copy done");
  return copies_issued_;
}

cudaEvent_t CudaBackend::pooled_event() {
  cudaEvent_t e = nullptr;
  if (free_events_.empty()) {
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  } else {
    e = free_events_.back();
    free_events_.pop_back();
  }
  return e;
}

bool CudaBackend::copy_done(uint64_t n) {
  while (!copy_events_.empty() && copies_seen_done_ < n) {
    const cudaError_t r = cudaEventQuery(copy_events_.front().second);
    if (r == cudaErrorNotReady) break;
    cuda_check(r, "overlapped copies");
    copies_seen_done_ = copy_events_.front().first;
    free_events_.push_back(copy_events_.front().second);
    copy_events_.pop_front();
  }
  return n <= copies_seen_done_ || copy_events_.empty();
}

void CudaBackend::wait_copies() {
  cuda_check(cudaStreamSynchronize(copy_stream_), "copy wait");
  for (const auto& c : copy_events_) free_events_.push_back(c.second);
  copy_events_.clear();
  copies_seen_done_ = copies_issued_;
}

void CudaBackend::to_host(void* dst, const void* src, size_t n) {
  cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_), "copy to host");
  synchronize();
}

void CudaBackend::copy(void* dst, const void* src, size_t n) {
  cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_), "device copy");
}

MatView CudaBackend::weights(const MatView& host, WeightStore& store) {
  kernels::check_matview(host, "cuda weights");
  MatView d = host;
  const size_t bytes = size_t(kernels::row_bytes(host) * host.rows);
  store.buffers.push_back(alloc(bytes));
  cuda_check(cudaMemcpy(store.buffers.back().data(), host.data, bytes, cudaMemcpyHostToDevice),
             "upload weights");
  d.data = store.buffers.back().data();
  if (const size_t sb = scale_bytes(host)) {
    store.buffers.push_back(alloc(sb));
    cuda_check(cudaMemcpy(store.buffers.back().data(), host.scales, sb, cudaMemcpyHostToDevice),
               "upload scales");
    d.scales = store.buffers.back().as<uint8_t>();
  }
  return d;
}

const float* CudaBackend::vector(std::span<const float> host, WeightStore& store) {
  store.buffers.push_back(alloc(host.size() * sizeof(float)));
  cuda_check(cudaMemcpy(store.buffers.back().data(), host.data(), host.size() * sizeof(float),
                        cudaMemcpyHostToDevice),
             "upload vector");
  return store.buffers.back().as<float>();
}

void CudaBackend::embed(const MatView& table, std::span<const int32_t> tokens, float* out) {
  if (recording_) {  // the token comes from the step slot at replay
    check(tokens.size() == 1, "cuda graph: a decode step embeds one token, not {}", tokens.size());
    const auto* tok =
        reinterpret_cast<const int32_t*>(step_dev_.as<char>() + offsetof(StepArgs, token));
    return cuda::embed(table, tok, 1, out, stream_), after("embed");
  }
  auto* ids = static_cast<int32_t*>(ids_.get(*this, tokens.size() * sizeof(int32_t)));
  to_device(ids, tokens.data(), tokens.size() * sizeof(int32_t));
  cuda::embed(table, ids, int64_t(tokens.size()), out, stream_), after("embed");
}

const int64_t* CudaBackend::step_pos(int64_t pos) const {
  if (!recording_) return nullptr;
  check(pos == record_pos_, "cuda graph: an op at position {} while recording step {}", pos,
        record_pos_);
  return step_dev_.as<int64_t>();
}

void CudaBackend::graph_begin(int64_t pos, int64_t max_positions) {
  check(!recording_, "cuda graph: already recording");
  if (!step_dev_.data()) {
    step_dev_ = alloc(sizeof(StepArgs));
    step_host_ = alloc_host(sizeof(StepArgs));
    step_ring_ = alloc_host(2 * sizeof(int32_t));
    for (cudaEvent_t& e : step_done_)
      cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "step event");
  }
  // Attention's split scratch for any step up to max_positions (heads <= 128,
  // head_dim <= 256): nothing may be allocated while recording.
  attn_.get(*this, size_t(cuda::attention_scratch_floats(1, max_positions, 128, 256)) * 4);
  recording_ = true;
  record_pos_ = pos;
  record_max_ = max_positions;
  join_staged();  // (stagings of a plain step that threw: joined outside the capture)
  cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
}

int CudaBackend::graph_end() {
  check(recording_, "cuda graph: not recording");
  join_staged();  // every branch joined before the capture ends
  recording_ = false;
  cudaGraph_t g = nullptr;
  cuda_check(cudaStreamEndCapture(stream_, &g), "end capture");
  cudaGraphExec_t exec = nullptr;
  while (!exec && !spare_graphs_.empty()) {  // a dropped graph updated to this one
    cudaGraphExec_t spare = spare_graphs_.back();
    spare_graphs_.pop_back();
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(spare, g, &info) == cudaSuccess) {
      exec = spare;
      ++graph_counts_.updated;
    } else {  // another shape of step: instantiate instead
      (void)cudaGetLastError();
      cudaGraphExecDestroy(spare);
    }
  }
  const cudaError_t e = exec ? cudaSuccess : cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  cuda_check(e, "instantiate graph");
  ++graph_counts_.recorded;
  const auto free = std::find(graphs_.begin(), graphs_.end(), nullptr);  // a dropped one's slot
  if (free != graphs_.end()) return *free = exec, int(free - graphs_.begin());
  graphs_.push_back(exec);
  return int(graphs_.size() - 1);
}

void CudaBackend::graph_launch(int graph, int64_t pos, int32_t token) {
  check(graph >= 0 && size_t(graph) < graphs_.size() && graphs_[size_t(graph)],
        "cuda graph: no graph {}", graph);
  check(pos >= 0 && pos < record_max_, "cuda graph: position {} outside [0, {})", pos, record_max_);
  synchronize();  // the pinned step slot may still be read by the previous replay
  auto* h = step_host_.as<StepArgs>();
  h->pos = pos;
  h->token = token;
  cuda_check(
      cudaMemcpyAsync(step_dev_.data(), h, sizeof(StepArgs), cudaMemcpyHostToDevice, stream_),
      "step args");
  cuda_check(cudaGraphLaunch(graphs_[size_t(graph)], stream_), "launch graph");
  cuda_check(cudaEventRecord(step_done_[pos & 1], stream_), "step event");
}

void CudaBackend::graph_record_advance(const int32_t* next) {
  check(recording_, "cuda graph: graph_record_advance outside a recording");
  auto* a = step_dev_.as<StepArgs>();
  cuda::advance_step(&a->pos, &a->token, next, step_ring_.as<int32_t>(), stream_);
  after("advance step");
}

// While recording, the argmax's last block advances the step (one launch).
void CudaBackend::argmax_advance(const float* x, int64_t n, int32_t* out) {
  if (!recording_) return Backend::argmax_advance(x, n, out);
  check(n > 0, "cuda argmax of no values");
  auto* a = step_dev_.as<StepArgs>();
  const cuda::StepAdvance adv{&a->pos, &a->token, step_ring_.as<int32_t>(), argmax_fence_};
  cuda::argmax(x, n, out, &sync()->argmax, stream_, &adv), after("argmax + advance step");
}

// No synchronize and no step arguments from the host: the replay before
// (the same stream) left them.
void CudaBackend::graph_launch_next(int graph, int64_t pos) {
  check(graph >= 0 && size_t(graph) < graphs_.size() && graphs_[size_t(graph)],
        "cuda graph: no graph {}", graph);
  check(pos >= 0 && pos < record_max_, "cuda graph: position {} outside [0, {})", pos, record_max_);
  cuda_check(cudaGraphLaunch(graphs_[size_t(graph)], stream_), "launch graph");
  cuda_check(cudaEventRecord(step_done_[pos & 1], stream_), "step event");
}

int32_t CudaBackend::graph_token(int64_t pos) {
  check(step_done_[pos & 1] != nullptr, "cuda graph: no replay at position {}", pos);
  cuda_check(cudaEventSynchronize(step_done_[pos & 1]), "step");
  return *static_cast<volatile const int32_t*>(step_ring_.as<int32_t>() + (pos & 1));
}

void CudaBackend::graph_abort() {
  if (!recording_) return;
  recording_ = false;
  try {
    join_staged();  // every branch joined, so the capture ends (and is dropped) cleanly
  } catch (const Error&) {
  }
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(stream_, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
}

void CudaBackend::graph_drop(int graph) {
  if (graph < 0 || size_t(graph) >= graphs_.size() || !graphs_[size_t(graph)]) return;
  synchronize();
  if (graph_update_) {
    spare_graphs_.push_back(graphs_[size_t(graph)]);
    if (spare_graphs_.size() > kSpareGraphs) {
      cudaGraphExecDestroy(spare_graphs_.front());
      spare_graphs_.erase(spare_graphs_.begin());
    }
  } else {
    cudaGraphExecDestroy(graphs_[size_t(graph)]);
  }
  graphs_[size_t(graph)] = nullptr;
}

void CudaBackend::matmul(const MatView& w, const float* x, int64_t n, float* y) {
  kernels::check_matview(w, "cuda matmul");
  if (n > kGemvMax && !f32_prefill_) return gemm_bf16(w, x, n, y, false);
  if (w.rows < 32768 && skipped(kSkipO, n)) return;  // (not the LM head)
  if (n == 1 && !legacy_decode_ && cuda::gemv1(w, x, y, false, stream_)) {
    if (timing_path_.empty()) return after("gemv1");
    return after(fmt::format("gemv1 {}x{}", w.rows, w.cols).c_str());
  }
  for (int64_t t = 0; t < n; t += kGemvMax) {
    const int64_t m = std::min(kGemvMax, n - t);
    cuda::gemv(w, x + t * w.cols, m, y + t * w.rows, false, stream_), after("gemv");
  }
}

bool gemv_multi_one(std::span<const MatView> ws, const float* x, std::span<float* const> ys,
                    const float* norm, float eps, int rows_per_block, cudaStream_t s,
                    std::span<const float* const> norms) {
  if (ws.empty() || ws.size() > size_t(cuda::GemvMulti::kMax)) return false;
  cuda::GemvMulti g;
  for (size_t i = 0; i < ws.size(); ++i) {
    kernels::check_matview(ws[i], "cuda matmul");
    if (ws[i].enc != ws[0].enc || ws[i].cols != ws[0].cols || !cuda::vectorizable(ws[i]))
      return false;
    g.w[i] = static_cast<const uint8_t*>(ws[i].data);
    g.sc[i] = ws[i].scales;
    g.y[i] = ys[i];
    g.tile0[i + 1] = g.tile0[i] + ws[i].rows;
    if (i < norms.size()) g.norms[i] = norms[i];
  }
  g.count = int(ws.size());
  g.norm = norm;
  g.eps = eps;
  g.rows_per_block = rows_per_block;
  return cuda::gemv_multi(g, ws[0].enc, ws[0].cols, x, s);
}

// One launch for the weights of one input at decode (q/k/v), else one matmul each.
void CudaBackend::matmul_multi(std::span<const MatView> ws, const float* x, int64_t n,
                               std::span<float* const> ys) {
  if (skipped(kSkipQkv, n)) return;
  if (n == 1 && !legacy_decode_ && gemv_multi_one(ws, x, ys, nullptr, 0.0f, qkv_rows_, stream_))
    return after("gemv_multi");
  Backend::matmul_multi(ws, x, n, ys);
}

// At decode the norm is computed by the GEMV's blocks (no norm launch).
void CudaBackend::matmul_multi_rmsnorm(std::span<const MatView> ws, const float* x,
                                       const float* norm, float eps, int64_t n,
                                       std::span<float* const> ys, float* xn) {
  if (skipped(kSkipQkv, n)) return;
  if (n == 1 && !legacy_decode_ && fuse_ &&
      (predict_qkv(ws, x, norm, eps, ys) ||
       gemv_multi_one(ws, x, ys, norm, eps, qkv_rows_, stream_)))
    return after("gemv_multi_rmsnorm");
  Backend::matmul_multi_rmsnorm(ws, x, norm, eps, n, ys, xn);
}

// At decode the LM head's blocks compute the final norm (no norm launch;
// MOETIER_CUDA_FUSE=0 or a matrix the block GEMV does not take: separate ops).
void CudaBackend::matmul_rmsnorm(const MatView& w, const float* x, const float* norm, float eps,
                                 int64_t n, float* y, float* xn) {
  kernels::check_matview(w, "cuda matmul");
  const std::array<MatView, 1> ws{w};
  const std::array<float*, 1> ys{y};
  if (n == 1 && !legacy_decode_ && fuse_ && gemv_multi_one(ws, x, ys, norm, eps, 0, stream_))
    return after("gemv_rmsnorm");
  Backend::matmul_rmsnorm(w, x, norm, eps, n, y, xn);
}

// At decode the GEMV adds its rows to y (no add launch).
void CudaBackend::matmul_add(const MatView& w, const float* x, int64_t n, float* y, float* tmp) {
  kernels::check_matview(w, "cuda matmul");
  if (w.rows < 32768 && skipped(kSkipO, n)) return;
  if (n > kGemvMax && !f32_prefill_) return gemm_bf16(w, x, n, y, true);
  if (n == 1 && !legacy_decode_ && fuse_) {
    if (const cuda::ExpertPredict pf = take_predict();
        pf.logits && cuda::gemv1(w, x, y, true, stream_, pf)) {
      predicted_table_ = pf_table_;  // (pf_table_ stays until the router counts)
      predicted_k_ = pf.k;
      return after("gemv1_add_predict");
    }
    if (cuda::gemv1(w, x, y, true, stream_)) return after("gemv1_add");
  }
  Backend::matmul_add(w, x, n, y, tmp);
}

// y [n, rows] (+)= x [n, cols] w^T on tensor cores: x and w rounded to bf16
// (w decoded kDecodeChunk bytes at a time), f32 accumulation and output.
void CudaBackend::gemm_bf16(const MatView& w, const float* x, int64_t n, float* y,
                            bool accumulate) {
  auto* xb = static_cast<uint16_t*>(xbf_.get(*this, size_t(n * w.cols) * 2));
  cuda::f32_to_bf16(x, n * w.cols, xb, stream_), after("f32_to_bf16");
  gemm_bf16_raw(w, xb, n, y, accumulate);
}

// w decoded to bf16 kDecodeChunk bytes at a time; f32 accumulation and output.
void CudaBackend::gemm_bf16_raw(const MatView& w, const uint16_t* xb, int64_t n, float* y,
                                bool accumulate) {
  const int64_t chunk = std::max<int64_t>(1, int64_t(kDecodeChunk / size_t(w.cols * 2)));
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
    const int64_t rows = std::min(chunk, w.rows - r0);
    MatView part = w;
    part.rows = rows;
    part.data = static_cast<const uint8_t*>(w.data) + r0 * kernels::row_bytes(w);
    if (w.scales) part.scales = w.scales + r0 * int64_t(scale_bytes(w) / size_t(w.rows));
    auto* wb = static_cast<uint16_t*>(wbf_.get(*this, size_t(rows * w.cols) * 2));
    cuda::decode_to_bf16(part, wb, stream_), after("decode_to_bf16");
    // Column-major view: Y^T [rows, n] = W [rows, cols] X^T [cols, n].
    check_blas(
        cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(w.cols), &one, wb,
                     CUDA_R_16BF, int(w.cols), xb, CUDA_R_16BF, int(w.cols), &beta, y + r0,
                     CUDA_R_32F, int(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "gemm bf16");
  }
}

// Checks the shapes and sizes the split partials for n_q queries from first_pos
// (graph mode: for every position up to the recording's capacity).
float* CudaBackend::attention_scratch(int64_t n_q, int64_t first_pos, int64_t heads,
                                      int64_t kv_heads, int64_t hd) {
  check(hd <= 256 && heads % kv_heads == 0 && kv_heads <= 256,
        "cuda attention: head_dim {} (<= 256), heads {} / {} (<= 256 kv heads)", hd, heads,
        kv_heads);
  const int64_t covered = step_pos(first_pos) ? record_max_ : first_pos + n_q;
  const int64_t sf = cuda::attention_scratch_floats(n_q, covered, heads, hd);
  return sf ? static_cast<float*>(attn_.get(*this, size_t(sf) * 4)) : nullptr;
}

void CudaBackend::attention(const float* q, const float* k, const float* v, int64_t n_q,
                            int64_t first_pos, int64_t heads, int64_t kv_heads, int64_t hd,
                            float scale, float* out) {
  float* scratch = attention_scratch(n_q, first_pos, heads, kv_heads, hd);
  cuda::attention(q, k, v, n_q, first_pos, step_pos(first_pos), record_max_, heads, kv_heads, hd,
                  scale, out, scratch, sync()->attn_done, stream_);
  after("attention");
}

void CudaBackend::attend_decode(float* q, float* k, const float* v, const float* q_norm,
                                const float* k_norm, int64_t nh, int64_t nkv, int64_t hd, float eps,
                                int64_t pos, const float* inv_freq, float* k_cache, float* v_cache,
                                float scale, float* out) {
  if (skipped(kSkipAttn, 1)) return;
  float* scratch = attention_scratch(1, pos, nh, nkv, hd);
  cuda::DecodePrep p;
  p.k_new = k, p.v_new = v, p.q_norm = q_norm, p.k_norm = k_norm, p.inv_freq = inv_freq,
  p.eps = eps;
  if (!legacy_decode_ &&
      cuda::attention_decode(q, k_cache, v_cache, pos, step_pos(pos), record_max_, nh, nkv, hd,
                             scale, p, out, scratch, sync()->attn_done, stream_))
    return after("attend_decode");
  Backend::attend_decode(q, k, v, q_norm, k_norm, nh, nkv, hd, eps, pos, inv_freq, k_cache, v_cache,
                         scale, out);
}

void CudaBackend::softmax_topk(const float* logits, int64_t n, int64_t e, int64_t k, bool renorm,
                               float* probs, int32_t* ids, float* weights) {
  check(k >= 1 && k <= e && e <= 1024 && k <= 32, "cuda router: top-{} of {} experts", k, e);
  cuda::softmax_topk(logits, n, e, k, renorm, probs, ids, weights, stream_), after("softmax_topk");
}

void CudaBackend::route_topk(const MatView& router, const float* x, int64_t n, int64_t k,
                             bool renorm, float* probs, int32_t* ids, float* weights) {
  check(k >= 1 && k <= router.rows && router.rows <= 1024 && k <= 32,
        "cuda router: top-{} of {} experts", k, router.rows);
  if (skipped(kSkipRouter, n)) return;
  if (n == 1 && !legacy_decode_ &&
      cuda::router_topk(router, x, k, renorm, probs, ids, weights, &sync()->route_done, stream_))
    return after("router_topk");
  Backend::route_topk(router, x, n, k, renorm, probs, ids, weights);
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

CudaBackend* as_cuda(Backend& be) { return dynamic_cast<CudaBackend*>(&be); }

}  // namespace moetier
