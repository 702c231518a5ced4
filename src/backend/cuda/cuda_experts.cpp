// CudaBackend::expert_batch: experts in ascending order; runs of small token
// groups go to the f32 expert kernels in one launch (kernels/cuda/experts.cu),
// groups of at least kGroupGemmMin pairs to bf16 tensor-core GEMMs (prefill).
// Each token's contributions are added in ascending expert order either way.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/error.h"
#include "kernels/matview.h"

namespace moetier {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

cuda::ExpertPtrs ptrs_of(const ExpertView& v) {
  return {{v.gate.data, v.up.data, v.down.data}, {v.gate.scales, v.up.scales, v.down.scales}};
}

bool uniform(const ExpertView& v) { return v.gate.enc == v.up.enc && v.up.enc == v.down.enc; }

// Whether moe_stream_q8 can read the expert: in device memory (not host),
// every region 16-byte aligned.
bool on_stream(const ExpertView& v, bool host) {
  const void* r[6] = {v.gate.data,   v.up.data,   v.down.data,
                      v.gate.scales, v.up.scales, v.down.scales};
  bool ok = !host;
  for (const void* p : r) ok = ok && p && aligned16(p);
  return ok;
}

bool in_host_memory(const void* p) {
  cudaPointerAttributes a{};
  const bool host = cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost;
  (void)cudaGetLastError();
  return host;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

template <typename T>
T* CudaBackend::upload_array(Scratch& s, const std::vector<T>& v) {
  auto* d = static_cast<T*>(s.get(*this, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) to_device(d, v.data(), v.size() * sizeof(T));
  return d;
}

void CudaBackend::expert_batch(const ExpertBatch& b) {
  const size_t m = b.experts.size();
  check(b.offsets.size() == m + 1, "expert batch: {} offsets for {} experts", b.offsets.size(), m);
  size_t i = 0;
  while (i < m) {
    // The precision policy of matmul: tensor cores only for chunks of more
    // than kGemvMax tokens.
    auto big = [&](size_t e) {
      return !f32_prefill_ && b.n > kGemvMax && b.offsets[e + 1] - b.offsets[e] >= kGroupGemmMin;
    };
    if (big(i)) {
      expert_gemm(b, i++);
      continue;
    }
    size_t j = i + 1;
    while (j < m && !big(j) && b.experts[j].gate.enc == b.experts[i].gate.enc) ++j;
    experts_gemv(b, i, j);
    i = j;
  }
}

// The index arrays of the pairs of experts [i0, i1) (m experts, P pairs, T
// distinct tokens), packed as experts_gemv uploads them: [pair_offsets m+1]
// [pair_token P][token_offsets T+1][token_pairs P][pair_expert P][token_rows T].
static std::vector<int32_t> pair_index(const ExpertBatch& b, size_t i0, size_t i1, int32_t& T) {
  const int32_t m = int32_t(i1 - i0);
  const int64_t p0 = b.offsets[i0], pairs = b.offsets[i1] - p0;
  std::vector<int32_t> rows;  // distinct tokens, ascending
  std::vector<int32_t> slot(size_t(b.n), -1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t t = int32_t(b.tokens[size_t(p0 + p)]);
    if (slot[size_t(t)] < 0) slot[size_t(t)] = 0, rows.push_back(t);
  }
  std::sort(rows.begin(), rows.end());
  for (size_t r = 0; r < rows.size(); ++r) slot[size_t(rows[r])] = int32_t(r);
  T = int32_t(rows.size());
  std::vector<int32_t> ints(size_t(m + 1 + pairs + T + 1 + 2 * pairs + T));
  int32_t* pair_offsets = ints.data();
  int32_t* pair_token = pair_offsets + m + 1;
  int32_t* token_offsets = pair_token + pairs;
  int32_t* token_pairs = token_offsets + T + 1;
  int32_t* pair_expert = token_pairs + pairs;
  int32_t* token_rows = pair_expert + pairs;
  for (int32_t e = 0; e <= m; ++e) pair_offsets[e] = int32_t(b.offsets[i0 + size_t(e)] - p0);
  std::vector<int32_t> count(size_t(T) + 1, 0);
  for (int32_t e = 0; e < m; ++e)
    for (int32_t p = pair_offsets[e]; p < pair_offsets[e + 1]; ++p) {
      pair_token[p] = int32_t(b.tokens[size_t(p0 + p)]);
      pair_expert[p] = e;
      ++count[size_t(slot[size_t(pair_token[p])]) + 1];
    }
  for (int32_t t = 0; t < T; ++t) count[size_t(t) + 1] += count[size_t(t)];
  std::copy(count.begin(), count.end(), token_offsets);
  for (int32_t p = 0; p < pairs; ++p)  // pairs ascend by expert: so do each token's
    token_pairs[count[size_t(slot[size_t(pair_token[p])])]++] = p;
  std::copy(rows.begin(), rows.end(), token_rows);
  return ints;
}

// The ExpertLaunch arrays of experts [i0, i1), packed in one upload:
// [ExpertPtrs m][pair_offsets m+1][pair_token P][token_offsets T+1]
// [token_pairs P][pair_expert P][token_rows T][pair_weight P].
void CudaBackend::experts_gemv(const ExpertBatch& b, size_t i0, size_t i1) {
  const int32_t m = int32_t(i1 - i0);
  const int64_t p0 = b.offsets[i0], pairs = b.offsets[i1] - p0;
  std::vector<cuda::ExpertPtrs> ptrs;
  bool vec = true;
  int32_t max_pairs = 0;
  for (size_t e = i0; e < i1; ++e) {
    const ExpertView& v = b.experts[e];
    check(uniform(v) && v.gate.enc == b.experts[i0].gate.enc,
          "cuda experts: one encoding per expert batch");
    ptrs.push_back(ptrs_of(v));
    vec = vec && aligned16(v.gate.data) && aligned16(v.up.data) && aligned16(v.down.data);
    max_pairs = std::max<int32_t>(max_pairs, int32_t(b.offsets[e + 1] - b.offsets[e]));
  }
  int32_t T = 0;  // distinct tokens
  const std::vector<int32_t> ints = pair_index(b, i0, i1, T);
  std::vector<float> w(b.weights.begin() + p0, b.weights.begin() + p0 + pairs);

  const cuda::ExpertPtrs* dptr = upload_array(arrays_, ptrs);
  const int32_t* dint = upload_array(rows_, ints);
  const float* dw = upload_array(rw_, w);
  cuda::ExpertLaunch l;
  l.enc = b.experts[i0].gate.enc;
  l.hidden = b.hidden;
  l.inter = b.intermediate;
  l.m = m;
  l.experts = dptr;
  l.pair_offsets = dint;
  l.pair_token = dint + m + 1;
  l.n = T;
  l.token_offsets = l.pair_token + pairs;
  l.token_pairs = l.token_offsets + T + 1;
  l.pair_expert = l.token_pairs + pairs;
  l.token_rows = l.pair_expert + pairs;
  l.pair_weight = dw;
  l.x = b.x;
  l.pairs = int32_t(pairs);
  l.h =
      static_cast<float*>(h_.get(*this, size_t(std::max<int64_t>(1, pairs) * b.intermediate) * 4));
  l.d = static_cast<float*>(d_.get(*this, size_t(std::max<int64_t>(1, pairs) * b.hidden) * 4));
  l.out = b.out;
  l.max_pairs_per_expert = max_pairs;
  l.vec_ok = vec;
  cuda::experts(l, stream_), after("experts");
}

// One expert on m >= kGroupGemmMin tokens: gather, gate/up GEMMs, silu * up,
// down GEMM, weighted scatter-add into out.
void CudaBackend::expert_gemm(const ExpertBatch& b, size_t i) {
  const ExpertView& v = b.experts[i];
  const int64_t p0 = b.offsets[i], m = b.offsets[i + 1] - p0, H = b.hidden, I = b.intermediate;
  std::vector<int32_t> rows(static_cast<size_t>(m));
  for (int64_t p = 0; p < m; ++p) rows[size_t(p)] = int32_t(b.tokens[size_t(p0 + p)]);
  std::vector<float> w(b.weights.begin() + p0, b.weights.begin() + p0 + m);
  const int32_t* drows = upload_array(rows_, rows);
  const float* dw = upload_array(rw_, w);
  auto* xg = static_cast<uint16_t*>(xbf_.get(*this, size_t(m * H) * 2));  // [m, H] bf16
  cuda::gather_rows_bf16(b.x, drows, m, H, xg, stream_), after("gather");
  auto* g = static_cast<float*>(g_.get(*this, size_t(m * I) * 4));  // [m, I]
  auto* u = static_cast<float*>(u_.get(*this, size_t(m * I) * 4));  // [m, I]
  gemm_bf16_raw(v.gate, xg, m, g, false);
  gemm_bf16_raw(v.up, xg, m, u, false);
  cuda::silu_mul(g, u, m * I, stream_), after("silu_mul");
  auto* hb = static_cast<uint16_t*>(hbf_.get(*this, size_t(m * I) * 2));  // [m, I] bf16
  cuda::f32_to_bf16(g, m * I, hb, stream_), after("f32_to_bf16");
  auto* y = static_cast<float*>(y_.get(*this, size_t(m * H) * 4));  // [m, H]
  gemm_bf16_raw(v.down, hb, m, y, false);
  cuda::scatter_add_rows(b.out, y, drows, dw, m, H, stream_), after("scatter_add");
}

int CudaBackend::register_experts(std::span<const ExpertView> views) {
  check(!views.empty(), "cuda: an empty expert table");
  Table t;
  t.enc = views[0].gate.enc;
  t.vec = true;
  std::vector<cuda::ExpertPtrs> ptrs;
  for (const ExpertView& v : views) {
    check(uniform(v) && v.gate.enc == t.enc, "cuda: one encoding per expert table");
    ptrs.push_back(ptrs_of(v));
    t.vec = t.vec && aligned16(v.gate.data) && aligned16(v.up.data) && aligned16(v.down.data);
  }
  t.num_experts = int64_t(views.size());
  t.inter = views[0].gate.rows;
  t.ptrs = alloc(ptrs.size() * sizeof(cuda::ExpertPtrs));
  cuda_check(cudaMemcpy(t.ptrs.data(), ptrs.data(), ptrs.size() * sizeof(cuda::ExpertPtrs),
                        cudaMemcpyHostToDevice),
             "upload expert table");
  std::vector<uint8_t> host(views.size());
  t.stream_ok = moe_stream_;  // (off: no table takes it, and updates are never refused)
  for (size_t e = 0; e < views.size(); ++e) {
    host[e] = in_host_memory(views[e].gate.data) ? 1 : 0;
    t.stream_ok = t.stream_ok && on_stream(views[e], host[e] != 0);
    t.all_device = t.all_device && host[e] == 0;
  }
  if (predict_.bytes() == 0) {  // (hint_experts: sized before any recording)
    predict_ = alloc(PredictSlots::kBytes);
    cuda_check(cudaMemset(predict_.data(), 0, predict_.bytes()), "prediction counters");
  }
  t.host = alloc(host.size());
  t.shadow =
      alloc(ptrs.size() * sizeof(cuda::ExpertPtrs));  // (staging: sized before any recording)
  cuda_check(cudaMemcpy(t.host.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
             "upload expert table");
  // A staging slot: the three matrices, then their scales, each 256-byte aligned.
  const MatView* m[3] = {&views[0].gate, &views[0].up, &views[0].down};
  for (int r = 0; r < 6; ++r) {
    const MatView& v = *m[r % 3];
    t.bytes[r] = r < 3 ? size_t(kernels::row_bytes(v) * v.rows) : scale_bytes(v);
    t.offset[r] = t.slot_bytes;
    t.slot_bytes += round_up(t.bytes[r], 256);
  }
  tables_.push_back(std::move(t));
  return int(tables_.size() - 1);
}

// The entries go to a pinned buffer that one kernel reads in place; the
// buffer is rewritten only after the kernel that read it is done.
void CudaBackend::update_experts(std::span<const ExpertTableEntry> entries) {
  if (entries.empty()) return;
  check(!recording_, "cuda graph: an expert table update while recording a decode step");
  cuda_check(cudaEventSynchronize(writes_done_), "table writes");
  const size_t bytes = entries.size() * sizeof(cuda::TableWrite);
  if (writes_host_.bytes() < bytes) writes_host_ = alloc_host(bytes + bytes / 2);
  auto* w = writes_host_.as<cuda::TableWrite>();
  for (size_t i = 0; i < entries.size(); ++i) {
    const ExpertTableEntry& e = entries[i];
    check(e.table >= 0 && size_t(e.table) < tables_.size(), "cuda: expert table {} (of {})",
          e.table, tables_.size());
    const Table& t = tables_[size_t(e.table)];
    check(e.id >= 0 && size_t(e.id) < t.ptrs.bytes() / sizeof(cuda::ExpertPtrs),
          "cuda: expert {} outside table {}", e.id, e.table);
    check(uniform(e.view) && e.view.gate.enc == t.enc, "cuda: one encoding per expert table");
    check(!t.vec || (aligned16(e.view.gate.data) && aligned16(e.view.up.data) &&
                     aligned16(e.view.down.data)),
          "cuda: expert table {}: entry {} is not 16-byte aligned", e.table, e.id);
    w[i] = {t.ptrs.as<cuda::ExpertPtrs>() + e.id, ptrs_of(e.view), t.host.as<uint8_t>() + e.id,
            uint8_t(e.host ? 1 : 0)};
  }
  const bool recorded =
      std::any_of(graphs_.begin(), graphs_.end(), [](cudaGraphExec_t g) { return g != nullptr; });
  for (const ExpertTableEntry& e : entries) {  // (after every entry was checked)
    Table& t = tables_[size_t(e.table)];
    check(!t.stream_ok || !recorded,
          "cuda: expert table {} updated after a decode graph recorded its one-launch MoE step",
          e.table);
    t.stream_ok = false;
    t.all_device = t.all_device && !e.host;
  }
  cuda::write_table_entries(w, int(entries.size()), stream_), after("expert table update");
  cuda_check(cudaEventRecord(writes_done_, stream_), "table writes");
}

const CudaBackend::Table& CudaBackend::table_at(int table, int64_t k) const {
  check(table >= 0 && size_t(table) < tables_.size() && k >= 1 && k <= 32,
        "cuda: resident experts table {} (of {}), top-{}", table, tables_.size(), k);
  return tables_[size_t(table)];
}

bool CudaBackend::moe_q8(const Table& t, const cuda::ExpertPtrs* p, const int32_t* ids,
                         const float* weights, int64_t k, const float* x, int64_t hidden,
                         int64_t intermediate, float* out, bool early, const cuda::Q8Fuse& fuse) {
  if (legacy_decode_ || !act_q8_ ||
      !cuda::moe_q8_applies(t.enc, t.vec, int(k), hidden, intermediate))
    return false;
  void* sq = q8_.get(*this, cuda::moe_q8_scratch_bytes(k, hidden, intermediate));
  cuda::Q8Fuse f = fuse;
  f.stream = t.stream_ok ? sync()->moe_stream : nullptr;
  const int how = cuda::moe_decode_q8(p, t.enc, t.vec, ids, weights, int(k), x, hidden,
                                      intermediate, sq, out, early, stream_, f);
  if (how == 0) {
    (void)cudaGetLastError();  // a refused shared-memory attribute: the f32 path instead
    return false;
  }
  after(how == 2 ? "resident experts (q8 stream)" : "resident experts (q8)");
  return true;
}

void CudaBackend::moe_resident(int table, const int32_t* ids, const float* weights, int64_t k,
                               const float* x, int64_t hidden, int64_t intermediate, float* out) {
  const Table& t = table_at(table, k);
  moe_ptrs(t, take_staged(table), ids, weights, k, x, hidden, intermediate, out);
}

// The experts of table t (entries p: its own or its shadow) for one token.
void CudaBackend::moe_ptrs(const Table& t, const cuda::ExpertPtrs* p, const int32_t* ids,
                           const float* weights, int64_t k, const float* x, int64_t hidden,
                           int64_t intermediate, float* out) {
  if (moe_q8(t, p, ids, weights, k, x, hidden, intermediate, out, false)) return;
  float* h = static_cast<float*>(h_.get(*this, size_t(k * intermediate) * 4));
  if (!legacy_decode_ && cuda::moe_decode(p, t.enc, t.vec, ids, weights, int(k), x, hidden,
                                          intermediate, h, out, stream_))
    return after("resident experts (fused)");
  cuda::fill_zero(out, hidden, stream_);
  void* prep = prep_.get(*this, cuda::expert_prep_bytes(k));
  cuda::ExpertLaunch l = cuda::prepare_decode_experts(ids, weights, k, p, prep, stream_);
  l.enc = t.enc;
  l.hidden = hidden;
  l.inter = intermediate;
  l.x = x;
  l.h = h;
  l.d = static_cast<float*>(d_.get(*this, size_t(k * hidden) * 4));
  l.out = out;
  l.vec_ok = t.vec;
  cuda::experts(l, stream_), after("resident experts");
}

// The router's last kernel writes ids and weights right before the q8
// kernels, and x was written before the router: the q8 kernels' early reads
// (decode_q8.cu) hold, whichever router path runs.
void CudaBackend::route_moe_resident(const MatView& router, int table, const float* x, int64_t k,
                                     bool renormalize, float* probs, int32_t* ids, float* weights,
                                     int64_t hidden, int64_t intermediate, float* out) {
  const Table& t = table_at(table, k);
  const cuda::ExpertPtrs* p = take_staged(table);
  route_topk(router, x, 1, k, renormalize, probs, ids, weights);
  if (skipped(kSkipExperts, 1)) return;
  // Early reads need the router launched right before (MOETIER_CUDA_SKIP=router: not).
  if (moe_q8(t, p, ids, weights, k, x, hidden, intermediate, out, !skipped(kSkipRouter, 1))) return;
  moe_ptrs(t, p, ids, weights, k, x, hidden, intermediate, out);
}

// The router normalizes x itself (and, with RouterQ8, quantizes it for the q8
// kernels; else the quantize kernel normalizes it again) and the down
// projection adds into x: four launches for norm, router, experts and
// residual add. The early reads hold as in route_moe_resident (x was written
// before the router; with RouterQ8 only down reads early, the router two
// back). Other expert paths (f32 activations, legacy) run the separate ops
// (route_add_ops). With f.next, the next layer's experts are staged after the
// router (cuda_stage.cpp).
void CudaBackend::route_moe_resident_add(const MatView& router, int table, float* x, int64_t k,
                                         bool renormalize, float* probs, int32_t* ids,
                                         float* weights, int64_t hidden, int64_t intermediate,
                                         const NormAdd& f) {
  const Table& t = table_at(table, k);
  const int predicted = predicted_k_ == k ? predicted_table_ : -1;  // the layer's hints end here
  hint_.reset(), pf_ = {}, pf_table_ = predicted_table_ = -1;
  const cuda::ExpertPtrs* p = take_staged(table);
  const bool stage = !skip_ && can_stage(f.next, k, hidden);
  const bool fuse = fuse_ && !legacy_decode_ && act_q8_ &&
                    cuda::moe_q8_applies(t.enc, t.vec, int(k), hidden, intermediate) &&
                    router.cols == hidden && router.rows <= 1024 && k <= router.rows;
  if (!fuse && skipped(kSkipExperts, 1)) {  // (profiling: no stale output added to x)
    rmsnorm(x, f.norm, 1, hidden, f.eps, f.xn);
    return route_topk(router, f.xn, 1, k, renormalize, probs, ids, weights);
  }
  if (!fuse)
    return route_add_ops(router, t, p, x, k, renormalize, probs, ids, weights, hidden, intermediate,
                         f, stage);
  float* xc = stage ? static_cast<float*>(stage_x_.get(*this, size_t(hidden) * 4)) : nullptr;
  // The router quantizes x for the q8 kernels (RouterQ8) unless MOETIER_CUDA_ROUTER_Q8=0
  // (or a profiling skip leaves the router or the experts out).
  cuda::RouterQ8 rq;
  if (router_q8_ && !skipped(kSkipExperts | kSkipRouter, 1)) {
    const cuda::Q8XSlots xs =
        cuda::moe_q8_x(q8_.get(*this, cuda::moe_q8_scratch_bytes(k, hidden, intermediate)), k,
                       hidden, intermediate);
    rq = {xs.xq, xs.xd, p, int64_t(t.num_experts * sizeof(cuda::ExpertPtrs))};
    rq.stash = router_stash_;
    if (predicted == table) {  // this layer's o_proj predicted (cuda_predict.cpp)
      rq.predicted = predict_slots().ids;
      rq.counts = predict_slots().counts;
    }
  }
  if (!skipped(kSkipRouter, 1)) {
    if (!cuda::router_topk(router, x, k, renormalize, probs, ids, weights, &sync()->route_done,
                           stream_, f.norm, f.eps, xc, rq))
      return route_add_ops(router, t, p, x, k, renormalize, probs, ids, weights, hidden,
                           intermediate, f, stage);
    after("router_topk_rmsnorm");
    if (xc) stage_next(*f.next, k, renormalize, f.eps, hidden);
  }
  if (skipped(kSkipExperts, 1)) return;
  cuda::Q8Fuse qf{f.norm, f.eps, true, rq.xq != nullptr};
  qf.predicted = rq.predicted;  // (set only with rq.xq) gate/up starts on them
  if (moe_q8(t, p, ids, weights, k, x, hidden, intermediate, x, !skipped(kSkipRouter, 1), qf))
    return;
  rmsnorm(x, f.norm, 1, hidden, f.eps, f.xn);  // (a refused shared-memory attribute)
  moe_ptrs(t, p, ids, weights, k, f.xn, hidden, intermediate, f.tmp);
  add(x, f.tmp, hidden);
}

// The separate ops: xn = rmsnorm(x), the router, the experts into tmp, x +=
// tmp; with stage, x is copied for the next layer's staging before the router.
void CudaBackend::route_add_ops(const MatView& router, const Table& t, const cuda::ExpertPtrs* p,
                                float* x, int64_t k, bool renormalize, float* probs, int32_t* ids,
                                float* weights, int64_t hidden, int64_t intermediate,
                                const NormAdd& f, bool stage) {
  rmsnorm(x, f.norm, 1, hidden, f.eps, f.xn);
  if (stage) {
    copy(stage_x_.get(*this, size_t(hidden) * 4), x, size_t(hidden) * 4);
    stage_next(*f.next, k, renormalize, f.eps, hidden);
  }
  route_topk(router, f.xn, 1, k, renormalize, probs, ids, weights);
  if (!moe_q8(t, p, ids, weights, k, f.xn, hidden, intermediate, f.tmp, !skipped(kSkipRouter, 1)))
    moe_ptrs(t, p, ids, weights, k, f.xn, hidden, intermediate, f.tmp);
  add(x, f.tmp, hidden);
}

}  // namespace moetier
