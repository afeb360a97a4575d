// stats.cpp — the median of timings (scalelab/measure/stats.h).
#include "scalelab/measure/stats.h"

#include <algorithm>  // defines: std::sort

#include "scalelab/measure/not_measured.h"  // defines: kNotMeasured

namespace scalelab {

double median(std::vector<double> v) {
  if (v.empty()) return kNotMeasured;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace scalelab
