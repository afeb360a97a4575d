// stats.h — the summary statistics of timings the kit reports: the median, robust to the one slow step a
// busy machine adds (a mean is not). Used by the calibration, the bottleneck verdict, the scaling report,
// the perf checks and the benchmarks. Implementation: common/src/measure/stats.cpp
// Tests: tests/common/measure/test_stats.cpp
#pragma once

#include <vector>

namespace scalelab {

// The middle value of v (the mean of the two middle ones for an even count); kNotMeasured (NaN,
// not_measured.h) for an empty v. v is taken by value: the caller's order is kept.
double median(std::vector<double> v);

}  // namespace scalelab
