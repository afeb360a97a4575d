// precision.h — the precision policy: which dtype each kind of state uses. The model, the optimizer,
// the communicator and the memory estimator all read this one object (docs/design.md).
// On the CPU, bf16 is storage only: values are stored as 16-bit and computed in fp32 ("emulated").
#pragma once

#include <string>

#include "scalelab/tensor.h"

namespace scalelab {

struct PrecisionPolicy {
  DType param_dtype = DType::F32;   // parameters as the forward/backward read them
  DType master_dtype = DType::F32;  // the optimizer's copy of the weights (fp32 master when params are bf16)
  DType grad_dtype = DType::F32;    // parameter gradients as stored
  DType reduce_dtype = DType::F32;  // dtype of gradient reduction across ranks (communicator)

  static PrecisionPolicy fp32() { return {}; }
  // The lesson's mixed precision: bf16 parameters for compute, fp32 master and optimizer state,
  // fp32 gradients and fp32 reduction (as FSDP MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)).
  static PrecisionPolicy bf16_mixed() { return {DType::BF16, DType::F32, DType::F32, DType::F32}; }
  // "fp32" or "bf16" (bf16_mixed). Throws with the accepted names otherwise.
  static PrecisionPolicy from_name(const std::string& name);

  bool has_master_copy() const { return param_dtype != master_dtype; }
  std::string name() const;  // "fp32" or "bf16-mixed" or "param=bf16,master=f32,grad=f32,reduce=f32"
};

}  // namespace scalelab
