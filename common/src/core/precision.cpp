// precision.cpp — PrecisionPolicy names (precision.h).
#include "scalelab/core/precision.h"

#include "scalelab/core/error.h"

namespace scalelab {

PrecisionPolicy PrecisionPolicy::from_name(const std::string& name) {
  if (name == "fp32") return fp32();
  if (name == "bf16" || name == "bf16-mixed") return bf16_mixed();
  if (name == "bf16-compute") return bf16_compute();
  SL_FAIL(
      "use --precision fp32, bf16 (= bf16-mixed: bf16 params, fp32 compute) or bf16-compute (bf16 matmul "
      "operands, fp32 accumulation)",
      "unknown precision '%s'", name.c_str());
}

std::string PrecisionPolicy::name() const {
  auto same = [this](const PrecisionPolicy& o) {
    return param_dtype == o.param_dtype && master_dtype == o.master_dtype && grad_dtype == o.grad_dtype &&
           reduce_dtype == o.reduce_dtype && matmul_dtype == o.matmul_dtype;
  };
  if (same(fp32())) return "fp32";
  if (same(bf16_mixed())) return "bf16-mixed";
  if (same(bf16_compute())) return "bf16-compute";
  std::string s = std::string("param=") + dtype_name(param_dtype) + ",master=" + dtype_name(master_dtype) +
                  ",grad=" + dtype_name(grad_dtype) + ",reduce=" + dtype_name(reduce_dtype);
  if (matmul_dtype != DType::F32) s += std::string(",matmul=") + dtype_name(matmul_dtype);
  return s;
}

}  // namespace scalelab
