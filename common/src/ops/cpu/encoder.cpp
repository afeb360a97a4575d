// encoder.cpp — CPU twin of the GPT-2 input embedding: out = wte[token] + wpe[position].
// Defines scalelab::cpu::encoder_forward / encoder_backward (contract: scalelab/ops/ops.h).
// CUDA twin: common/src/ops/cuda/encoder.cu   tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp (CPU vs CUDA)
#include <cstdint>

#include "scalelab/ops/ops.h"  // defines: the cpu:: declarations implemented here

namespace scalelab::cpu {

// out (B,T,C) = wte[tokens[b,t], :] + wpe[t, :].
// tokens (B,T) i32, each in [0,V) (the Tensor-level op checks the range); wte (V,C); wpe (maxT,C), T <= maxT.
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;  // rows
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t i = 0; i < N; i++) {
    const int t = static_cast<int>(i % T);                             // position of row i = (b, t)
    const float* wte_row = wte + static_cast<int64_t>(tokens[i]) * C;  // (C)
    const float* wpe_row = wpe + static_cast<int64_t>(t) * C;          // (C)
    float* out_row = out + i * C;                                      // (C)
    for (int c = 0; c < C; c++) out_row[c] = wte_row[c] + wpe_row[c];
  }
}

// dwte (V,C) += dout rows scattered to their token's row; dwpe (maxT,C) rows [0,T) += sum over b of dout[b,t].
// dout (B,T,C); tokens (B,T) i32.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  // dwpe: each position t is owned by one iteration, so the loop over t parallelises without races.
#pragma omp parallel for schedule(static) if (static_cast <int64_t>(B) * T * C > 32768)
  for (int t = 0; t < T; t++) {
    float* dwpe_row = dwpe + static_cast<int64_t>(t) * C;
    for (int b = 0; b < B; b++) {
      const float* dout_row = dout + (static_cast<int64_t>(b) * T + t) * C;
      for (int c = 0; c < C; c++) dwpe_row[c] += dout_row[c];
    }
  }
  // dwte: two rows (b,t) with the same token add into the same dwte row, so a parallel loop over rows
  // would race. We stay serial (N*C adds, a tiny fraction of a step), which also fixes the summation
  // order: the result is bit-identical for any thread count.
  const int64_t N = static_cast<int64_t>(B) * T;
  for (int64_t i = 0; i < N; i++) {
    float* dwte_row = dwte + static_cast<int64_t>(tokens[i]) * C;
    const float* dout_row = dout + i * C;
    for (int c = 0; c < C; c++) dwte_row[c] += dout_row[c];
  }
}

}  // namespace scalelab::cpu
