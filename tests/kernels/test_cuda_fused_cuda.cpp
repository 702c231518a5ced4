// The decode ops that take in their neighbours (label `cuda`; skips without
// a GPU), against the CPU backend's defaults, which compute the separate
// steps: matmul_multi_rmsnorm (the input norm inside the q/k/v GEMV),
// matmul_add (the residual add inside o_proj) and route_moe_resident_add (the
// post-attention norm inside the router and the quantize kernel, the
// residual add inside the down projection). Inputs are written by a kernel
// right before each call, as in a decode step, so the programmatic-launch
// ordering is exercised too. Tolerances as in test_cuda_ops_cuda.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/cuda_fixture.h"
#include "unit/numeric.h"
#if MOETIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "kernels/cuda/cuda.h"
#endif

using namespace moetier;
using namespace moetier::testing;

namespace {

// x - base, elementwise (what a residual add added).
std::vector<float> minus(const std::vector<float>& x, const std::vector<float>& base) {
  std::vector<float> d(x.size());
  for (size_t i = 0; i < x.size(); ++i) d[i] = x[i] - base[i];
  return d;
}

}  // namespace

TEST(CudaFused, NormGemvMatchesCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(41);
  struct Case {
    WeightEncoding enc;
    int64_t cols;
    std::vector<int64_t> rows;
  };
  for (const Case& c :
       {Case{WeightEncoding::BF16, 2048, {4096, 512, 515}},  // 4 rows per block
        Case{WeightEncoding::BF16, 2048, {2050, 9, 600}},    // 2 rows per block
        Case{WeightEncoding::BF16, 320, {67, 9, 130}}, Case{WeightEncoding::MXFP4, 2880, {300, 33}},
        Case{WeightEncoding::F32, 36, {5, 70}}})
    for (int64_t n : {1, 3}) {
      std::vector<DeviceBuffer> keep;
      std::vector<std::unique_ptr<HostMatrix>> m;
      std::vector<MatView> dev;
      for (int64_t rows : c.rows) {
        m.push_back(std::make_unique<HostMatrix>(c.enc, rows, c.cols, rng));
        dev.push_back(f.gpu->weights(m.back()->view, f.store));
      }
      const auto x = randn(size_t(n * c.cols), rng, 3.0f), nw = randn(size_t(c.cols), rng);
      std::vector<float*> outs;
      for (const auto& mm : m) outs.push_back(f.zeros(size_t(n * mm->view.rows), keep));
      float* dx = f.zeros(x.size(), keep);
      float* raw = f.up(x, keep);
      f.gpu->synchronize();
      f.gpu->add(dx, raw, int64_t(x.size()));  // x written by the kernel right before
      f.gpu->matmul_multi_rmsnorm(dev, dx, f.up(nw, keep), 1e-6f, n, outs, f.zeros(x.size(), keep));
      std::vector<float> xn(x.size());
      std::vector<std::vector<float>> ref;
      std::vector<float*> refp;
      for (const auto& mm : m) ref.emplace_back(size_t(n * mm->view.rows));
      for (auto& r : ref) refp.push_back(r.data());
      std::vector<MatView> host;
      for (const auto& mm : m) host.push_back(mm->view);
      f.cpu->matmul_multi_rmsnorm(host, x.data(), nw.data(), 1e-6f, n, refp, xn.data());
      const std::string what = std::to_string(int(c.enc)) + " cols " + std::to_string(c.cols) +
                               " n " + std::to_string(n);
      for (size_t i = 0; i < m.size(); ++i)
        EXPECT_LE(rel_err(f.down(outs[i], ref[i].size()), ref[i]), 1e-5) << what << " m " << i;
      EXPECT_EQ(f.down(dx, x.size()), x) << what;  // the input is left as it was
    }
}

// The q/k/v GEMV at each rows-per-block setting (MOETIER_CUDA_QKV_ROWS; the
// default picks by the row count), with its norm, one token.
TEST(CudaFused, NormGemvAtEveryRowsPerBlockMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(53);
  for (auto enc : {WeightEncoding::BF16, WeightEncoding::MXFP4})
    for (const char* r : {"1", "2", "4", "8"}) {
      EnvVar env("MOETIER_CUDA_QKV_ROWS", r);
      BackendPair f;
      std::vector<DeviceBuffer> keep;
      const int64_t cols = 1024;
      std::vector<std::unique_ptr<HostMatrix>> m;
      std::vector<MatView> dev, host;
      for (int64_t rows : {1001, 131, 7}) {
        m.push_back(std::make_unique<HostMatrix>(enc, rows, cols, rng));
        dev.push_back(f.gpu->weights(m.back()->view, f.store));
        host.push_back(m.back()->view);
      }
      const auto x = randn(size_t(cols), rng, 2.0f), nw = randn(size_t(cols), rng);
      std::vector<float*> outs;
      std::vector<std::vector<float>> ref;
      std::vector<float*> refp;
      for (const auto& mm : m) {
        outs.push_back(f.zeros(size_t(mm->view.rows), keep));
        ref.emplace_back(size_t(mm->view.rows));
      }
      for (auto& v : ref) refp.push_back(v.data());
      std::vector<float> xn(x.size());
      f.cpu->matmul_multi_rmsnorm(host, x.data(), nw.data(), 1e-6f, 1, refp, xn.data());
      f.gpu->matmul_multi_rmsnorm(dev, f.up(x, keep), f.up(nw, keep), 1e-6f, 1, outs,
                                  f.zeros(x.size(), keep));
      for (size_t i = 0; i < m.size(); ++i)
        EXPECT_LE(rel_err(f.down(outs[i], ref[i].size()), ref[i]), 1e-5)
            << int(enc) << " rows per block " << r << " m " << i;
    }
}

TEST(CudaFused, MatmulAddMatchesCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(43);
  for (auto enc : {WeightEncoding::BF16, WeightEncoding::MXFP4})
    for (int64_t n : {1, 3, 80}) {  // one-token GEMV, the f32 chunk path, the bf16 GEMM
      std::vector<DeviceBuffer> keep;
      const int64_t rows = 2056, cols = 4096;
      HostMatrix w(enc, rows, cols, rng);
      const MatView dw = f.gpu->weights(w.view, f.store);
      const auto x = randn(size_t(n * cols), rng), y0 = randn(size_t(n * rows), rng, 4.0f);
      std::vector<float> y = y0, tmp(y0.size());
      f.cpu->matmul_add(w.view, x.data(), n, y.data(), tmp.data());
      float* dy = f.up(y0, keep);
      float* dx = f.zeros(x.size(), keep);
      float* raw = f.up(x, keep);
      f.gpu->synchronize();
      f.gpu->add(dx, raw, int64_t(x.size()));
      f.gpu->matmul_add(dw, dx, n, dy, f.zeros(y0.size(), keep));
      const auto got = f.down(dy, y.size());
      const double tol = n > 64 ? 1.5e-2 : 1e-5;  // the GEMM rounds to bf16
      const std::string what = std::to_string(int(enc)) + " n " + std::to_string(n);
      EXPECT_LE(rel_err(got, y), tol) << what;
      EXPECT_LE(rel_err(minus(got, y0), minus(y, y0)), tol) << what;
    }
}

// x += the MoE block of rmsnorm(x): ids equal the CPU router's on rmsnorm(x),
// x within 1e-5 of the CPU's (its added part within 1e-4), two calls back to
// back with x written by a kernel right before each; both activation modes
// (q8: the fused kernels; f32: the default composition of CUDA ops), and with
// the fused kernels on (MOETIER_CUDA_FUSE=1; x quantized by the router,
// MOETIER_CUDA_ROUTER_Q8=1, or by a kernel of its own, 0) and off (0: the
// default composition); probs within 1e-5 of the CPU's, as the weights.
TEST(CudaFused, RoutedResidentStepWithNormAndAddMatchesCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t experts, k, H, I;
  };
  for (const char* fuse : {"1", "1r", "0"})
    for (const char* mode : {"q8", "f32"}) {
      EnvVar env("MOETIER_CUDA_FUSE", fuse[0] == '1' ? "1" : "0");
      EnvVar rq8("MOETIER_CUDA_ROUTER_Q8", fuse[1] == 'r' ? "0" : "1");
      ActMode act(mode);
      BackendPair f;
      std::mt19937 rng(47);
      for (const Case& c : {Case{16, 8, 2048, 768}, Case{5, 3, 96, 64}, Case{10, 6, 4096, 2048},
                            Case{40, 32, 160, 96}, Case{8, 4, 2880, 1024}}) {
        const ExpertSet ex(f, WeightEncoding::MXFP4, c.experts, c.H, c.I, rng);
        HostMatrix router(WeightEncoding::BF16, c.experts, c.H, rng);
        const MatView dr = f.gpu->weights(router.view, f.store);
        const int table = f.gpu->register_experts(ex.dev);
        const auto nw = randn(size_t(c.H), rng);
        std::vector<DeviceBuffer> keep;
        float* dnw = f.up(nw, keep);
        struct Call {
          std::vector<float> x, ref, w, p;
          std::vector<int32_t> ids;
          float *dp, *dw, *dx, *raw;
          int32_t* dids;
        };
        Call calls[2];
        for (Call& k : calls) {  // the CPU: norm, router, experts, add
          k.x = randn(size_t(c.H), rng, 2.0f);
          std::vector<float> xn(k.x.size()), w(size_t(c.k));
          std::vector<float>& p = k.p;
          p.resize(size_t(c.experts));
          f.cpu->rmsnorm(k.x.data(), nw.data(), 1, c.H, 1e-6f, xn.data());
          k.ids.resize(size_t(c.k));
          f.cpu->route_topk(router.view, xn.data(), 1, c.k, true, p.data(), k.ids.data(), w.data());
          k.w = w;
          const auto moe = ex.cpu_out(f, k.ids, w, xn, c.H, c.I);
          k.ref = k.x;
          for (size_t i = 0; i < moe.size(); ++i) k.ref[i] += moe[i];
          k.dp = f.zeros(size_t(c.experts), keep);
          k.dw = f.zeros(size_t(c.k), keep);
          keep.push_back(f.gpu->alloc(size_t(c.k) * 4));
          k.dids = keep.back().as<int32_t>();
          k.dx = f.zeros(size_t(c.H), keep);
          k.raw = f.up(k.x, keep);
        }
        Backend::NormAdd na{dnw, 1e-6f, f.zeros(size_t(c.H), keep), f.zeros(size_t(c.H), keep)};
        f.gpu->synchronize();
        for (Call& k : calls) {  // back to back on the backend's stream
          f.gpu->add(k.dx, k.raw, c.H);
          f.gpu->route_moe_resident_add(dr, table, k.dx, c.k, true, k.dp, k.dids, k.dw, c.H, c.I,
                                        na);
        }
        for (int i = 0; i < 2; ++i) {
          const Call& k = calls[i];
          std::vector<int32_t> gids(k.ids.size());
          f.gpu->to_host(gids.data(), k.dids, gids.size() * 4);
          const auto got = f.down(k.dx, size_t(c.H));
          const std::string what = std::string("fuse ") + fuse + " " + mode + " " +
                                   std::to_string(c.H) + " x " + std::to_string(c.I) + " call " +
                                   std::to_string(i);
          EXPECT_EQ(gids, k.ids) << what;
          const auto gw = f.down(k.dw, k.w.size());
          for (size_t j = 0; j < gw.size(); ++j)
            EXPECT_NEAR(gw[j], k.w[j], 1e-5) << what << " " << j;
          const auto gp = f.down(k.dp, k.p.size());
          for (size_t j = 0; j < gp.size(); ++j)
            EXPECT_NEAR(gp[j], k.p[j], 1e-5) << what << " probs " << j;
          EXPECT_LE(rel_err(got, k.ref), 1e-5) << what;
          EXPECT_LE(rel_err(minus(got, k.x), minus(k.ref, k.x)), 1e-4) << what;
        }
      }
    }
}

// cuda::router_topk's RouterQ8 (x quantized inside the router for the q8 MoE
// kernels): every x block is written, each of the router's blocks taking
// blocks b, b + grid, ... (more x blocks than router blocks: 2880 columns, 4
// router blocks at 2 rows a block; fewer: 160 columns, 20 blocks), at 1, 4 and
// 2 (the default) rows a block, with bf16 and MXFP4 router weights, as a scalar
// q8 quantize of rmsnorm(x) computed in double (32 codes in order, d = amax /
// 127, codes rounded half to even): each code within 1 (the router's 1 / rms
// comes from a float sum; a flip needs a product within an ulp of a half), at
// most 1% of codes off, each scale within 1e-5; the router's ids equal those
// of a launch without it; with and without the norm. The router quantizes
// after its count (by warp 1 beside the top-k; in a block of one warp, 96 and
// 160 columns, after it). With RouterQ8::stash (block b's q8 block from the
// values its dot read) every code and scale is the same, bit for bit.
TEST(CudaFused, RouterQuantizesXForTheQ8Kernels) {
  REQUIRE_GPU();
#if MOETIER_HAVE_CUDA
  BackendPair f;
  std::mt19937 rng(53);
  for (const int rows : {1, 4, 2})  // the last is the default (process-wide)
    for (auto [e, cols, norm, enc] :
         {std::tuple<int64_t, int64_t, bool, WeightEncoding>{16, 2048, true, WeightEncoding::BF16},
          {5, 96, true, WeightEncoding::BF16},
          {40, 160, false, WeightEncoding::BF16},
          {8, 2880, true, WeightEncoding::BF16},
          {32, 2880, true, WeightEncoding::MXFP4},
          {256, 4096, false, WeightEncoding::BF16},
          {256, 4096, true, WeightEncoding::BF16}}) {
      cuda::set_router_rows(rows);
      const std::string what = std::to_string(e) + " x " + std::to_string(cols) +
                               (norm ? " norm" : "") + " enc " + std::to_string(int(enc)) +
                               " rows " + std::to_string(rows);
      HostMatrix router(enc, e, cols, rng);
      const MatView dr = f.gpu->weights(router.view, f.store);
      std::vector<DeviceBuffer> keep;
      const auto x = randn(size_t(cols), rng, 2.0f), nw = randn(size_t(cols), rng);
      const int64_t nb = cols / 32, k = std::min<int64_t>(e, 4);
      float* dx = f.up(x, keep);
      float* dnw = norm ? f.up(nw, keep) : nullptr;
      float* probs = f.zeros(size_t(e), keep);
      float* w = f.zeros(size_t(k), keep);
      auto* done = reinterpret_cast<unsigned*>(f.zeros(1, keep));
      float* xq = f.zeros(size_t(nb * 8), keep);  // 32 int8 codes a block
      float* xd = f.zeros(size_t(nb), keep);
      float* table = f.zeros(300, keep);  // prefetched (1200 bytes: not whole lines)
      int32_t* ids[2];
      for (auto& p : ids)
        keep.push_back(f.gpu->alloc(size_t(k) * 4)), p = keep.back().as<int32_t>();
      f.gpu->synchronize();
      for (int q = 0; q < 2; ++q) {
        cuda::RouterQ8 q8;
        if (q == 1) q8 = {xq, xd, table, 1200};
        ASSERT_TRUE(cuda::router_topk(dr, dx, k, true, probs, ids[q], w, done, nullptr, dnw, 1e-6f,
                                      nullptr, q8))
            << what;
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      std::vector<int32_t> id0(static_cast<size_t>(k)), id1(static_cast<size_t>(k));
      f.gpu->to_host(id0.data(), ids[0], id0.size() * 4);
      f.gpu->to_host(id1.data(), ids[1], id1.size() * 4);
      EXPECT_EQ(id0, id1) << what;
      std::vector<float> v(x);
      if (norm) {
        double ss = 0;
        for (float a : x) ss += double(a) * a;
        const float r = float(1.0 / std::sqrt(ss / double(cols) + 1e-6));
        for (size_t i = 0; i < v.size(); ++i) v[i] = nw[i] * (x[i] * r);
      }
      std::vector<int8_t> want_q(static_cast<size_t>(cols)), got_q(static_cast<size_t>(cols));
      std::vector<float> want_d(static_cast<size_t>(nb));
      for (int64_t b = 0; b < nb; ++b) {  // q8 blocks of 32 in order (d = amax / 127)
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(v[size_t(32 * b + j)]));
        want_d[size_t(b)] = amax / 127.0f;
        const float id = 127.0f / amax;
        for (int j = 0; j < 32; ++j)
          want_q[size_t(32 * b + j)] = int8_t(std::nearbyint(v[size_t(32 * b + j)] * id));
      }
      f.gpu->to_host(got_q.data(), xq, got_q.size());
      const std::vector<float> got_d = f.down(xd, size_t(nb));
      int off = 0;
      for (int64_t i = 0; i < cols; ++i) {
        ASSERT_LE(std::abs(int(got_q[size_t(i)]) - int(want_q[size_t(i)])), 1) << what << " " << i;
        off += got_q[size_t(i)] != want_q[size_t(i)];
      }
      EXPECT_LE(off, cols / 100) << what;
      for (int64_t b = 0; b < nb; ++b)
        EXPECT_NEAR(got_d[size_t(b)], want_d[size_t(b)], 1e-5 * std::abs(want_d[size_t(b)]))
            << what << " block " << b;
      // Quantized from the dot's own copy of x (RouterQ8::stash): the same bits.
      float* xq2 = f.zeros(size_t(nb * 8), keep);
      float* xd2 = f.zeros(size_t(nb), keep);
      cuda::RouterQ8 q8s{xq2, xd2, table, 1200};
      q8s.stash = true;
      ASSERT_TRUE(cuda::router_topk(dr, dx, k, true, probs, ids[1], w, done, nullptr, dnw, 1e-6f,
                                    nullptr, q8s))
          << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      std::vector<int8_t> stash_q(static_cast<size_t>(cols));
      f.gpu->to_host(stash_q.data(), xq2, stash_q.size());
      EXPECT_EQ(stash_q, got_q) << what << " stash";
      EXPECT_EQ(f.down(xd2, size_t(nb)), got_d) << what << " stash";
    }
#endif
}

// Gate/up started on predicted experts before its wait (Q8Fuse::predicted,
// MOETIER_CUDA_PREDICT=early) gives the bits of the plain step whatever the
// prediction: the router's ids, the same ids in another order, ids the router
// did not choose, some of each, and a step whose predicted blocks all restart;
// k from 1 to 32; with all four of gate/up's first passes started before its
// wait (the default), two and one (MoeQ8Kernels::predict_passes). The
// plain step (x quantized by its own kernel) leaves x's q8 blocks in the
// scratch that the predicted steps then read (x_ready), as the router's would;
// h's blocks are poisoned before each, so a slot that no block writes shows.
TEST(CudaFused, GateUpOnPredictedExpertsGivesThePlainBits) {
  REQUIRE_GPU();
#if MOETIER_HAVE_CUDA
  BackendPair f;
  std::mt19937 rng(59);
  {
    for (auto [e, k, H, I] : {std::tuple<int, int, int64_t, int64_t>{40, 8, 1024, 256},
                              {12, 1, 2048, 96},
                              {70, 32, 1056, 64},
                              {24, 6, 4096, 512}}) {
      const std::string what = std::to_string(e) + " experts, k " + std::to_string(k) + ", " +
                               std::to_string(H) + " x " + std::to_string(I);
      const ExpertSet ex(f, WeightEncoding::MXFP4, e, H, I, rng);
      std::vector<cuda::ExpertPtrs> ptrs;
      for (const ExpertView& v : ex.dev)
        ptrs.push_back(
            {{v.gate.data, v.up.data, v.down.data}, {v.gate.scales, v.up.scales, v.down.scales}});
      std::vector<DeviceBuffer> keep;
      keep.push_back(f.gpu->alloc(ptrs.size() * sizeof(cuda::ExpertPtrs)));
      const auto* table = keep.back().as<cuda::ExpertPtrs>();
      f.gpu->to_device(keep.back().data(), ptrs.data(), ptrs.size() * sizeof(cuda::ExpertPtrs));
      std::vector<int32_t> all(static_cast<size_t>(e));
      for (int i = 0; i < e; ++i) all[size_t(i)] = i;
      std::shuffle(all.begin(), all.end(), rng);
      const std::vector<int32_t> ids(all.begin(), all.begin() + k);
      std::vector<int32_t> perm = ids, other(all.end() - k, all.end()), mixed = ids;
      std::reverse(perm.begin(), perm.end());
      for (int i = 0; i < k; i += 2) mixed[size_t(i)] = other[size_t(i)];
      std::rotate(mixed.begin(), mixed.begin() + k / 2, mixed.end());
      const auto x = randn(size_t(H), rng, 1.0f), w = randn(size_t(k), rng, 0.3f);
      auto up_ids = [&](const std::vector<int32_t>& v) {
        keep.push_back(f.gpu->alloc(v.size() * 4));
        f.gpu->to_device(keep.back().data(), v.data(), v.size() * 4);
        return keep.back().as<int32_t>();
      };
      const int32_t* dids = up_ids(ids);
      const float* dw = f.up(w, keep);
      const float* dx = f.up(x, keep);
      keep.push_back(f.gpu->alloc(cuda::moe_q8_scratch_bytes(k, H, I)));
      void* scratch = keep.back().data();
      float* out0 = f.zeros(size_t(H), keep);
      // The steps run on the legacy stream, the uploads, zeros and reads on the
      // backend's: the device is synchronized around each step.
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cuda::moe_decode_q8(table, WeightEncoding::MXFP4, true, dids, dw, k, dx, H, I,
                                    scratch, out0, false, nullptr),
                1)
          << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const std::vector<float> want = f.down(out0, size_t(H));
      const std::vector<std::pair<const char*, std::vector<int32_t>>> preds = {
          {"the router's", ids}, {"reversed", perm}, {"none chosen", other}, {"mixed", mixed}};
      const int64_t nb = H / 32, nh = int64_t(k) * (I / 32);  // moe_q8_x's layout
      for (const int npre : {4, 2, 1})
        for (const auto& [name, pred] : preds) {
          cuda::MoeQ8Kernels mk;
          mk.predict_passes = npre;
          cuda::set_moe_q8_kernels(mk);
          // h's q8 blocks and scales poisoned (NaN): a slot no block writes shows
          auto* sc = static_cast<uint8_t*>(scratch);
          ASSERT_EQ(cudaMemset(sc + 32 * nb, 0xff, size_t(32 * nh)), cudaSuccess);
          ASSERT_EQ(cudaMemset(sc + 32 * (nb + nh) + 4 * nb, 0xff, size_t(4 * nh)), cudaSuccess);
          cuda::Q8Fuse q;
          q.x_ready = true;
          q.predicted = up_ids(pred);
          float* out = f.zeros(size_t(H), keep);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_EQ(cuda::moe_decode_q8(table, WeightEncoding::MXFP4, true, dids, dw, k, dx, H, I,
                                        scratch, out, false, nullptr, q),
                    1)
              << what << ", " << name;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << ", " << name;
          const std::vector<float> got = f.down(out, size_t(H));
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
              << what << ", predicted " << name << ", " << npre
              << " passes early: max |diff| / max |ref| " << rel_err(got, want);
          cuda::set_moe_q8_kernels({});
        }
    }
  }
#endif
}
