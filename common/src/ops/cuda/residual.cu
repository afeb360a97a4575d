// residual.cu — CUDA twin of the residual connection out = a + b.
// Defines scalelab::cuda::residual_forward / residual_backward and add_bias (contract: scalelab/ops/ops.h;
// declared in scalelab/ops/twins.h). One fp32 add per element, as on the CPU: bit-identical.
// CPU twin: common/src/ops/cpu/residual.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include "context.cuh"           // defines: grid_stride_blocks, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;

// out (n) = a (n) + b (n). out may alias a or b (each thread reads its element before writing it).
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

// out (N*OC) += bias[i % OC]: the bias of a row-parallel linear, on every row.
__global__ void add_bias_kernel(float* out, const float* bias, int64_t n, int OC) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] += bias[i % OC];
  }
}

// da (n) += dout (n); db (n) += dout (n): the gradient flows unchanged into both branches.
__global__ void residual_backward_kernel(float* da, float* db, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    da[i] += dout[i];  // dout is read twice, as on the CPU, so even aliased arguments give the same bits
    db[i] += dout[i];
  }
}
}  // namespace

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
  if (n == 0) return;
  residual_forward_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(out, a, b, n);
  SL_CUDA_CHECK_LAST();
}

void add_bias(float* out, const float* bias, int64_t N, int OC) {
  const int64_t n = N * OC;
  if (n == 0) return;
  add_bias_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(out, bias, n, OC);
  SL_CUDA_CHECK_LAST();
}

void residual_backward(float* da, float* db, const float* dout, int64_t n) {
  if (n == 0) return;
  residual_backward_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(da, db, dout, n);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
