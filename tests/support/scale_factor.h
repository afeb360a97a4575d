// scale_factor.h — "2.00x the expected value: summed instead of averaged?": tells a result that is the
// expected one times a constant from any other mismatch, so a failing equality check names the factor
// (and the mistakes that produce it) instead of a relative error of 1.00e+00. Used by the comparisons of
// labs 01, 03 and 04 (tests/lab01/test_lab01.cpp, tests/lab03/lab03_support.cpp, tests/lab04/lab04_support.cpp).
// Implementation: scale_factor.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::test {

// The least-squares factor k of got ~ k * want over everything add()ed (one tensor, or a whole model),
// and whether the fit is exact up to fp32 rounding: ||got - k want|| <= kRoundingRtol * ||k want||.
// Sums in double: the residual follows from <g,g>, <g,w>, <w,w> without a second pass.
class ScaleFit {
 public:
  // fp32 rounding of sums taken in another order leaves ~1e-6 of a tensor's norm (labs 03/04 measured
  // 3.5e-7..5.6e-7 of its largest entry); a real non-constant mistake leaves tens of percent.
  static constexpr double kRoundingRtol = 1e-4;

  void add(const float* got, const float* want, int64_t n);
  void add(const ScaleFit& other);
  double factor() const;  // 1 when want is all zero
  // got is k x want with k clearly not 1 (|k - 1| > 1e-3): a scaling mistake, not a rounding difference.
  bool constant_factor() const;

 private:
  double gg_ = 0, gw_ = 0, ww_ = 0;
};

// A factor a known mistake produces, and the question the message asks about it.
struct KnownFactor {
  double factor;
  std::string cause;  // "summed over the 2 ranks instead of averaged"
};

// The factors of the data-parallel mistakes for `world` ranks and `micro_steps` micro-steps per step:
// world (Sum instead of Avg), micro_steps (no 1/m), world x micro_steps, 1/world and 1/micro_steps
// (divided twice), world/2 (summed, then divided by 2 instead of by the world size). Factors equal to 1
// are left out (a mistake that changes nothing at this size cannot be named by its factor).
std::vector<KnownFactor> data_parallel_factors(int world, int micro_steps);

// "2.00x <what> (summed over the 2 ranks instead of averaged?)": the factor, and every known cause
// whose factor it is (within 1e-3 relative; several are joined by ", or "). "" unless
// fit.constant_factor().
std::string describe_scale(const ScaleFit& fit, const std::vector<KnownFactor>& known,
                           const std::string& what = "the expected value");
// The same for one number (a loss, a norm): "" when got equals want within 1e-3 relative or want is 0.
std::string describe_ratio(double got, double want, const std::vector<KnownFactor>& known,
                           const std::string& what = "the expected value");

}  // namespace scalelab::test
