// close_to_scale.cpp — close_to_scale.h.
#include "close_to_scale.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace scalelab::test {

::testing::AssertionResult close_to_scale(const std::string& what, const std::vector<float>& got,
                                          const std::vector<double>& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected " << want.size();
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  size_t num_bad = 0;
  double max_abs = 0.0;
  std::string first_bad;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double bound = tol * (scale + std::fabs(want[i]));
    max_abs = std::max(max_abs, err);
    if (!(err <= bound)) {  // written so that NaN fails
      if (num_bad < 5) {
        char line[160];
        std::snprintf(line, sizeof line, "\n    [%zu] got %.9g want %.9g (err %.3e, bound %.3e)", i, got[i], want[i],
                      err, bound);
        first_bad += line;
      }
      num_bad++;
    }
  }
  const double max_scaled = scale > 0.0 ? max_abs / scale : max_abs;
  if (num_bad == 0) {
    std::printf("[ measured ] %s: max abs err %.3e, max err / max|want| %.3e (tol %.0e)\n", what.c_str(), max_abs,
                max_scaled, tol);
    return ::testing::AssertionSuccess();
  }
  char summary[200];
  std::snprintf(summary, sizeof summary, "%s: %zu of %zu elements out of bound; max abs err %.3e (%.3e of max|want|)",
                what.c_str(), num_bad, got.size(), max_abs, max_scaled);
  return ::testing::AssertionFailure() << summary << first_bad;
}

::testing::AssertionResult close_to_scale(const std::string& what, const std::vector<float>& got,
                                          const std::vector<float>& want, double tol) {
  return close_to_scale(what, got, std::vector<double>(want.begin(), want.end()), tol);
}

}  // namespace scalelab::test
