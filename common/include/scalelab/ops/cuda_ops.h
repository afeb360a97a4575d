// cuda_ops.h — the CUDA twins of the GPT-2 ops: scalelab::cuda::<op>, the same names, arguments and
// semantics as scalelab::cpu::<op> in scalelab/ops/ops.h (the contract, including the += rule of every
// *_backward and the overwrite of softmax_crossentropy_backward), plus the bf16 matmuls of the mixed
// precision policy. Definitions: common/src/ops/cuda/<op>.cu, one file per op family, beside the CPU twins
// in common/src/ops/cpu/<op>.cpp (STYLE.md 3, 5). Design and memory notes: docs/cuda_backend.md.
// Tests: tests/common/ops/test_ops_cuda.cpp (each op against its CPU twin; skipped without a GPU).
//
// Every pointer is DEVICE memory of the current device (cudaSetDevice), every size as in ops.h.
// Streams: everything runs on the default stream, so ops are ordered one after another and a
// host-side read (Tensor::copy_from, cudaMemcpy) waits for them. Calls return before the GPU has
// finished, except the few marked "synchronous" (they need a value on the host).
// Preconditions the Tensor-level ops of ops_dispatch.cpp check before calling these (raw callers must
// do the same): shapes as in ops.h, token ids / targets in [0, V), C % NH == 0.
// This header needs no CUDA headers: host code (ops_dispatch.cpp, tests) includes it in any build,
// but the functions exist only in builds with the CUDA backend (SL_WITH_CUDA).
#pragma once

#include <cstdint>

#include "scalelab/core/bf16.h"  // defines: scalelab::bf16 (16-bit storage; same bits as CUDA's __nv_bfloat16)

namespace scalelab::cuda {

// ---------------------------------------------------------------------------------------------
// fp32 twins of scalelab::cpu:: (ops.h). Results equal the CPU twin's bit for bit where the comment
// says "bit-identical"; elsewhere they differ by the order of fp32 sums (tests bound how much).

// encoder.cu — bit-identical. encoder_backward is synchronous: it copies tokens (B*T i32) to the host
// to sort rows by token, so that each dwte row is summed in the CPU's order, without atomics.
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);
// layernorm.cu — one warp per row; dweight/dbias by a deterministic two-pass column sum.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C);
// matmul.cu — cuBLASLt with the bias fused into the GEMM epilogue (cuBLAS GemmEx when cuBLASLt has no
// algorithm for the pointers' alignment); backward by cublasGemmEx (beta = 1) and a column-sum kernel.
// fp32 compute throughout (CUBLAS_COMPUTE_32F: no TF32).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC);
// attention.cu — materialized att (B,NH,T,T), as the contract saves it for backward: cuBLAS strided-batched
// GEMMs (one call per head, batched over B) and a causal-softmax kernel (one warp per row).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);
// attention_flash.cu — flash-style, no (B,NH,T,T) tensor: online softmax over key tiles staged in shared
// memory, fp32 CUDA cores (no tensor cores), lse (B,NH,T) saved; the backward recomputes the scores (a D
// kernel, then dk/dv per key block and dq per query block: no atomics, deterministic). Slower than the
// materialized op; for when the scores do not fit. Throws scalelab::Error unless HS = C/NH <= 128.
// The backward allocates B*NH*T fp32 of scratch (Workspace, kept and reused like the other scratch).
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              int B, int T, int C, int NH);
// gelu.cu, residual.cu — elementwise. residual_* are bit-identical; gelu differs by expf's last bit.
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
void residual_forward(float* out, const float* a, const float* b, int64_t n);
void residual_backward(float* da, float* db, const float* dout, int64_t n);
// crossentropy.cu — one block per row; the backward is bit-identical (dlogits may alias probs).
void softmax_crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                                  int64_t N, int V);
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                                   int64_t N, int V);
// optimizer_ops.cu — fused, one thread per element; the CPU's operations and scalars, each rounded once
// (no FMA contraction): within about an ulp of the CPU twin, whose compiler may contract a*b+c.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t);
void sgd_update(float* param, const float* grad, int64_t n, float lr, float weight_decay);
// reduce.cu — sum_squares is synchronous (returns a host double) and deterministic: a fixed two-pass
// tree in double whose shape depends only on n. scale and the casts are bit-identical.
double sum_squares(const float* x, int64_t n);
void scale(float* x, int64_t n, float s);
void cast_f32_to_bf16(bf16* dst, const float* src, int64_t n);
void cast_bf16_to_f32(float* dst, const bf16* src, int64_t n);

// ---------------------------------------------------------------------------------------------
// bf16 compute (the mixed precision policy: bf16 operands on the tensor cores, fp32 accumulate,
// fp32 outputs and gradients). Compute capability 8.0+ (require_bf16_support); matmul.cu.
// out (N,OC) fp32 = inp (N,C) bf16 @ weight (OC,C)^T bf16 + bias (OC) fp32 (bias may be nullptr).
void matmul_forward_bf16(float* out, const bf16* inp, const bf16* weight, const float* bias, int64_t N, int C,
                         int OC);
// dinp (N,C) fp32 += dout @ weight; dweight (OC,C) fp32 += dout^T @ inp; dbias (OC) fp32 += column sums
// of dout (the bf16 values the GEMMs see, summed in fp32). dinp and dbias may be nullptr.
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, int64_t N, int C, int OC);

// ---------------------------------------------------------------------------------------------
// Helpers (context.cu, reduce.cu)

// Throws scalelab::Error with a hint unless the current device has compute capability >= 8.0
// (bf16 tensor cores: A100, RTX 30xx/40xx, H100/H200). The bf16 matmuls call it on every use.
void require_bf16_support();
// Synchronous. The index of the first entry of idx (n i32) outside [0, limit), or -1 if none;
// *bad_value receives that entry. Used by ops_dispatch.cpp to check token ids on the GPU.
int64_t first_index_out_of_range(const int32_t* idx, int64_t n, int64_t limit, int32_t* bad_value);

}  // namespace scalelab::cuda
