// ops.h — the GPT-2 ops, forward and backward, declared once (docs/style.md 3, 5).
// scalelab::<op> takes Tensors, checks shapes/dtypes/devices and dispatches on the device
// (common/src/ops/dispatch.cpp) to the twins scalelab::cpu::<op> (common/src/ops/cpu/<op>.cpp, OpenBLAS +
// OpenMP loops) and scalelab::cuda::<op> (common/src/ops/cuda/<op>.cu), declared once in twins.h.
// Activations and gradients are fp32. Dimension letters: B batch, T time, C channels, V vocab,
// NH heads, HS = C/NH head size, OC output channels, N = B*T rows.
//
// Accumulation rule (as in llm.c): every *_backward ADDS (+=) into its gradient outputs (dinp,
// dweight, dbias, dwte, ...), so the caller zeroes gradients once per step and branches of the
// residual stream sum naturally. Exceptions say so: softmax_crossentropy_backward overwrites dlogits.
// Errors: every op throws scalelab::Error naming the mismatched shape/dtype/device.
// Tests: tests/common/ops/test_ops_cpu.cpp (finite differences, known values), tests/common/model/test_gpt2_fixture.cpp
// (the block attention ops and the merge: tests/common/ops/test_attention_block.cpp)
#pragma once

#include <cstdint>
#include <string>

#include "scalelab/core/tensor.h"
#include "scalelab/ops/twins.h"  // defines: the cpu:: and cuda:: twins these ops dispatch to

namespace scalelab {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t].  tokens (B,T) i32 in [0,V); wte (V,C); wpe (maxT,C), T <= maxT.
void encoder_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
// dwte (V,C) += scatter of dout rows by token; dwpe (maxT,C) rows [0,T) += sum over b of dout.
void encoder_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

// LayerNorm over the last dim (Ba et al. 2016), eps = 1e-5 as in GPT-2.
// inp/out (N,C) or (B,T,C); weight, bias (C); mean, rstd (N) saved for backward.
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias);
void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd);

// out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC). weight is stored (out, in) like torch.nn.Linear.
// bias may be nullptr (the tied LM head has none). inp may be (B,T,C): N = B*T.
void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
// dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += sum_rows(dout).
// Every output is optional (nullptr: not computed), so the input gradient and the weight gradient can be
// computed apart, as a zero-bubble pipeline schedule runs them (B now, W later: Qi et al. 2024, "Zero Bubble
// Pipeline Parallelism", arXiv:2401.10241, Sec. 2): dinp nullptr when nothing upstream needs it; dweight
// nullptr skips the weight gradient and the bias gradient with it (dbias must then be nullptr too); dbias
// nullptr when the forward had no bias. At least one of dinp, dweight. A call with dinp alone and a call with
// dweight (+ dbias) alone give exactly the bits of one call with all three (tests/common/ops/test_ops_cpu.cpp).
void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight);
// The same matmuls with bf16 operands (PrecisionPolicy::bf16_compute): inp, weight and dout bf16; out,
// bias, dinp, dweight, dbias fp32, accumulated in fp32, same shapes, `+=` rule and optional outputs as
// above (apart or together, the same bits: tests/common/ops/test_bf16_compute.cpp). dbias sums the
// bf16 dout in fp32. GPU: cuBLAS on the bf16 tensor cores (cuda::matmul_*_bf16, sm_80+; throws with a hint
// on older GPUs). CPU twin: oneDNN's bf16 matmul (AVX512_BF16) in builds with oneDNN (SL_WITH_DNNL) on CPUs
// that have it, else the operands cast to fp32 scratch (category Workspace, freed on return) and the fp32
// matmul above; cpu::bf16_matmul_backend() says which. bf16 x bf16 products are exact in fp32, so all the
// twins differ only in the order of the fp32 sums. Tests: tests/common/ops/test_bf16_compute.cpp,
// tests/common/ops/test_ops_cuda.cpp
void matmul_forward_bf16(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
void matmul_backward_bf16(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight);

// Causal self-attention (Vaswani et al. 2017, Eq. 1, with a causal mask), heads split as GPT-2 does:
// qkv (B,T,3C) holds q | k | v, each (B,T,C) = NH heads of HS channels.
// att (B,NH,T,T): softmax(q k^T / sqrt(HS)) with att[..,t,s] = 0 for s > t, saved for backward.
// out (B,T,C): att @ v with heads concatenated. BLAS computes q k^T and att v per (b, head).
void attention_forward(Tensor& out, Tensor& att, const Tensor& qkv, int NH);
// dqkv (B,T,3C) += gradients of q, k, v. datt (B,NH,T,T) is scratch (overwritten).
void attention_backward(Tensor& dqkv, Tensor& datt, const Tensor& dout, const Tensor& qkv, const Tensor& att, int NH);

// Memory-efficient ("flash-style") causal self-attention: the same out as attention_forward, without the
// (B,NH,T,T) scores. An online softmax over key tiles (Dao et al. 2022, "FlashAttention", arXiv:2205.14135,
// Alg. 1; Milakov & Gimelshein 2018) keeps only lse (B,NH,T) fp32 = log sum_{s<=t} exp(q_t k_s / sqrt(HS))
// per row (natural log), saved for backward; O(B*NH*T) extra memory instead of O(B*NH*T^2). Slower than the
// materialized op (the backward recomputes the scores; the CUDA twin uses no tensor cores): use it when the
// scores do not fit (docs/cuda_backend.md "Attention"). The CUDA twin needs HS = C/NH <= 128.
// qkv (B,T,3C) as attention_forward; out (B,T,C); lse (B,NH,T).
void attention_forward_flash(Tensor& out, Tensor& lse, const Tensor& qkv, int NH);
// dqkv (B,T,3C) += gradients of q, k, v (FlashAttention Alg. 2): recomputes P = exp(S - lse) per tile and
// D_t = rowsum(dout_t * out_t). dout, out (B,T,C); qkv (B,T,3C); lse (B,NH,T) as saved by the forward.
// Needs no scratch from the caller (its O(B*NH*T) scratch is allocated inside, category Workspace).
void attention_backward_flash(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              int NH);

// ---- Block attention, for a sequence split across ranks (context parallelism, docs/context_parallel.md; Liu
// et al. 2023, "Ring Attention", arXiv:2310.01889, Sec. 3). The flash op's loops on one block of queries
// against one block of keys and values of the same sequences, the causal mask by ABSOLUTE positions: query t
// of the block sits at position q_offset + t, key s at kv_offset + s, and key s is visible to query t iff
// kv_offset + s <= q_offset + t. The whole attention of a query block is the attention_merge of its blocks
// against every key block it sees.
// q (B,Tq,C): the block's queries, heads as in qkv. kv (B,Tk,2C): row (b,s) = k_s | v_s, one contiguous
// tensor, so a ring sends a key/value block as one message. Any Tq, Tk >= 1 and offsets >= 0.
// out (B,Tq,C) = the block's softmax(S) @ v; lse (B,NH,Tq) = log sum over the block's visible keys of
// exp(S) (natural log). A row that sees no key of the block (fully masked: q_offset + t < kv_offset) gets
// out 0 and lse -inf, the empty sum that attention_merge adds as nothing. The CUDA twin needs HS <= 128.
void attention_forward_block(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& kv, int NH, int q_offset,
                             int kv_offset);
// This block's share of the gradients, given the FINAL out and lse of the query rows (over all the key
// blocks they see, after every merge), as FlashAttention's backward recomputes P = exp(S - lse):
// dq (B,Tq,C) += its sum over this block's keys; dkv (B,Tk,2C) = dk | dv += the block's queries' terms.
// Summed over every block pair, these are the dense backward's gradients. dout, out (B,Tq,C); lse (B,NH,Tq).
void attention_backward_block(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                              const Tensor& out, const Tensor& lse, int NH, int q_offset, int kv_offset);
// The online-softmax merge (FlashAttention Alg. 1, lines 10-12) of a partial result into an accumulator, per
// (b, h, t) row: lse_new = log(exp(lse) + exp(lse_part)), out = exp(lse - lse_new) out + exp(lse_part -
// lse_new) out_part, lse = lse_new. lse_part = -inf (no key) leaves the row as it is. out, out_part (B,T,C);
// lse, lse_part (B,NH,T). Start the accumulator at out 0, lse -inf (or a copy of the first partial).
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_part, const Tensor& lse_part, int NH);

// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016, Sec. 2):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any shape; out and inp same numel.
void gelu_forward(Tensor& out, const Tensor& inp);
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);  // dinp += gelu'(inp) * dout

// out (N,OC) += bias (OC) on every row: a row-parallel linear's bias, added once after its reduction
// (Megatron-LM, Shoeybi et al. 2019, Sec. 3). out may be (B,T,OC). Its gradient is the column sum of dout,
// as matmul_backward's dbias computes it.
void add_bias_(Tensor& out, const Tensor& bias);

// out = a + b (same numel). Backward: da += dout, db += dout.
void residual_forward(Tensor& out, const Tensor& a, const Tensor& b);
void residual_backward(Tensor& da, Tensor& db, const Tensor& dout);

// Fused softmax + cross-entropy. logits (B,T,V); targets (B,T) i32 in [0,V).
// probs (B,T,V) = softmax(logits) (kept for backward); losses (B,T) = -log probs[target].
void softmax_crossentropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets);
// dlogits (B,T,V) = dloss * (probs - onehot(targets)); OVERWRITES dlogits. dloss is d(total)/d(loss[b,t]),
// 1/(B*T) for a mean loss. dlogits may alias probs (in place).
void softmax_crossentropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss);

// ---- The vocabulary split across a tensor-parallel group (Megatron-LM, Shoeybi et al. 2019, Sec. 3): a
// rank holds rows [vocab_begin, vocab_begin + Vl) of wte, used by the embedding and by the tied LM head,
// whose logits it computes for its Vl columns only. These are the local pieces; the collectives between
// them (which make the results whole) are the caller's: lab 05's vocabulary-parallel embedding and
// cross-entropy. tokens and targets (B,T) / (N) i32 in [0, V).
// out (B,T,C) = (token in the rank's rows ? wte_shard[token - vocab_begin] : 0) + wpe[t] (wpe may be nullptr:
// no position term). wte_shard (Vl,C), wpe (maxT,C).
void encoder_forward_vocab_shard(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor* wpe,
                                 int64_t vocab_begin);
// dwte_shard (Vl,C) += the rows of dout (B,T,C) whose token is in the rank's rows; dwpe (maxT,C) += positions
// when given.
void encoder_backward_vocab_shard(Tensor& dwte_shard, Tensor* dwpe, const Tensor& dout, const Tensor& tokens,
                                  int64_t vocab_begin);
// maxes (N) = the max of each row of logits (N,Vl) (or (B,T,Vl)) over the rank's columns.
void logits_row_max(Tensor& maxes, const Tensor& logits);
// With maxes the max over ALL columns: sumexp (N) = sum of exp(logits - maxes) over the rank's columns;
// target_logit (N) = the target's logit where the target is one of the rank's columns, else 0.
void crossentropy_vocab_shard_partials(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& maxes,
                                       const Tensor& targets, int64_t vocab_begin);
// With maxes, sumexp and target_logit over ALL columns: losses (N) = log(sumexp) + maxes - target_logit (the
// same on every rank) and probs (N,Vl) = exp(logits - maxes) / sumexp, the rank's columns of the softmax.
void crossentropy_vocab_shard_finish(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& maxes,
                                     const Tensor& sumexp, const Tensor& target_logit);
// dlogits (N,Vl) = dloss * (probs - onehot(targets - vocab_begin)) on the rank's columns. OVERWRITES dlogits,
// which may alias probs.
void crossentropy_vocab_shard_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, int64_t vocab_begin,
                                       float dloss);

// AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101, Alg. 2) on one fp32 tensor, step t >= 1:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mhat = m/(1-b1^t);  vhat = v/(1-b2^t)
//   p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
// param, grad, m, v: same numel, fp32. Same arithmetic as torch.optim.AdamW.
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t);
// Plain SGD with L2 weight decay folded into the gradient, as torch.optim.SGD(weight_decay=...) without
// momentum: p -= lr * (g + weight_decay * p).
void sgd_update(Tensor& param, const Tensor& grad, float lr, float weight_decay);

// Sum of squares of an fp32 tensor, accumulated in double (for the global gradient norm).
double sum_squares(const Tensor& t);
// t *= s (fp32).
void scale_(Tensor& t, float s);
// t += x (fp32, same numel): residual_forward's kernel in place (gradient accumulation, lab 04).
void add_(Tensor& t, const Tensor& x);
// dst = src with dtype conversion (f32 <-> bf16, round to nearest even; same dtype = copy). Same numel.
void cast(Tensor& dst, const Tensor& src);

}  // namespace scalelab
