// precision.cpp — PrecisionPolicy names (precision.h).
#include "scalelab/precision.h"

#include "scalelab/error.h"

namespace scalelab {

PrecisionPolicy PrecisionPolicy::from_name(const std::string& name) {
  if (name == "fp32") return fp32();
  if (name == "bf16" || name == "bf16-mixed") return bf16_mixed();
  SL_FAIL("use --precision fp32 or --precision bf16", "unknown precision '%s'", name.c_str());
}

std::string PrecisionPolicy::name() const {
  const PrecisionPolicy f = fp32(), b = bf16_mixed();
  auto same = [this](const PrecisionPolicy& o) {
    return param_dtype == o.param_dtype && master_dtype == o.master_dtype && grad_dtype == o.grad_dtype &&
           reduce_dtype == o.reduce_dtype;
  };
  if (same(f)) return "fp32";
  if (same(b)) return "bf16-mixed";
  return std::string("param=") + dtype_name(param_dtype) + ",master=" + dtype_name(master_dtype) +
         ",grad=" + dtype_name(grad_dtype) + ",reduce=" + dtype_name(reduce_dtype);
}

}  // namespace scalelab
