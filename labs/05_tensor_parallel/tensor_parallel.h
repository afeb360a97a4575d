// tensor_parallel.h — what the learner writes in lab 05 (tensor parallel), declared once for both tracks.
//   labs/05_tensor_parallel/tensor_parallel.cpp       the learner's file (TODO blocks)   -> lab05_learner
//   solutions/05_tensor_parallel/tensor_parallel.cpp  the reference (same file, filled)  -> lab05_ref
//   labs/05_tensor_parallel/tp_groups.cpp             the given code (shard_of, MegatronPoints' constructor,
//                                                     average_over_replicas): compiled into both libraries
// The two tracks live in distinct inline namespaces (scalelab::lab05::learner / ::ref) chosen by
// SL_TRACK_LAB05, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/05_tensor_parallel/README.md   Graded tests: tests/lab05/ (test_lab05*.cpp)
//
// The model (common/include/scalelab/model/gpt2.h) knows how to hold a slice: built for a ModelShard with
// tp_size ranks, every rank holds the slice of each block tensor that the shard's split rule names
// (ModelShard::tp_split, applied by gpt2_param_table; wte is cut by vocabulary rows) and runs the block on its
// slices, calling the tensor-parallel points of scalelab/model/tensor_parallel.h at fixed places of the
// block. This lab decides the split and implements the points over the tensor-parallel group:
//   the block's split        which tensor is cut along which dimension                          TODO lab05-9
//   f, g                     the conjugate operators around each column -> row parallel pair   TODO lab05-2, -3
//   embedding                the vocabulary-parallel lookup                                    TODO lab05-4
//   cross-entropy            the loss over logits split by vocabulary                          TODO lab05-5
//   sequence parallel        all-gather / reduce-scatter of the token rows instead of f and g  TODO lab05-6
//   replicated gradients     made whole across the group under sequence parallelism           TODO lab05-7
//   the training step        one optimizer step of a tensor-parallel shard                     TODO lab05-8
// (README.md#the-picture shows where each one sits in a block.)
#pragma once

#include <string>
#include <vector>

#include "scalelab/comm/comm.h"              // defines: Communicator
#include "scalelab/model/batch.h"            // defines: MicroBatch, StepResult
#include "scalelab/model/gpt2.h"             // defines: GPT2, GPTConfig, ModelShard
#include "scalelab/model/optim.h"            // defines: Optimizer
#include "scalelab/model/tensor_parallel.h"  // defines: TensorParallel (the points, and their identity)

#ifndef SL_TRACK_LAB05
#define SL_TRACK_LAB05 ref
#endif

namespace scalelab::lab05 {
inline namespace SL_TRACK_LAB05 {

// TODO(lab05-1): the layout of a lab 05 run on `world_size` ranks: tensor-parallel groups of `tp`
// consecutive ranks (tp fastest: a group sits inside a node), and world_size / tp data-parallel replicas of
// it. Throws scalelab::Error, with the numbers and a hint, unless 1 <= tp <= world_size, tp divides
// world_size, sequence parallelism has tp > 1, and the model (NH, 4C, V) divides by tp
// (ModelShard::validate): the same on every rank, before any collective, so no rank hangs. README.md#the-layout
struct Layout {
  int tp = 1, dp = 1;
  int tp_rank = 0, dp_rank = 0;
  bool sequence_parallel = false;
};
Layout make_layout(const GPTConfig& cfg, int world_size, int rank, int tp, bool sequence_parallel);
// TODO(lab05-9): the column/row split of a block's weights. For each tensor of a block, named without its
// "h.<l>." prefix (the twelve of gpt2_param_table: "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", ...,
// "mlp.c_proj.bias"), how every rank of a tensor-parallel group cuts it (TpSplit, scalelab/model/gpt2_layout.h:
// which dimension, in how many blocks; -1 keeps it whole). Contract: with the points the model calls at their
// fixed places in a block (README.md#the-picture), the tp ranks' slices compute exactly the dense block's
// output and gradients, for any tp dividing NH and 4C; no activation of a block's (B, T, 3C) or (B, T, 4C)
// width is ever whole on one rank; every head's attention runs on one rank. Throws scalelab::Error for a
// name that is not a block tensor. README.md#the-column-row-split
TpSplit block_split(const std::string& block_tensor);
// The shard this rank's model is built for: tp_rank of tp, every layer, embedding and head, cut by
// block_split.
ModelShard shard_of(const Layout& layout);

// The tensor-parallel points over one tensor-parallel group (comm: its communicator, tp = comm.size()).
// Every method is a collective of the group: all its ranks call it at the same point, with tensors of the
// same shapes. Shapes as in scalelab/model/tensor_parallel.h.
class MegatronPoints : public TensorParallel {
 public:
  MegatronPoints(Communicator& tp_group, bool sequence_parallel);
  int size() const override;
  int rank() const override;
  Communicator& group() { return comm_; }

  // TODO(lab05-2): Megatron's f (Shoeybi et al. 2019, Sec. 3, Fig. 3). README.md#f-and-g
  void f_forward(Tensor& x) override;
  void f_backward(Tensor& dx) override;
  // TODO(lab05-3): Megatron's g, with the row-parallel bias added once. README.md#f-and-g
  void g_forward(Tensor& y, const Tensor* bias) override;
  void g_backward(Tensor& dy) override;

  // TODO(lab05-4): the vocabulary-parallel embedding. README.md#the-vocabulary-split
  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor& wpe) override;
  void embedding_backward(Tensor& dwte_shard, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) override;

  // TODO(lab05-5): the vocabulary-parallel cross-entropy. README.md#the-vocabulary-split
  void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets) override;
  void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) override;

  // TODO(lab05-6): sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2). README.md#sequence-parallel
  void sp_gather_forward(const Tensor& x_shard, Tensor& x_full) override;
  void sp_gather_backward(const Tensor& dx_full, Tensor& dx_shard) override;
  void sp_scatter_forward(const Tensor& y_full, Tensor& y_shard, const Tensor* bias) override;
  void sp_scatter_backward(const Tensor& dy_shard, Tensor& dy_full) override;

 private:
  Communicator& comm_;
  bool sequence_parallel_;
};

// TODO(lab05-7): under sequence parallelism some replicated parameters (whole on every rank) get from each
// rank only a partial gradient, computed from its own token rows. Contract: on return the gradient of every
// replicated parameter is whole and equal on every rank of the tensor-parallel group; the others are
// untouched. Without sequence parallelism, nothing to do. README.md#sequence-parallel
void sync_replicated_grads(GPT2& model, MegatronPoints& points);

// TODO(lab05-8): one optimizer step of this rank's shard over its micro-batches (one per micro-step; every
// rank of a tensor-parallel group sees the same micro-batches). Contract: on return every parameter has taken
// one step of `optimizer` at `lr` on the gradient of the step's mean loss (over the m micro-batches and, with
// `dp_group` (nullptr or size 1: none), over the replicas' batches), that gradient whole on every rank of the
// group and clipped to a whole-model norm of at most grad_clip (<= 0: no clipping; scalelab/model/optim.h).
// Returns the loss (mean over the micro-batches; the same on every rank of the group) and the whole model's
// gradient norm before clipping. Given: average_over_replicas. README.md#one-training-step
StepResult train_step(GPT2& model, Optimizer& optimizer, MegatronPoints& points, Communicator* dp_group,
                      const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip);

// Given. Every gradient becomes its average over the data-parallel replicas (one all-reduce per unit).
void average_over_replicas(GPT2& model, Communicator& dp_group);

}  // namespace SL_TRACK_LAB05
}  // namespace scalelab::lab05
