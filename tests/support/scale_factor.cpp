// scale_factor.cpp — scale_factor.h.
#include "scale_factor.h"

#include <algorithm>  // defines: std::max
#include <cmath>
#include <cstdio>

namespace scalelab::test {

namespace {

constexpr double kFactorRtol = 1e-3;  // a factor "is" a known one within this; also how far from 1 it must be

std::string describe_factor(double k, const std::vector<KnownFactor>& known, const std::string& what) {
  std::string causes;
  for (const KnownFactor& f : known) {
    if (std::fabs(k - f.factor) <= kFactorRtol * std::fabs(f.factor))
      causes += (causes.empty() ? "" : ", or ") + f.cause;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx ", k);
  return buf + what + (causes.empty() ? "" : " (" + causes + "?)");
}

}  // namespace

void ScaleFit::add(const float* got, const float* want, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    gg_ += g * g;
    gw_ += g * w;
    ww_ += w * w;
  }
}

void ScaleFit::add(const ScaleFit& other) {
  gg_ += other.gg_;
  gw_ += other.gw_;
  ww_ += other.ww_;
}

double ScaleFit::factor() const { return ww_ > 0 ? gw_ / ww_ : 1.0; }

bool ScaleFit::constant_factor() const {
  if (!(ww_ > 0) || !std::isfinite(gg_)) return false;
  const double k = factor();
  if (!(std::fabs(k - 1.0) > kFactorRtol) || k == 0.0) return false;
  // ||g - k w||^2 = <g,g> - 2k<g,w> + k^2<w,w> = <g,g> - k<g,w> at the least-squares k
  const double residual2 = std::max(0.0, gg_ - k * gw_);
  return residual2 <= kRoundingRtol * kRoundingRtol * k * k * ww_;
}

std::vector<KnownFactor> data_parallel_factors(int world, int micro_steps) {
  const double n = world, m = micro_steps;
  const std::string ranks = std::to_string(world) + " ranks", steps = std::to_string(micro_steps) + " micro-steps";
  std::vector<KnownFactor> all = {
      {n, "summed over the " + ranks + " instead of averaged (ReduceOp::Sum)"},
      {m, "the sum over the " + steps + " not divided by their number"},
      {micro_steps > 1 ? n * m : 1.0, "summed over the ranks and not divided by the number of micro-steps"},
      {1.0 / n, "averaged over the ranks and then divided by the world size again"},
      {1.0 / m, "divided by the number of micro-steps twice"},
      {n / 2.0, "summed, then divided by 2 instead of by the world size"},
  };
  std::vector<KnownFactor> out;
  for (const KnownFactor& f : all)
    if (std::fabs(f.factor - 1.0) > kFactorRtol) out.push_back(f);
  return out;
}

std::string describe_scale(const ScaleFit& fit, const std::vector<KnownFactor>& known, const std::string& what) {
  return fit.constant_factor() ? describe_factor(fit.factor(), known, what) : "";
}

std::string describe_ratio(double got, double want, const std::vector<KnownFactor>& known, const std::string& what) {
  if (want == 0.0 || !std::isfinite(got) || std::fabs(got / want - 1.0) <= kFactorRtol) return "";
  return describe_factor(got / want, known, what);
}

}  // namespace scalelab::test
