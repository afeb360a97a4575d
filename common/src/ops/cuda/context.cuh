// context.cuh — what the CUDA op files share (internal to common/src/ops/cuda/): the per-device context
// (cuBLAS and cuBLASLt handles, their workspace, persistent scratch buffers; defined in context.cu),
// launch-size helpers, warp reductions, and bf16 bit conversions identical to scalelab/core/bf16.h.
// Streams: every op runs on the default (legacy) stream, kDefaultStream, so consecutive ops are ordered
// and host copies wait for them. A later issue may give each op a stream argument (for overlap with
// communication); the handles would then be bound with cublasSetStream per call.
#pragma once

#include <cublasLt.h>   // defines: cublasLtHandle_t, cublasLtMatmul
#include <cublas_v2.h>  // defines: cublasHandle_t, cublasGemmEx, cublasGemmStridedBatchedEx

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "scalelab/core/cuda_check.h"  // defines: SL_CUDA_CHECK, SL_CUDA_CHECK_LAST, SL_CUBLAS_CHECK

namespace scalelab::cuda {

constexpr int kWarpSize = 32;
constexpr cudaStream_t kDefaultStream = nullptr;  // the legacy default stream (see the file head)

// Persistent device scratch, one buffer per purpose, grown on demand (scratch()).
enum class Scratch : int {
  Reduce,           // sum_squares partial sums (double)
  IndexCheck,       // first_index_out_of_range's result
  EncoderBuckets,   // encoder_backward's rows sorted by token
  ColumnPartials,   // per-chunk column sums: layernorm dweight/dbias, matmul dbias
  AttentionRowDot,  // attention_backward_flash's D = rowsum(dout * out), (B,NH,T) fp32
  kCount
};
constexpr int kNumScratch = static_cast<int>(Scratch::kCount);

// One per device, created on first use by context() and kept until the process exits.
struct DeviceContext {
  int device = -1;
  int cc_major = 0, cc_minor = 0;  // compute capability, e.g. 9.0 for H100/H200
  char name[256] = {};             // "NVIDIA H200"
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  void* workspace = nullptr;  // shared by both handles (one stream: never used concurrently)
  size_t workspace_bytes = 0;
  void* scratch[kNumScratch] = {};
  size_t scratch_bytes[kNumScratch] = {};
};

// The context of the current device (cudaGetDevice). Thread-safe creation; the ops themselves assume
// one host thread issues work per device, as every lab does.
DeviceContext& context();

// A device buffer of at least nbytes for `slot` on the current device, reused across calls. Growing it
// synchronises the device first (kernels may still read the old buffer). Counted by the CUDA Allocator
// as Workspace, so the memory cap applies. Valid until the next scratch() call with the same slot.
void* scratch(Scratch slot, size_t nbytes);

// ---------------------------------------------------------------------------------------------
// Launch sizes

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements with `threads` per block: one element per thread up to
// a cap (the loop covers the rest). Never 0 (callers return early when n == 0).
inline unsigned int grid_stride_blocks(int64_t n, int threads) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 24;  // far below gridDim.x's limit of 2^31 - 1
  return static_cast<unsigned int>(std::clamp<int64_t>(ceil_div(n, threads), 1, kMaxBlocks));
}

// ---------------------------------------------------------------------------------------------
// Device helpers

// Butterfly reductions over the 32 lanes of a warp: every lane receives the result. All 32 lanes must
// call them (the kernels below let whole warps return early, never single lanes).
__device__ __forceinline__ float warp_reduce_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// fp32 -> bf16 bits, round to nearest even, NaN stays (quiet) NaN: the same bit arithmetic as
// float_to_bf16 in scalelab/core/bf16.h, so GPU casts equal the CPU's bit for bit (cuda_bf16.h's
// __float2bfloat16_rn would differ on NaN payloads). Integer ops only: runs on every architecture.
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace scalelab::cuda
