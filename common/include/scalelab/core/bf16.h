// bf16.h — bfloat16 storage type: the top 16 bits of an IEEE fp32, rounded to nearest even.
// On the CPU the kit stores bf16 and computes in fp32 ("emulated bf16", docs/design.md precision policy).
// Tests: tests/common/core/test_tensor.cpp
#pragma once

#include <cstdint>
#include <cstring>

namespace scalelab {

struct bf16 {
  uint16_t bits = 0;
};

// fp32 -> bf16, round to nearest, ties to even; NaN stays NaN.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

inline float bf16_to_float(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value an fp32 number has after a round trip through bf16 storage.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace scalelab
