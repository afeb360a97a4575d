// optimizer_ops.cpp — CPU twins of the elementwise optimizer updates: AdamW and plain SGD.
// Defines scalelab::cpu::adamw_update / sgd_update (contract: scalelab/ops/ops.h). The arithmetic follows
// torch.optim.AdamW / torch.optim.SGD (single-tensor CPU path) operation by operation, so a run can be
// compared with PyTorch. CUDA twin: common/src/ops/cuda/optimizer_ops.cu
// tests: tests/common/ops/test_ops_cpu.cpp
#include <cmath>
#include <cstdint>

#include "scalelab/ops/ops.h"  // defines: the cpu:: declarations implemented here

namespace scalelab::cpu {

// AdamW, Loshchilov & Hutter 2019 (arXiv:1711.05101), Alg. 2, at step t >= 1, on n elements (all fp32):
//   p *= 1 - lr * weight_decay                         (decoupled decay, applied first as torch does)
//   m  = m + (1 - beta1) (g - m)                       (= beta1 m + (1 - beta1) g; torch's lerp_)
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// This is the formula in ops.h (mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t)) rearranged as
// torch does: the bias corrections are folded into two scalars, computed in double like Python floats.
// param, grad, m, v (n); lr, eps, weight_decay plain numbers; beta1, beta2 in [0,1).
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t) {
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float step_size = static_cast<float>(static_cast<double>(lr) / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);  // p *= decay
  const float one_minus_beta1 = static_cast<float>(1.0 - beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - beta2);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m_new = m[i] + one_minus_beta1 * (g - m[i]);
    const float v_new = v[i] * beta2 + one_minus_beta2 * g * g;
    const float denom = std::sqrt(v_new) / bias_correction2_sqrt + eps;
    param[i] = p + (-step_size) * m_new / denom;  // torch addcdiv_: p + (value * m) / denom
    m[i] = m_new;
    v[i] = v_new;
  }
}

// SGD without momentum, weight decay as torch.optim.SGD applies it (added to the gradient, i.e. L2):
//   p -= lr * (g + weight_decay * p).     param, grad (n).
void sgd_update(float* param, const float* grad, int64_t n, float lr, float weight_decay) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float d_p = grad[i] + weight_decay * param[i];
    param[i] = param[i] + (-lr) * d_p;
  }
}

}  // namespace scalelab::cpu
