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
