// tensor_parallel.h — the tensor-parallel points of GPT-2: where a block split across a tensor-parallel
// group must communicate (docs/design.md "Parallel layouts"). The model calls these at fixed places of its
// forward and backward; this base class is their identity, which is exactly the dense model (tp = 1).
// Lab 05 derives from it and implements them over its tp group (labs/05_tensor_parallel; the ideas: its
// README, "f and g", "The vocabulary split", "Sequence parallel"; Megatron-LM, Shoeybi et al. 2019,
// arXiv:1909.08053, Sec. 3, Fig. 3; sequence parallelism, Korthikanti et al. 2022, arXiv:2205.05198,
// Sec. 4.2.2).
//
// Where the model calls them in a block: the f points (or, with sequence parallelism, the sp_gather
// points) on the input of each linear that follows a layernorm (c_attn, c_fc) and of the LM head; the g
// points (or sp_scatter) on the output of each linear that feeds the residual stream (the two c_proj),
// handing them that linear's bias. How each linear's weight is cut is the shard's split rule
// (ModelShard::tp_split in gpt2_layout.h), not this interface's.
// With sequence parallelism the kit stores activations (B, T, C), batch first, and splits the B*T token
// rows into tp contiguous blocks of B*T/tp rows, block r on rank r (with B = 1 exactly Megatron's split
// along the sequence): a shard of the residual stream is (Nl, C). The vocabulary is split by rows of wte,
// V/tp per rank, rank r holding rows [r*Vl, (r+1)*Vl); the LM head's logits are (B, T, Vl) per rank.
//
// Every method is called by every rank of the group at the same point (they are collectives in lab 05).
// Shapes below: B batch, T the sequence, C channels, Nl = B*T/tp token rows with sequence parallelism
// (the stream is (B,T,C) without), V the whole vocabulary, Vl = V/tp this rank's rows of it. "Whole" means
// the value the dense model has at that point, the same on every rank; "partial" means one rank's term of
// a sum over the group whose total is the whole value.
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
  // f forward: x is the input of a linear whose weight each rank holds a part of; on return x is what that
  // linear must see on this rank.
  virtual void f_forward(Tensor& x) { (void)x; }
  // f backward: dx arrives as this rank's gradient of that input (from its part of the linear only); on
  // return dx is the whole gradient of x on every rank.
  virtual void f_backward(Tensor& dx) { (void)dx; }
  // g forward: y arrives as this rank's output of a linear whose weight each rank holds a part of; on
  // return y is the whole output, bias (C) included exactly once, on every rank. bias nullptr: the model
  // has added it already (tp = 1 fuses it into the matmul).
  virtual void g_forward(Tensor& y, const Tensor* bias);
  // g backward: dy arrives as the whole gradient of g's output; on return dy is the gradient of this
  // rank's y (g's input).
  virtual void g_backward(Tensor& dy) { (void)dy; }

  // ---- Sequence parallelism, instead of f and g (model built with ModelShard::sequence_parallel).
  // Where f sits: x_shard (Nl, C), this rank's token rows of the whole input -> x_full (B, T, C), the whole
  // input as the linear must see it.
  virtual void sp_gather_forward(const Tensor& x_shard, Tensor& x_full) { x_full.copy_from(x_shard); }
  // Its backward: dx_full (B, T, C), this rank's gradient of x_full -> dx_shard (Nl, C), this rank's rows of
  // the whole gradient.
  virtual void sp_gather_backward(const Tensor& dx_full, Tensor& dx_shard) { dx_shard.copy_from(dx_full); }
  // Where g sits: y_full (B, T, C), this rank's output of the linear -> y_shard (Nl, C), this rank's token
  // rows of the whole output, bias (C) included once (as g_forward).
  virtual void sp_scatter_forward(const Tensor& y_full, Tensor& y_shard, const Tensor* bias);
  // Its backward: dy_shard (Nl, C), this rank's rows of the whole gradient -> dy_full (B, T, C), the
  // gradient of this rank's y_full.
  virtual void sp_scatter_backward(const Tensor& dy_shard, Tensor& dy_full) { dy_full.copy_from(dy_shard); }

  // ---- The vocabulary-parallel embedding. tokens (B, T) i32 in [0, V); wte_shard (Vl, C) holds rows
  // [rank*Vl, (rank+1)*Vl) of wte; wpe (maxT, C). out (B, T, C) = wte[tokens] + wpe, whole on every rank;
  // with sequence parallelism out is the rank's (Nl, C) rows of it. The defaults are the dense ops (ops.h
  // encoder_forward / encoder_backward).
  virtual void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor& wpe);
  // dwte_shard (Vl, C) += the rows of this rank's tokens; dwpe (maxT, C) += positions; dout like out.
  virtual void embedding_backward(Tensor& dwte_shard, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

  // ---- The vocabulary-parallel cross-entropy. logits (B, T, Vl): this rank's columns of the LM head's
  // output; targets (B, T) i32 in [0, V). losses (B, T) = -log softmax(full logits)[target], the same on
  // every rank, without the full (B, T, V) logits ever on one rank; probs (B, T, Vl) = this rank's columns
  // of the softmax, kept for backward. The defaults are the dense op (softmax_crossentropy_forward /
  // _backward).
  virtual void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets);
  // dlogits (B, T, Vl) = dloss times the gradient of each row's loss with respect to this rank's columns of
  // the logits; OVERWRITES.
  virtual void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss);
};

}  // namespace scalelab
