// context_parallel_lab.cpp — lab 10: context parallelism, ring attention (Liu et al. 2023, arXiv:2310.01889)
// and its all-gather variant (Llama 3, Dubey et al. 2024, Sec. 3.3.2): the point where a model split along the
// sequence talks, over the context-parallel group. Declared in labs/10_context_parallel/context_parallel_lab.h;
// the lesson is labs/10_context_parallel/README.md. Only the code between TODO(lab10-N) BEGIN/END is yours to
// write. The code around it (constructors, chunks_of, the row copies, average_grads) is given once, in
// labs/10_context_parallel/cp_given.cpp, and compiled into both tracks.
#include <algorithm>  // defines: std::max, std::min
#include <utility>    // defines: std::swap

#include "context_parallel_lab.h"
#include "scalelab/comm/host_values.h"  // defines: all_reduce_value (the group's mean loss)
#include "scalelab/core/error.h"        // defines: SL_CHECK, SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/model/optim.h"       // defines: clip_grad_norm (with groups)
#include "scalelab/ops/ops.h"  // defines: attention_forward_block, attention_backward_block, attention_merge, scale_

namespace scalelab::lab10 {
inline namespace SL_TRACK_LAB10 {

// =============================================================================================
// The layout
// =============================================================================================
Layout make_layout(const GPTConfig& cfg, int world_size, int rank, int tp, int cp, bool zigzag, int seq_len) {
  Layout l;
  // TODO(lab10-1) BEGIN  this rank's place in the layout, or a clear error on every rank
  //   Where this rank sits in the tp x cp x dp grid (tp fastest, then cp), its tokens per sequence, and every
  //   layout that cannot work (the ranks, the model's split by tp, the sequence) refused with the numbers and what
  //   to change. README.md#the-layout and README.md#with-tensor-parallelism
  throw scalelab::NotImplemented("lab10-1 make_layout");
  // TODO(lab10-1) END
  return l;
}

// =============================================================================================
// Which blocks to compute
// =============================================================================================
int64_t visible_pairs(const CpChunk& q, const CpChunk& kv) {
  int64_t pairs = 0;
  // TODO(lab10-2) BEGIN  the causal mask's query-key pairs between two chunks, by absolute positions
  //   Query at position p sees the keys at positions <= p. Count, for the chunks' absolute positions, how many
  //   (query, key) pairs survive: a whole block, a triangle, or none. README.md#the-causal-imbalance-and-the-zig-zag
  throw scalelab::NotImplemented("lab10-2 visible_pairs");
  // TODO(lab10-2) END
  return pairs;
}

// =============================================================================================
// The ring
// =============================================================================================
void RingAttention::attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                                      const std::vector<CpChunk>& chunks) {
  work_ = CpWork{};
  // TODO(lab10-3) BEGIN  this rank's queries against every rank's keys and values, one block per ring step
  //   cp steps: at each, start handing the kv block in hand to rank r+1 (and receiving r-1's), compute this
  //   rank's query chunks against the chunks of the block's owner (chunks_of), skip what the mask hides, merge
  //   each partial result by its lse, then wait for the transfer (overlap_ false: wait before computing; see the
  //   constructor in context_parallel_lab.h). Count work_ as you go. out and lse arrive holding whatever the
  //   model's buffers held: on return every row of both is this rank's final result. README.md#the-ring
  throw scalelab::NotImplemented("lab10-3 RingAttention::attention_forward");
  // TODO(lab10-3) END
}

void RingAttention::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                       const Tensor& lse, int NH, const std::vector<CpChunk>& chunks) {
  // TODO(lab10-4) BEGIN  dq here; dk, dv travel round the ring with their kv block and home again
  //   The same ring of kv blocks; each block's dk, dv accumulate the share of every rank that held it, travelling
  //   with it, and must end on the rank that owns those keys. dq never leaves. README.md#the-ring-backward
  throw scalelab::NotImplemented("lab10-4 RingAttention::attention_backward");
  // TODO(lab10-4) END
}

// =============================================================================================
// The all-gather variant
// =============================================================================================
void AllGatherAttention::attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                                           const std::vector<CpChunk>& chunks) {
  work_ = CpWork{};
  // TODO(lab10-5) BEGIN  gather every rank's kv (B, Tl, 2C) into (cp, B, Tl, 2C), then every block at once
  //   One all-gather brings every rank's kv block; then the same blocks as the ring's, merged.
  //   README.md#ring-or-all-gather
  throw scalelab::NotImplemented("lab10-5 AllGatherAttention::attention_forward");
  // TODO(lab10-5) END
}

void AllGatherAttention::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                            const Tensor& lse, int NH, const std::vector<CpChunk>& chunks) {
  // TODO(lab10-5) BEGIN  every owner's dk, dv from this rank's queries, summed at the owner by a reduce-scatter
  //   Each owner's dk, dv are the sum over every rank's queries: which collective ends with that sum on the owner
  //   alone? README.md#ring-or-all-gather
  throw scalelab::NotImplemented("lab10-5 AllGatherAttention::attention_backward");
  // TODO(lab10-5) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(GPT2& model, Optimizer& optimizer, Communicator* tp_group, Communicator& cp_group,
                      Communicator* dp_group, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  SL_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  StepResult r;
  // TODO(lab10-6) BEGIN  one optimizer step of a context-parallel shard
  //   This rank's slice of each whole sequence (slice_sequence, the model's cp_chunks), forward and backward per
  //   micro-batch, then the gradient and the loss of the WHOLE sequences and of every replica, clipped on the
  //   WHOLE model's norm (every tp shard's part of it). README.md#one-training-step, README.md#with-tensor-parallelism
  throw scalelab::NotImplemented("lab10-6 train_step");
  // TODO(lab10-6) END
  return r;
}

}  // namespace SL_TRACK_LAB10
}  // namespace scalelab::lab10
