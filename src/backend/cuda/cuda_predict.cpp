// Predicted experts brought into L2 while a decode layer's attention runs
// (MOETIER_CUDA_PREDICT_MB; docs/cuda.md "Predicted experts", kernels/cuda/predict.cuh).
//
// Sequence, per MoE layer of a resident decode step (host side): the model's
// hint_experts names the layer's router, norm and table; the q/k/v GEMV
// (matmul_multi_rmsnorm -> predict_qkv) computes the router's logits on the
// layer's input as a fourth matrix with its own norm, into predict_; the o
// projection (matmul_add -> take_prefetch) launches one more block, which
// takes their top k and prefetches those experts' first gate / up rows while
// attention runs; route_moe_resident_add on the table has its router count
// how many of them it chose, and ends the layer's hint. Any other op order
// just drops the hint: nothing depends on it but L2's contents.
#include <cstdlib>

#include "backend/cuda/cuda_backend_impl.h"

namespace moetier {

// The default budget: megabytes of gate / up rows per layer (docs/cuda.md).
constexpr double kDefaultPredictMb = 0.0;

double read_predict_env() {
  const char* v = std::getenv("MOETIER_CUDA_PREDICT_MB");
  if (!v) return kDefaultPredictMb;
  char* end = nullptr;
  const double mb = std::strtod(v, &end);
  check(end != v && *end == '\0' && mb >= 0.0 && mb <= 65536.0,
        "MOETIER_CUDA_PREDICT_MB={}: expected megabytes from 0 to 65536", v);
  return mb;
}

void CudaBackend::hint_experts(const ExpertHint& h) {
  hint_.reset();
  if (predict_mb_ <= 0.0 || skip_ || legacy_decode_ || !fuse_ || !h.router || !h.norm) return;
  if (h.table < 0 || size_t(h.table) >= tables_.size() || h.k < 1 || h.k > 32) return;
  const Table& t = tables_[size_t(h.table)];
  if (t.any_host || t.inter < 1 || h.router->rows != t.num_experts || h.router->rows > 1024 ||
      h.k > h.router->rows)
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
  y[n] = predict_.as<float>();  // logits [e]
  nw[n] = h.norm;
  if (!gemv_multi_one({w, n + 1}, x, {y, n + 1}, norm, eps, qkv_rows_, stream_, {nw, n + 1}))
    return false;
  // The first rows of gate and up (with their scales) of each predicted expert, within budget.
  const Table& t = tables_[size_t(h.table)];
  const size_t row_w = t.bytes[0] / size_t(t.inter), row_s = t.bytes[3] / size_t(t.inter);
  const double per_row = 2.0 * double(h.k) * double(row_w + row_s);
  const auto rows = size_t(std::min(double(t.inter), predict_mb_ * 1e6 / per_row));
  auto pf_bytes = [](size_t b) { return uint32_t(std::min<size_t>(b, 0xffffffffu) / 16 * 16); };
  pf_ = {};
  pf_.logits = predict_.as<float>();
  pf_.table = tables_[size_t(h.table)].ptrs.as<cuda::ExpertPtrs>();
  pf_.ids = reinterpret_cast<int32_t*>(predict_.as<float>() + 1024);
  pf_.e = int(h.router->rows);
  pf_.k = int(h.k);
  pf_.bytes[0] = pf_.bytes[1] = pf_bytes(rows * row_w);
  pf_.bytes[2] = pf_.bytes[3] = pf_bytes(rows * row_s);
  pf_table_ = h.table;
  return true;
}

cuda::ExpertPrefetch CudaBackend::take_prefetch() {
  const cuda::ExpertPrefetch p = pf_;
  pf_ = {};
  return p;
}

std::optional<Backend::PredictionCounts> CudaBackend::expert_predictions() {
  if (predict_mb_ <= 0.0 || predict_.bytes() == 0) return std::nullopt;
  unsigned long long c[2] = {};
  cuda_check(cudaStreamSynchronize(stream_), "prediction counters");
  cuda_check(
      cudaMemcpy(c, predict_.as<uint8_t>() + 1024 * 4 + 32 * 4, sizeof c, cudaMemcpyDeviceToHost),
      "prediction counters");
  return PredictionCounts{c[1], c[0]};
}

}  // namespace moetier
