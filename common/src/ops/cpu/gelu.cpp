// gelu.cpp — CPU twin of GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, arXiv:1606.08415, Sec. 2).
// Defines scalelab::cpu::gelu_forward / gelu_backward (contract: scalelab/ops/ops.h).
// CUDA twin: common/src/ops/cuda/gelu.cu   tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp (CPU vs CUDA)
#include <cmath>
#include <cstdint>

#include "scalelab/ops/ops.h"       // defines: the cpu:: declarations implemented here
#include "scalelab/ops/vec_math.h"  // defines: exp_vectorizable

namespace scalelab::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;              // the cubic coefficient of the approximation

// 0.5 (1 + tanh(u)) written as the logistic sigmoid of 2u: 1 / (1 + exp(-2u)), the same number
// (tanh(u) = 2 sigmoid(2u) - 1), with an e^x the loops below vectorize (vec_math.h): a call to glibc's
// tanhf or expf per element kept each loop scalar, and GELU took a sixth of the demo model's step
// (bench_lab01 --breakdown). For |u| > 43 the clamped exp gives 1 or about 1e-38 instead of 0: x times it is 0.
inline float half_one_plus_tanh(float u) { return 1.0f / (1.0f + exp_vectorizable(-2.0f * u)); }
}  // namespace

// out (n) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), x = inp (n).
void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = x * half_one_plus_tanh(u);
  }
}

// dinp (n) += gelu'(inp) * dout. With s = 0.5 (1 + tanh(u)), the product and chain rules give
//   gelu'(x) = s + x * 0.5 (1 - tanh(u)^2) du/dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// using 0.5 (1 - tanh^2) = 2 s (1 - s); the form never overflows (unlike 1 / cosh^2 u for large |x|).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float s = half_one_plus_tanh(u);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    const float local_grad = s + 2.0f * x * s * (1.0f - s) * du_dx;
    dinp[i] += local_grad * dout[i];
  }
}

}  // namespace scalelab::cpu
