// attention.cu — CUDA twin of GPT-2's causal multi-head self-attention (Vaswani et al. 2017, Eq. 1, with
// a causal mask). Defines scalelab::cuda::attention_forward / attention_backward (contract: scalelab/ops/ops.h;
// declared in scalelab/ops/twins.h). CPU twin: common/src/ops/cpu/attention.cpp   tests: tests/common/ops/test_ops_cuda.cpp
//
// What we chose and why. The contract saves att (B,NH,T,T) fp32 for the backward, so this version
// MATERIALISES the scores, as the CPU twin and llm.c's first CUDA version do: per head h, one cuBLAS
// strided-batched GEMM over the B sequences computes scale * q k^T into att, a kernel applies the causal
// softmax in place (one warp per row), and a second batched GEMM computes att @ v. The backward mirrors
// the CPU twin's five steps. It is simple to read and to check against the CPU, and it needs no
// scratch beyond att and datt: q, k, v are read in place inside qkv (leading dimension 3C, batch
// stride T*3C), heads are separated by the pointer offset h*HS, so nothing is permuted or copied.
// Cost: cuBLAS computes the full T x T products, masked half included (the CPU twin skips most of it
// by blocking rows), and the scores make a round trip through memory.
//
// Memory (the price of the contract): att holds B*NH*T*T*4 bytes per layer, kept for the backward, plus
// one datt of the same size. At T = 1024, B = 16: d12 (NH = 12) 0.81 GB per layer, 9.7 GB for 12 layers;
// d24 (NH = 16) 1.07 GB per layer, 25.8 GB for 24; d48 (NH = 25) 1.68 GB per layer, 81 GB for 48: over
// three times the model's fp32 parameters, gradients and AdamW state together (1.48 B parameters with
// the byte vocabulary, 16 bytes each: 24 GB).
// The alternative when memory is short: attention_forward_flash / attention_backward_flash
// (attention_flash.cu, after Dao et al. 2022, arXiv:2205.14135), separate ops that tile q, k, v through
// shared memory with an online softmax, save only the (B,NH,T) log-sum-exp per row and recompute the
// scores in the backward: O(B*NH*T) memory instead of O(B*NH*T^2), at a cost in speed (fp32 CUDA cores).
// This file stays the default. cuDNN's fused attention is the fast off-the-shelf option.
#include <cmath>  // defines: std::sqrt (host), INFINITY

#include "context.cuh"           // defines: context, kWarpSize, warp_reduce_*, SL_CUBLAS_CHECK, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kRowsPerBlock = 8;  // one warp per row of att: 8 warps = 256 threads per block

// Causal softmax in place on att, (num_rows, T) with num_rows = B*NH*T; row r is query position
// t = r % T, so entries s <= t are the visible keys. On entry att holds scale * q k^T (all T columns);
// on exit row t holds softmax over s <= t and 0 for s > t (the mask). Max subtraction keeps expf <= 1.
__global__ void attention_softmax_forward_kernel(float* att, int64_t num_rows, int T) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= num_rows) return;  // whole warps only (row is uniform across a warp)
  const int t = static_cast<int>(row % T);
  float* a = att + row * T;
  float maxval = -INFINITY;  // lane 0 always sees s = 0 <= t, so the warp's max is finite
  for (int s = lane; s <= t; s += kWarpSize) maxval = fmaxf(maxval, a[s]);
  maxval = warp_reduce_max(maxval);
  float sum = 0.0f;
  for (int s = lane; s <= t; s += kWarpSize) {
    const float e = expf(a[s] - maxval);
    a[s] = e;  // this lane reads it back below; no other lane touches a[s]
    sum += e;
  }
  const float inv_sum = 1.0f / warp_reduce_sum(sum);  // sum >= 1: the max term contributes exp(0)
  for (int s = lane; s <= t; s += kWarpSize) a[s] *= inv_sum;
  for (int s = t + 1 + lane; s < T; s += kWarpSize) a[s] = 0.0f;  // future positions get no weight
}

// Softmax backward in place on datt (num_rows, T): on entry dP = d(loss)/d(att), on exit
// dS[t,s] = P[t,s] * (dP[t,s] - sum_s' P[t,s'] dP[t,s']) for s <= t and 0 above the diagonal.
// att (num_rows, T) = P as saved by the forward.
__global__ void attention_softmax_backward_kernel(float* datt, const float* att, int64_t num_rows, int T) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= num_rows) return;
  const int t = static_cast<int>(row % T);
  const float* p = att + row * T;
  float* d = datt + row * T;
  float dot = 0.0f;
  for (int s = lane; s <= t; s += kWarpSize) dot += p[s] * d[s];
  dot = warp_reduce_sum(dot);
  for (int s = lane; s <= t; s += kWarpSize) d[s] = p[s] * (d[s] - dot);
  for (int s = t + 1 + lane; s < T; s += kWarpSize) d[s] = 0.0f;  // masked scores have no gradient
}

unsigned int warp_per_row_blocks(int64_t num_rows) {
  const int64_t blocks = ceil_div(num_rows, kRowsPerBlock);
  SL_CHECK(blocks <= INT32_MAX, "attention: %lld rows need more than 2^31-1 blocks", static_cast<long long>(num_rows));
  return static_cast<unsigned int>(blocks);
}

// batch_count column-major GEMMs C_i (m,n) = alpha op(A_i) op(B_i) + beta C_i, X_i = X + i * stride_x,
// fp32 operands and accumulation (CUBLAS_COMPUTE_32F: no TF32). Here i runs over the B sequences.
void gemm_strided_batched(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
                          const float* A, int lda, long long stride_a, const float* B, int ldb, long long stride_b,
                          float beta, float* C, int ldc, long long stride_c, int batch_count) {
  SL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(context().cublas, transa, transb, m, n, k, &alpha, A, CUDA_R_32F, lda,
                                             stride_a, B, CUDA_R_32F, ldb, stride_b, &beta, C, CUDA_R_32F, ldc,
                                             stride_c, batch_count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

// Row-major to column-major (as in matmul.cu): for one (b, h), q, k, v are row-major (T,HS) with leading
// dimension 3C, i.e. column-major (HS,T) matrices Qc, Kc, Vc; att row-major (T,T) is column-major
// (T,T) with element (s, t) = att[t][s]; out row-major (T,HS) with leading dimension C is Oc (HS,T).
//   1. att[t][s] = scale * sum_d q[t][d] k[s][d]   ->  att_c (T,T) = scale * Kc^T Qc    m=T  n=T k=HS
//   2. causal softmax of each row t (kernel)
//   3. out[t][d] = sum_s att[t][s] v[s][d]         ->  Oc (HS,T) = Vc att_c            m=HS n=T k=T
// Batch strides over b: qkv T*3C, att NH*T*T, out T*C. qkv (B,T,3C), att (B,NH,T,T), out (B,T,C).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int C3 = 3 * C;                                          // leading dimension of q, k, v
  const int HS = C / NH;                                         // head size
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));  // the 1/sqrt(d_k) of Eq. 1, as the CPU twin
  const long long stride_qkv = static_cast<long long>(T) * C3;
  const long long stride_att = static_cast<long long>(NH) * T * T;
  const long long stride_out = static_cast<long long>(T) * C;
  for (int h = 0; h < NH; h++) {
    const float* q = qkv + static_cast<int64_t>(h) * HS;  // head h of sequence 0; + b * stride_qkv for b
    const float* k = q + C;
    float* att_h = att + static_cast<int64_t>(h) * T * T;
    gemm_strided_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, scale, k, C3, stride_qkv, q, C3, stride_qkv,
                         /*beta=*/0.0f, att_h, T, stride_att, B);
  }
  const int64_t num_rows = static_cast<int64_t>(B) * NH * T;
  attention_softmax_forward_kernel<<<warp_per_row_blocks(num_rows), kRowsPerBlock * kWarpSize, 0, kDefaultStream>>>(
      att, num_rows, T);
  SL_CUDA_CHECK_LAST();
  for (int h = 0; h < NH; h++) {
    const float* v = qkv + static_cast<int64_t>(h) * HS + 2 * C;
    const float* att_h = att + static_cast<int64_t>(h) * T * T;
    float* out_h = out + static_cast<int64_t>(h) * HS;
    gemm_strided_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, 1.0f, v, C3, stride_qkv, att_h, T, stride_att,
                         /*beta=*/0.0f, out_h, C, stride_out, B);
  }
}

// The CPU twin's five steps (P = att, dS = gradient of the scores), in column-major terms (dQc, dKc,
// dVc, dOc are the (HS,T) views of dq, dk, dv inside dqkv and of dout; datt_c as att_c):
//   1. dP[t][s] = sum_d dout[t][d] v[s][d]          ->  datt_c = Vc^T dOc            m=T  n=T k=HS beta=0
//   2. dv[s][d] += sum_t P[t][s] dout[t][d]         ->  dVc += dOc att_c^T           m=HS n=T k=T  beta=1
//   3. dS = softmax backward of dP (kernel, in place in datt)
//   4. dq[t][d] += scale * sum_s dS[t][s] k[s][d]   ->  dQc += scale * Kc datt_c     m=HS n=T k=T  beta=1
//   5. dk[s][d] += scale * sum_t dS[t][s] q[t][d]   ->  dKc += scale * Qc datt_c^T   m=HS n=T k=T  beta=1
// beta = 1 is the ops.h += rule. Each (b, h) writes only its own slices of dqkv: no races.
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH) {
  if (B == 0 || T == 0) return;
  const int C3 = 3 * C;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long stride_qkv = static_cast<long long>(T) * C3;
  const long long stride_att = static_cast<long long>(NH) * T * T;
  const long long stride_out = static_cast<long long>(T) * C;
  for (int h = 0; h < NH; h++) {
    const int64_t off = static_cast<int64_t>(h) * HS;
    const float* v = qkv + off + 2 * C;
    float* dv = dqkv + off + 2 * C;
    const float* dout_h = dout + off;
    const float* att_h = att + static_cast<int64_t>(h) * T * T;
    float* datt_h = datt + static_cast<int64_t>(h) * T * T;
    // 1. dP
    gemm_strided_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, 1.0f, v, C3, stride_qkv, dout_h, C, stride_out,
                         /*beta=*/0.0f, datt_h, T, stride_att, B);
    // 2. dv
    gemm_strided_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, 1.0f, dout_h, C, stride_out, att_h, T, stride_att,
                         /*beta=*/1.0f, dv, C3, stride_qkv, B);
  }
  // 3. dS (all heads at once)
  const int64_t num_rows = static_cast<int64_t>(B) * NH * T;
  attention_softmax_backward_kernel<<<warp_per_row_blocks(num_rows), kRowsPerBlock * kWarpSize, 0, kDefaultStream>>>(
      datt, att, num_rows, T);
  SL_CUDA_CHECK_LAST();
  for (int h = 0; h < NH; h++) {
    const int64_t off = static_cast<int64_t>(h) * HS;
    const float* q = qkv + off;
    const float* k = q + C;
    float* dq = dqkv + off;
    float* dk = dq + C;
    const float* datt_h = datt + static_cast<int64_t>(h) * T * T;
    // 4. dq
    gemm_strided_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, scale, k, C3, stride_qkv, datt_h, T, stride_att,
                         /*beta=*/1.0f, dq, C3, stride_qkv, B);
    // 5. dk
    gemm_strided_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, scale, q, C3, stride_qkv, datt_h, T, stride_att,
                         /*beta=*/1.0f, dk, C3, stride_qkv, B);
  }
}

}  // namespace scalelab::cuda
