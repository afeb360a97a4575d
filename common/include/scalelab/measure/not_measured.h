// not_measured.h — the value of a quantity that was not measured: NaN, written to the logs as JSON null
// (docs/log_schema.md "Not measured is null"), never 0. Test with std::isnan.
#pragma once

#include <limits>

namespace scalelab {

constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

}  // namespace scalelab
