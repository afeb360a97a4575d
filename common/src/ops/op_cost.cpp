// op_cost.cpp — FLOPs, bytes and launches of every op of ops.h, and the roofline that turns them into
// seconds on a GPU model (ops/op_cost.h says what is counted and why). Each function lists its kernels as
// the CUDA twin runs them (common/src/ops/cuda/<op>.cu), with the elements each reads (r) and writes (w).
// Tests: tests/common/ops/test_op_cost.cpp
#include "scalelab/ops/op_cost.h"

#include <algorithm>  // defines: std::max, std::clamp

namespace scalelab {

double op_seconds(const OpCost& cost, const GpuModel& gpu) {
  const double compute_s =
      cost.flops > 0 ? cost.flops / (gpu.peak_flops_per_s(cost.math) * gpu.efficiency(cost.op_class)) : 0.0;
  const double memory_s = cost.bytes / (gpu.hbm_bytes_per_s * gpu.eff_memory);
  return static_cast<double>(cost.launches) * gpu.launch_s + std::max(compute_s, memory_s);
}

namespace op_cost {

namespace {
constexpr double kF32 = 4;  // bytes per f32 (and per i32 token id): every tensor but bf16 operands

// A memory-bound op: `elements` f32/i32 elements read + written by `launches` kernels.
OpCost memory_bound(double elements, int64_t launches) {
  OpCost c;
  c.bytes = kF32 * elements;
  c.launches = launches;
  return c;
}

// The token-range check dispatch.cpp runs before an op that indexes by token (check_index_range): one
// kernel reading the n ids.
OpCost with_index_check(OpCost c, double n) {
  c.bytes += kF32 * n;
  c.launches += 1;
  return c;
}
}  // namespace

// ---- Encoder: out (B,T,C), tokens (B,T), a row of wte and of wpe per position.

OpCost encoder_forward(int64_t B, int64_t T, int64_t C) {
  const double N = static_cast<double>(B) * T;
  return with_index_check(memory_bound(N + 3 * N * C, 1), N);  // r tokens, wte rows, wpe rows; w out
}

OpCost encoder_backward(int64_t B, int64_t T, int64_t C) {
  const double N = static_cast<double>(B) * T, TC = static_cast<double>(T) * C;
  // wpe kernel: r dout (N C), r+w dwpe rows [0,T) (2 T C). wte kernel: r dout rows (N C), r+w one dwte row
  // per position (2 N C), r tokens (N).
  return with_index_check(memory_bound(N * C + 2 * TC + 3 * N * C + N, 2), N);
}

// ---- LayerNorm: inp, out (N,C); weight, bias (C); mean, rstd (N).

OpCost layernorm_forward(int64_t N, int64_t C) {
  const double n = static_cast<double>(N), c = static_cast<double>(C);
  return memory_bound(2 * n * c + 2 * c + 2 * n, 1);  // r inp, weight, bias; w out, mean, rstd
}

OpCost layernorm_backward(int64_t N, int64_t C) {
  const double n = static_cast<double>(N), c = static_cast<double>(C);
  const double dinp = 4 * n * c + c + 2 * n;  // r dout, inp, weight, mean, rstd; r+w dinp
  const double partials = 2 * n * c + 2 * n;  // r dout, inp, mean, rstd (the column partials: scratch)
  const double finalize = 4 * c;              // r+w dweight, dbias
  return memory_bound(dinp + partials + finalize, 3);
}

// ---- Linear layers: inp (N,C), weight (OC,C), out/dout (N,OC); operands in `operand`, the rest f32.

OpCost matmul_forward(int64_t N, int64_t C, int64_t OC, bool bias, DType operand) {
  const double n = static_cast<double>(N), c = static_cast<double>(C), oc = static_cast<double>(OC);
  const double s = static_cast<double>(dtype_size(operand));
  OpCost cost;
  cost.op_class = OpClass::Matmul;
  cost.math = operand;
  cost.flops = 2 * n * c * oc;
  cost.bytes = s * (n * c + oc * c) + kF32 * (n * oc + (bias ? oc : 0));  // r inp, weight, bias; w out
  cost.launches = 1;                                                      // cublasLt with the bias in its epilogue
  return cost;
}

OpCost matmul_backward(int64_t N, int64_t C, int64_t OC, bool dinp, bool dweight, bool dbias, DType operand) {
  const double n = static_cast<double>(N), c = static_cast<double>(C), oc = static_cast<double>(OC);
  const double s = static_cast<double>(dtype_size(operand));
  OpCost cost;
  cost.op_class = OpClass::Matmul;
  cost.math = operand;
  if (dinp) {  // dinp (N,C) += dout @ weight: one GEMM, r dout, weight, r+w dinp
    cost.flops += 2 * n * c * oc;
    cost.bytes += s * (n * oc + oc * c) + kF32 * 2 * n * c;
    cost.launches += 1;
  }
  if (dweight) {  // dweight (OC,C) += dout^T @ inp: one GEMM, r dout, inp, r+w dweight
    cost.flops += 2 * n * c * oc;
    cost.bytes += s * (n * oc + n * c) + kF32 * 2 * oc * c;
    cost.launches += 1;
  }
  if (dbias) {  // dbias (OC) += column sums of dout: partials + finalize kernels, r dout, r+w dbias
    cost.bytes += s * n * oc + kF32 * 2 * oc;
    cost.launches += 2;
  }
  return cost;
}

// ---- Attention: qkv (B,T,3C), out (B,T,C), att (B,NH,T,T) or lse (B,NH,T). X = B T C elements of one of
// q, k, v, out; A = B NH T^2 scores; a head's products are (T x HS) by (HS x T) and (T x T) by (T x HS).

OpCost attention_forward(int64_t B, int64_t T, int64_t C, int64_t NH) {
  const double X = static_cast<double>(B) * T * C, A = static_cast<double>(B) * NH * T * T;
  OpCost cost;
  cost.op_class = OpClass::Attention;
  cost.flops = 2 * (2 * static_cast<double>(T) * X);  // q k^T and att v, the whole square: 2 T^2 C B each
  // per head: GEMM r q, k, w att; softmax r+w att; GEMM r att, v, w out
  cost.bytes = kF32 * ((2 * X + A) + 2 * A + (A + 2 * X));
  cost.launches = 2 * NH + 1;
  return cost;
}

OpCost attention_backward(int64_t B, int64_t T, int64_t C, int64_t NH) {
  const double X = static_cast<double>(B) * T * C, A = static_cast<double>(B) * NH * T * T;
  OpCost cost;
  cost.op_class = OpClass::Attention;
  cost.flops = 4 * (2 * static_cast<double>(T) * X);  // dP, dv, dq, dk: four products of the forward's size
  // dP: r v, dout, w datt; dv: r dout, att, r+w dv; softmax backward: r datt, att, w datt;
  // dq: r k, datt, r+w dq; dk: r q, datt, r+w dk
  cost.bytes = kF32 * ((2 * X + A) + (3 * X + A) + 3 * A + (3 * X + A) + (3 * X + A));
  cost.launches = 4 * NH + 1;
  return cost;
}

OpCost attention_forward_flash(int64_t B, int64_t T, int64_t C, int64_t NH) {
  const double X = static_cast<double>(B) * T * C, R = static_cast<double>(B) * NH * T;
  const double pairs_x_hs = X * (static_cast<double>(T) + 1) / 2;  // sum over heads of HS x T(T+1)/2 pairs
  OpCost cost;
  cost.op_class = OpClass::Attention;
  cost.flops = 4 * pairs_x_hs;          // per causal pair: q.k and p v, HS multiply-adds each
  cost.bytes = kF32 * (3 * X + X + R);  // r q, k, v; w out, lse
  cost.launches = 1;
  return cost;
}

OpCost attention_backward_flash(int64_t B, int64_t T, int64_t C, int64_t NH) {
  const double X = static_cast<double>(B) * T * C, R = static_cast<double>(B) * NH * T;
  const double pairs_x_hs = X * (static_cast<double>(T) + 1) / 2;
  OpCost cost;
  cost.op_class = OpClass::Attention;
  // dk/dv pass: S, dP, dv, dk (4 products); dq pass: S, dP, dq (3): 7 x 2 FLOPs per pair and channel
  cost.flops = 14 * pairs_x_hs;
  // row dot D: r dout, out, w D; dk/dv: r q, k, v, dout, lse, D, r+w dk, dv; dq: r q, k, v, dout, lse, D,
  // r+w dq
  cost.bytes = kF32 * ((2 * X + R) + (8 * X + 2 * R) + (6 * X + 2 * R));
  cost.launches = 3;
  return cost;
}

double attention_block_pairs(int64_t Tq, int64_t Tk, int64_t q_offset, int64_t kv_offset) {
  double pairs = 0;
  // Query t sees keys s = 0 .. q_offset + t - kv_offset of the block, at most Tk of them.
  for (int64_t t = 0; t < Tq; t++)
    pairs += static_cast<double>(std::clamp<int64_t>(q_offset + t - kv_offset + 1, 0, Tk));
  return pairs;
}

namespace {
// The sizes both block ops count with: X = B Tq C (q, out, dq), Xk = B Tk C (k or v), R = B NH Tq (lse, D), and
// pairs_x_c = visible pairs x B x C (the sum over heads of HS x the visible pairs).
struct BlockSizes {
  double X, Xk, R, pairs_x_c;
  BlockSizes(int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, int64_t q_offset, int64_t kv_offset)
      : X(static_cast<double>(B) * Tq * C),
        Xk(static_cast<double>(B) * Tk * C),
        R(static_cast<double>(B) * NH * Tq),
        pairs_x_c(attention_block_pairs(Tq, Tk, q_offset, kv_offset) * static_cast<double>(B) * C) {}
};
}  // namespace

OpCost attention_forward_block(int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, int64_t q_offset,
                               int64_t kv_offset) {
  const BlockSizes z(B, Tq, Tk, C, NH, q_offset, kv_offset);
  OpCost cost;
  cost.op_class = OpClass::Attention;
  cost.flops = 4 * z.pairs_x_c;  // per visible pair and head: q.k and p v, HS multiply-adds each
  // r q; r k, v (only when some pair is visible: the kernel skips every key tile otherwise); w out, lse
  cost.bytes = kF32 * (z.X + (z.pairs_x_c > 0 ? 2 * z.Xk : 0) + z.X + z.R);
  cost.launches = 1;
  return cost;
}

OpCost attention_backward_block(int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, int64_t q_offset,
                                int64_t kv_offset) {
  const BlockSizes z(B, Tq, Tk, C, NH, q_offset, kv_offset);
  OpCost cost;
  cost.op_class = OpClass::Attention;
  cost.flops = 14 * z.pairs_x_c;  // as attention_backward_flash, per visible pair
  // row dot D: r dout, out, w D; dk/dv: r q, k, v, dout, lse, D, r+w dk, dv; dq: r q, k, v, dout, lse, D,
  // r+w dq
  cost.bytes = kF32 * ((2 * z.X + z.R) + (2 * z.X + 6 * z.Xk + 2 * z.R) + (4 * z.X + 2 * z.Xk + 2 * z.R));
  cost.launches = 3;
  return cost;
}

OpCost attention_merge(int64_t B, int64_t T, int64_t C, int64_t NH) {
  const double X = static_cast<double>(B) * T * C, R = static_cast<double>(B) * NH * T;
  return memory_bound(3 * X + 3 * R, 1);  // r out, out_part, w out; r lse, lse_part, w lse
}

// ---- Elementwise.

OpCost gelu_forward(int64_t n) { return memory_bound(2.0 * n, 1); }   // r inp, w out
OpCost gelu_backward(int64_t n) { return memory_bound(4.0 * n, 1); }  // r inp, dout, r+w dinp
OpCost add_bias(int64_t N, int64_t OC) {
  return memory_bound(2.0 * N * OC + OC, 1);  // r+w out, r bias
}
OpCost residual_forward(int64_t n) { return memory_bound(3.0 * n, 1); }   // r a, b, w out
OpCost residual_backward(int64_t n) { return memory_bound(5.0 * n, 1); }  // r dout, r+w da, db

// ---- Softmax + cross-entropy: logits, probs (N,V); targets, losses (N).

OpCost softmax_crossentropy_forward(int64_t N, int64_t V) {
  const double n = static_cast<double>(N);
  return with_index_check(memory_bound(2 * n * V + 2 * n, 1), n);  // r logits, targets; w probs, losses
}

OpCost softmax_crossentropy_backward(int64_t N, int64_t V) {
  const double n = static_cast<double>(N);
  return with_index_check(memory_bound(2 * n * V + n, 1), n);  // r probs, targets; w dlogits
}

// ---- The vocabulary split across a tensor-parallel group: logits (N,Vl), per-row tensors (N).

OpCost encoder_forward_vocab_shard(int64_t B, int64_t T, int64_t C, bool wpe) {
  const double N = static_cast<double>(B) * T;
  return memory_bound(N + 2 * N * C + (wpe ? N * C : 0), 1);  // r tokens, wte_shard rows, wpe rows; w out
}

OpCost encoder_backward_vocab_shard(int64_t B, int64_t T, int64_t C, int64_t Vl, bool dwpe) {
  const double N = static_cast<double>(B) * T;
  const double dwte = N + N * C + 2.0 * Vl * C;    // r tokens, dout rows, r+w dwte_shard
  const double dwpe_kernel = N * C + 2.0 * T * C;  // r dout, r+w dwpe rows [0,T)
  return memory_bound(dwte + (dwpe ? dwpe_kernel : 0), dwpe ? 2 : 1);
}

OpCost logits_row_max(int64_t N, int64_t Vl) {
  return memory_bound(static_cast<double>(N) * Vl + N, 1);  // r logits, w maxes
}

OpCost crossentropy_vocab_shard_partials(int64_t N, int64_t Vl) {
  return memory_bound(static_cast<double>(N) * Vl + 4.0 * N, 1);  // r logits, maxes, targets; w sumexp, target_logit
}

OpCost crossentropy_vocab_shard_finish(int64_t N, int64_t Vl) {
  // r logits, maxes, sumexp, target_logit; w probs, losses
  return memory_bound(2.0 * N * Vl + 4.0 * N, 1);
}

OpCost crossentropy_vocab_shard_backward(int64_t N, int64_t Vl) {
  return memory_bound(2.0 * N * Vl + N, 1);  // r probs, targets; w dlogits
}

// ---- Optimizer updates, reductions, casts.

OpCost adamw_update(int64_t n) { return memory_bound(7.0 * n, 1); }  // r grad, r+w param, m, v
OpCost sgd_update(int64_t n) { return memory_bound(3.0 * n, 1); }    // r grad, r+w param
OpCost sum_squares(int64_t n) { return memory_bound(1.0 * n, 2); }   // r t (partial sums, then their sum)
OpCost scale(int64_t n) { return memory_bound(2.0 * n, 1); }         // r+w t

OpCost cast(int64_t n, DType dst, DType src) {
  OpCost cost;
  cost.bytes = static_cast<double>(n) * static_cast<double>(dtype_size(dst) + dtype_size(src));  // r src, w dst
  cost.launches = 1;
  return cost;
}

}  // namespace op_cost

}  // namespace scalelab
