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

DType PrecisionPolicy::activation_dtype_from_name(const std::string& name) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  SL_FAIL(
      "use --activations fp32 (keep the forward's activations as computed) or bf16 (store them in 16 bits, as "
      "Megatron-LM and torchtitan do)",
      "unknown activation dtype '%s'", name.c_str());
}

std::string PrecisionPolicy::name() const {
  const std::string activations =
      activation_dtype == DType::F32 ? "" : std::string("+") + dtype_name(activation_dtype) + "-activations";
  auto same = [this](const PrecisionPolicy& o) {
    return param_dtype == o.param_dtype && master_dtype == o.master_dtype && grad_dtype == o.grad_dtype &&
           reduce_dtype == o.reduce_dtype && matmul_dtype == o.matmul_dtype;
  };
  if (same(fp32())) return "fp32" + activations;
  if (same(bf16_mixed())) return "bf16-mixed" + activations;
  if (same(bf16_compute())) return "bf16-compute" + activations;
  std::string s = std::string("param=") + dtype_name(param_dtype) + ",master=" + dtype_name(master_dtype) +
                  ",grad=" + dtype_name(grad_dtype) + ",reduce=" + dtype_name(reduce_dtype);
  if (matmul_dtype != DType::F32) s += std::string(",matmul=") + dtype_name(matmul_dtype);
  return s + activations;
}

}  // namespace scalelab
