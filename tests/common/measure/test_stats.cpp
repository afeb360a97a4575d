// test_stats.cpp — the one median of the kit: odd and even counts, the caller's order kept, empty is
// not measured. Code under test: common/src/measure/stats.cpp
#include <gtest/gtest.h>  // defines: TEST, EXPECT_*

#include <cmath>  // defines: std::isnan
#include <vector>

#include "scalelab/measure/stats.h"  // defines: median

TEST(Median, MiddleValueOfAnOddCount) { EXPECT_EQ(scalelab::median({5, 1, 9, 3, 7}), 5); }

TEST(Median, MeanOfTheTwoMiddleValuesOfAnEvenCount) { EXPECT_EQ(scalelab::median({4, 1, 3, 2}), 2.5); }

TEST(Median, KeepsTheCallersOrder) {
  const std::vector<double> v = {3, 1, 2};
  EXPECT_EQ(scalelab::median(v), 2);
  EXPECT_EQ(v, (std::vector<double>{3, 1, 2}));
}

TEST(Median, OfNothingIsNotMeasured) { EXPECT_TRUE(std::isnan(scalelab::median({}))); }
