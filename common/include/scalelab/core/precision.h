// precision.h — the precision policy: which dtype each kind of state uses. The model, the optimizer,
// the memory estimator and the planner read this one object (docs/design.md); the communicator reduces
// whatever dtype its buffers hold.
// Two mixed policies: bf16-mixed stores bf16 parameters and computes in fp32 ("emulated bf16", the same
// arithmetic on CPU and GPU); bf16-compute also feeds the model's matmuls bf16 operands (the GPU's bf16
// tensor cores; on the CPU the twin rounds the operands and runs the fp32 GEMM). docs/cuda_backend.md.
// The dtype of the activations a forward keeps for its backward is a third, independent choice
// (activation_dtype: lab drivers' --activations fp32|bf16, sl_plan's too). docs/memory.md "16-bit activations".
// Tests: tests/common/core/test_error.cpp (names), tests/common/ops/test_bf16_compute.cpp,
//        tests/common/model/test_bf16_activations.cpp
#pragma once

#include <string>

#include "scalelab/core/tensor.h"

namespace scalelab {

struct PrecisionPolicy {
  DType param_dtype = DType::F32;   // parameters as the forward/backward read them
  DType master_dtype = DType::F32;  // the optimizer's copy of the weights (fp32 master when params are bf16)
  DType grad_dtype = DType::F32;    // parameter gradients as stored
  // The dtype gradients are reduced in across ranks. Every policy keeps fp32 gradients and reduces them in
  // their own buffers, so this is F32 in every policy and no communicator call reads it: it is the policy's
  // statement for the run record (str()) and the bytes on the wire of lab 09's planner.
  DType reduce_dtype = DType::F32;
  // Operands of the model's matmuls (c_attn, attn c_proj, c_fc, mlp c_proj, the tied LM head). F32: fp32
  // activations times fp32 weights. BF16: the fp32 activation (and, in backward, dout) rounded to bf16
  // times the bf16 parameter, accumulated in fp32 with fp32 outputs (needs param_dtype BF16).
  // Every other op (layernorm, GELU, attention, softmax/cross-entropy, residual) computes in fp32.
  DType matmul_dtype = DType::F32;
  // The activations each block keeps from its forward for its backward (BlockActivations, gpt2_activations.h).
  // F32: as computed. BF16: the tensors of (B,T,*) and (B,NH,T,T) shape that Megatron-LM and torchtitan keep
  // in 16 bits (layernorm outputs, qkv, the attention scores, attention's output, residual2, c_fc's output and
  // GELU's) are stored rounded to bf16 (round to nearest even) and converted back to fp32 where the backward
  // reads them; the block computes in fp32 as before, in one shared fp32 working block. The layernorm
  // mean/rstd, flash attention's lse and the block's output (the residual stream) stay fp32. Independent of
  // the other fields (any of the three policies above can take it).
  DType activation_dtype = DType::F32;

  static PrecisionPolicy fp32() { return {}; }
  // The lesson's mixed precision: bf16 parameters for compute, fp32 master and optimizer state,
  // fp32 gradients and fp32 reduction (as FSDP MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)).
  // The matmuls read an fp32 copy of the bf16 weights (fp32 GEMMs on CPU and GPU).
  static PrecisionPolicy bf16_mixed() { return {DType::BF16, DType::F32, DType::F32, DType::F32}; }
  // bf16_mixed plus bf16 matmul operands: the counterpart of torch.autocast(dtype=torch.bfloat16) over
  // a model whose parameters are bf16 (with fp32 master weights in the optimizer).
  static PrecisionPolicy bf16_compute() {
    return {DType::BF16, DType::F32, DType::F32, DType::F32, /*matmul_dtype=*/DType::BF16};
  }
  // "fp32", "bf16" or "bf16-mixed" (bf16_mixed), "bf16-compute" (bf16_compute). Throws with the
  // accepted names otherwise.
  static PrecisionPolicy from_name(const std::string& name);

  // "fp32" -> F32, "bf16" -> BF16: the value of --activations. Throws with the accepted names otherwise.
  static DType activation_dtype_from_name(const std::string& name);

  bool has_master_copy() const { return param_dtype != master_dtype; }
  // "fp32", "bf16-mixed", "bf16-compute", or e.g. "param=bf16,master=f32,grad=bf16,reduce=f32"
  // (",matmul=bf16" appended when the matmul operands are not fp32); "+bf16-activations" appended when
  // activation_dtype is BF16 (e.g. "bf16-mixed+bf16-activations").
  std::string name() const;
};

}  // namespace scalelab
