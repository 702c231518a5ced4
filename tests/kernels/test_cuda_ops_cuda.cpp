// The CUDA backend op by op against the CPU backend (label `cuda`; skips
// without a GPU), the way llama.cpp's test-backend-ops compares backends:
// random inputs (never zeros), odd shapes, normalized error
// ||cuda - cpu|| / ||cpu||. Tolerances: 1e-5 for the f32 paths (both sides
// f32, only the summation order differs), 1.5e-2 for the bf16 tensor-core
// GEMM of long chunks (activations and weights rounded to bf16: ~2^-8 each).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cb3.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cuda_fixture.h"
#include "unit/numeric.h"
#if MOETIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda.h"
#endif

using namespace moetier;
using namespace moetier::testing;

struct MatmulCase {
  WeightEncoding enc;
  int64_t rows, cols, n;
};

class CudaMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(CudaMatmul, MatchesCpu) {
  REQUIRE_GPU();
  const auto [enc, rows, cols, n] = GetParam();
  BackendPair f;
  std::mt19937 rng(uint32_t(rows * 131 + cols * 7 + n));
  HostMatrix w(enc, rows, cols, rng);
  const auto x = randn(size_t(n * cols), rng);
  std::vector<float> ref(size_t(n * rows));
  f.cpu->matmul(w.view, x.data(), n, ref.data());
  std::vector<DeviceBuffer> keep;
  const MatView dw = f.gpu->weights(w.view, f.store);
  float* dx = f.up(x, keep);
  float* dy = f.zeros(size_t(n * rows), keep);
  f.gpu->matmul(dw, dx, n, dy);
  const double tol = n > 64 ? 1.5e-2 : 1e-5;
  EXPECT_LE(rel_err(f.down(dy, size_t(n * rows)), ref), tol)
      << int(enc) << " " << rows << "x" << cols << " n " << n;
}

std::vector<MatmulCase> matmul_cases() {
  std::vector<MatmulCase> c;
  for (auto e :
       {WeightEncoding::F32, WeightEncoding::BF16, WeightEncoding::MXFP4, WeightEncoding::CB3})
    // 2051 x 2080: the two-row blocks of the decode GEMV (rows >= 2048), with
    // an odd last block; 300 x 4128: more chunks than a block has threads.
    for (auto [r, k] : {std::pair<int64_t, int64_t>{67, 160},
                        {9, 96},
                        {300, 512},
                        {5, 37},
                        {2051, 2080},
                        {300, 4128}})
      for (int64_t n : {1, 3, 8, 11, 70}) {
        if (e == WeightEncoding::MXFP4 && k % 32) continue;
        c.push_back({e, r, k, n});
      }
  // 4102 x 2080, one token: the four-row blocks (rows >= 4096), odd last block.
  for (auto e : {WeightEncoding::F32, WeightEncoding::BF16, WeightEncoding::MXFP4})
    c.push_back({e, 4102, 2080, 1});
  return c;
}
INSTANTIATE_TEST_SUITE_P(OddShapes, CudaMatmul, ::testing::ValuesIn(matmul_cases()));

TEST(CudaOps, ElementwiseNormRopeMatchCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(5);
  std::vector<DeviceBuffer> keep;
  const int64_t n = 7, dim = 200, heads = 3, hd = 64;
  auto x = randn(size_t(n * dim), rng), w = randn(size_t(dim), rng),
       y = randn(size_t(n * dim), rng);
  // rmsnorm
  std::vector<float> ref(x.size());
  f.cpu->rmsnorm(x.data(), w.data(), n, dim, 1e-6f, ref.data());
  float* dx = f.up(x, keep);
  float* dw = f.up(w, keep);
  float* dout = f.zeros(x.size(), keep);
  f.gpu->rmsnorm(dx, dw, n, dim, 1e-6f, dout);
  EXPECT_LE(rel_err(f.down(dout, x.size()), ref), 1e-6);
  // add, add_rows, silu_mul
  float* dy = f.up(y, keep);
  std::vector<float> a = x;
  f.cpu->add(a.data(), y.data(), n * dim);
  f.gpu->add(dx, dy, n * dim);
  EXPECT_LE(rel_err(f.down(dx, x.size()), a), 1e-7);
  f.cpu->add_rows(a.data(), w.data(), n, dim);
  f.gpu->add_rows(dx, dw, n, dim);
  EXPECT_LE(rel_err(f.down(dx, x.size()), a), 1e-7);
  f.cpu->silu_mul(a.data(), y.data(), n * dim);
  f.gpu->silu_mul(dx, dy, n * dim);
  EXPECT_LE(rel_err(f.down(dx, x.size()), a), 1e-6);
  // rope at position 1000 (large angles)
  auto q = randn(size_t(n * heads * hd), rng);
  std::vector<float> inv(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv[size_t(i)] = 1.0f / std::pow(10000.0f, float(2 * i) / hd);
  float* dq = f.up(q, keep);
  float* dinv = f.up(inv, keep);
  f.cpu->rope(q.data(), n, heads, hd, 1000, inv.data());
  f.gpu->rope(dq, n, heads, hd, 1000, dinv);
  EXPECT_LE(rel_err(f.down(dq, q.size()), q), 1e-6);
}

// The fused steps against the CPU backend's compositions of the plain ops.
TEST(CudaOps, FusedStepsMatchCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(23);
  std::vector<DeviceBuffer> keep;
  // matmul_multi: three weights of one width (one launch at n == 1), and n == 3
  for (auto enc : {WeightEncoding::BF16, WeightEncoding::MXFP4, WeightEncoding::F32})
    for (int64_t t : {1, 3}) {
      const int64_t cols = 320;
      std::vector<std::unique_ptr<HostMatrix>> m;
      std::vector<MatView> dev;
      for (int64_t rows : {67, 9, 130}) {
        m.push_back(std::make_unique<HostMatrix>(enc, rows, cols, rng));
        dev.push_back(f.gpu->weights(m.back()->view, f.store));
      }
      const auto xin = randn(size_t(t * cols), rng);
      float* dxin = f.up(xin, keep);
      std::vector<float*> outs;
      for (const auto& mm : m) outs.push_back(f.zeros(size_t(t * mm->view.rows), keep));
      f.gpu->matmul_multi(dev, dxin, t, outs);
      for (size_t i = 0; i < m.size(); ++i) {
        std::vector<float> r(size_t(t * m[i]->view.rows));
        f.cpu->matmul(m[i]->view, xin.data(), t, r.data());
        EXPECT_LE(rel_err(f.down(outs[i], r.size()), r), 1e-5) << int(enc) << " n " << t;
      }
    }
  // qk_norm_rope_kv with and without norms, at position 37 of a 50-row cache
  const int64_t n = 3, nh = 6, nkv = 2, hd = 64, pos = 37, cap = 50;
  std::vector<float> inv(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(1e6f, float(2 * i) / hd);
  for (bool norms : {true, false}) {
    auto q = randn(size_t(n * nh * hd), rng), k = randn(size_t(n * nkv * hd), rng),
         v = randn(size_t(n * nkv * hd), rng), qn = randn(size_t(hd), rng),
         kn = randn(size_t(hd), rng);
    std::vector<float> kc(size_t(cap * nkv * hd), 0.0f), vc = kc, q2 = q, k2 = k;
    float* dq = f.up(q, keep);
    float* dk = f.up(k, keep);
    float* dkc = f.zeros(kc.size(), keep);
    float* dvc = f.zeros(vc.size(), keep);
    f.cpu->qk_norm_rope_kv(q2.data(), k2.data(), v.data(), norms ? qn.data() : nullptr,
                           norms ? kn.data() : nullptr, n, nh, nkv, hd, 1e-6f, pos, inv.data(),
                           kc.data(), vc.data());
    f.gpu->qk_norm_rope_kv(dq, dk, f.up(v, keep), norms ? f.up(qn, keep) : nullptr,
                           norms ? f.up(kn, keep) : nullptr, n, nh, nkv, hd, 1e-6f, pos,
                           f.up(inv, keep), dkc, dvc);
    EXPECT_LE(rel_err(f.down(dq, q.size()), q2), 1e-6) << norms;
    EXPECT_LE(rel_err(f.down(dk, k.size()), k2), 1e-6) << norms;
    EXPECT_LE(rel_err(f.down(dkc, kc.size()), kc), 1e-6) << norms;
    EXPECT_EQ(f.down(dvc, vc.size()), vc) << norms;
  }
}

TEST(CudaOps, AttentionMatchesCpuForDecodeSplitsAndPrefill) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(7);
  struct Heads {
    int64_t heads, kvh, hd;
  };
  // Groups of 3, 8, 16 and 20 query heads per kv head (one, one, two and three
  // heads per warp), head_dim 72 / 128 / 256 / 64; lengths from one position to
  // several tiles per split.
  for (const Heads& s : {Heads{6, 2, 72}, Heads{32, 4, 128}, Heads{16, 1, 256}, Heads{40, 2, 64}})
    for (auto [n_q, first] :
         {std::pair<int64_t, int64_t>{1, 0}, {1, 37}, {1, 1700}, {1, 4999}, {5, 0}, {9, 300}}) {
      if (n_q > 1 && s.hd != 72) continue;
      const int64_t heads = s.heads, kvh = s.kvh, hd = s.hd, len = first + n_q;
      auto q = randn(size_t(n_q * heads * hd), rng);
      auto k = randn(size_t(len * kvh * hd), rng), v = randn(size_t(len * kvh * hd), rng);
      std::vector<float> ref(q.size());
      f.cpu->attention(q.data(), k.data(), v.data(), n_q, first, heads, kvh, hd, 0.117f,
                       ref.data());
      std::vector<DeviceBuffer> keep;
      float* dq = f.up(q, keep);
      float* dk = f.up(k, keep);
      float* dv = f.up(v, keep);
      float* dout = f.zeros(q.size(), keep);
      f.gpu->attention(dq, dk, dv, n_q, first, heads, kvh, hd, 0.117f, dout);
      EXPECT_LE(rel_err(f.down(dout, q.size()), ref), 1e-5)
          << n_q << " at " << first << ", heads " << heads << "/" << kvh << " of " << hd;
    }
}

// One decode token's per-head steps and attention in one launch (the last
// block of each kv head merging the splits) against the CPU's composition:
// the output and the cache rows written at the token's position. One backend
// for every case, so each launch must leave the block counters at 0.
TEST(CudaOps, FusedDecodeAttentionMatchesCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(23);
  struct Heads {
    int64_t heads, kvh, hd;
  };
  int c = 0;
  // 68: head_dim % 8 == 4; {4, 1, 128} and {2, 2, 128}: head_dim 128 with fewer
  // than 8 heads per kv head (tiles in several rounds) and with one; {8, 1, 128}:
  // the DeepSeek-shaped model's group.
  for (const Heads& s : {Heads{6, 2, 72}, Heads{32, 4, 128}, Heads{16, 1, 256}, Heads{40, 2, 64},
                         Heads{6, 2, 68}, Heads{4, 1, 128}, Heads{2, 2, 128}, Heads{8, 1, 128}})
    // 2100, 2144 and 4990: more tiles than splits, so the last split's block
    // finds the token's position in a later tile than its first (2144: as
    // that tile's only row).
    for (int64_t pos : {0, 31, 32, 1700, 2100, 2144, 2145, 4990, 4999}) {
      const bool norms = ++c % 3 != 0;  // every third case without q/k norms
      const int64_t nh = s.heads, nkv = s.kvh, hd = s.hd, row = nkv * hd, cap = pos + 3;
      auto q = randn(size_t(nh * hd), rng), k = randn(size_t(row), rng),
           v = randn(size_t(row), rng);
      auto kc = randn(size_t(cap * row), rng), vc = randn(size_t(cap * row), rng);
      auto qn = randn(size_t(hd), rng), kn = randn(size_t(hd), rng);
      std::vector<float> inv(size_t(hd / 2));
      for (int64_t i = 0; i < hd / 2; ++i)
        inv[size_t(i)] = 1.0f / std::pow(10000.0f, float(2 * i) / float(hd));
      std::vector<DeviceBuffer> keep;
      float* dq = f.up(q, keep);
      float* dk = f.up(k, keep);
      float* dv = f.up(v, keep);
      float* dkc = f.up(kc, keep);
      float* dvc = f.up(vc, keep);
      const float* dqn = norms ? f.up(qn, keep) : nullptr;
      const float* dkn = norms ? f.up(kn, keep) : nullptr;
      float* dinv = f.up(inv, keep);
      float* dout = f.zeros(q.size(), keep);
      std::vector<float> ref(q.size());
      f.cpu->attend_decode(q.data(), k.data(), v.data(), norms ? qn.data() : nullptr,
                           norms ? kn.data() : nullptr, nh, nkv, hd, 1e-6f, pos, inv.data(),
                           kc.data(), vc.data(), 0.117f, ref.data());
      f.gpu->attend_decode(dq, dk, dv, dqn, dkn, nh, nkv, hd, 1e-6f, pos, dinv, dkc, dvc, 0.117f,
                           dout);
      const std::string what = std::to_string(nh) + "/" + std::to_string(nkv) + " of " +
                               std::to_string(hd) + " at " + std::to_string(pos);
      EXPECT_LE(rel_err(f.down(dout, q.size()), ref), 1e-5) << what;
      EXPECT_EQ(f.down(dvc, vc.size()), vc) << what;  // row pos is v, the others untouched
      EXPECT_LE(rel_err(f.down(dkc, kc.size()), kc), 1e-6) << what;
      const auto gk = f.down(dkc + pos * row, size_t(row));
      const std::vector<float> rk(kc.begin() + pos * row, kc.begin() + (pos + 1) * row);
      EXPECT_LE(rel_err(gk, rk), 1e-6) << what;
    }
}

// The first maximum over one to several blocks, with the maximum repeated
// (the lowest index wins), twice per size (the block counter is reset);
// at 16, 64 and 32 (the default) values a thread at the least
// (MOETIER_CUDA_ARGMAX_VALUES). 8192, the DeepSeek-shaped vocabulary: one
// block at 32 and 64 (no count), two at 16; 600001: 74 blocks at 32, 37 at 64,
// and at 16 the cap of 128 blocks, of more than 16 values a thread.
TEST(CudaOps, ArgmaxIsTheFirstMaximum) {
  REQUIRE_GPU();
  std::mt19937 rng(29);
  for (const char* per : {"16", "64", "32"}) {  // the last is the default (process-wide)
    EnvVar env("MOETIER_CUDA_ARGMAX_VALUES", per);
    BackendPair f;  // (its backend sets the count)
    for (int64_t n : {1, 7, 1000, 4099, 8192, 151936, 300001, 600001})
      for (int rep = 0; rep < 2; ++rep) {
        auto x = randn(size_t(n), rng, 3.0f);
        std::uniform_int_distribution<int64_t> at(0, n - 1);
        const int64_t a = at(rng), b = at(rng);
        x[size_t(a)] = x[size_t(b)] = 50.0f;
        std::vector<DeviceBuffer> keep;
        float* dx = f.up(x, keep);
        keep.push_back(f.gpu->alloc(4));
        auto* dout = keep.back().as<int32_t>();
        f.gpu->argmax(dx, n, dout);
        int32_t got = -1;
        f.gpu->to_host(&got, dout, 4);
        EXPECT_EQ(got, int32_t(std::min(a, b))) << n << ", " << per << " a thread";
      }
  }
}

TEST(CudaOps, RouterAndEmbeddingMatchCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(9);
  std::vector<DeviceBuffer> keep;
  const int64_t n = 5;
  // k = 32 (every lane writes a round) and logits with many ties (the lower
  // id wins, as on the CPU); past 32 is refused.
  for (auto [e, k, renorm, ties] : {std::tuple<int64_t, int64_t, bool, bool>{128, 8, true, false},
                                    {256, 6, true, false},
                                    {60, 4, false, false},
                                    {1000, 3, true, false},
                                    {300, 32, true, false},
                                    {96, 32, false, false},
                                    {200, 12, true, true}}) {
    auto logits = randn(size_t(n * e), rng, 2.0f);
    if (ties)
      for (float& v : logits) v = std::floor(v);
    std::vector<float> p(logits.size()), w(size_t(n * k));
    std::vector<int32_t> ids(size_t(n * k));
    f.cpu->softmax_topk(logits.data(), n, e, k, renorm, p.data(), ids.data(), w.data());
    float* dl = f.up(logits, keep);
    keep.push_back(f.gpu->alloc(ids.size() * 4));
    auto* dids = keep.back().as<int32_t>();
    float* dw = f.zeros(w.size(), keep);
    f.gpu->softmax_topk(dl, n, e, k, renorm, dl, dids, dw);
    std::vector<int32_t> gids(ids.size());
    f.gpu->to_host(gids.data(), dids, gids.size() * 4);
    EXPECT_EQ(gids, ids) << e;
    EXPECT_LE(rel_err(f.down(dw, w.size()), w), 1e-6) << e;
    EXPECT_LE(rel_err(f.down(dl, p.size()), p), 1e-6) << e;
  }
  for (const int64_t e : {60, 256}) {  // a NaN logit: every probability NaN, real ids (the CPU's)
    auto logits = randn(size_t(e), rng, 2.0f);
    logits[7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> p(logits.size()), w(6);
    std::vector<int32_t> ids(6);
    f.cpu->softmax_topk(logits.data(), 1, e, 6, true, p.data(), ids.data(), w.data());
    float* dl = f.up(logits, keep);
    keep.push_back(f.gpu->alloc(ids.size() * 4));
    auto* dids = keep.back().as<int32_t>();
    f.gpu->softmax_topk(dl, 1, e, 6, true, dl, dids, f.zeros(w.size(), keep));
    std::vector<int32_t> gids(ids.size());
    f.gpu->to_host(gids.data(), dids, gids.size() * 4);
    EXPECT_EQ(gids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5})) << e;
    EXPECT_EQ(gids, ids) << e;
  }
  {  // more than 32 experts a token: refused with a message, nothing launched
    float* dl = f.up(randn(64, rng, 1.0f), keep);
    keep.push_back(f.gpu->alloc(33 * 4));
    auto* dids = keep.back().as<int32_t>();
    float* dw = f.zeros(33, keep);
    EXPECT_THROW(f.gpu->softmax_topk(dl, 1, 64, 33, true, dl, dids, dw), Error);
  }
  for (auto enc : {WeightEncoding::BF16, WeightEncoding::MXFP4}) {
    HostMatrix t(enc, 50, 96, rng);
    const std::vector<int32_t> toks{3, 49, 0, 3};
    std::vector<float> ref(4 * 96);
    f.cpu->embed(t.view, toks, ref.data());
    float* out = f.zeros(ref.size(), keep);
    f.gpu->embed(f.gpu->weights(t.view, f.store), toks, out);
    EXPECT_EQ(f.down(out, ref.size()), ref);
  }
}

namespace {
// The fused router's cases (FusedRouterMatchesCpu) on a backend made now.
void fused_router_cases() {
  BackendPair f;
  std::mt19937 rng(17);
  std::vector<DeviceBuffer> keep;
  struct Case {
    WeightEncoding enc;
    int64_t e, cols, k, n;
    bool renorm;
  };
  for (const Case c : {Case{WeightEncoding::BF16, 128, 2048, 8, 1, true},
                       Case{WeightEncoding::BF16, 100, 72, 6, 1, false},
                       Case{WeightEncoding::MXFP4, 256, 96, 6, 1, true},
                       Case{WeightEncoding::F32, 300, 36, 5, 1, true},
                       Case{WeightEncoding::BF16, 1000, 64, 3, 1, true},
                       Case{WeightEncoding::BF16, 60, 70, 4, 1, true},
                       Case{WeightEncoding::BF16, 61, 72, 4, 1, true},
                       Case{WeightEncoding::MXFP4, 63, 96, 5, 1, true},
                       Case{WeightEncoding::MXFP4, 254, 96, 6, 1, true},
                       Case{WeightEncoding::BF16, 128, 2048, 8, 3, true},
                       Case{WeightEncoding::BF16, 256, 4096, 6, 1, true},
                       Case{WeightEncoding::BF16, 100, 2056, 4, 1, false}}) {
    HostMatrix r(c.enc, c.e, c.cols, rng);
    const MatView dr = f.gpu->weights(r.view, f.store);
    for (int rep = 0; rep < 2; ++rep) {
      const auto x = randn(size_t(c.n * c.cols), rng, 1.0f);
      std::vector<float> p(size_t(c.n * c.e)), w(size_t(c.n * c.k));
      std::vector<int32_t> ids(size_t(c.n * c.k));
      f.cpu->route_topk(r.view, x.data(), c.n, c.k, c.renorm, p.data(), ids.data(), w.data());
      float* dx = f.up(x, keep);
      float* dp = f.zeros(p.size(), keep);
      float* dw = f.zeros(w.size(), keep);
      keep.push_back(f.gpu->alloc(ids.size() * 4));
      auto* dids = keep.back().as<int32_t>();
      f.gpu->route_topk(dr, dx, c.n, c.k, c.renorm, dp, dids, dw);
      std::vector<int32_t> gids(ids.size());
      f.gpu->to_host(gids.data(), dids, gids.size() * 4);
      const std::string what = std::to_string(c.e) + " x " + std::to_string(c.cols) + " n " +
                               std::to_string(c.n) + " rep " + std::to_string(rep);
      EXPECT_EQ(gids, ids) << what;
      EXPECT_LE(rel_err(f.down(dw, w.size()), w), 1e-5) << what;
      EXPECT_LE(rel_err(f.down(dp, p.size()), p), 1e-5) << what;
    }
  }
}
}  // namespace

// The router GEMV and the softmax top-k in one launch (one token; the last
// block to finish runs the top-k): each shape twice, since the block counter
// must be back at 0 for the next call; n = 3 and unaligned widths take the
// two-launch path. At 4, 1 and 2 rows a block (MOETIER_CUDA_ROUTER_ROWS; the
// default last): 61 and 63 experts leave a part block at 2 and 4 rows, 254
// at 4 (the fused path: widths a multiple of the chunk); 4096 and 2056 bf16
// columns give a thread 2 chunks, and 1 or 2.
TEST(CudaOps, FusedRouterMatchesCpu) {
  REQUIRE_GPU();
  for (const char* rows : {"4", "1", "2"}) {
    EnvVar env("MOETIER_CUDA_ROUTER_ROWS", rows);
    SCOPED_TRACE(std::string("router rows ") + rows);
    fused_router_cases();
  }
}

// Random expert groups against the CPU: a chunk of 40 tokens (the f32 path)
// and of 80 (expert 2's 34 tokens take the bf16 tensor-core GEMM path).
TEST(CudaOps, ExpertBatchAndResidentExpertsMatchCpu) {
  REQUIRE_GPU();
  BackendPair f;
  std::mt19937 rng(11);
  const int64_t H = 96, I = 64;
  for (int64_t n : {40, 80})  // (H, I) = (96, 64): a width that is not a multiple of the tiles
    for (auto enc : {WeightEncoding::BF16, WeightEncoding::MXFP4, WeightEncoding::F32}) {
      const ExpertSet ex(f, enc, 5, H, I, rng);
      const std::vector<ExpertView>&host = ex.host, &dev = ex.dev;
      // Expert e takes tokens [0, counts[e]) (expert 2: 34 of them, the GEMM path).
      const std::vector<int64_t> counts{1, 3, 34, 0, 7};
      std::vector<int64_t> offsets{0}, tokens;
      std::vector<float> weights;
      for (int64_t c : counts) {
        for (int64_t t = 0; t < c; ++t)
          tokens.push_back((t * 7) % n), weights.push_back(0.1f + 0.01f * float(t));
        offsets.push_back(int64_t(tokens.size()));
      }
      auto x = randn(size_t(n * H), rng);
      std::vector<float> ref(size_t(n * H), 0.0f);
      ExpertBatch b{host, offsets, tokens, weights, x.data(), n, H, I, ref.data()};
      f.cpu->expert_batch(b);
      std::vector<DeviceBuffer> keep;
      b.experts = dev;
      b.x = f.up(x, keep);
      b.out = f.zeros(ref.size(), keep);
      f.gpu->expert_batch(b);
      EXPECT_LE(rel_err(f.down(b.out, ref.size()), ref), n > 64 ? 1.5e-2 : 1e-5) << int(enc);
      // One token through the resident table: ids and weights in device memory.
      const int table = f.gpu->register_experts(dev);
      ASSERT_GE(table, 0);
      const std::vector<int32_t> ids{4, 1, 2};  // router order, not ascending
      const std::vector<float> w{0.5f, 0.3f, 0.2f};
      std::vector<int64_t> o1{0, 1, 2, 3}, t1{0, 0, 0};
      std::vector<float> w1{0.3f, 0.2f, 0.5f};  // ascending id order: 1, 2, 4
      std::vector<ExpertView> h1{host[1], host[2], host[4]};
      std::vector<float> ref1(size_t(H), 0.0f);
      f.cpu->expert_batch({h1, o1, t1, w1, x.data(), 1, H, I, ref1.data()});
      keep.push_back(f.gpu->alloc(12));
      f.gpu->to_device(keep.back().data(), ids.data(), 12);
      const auto* dids = keep.back().as<int32_t>();
      float* dwt = f.up(w, keep);
      float* out1 = f.zeros(size_t(H), keep);
      f.gpu->moe_resident(table, dids, dwt, 3, b.x, H, I, out1);
      EXPECT_LE(rel_err(f.down(out1, size_t(H)), ref1), 1e-5) << int(enc);
    }
}

// The resident MoE step at real widths (Qwen3-30B-A3B: 8 of 12 experts of
// 768 x 2048; DeepSeek-V4-Flash-like: 6 of 8 of 2048 x 4096 in MXFP4), ids
// in router order, against the CPU: with f32 activations on both, and with
// q8 activations on both (MOETIER_CUDA_ACT / the CPU's MXFP4 activations:
// the same integer block sums, so only the f32 order of their sum differs).
TEST(CudaOps, ResidentExpertsAtRealWidthsMatchCpu) {
  REQUIRE_GPU();
  struct Case {
    WeightEncoding enc;
    int64_t experts, k, H, I;
  };
  for (const char* mode : {"f32", "q8"}) {
    ActMode act(mode);
    BackendPair f;  // its CUDA backend reads MOETIER_CUDA_ACT
    std::mt19937 rng(17);
    for (const Case& c : {Case{WeightEncoding::MXFP4, 12, 8, 2048, 768},
                          Case{WeightEncoding::BF16, 12, 8, 2048, 768},
                          Case{WeightEncoding::MXFP4, 8, 6, 4096, 2048},
                          Case{WeightEncoding::MXFP4, 5, 3, 96, 64}}) {
      const ExpertSet ex(f, c.enc, c.experts, c.H, c.I, rng);
      std::vector<int32_t> ids(size_t(c.experts));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(size_t(c.k));
      std::vector<float> w;
      for (int64_t j = 0; j < c.k; ++j) w.push_back(0.05f + 0.03f * float(j));
      auto x = randn(size_t(c.H), rng);
      const std::vector<float> ref = ex.cpu_out(f, ids, w, x, c.H, c.I);
      std::vector<DeviceBuffer> keep;
      const int table = f.gpu->register_experts(ex.dev);
      keep.push_back(f.gpu->alloc(ids.size() * 4));
      f.gpu->to_device(keep.back().data(), ids.data(), ids.size() * 4);
      const auto* dids = keep.back().as<int32_t>();
      float* dwt = f.up(w, keep);
      float* dx = f.up(x, keep);
      float* out = f.zeros(size_t(c.H), keep);
      f.gpu->moe_resident(table, dids, dwt, c.k, dx, c.H, c.I, out);
      EXPECT_LE(rel_err(f.down(out, size_t(c.H)), ref), 1e-5)
          << mode << " " << int(c.enc) << " " << c.H;
    }
  }
}

// route_moe_resident (the router, then the q8 kernels that read its ids
// before they wait) against the CPU's router and experts. Shapes: fewer chunks
// per expert row than a warp has lanes (96 x 64: 2; 768: 24), as many (1024:
// 32) and more (2048: 64); 90 chunks per x row (2880: not a multiple of 32);
// k from 3 to 32. A CB3 router takes the unfused path (matmul, then
// softmax_topk). Each rep runs two calls back to back with no host sync, x
// written by a kernel (add) right before each, so the early reads follow
// kernels that wrote what they read and the second call's x quantization
// follows the first call's readers of that scratch.
TEST(CudaOps, RoutedResidentExpertsMatchCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t experts, k, H, I;
    WeightEncoding router = WeightEncoding::BF16;
  };
  for (const char* mode : {"q8", "f32"}) {
    ActMode act(mode);
    BackendPair f;
    std::mt19937 rng(29);
    for (const Case& c : {Case{16, 8, 2048, 768}, Case{5, 3, 96, 64}, Case{10, 6, 4096, 2048},
                          Case{40, 32, 160, 96}, Case{8, 4, 2880, 1024},
                          Case{6, 3, 256, 96, WeightEncoding::CB3}}) {
      const ExpertSet ex(f, WeightEncoding::MXFP4, c.experts, c.H, c.I, rng);
      HostMatrix router(c.router, c.experts, c.H, rng);
      const MatView dr = f.gpu->weights(router.view, f.store);
      const int table = f.gpu->register_experts(ex.dev);
      for (int rep = 0; rep < 2; ++rep) {
        std::vector<DeviceBuffer> keep;
        struct Call {
          std::vector<float> x, ref;
          std::vector<int32_t> ids;
          float *dp, *dw, *dx, *out;
          int32_t* dids;
        };
        Call calls[2];
        for (Call& k : calls) {  // the CPU's router and experts
          k.x = randn(size_t(c.H), rng, 1.0f);
          std::vector<float> p(size_t(c.experts)), w(size_t(c.k));
          k.ids.resize(size_t(c.k));
          f.cpu->route_topk(router.view, k.x.data(), 1, c.k, true, p.data(), k.ids.data(),
                            w.data());
          k.ref = ex.cpu_out(f, k.ids, w, k.x, c.H, c.I);
          k.dp = f.zeros(size_t(c.experts), keep);
          k.dw = f.zeros(size_t(c.k), keep);
          keep.push_back(f.gpu->alloc(size_t(c.k) * 4));
          k.dids = keep.back().as<int32_t>();
          k.out = f.zeros(size_t(c.H), keep);
          k.dx = f.zeros(size_t(c.H), keep);
        }
        std::vector<float*> raw;
        for (Call& k : calls) raw.push_back(f.up(k.x, keep));
        f.gpu->synchronize();
        for (int i = 0; i < 2; ++i) {  // back to back on the backend's stream
          Call& k = calls[i];
          f.gpu->add(k.dx, raw[size_t(i)], c.H);  // x = 0 + x, by a kernel
          f.gpu->route_moe_resident(dr, table, k.dx, c.k, true, k.dp, k.dids, k.dw, c.H, c.I,
                                    k.out);
        }
        for (int i = 0; i < 2; ++i) {
          const Call& k = calls[i];
          std::vector<int32_t> gids(k.ids.size());
          f.gpu->to_host(gids.data(), k.dids, gids.size() * 4);
          const std::string what = std::string(mode) + " " + std::to_string(c.H) + " x " +
                                   std::to_string(c.I) + " router " +
                                   std::to_string(int(c.router)) + " rep " + std::to_string(rep) +
                                   " call " + std::to_string(i);
          EXPECT_EQ(gids, k.ids) << what;
          EXPECT_LE(rel_err(f.down(k.out, size_t(c.H)), k.ref), 1e-5) << what;
        }
      }
    }
  }
}

// Gate and up scales at the bottom of e8m0 (0, 1, 2: subnormal and smallest
// normal weights) against activations of 2^100, fixed ids: the q8 kernels'
// branchless scale decode against the CPU's, both modes.
TEST(CudaOps, ResidentExpertsWithTinyScalesMatchCpu) {
  REQUIRE_GPU();
  const int64_t H = 96, I = 64, E = 5, k = 3;
  for (const char* mode : {"q8", "f32"}) {
    ActMode act(mode);
    BackendPair f;
    std::mt19937 rng(31);
    ExpertSet ex(f, WeightEncoding::MXFP4, E, H, I, rng);
    std::uniform_int_distribution<int> tiny(0, 2);
    for (size_t m = 0; m < ex.mats.size(); ++m) {
      if (m % 3 == 2) continue;  // down keeps its scales
      for (auto& sc : ex.mats[m]->scales) sc = uint8_t(tiny(rng));
    }
    ex.upload(f);  // the changed scales
    const std::vector<int32_t> ids{3, 0, 4};
    const std::vector<float> w{0.5f, 0.3f, 0.2f};
    auto x = randn(size_t(H), rng);
    for (auto& v : x) v = std::ldexp(v, 100);
    const std::vector<float> ref = ex.cpu_out(f, ids, w, x, H, I);
    std::vector<DeviceBuffer> keep;
    const int table = f.gpu->register_experts(ex.dev);
    keep.push_back(f.gpu->alloc(ids.size() * 4));
    f.gpu->to_device(keep.back().data(), ids.data(), ids.size() * 4);
    float* out = f.zeros(size_t(H), keep);
    f.gpu->moe_resident(table, keep[0].as<int32_t>(), f.up(w, keep), k, f.up(x, keep), H, I, out);
    const std::vector<float> got = f.down(out, size_t(H));
    double norm = 0;
    for (float v : ref) norm += double(v) * v;
    EXPECT_GT(norm, 0.0) << mode;  // the tiny scales reach the output
    EXPECT_LE(rel_err(got, ref), 1e-5) << mode;
  }
}

// update_experts after a decode graph was recorded: refused only for a
// table the recorded step may read through the one-launch MoE kernel
// (MOETIER_CUDA_MOE_STREAM=1, every entry in device memory and aligned); with
// that kernel off (the default) the same update goes through, and with it on
// once the graph is dropped.
TEST(CudaOps, TableUpdateAfterARecordedGraph) {
  REQUIRE_GPU();
  std::mt19937 rng(78);
  for (const bool stream : {false, true}) {
    EnvVar e("MOETIER_CUDA_MOE_STREAM", stream ? "1" : "0");
    BackendPair f;  // (the variable is read when the backend is made)
    const ExpertSet ex(f, WeightEncoding::MXFP4, 4, 256, 128, rng);
    const int table = f.gpu->register_experts(ex.dev);
    std::vector<DeviceBuffer> keep;
    float* x = f.up(randn(256, rng), keep);
    f.gpu->graph_begin(0, 8);
    f.gpu->add(x, x, 256);
    const int g = f.gpu->graph_end();
    const Backend::ExpertTableEntry entry{table, 1, ex.dev[2], false};
    if (stream)
      EXPECT_THROW(f.gpu->update_experts({&entry, 1}), Error);
    else
      EXPECT_NO_THROW(f.gpu->update_experts({&entry, 1}));
    f.gpu->graph_drop(g);
    EXPECT_NO_THROW(f.gpu->update_experts({&entry, 1})) << stream;
    f.gpu->synchronize();
  }
}

// The q8 MoE kernels against the CPU's q8 experts, through
// route_moe_resident: x rows of 16, 48 and 192 chunks (not all multiples of
// 32), expert rows of 8, 24 and 72 chunks, k from 2 to 13, and the real
// widths. Three calls back to back per shape, no host sync. That the q8
// kernels ran is read from the backend's op timing (MOETIER_CUDA_TIMING).
namespace {

struct RoutedCase {
  int64_t experts, k, H, I;
};

// Three routed resident MoE steps of case c on the GPU (q8 kernels) against
// the CPU engine's experts; `what` names the kernel variant in failures.
void check_routed_q8(BackendPair& f, const RoutedCase& c, std::mt19937& rng,
                     const std::string& what) {
  const ExpertSet ex(f, WeightEncoding::MXFP4, c.experts, c.H, c.I, rng);
  HostMatrix router(WeightEncoding::BF16, c.experts, c.H, rng);
  const MatView dr = f.gpu->weights(router.view, f.store);
  const int table = f.gpu->register_experts(ex.dev);
  std::vector<DeviceBuffer> keep;
  std::vector<std::vector<float>> refs;
  std::vector<float*> outs;
  for (int call = 0; call < 3; ++call) {
    const auto x = randn(size_t(c.H), rng, 1.0f);
    std::vector<float> p(size_t(c.experts)), w(size_t(c.k));
    std::vector<int32_t> ids(size_t(c.k));
    f.cpu->route_topk(router.view, x.data(), 1, c.k, true, p.data(), ids.data(), w.data());
    refs.push_back(ex.cpu_out(f, ids, w, x, c.H, c.I));
    float* dx = f.up(x, keep);
    keep.push_back(f.gpu->alloc(size_t(c.k) * 4));
    auto* dids = keep.back().as<int32_t>();
    outs.push_back(f.zeros(size_t(c.H), keep));
    f.gpu->route_moe_resident(dr, table, dx, c.k, true, f.zeros(size_t(c.experts), keep), dids,
                              f.zeros(size_t(c.k), keep), c.H, c.I, outs.back());
  }
  // 3e-5: measured 1.29e-5 on the 4096 x 256, k 3 case on the H200 (f32
  // rounding: block-sum order, the routing weight folded into h's scales),
  // 1e-5 or less on the others. Plus three q8 codes of h rounded the other
  // way: h's f32 values differ in their last bits, and one that lies within
  // them of a rounding boundary gets the neighbouring code, which moves the
  // output by about d_h times a column of down, d_h = amax / 127 (amax about
  // 5 x rms for h): a relative 5 / (127 sqrt(k I)) of the output's norm a
  // flip (measured 5.5e-4 on the 3072 x 1536, k 5 case, whose 7680 values of
  // h flip about once in two calls). A lost or misplaced item of 32 columns
  // moves it by sqrt(32 / (k I)), 10 or more times this bound.
  const double tol = 3e-5 + 3 * 5.0 / (127.0 * std::sqrt(double(c.k * c.I)));
  for (size_t i = 0; i < outs.size(); ++i)
    EXPECT_LE(rel_err(f.down(outs[i], size_t(c.H)), refs[i]), tol)
        << c.H << " x " << c.I << " k " << c.k << " call " << i << " " << what;
}

}  // namespace

TEST(CudaOps, RoutedQ8MoeMatchesCpuOnManyShapes) {
  REQUIRE_GPU();
  ActMode act("q8");
  const std::string timing = ::testing::TempDir() + "moetier_q8_moe_timing.txt";
  std::mt19937 rng(41);
  {
    EnvVar t("MOETIER_CUDA_TIMING", timing);
    BackendPair f;
    for (const RoutedCase& c :
         {RoutedCase{9, 7, 1536, 768}, RoutedCase{20, 13, 512, 256}, RoutedCase{12, 5, 512, 2304},
          RoutedCase{5, 3, 4096, 256}, RoutedCase{4, 2, 6144, 512}, RoutedCase{16, 8, 2048, 768},
          RoutedCase{8, 6, 4096, 2048}})
      check_routed_q8(f, c, rng, "default kernels");
  }  // the backend writes its op timing here
  std::ifstream in(timing);
  const std::string ops((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const bool fused = ops.find("resident experts (fused)") != std::string::npos;
  const bool q8 = ops.find("resident experts (q8)") != std::string::npos;
  EXPECT_TRUE(q8 && !fused) << ops;  // (fused: the f32 kernels of decode.cu)
}

// The one-launch gate/up and down (MOETIER_CUDA_MOE_STREAM=1) where it
// applies: hidden / 32 of 64 to 256 and inter / 32 of 64 to 256 (a stage
// holding 32 to 8 rows of gate or up, 32 to 8 of down), k x inter / 32 at its
// limit of 640, fewer gate/up tiles than blocks (8192 x 2048, k 2: some
// blocks stream down rows only), and a shape where it does not apply (the
// separate kernels run). The op timing names which ran.
TEST(CudaOps, RoutedQ8MoeStreamMatchesCpu) {
  REQUIRE_GPU();
  ActMode act("q8");
  const std::string timing = ::testing::TempDir() + "moetier_q8_stream_timing.txt";
  std::mt19937 rng(47);
  bool supported = false;
  {
    EnvVar st("MOETIER_CUDA_MOE_STREAM", "1");
    EnvVar t("MOETIER_CUDA_TIMING", timing);
    BackendPair f;
#if MOETIER_HAVE_CUDA
    supported = cuda::moe_stream_supported();  // (the backend made device 0 current)
#endif
    for (const RoutedCase& c :
         {RoutedCase{8, 6, 4096, 2048}, RoutedCase{9, 5, 2048, 2048}, RoutedCase{6, 4, 2048, 4096},
          RoutedCase{10, 10, 2048, 2048}, RoutedCase{4, 2, 8192, 2048},
          RoutedCase{3, 1, 2048, 8192}, RoutedCase{9, 7, 1536, 768}})
      check_routed_q8(f, c, rng, "stream");
  }
  std::ifstream in(timing);
  const std::string ops((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Below sm_90 (the device, or a build for sm_80 JIT-compiled on an H100)
  // the launcher refuses every shape and the separate kernels give the results.
  if (supported)
    EXPECT_NE(ops.find("resident experts (q8 stream)"), std::string::npos) << ops;
  else
    EXPECT_EQ(ops.find("resident experts (q8 stream)"), std::string::npos) << ops;
  EXPECT_NE(ops.find("resident experts (q8)\n"), std::string::npos) << ops;
}

// Every q8 kernel variant (MOETIER_CUDA_MOE_*, read when the backend is
// made), each on the same data: long expert rows (I = 8192 with k = 8 gives
// the down kernels 2048 (expert, chunk) items per row, more than one pass of
// a block's 128 threads, where the pair kernel falls back to the split
// one); H = 1056 is 33 blocks of 32 columns; 13 x 32 items are 4 a thread,
// 3 x 3 fewer than a block has threads. The last variants
// are the defaults, which later tests then use again (the choice is
// process-wide).
TEST(CudaOps, RoutedQ8MoeVariantsMatchCpuOnLongRows) {
  REQUIRE_GPU();
  ActMode act("q8");
  for (const auto& [var, value] :
       std::vector<std::pair<const char*, const char*>>{{"MOETIER_CUDA_MOE_DOWN", "2"},
                                                        {"MOETIER_CUDA_MOE_DOWN", "warp"},
                                                        {"MOETIER_CUDA_MOE_GATE", "16"},
                                                        {"MOETIER_CUDA_MOE_DOWN", "4"},
                                                        {"MOETIER_CUDA_MOE_DOWN", "pair"},
                                                        {"MOETIER_CUDA_MOE_GATE", "8"}}) {
    EnvVar e(var, value);
    BackendPair f;
    std::mt19937 rng(43);
    const std::string what = std::string(var) + "=" + value;
    for (const RoutedCase& c : {RoutedCase{10, 8, 1056, 8192}, RoutedCase{7, 5, 3072, 1536},
                                RoutedCase{15, 13, 1056, 1024}, RoutedCase{5, 3, 2080, 96}})
      check_routed_q8(f, c, rng, what);
  }
}

TEST(CudaOps, BadRequestsAreErrors) {
  REQUIRE_GPU();
  EXPECT_THROW(make_cuda_backend(cuda_device_count()), Error);
  EXPECT_THROW(make_backend("cuda:x"), Error);
  for (const char* bad : {"attn,bogus", ","}) {  // the profiling switch names its ops
    EnvVar e("MOETIER_CUDA_SKIP", bad);
    EXPECT_THROW(make_cuda_backend(0), Error) << bad;
  }
  for (const auto& [var, bad] :
       std::vector<std::pair<const char*, const char*>>{{"MOETIER_CUDA_MOE_DOWN", "3"},
                                                        {"MOETIER_CUDA_MOE_GATE", ""},
                                                        {"MOETIER_CUDA_STAGE_BLOCKS", "0"},
                                                        {"MOETIER_CUDA_GEMV_WARP_ROWS", "12x"},
                                                        {"MOETIER_CUDA_ROUTER_Q8", "2"},
                                                        {"MOETIER_CUDA_ARGMAX_VALUES", "4"},
                                                        {"MOETIER_CUDA_ARGMAX_FENCE", "2"},
                                                        {"MOETIER_CUDA_MOE_STREAM", "on"},
                                                        {"MOETIER_CUDA_PREDICT", "on"},
                                                        {"MOETIER_CUDA_CARVEOUT", "101"},
                                                        {"MOETIER_CUDA_PREDICT_PASSES", "5"},
                                                        {"MOETIER_CUDA_STAGE", "l2"}}) {
    EnvVar e(var, bad);  // the kernel switches name their variable
    EXPECT_THROW(make_cuda_backend(0), Error) << var;
  }
  {
    EnvVar e("MOETIER_CUDA_SKIP", "attn,experts");
    EXPECT_NO_THROW(make_cuda_backend(0));
  }
  BackendPair f;
  EXPECT_THROW(f.gpu->alloc(size_t(1) << 62), Error);  // names the size, no crash
}
