// A decode layer's experts predicted while its attention runs, so that gate/up
// starts copying their weights before the router's ids are known
// (MOETIER_CUDA_PREDICT=early; docs/cuda.md "Predicted experts start gate/up
// early", kernels/cuda/predict.cuh).
//
// Sequence, per MoE layer of a resident decode step (host side): the model's
// hint_experts names the layer's router, norm and table; the q/k/v GEMV
// (matmul_multi_rmsnorm -> predict_qkv) computes the router's logits on the
// layer's input as a fourth matrix with its own norm, into predict_; the o
// projection (matmul_add -> take_predict) takes their top k in its block 0
// while attention runs, into predict_; route_moe_resident_add on the table
// has its router count how many of them it chose and its gate/up start on
// them (Q8Fuse::predicted), and ends the layer's hint. Any other op order
// just drops the hint: no result depends on it.
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend_impl.h"

namespace moetier {

// MOETIER_CUDA_PREDICT=early (the default): each resident decode layer
// predicts its experts before attention and gate/up starts copying them
// before the router's ids are known; off: no prediction (docs/cuda.md,
// "Predicted experts start gate/up early").
bool read_predict_env() {
  const char* v = std::getenv("MOETIER_CUDA_PREDICT");
  if (!v) return true;
  const std::string s = v;
  check(s == "early" || s == "off", "MOETIER_CUDA_PREDICT={}: expected early or off", s);
  return s == "early";
}

void CudaBackend::hint_experts(const ExpertHint& h) {
  // A new layer: whatever an earlier layer left (a step cut short by an
  // error) is dropped, so no o projection takes another layer's logits.
  hint_.reset(), pf_ = {}, pf_table_ = predicted_table_ = -1;
  fold_ = {}, folded_table_ = -1;
  if (!predict_on_ || skip_ || legacy_decode_ || !fuse_ || !h.router || !h.norm) return;
  if (h.table < 0 || size_t(h.table) >= tables_.size() || h.k < 1 ||
      h.k > cuda::ExpertPredict::kMaxK)
    return;
  const Table& t = tables_[size_t(h.table)];
  if (!t.all_device || t.inter < 1 || h.router->rows != t.num_experts ||
      h.router->rows > cuda::ExpertPredict::kMaxExperts || h.k > h.router->rows)
    return;
  // only where the q8 step with the router's quantize runs (its gate/up takes the prediction)
  if (!act_q8_ || !router_q8_ ||
      !cuda::moe_q8_applies(t.enc, t.vec, int(h.k), h.router->cols, t.inter))
    return;
  hint_ = h;
  if (fold_on_) hint_fold(h);
}

// The layer's fold (stage 1) where its hint names an o projection and the
// router's outputs, and M is built or can be (not while recording).
void CudaBackend::hint_fold(const ExpertHint& h) {
  if (!h.o_proj || !h.probs || !h.ids || !h.weights || h.o_proj->rows != h.router->cols ||
      h.o_proj->cols % 4)
    return;
  const FoldKey key{h.router->data, h.norm, h.o_proj->data};
  auto it = fold_m_.find(key);
  if (it == fold_m_.end()) {
    if (recording_) return;
    DeviceBuffer m = alloc(size_t(h.router->rows * h.o_proj->cols) * sizeof(float));
    if (!cuda::fold_matrix(*h.router, h.norm, *h.o_proj, m.as<float>(), stream_)) return;
    after("fold_matrix");
    it = fold_m_.emplace(key, std::move(m)).first;
  }
  fold_.h = h;
  fold_.m = it->second.as<float>();
  fold_.stage = 1;
}

// o projection + router in one launch (stage 3 on the hinted o projection);
// false: the fold dropped, nothing launched.
bool CudaBackend::fold_o(const MatView& o, const float* a, float* x) {
  if (fold_.stage != 3) return fold_.stage = 0, false;
  fold_.stage = 0;
  const ExpertHint& h = fold_.h;
  if (&o != h.o_proj && o.data != h.o_proj->data) return false;
  const Table& t = tables_[size_t(h.table)];
  const int64_t hidden = h.router->cols;
  const cuda::Q8XSlots xs = cuda::moe_q8_x(
      q8_.get(*this, cuda::moe_q8_scratch_bytes(h.k, hidden, t.inter)), h.k, hidden, t.inter);
  cuda::RouterFold f;
  f.m = fold_.m;
  f.zx = pf_.logits;
  f.za = static_cast<float*>(fold_za_.get(*this, size_t(h.router->rows) * sizeof(float)));
  f.norm = h.norm, f.eps = h.eps;
  f.e = h.router->rows, f.k = h.k, f.renorm = h.renormalize ? 1 : 0;
  f.probs = h.probs, f.ids = h.ids, f.weights = h.weights;
  f.done = &sync()->route_done;
  f.q8 = {xs.xq, xs.xd, t.ptrs.data(), int64_t(t.num_experts * sizeof(cuda::ExpertPtrs))};
  f.q8.predicted = predict_slots().ids;
  f.q8.counts = predict_slots().counts;
  if (!f.zx || !cuda::o_fold(o, a, x, f, stream_)) return false;
  pf_ = {};
  folded_table_ = predicted_table_ = pf_table_;
  predicted_k_ = int(h.k);
  return true;
}

// q/k/v and the hinted router in one launch; false (nothing launched, the
// hint dropped) where it does not apply (another encoding or width).
bool CudaBackend::predict_qkv(std::span<const MatView> ws, const float* x, const float* norm,
                              float eps, std::span<float* const> ys) {
  if (!hint_) return false;
  const ExpertHint h = *hint_;
  hint_.reset();
  constexpr size_t kMax = cuda::GemvMulti::kMax;
  const size_t n = ws.size();
  if (n + 1 > kMax || ys.size() != n) return false;
  MatView w[kMax];
  float* y[kMax] = {};
  const float* nw[kMax] = {};
  for (size_t i = 0; i < n; ++i) w[i] = ws[i], y[i] = ys[i];
  w[n] = *h.router;
  const PredictSlots ps = predict_slots();
  y[n] = ps.logits;  // [e]
  nw[n] = h.norm;
  // folded router (stage 1): its logits without rstd(x), W_r (g * x)
  const unsigned raw = fold_.stage == 1 ? 1u << n : 0u;
  fold_.stage = 0;
  if (!gemv_multi_one({w, n + 1}, x, {y, n + 1}, norm, eps, qkv_rows_, stream_, {nw, n + 1}, raw))
    return false;
  if (raw) fold_.stage = 2;
  pf_ = {};
  pf_.logits = ps.logits;
  pf_.ids = ps.ids;
  pf_.e = int(h.router->rows);
  pf_.k = int(h.k);
  pf_table_ = h.table;
  return true;
}

CudaBackend::PredictSlots CudaBackend::predict_slots() const {
  uint8_t* p = predict_.as<uint8_t>();
  return {reinterpret_cast<float*>(p), reinterpret_cast<int32_t*>(p + PredictSlots::kIds),
          reinterpret_cast<unsigned long long*>(p + PredictSlots::kCounts)};
}

cuda::ExpertPredict CudaBackend::take_predict() {
  const cuda::ExpertPredict p = pf_;
  pf_ = {};
  return p;
}

std::optional<Backend::PredictionCounts> CudaBackend::expert_predictions() {
  if (!predict_on_ || predict_.bytes() == 0) return std::nullopt;
  unsigned long long c[3] = {};
  cuda_check(cudaStreamSynchronize(stream_), "prediction counters");
  cuda_check(cudaMemcpy(c, predict_slots().counts, sizeof c, cudaMemcpyDeviceToHost),
             "prediction counters");
  return PredictionCounts{c[1], c[0], c[2]};
}

}  // namespace moetier
