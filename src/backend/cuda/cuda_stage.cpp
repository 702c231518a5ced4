// CudaBackend: staging the next MoE layer's predicted host experts during a
// decode step (Backend::NormAdd::next; docs/cache-protocol.md, "Next-layer
// staging"). Protocol (all ops in stream order unless named):
//   1. Layer L's router kernel also copies x to stage_x_ (x as the router
//      read it; layer L's down projection adds into x later).
//   2. stage_fork_ is recorded on stream_ right after that router: the
//      stage stream waits for it, predicts layer N's experts from stage_x_
//      (router_topk with N's norm and router) and runs stage_experts (the
//      host experts among them into a staging buffer, N's shadow table).
//   3. A join event is recorded on the stage stream (stage_join_[N]); the
//      call on N's table makes stream_ wait for it before N's router, and
//      reads the shadow table. So N's router (and every kernel after it,
//      the early reads of decode_q8.cu included) runs after the staging.
//   4. Buffers: stage_x_ is rewritten by N's router, after the join. The two
//      staging buffers are used in turn: staging i + 2 reuses the buffer of
//      staging i, and is forked after the router of the layer that read
//      staging i's experts, so after those were read (PDL completes kernels
//      in order). Pending joins are waited for before a recording begins and
//      before it ends (graph_end, graph_abort). Both buffers and every
//      table's shadow are sized outside recordings.
//   5. N's q8 kernels read the shadow table and the staged bytes before
//      their grid_wait (gate/up only with MOETIER_CUDA_ROUTER_Q8=0; down
//      always), as they read the table that update_experts' kernel wrote
//      (launch.cuh, early reads): the staging kernel completed before N's
//      router started, two or more launches before them.
#include "backend/cuda/cuda_backend_impl.h"
#include "kernels/matview.h"

namespace moetier {

bool CudaBackend::can_stage(const NextLayer* next, int64_t k, int64_t hidden) const {
  if (!next || !next->router || next->table < 0 || size_t(next->table) >= tables_.size())
    return false;
  const Table& t = tables_[size_t(next->table)];
  // (copies on a table with every entry in device memory: nothing to copy)
  return stage_mode_ > 0 && !(stage_mode_ == 2 && t.all_device) && t.slot_bytes > 0 && k >= 1 &&
         k <= 32 && k <= t.num_experts && next->router->rows == t.num_experts &&
         next->router->cols == hidden;
}

void CudaBackend::stage_next(const NextLayer& next, int64_t k, bool renormalize, float eps,
                             int64_t hidden) {
  if (stage_join_.count(next.table)) take_staged(next.table);  // (an unread staging: joined)
  Table& t = tables_[size_t(next.table)];
  if (!stage_stream_) {
    cuda_check(cudaStreamCreateWithFlags(&stage_stream_, cudaStreamNonBlocking), "stage stream");
    cuda_check(cudaEventCreateWithFlags(&stage_fork_, cudaEventDisableTiming), "stage event");
  }
  // Both buffers sized at once: a recording allocates nothing.
  for (Scratch& b : staging_) b.get(*this, size_t(k) * t.slot_bytes);
  auto* staging = static_cast<uint8_t*>(staging_[stage_count_++ % 2].buf.data());
  auto* probs = static_cast<float*>(stage_route_.get(*this, size_t(t.num_experts + 2 * k) * 4));
  auto* ids = reinterpret_cast<int32_t*>(probs + t.num_experts);  // [k]
  float* weights = probs + t.num_experts + k;                     // [k]
  const cudaEvent_t join = pooled_event();
  stage_join_[next.table] = {join, false};  // owned by the map before any record
  cuda_check(cudaEventRecord(stage_fork_, stream_), "stage fork");
  cuda_check(cudaStreamWaitEvent(stage_stream_, stage_fork_, 0), "stage fork");
  const auto* x = static_cast<const float*>(stage_x_.buf.data());
  const cuda::PlainLaunches plain;  // full dependencies on the fork (and the kernel before)
  if (cuda::router_topk(*next.router, x, k, renormalize, probs, ids, weights, &sync()->stage_done,
                        stage_stream_, next.norm, eps)) {
    cuda_check(cudaGetLastError(), "stage: router");
    cuda::StageLaunch a;
    a.table = t.ptrs.as<cuda::ExpertPtrs>();
    a.host = stage_mode_ == 2 ? t.host.as<uint8_t>() : nullptr;
    a.blocks = unsigned(stage_blocks_);
    a.ids = ids;
    a.k = int(k);
    a.num_experts = int(t.num_experts);
    a.staging = staging;
    a.slot_bytes = t.slot_bytes;
    for (int r = 0; r < 6; ++r) a.offset[r] = t.offset[r], a.bytes[r] = t.bytes[r];
    a.shadow = t.shadow.as<cuda::ExpertPtrs>();
    a.staged = next.staged;
    cuda::stage_experts(a, stage_stream_);
    cuda_check(cudaGetLastError(), "stage: copies");
    stage_join_[next.table].second = true;
  }
  // Recorded even when nothing ran: a recording ends with every branch joined.
  cuda_check(cudaEventRecord(join, stage_stream_), "stage join");
}

const cuda::ExpertPtrs* CudaBackend::take_staged(int table) {
  const Table& t = tables_[size_t(table)];
  const auto it = stage_join_.find(table);
  if (it == stage_join_.end()) return t.ptrs.as<cuda::ExpertPtrs>();
  const auto [join, staged] = it->second;
  stage_join_.erase(it);
  free_events_.push_back(join);
  cuda_check(cudaStreamWaitEvent(stream_, join, 0), "stage join");
  return staged ? t.shadow.as<cuda::ExpertPtrs>() : t.ptrs.as<cuda::ExpertPtrs>();
}

void CudaBackend::join_staged() {
  const auto pending = std::move(stage_join_);
  stage_join_.clear();
  cudaError_t err = cudaSuccess;
  for (const auto& [table, j] : pending) {  // every one waited for, even after an error
    free_events_.push_back(j.first);
    const cudaError_t e = cudaStreamWaitEvent(stream_, j.first, 0);
    if (err == cudaSuccess) err = e;
  }
  cuda_check(err, "stage join");
}

}  // namespace moetier
