// CB3 (kernels/cb3.h): the bit layout, the scalar reference, the CPU kernels
// against the reference on random odd shapes (normalized error), and the
// weighted k-means fit (convert/cb3_fit.h) against 3-bit uniform rounding.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "convert/cb3_fit.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cb3.h"
#include "kernels/cpu/cb3.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ref/ref.h"
#include "numeric.h"

using namespace moetier::testing;

using namespace moetier;

namespace {

// A random CB3 matrix: random codes, random (unsorted) f16 codebooks.
struct RandomCb3 {
  std::vector<uint8_t> codes, book;
  std::vector<uint8_t> unpacked;  // [rows, cols]
  MatView view;
  RandomCb3(int64_t rows, int64_t cols, std::mt19937& rng) {
    std::uniform_int_distribution<int> code(0, 7);
    const int64_t rb = kernels::cb3_row_bytes(cols);
    unpacked.resize(size_t(rows * cols));
    for (auto& c : unpacked) c = uint8_t(code(rng));
    codes.resize(size_t(rows * rb));
    for (int64_t r = 0; r < rows; ++r)
      kernels::cb3_pack_row(unpacked.data() + r * cols, cols, codes.data() + r * rb);
    book.resize(size_t(rows * 16));
    const auto vals = randn(size_t(rows * 8), rng, 0.3f);
    for (size_t i = 0; i < vals.size(); ++i) {
      const uint16_t h = f32_to_f16(vals[i]);
      std::memcpy(book.data() + 2 * i, &h, 2);
    }
    view = {WeightEncoding::CB3, rows, cols, codes.data(), book.data()};
  }
  float value(int64_t r, int64_t c) const {
    uint16_t h;
    std::memcpy(&h, book.data() + (r * 8 + unpacked[size_t(r * view.cols + c)]) * 2, 2);
    return f16_to_f32(h);
  }
};

}  // namespace

// The documented bit order: columns 8g..8g+7 in bytes 3g..3g+2, v = b0 | b1<<8
// | b2<<16, code j = (v >> 3j) & 7; unused high bits zero.
TEST(Cb3Layout, BitOrderIsLittleEndianThreeBitsPerColumn) {
  const uint8_t codes[10] = {1, 2, 3, 4, 5, 6, 7, 0, 5, 3};
  uint8_t out[4] = {0xaa, 0xaa, 0xaa, 0xaa};
  ASSERT_EQ(kernels::cb3_row_bytes(10), 4);
  kernels::cb3_pack_row(codes, 10, out);
  EXPECT_EQ(out[0], 0xd1);
  EXPECT_EQ(out[1], 0x58);
  EXPECT_EQ(out[2], 0x1f);
  EXPECT_EQ(out[3], 0x1d);  // 5 | 3 << 3, bits 6..7 zero
  for (int c = 0; c < 10; ++c) EXPECT_EQ(kernels::cb3_code(out, c), codes[c]) << c;
}

TEST(Cb3Layout, PackRoundTripsEveryWidth) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> code(0, 7);
  for (int64_t cols = 1; cols <= 41; ++cols) {
    std::vector<uint8_t> c(static_cast<size_t>(cols)), packed(size_t(kernels::cb3_row_bytes(cols)));
    for (auto& x : c) x = uint8_t(code(rng));
    kernels::cb3_pack_row(c.data(), cols, packed.data());
    for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(kernels::cb3_code(packed.data(), i), c[size_t(i)]);
    const int used = int(3 * cols % 8);
    if (used) {
      EXPECT_EQ(packed.back() >> used, 0) << cols;  // padding bits are zero
    }
  }
}

TEST(Cb3Kernels, RefWeightAtIsTheCodebookEntry) {
  std::mt19937 rng(7);
  RandomCb3 m(5, 19, rng);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 19; ++c) ASSERT_EQ(ref::weight_at(m.view, r, c), m.value(r, c));
}

class Cb3Matmul : public ::testing::TestWithParam<std::array<int64_t, 3>> {};

TEST_P(Cb3Matmul, MatchesReference) {
  const auto [rows, cols, n] = GetParam();
  std::mt19937 rng(uint32_t(rows * 1000 + cols * 10 + n));
  RandomCb3 m(rows, cols, rng);
  const auto x = randn(size_t(n * cols), rng);
  std::vector<float> ref(size_t(n * rows)), out(size_t(n * rows), NAN);
  ref::matmul(m.view, x.data(), n, ref.data());
  const cpu::KernelPath saved = cpu::kernel_path();
  std::vector<cpu::KernelPath> paths{cpu::KernelPath::Portable};
  if (cpu::cpu_has_avx2()) paths.push_back(cpu::KernelPath::Avx2);
  if (cpu::cpu_has_avx512()) paths.push_back(cpu::KernelPath::Avx512);
  for (cpu::KernelPath p : paths) {
    cpu::set_kernel_path(p);
    cpu::matmul(m.view, x.data(), n, out.data());
    EXPECT_LE(rel_err(out, ref), 1e-5) << rows << "x" << cols << " n=" << n;
    // Batch invariance: each token alone gives the same bits.
    std::vector<float> one(size_t(n * rows), NAN);
    for (int64_t t = 0; t < n; ++t)
      cpu::matmul(m.view, x.data() + t * cols, 1, one.data() + t * rows);
    EXPECT_EQ(out, one) << cpu::kernel_path_name(p) << " " << rows << "x" << cols;
  }
  cpu::set_kernel_path(saved);
}

// One and several tokens, cols % 8 != 0, a single column,
// and a size above the parallel threshold.
INSTANTIATE_TEST_SUITE_P(
    OddShapes, Cb3Matmul,
    ::testing::Values(std::array<int64_t, 3>{1, 1, 1}, std::array<int64_t, 3>{7, 13, 1},
                      std::array<int64_t, 3>{33, 64, 2}, std::array<int64_t, 3>{17, 100, 3},
                      std::array<int64_t, 3>{50, 257, 5}, std::array<int64_t, 3>{64, 256, 1},
                      std::array<int64_t, 3>{256, 64, 9}, std::array<int64_t, 3>{5, 8, 4},
                      std::array<int64_t, 3>{300, 301, 3}));

TEST(Cb3Kernels, DispatchedRowKernelsMatchPortable) {
  std::mt19937 rng(11);
  for (int64_t cols : {1, 7, 8, 9, 16, 23, 64, 129}) {
    RandomCb3 m(3, cols, rng);
    const int64_t rb = kernels::cb3_row_bytes(cols);
    for (int64_t r = 0; r < 3; ++r) {
      const uint8_t* codes = m.codes.data() + r * rb;
      const uint8_t* book = m.book.data() + r * 16;
      std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
      cpu::detail::decode_cb3_portable(codes, book, cols, a.data());
      cpu::detail::best_cb3_decode()(codes, book, cols, b.data());
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(a[size_t(c)], m.value(r, c));
      EXPECT_EQ(a, b);
    }
  }
}

TEST(Cb3Kernels, GetRowDecodesAndMissingCodebookIsRefused) {
  std::mt19937 rng(13);
  RandomCb3 m(4, 37, rng);
  std::vector<float> row(37);
  cpu::get_row(m.view, 2, row.data());
  for (int64_t c = 0; c < 37; ++c) ASSERT_EQ(row[size_t(c)], m.value(2, c));
  MatView bad = m.view;
  bad.scales = nullptr;
  std::vector<float> x(37, 1.0f), y(4);
  EXPECT_THROW(cpu::matmul(bad, x.data(), 1, y.data()), Error);
  EXPECT_THROW(cpu::get_row(m.view, 4, row.data()), Error);
}

// k-means with 8 centroids beats 8 evenly spaced levels from min to max on
// Gaussian rows (relative error ~0.033; uniform 0.040 at 64 columns, 0.074 at 1000).
TEST(Cb3Fit, BeatsUniformThreeBitOnGaussianRows) {
  std::mt19937 rng(17);
  Cb3Scratch s;
  for (int64_t cols : {64, 100, 256, 1000}) {
    double fit = 0, uni = 0, energy = 0;
    for (int row = 0; row < 20; ++row) {
      const auto x = randn(size_t(cols), rng, 0.05f);
      uint16_t book[8];
      std::vector<uint8_t> codes(static_cast<size_t>(cols));
      cb3_fit_row(x.data(), nullptr, cols, 16, book, codes.data(), s);
      for (int k = 1; k < 8; ++k) EXPECT_LE(f16_to_f32(book[k - 1]), f16_to_f32(book[k]));
      for (int64_t c = 0; c < cols; ++c) {
        const double d = x[size_t(c)] - f16_to_f32(book[codes[size_t(c)]]);
        fit += d * d;
        energy += double(x[size_t(c)]) * x[size_t(c)];
      }
      uni += uniform3_error(x.data(), nullptr, cols).err;
    }
    EXPECT_LT(fit, 0.9 * uni) << cols;  // measured 0.84 (64 cols) .. 0.46 (1000 cols)
    EXPECT_LT(fit / energy, 0.045) << cols;
    std::printf("cols %lld: k-means rel err %.4f, uniform 3-bit %.4f\n", (long long)cols,
                fit / energy, uni / energy);
  }
}

// With column weights, the weighted fit has the lower weighted error than
// the unweighted one (summed over many rows).
TEST(Cb3Fit, WeightsSteerTheFit) {
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const int64_t cols = 96;
  std::vector<float> w(static_cast<size_t>(cols));
  for (auto& v : w) v = std::pow(u(rng), 4.0f) * 10.0f;  // a few heavy columns
  Cb3Scratch s;
  double weighted = 0, plain = 0;
  for (int row = 0; row < 40; ++row) {
    const auto x = randn(size_t(cols), rng);
    uint16_t b1[8], b2[8];
    std::vector<uint8_t> c1(static_cast<size_t>(cols)), c2(static_cast<size_t>(cols));
    cb3_fit_row(x.data(), w.data(), cols, 20, b1, c1.data(), s);
    cb3_fit_row(x.data(), nullptr, cols, 20, b2, c2.data(), s);
    for (int64_t c = 0; c < cols; ++c) {
      const double d1 = x[size_t(c)] - f16_to_f32(b1[c1[size_t(c)]]);
      const double d2 = x[size_t(c)] - f16_to_f32(b2[c2[size_t(c)]]);
      weighted += w[size_t(c)] * d1 * d1;
      plain += w[size_t(c)] * d2 * d2;
    }
  }
  EXPECT_LT(weighted, 0.9 * plain);
}

TEST(Cb3Fit, ExactWhenTheRowHasAtMostEightValues) {
  Cb3Scratch s;
  std::vector<float> x(40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7 % 8) - 3) * 0.25f;  // 8 values
  uint16_t book[8];
  std::vector<uint8_t> codes(x.size());
  cb3_fit_row(x.data(), nullptr, int64_t(x.size()), 16, book, codes.data(), s);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(f16_to_f32(book[codes[i]]), x[i]) << i;
  std::vector<float> flat(13, -1.5f);
  cb3_fit_row(flat.data(), nullptr, 13, 16, book, codes.data(), s);
  for (int i = 0; i < 13; ++i) EXPECT_EQ(f16_to_f32(book[codes[size_t(i)]]), -1.5f);
  std::vector<float> zero_w(13, 0.0f);  // all weights zero: unit weights instead
  cb3_fit_row(flat.data(), zero_w.data(), 13, 16, book, codes.data(), s);
  EXPECT_EQ(f16_to_f32(book[codes[0]]), -1.5f);
}

// The encoded matrix decodes (via the kernels) to the fitted values, and the
// bytes do not depend on the number of threads.
TEST(Cb3Fit, EncodeMatrixIsDeterministicAndDecodes) {
  std::mt19937 rng(23);
  const int64_t rows = 300, cols = 257;  // above the parallel threshold (2^16)
  const auto w = randn(size_t(rows * cols), rng, 0.1f);
  const int64_t rb = kernels::cb3_row_bytes(cols);
  std::vector<uint8_t> c1(size_t(rows * rb)), b1(size_t(rows * 16)), c2 = c1, b2 = b1;
  const int saved = cpu::threads();
  cpu::set_threads(1);
  const Cb3Error e1 = cb3_encode_matrix(w.data(), rows, cols, nullptr, 16, c1.data(), b1.data());
  cpu::set_threads(3);
  const Cb3Error e2 = cb3_encode_matrix(w.data(), rows, cols, nullptr, 16, c2.data(), b2.data());
  cpu::set_threads(saved);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(b1, b2);
  EXPECT_EQ(e1.err, e2.err);  // per-chunk sums added in chunk order
  MatView v{WeightEncoding::CB3, rows, cols, c1.data(), b1.data()};
  std::vector<float> row(static_cast<size_t>(cols));
  double err = 0;
  for (int64_t r = 0; r < rows; ++r) {
    cpu::get_row(v, r, row.data());
    for (int64_t c = 0; c < cols; ++c) {
      const double d = double(w[size_t(r * cols + c)]) - row[size_t(c)];
      err += d * d;
    }
  }
  EXPECT_NEAR(err, e1.err, 1e-6 * e1.err);
  EXPECT_GT(e1.relative(), 0.0);
  EXPECT_LT(e1.relative(), 0.06);
}
