// Element types of checkpoint tensors and their scalar conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moetier {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, F8_E8M0, U8, I8, I32, I64 };

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling: "F32", "BF16", "F8_E4M3", ...
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8_e4m3_to_f32(uint8_t v);

// e8m0: a power of two, 2^(v-127); 0xff is NaN.
inline float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return __builtin_nanf("");
  uint32_t u = v == 0 ? 0x00400000u : uint32_t(v) << 23;  // 2^-127 is subnormal
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// e2m1 (FP4) code -> value: {0, .5, 1, 1.5, 2, 3, 4, 6} with sign in bit 3.
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kLut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                     4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                     -2.0f, -3.0f, -4.0f, -6.0f};
  return kLut[code & 15];
}

}  // namespace moetier
