// layernorm.cpp — CPU twin of LayerNorm over the last dimension (Ba, Kiros & Hinton 2016, arXiv:1607.06450).
// Defines scalelab::cpu::layernorm_forward / layernorm_backward (contract: scalelab/ops/ops.h).
// CUDA twin: common/src/ops/cuda/layernorm.cu   tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp (CPU vs CUDA)
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "scalelab/ops/ops.h"       // defines: the cpu:: declarations implemented here
#include "scalelab/ops/vec_math.h"  // defines: sum_8_lanes

namespace scalelab::cpu {

namespace {
constexpr float kLayerNormEps = 1e-5f;  // GPT-2's (and torch.nn.LayerNorm's default) epsilon
constexpr int kChannelBlock = 64;       // channels per task in the column reductions (dweight, dbias)
}  // namespace

// out (N,C) = (inp - mean) * rstd * weight + bias, per row; mean, rstd (N) saved for backward.
// inp (N,C); weight, bias (C). Variance is the biased one (divide by C), as torch.nn.LayerNorm.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* x = inp + i * C;  // (C)
    // Two passes (mean, then variance about the mean) avoid the cancellation of E[x^2] - E[x]^2.
    const float m = sum_8_lanes(C, [&](int c) { return x[c]; }) / C;
    const float sum_sq = sum_8_lanes(C, [&](int c) { return (x[c] - m) * (x[c] - m); });
    const float s = 1.0f / std::sqrt(sum_sq / C + kLayerNormEps);
    float* y = out + i * C;  // (C)
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

// Gradients of the forward above; all three ADD into their outputs (ops.h accumulation rule).
// With xhat = (x - mean) * rstd and g = weight * dout (both per row, (C)):
//   dinp   += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))      (the standard LayerNorm backward,
//                                                                     as derived in llm.c doc/layernorm)
//   dweight += sum over rows of dout * xhat;   dbias += sum over rows of dout.
// dinp, dout, inp (N,C); dweight, dbias, weight (C); mean, rstd (N).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C) {
  // Pass 1, dinp: rows are independent.
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t i = 0; i < N; i++) {
    const float* x = inp + i * C;
    const float* dy = dout + i * C;
    const float m = mean[i], s = rstd[i];
    const float g_mean = sum_8_lanes(C, [&](int c) { return weight[c] * dy[c]; }) / C;
    const float g_xhat_mean = sum_8_lanes(C, [&](int c) { return weight[c] * dy[c] * ((x[c] - m) * s); }) / C;
    float* dx = dinp + i * C;
    for (int c = 0; c < C; c++) {
      const float xhat = (x[c] - m) * s;
      const float g = weight[c] * dy[c];
      dx[c] += s * (g - g_mean - xhat * g_xhat_mean);
    }
  }
  // Pass 2, dweight and dbias: sums over rows (column reductions). Each task owns a block of channels
  // and walks all rows in order, so there are no races and the sum order (hence every bit of the
  // result) is the same for any thread count.
  const int num_blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int blk = 0; blk < num_blocks; blk++) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t i = 0; i < N; i++) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float m = mean[i], s = rstd[i];
      for (int c = c0; c < c1; c++) {
        dweight[c] += dy[c] * (x[c] - m) * s;
        dbias[c] += dy[c];
      }
    }
  }
}

}  // namespace scalelab::cpu
