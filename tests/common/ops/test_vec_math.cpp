// test_vec_math.cpp — exp_vectorizable (scalelab/ops/vec_math.h), the e^x of the CPU twins' GELU and softmax:
// within 2 ulp of e^x (computed in double, then rounded) over its whole range, clamped outside it, NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "scalelab/ops/vec_math.h"  // defines: scalelab::cpu::exp_vectorizable

namespace {

// Distance in units in the last place between two positive finite floats.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

TEST(VecMath, ExpWithinTwoUlpOverItsRange) {
  int64_t worst = 0;
  float worst_x = 0;
  for (float x = -87.0f; x <= 88.3f; x += 0.000731f) {  // about 120,000 points, every binade of e^x
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t e = ulps(scalelab::cpu::exp_vectorizable(x), want);
    if (e > worst) worst = e, worst_x = x;
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
  for (float x : {0.0f, 1.0f, -1.0f, 1e-7f, -1e-7f, 0.5f * 0.6931472f})
    EXPECT_LE(ulps(scalelab::cpu::exp_vectorizable(x), static_cast<float>(std::exp(double{x}))), 2) << x;
  EXPECT_EQ(scalelab::cpu::exp_vectorizable(0.0f), 1.0f);
}

TEST(VecMath, ExpClampsOutsideItsRangeAndKeepsNaN) {
  EXPECT_EQ(scalelab::cpu::exp_vectorizable(-1000.0f), scalelab::cpu::exp_vectorizable(-87.0f));
  EXPECT_GT(scalelab::cpu::exp_vectorizable(-1000.0f), 0.0f);
  EXPECT_LT(scalelab::cpu::exp_vectorizable(-1000.0f), 2e-38f);
  EXPECT_EQ(scalelab::cpu::exp_vectorizable(1000.0f), scalelab::cpu::exp_vectorizable(88.3f));
  EXPECT_TRUE(std::isfinite(scalelab::cpu::exp_vectorizable(1000.0f)));
  EXPECT_TRUE(std::isnan(scalelab::cpu::exp_vectorizable(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace

// sum_8_lanes adds in the order its comment gives (lanes, then the lanes in order, then the tail): the
// order is part of the contract, since the CPU twins promise the same bits for any thread count.
TEST(VecMath, SumOf8LanesAddsInItsDocumentedOrder) {
  float x[21];
  for (int i = 0; i < 21; i++) x[i] = (i % 3 == 0 ? 1e8f : 1.0f) * (i % 2 ? -1.0f : 1.0f) + 0.1f * i;
  float lane[8] = {};
  for (int i = 0; i < 16; i++) lane[i % 8] += x[i];
  float want = 0.0f;
  for (int j = 0; j < 8; j++) want += lane[j];
  for (int i = 16; i < 21; i++) want += x[i];
  const float got = scalelab::cpu::sum_8_lanes(21, [&](int i) { return x[i]; });
  EXPECT_EQ(got, want);
  float running = 0.0f;  // and it is a sum: close to the plain running sum
  for (int i = 0; i < 21; i++) running += x[i];
  EXPECT_NEAR(got, running, 64.0f);
}

// max_8_lanes is the plain maximum for every length (the tail and the lanes) and any position of the max.
TEST(VecMath, MaxOf8LanesIsTheMaximum) {
  float x[37];
  for (int n = 1; n <= 37; n++) {
    for (int at = 0; at < n; at++) {
      for (int i = 0; i < n; i++) x[i] = -1.0f - 0.5f * ((i * 7) % 5);
      x[at] = 3.0f;
      EXPECT_EQ(scalelab::cpu::max_8_lanes(x, n), 3.0f) << "n " << n << ", max at " << at;
    }
  }
}
