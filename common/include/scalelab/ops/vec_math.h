// vec_math.h — e^x and sums written so that the loops calling them vectorize (for the CPU twins,
// common/src/ops/cpu/).
// glibc's expf is a call the compiler cannot put in a SIMD loop (its vector twin in libmvec is declared
// only under -ffast-math), so GELU and the attention softmax spent most of their time in scalar expf calls.
// This one is a few multiply-adds without branches: GCC vectorizes a loop around it (8 or 16 lanes).
// A plain running sum does not vectorize either: without -ffast-math the compiler keeps its order, so each
// addition waits for the one before (sum_8_lanes below).
// Tests: tests/common/ops/test_vec_math.cpp (the error over the whole range, the clamps, NaN; the sum's order).
#pragma once

#include <cmath>  // defines: std::floor
#include <cstdint>
#include <cstring>  // defines: std::memcpy

namespace scalelab::cpu {

// e^x for float x, within 2 ulp of the correctly rounded value for x in [-87, 88.3] (e^x from 1.6e-38 to
// 2.2e38, normal floats); below that range it returns e^-87 (not 0: a softmax or a sigmoid does not mind),
// above it e^88.3 (not inf), and NaN for NaN. The classic reduction (e.g. Muller, "Elementary Functions",
// Ch. 11):
//   x = n ln2 + r,  n = round(x / ln2), |r| <= ln2 / 2, with ln2 split in two so that n ln2 is exact;
//   e^r by its Taylor polynomial to r^7 (truncation < 5.3e-9 relative on |r| <= 0.347), in Horner form;
//   2^n by writing n + 127 into the float's exponent bits.
inline float exp_vectorizable(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;     // ln 2 to 9 bits: n * kLn2Hi is exact for |n| <= 127
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
  x = x < -87.0f ? -87.0f : x;               // compiled to min/max: no branch (NaN compares false and stays NaN)
  x = x > 88.3f ? 88.3f : x;
  const float n = std::floor(x * kLog2e + 0.5f);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n: n is in [-125, 127] here, so n + 127 is a normal float's biased exponent. (A NaN x converts as 0,
  // since converting NaN to an integer is undefined, and comes back as itself at the end.)
  const int32_t bits = (static_cast<int32_t>(n == n ? n : 0.0f) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(bits));
  return x == x ? p * two_n : x;
}

// sum of term(i) for i in [0, n), in 8 interleaved partial sums (lane j takes i = j, j + 8, ...), the 8 lanes
// then added in order, then the n % 8 last terms: a fixed order, so the same bits for any thread count and
// every call, which the compiler runs as one 8-lane vector add per step. term: any callable int -> float,
// inlined (e.g. [&](int c) { return x[c] * y[c]; }).
template <class Term>
inline float sum_8_lanes(int n, Term term) {
  float lane[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) lane[j] += term(i + j);
  float sum = 0.0f;
  for (int j = 0; j < 8; j++) sum += lane[j];
  for (; i < n; i++) sum += term(i);
  return sum;
}

// max of x[i] for i in [0, n), n >= 1, in 8 interleaved lanes. A max rounds nothing, so any order gives the
// same value for x without NaN (a NaN in x[0] seeds every lane and comes out, as from the plain loop; a NaN
// elsewhere is skipped, as std::max skips it); the plain loop stays scalar only because the compiler may not
// reorder a float reduction without -ffast-math.
inline float max_8_lanes(const float* x, int n) {
  float lane[8];
  for (int j = 0; j < 8; j++) lane[j] = x[0];
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = lane[0];
  for (int j = 1; j < 8; j++) m = lane[j] > m ? lane[j] : m;
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace scalelab::cpu
