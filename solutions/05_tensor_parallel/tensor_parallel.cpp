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
  SL_CHECK_HINT(tp >= 1 && tp <= world_size,
                "--tp is the size of one tensor-parallel group: 1 .. the number "
                "of ranks (mpirun -np)",
                "--tp %d with %d ranks", tp, world_size);
  SL_CHECK_HINT(world_size % tp == 0,
                "--tp must divide the number of ranks (the rest are data-parallel "
                "replicas of the group), e.g. -np 4 with --tp 2 or 4",
                "--tp %d does not divide %d ranks", tp, world_size);
  SL_CHECK_HINT(!sequence_parallel || tp > 1,
                "sequence parallelism splits the token rows across a "
                "tensor-parallel group: use it with --tp 2 or more",
                "--sequence-parallel with --tp %d", tp);
  l.tp = tp;
  l.dp = world_size / tp;
  l.tp_rank = rank % tp;  // tp fastest: ranks 0..tp-1 form the first group
  l.dp_rank = rank / tp;
  l.sequence_parallel = sequence_parallel;
  shard_of(l).validate(cfg);  // NH, 4C, V divisible by tp: every rank throws the same error
  // TODO(lab05-1) END
  return l;
}

// =============================================================================================
// The column/row split of a block's weights
// =============================================================================================
TpSplit block_split(const std::string& block_tensor) {
  TpSplit s;
  // TODO(lab05-9) BEGIN  how a tensor-parallel group cuts this tensor of a block
  const std::string& t = block_tensor;
  if (t == "attn.c_attn.weight" || t == "attn.c_attn.bias") {
    s = {0, 3};  // column-parallel by output rows: q | k | v each cut, so a rank holds whole heads of all three
  } else if (t == "mlp.c_fc.weight" || t == "mlp.c_fc.bias") {
    s = {0, 1};  // column-parallel: 4C/tp of the MLP's channels, their GELU needs nothing from other ranks
  } else if (t == "attn.c_proj.weight" || t == "mlp.c_proj.weight") {
    s = {1, 1};  // row-parallel by input columns: the columns that multiply this rank's heads / channels
  } else if (t == "attn.c_proj.bias" || t == "mlp.c_proj.bias" || t.rfind("ln_", 0) == 0) {
    s = {-1, 1};  // whole: the row-parallel bias is added once, after g; layernorms see the whole stream
  } else {
    SL_FAIL("block tensors are those of gpt2_param_table without \"h.<l>.\", e.g. \"attn.c_attn.weight\"",
            "block_split: unknown block tensor \"%s\"", t.c_str());
  }
  // TODO(lab05-9) END
  return s;
}

// =============================================================================================
// f and g: the conjugate operators around a column-parallel -> row-parallel pair
// =============================================================================================
void MegatronPoints::f_forward(Tensor& x) {
  // TODO(lab05-2) BEGIN  f, forward: the input of a column-parallel linear (B,T,C)
  (void)x;  // identity: every rank already holds all of x
  // TODO(lab05-2) END
}

void MegatronPoints::f_backward(Tensor& dx) {
  // TODO(lab05-2) BEGIN  f, backward: the gradient of that input, partial on every rank
  comm_.all_reduce(dx, ReduceOp::Sum, "f backward");
  // TODO(lab05-2) END
}

void MegatronPoints::g_forward(Tensor& y, const Tensor* bias) {
  // TODO(lab05-3) BEGIN  g, forward: the row-parallel output, partial on every rank; then its bias, once
  comm_.all_reduce(y, ReduceOp::Sum, "g forward");
  if (bias != nullptr) add_bias_(y, *bias);
  // TODO(lab05-3) END
}

void MegatronPoints::g_backward(Tensor& dy) {
  // TODO(lab05-3) BEGIN  g, backward
  (void)dy;  // identity: the gradient of a sum reaches every addend unchanged
  // TODO(lab05-3) END
}

// =============================================================================================
// The vocabulary split: embedding and cross-entropy
// =============================================================================================
void MegatronPoints::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte_shard, const Tensor& wpe) {
  [[maybe_unused]] const int64_t Vl = wte_shard.size(0),
                                 begin = static_cast<int64_t>(rank()) * Vl;  // this rank's first row
  // TODO(lab05-4) BEGIN  out = wte[tokens] + wpe, from every rank's rows
  const Tensor* my_wpe = rank() == 0 ? &wpe : nullptr;  // the positions once, not tp times
  if (!sequence_parallel_) {
    encoder_forward_vocab_shard(out, tokens, wte_shard, my_wpe, begin);
    comm_.all_reduce(out, ReduceOp::Sum, "embedding");
  } else {
    const int64_t B = tokens.size(0), T = tokens.size(1), C = wte_shard.size(1);
    Tensor full = Tensor::empty({B, T, C}, DType::F32, out.device(), MemCategory::Workspace);
    encoder_forward_vocab_shard(full, tokens, wte_shard, my_wpe, begin);
    comm_.reduce_scatter(full, out, ReduceOp::Sum, "embedding");  // this rank's token rows
  }
  // TODO(lab05-4) END
}

void MegatronPoints::embedding_backward(Tensor& dwte_shard, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  [[maybe_unused]] const int64_t Vl = dwte_shard.size(0), begin = static_cast<int64_t>(rank()) * Vl;
  // TODO(lab05-4) BEGIN  the gradients of this rank's rows of wte, and of wpe
  if (!sequence_parallel_) {
    encoder_backward_vocab_shard(dwte_shard, &dwpe, dout, tokens, begin);
  } else {
    const int64_t B = tokens.size(0), T = tokens.size(1), C = dwte_shard.size(1);
    Tensor full = Tensor::empty({B, T, C}, DType::F32, dout.device(), MemCategory::Workspace);
    comm_.all_gather(dout, full, "embedding backward");  // every token row's gradient
    encoder_backward_vocab_shard(dwte_shard, &dwpe, full, tokens, begin);
  }
  // TODO(lab05-4) END
}

void MegatronPoints::cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets) {
  [[maybe_unused]] const int64_t N = losses.numel(), Vl = logits.size(-1), begin = static_cast<int64_t>(rank()) * Vl;
  [[maybe_unused]] auto row = [&](MemCategory c) { return Tensor::empty({N}, DType::F32, logits.device(), c); };
  // TODO(lab05-5) BEGIN  the loss of every row, the full (B,T,V) logits never on one rank
  Tensor maxes = row(MemCategory::Workspace);
  logits_row_max(maxes, logits);
  comm_.all_reduce(maxes, ReduceOp::Max, "cross-entropy max");
  Tensor both = Tensor::empty({2 * N}, DType::F32, logits.device(), MemCategory::Workspace);  // one message
  Tensor sumexp = both.view(0, {N}), target_logit = both.view(N, {N});
  crossentropy_vocab_shard_partials(sumexp, target_logit, logits, maxes, targets, begin);
  comm_.all_reduce(both, ReduceOp::Sum, "cross-entropy sum");
  crossentropy_vocab_shard_finish(losses, probs, logits, maxes, sumexp, target_logit);
  // TODO(lab05-5) END
}

void MegatronPoints::cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) {
  [[maybe_unused]] const int64_t Vl = probs.size(-1), begin = static_cast<int64_t>(rank()) * Vl;
  // TODO(lab05-5) BEGIN  the gradient of this rank's columns of the logits
  crossentropy_vocab_shard_backward(dlogits, probs, targets, begin, dloss);
  // TODO(lab05-5) END
}

// =============================================================================================
// Sequence parallelism: the token rows split across the group outside the column -> row regions
// =============================================================================================
void MegatronPoints::sp_gather_forward(const Tensor& x_shard, Tensor& x_full) {
  // TODO(lab05-6) BEGIN  before a column-parallel region: every rank's rows
  comm_.all_gather(x_shard, x_full, "sp gather");
  // TODO(lab05-6) END
}

void MegatronPoints::sp_gather_backward(const Tensor& dx_full, Tensor& dx_shard) {
  // TODO(lab05-6) BEGIN  its backward: each rank's rows of the summed gradient
  comm_.reduce_scatter(dx_full, dx_shard, ReduceOp::Sum, "sp gather backward");
  // TODO(lab05-6) END
}

void MegatronPoints::sp_scatter_forward(const Tensor& y_full, Tensor& y_shard, const Tensor* bias) {
  // TODO(lab05-6) BEGIN  after a row-parallel linear: this rank's rows of the sum, then the bias once
  comm_.reduce_scatter(y_full, y_shard, ReduceOp::Sum, "sp scatter");
  if (bias != nullptr) add_bias_(y_shard, *bias);
  // TODO(lab05-6) END
}

void MegatronPoints::sp_scatter_backward(const Tensor& dy_shard, Tensor& dy_full) {
  // TODO(lab05-6) BEGIN  its backward
  comm_.all_gather(dy_shard, dy_full, "sp scatter backward");
  // TODO(lab05-6) END
}

void sync_replicated_grads(GPT2& model, MegatronPoints& points) {
  if (!model.shard().sequence_parallel) return;  // every replicated gradient is whole already
  // TODO(lab05-7) BEGIN  the replicated gradients that sequence parallelism leaves partial
  for (const ParamInfo& p : model.param_table()) {
    if (p.name.find("ln_") == std::string::npos) continue;  // ln_1, ln_2, ln_f: weight and bias
    Tensor g = model.grad(p.name);
    points.group().all_reduce(g, ReduceOp::Sum, "replicated " + p.name);
  }
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
  model.zero_grad();
  double loss = 0.0;
  for (const MicroBatch& mb : micro_batches) {
    loss += model.forward(mb.inputs, &mb.targets);
    model.backward();
  }
  const int m = static_cast<int>(micro_batches.size());
  if (m > 1)
    for (int u = 0; u < model.num_units(); ++u)
      if (model.owns_unit(u)) scale_(model.unit_grads(u), 1.0f / static_cast<float>(m));
  sync_replicated_grads(model, points);
  if (dp_group != nullptr && dp_group->size() > 1) average_over_replicas(model, *dp_group);
  r.grad_norm = clip_grad_norm(model, grad_clip, {&points.group()});
  optimizer.step(lr);
  r.loss = static_cast<float>(loss / m);
  // TODO(lab05-8) END
  return r;
}

}  // namespace SL_TRACK_LAB05
}  // namespace scalelab::lab05
