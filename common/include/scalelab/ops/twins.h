// twins.h — the raw-pointer twins of every GPT-2 op, declared ONCE for both backends (docs/style.md 3, 5, 24):
//   scalelab::cpu::<op>   common/src/ops/cpu/<op>.cpp   OpenBLAS + OpenMP loops; the oracle in tests
//   scalelab::cuda::<op>  common/src/ops/cuda/<op>.cu   cuBLAS / cuBLASLt + kernels (builds with CUDA only)
// Both namespaces get exactly the declarations of twin_ops.inc (included twice below), so the two
// backends cannot drift apart: same names, arguments and semantics as the Tensor-level ops of ops.h,
// with shapes passed explicitly (the contract there, including the += rule of every *_backward and the
// overwrite of softmax_crossentropy_backward). The dispatch (common/src/ops/dispatch.cpp) checks shapes,
// dtypes and devices, then calls the twin of the tensors' device; tests may call a twin directly.
//
// CUDA twins: every pointer is DEVICE memory of the current device; everything runs on the default stream,
// so ops are ordered one after another and a host-side read waits for them. Calls return before the GPU
// has finished, except those marked synchronous below. How each CUDA twin relates to its CPU twin
// (tests/common/ops/test_ops_cuda.cpp checks it; design notes in docs/cuda_backend.md):
//   encoder        bit-identical; encoder_backward is synchronous (copies the tokens to the host to sort
//                  rows by token, so each dwte row sums in the CPU's order, without atomics)
//   layernorm      one warp per row; dweight/dbias by a deterministic two-pass column sum
//   matmul         cuBLASLt with the bias fused into the epilogue (cuBLAS GemmEx where cuBLASLt has no
//                  algorithm for the pointers' alignment); fp32 compute (no TF32); the bf16 matmuls on the
//                  tensor cores (sm_80+: require_bf16_support)
//   attention      materialized: strided-batched GEMMs and a causal-softmax kernel (one warp per row);
//                  flash: online softmax over key tiles in shared memory, fp32 CUDA cores, HS <= 128,
//                  deterministic backward without atomics (B*NH*T fp32 of Workspace scratch)
//                  block ops (context parallelism): the flash kernels on q (B,Tq,C) and kv (B,Tk,2C) at
//                  absolute offsets; attention_merge one warp per row
//   gelu, residual residual bit-identical; gelu differs by expf's last bit
//   crossentropy   one block per row; the backward bit-identical (dlogits may alias probs)
//   optimizer      fused, one thread per element, each operation rounded once (no FMA contraction):
//                  within about an ulp of the CPU twin, whose compiler may contract a*b+c
//   reduce         sum_squares synchronous and deterministic (a fixed two-pass tree in double whose shape
//                  depends only on n); scale and the casts bit-identical
// This header needs no CUDA headers: host code includes it in every build; the cuda:: functions exist
// only in builds with the CUDA backend (SL_WITH_CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "scalelab/core/bf16.h"  // defines: scalelab::bf16 (16-bit storage; same bits as CUDA's __nv_bfloat16)

namespace scalelab::cpu {
#include "scalelab/ops/twin_ops.inc"

// The cast + sgemm path of matmul_*_bf16, in every build: what they run without oneDNN (or on a CPU without
// AVX512_BF16), and the oracle the oneDNN path is tested against (tests/common/ops/test_bf16_compute.cpp).
void matmul_forward_bf16_reference(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int C,
                                   int OC);
void matmul_backward_bf16_reference(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                                    const bf16* weight, int64_t N, int C, int OC);
// Which path matmul_*_bf16 run on this build and CPU, for headers and run records, e.g.
// "oneDNN 2.6.3 (avx512_core_bf16)" or "fp32 sgemm on bf16-rounded operands (no oneDNN in this build)".
std::string bf16_matmul_backend();
// The kernels OpenBLAS runs the fp32 GEMMs on, for headers, calibration caches and run records, e.g.
// "SkylakeX" or "SkylakeX (set by scalelab: OpenBLAS 0.3.21 took this CPU for Prescott)". See blas_kernel.cpp.
std::string blas_kernel();
// True when this program runs the kernels blas_kernel.cpp asked for in place of OpenBLAS's own choice.
bool blas_kernel_replaced();
}  // namespace scalelab::cpu

namespace scalelab::cuda {
#include "scalelab/ops/twin_ops.inc"

// Throws scalelab::Error with a hint unless the current device has compute capability >= 8.0 (bf16 tensor
// cores: A100, RTX 30xx/40xx, H100/H200). The bf16 matmuls call it on every use.
void require_bf16_support();
// Synchronous. The index of the first entry of idx (n i32) outside [0, limit), or -1 if none; *bad_value
// receives that entry. The dispatch checks token ids on the GPU with it.
int64_t first_index_out_of_range(const int32_t* idx, int64_t n, int64_t limit, int32_t* bad_value);
}  // namespace scalelab::cuda
