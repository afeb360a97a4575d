// tensor_parallel.h — the tensor-parallel points of GPT-2: where a block split across a tensor-parallel
// group must communicate (docs/design.md "Parallel layouts"). The model calls these at fixed places of its
// forward and backward; this base class is their identity, which is exactly the dense model (tp = 1).
// Lab 05 derives from it and implements them over its tp group (labs/05_tensor_parallel).
//
// Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3, Fig. 3) splits each of a block's two halves,
// attention and MLP, as column-parallel linear (weight rows split: c_attn by heads, c_fc by its 4C outputs)
// followed by row-parallel linear (weight columns split: the two c_proj). Around the pair sit two conjugate
// operators:
//   f  before the column-parallel linear: identity forward, all-reduce of the input's gradient backward
//   g  after the row-parallel linear:     all-reduce of the partial outputs forward, identity backward
// and the row-parallel layer's bias is added once, after g's reduction (g takes it). With sequence
// parallelism (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.2.2) the residual stream and the
// layernorms are split across the group instead of replicated: f becomes an all-gather (reduce-scatter in
// backward) and g a reduce-scatter (all-gather in backward). The kit stores activations (B, T, C), batch
// first, so it splits the B*T token rows into tp contiguous blocks of B*T/tp rows (with B = 1 exactly
// Megatron's split along the sequence; the volumes and the memory are the same for any B): a shard of the
// residual stream is (B*T/tp, C).
// The vocabulary is split too (wte's rows, V/tp per rank): the embedding looks up only the rank's rows
// and the group sums the partial results; the LM head produces (B, T, V/tp) logits per rank and the
// cross-entropy combines the max, the sum of exponentials and the target's logit across the group, so the
// full (B, T, V) logits never exist on one rank.
//
// Every method is called by every rank of the group at the same point (they are collectives in lab 05).
// Shapes below: B batch, T the sequence, C channels, Nl = B*T/tp token rows with sequence parallelism
// (the stream is (B,T,C) without), V the whole vocabulary, Vl = V/tp this rank's rows of it.
// Tests: tests/common/model/test_model_shard.cpp (the identity is the dense model bit for bit)
#pragma once

#include "scalelab/core/tensor.h"  // defines: Tensor

namespace scalelab {

class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int size() const { return 1; }  // tp: ranks in the group
  virtual int rank() const { return 0; }  // this rank's index in it

  // ---- Megatron's f and g (no sequence parallelism). x, y: (B, T, C) fp32, in place.
  // f forward: the input of a column-parallel linear, identity (every rank already holds all of it).
  virtual void f_forward(Tensor& x) { (void)x; }
  // f backward: the gradient of that input, partial on each rank (each saw only its columns' outputs):
  // all-reduce (sum) so every rank holds the whole gradient.
  virtual void f_backward(Tensor& dx) { (void)dx; }
  // g forward: the row-parallel linear's output, partial on each rank: all-reduce (sum), then add bias
  // (C), replicated, once. bias nullptr: the model has added it already (tp = 1 fuses it into the matmul).
  virtual void g_forward(Tensor& y, const Tensor* bias);
  // g backward: identity (the gradient of a sum is the same on every addend).
  virtual void g_backward(Tensor& dy) { (void)dy; }

  // ---- Sequence parallelism, instead of f and g (model built with ModelShard::sequence_parallel).
  // Before a column-parallel region: x_shard (Nl, C) -> x_full (B, T, C): all-gather of the token rows.
  virtual void sp_gather_forward(const Tensor& x_shard, Tensor& x_full) { x_full.copy_from(x_shard); }
  // Its backward: dx_full (B, T, C) partial per rank -> dx_shard (Nl, C): reduce-scatter (sum).
  virtual void sp_gather_backward(const Tensor& dx_full, Tensor& dx_shard) { dx_shard.copy_from(dx_full); }
  // After a row-parallel linear: y_full (B, T, C) partial per rank -> y_shard (Nl, C): reduce-scatter
  // (sum), then add bias (C) once (as g_forward).
  virtual void sp_scatter_forward(const Tensor& y_full, Tensor& y_shard, const Tensor* bias);
  // Its backward: dy_shard (Nl, C) -> dy_full (B, T, C): all-gather.
  virtual void sp_scatter_backward(const Tensor& dy_shard, Tensor& dy_full) { dy_full.copy_from(dy_shard); }

  // ---- The vocabulary-parallel embedding. tokens (B, T) i32 in [0, V); wte_shard (Vl, C) holds rows
  // [rank*Vl, (rank+1)*Vl) of wte; wpe (maxT, C). out (B, T, C) = wte[tokens] + wpe (the sum over the group
  // of each rank's lookups, ids outside its rows contributing zero); with sequence parallelism out is the
  // rank's (Nl, C) rows of it. The defaults are the dense ops (ops.h encoder_forward / encoder_backward).
  virtual void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor& wpe);
  // dwte_shard (Vl, C) += the rows of this rank's tokens; dwpe (maxT, C) += positions; dout like out.
  virtual void embedding_backward(Tensor& dwte_shard, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

  // ---- The vocabulary-parallel cross-entropy. logits (B, T, Vl): this rank's columns of the LM head's
  // output; targets (B, T) i32 in [0, V). losses (B, T) = -log softmax(full logits)[target], the same on
  // every rank; probs (B, T, Vl) = this rank's columns of the softmax, kept for backward. The defaults are
  // the dense op (softmax_crossentropy_forward / _backward).
  virtual void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets);
  // dlogits (B, T, Vl) = dloss * (probs - onehot(targets) restricted to this rank's columns); OVERWRITES.
  virtual void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss);
};

}  // namespace scalelab
