// crossentropy.cu — CUDA twin of the fused softmax + cross-entropy loss at the top of GPT-2.
// Defines scalelab::cuda::softmax_crossentropy_forward / softmax_crossentropy_backward (contract:
// scalelab/ops/ops.h; declared in scalelab/ops/twins.h). The forward differs from the CPU twin by the order of
// its sums and by expf/logf rounding; the backward is bit-identical (one multiply per element).
// CPU twin: common/src/ops/cpu/crossentropy.cpp   tests: tests/common/ops/test_ops_cuda.cpp
#include <cmath>  // defines: INFINITY

#include "context.cuh"           // defines: kWarpSize, warp_reduce_*, grid_stride_blocks, SL_CUDA_CHECK_LAST
#include "scalelab/ops/twins.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

namespace {
constexpr int kThreads = 256;  // forward: threads per row (one block per row); backward: per block
constexpr int kWarps = kThreads / kWarpSize;

// Sum (or max) over the kThreads threads of a block; every thread receives the result, each computing it
// from the same per-warp values in the same order. smem: kWarps floats. Every thread must call it.
template <bool kMax>
__device__ float block_reduce(float v, float* smem) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = kMax ? warp_reduce_max(v) : warp_reduce_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float r = kMax ? -INFINITY : 0.0f;
  for (int w = 0; w < kWarps; w++) r = kMax ? fmaxf(r, smem[w]) : r + smem[w];
  __syncthreads();  // everyone has read smem before the next call overwrites it
  return r;
}

// One block of kThreads per row i: probs[i] (V) = softmax(logits[i]), losses[i] = -log probs[i][targets[i]]
// computed as log(sum) - (z_target - max), finite even when probs[target] underflows (as the CPU twin).
// logits, probs (N,V); targets, losses (N); targets already checked in [0,V).
__global__ void softmax_crossentropy_forward_kernel(float* losses, float* probs, const float* logits,
                                                    const int32_t* targets, int64_t N, int V) {
  __shared__ float smem[kWarps];
  const int64_t i = blockIdx.x;
  if (i >= N) return;  // uniform for the whole block, before any __syncthreads
  const float* z = logits + i * V;
  float* p = probs + i * V;
  float maxval = -INFINITY;
  for (int v = threadIdx.x; v < V; v += kThreads) maxval = fmaxf(maxval, z[v]);
  maxval = block_reduce<true>(maxval, smem);  // max subtraction: expf(z - max) <= 1
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += kThreads) {
    const float e = expf(z[v] - maxval);
    p[v] = e;  // read back by this same thread below
    sum += e;
  }
  sum = block_reduce<false>(sum, smem);
  const float inv_sum = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += kThreads) p[v] *= inv_sum;
  if (threadIdx.x == 0) losses[i] = logf(sum) - (z[targets[i]] - maxval);
}

// dlogits (N,V) = dloss * (probs - onehot(targets)), OVERWRITING dlogits. One thread per element, which
// reads its probs entry before writing its dlogits entry, so dlogits may alias probs. The arithmetic is
// the CPU twin's: dloss * p, and dloss * (p - 1) at the target (the _rn intrinsics forbid contraction).
__global__ void softmax_crossentropy_backward_kernel(float* dlogits, const float* probs, const int32_t* targets,
                                                     float dloss, int64_t N, int V) {
  const int64_t n = N * V;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / V;
    const int v = static_cast<int>(idx % V);
    const float p = probs[idx];
    dlogits[idx] = v == targets[i] ? __fmul_rn(dloss, __fsub_rn(p, 1.0f)) : __fmul_rn(dloss, p);
  }
}
}  // namespace

void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int64_t N,
                                  int V) {
  if (N == 0) return;
  SL_CHECK(N <= INT32_MAX, "softmax_crossentropy_forward: N=%lld rows exceed the grid", static_cast<long long>(N));
  softmax_crossentropy_forward_kernel<<<static_cast<unsigned int>(N), kThreads, 0, kDefaultStream>>>(losses, probs,
                                                                                                     logits, targets, N,
                                                                                                     V);
  SL_CUDA_CHECK_LAST();
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int64_t N,
                                   int V) {
  if (N == 0) return;
  softmax_crossentropy_backward_kernel<<<grid_stride_blocks(N * V, kThreads), kThreads, 0, kDefaultStream>>>(dlogits,
                                                                                                             probs,
                                                                                                             targets,
                                                                                                             dloss, N,
                                                                                                             V);
  SL_CUDA_CHECK_LAST();
}

}  // namespace scalelab::cuda
