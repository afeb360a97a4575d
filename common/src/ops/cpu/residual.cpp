// residual.cpp — CPU twin of the residual connection out = a + b.
// Defines scalelab::cpu::residual_forward / residual_backward and add_bias, the row-parallel linear's bias
// add (contract: scalelab/ops/ops.h).
// CUDA twin: common/src/ops/cuda/residual.cu   tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp (CPU vs CUDA)
#include <cstdint>

#include "scalelab/ops/ops.h"  // defines: the cpu:: declarations implemented here

namespace scalelab::cpu {

// out (n) = a (n) + b (n). out may alias a or b (elementwise, read before write).
void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// out (N, OC) += bias (OC) on every row.
void add_bias(float* out, const float* bias, int64_t N, int OC) {
#pragma omp parallel for schedule(static) if (N * OC > 65536)
  for (int64_t i = 0; i < N; i++)
    for (int j = 0; j < OC; j++) out[i * OC + j] += bias[j];
}

// d(a + b)/da = d(a + b)/db = 1, so the gradient flows unchanged into both branches:
// da (n) += dout (n); db (n) += dout (n).
void residual_backward(float* da, float* db, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace scalelab::cpu
