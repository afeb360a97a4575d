// encoder.cu — CUDA twin of the GPT-2 input embedding: out = wte[token] + wpe[position].
// Defines scalelab::cuda::encoder_forward / encoder_backward (contract: scalelab/ops/ops.h; declared in
// scalelab/ops/twins.h). Both are bit-identical to the CPU twin: the same fp32 adds in the same order.
// CPU twin: common/src/ops/cpu/encoder.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include <algorithm>  // defines: std::stable_sort
#include <numeric>    // defines: std::iota
#include <vector>

#include "context.cuh"           // defines: scratch, grid_stride_blocks, SL_CUDA_CHECK(_LAST)
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;  // threads per block in every kernel of this file

// out (N,C) = wte[tokens[i]] + wpe[i % T], N = B*T rows. One thread per element (i, c), so consecutive
// threads read consecutive channels of one row (coalesced). tokens (N) i32, already checked in [0,V).
__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t N,
                                       int T, int C) {
  const int64_t n = N * C;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / C;  // row (b, t)
    const int c = static_cast<int>(idx % C);
    const int t = static_cast<int>(i % T);  // position of row i
    out[idx] = wte[static_cast<int64_t>(tokens[i]) * C + c] + wpe[static_cast<int64_t>(t) * C + c];
  }
}

// dwpe (maxT,C) rows [0,T) += sum over b of dout[b,t]: one thread per (t, c) owns its element and adds
// b = 0, 1, ..., B-1 in order, exactly as the CPU loop does. dout (B,T,C).
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(T) * C;  // elements of dwpe's rows [0, T)
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = dwpe[idx];                                                       // idx = t*C + c
    for (int b = 0; b < B; b++) acc += dout[static_cast<int64_t>(b) * n + idx];  // dout[b,t,c]
    dwpe[idx] = acc;
  }
}

// dwte (V,C) += dout rows grouped by token. The rows of one token form a "bucket" (prepared on the host,
// rows in increasing order); blockIdx.x is the bucket, threads cover its C channels, and each thread
// adds the bucket's rows in order into its dwte element: the CPU's order, no atomics, no races (each
// token appears in exactly one bucket).
//   bucket_token (num_buckets): the token of each bucket
//   bucket_start (num_buckets + 1): bucket u holds rows[bucket_start[u] .. bucket_start[u+1])
//   rows (N): row indices i (into dout (N,C)) sorted by token, stable
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* bucket_token,
                                            const int32_t* bucket_start, const int32_t* rows, int num_buckets, int C) {
  const int u = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (u >= num_buckets || c >= C) return;
  float* dst = dwte + static_cast<int64_t>(bucket_token[u]) * C + c;
  float acc = *dst;
  for (int j = bucket_start[u]; j < bucket_start[u + 1]; j++) acc += dout[static_cast<int64_t>(rows[j]) * C + c];
  *dst = acc;
}
}  // namespace

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N == 0 || C == 0) return;
  encoder_forward_kernel<<<grid_stride_blocks(N * C, kThreads), kThreads, 0, kDefaultStream>>>(out, tokens, wte, wpe, N,
                                                                                               T, C);
  SL_CUDA_CHECK_LAST();
}

// Synchronous: the buckets are built on the host (as llm.c's train_gpt2.cu does), which costs one
// copy of B*T token ids each way per call; a GPU sort would avoid it and is not needed at these sizes.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N == 0 || C == 0) return;
  SL_CHECK(N <= INT32_MAX, "encoder_backward: B*T = %lld rows do not fit the i32 row index", static_cast<long long>(N));

  // 1. dwpe: one thread per (t, c).
  encoder_backward_wpe_kernel<<<grid_stride_blocks(static_cast<int64_t>(T) * C, kThreads), kThreads, 0,
                                kDefaultStream>>>(dwpe, dout, B, T, C);
  SL_CUDA_CHECK_LAST();

  // 2. dwte: sort the rows by token on the host, stable so each bucket keeps rows in increasing order.
  std::vector<int32_t> h_tokens(static_cast<size_t>(N));
  SL_CUDA_CHECK(cudaMemcpy(h_tokens.data(), tokens, sizeof(int32_t) * N, cudaMemcpyDeviceToHost));
  std::vector<int32_t> rows(static_cast<size_t>(N));
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [&](int32_t a, int32_t b) { return h_tokens[a] < h_tokens[b]; });
  std::vector<int32_t> bucket_token, bucket_start;
  for (int64_t j = 0; j < N; j++) {
    if (j == 0 || h_tokens[rows[j]] != h_tokens[rows[j - 1]]) {
      bucket_token.push_back(h_tokens[rows[j]]);
      bucket_start.push_back(static_cast<int32_t>(j));
    }
  }
  const int num_buckets = static_cast<int>(bucket_token.size());
  bucket_start.push_back(static_cast<int32_t>(N));
  // One upload: [bucket_token (num_buckets) | bucket_start (num_buckets + 1) | rows (N)].
  std::vector<int32_t> packed;
  packed.reserve(bucket_token.size() + bucket_start.size() + rows.size());
  packed.insert(packed.end(), bucket_token.begin(), bucket_token.end());
  packed.insert(packed.end(), bucket_start.begin(), bucket_start.end());
  packed.insert(packed.end(), rows.begin(), rows.end());
  auto* d_packed = static_cast<int32_t*>(scratch(Scratch::EncoderBuckets, sizeof(int32_t) * packed.size()));
  // A copy from pageable host memory waits for earlier work on the stream, so a previous call's kernel
  // has finished reading this scratch buffer before it is overwritten.
  SL_CUDA_CHECK(cudaMemcpy(d_packed, packed.data(), sizeof(int32_t) * packed.size(), cudaMemcpyHostToDevice));
  const int32_t* d_bucket_token = d_packed;
  const int32_t* d_bucket_start = d_packed + num_buckets;
  const int32_t* d_rows = d_packed + 2 * num_buckets + 1;
  const dim3 grid(static_cast<unsigned int>(num_buckets), static_cast<unsigned int>(ceil_div(C, kThreads)));
  encoder_backward_wte_kernel<<<grid, kThreads, 0, kDefaultStream>>>(dwte, dout, d_bucket_token, d_bucket_start, d_rows,
                                                                     num_buckets, C);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
