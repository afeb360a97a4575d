// optimizer_ops.cu — CUDA twins of the elementwise optimizer updates: fused AdamW and plain SGD.
// Defines scalelab::cuda::adamw_update / sgd_update (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). One kernel per call reads param, grad, m, v once and writes them once.
// The host computes the CPU twin's scalars with the same double arithmetic, and the kernels repeat the
// CPU's fp32 operations in the CPU's order, each rounded once: the IEEE-rounded intrinsics
// __fadd_rn/__fsub_rn/__fmul_rn/__fdiv_rn/__fsqrt_rn are never contracted into FMAs by nvcc, so the result
// does not depend on the compiler. The CPU build may contract (GCC -O3 -march=native fuses some a*b+c of
// cpu/optimizer_ops.cpp into vfmadd), so the twins agree to about an ulp, not always bit for bit.
// CPU twin: common/src/ops/cpu/optimizer_ops.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include <cmath>  // defines: std::pow, std::sqrt (host scalars)

#include "context.cuh"           // defines: grid_stride_blocks, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;

// AdamW, Loshchilov & Hutter 2019 (arXiv:1711.05101), Alg. 2, arranged as torch.optim.AdamW (see the
// CPU twin for the derivation). param, grad, m, v (n) fp32; the scalars come from adamw_update below.
//   p = param * decay;  m = m + (1 - beta1) (g - m);  v = v beta2 + (1 - beta2) g g
//   param = p + (-step_size) m / (sqrt(v) / sqrt(bias_correction2) + eps)
__global__ void adamw_update_kernel(float* param, const float* grad, float* m, float* v, int64_t n, float step_size,
                                    float bias_correction2_sqrt, float decay, float one_minus_beta1, float beta2,
                                    float one_minus_beta2, float eps) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float p = __fmul_rn(param[i], decay);
    const float m_new = __fadd_rn(m[i], __fmul_rn(one_minus_beta1, __fsub_rn(g, m[i])));
    const float v_new = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), bias_correction2_sqrt), eps);
    param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(-step_size, m_new), denom));
    m[i] = m_new;
    v[i] = v_new;
  }
}

// p -= lr * (g + weight_decay * p), as torch.optim.SGD without momentum: param = param + (-lr) * d_p.
__global__ void sgd_update_kernel(float* param, const float* grad, int64_t n, float lr, float weight_decay) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float d_p = __fadd_rn(grad[i], __fmul_rn(weight_decay, param[i]));
    param[i] = __fadd_rn(param[i], __fmul_rn(-lr, d_p));
  }
}
}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t) {
  if (n == 0) return;
  // Host scalars: the CPU twin's expressions, verbatim (double like Python floats, then fp32).
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float step_size = static_cast<float>(static_cast<double>(lr) / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);  // p *= decay
  const float one_minus_beta1 = static_cast<float>(1.0 - beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - beta2);
  adamw_update_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(param, grad, m, v, n, step_size,
                                                                                        bias_correction2_sqrt, decay,
                                                                                        one_minus_beta1, beta2,
                                                                                        one_minus_beta2, eps);
  SL_CUDA_CHECK_LAST();
}

void sgd_update(float* param, const float* grad, int64_t n, float lr, float weight_decay) {
  if (n == 0) return;
  sgd_update_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(param, grad, n, lr, weight_decay);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
