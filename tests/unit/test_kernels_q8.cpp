// The q8 mode of MXFP4 matmuls (kernels/cpu/q8.h) on every kernel path:
//   - the quantizers give the reference's bytes and scales bit for bit;
//   - matmul matches ref::matmul_q8 (the same quantized activations, dotted
//     in double) by normalized error <= 1e-5 on random odd shapes, and the f32
//     reference within the quantization error (bound 1.5e-2, and above 1e-4 so that
//     the q8 path is shown to have run; the actual value was not recorded);
//   - a token's row is bit-identical alone or with others, at 1 or 3 threads;
//   - NaN in a block scale or an activation is never hidden.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/q8.h"
#include "kernels/ref/ref.h"
#include "numeric.h"

using namespace moetier;
using namespace moetier::testing;

namespace {

struct Mxfp4Matrix {
  std::vector<uint8_t> codes, scales;
  MatView view;
  Mxfp4Matrix(int64_t rows, int64_t cols, std::mt19937& rng) {
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 130);
    for (int64_t i = 0; i < rows * cols / 2; ++i) codes.push_back(uint8_t(byte(rng)));
    for (int64_t i = 0; i < rows * cols / 32; ++i) scales.push_back(uint8_t(sc(rng)));
    view = MatView{WeightEncoding::MXFP4, rows, cols, codes.data(), scales.data()};
  }
};

std::vector<cpu::KernelPath> paths() {
  std::vector<cpu::KernelPath> p{cpu::KernelPath::Portable};
  if (cpu::cpu_has_avx2()) p.push_back(cpu::KernelPath::Avx2);
  if (cpu::cpu_has_avx512()) p.push_back(cpu::KernelPath::Avx512);
  return p;
}

struct Guard {  // restores what a test changed
  cpu::KernelPath path = cpu::kernel_path();
  cpu::Activations act = cpu::mxfp4_activations();
  int threads = cpu::threads();
  Guard() { cpu::set_mxfp4_activations(cpu::Activations::Q8); }
  ~Guard() {
    cpu::set_kernel_path(path);
    cpu::set_mxfp4_activations(act);
    cpu::set_threads(threads);
  }
};

// Rows with every kind of block: random, all zero, one huge value, tiny
// values, exact halves (ties), a NaN, an infinity.
std::vector<float> awkward_row(int64_t blocks, std::mt19937& rng) {
  auto x = randn(size_t(32 * blocks), rng, 2.0f);
  if (blocks > 1) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
  if (blocks > 2) x[70] = 3e38f;
  if (blocks > 3)
    for (int j = 96; j < 128; ++j) x[size_t(j)] *= 1e-30f;
  if (blocks > 4)
    for (int j = 128; j < 160; ++j) x[size_t(j)] = float(j - 144) * 0.5f;  // amax 8: ties
  if (blocks > 5) x[170] = NAN;
  if (blocks > 6) x[200] = -INFINITY;
  return x;
}

}  // namespace

TEST(Q8, QuantizersMatchTheReferenceBitForBit) {
  std::mt19937 rng(41);
  const int64_t blocks = 9;
  const auto x = awkward_row(blocks, rng);
  std::vector<int8_t> qr(size_t(32 * blocks)), q(qr.size());
  std::vector<float> dr(static_cast<size_t>(blocks)), d(dr.size());
  ref::quantize_q8(x.data(), blocks, qr.data(), dr.data());
  EXPECT_TRUE(std::isnan(dr[5]) && std::isnan(dr[6]));
  EXPECT_EQ(dr[1], 0.0f);
  using Fn = void (*)(const float*, int64_t, int8_t*, float*);
  std::vector<Fn> fns{cpu::detail::quantize_q8_portable};
  if (cpu::cpu_has_avx2()) fns.push_back(cpu::detail::quantize_q8_avx2);
  for (Fn f : fns) {
    f(x.data(), blocks, q.data(), d.data());
    EXPECT_EQ(q, qr);
    for (int64_t b = 0; b < blocks; ++b) {
      if (std::isnan(dr[size_t(b)]))
        EXPECT_TRUE(std::isnan(d[size_t(b)])) << b;
      else
        EXPECT_EQ(d[size_t(b)], dr[size_t(b)]) << b;
    }
  }
  // Even columns first: column 2 is byte 1, column 1 is byte 16.
  std::vector<float> y(32, 0.0f);
  y[2] = 127.0f, y[1] = -63.0f;
  ref::quantize_q8(y.data(), 1, q.data(), d.data());
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(q[1], 127);
  EXPECT_EQ(q[16], -63);
}

TEST(Q8, MatmulMatchesTheReferenceOnEveryPath) {
  Guard guard;
  for (auto [rows, cols, n] : std::vector<std::array<int64_t, 3>>{{1, 32, 1},
                                                                  {5, 96, 2},
                                                                  {67, 160, 3},
                                                                  {131, 544, 17},
                                                                  {9, 1056, 40},
                                                                  {301, 1024, 1},
                                                                  {83, 1056, 5}}) {
    std::mt19937 rng(uint32_t(rows * 7 + cols + n));
    Mxfp4Matrix w(rows, cols, rng);
    auto x = randn(size_t(n * cols), rng);
    std::vector<float> r8(size_t(n * rows)), r32(r8.size());
    ref::matmul_q8(w.view, x.data(), n, r8.data());
    ref::matmul(w.view, x.data(), n, r32.data());
    for (cpu::KernelPath p : paths()) {
      cpu::set_kernel_path(p);
      std::vector<float> y(r8.size(), NAN);
      cpu::matmul(w.view, x.data(), n, y.data());
      EXPECT_LE(rel_err(y, r8), 1e-5) << cpu::kernel_path_name(p) << " " << rows << "x" << cols;
      EXPECT_LE(rel_err(y, r32), 1.5e-2) << cpu::kernel_path_name(p);
      EXPECT_GT(rel_err(y, r32), 1e-4) << "q8 was not used";
    }
  }
}

TEST(Q8, MatmulIsBatchAndThreadInvariantOnEveryPath) {
  Guard guard;
  std::mt19937 rng(43);
  for (auto [rows, cols] : std::vector<std::array<int64_t, 2>>{{67, 160}, {130, 512}, {515, 768}}) {
    Mxfp4Matrix w(rows, cols, rng);
    const int64_t n = 7;
    auto x = randn(size_t(n * cols), rng);
    for (cpu::KernelPath p : paths()) {
      cpu::set_kernel_path(p);
      std::vector<float> first;
      for (int threads : {1, 3}) {
        cpu::set_threads(threads);
        std::vector<float> all(size_t(n * rows)), one(all.size());
        cpu::matmul(w.view, x.data(), n, all.data());
        for (int64_t t = 0; t < n; ++t)
          cpu::matmul(w.view, x.data() + t * cols, 1, one.data() + t * rows);
        EXPECT_EQ(all, one) << rows << "x" << cols << " " << cpu::kernel_path_name(p);
        if (first.empty()) first = all;
        EXPECT_EQ(all, first) << "threads " << threads;
      }
    }
  }
}

// The avx512 path's VNNI kernels compute the AVX2 kernels' bits (q8.h), up to
// 8 activation rows (straight from the stored rows) and more (decoded tiles),
// with an even and an odd number of blocks per row.
TEST(Q8, Avx512GivesTheAvx2Bits) {
  if (!cpu::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  Guard guard;
  cpu::set_mxfp4_activations(cpu::Activations::Q8);
  std::mt19937 rng(47);
  for (auto [rows, cols] :
       std::vector<std::array<int64_t, 2>>{{67, 160}, {9, 96}, {130, 2048}, {21, 768}, {6, 32}}) {
    Mxfp4Matrix w(rows, cols, rng);
    for (int64_t n : {1, 2, 3, 4, 5, 8, 9}) {  // 5 and 8: direct, in groups of 4; 9: tiles
      auto x = randn(size_t(n * cols), rng);
      std::vector<float> y2(size_t(n * rows), NAN), y5(y2.size(), -1.0f);
      cpu::set_kernel_path(cpu::KernelPath::Avx2);
      cpu::matmul(w.view, x.data(), n, y2.data());
      cpu::set_kernel_path(cpu::KernelPath::Avx512);
      cpu::matmul(w.view, x.data(), n, y5.data());
      EXPECT_EQ(y5, y2) << rows << "x" << cols << " n " << n;
    }
  }
}

TEST(Q8, NanIsNeverHidden) {
  Guard guard;
  std::mt19937 rng(47);
  Mxfp4Matrix w(7, 96, rng);
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
    auto xn = x;
    xn[96 + 40] = NAN;  // token 1, block 1
    std::vector<float> y(3 * 7);
    cpu::matmul(w.view, xn.data(), 3, y.data());
    for (int r = 1; r < 7; ++r) {
      EXPECT_TRUE(std::isfinite(y[size_t(r)]));
      EXPECT_TRUE(std::isnan(y[size_t(7 + r)])) << cpu::kernel_path_name(p);
    }
  }
}

TEST(Q8, F32ModeIsTheExactPath) {
  Guard guard;
  std::mt19937 rng(53);
  Mxfp4Matrix w(33, 256, rng);
  auto x = randn(2 * 256, rng);
  std::vector<float> r32(2 * 33), y(r32.size());
  ref::matmul(w.view, x.data(), 2, r32.data());
  cpu::set_mxfp4_activations(cpu::Activations::F32);
  cpu::matmul(w.view, x.data(), 2, y.data());
  EXPECT_LE(rel_err(y, r32), 1e-5);
}
