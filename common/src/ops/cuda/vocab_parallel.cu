// vocab_parallel.cu — CUDA twins of the vocabulary-parallel embedding and cross-entropy pieces (contract:
// scalelab/ops/ops.h; declared in scalelab/ops/twins.h). One thread per row for the row statistics (Vl is
// a shard of a byte-level vocabulary here: small), one per element otherwise. The dwte accumulation runs
// in one thread per (row of the shard, channel), walking the tokens in order: no atomics, deterministic.
// CPU twin: common/src/ops/cpu/vocab_parallel.cpp   tests: tests/common/ops/test_ops_cuda.cpp (CudaOps.VocabShard*,
// against the CPU twin; they skip without a GPU and have not run on one yet).
#include "context.cuh"           // defines: grid_stride_blocks, kDefaultStream, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void encoder_forward_vocab_shard_kernel(float* out, const int32_t* tokens, const float* wte_shard,
                                                   const float* wpe, int64_t vocab_begin, int Vl, int T, int C,
                                                   int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / C, c = k % C;
    const int64_t row = tokens[i] - vocab_begin;
    const float w = row >= 0 && row < Vl ? wte_shard[row * C + c] : 0.0f;
    const float p = wpe != nullptr ? wpe[(i % T) * C + c] : 0.0f;
    out[k] = w + p;
  }
}

// One thread per (shard row r, channel c): dwte_shard[r, c] += dout[i, c] for every row i with token
// begin + r, in the order of i (as the CPU twin).
__global__ void dwte_vocab_shard_kernel(float* dwte_shard, const float* dout, const int32_t* tokens,
                                        int64_t vocab_begin, int Vl, int64_t N, int C) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= static_cast<int64_t>(Vl) * C) return;
  const int64_t r = k / C, c = k % C;
  float acc = dwte_shard[k];
  for (int64_t i = 0; i < N; i++)
    if (tokens[i] - vocab_begin == r) acc += dout[i * C + c];
  dwte_shard[k] = acc;
}

__global__ void dwpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= static_cast<int64_t>(T) * C) return;
  const int64_t t = k / C, c = k % C;
  float acc = dwpe[k];
  for (int b = 0; b < B; b++) acc += dout[(static_cast<int64_t>(b) * T + t) * C + c];
  dwpe[k] = acc;
}

__global__ void logits_row_max_kernel(float* maxes, const float* logits, int64_t N, int Vl) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const float* z = logits + i * Vl;
  float m = z[0];
  for (int j = 1; j < Vl; j++) m = fmaxf(m, z[j]);
  maxes[i] = m;
}

__global__ void partials_kernel(float* sumexp, float* target_logit, const float* logits, const float* maxes,
                                const int32_t* targets, int64_t vocab_begin, int64_t N, int Vl) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const float* z = logits + i * Vl;
  float s = 0.0f;
  for (int j = 0; j < Vl; j++) s += expf(z[j] - maxes[i]);
  sumexp[i] = s;
  const int64_t col = targets[i] - vocab_begin;
  target_logit[i] = col >= 0 && col < Vl ? z[col] : 0.0f;
}

__global__ void finish_kernel(float* losses, float* probs, const float* logits, const float* maxes, const float* sumexp,
                              const float* target_logit, int64_t N, int Vl) {
  const int64_t n = N * Vl;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / Vl;
    probs[k] = expf(logits[k] - maxes[i]) / sumexp[i];
    if (k % Vl == 0) losses[i] = logf(sumexp[i]) + maxes[i] - target_logit[i];
  }
}

__global__ void backward_kernel(float* dlogits, const float* probs, const int32_t* targets, int64_t vocab_begin,
                                float dloss, int64_t N, int Vl) {
  const int64_t n = N * Vl;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / Vl, j = k % Vl;
    const float onehot = targets[i] - vocab_begin == j ? 1.0f : 0.0f;
    dlogits[k] = dloss * (probs[k] - onehot);
  }
}

unsigned int blocks_for(int64_t n) { return static_cast<unsigned int>((n + kThreads - 1) / kThreads); }
}  // namespace

void encoder_forward_vocab_shard(float* out, const int32_t* tokens, const float* wte_shard, const float* wpe,
                                 int64_t vocab_begin, int Vl, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  if (n == 0) return;
  encoder_forward_vocab_shard_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(out, tokens,
                                                                                                       wte_shard, wpe,
                                                                                                       vocab_begin, Vl,
                                                                                                       T, C, n);
  SL_CUDA_CHECK_LAST();
}

void encoder_backward_vocab_shard(float* dwte_shard, float* dwpe, const float* dout, const int32_t* tokens,
                                  int64_t vocab_begin, int Vl, int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
  if (N == 0) return;
  if (dwpe != nullptr) {
    dwpe_kernel<<<blocks_for(static_cast<int64_t>(T) * C), kThreads, 0, kDefaultStream>>>(dwpe, dout, B, T, C);
    SL_CUDA_CHECK_LAST();
  }
  dwte_vocab_shard_kernel<<<blocks_for(static_cast<int64_t>(Vl) * C), kThreads, 0, kDefaultStream>>>(dwte_shard, dout,
                                                                                                     tokens,
                                                                                                     vocab_begin, Vl, N,
                                                                                                     C);
  SL_CUDA_CHECK_LAST();
}

void logits_row_max(float* maxes, const float* logits, int64_t N, int Vl) {
  if (N == 0) return;
  logits_row_max_kernel<<<blocks_for(N), kThreads, 0, kDefaultStream>>>(maxes, logits, N, Vl);
  SL_CUDA_CHECK_LAST();
}

void crossentropy_vocab_shard_partials(float* sumexp, float* target_logit, const float* logits, const float* maxes,
                                       const int32_t* targets, int64_t vocab_begin, int64_t N, int Vl) {
  if (N == 0) return;
  partials_kernel<<<blocks_for(N), kThreads, 0, kDefaultStream>>>(sumexp, target_logit, logits, maxes, targets,
                                                                  vocab_begin, N, Vl);
  SL_CUDA_CHECK_LAST();
}

void crossentropy_vocab_shard_finish(float* losses, float* probs, const float* logits, const float* maxes,
                                     const float* sumexp, const float* target_logit, int64_t N, int Vl) {
  const int64_t n = N * Vl;
  if (n == 0) return;
  finish_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(losses, probs, logits, maxes, sumexp,
                                                                                  target_logit, N, Vl);
  SL_CUDA_CHECK_LAST();
}

void crossentropy_vocab_shard_backward(float* dlogits, const float* probs, const int32_t* targets, int64_t vocab_begin,
                                       float dloss, int64_t N, int Vl) {
  const int64_t n = N * Vl;
  if (n == 0) return;
  backward_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, kDefaultStream>>>(dlogits, probs, targets,
                                                                                    vocab_begin, dloss, N, Vl);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
