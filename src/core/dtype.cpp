#include "core/dtype.h"

#include <cmath>

namespace moetier {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E8M0, "F8_E8M0", 1}, {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},           {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
};
}  // namespace

size_t dtype_size(DType t) { return kInfo[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kInfo[size_t(t)].name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.t;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);
    return sign ? -f : f;
  }
  uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                         : sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal: units of 2^-24, round to even
    float q = std::nearbyint(a * 16777216.0f);
    return sign | uint16_t(q);
  }
  uint32_t au = u & 0x7fffffffu;
  au += 0x0fffu + ((au >> 13) & 1u);  // round mantissa to 10 bits, even
  int exp = int(au >> 23) - 127 + 15;
  return sign | uint16_t(exp << 10) | uint16_t((au >> 13) & 0x3ff);
}

float fp8_e4m3_to_f32(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int exp = (v >> 3) & 0xf;
  int mant = v & 7;
  if (exp == 15 && mant == 7) return __builtin_nanf("");
  if (exp == 0) return sign * std::ldexp(float(mant), -9);
  return sign * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}

}  // namespace moetier
