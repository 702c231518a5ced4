#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"

using namespace moetier;

TEST(DType, NamesRoundTrip) {
  for (auto t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E8M0,
                 DType::U8, DType::I8, DType::I32, DType::I64}) {
    auto back = dtype_from_name(dtype_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(dtype_from_name("F4").has_value());
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // 1 + 3*2^-8 -> up to even
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 3.f);
  for (int i = 0; i < 1000; ++i) {
    float x = d(rng);
    float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * (1.0f / 256));
  }
}

TEST(DType, F16RoundTrip) {
  for (float x : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(DType, Fp8AndFp4Tables) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(120), 1.0f / 128);
  EXPECT_EQ(e2m1_to_f32(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xb), -1.5f);
}
