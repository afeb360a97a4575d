// gelu.cu — CUDA twin of GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, arXiv:1606.08415, Sec. 2).
// Defines scalelab::cuda::gelu_forward / gelu_backward (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). The same formulas as the CPU twin; results differ only through expf, which
// CUDA computes to within 2 ulp (glibc's to within 1), so by a few fp32 ulps.
// CPU twin: common/src/ops/cpu/gelu.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include "context.cuh"           // defines: grid_stride_blocks, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;              // the cubic coefficient of the approximation

// 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), the logistic sigmoid of 2u, as in the CPU twin (which uses it
// because glibc's expf is faster than its tanhf; here it keeps the two twins' formulas identical).
__device__ __forceinline__ float half_one_plus_tanh(float u) { return 1.0f / (1.0f + expf(-2.0f * u)); }

// out (n) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), x = inp (n).
__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = x * half_one_plus_tanh(u);
  }
}

// dinp (n) += gelu'(inp) * dout, gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2), s = 0.5 (1 + tanh u)
// (derivation in the CPU twin).
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float s = half_one_plus_tanh(u);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    const float local_grad = s + 2.0f * x * s * (1.0f - s) * du_dx;
    dinp[i] += local_grad * dout[i];
  }
}
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(out, inp, n);
  SL_CUDA_CHECK_LAST();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(dinp, inp, dout, n);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
