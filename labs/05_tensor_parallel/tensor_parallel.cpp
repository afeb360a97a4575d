// tensor_parallel.cpp — lab 05: tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053):
// the points where a model split inside each layer talks, over the tensor-parallel group. Declared in
// labs/05_tensor_parallel/tensor_parallel.h; the lesson is labs/05_tensor_parallel/README.md. Only the code
// between TODO(lab05-N) BEGIN/END is yours to write. The code around these functions (MegatronPoints'
// constructor, shard_of, the data-parallel average) is given once, in labs/05_tensor_parallel/tp_groups.cpp,
// and compiled into both tracks.
#include "tensor_parallel.h"

#include <string>  // defines: std::string (the names of the replicated parameters)

#include "scalelab/core/error.h"   // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL, scalelab::NotImplemented
#include "scalelab/ops/ops.h"      // defines: add_bias_, scale_, encoder_*_vocab_shard, crossentropy_vocab_shard_*
#include "scalelab/model/optim.h"  // defines: clip_grad_norm (with groups)

namespace scalelab::lab05 {
inline namespace SL_TRACK_LAB05 {

// =============================================================================================
// The layout
// =============================================================================================
Layout make_layout(const GPTConfig& cfg, int world_size, int rank, int tp, bool sequence_parallel) {
  Layout l;
  // TODO(lab05-1) BEGIN  this rank's place in the layout, or a clear error on every rank
  //   Which ranks form a tensor-parallel group (tp fastest), which replica this rank belongs to, and every
  //   layout that cannot work refused with the numbers and what to change (ModelShard::validate knows the
  //   model's side). README.md#the-layout
  throw scalelab::NotImplemented("lab05-1 make_layout");
  // TODO(lab05-1) END
  return l;
}

// =============================================================================================
// The column/row split of a block's weights
// =============================================================================================
TpSplit block_split(const std::string& block_tensor) {
  TpSplit s;
  // TODO(lab05-9) BEGIN  how a tensor-parallel group cuts this tensor of a block
  //   Which tensors does each rank need whole, which can it hold a 1/tp slice of, and along which dimension,
  //   so that the block's points (f, g) at their places make the result the dense block's? Weights are
  //   (out, in). README.md#the-column-row-split
  throw scalelab::NotImplemented("lab05-9 block_split");
  // TODO(lab05-9) END
  return s;
}

// =============================================================================================
// f and g: the conjugate operators around a column-parallel -> row-parallel pair
// =============================================================================================
void MegatronPoints::f_forward(Tensor& x) {
  // TODO(lab05-2) BEGIN  f, forward: the input of a column-parallel linear (B,T,C)
  //   x is the input of a column-parallel linear. What does each rank already hold, and what must it do?
  //   README.md#f-and-g
  throw scalelab::NotImplemented("lab05-2 f_forward");
  // TODO(lab05-2) END
}

void MegatronPoints::f_backward(Tensor& dx) {
  // TODO(lab05-2) BEGIN  f, backward: the gradient of that input, partial on every rank
  //   Each rank's column-parallel linear saw only its own output columns, so its dx is one part of the
  //   whole gradient. Every rank needs the whole of it. README.md#f-and-g
  throw scalelab::NotImplemented("lab05-2 f_backward");
  // TODO(lab05-2) END
}

void MegatronPoints::g_forward(Tensor& y, const Tensor* bias) {
  // TODO(lab05-3) BEGIN  g, forward: the row-parallel output, partial on every rank; then its bias, once
  //   Each rank's row-parallel linear multiplied only its input columns: y is one part of the output.
  //   Make it whole on every rank; a bias (C) the model gives here belongs in the output exactly once.
  //   README.md#f-and-g
  throw scalelab::NotImplemented("lab05-3 g_forward");
  // TODO(lab05-3) END
}

void MegatronPoints::g_backward(Tensor& dy) {
  // TODO(lab05-3) BEGIN  g, backward
  //   What is the gradient of a sum with respect to each of its parts? README.md#f-and-g
  throw scalelab::NotImplemented("lab05-3 g_backward");
  // TODO(lab05-3) END
}

// =============================================================================================
// The vocabulary split: embedding and cross-entropy
// =============================================================================================
void MegatronPoints::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor& wpe) {
  [[maybe_unused]] const int64_t Vl = wte_shard.size(0),
                                 begin = static_cast<int64_t>(rank()) * Vl;  // this rank's first row
  // TODO(lab05-4) BEGIN  out = wte[tokens] + wpe, from every rank's rows
  //   This rank holds wte rows [begin, begin + Vl) and all of wpe; out must be the dense embedding's output
  //   (with sequence parallelism only this rank's token rows (Nl, C) of it). What can this rank look up on
  //   its own, and what is counted how often? ops.h has the vocab-shard lookup. README.md#the-vocabulary-split
  throw scalelab::NotImplemented("lab05-4 embedding_forward");
  // TODO(lab05-4) END
}

void MegatronPoints::embedding_backward(Tensor& dwte_shard, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  [[maybe_unused]] const int64_t Vl = dwte_shard.size(0), begin = static_cast<int64_t>(rank()) * Vl;
  // TODO(lab05-4) BEGIN  the gradients of this rank's rows of wte, and of wpe
  //   dout is whole on every rank without sequence parallelism, this rank's token rows with it. Every row of
  //   wte this rank owns needs the gradient of every position holding its token (ops.h
  //   encoder_backward_vocab_shard). README.md#the-vocabulary-split
  throw scalelab::NotImplemented("lab05-4 embedding_backward");
  // TODO(lab05-4) END
}

void MegatronPoints::cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets) {
  [[maybe_unused]] const int64_t N = losses.numel(), Vl = logits.size(-1), begin = static_cast<int64_t>(rank()) * Vl;
  [[maybe_unused]] auto row = [&](MemCategory c) { return Tensor::empty({N}, DType::F32, logits.device(), c); };
  // TODO(lab05-5) BEGIN  the loss of every row, the full (B,T,V) logits never on one rank
  //   The loss of row i needs the max, the sum of exponentials and the target's logit over ALL V columns,
  //   and each rank holds Vl of them. ops.h has the local pieces (the vocab-shard cross-entropy); N is the
  //   number of rows, `row` makes an (N,) tensor. README.md#the-vocabulary-split
  throw scalelab::NotImplemented("lab05-5 cross_entropy_forward");
  // TODO(lab05-5) END
}

void MegatronPoints::cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) {
  [[maybe_unused]] const int64_t Vl = probs.size(-1), begin = static_cast<int64_t>(rank()) * Vl;
  // TODO(lab05-5) BEGIN  the gradient of this rank's columns of the logits
  //   The gradient of the loss with respect to this rank's columns needs nothing from other ranks: why?
  //   README.md#the-vocabulary-split
  throw scalelab::NotImplemented("lab05-5 cross_entropy_backward");
  // TODO(lab05-5) END
}

// =============================================================================================
// Sequence parallelism: the token rows split across the group outside the column -> row regions
// =============================================================================================
void MegatronPoints::sp_gather_forward(const Tensor& x_shard, Tensor& x_full) {
  // TODO(lab05-6) BEGIN  before a column-parallel region: every rank's rows
  //   Outside the column -> row regions each rank keeps only its token rows (Nl, C). A column-parallel
  //   linear needs all of them. README.md#sequence-parallel
  throw scalelab::NotImplemented("lab05-6 sp_gather_forward");
  // TODO(lab05-6) END
}

void MegatronPoints::sp_gather_backward(const Tensor& dx_full, Tensor& dx_shard) {
  // TODO(lab05-6) BEGIN  its backward: each rank's rows of the summed gradient
  //   The conjugate of the forward above. README.md#sequence-parallel
  throw scalelab::NotImplemented("lab05-6 sp_gather_backward");
  // TODO(lab05-6) END
}

void MegatronPoints::sp_scatter_forward(const Tensor& y_full, Tensor& y_shard, const Tensor* bias) {
  // TODO(lab05-6) BEGIN  after a row-parallel linear: this rank's rows of the sum, then the bias once
  //   g with sequence parallelism: y_full is one part of the output on every rank; each rank needs only its
  //   token rows of the whole, with the bias once. README.md#sequence-parallel
  throw scalelab::NotImplemented("lab05-6 sp_scatter_forward");
  // TODO(lab05-6) END
}

void MegatronPoints::sp_scatter_backward(const Tensor& dy_shard, Tensor& dy_full) {
  // TODO(lab05-6) BEGIN  its backward
  //   The conjugate of the forward above. README.md#sequence-parallel
  throw scalelab::NotImplemented("lab05-6 sp_scatter_backward");
  // TODO(lab05-6) END
}

void sync_replicated_grads(GPT2& model, MegatronPoints& points) {
  if (!model.shard().sequence_parallel) return;  // every replicated gradient is whole already
  // TODO(lab05-7) BEGIN  the replicated gradients that sequence parallelism leaves partial
  //   Which replicated parameters did each rank see only part of the data for? Make their gradients the
  //   same, whole gradient on every rank of the group. README.md#sequence-parallel
  throw scalelab::NotImplemented("lab05-7 sync_replicated_grads");
  // TODO(lab05-7) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(GPT2& model, Optimizer& optimizer, MegatronPoints& points, Communicator* dp_group,
                      const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  SL_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  StepResult r;
  // TODO(lab05-8) BEGIN  one optimizer step of a tensor-parallel shard
  //   The step of lab 01 and lab 03, on a shard: what changes is where the gradients become whole and which
  //   norm the clipping uses (scalelab/model/optim.h). Fill r. README.md#one-training-step
  throw scalelab::NotImplemented("lab05-8 train_step");
  // TODO(lab05-8) END
  return r;
}

}  // namespace SL_TRACK_LAB05
}  // namespace scalelab::lab05
