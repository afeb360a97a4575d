// close_to_scale.h — the elementwise check of ops whose results differ from an oracle only by the order
// of fp32 sums (tests/common/ops/test_attention_flash.cpp, tests/common/ops/test_attention_flash_cuda.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace scalelab::test {

// Passes when |got_i - want_i| <= tol * (max_j |want_j| + |want_i|) for every i (NaN fails), so entries
// near zero by cancellation are judged on the tensor's scale. On failure: how many, the first 5 with both
// values (docs/style.md 29), the max abs error and the max error relative to the scale; on success it prints
// one "[ measured ]" line with those two errors.
::testing::AssertionResult close_to_scale(const std::string& what, const std::vector<float>& got,
                                          const std::vector<double>& want, double tol);
::testing::AssertionResult close_to_scale(const std::string& what, const std::vector<float>& got,
                                          const std::vector<float>& want, double tol);

}  // namespace scalelab::test
