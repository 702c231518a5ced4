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
  if (!gemv_multi_one({w, n + 1}, x, {y, n + 1}, norm, eps, qkv_rows_, stream_, {nw, n + 1}))
    return false;
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
  unsigned long long c[2] = {};
  cuda_check(cudaStreamSynchronize(stream_), "prediction counters");
  cuda_check(cudaMemcpy(c, predict_slots().counts, sizeof c, cudaMemcpyDeviceToHost),
             "prediction counters");
  return PredictionCounts{c[1], c[0]};
}

}  // namespace moetier
