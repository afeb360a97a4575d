// bit_identical.h — a test assertion that two arrays are equal bit for bit (each element compared with
// memcmp, so -0 differs from +0 and a NaN equals only the same NaN), reporting the first differing elements'
// bits. For results that must be identical, not close: one computation split differently (ops.h's matmul
// gradients apart or together), a device's op against itself, an index copy.
#pragma once

#include <gtest/gtest.h>  // defines: ::testing::AssertionResult

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace scalelab::test {

// got against want, host vectors of float, int32_t or bf16. On failure: how many differ and the first 5.
template <typename T>
::testing::AssertionResult bit_identical(const std::string& what, const std::vector<T>& got,
                                         const std::vector<T>& want) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "float, int32_t or bf16");
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected " << want.size();
  size_t num_bad = 0;
  std::string first_bad;
  for (size_t i = 0; i < got.size(); i++) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (num_bad < 5) {
        uint32_t g = 0, w = 0;
        std::memcpy(&g, &got[i], sizeof(T));
        std::memcpy(&w, &want[i], sizeof(T));
        char line[120];
        std::snprintf(line, sizeof line, "\n    [%zu] got bits 0x%08x want 0x%08x", i, g, w);
        first_bad += line;
      }
      num_bad++;
    }
  }
  if (num_bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << num_bad << " of " << got.size()
                                       << " elements differ in their bits" << first_bad;
}

}  // namespace scalelab::test
