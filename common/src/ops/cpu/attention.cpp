// attention.cpp — CPU twin of GPT-2's causal multi-head self-attention (Vaswani et al. 2017, Eq. 1,
// with a causal mask). Defines scalelab::cpu::attention_forward / attention_backward (contract: scalelab/ops/ops.h).
// The four products per (batch, head) are OpenBLAS sgemms on strided views of qkv (no copies); the
// (batch, head) loop is an OpenMP loop, inside which the OpenMP build of OpenBLAS runs single-threaded.
// CUDA twin: common/src/ops/cuda/attention.cu   tests: tests/common/ops/test_ops_cpu.cpp, tests/common/ops/test_ops_cuda.cpp (CPU vs CUDA)
#include <cblas.h>  // defines: cblas_sgemm (OpenBLAS, OpenMP build)

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "scalelab/ops/ops.h"       // defines: the cpu:: declarations implemented here
#include "scalelab/ops/vec_math.h"  // defines: exp_vectorizable, sum_8_lanes, max_8_lanes

namespace scalelab::cpu {

namespace {
// Query rows per block. Causality: rows [t0, t1) attend only to keys [0, t1), so each block's GEMMs
// stop at column t1 and skip most of the masked upper triangle: at T = 256, 5/8 of the flops of the full
// T x T products (128-row blocks: 3/4), while each GEMM stays large enough for BLAS to run near its peak.
constexpr int kRowBlock = 64;

}  // namespace

// qkv (B,T,3C): row (b,t) holds q | k | v, each C = NH * HS channels, head h at channels [h*HS, (h+1)*HS).
// For one (b, h), q, k, v are (T,HS) matrices with leading dimension 3C inside qkv.
// att (B,NH,T,T) = softmax_s(q k^T / sqrt(HS)) with att[..,t,s] = 0 for s > t (written in full).
// out (B,T,C) = att @ v, heads concatenated along channels (head h at channels [h*HS, (h+1)*HS)).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int C3 = 3 * C;                                          // leading dimension of q, k, v inside qkv
  const int HS = C / NH;                                         // head size
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));  // the 1/sqrt(d_k) of Eq. 1
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + static_cast<int64_t>(b) * T * C3 + h * HS;  // (T,HS), ld 3C
      const float* k = q + C;                                            // (T,HS), ld 3C
      const float* v = q + 2 * C;                                        // (T,HS), ld 3C
      float* att_bh = att + (static_cast<int64_t>(b) * NH + h) * T * T;  // (T,T), ld T
      float* out_bh = out + static_cast<int64_t>(b) * T * C + h * HS;    // (T,HS), ld C
      for (int t0 = 0; t0 < T; t0 += kRowBlock) {
        const int rows = std::min(kRowBlock, T - t0);             // query rows [t0, t1)
        const int keys = t0 + rows;                               // = t1: keys [0, t1) are visible to some row
        float* att_rows = att_bh + static_cast<int64_t>(t0) * T;  // (rows, T), ld T
        // 1. scores: att[t0:t1, 0:t1] = scale * q[t0:t1] @ k[0:t1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS, scale, q + int64_t{t0} * C3, C3, k, C3,
                    /*beta=*/0.0f, att_rows, T);
        // 2. causal softmax of each row t over s <= t; max subtraction keeps exp() from overflowing.
        for (int t = t0; t < t0 + rows; t++) {
          float* row = att_bh + static_cast<int64_t>(t) * T;
          const float maxval = max_8_lanes(row, t + 1);
          for (int s = 0; s <= t; s++) row[s] = exp_vectorizable(row[s] - maxval);  // a vector loop
          // >= 1: the max term is exp(0)
          const float inv_sum = 1.0f / sum_8_lanes(t + 1, [&](int s) { return row[s]; });
          for (int s = 0; s <= t; s++) row[s] *= inv_sum;
          for (int s = t + 1; s < T; s++) row[s] = 0.0f;  // the mask: future positions get no weight
        }
        // 3. out[t0:t1] = att[t0:t1, 0:t1] @ v[0:t1]   (att is 0 beyond each row's diagonal)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys, 1.0f, att_rows, T, v, C3,
                    /*beta=*/0.0f, out_bh + int64_t{t0} * C, C);
      }
    }
  }
}

// Gradients of the forward above. dqkv (B,T,3C) += dq | dk | dv (ops.h accumulation rule: beta = 1).
// datt (B,NH,T,T) is scratch: on return it holds d(loss)/d(scores) (0 above the diagonal).
// dout (B,T,C); qkv (B,T,3C); att (B,NH,T,T) as saved by the forward. Per (b, h), with P = att:
//   dP = dout @ v^T;   dv += P^T @ dout;
//   dS[t,s] = P[t,s] * (dP[t,s] - sum_s' P[t,s'] dP[t,s'])     (softmax Jacobian-vector product)
//   dq += scale * dS @ k;   dk += scale * dS^T @ q
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH) {
  const int C3 = 3 * C;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + h * HS;
      const float* q = qkv + qkv_off;  // (T,HS), ld 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + qkv_off;  // (T,HS), ld 3C; each (b, h) owns its slices, so no races
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* att_bh = att + (static_cast<int64_t>(b) * NH + h) * T * T;  // (T,T)
      float* datt_bh = datt + (static_cast<int64_t>(b) * NH + h) * T * T;      // (T,T)
      const float* dout_bh = dout + static_cast<int64_t>(b) * T * C + h * HS;  // (T,HS), ld C
      for (int t0 = 0; t0 < T; t0 += kRowBlock) {
        const int rows = std::min(kRowBlock, T - t0);
        const int keys = t0 + rows;
        const float* att_rows = att_bh + static_cast<int64_t>(t0) * T;    // (rows, T)
        float* datt_rows = datt_bh + static_cast<int64_t>(t0) * T;        // (rows, T)
        const float* dout_rows = dout_bh + static_cast<int64_t>(t0) * C;  // (rows, HS), ld C
        // 1. dP[t0:t1, 0:t1] = dout[t0:t1] @ v[0:t1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS, 1.0f, dout_rows, C, v, C3,
                    /*beta=*/0.0f, datt_rows, T);
        // 2. dv[0:t1] += P[t0:t1, 0:t1]^T @ dout[t0:t1]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows, 1.0f, att_rows, T, dout_rows, C,
                    /*beta=*/1.0f, dv, C3);
        // 3. softmax backward in place: dP -> dS, row by row.
        for (int t = t0; t < t0 + rows; t++) {
          const float* p = att_bh + static_cast<int64_t>(t) * T;
          float* d = datt_bh + static_cast<int64_t>(t) * T;
          const float dot = sum_8_lanes(t + 1, [&](int s) { return p[s] * d[s]; });  // sum_s P[t,s] dP[t,s]
          for (int s = 0; s <= t; s++) d[s] = p[s] * (d[s] - dot);
          for (int s = t + 1; s < T; s++) d[s] = 0.0f;  // masked scores have no gradient
        }
        // 4. dq[t0:t1] += scale * dS[t0:t1, 0:t1] @ k[0:t1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys, scale, datt_rows, T, k, C3,
                    /*beta=*/1.0f, dq + int64_t{t0} * C3, C3);
        // 5. dk[0:t1] += scale * dS[t0:t1, 0:t1]^T @ q[t0:t1]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows, scale, datt_rows, T, q + int64_t{t0} * C3,
                    C3, /*beta=*/1.0f, dk, C3);
      }
    }
  }
}

}  // namespace scalelab::cpu
