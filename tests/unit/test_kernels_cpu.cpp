// cpu kernels against the scalar references (kernels/ref), on random inputs
// with odd shapes, by normalized error ||out - ref|| / ||ref||. NaN never
// passes (rel_err returns +inf). Tolerances: the reference accumulates in
// double, the cpu kernels in f32 with a different summation order; for the
// sizes here that gives ~1e-7..1e-6, so 1e-5 leaves margin without hiding a
// wrong element (one wrong element out of 67*160 moves the error by >1e-3).
// MXFP4 matmuls run here with f32 activations (the exact mode); the q8 mode
// has its own tests (test_kernels_q8.cpp).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/matview.h"
#include "kernels/ref/ref.h"
#include "numeric.h"

using namespace moetier::testing;

using namespace moetier;

namespace {

struct ExactActivations : ::testing::Environment {
  void SetUp() override { cpu::set_mxfp4_activations(cpu::Activations::F32); }
};
const auto* const kExact = ::testing::AddGlobalTestEnvironment(new ExactActivations);

// Owns the bytes behind a MatView of random weights.
struct RandomMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> codes, scales;
  MatView view;

  RandomMatrix(WeightEncoding enc, int64_t rows, int64_t cols, std::mt19937& rng) {
    view.enc = enc;
    view.rows = rows;
    view.cols = cols;
    size_t n = size_t(rows * cols);
    if (enc == WeightEncoding::F32) {
      f32 = randn(n, rng, 0.5f);
      view.data = f32.data();
    } else if (enc == WeightEncoding::BF16) {
      for (float x : randn(n, rng, 0.5f)) bf16.push_back(f32_to_bf16(x));
      view.data = bf16.data();
    } else {
      std::uniform_int_distribution<int> byte(0, 255), sc(118, 130);
      for (size_t i = 0; i < n / 2; ++i) codes.push_back(uint8_t(byte(rng)));
      for (size_t i = 0; i < n / 32; ++i) scales.push_back(uint8_t(sc(rng)));
      view.data = codes.data();
      view.scales = scales.data();
    }
  }
};

struct MatmulCase {
  WeightEncoding enc;
  int64_t rows, cols, n;
};

}  // namespace

class CpuMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(CpuMatmul, MatchesReference) {
  auto [enc, rows, cols, n] = GetParam();
  std::mt19937 rng(uint32_t(rows * 1000 + cols * 10 + n));
  RandomMatrix w(enc, rows, cols, rng);
  auto x = randn(size_t(n * cols), rng);
  std::vector<float> ref(static_cast<size_t>(n * rows)), out(static_cast<size_t>(n * rows), NAN);
  ref::matmul(w.view, x.data(), n, ref.data());
  cpu::matmul(w.view, x.data(), n, out.data());
  EXPECT_LE(rel_err(out, ref), 1e-5);
}

std::vector<MatmulCase> matmul_cases() {
  std::vector<MatmulCase> v;
  for (auto enc : {WeightEncoding::F32, WeightEncoding::BF16, WeightEncoding::MXFP4})
    for (int64_t rows : {1, 5, 67, 131})
      for (int64_t cols : {96, 160, 544})
        for (int64_t n : {1, 2, 3, 17}) v.push_back({enc, rows, cols, n});
  for (auto enc : {WeightEncoding::F32, WeightEncoding::BF16})
    for (int64_t cols : {1, 7, 33, 101}) v.push_back({enc, 67, cols, 3});
  // Large enough for the multi-threaded path (>= 2^18 multiply-adds).
  for (auto enc : {WeightEncoding::F32, WeightEncoding::BF16, WeightEncoding::MXFP4}) {
    v.push_back({enc, 301, 1024, 1});
    v.push_back({enc, 83, 1056, 5});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuMatmul, ::testing::ValuesIn(matmul_cases()));

TEST(RefKernels, Mxfp4DecodesLowNibbleFirst) {
  std::vector<uint8_t> codes(16, 0), scales{128};  // one row, 32 cols, scale 2
  codes[0] = 0x72;                                 // col 0: code 2 (1.0), col 1: code 7 (6.0)
  codes[15] = 0xb9;                                // col 30: -0.5, col 31: -1.5
  MatView w{WeightEncoding::MXFP4, 1, 32, codes.data(), scales.data()};
  EXPECT_EQ(ref::weight_at(w, 0, 0), 2.0f);
  EXPECT_EQ(ref::weight_at(w, 0, 1), 12.0f);
  EXPECT_EQ(ref::weight_at(w, 0, 30), -1.0f);
  EXPECT_EQ(ref::weight_at(w, 0, 31), -3.0f);
  std::vector<float> x(32, 1.0f);
  float y = 0;
  ref::matvec(w, x.data(), &y);
  EXPECT_FLOAT_EQ(y, 2 + 12 - 1 - 3);
}

TEST(RefKernels, RopeIdentityAtZeroAndKeepsPairNorms) {
  std::mt19937 rng(3);
  auto inv = ref::rope_inv_freq(12, 10000.0);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], 1.0 / std::pow(10000.0, 2.0 / 12), 1e-7);
  auto x = randn(3 * 12, rng), y = x;
  ref::rope(y.data(), 3, 12, 0, inv.data());
  EXPECT_EQ(x, y);
  ref::rope(y.data(), 3, 12, 37, inv.data());
  for (int h = 0; h < 3; ++h)
    for (int i = 0; i < 6; ++i) {
      float a = x[h * 12 + i], b = x[h * 12 + i + 6];
      float c = y[h * 12 + i], d = y[h * 12 + i + 6];
      EXPECT_NEAR(a * a + b * b, c * c + d * d, 1e-4);
    }
  // Pair 0 turns by exactly 37 radians.
  EXPECT_NEAR(y[0], x[0] * std::cos(37.0) - x[6] * std::sin(37.0), 1e-5);
}

TEST(RefKernels, AttentionOverOnePositionReturnsV) {
  std::mt19937 rng(5);
  auto q = randn(4 * 8, rng), k = randn(2 * 8, rng), v = randn(2 * 8, rng);
  std::vector<float> out(4 * 8);
  ref::attention(q.data(), k.data(), v.data(), 1, 4, 2, 8, 0.3f, out.data());
  for (int h = 0; h < 4; ++h)
    for (int d = 0; d < 8; ++d) EXPECT_FLOAT_EQ(out[h * 8 + d], v[(h / 2) * 8 + d]);
}

TEST(CpuKernels, RmsnormMatchesReference) {
  std::mt19937 rng(11);
  for (int64_t dim : {7, 96, 1000}) {
    int64_t n = 5;
    auto x = randn(size_t(n * dim), rng, 3.0f), w = randn(size_t(dim), rng);
    std::vector<float> ref(x.size()), out(x.size());
    for (int64_t t = 0; t < n; ++t)
      ref::rmsnorm(x.data() + t * dim, w.data(), dim, 1e-6f, ref.data() + t * dim);
    cpu::rmsnorm(x.data(), w.data(), n, dim, 1e-6f, out.data());
    EXPECT_LE(rel_err(out, ref), 1e-6) << dim;
    cpu::rmsnorm(x.data(), w.data(), n, dim, 1e-6f, x.data());  // in place
    EXPECT_EQ(x, out);
  }
}

TEST(CpuKernels, RopeMatchesReference) {
  std::mt19937 rng(13);
  int64_t n = 5, heads = 3, hd = 34;
  auto inv = ref::rope_inv_freq(hd, 1e6);
  auto x = randn(size_t(n * heads * hd), rng), ref = x;
  for (int64_t t = 0; t < n; ++t)
    ref::rope(ref.data() + t * heads * hd, heads, hd, 1000 + t, inv.data());
  cpu::rope(x.data(), n, heads, hd, 1000, inv.data());
  EXPECT_LE(rel_err(x, ref), 1e-6);
}

TEST(CpuKernels, SoftmaxAndSiluMatchReference) {
  std::mt19937 rng(17);
  auto x = randn(301, rng, 5.0f), ref = x;
  ref::softmax(ref.data(), 301);
  cpu::softmax(x.data(), 301);
  EXPECT_LE(rel_err(x, ref), 1e-6);
  auto g = randn(99, rng, 4.0f), u = randn(99, rng);
  std::vector<float> r(99);
  for (size_t i = 0; i < 99; ++i) r[i] = ref::silu(g[i]) * u[i];
  cpu::silu_mul(g.data(), u.data(), 99);
  EXPECT_LE(rel_err(g, r), 1e-6);
}

TEST(CpuKernels, CausalAttentionMatchesReference) {
  std::mt19937 rng(19);
  for (auto [n_q, first, heads, kv, hd] :
       std::vector<std::array<int64_t, 5>>{{1, 0, 4, 2, 16},
                                           {1, 40, 6, 3, 20},
                                           {7, 0, 4, 1, 8},
                                           {5, 13, 8, 8, 12},
                                           {33, 100, 8, 2, 64} /* multi-threaded path */,
                                           {1, 700, 16, 4, 64}}) {
    int64_t n_pos = first + n_q;
    auto q = randn(size_t(n_q * heads * hd), rng), k = randn(size_t(n_pos * kv * hd), rng),
         v = randn(size_t(n_pos * kv * hd), rng);
    float scale = 1.0f / std::sqrt(float(hd));
    std::vector<float> ref(q.size()), out(q.size(), NAN);
    for (int64_t t = 0; t < n_q; ++t)
      ref::attention(q.data() + t * heads * hd, k.data(), v.data(), first + t + 1, heads, kv, hd,
                     scale, ref.data() + t * heads * hd);
    cpu::attention(q.data(), k.data(), v.data(), n_q, first, heads, kv, hd, scale, out.data());
    EXPECT_LE(rel_err(out, ref), 1e-5) << n_q << " " << first;
  }
}

TEST(CpuKernels, BadMatricesAreRefused) {
  std::vector<uint8_t> b(64);
  std::vector<float> x(64), y(4);
  MatView odd{WeightEncoding::MXFP4, 2, 48, b.data(), b.data()};
  EXPECT_THROW(cpu::matmul(odd, x.data(), 1, y.data()), Error);
  MatView no_scales{WeightEncoding::MXFP4, 2, 32, b.data(), nullptr};
  EXPECT_THROW(cpu::matmul(no_scales, x.data(), 1, y.data()), Error);
  MatView no_data{WeightEncoding::BF16, 2, 32, nullptr, nullptr};
  EXPECT_THROW(cpu::matmul(no_data, x.data(), 1, y.data()), Error);
  MatView cb3_no_codebook{WeightEncoding::CB3, 2, 32, b.data(), nullptr};
  EXPECT_THROW(cpu::matmul(cb3_no_codebook, x.data(), 1, y.data()), Error);
}

TEST(CpuKernels, NanInWeightsIsNotHidden) {
  std::vector<float> w(3 * 40, 0.25f), x(40, 1.0f), y(3);
  w[40 + 7] = NAN;
  MatView m{WeightEncoding::F32, 3, 40, w.data(), nullptr};
  cpu::matmul(m, x.data(), 1, y.data());
  EXPECT_TRUE(std::isfinite(y[0]));
  EXPECT_TRUE(std::isnan(y[1]));
}

TEST(CpuKernels, GetRowDecodesEveryEncoding) {
  std::mt19937 rng(23);
  for (auto enc : {WeightEncoding::F32, WeightEncoding::BF16, WeightEncoding::MXFP4}) {
    RandomMatrix w(enc, 9, 64, rng);
    std::vector<float> row(64);
    for (int64_t r : {0, 4, 8}) {
      cpu::get_row(w.view, r, row.data());
      for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(row[size_t(c)], ref::weight_at(w.view, r, c));
    }
    EXPECT_THROW(cpu::get_row(w.view, 9, row.data()), Error);
  }
}

// The kernel paths this CPU can run (portable always; avx2 when present).
std::vector<cpu::KernelPath> paths() {
  std::vector<cpu::KernelPath> p{cpu::KernelPath::Portable};
  if (cpu::cpu_has_avx2()) p.push_back(cpu::KernelPath::Avx2);
  if (cpu::cpu_has_avx512()) p.push_back(cpu::KernelPath::Avx512);
  return p;
}

// Restores the kernel path and thread count a test changed.
struct PathGuard {
  cpu::KernelPath path = cpu::kernel_path();
  cpu::Activations act = cpu::mxfp4_activations();
  int threads = cpu::threads();
  ~PathGuard() {
    cpu::set_kernel_path(path);
    cpu::set_mxfp4_activations(act);
    cpu::set_threads(threads);
  }
};

// Batch invariance (kernels/cpu/tile.h): on every path and thread count, a
// token's row of X W^T is bit-identical whether it is computed alone or with
// others, and every path matches the reference.
TEST(CpuKernels, MatmulIsBatchInvariantOnEveryPath) {
  PathGuard guard;
  std::mt19937 rng(31);
  for (auto enc : {WeightEncoding::F32, WeightEncoding::BF16, WeightEncoding::MXFP4}) {
    // 1000 and 2080 columns: long rows, 1000 with groups past the last whole
    // 32-column block.
    for (auto [rows, cols] : {std::array<int64_t, 2>{67, 160}, std::array<int64_t, 2>{9, 96},
                              std::array<int64_t, 2>{130, 512}, std::array<int64_t, 2>{5, 37},
                              std::array<int64_t, 2>{11, 1000}, std::array<int64_t, 2>{6, 2080}}) {
      if (enc == WeightEncoding::MXFP4 && cols % 32) continue;
      RandomMatrix w(enc, rows, cols, rng);
      const int64_t n = 7;
      auto x = randn(size_t(n * cols), rng);
      std::vector<float> ref(size_t(n * rows));
      ref::matmul(w.view, x.data(), n, ref.data());
      for (cpu::KernelPath p : paths()) {
        cpu::set_kernel_path(p);
        for (int threads : {1, 3}) {
          cpu::set_threads(threads);
          std::vector<float> all(size_t(n * rows)), one(size_t(n * rows));
          cpu::matmul(w.view, x.data(), n, all.data());
          for (int64_t t = 0; t < n; ++t)
            cpu::matmul(w.view, x.data() + t * cols, 1, one.data() + t * rows);
          EXPECT_EQ(all, one) << encoding_name(enc) << " " << rows << "x" << cols << " "
                              << cpu::kernel_path_name(p) << " threads " << threads;
          EXPECT_LE(rel_err(all, ref), 1e-5) << cpu::kernel_path_name(p);
        }
      }
    }
  }
}

// The same result at any thread count (each output is one thread's dot).
TEST(CpuKernels, MatmulDoesNotDependOnThreads) {
  PathGuard guard;
  std::mt19937 rng(37);
  RandomMatrix w(WeightEncoding::BF16, 515, 768, rng);  // above the parallel threshold
  auto x = randn(size_t(5 * 768), rng);
  std::vector<float> y1(5 * 515), y4(5 * 515);
  cpu::set_threads(1);
  cpu::matmul(w.view, x.data(), 5, y1.data());
  cpu::set_threads(4);
  cpu::matmul(w.view, x.data(), 5, y4.data());
  EXPECT_EQ(y1, y4);
}

// A NaN block scale (e8m0 0xff) poisons its row on every path, alone or
// batched, with f32 activations (the q8 mode: Q8.NanIsNeverHidden).
TEST(CpuKernels, Mxfp4NanScalePropagatesOnEveryPath) {
  PathGuard guard;
  cpu::set_mxfp4_activations(cpu::Activations::F32);
  std::mt19937 rng(29);
  RandomMatrix w(WeightEncoding::MXFP4, 7, 96, rng);
  w.scales[0] = 0xff;  // row 0, first block
  auto x = randn(3 * 96, rng);
  for (cpu::KernelPath p : paths()) {
    cpu::set_kernel_path(p);
    for (int64_t n : {1, 3}) {
      std::vector<float> y(size_t(n * 7));
      cpu::matmul(w.view, x.data(), n, y.data());
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_TRUE(std::isnan(y[size_t(t * 7)])) << cpu::kernel_path_name(p) << " n " << n;
        EXPECT_TRUE(std::isfinite(y[size_t(t * 7 + 1)]));
      }
    }
  }
}

// Backend::argmax (the default, through host memory): the first maximum.
TEST(CpuBackendOps, ArgmaxIsTheFirstMaximum) {
  auto be = make_cpu_backend();
  const std::vector<float> x{-3.0f, 2.5f, -1.0f, 2.5f, 0.0f, 2.4999f};
  int32_t out = -1;
  be->argmax(x.data(), int64_t(x.size()), &out);
  EXPECT_EQ(out, 1);
  const std::vector<float> one{-7.0f};
  be->argmax(one.data(), 1, &out);
  EXPECT_EQ(out, 0);
  EXPECT_THROW(be->argmax(x.data(), 0, &out), Error);
}

// A NaN logit makes every probability NaN: the top-k still names real,
// distinct experts, the lowest ids (the CUDA router's choice), whatever the
// sort's internal order would make of incomparable values.
TEST(CpuBackendOps, TopkOfNanLogitsNamesTheLowestIds) {
  auto be = make_cpu_backend();
  for (const int64_t e : {7, 60, 256}) {
    std::vector<float> logits(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) logits[size_t(i)] = std::sin(float(i));
    logits[size_t(e / 2)] = std::nanf("");
    std::vector<float> p(static_cast<size_t>(e)), w(6);
    std::vector<int32_t> ids(6);
    be->softmax_topk(logits.data(), 1, e, 6, true, p.data(), ids.data(), w.data());
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5})) << e;
  }
}

// matmul_many and matmul_glu compute each output as matmul (and silu_mul)
// does: the same bits on every path, with q8 and f32 activations, at 1 and 3
// threads, for tasks of mixed encodings and sizes (n 0, 1, 6 and 11: the
// direct kernels and the scratch), some sharing one input.
TEST(CpuKernels, MatmulManyAndGluGiveMatmulsBits) {
  PathGuard guard;
  std::mt19937 rng(41);
  const int64_t cols = 320;
  RandomMatrix ws[] = {RandomMatrix(WeightEncoding::MXFP4, 45, cols, rng),
                       RandomMatrix(WeightEncoding::MXFP4, 45, cols, rng),
                       RandomMatrix(WeightEncoding::BF16, 37, cols, rng),
                       RandomMatrix(WeightEncoding::MXFP4, 300, cols, rng),
                       RandomMatrix(WeightEncoding::MXFP4, 300, cols, rng)};
  const int64_t ns[] = {6, 6, 1, 11, 0};
  auto xa = randn(size_t(11 * cols), rng), xb = randn(size_t(11 * cols), rng);
  const float* xs[] = {xa.data(), xa.data(), xb.data(), xb.data(), xa.data()};
  for (auto act : {cpu::Activations::Q8, cpu::Activations::F32}) {
    cpu::set_mxfp4_activations(act);
    for (cpu::KernelPath p : paths()) {
      cpu::set_kernel_path(p);
      for (int threads : {1, 3}) {
        cpu::set_threads(threads);
        const std::string where = std::string(cpu::kernel_path_name(p)) + " " +
                                  cpu::activations_name(act) + " threads " +
                                  std::to_string(threads);
        std::vector<std::vector<float>> sep(5), many(5);
        std::vector<cpu::MatmulTask> tasks;
        for (int i = 0; i < 5; ++i) {
          sep[size_t(i)].assign(size_t(ns[i] * ws[i].view.rows), NAN);
          many[size_t(i)].assign(sep[size_t(i)].size(), NAN);
          cpu::matmul(ws[i].view, xs[i], ns[i], sep[size_t(i)].data());
          tasks.push_back({ws[i].view, xs[i], ns[i], many[size_t(i)].data()});
        }
        cpu::matmul_many(tasks);
        for (int i = 0; i < 5; ++i) {
          EXPECT_EQ(sep[size_t(i)], many[size_t(i)]) << i << " " << where;
          std::vector<float> ref(sep[size_t(i)].size());
          ref::matmul(ws[i].view, xs[i], ns[i], ref.data());
          if (!ref.empty()) {
            EXPECT_LE(rel_err(many[size_t(i)], ref), 1.5e-2) << i << " " << where;
          }
        }
        // GLU: tasks (0, 1) on xa and (3, 4) on xb, n 6 and 9.
        const int64_t gn[] = {6, 9};
        std::vector<float> g[2], u[2], ref[2];
        std::vector<cpu::GluTask> glu;
        for (int k = 0; k < 2; ++k) {
          const MatView &gw = ws[3 * k].view, &uw = ws[3 * k + 1].view;
          const float* x = k ? xb.data() : xa.data();
          const int64_t rows = gw.rows, n = gn[k];
          std::vector<float> uref(size_t(n * rows));
          ref[k].resize(size_t(n * rows));
          cpu::matmul(gw, x, n, ref[k].data());
          cpu::matmul(uw, x, n, uref.data());
          cpu::silu_mul(ref[k].data(), uref.data(), n * rows);
          g[k].assign(size_t(n * rows), NAN);
          u[k].assign(size_t(n * rows), NAN);
          glu.push_back({gw, uw, x, n, g[k].data(), u[k].data()});
        }
        cpu::matmul_glu(glu);
        for (int k = 0; k < 2; ++k) EXPECT_EQ(g[k], ref[k]) << "glu " << k << " " << where;
      }
    }
  }
}

// bf16 activations (kernels/cpu/bf16.h; the q8 mode on an AVX-512 BF16 CPU):
// within the rounding of X to bf16 of the exact product, batch- and
// thread-invariant, a NaN in X never hidden.
TEST(CpuKernels, Bf16ActivationsAreCloseBatchAndThreadInvariant) {
  if (!cpu::cpu_has_avx512bf16()) GTEST_SKIP() << "no AVX-512 BF16";
  PathGuard guard;
  cpu::set_kernel_path(cpu::KernelPath::Avx512);
  cpu::set_mxfp4_activations(cpu::Activations::Q8);
  ASSERT_TRUE(cpu::bf16_activations());
  std::mt19937 rng(43);
  for (auto [rows, cols] : {std::array<int64_t, 2>{67, 1000}, std::array<int64_t, 2>{9, 2048},
                            std::array<int64_t, 2>{130, 37}, std::array<int64_t, 2>{301, 1024}}) {
    RandomMatrix w(WeightEncoding::BF16, rows, cols, rng);
    const int64_t n = 7;
    auto x = randn(size_t(n * cols), rng);
    std::vector<float> ref(size_t(n * rows));
    ref::matmul(w.view, x.data(), n, ref.data());
    std::vector<float> first;
    for (int threads : {1, 3}) {
      cpu::set_threads(threads);
      std::vector<float> all(size_t(n * rows), NAN), one(size_t(n * rows), NAN);
      cpu::matmul(w.view, x.data(), n, all.data());
      for (int64_t t = 0; t < n; ++t)
        cpu::matmul(w.view, x.data() + t * cols, 1, one.data() + t * rows);
      EXPECT_EQ(all, one) << rows << "x" << cols << " threads " << threads;
      // X rounded to bf16: each element within 2^-9 relative; the sums' error is smaller.
      EXPECT_LE(rel_err(all, ref), 4e-3) << rows << "x" << cols;
      EXPECT_GT(rel_err(all, ref), 0.0) << "bf16 activations should round X";
      if (first.empty()) first = all;
      EXPECT_EQ(all, first) << "threads " << threads;
    }
    // Three tasks on one x in one run (q, k and v: one bf16 copy shared): each as alone.
    RandomMatrix w2(WeightEncoding::BF16, 5, cols, rng), w3(WeightEncoding::BF16, 130, cols, rng);
    std::vector<float> y1(size_t(n * rows), NAN), y2(size_t(n * 5), NAN), y3(size_t(n * 130), NAN);
    std::vector<float> s2(y2.size()), s3(y3.size()), r2(y2.size());
    cpu::matmul_many(std::vector<cpu::MatmulTask>{{w.view, x.data(), n, y1.data()},
                                                  {w2.view, x.data(), n, y2.data()},
                                                  {w3.view, x.data(), n, y3.data()}});
    cpu::matmul(w2.view, x.data(), n, s2.data());
    cpu::matmul(w3.view, x.data(), n, s3.data());
    ref::matmul(w2.view, x.data(), n, r2.data());
    EXPECT_EQ(y1, first);
    EXPECT_EQ(y2, s2);
    EXPECT_EQ(y3, s3);
    EXPECT_LE(rel_err(y2, r2), 4e-3);
    x[size_t(cols + 3)] = NAN;  // token 1
    std::vector<float> y(size_t(n * rows));
    cpu::matmul(w.view, x.data(), n, y.data());
    for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(std::isnan(y[size_t(rows + r)])) << r;
    EXPECT_FALSE(std::isnan(y[0]));
  }
}
