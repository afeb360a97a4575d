// context_parallel_lab.h — what the learner writes in lab 10 (context parallel), declared once for both tracks.
//   labs/10_context_parallel/context_parallel_lab.cpp       the learner's file (TODO blocks)   -> lab10_learner
//   solutions/10_context_parallel/context_parallel_lab.cpp  the reference (same file, filled)  -> lab10_ref
//   labs/10_context_parallel/cp_given.cpp                   the given code (shard_of, split_groups, the
//                                                           constructors, the row copies): both libraries
// The two tracks live in distinct inline namespaces (scalelab::lab10::learner / ::ref) chosen by
// SL_TRACK_LAB10, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/10_context_parallel/README.md   Graded tests: tests/lab10/ (test_lab10*.cpp)
//
// The model (common/include/scalelab/model/gpt2.h) knows how to hold a slice of every sequence: built for a
// ModelShard with cp_size ranks, rank cp_rank holds the positions cp_chunks names (one contiguous slice, or
// two zig-zag chunks), its parameters (whole, or its tensor-parallel slice with tp > 1: lab 05's split and
// lab 05's reference points), and calls the context-parallel point of scalelab/model/context_parallel.h in
// place of attention, on its NH/tp local heads. This lab implements that point over the context-parallel
// group, twice, and the step around it:
//   the layout               tp x cp x dp ranks, tp fastest then cp, the checks           TODO lab10-1
//   which blocks to compute  the causal mask between two chunks, and its work            TODO lab10-2
//   the ring, forward        kv blocks passed round the group while computing, merged     TODO lab10-3
//   the ring, backward       dq kept, dk dv travelling round the ring back to the owner   TODO lab10-4
//   the all-gather variant   every kv gathered at once (Llama 3), dkv reduce-scattered    TODO lab10-5
//   the training step        the cp group (and the dp replicas) average the gradients,    TODO lab10-6
//                            the norm summed over the tp group
#pragma once

#include <cstdint>
#include <memory>  // defines: std::unique_ptr
#include <vector>

#include "scalelab/comm/comm.h"               // defines: Communicator
#include "scalelab/model/batch.h"             // defines: MicroBatch, StepResult
#include "scalelab/model/context_parallel.h"  // defines: ContextParallel (the point), CpChunk, cp_chunks
#include "scalelab/model/gpt2.h"              // defines: GPT2, GPTConfig, ModelShard (gpt2_layout.h's, included)
#include "scalelab/model/optim.h"             // defines: Optimizer

#ifndef SL_TRACK_LAB10
#define SL_TRACK_LAB10 ref
#endif

namespace scalelab::lab10 {
inline namespace SL_TRACK_LAB10 {

// TODO(lab10-1): the layout of a lab 10 run on `world_size` ranks as a tp x cp x dp grid, tp fastest, then
// cp (the order of Megatron-LM and of lab 09's planner): rank = tp_rank + tp * (cp_rank + cp * dp_rank).
// Tensor-parallel groups of `tp` consecutive ranks (they talk in every layer's forward AND backward: the
// innermost, inside a node), context-parallel groups of `cp` ranks with the same tp_rank in the same replica
// (the ring of each tp_rank's heads), world_size / (tp cp) data-parallel replicas of the tp x cp block; each sequence of seq_len
// tokens split into T_local = seq_len / cp per rank. Throws scalelab::Error, with the numbers and a hint,
// unless tp >= 1, 1 <= cp, tp cp <= world_size and divides it, the model splits by tp (NH, 4C and V:
// ModelShard::validate's rules), cp divides seq_len (2 cp with the zig-zag: two chunks per rank), and
// seq_len <= cfg.max_seq_len: the same on every rank, before any collective, so no rank hangs.
// README.md#the-layout and README.md#with-tensor-parallelism
struct Layout {
  int tp = 1, cp = 1, dp = 1;
  int tp_rank = 0, cp_rank = 0, dp_rank = 0;
  bool zigzag = false;  // the sequence in 2 cp chunks, rank r holding chunks r and 2cp-1-r
  int T_local = 0;      // tokens of each sequence on this rank
};
Layout make_layout(const GPTConfig& cfg, int world_size, int rank, int tp, int cp, bool zigzag, int seq_len);
// Given. The shard this rank's model is built for: cp_rank of cp, the zig-zag as the layout says; tp_rank
// of tp, each block tensor cut by lab 05's reference split (lab05::block_split) when tp > 1.
ModelShard shard_of(const Layout& layout);
// Given. This rank's three groups, split from `world` (whose rank is the layout's rank) by the layout: a group
// is the ranks that share the other two coordinates, its rank the coordinate along its own axis. tp: tp
// consecutive ranks; cp: the same tp_rank in one replica (the ring); dp: the same tp_rank and cp_rank.
// Collective over world: every rank calls it, in the same order.
struct Groups {
  std::unique_ptr<Communicator> tp, cp, dp;
};
Groups split_groups(Communicator& world, const Layout& layout);

// TODO(lab10-2): the query-key pairs of query chunk q against key chunk kv that the causal mask lets through
// (key position <= query position, by ABSOLUTE positions in the whole sequence): 0 for a block wholly in the
// queries' future, which the ring skips without calling the block op; q.length x kv.length for a block wholly
// in their past; the triangle on the diagonal. The ranks' sums of it are their attention work.
// README.md#the-causal-imbalance-and-the-zig-zag
int64_t visible_pairs(const CpChunk& q, const CpChunk& kv);

// What a context-parallel point did in its last forward, for the checks and the driver.
struct CpWork {
  int64_t pairs = 0;        // query-key pairs of the blocks computed (visible_pairs summed; per sequence, head)
  int blocks_computed = 0;  // block-op calls of the forward
  int blocks_skipped = 0;   // fully masked blocks not computed
};

// The ring (Liu et al. 2023, "Ring Attention", arXiv:2310.01889, Sec. 3) over one context-parallel group
// (comm: its communicator, cp = comm.size(); rank r sends to r+1 and receives from r-1, mod cp). Every
// method is a collective of the group. Shapes as in scalelab/model/context_parallel.h. Tensors in host
// memory: --device cpu or sim.
class RingAttention : public ContextParallel {
 public:
  // overlap false: in the forward AND the backward, every kv block's transfer is waited for right after it is
  // posted, BEFORE the computation on the block in hand starts (what the ring would cost without overlap: the
  // measurement README.md#what-the-numbers-show and the check lab10.ring_overlaps_transfers compare). Either
  // way, each dkv can only leave once this rank's share is added.
  RingAttention(Communicator& cp_group, const GPTConfig& cfg, bool zigzag, bool overlap = true);
  Communicator& group() { return comm_; }
  const CpWork& work() const { return work_; }
  // Given. The chunks of group rank `owner` for slices of T_local tokens (cp_chunks of its shard).
  std::vector<CpChunk> chunks_of(int owner, int T_local) const;

  // TODO(lab10-3): the ring's forward. README.md#the-ring
  void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                         const std::vector<CpChunk>& chunks) override;
  // TODO(lab10-4): the ring's backward. README.md#the-ring-backward
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          int NH, const std::vector<CpChunk>& chunks) override;

 private:
  Communicator& comm_;
  GPTConfig cfg_;
  bool zigzag_, overlap_;
  CpWork work_;
};

// The all-gather variant (Llama 3, Dubey et al. 2024, Sec. 3.3.2): every rank gathers the keys and values of
// the whole sequence in one collective, computes its queries against them, and in the backward gives each
// owner the sum of its dk, dv in one reduce-scatter. Same contract as RingAttention.
class AllGatherAttention : public ContextParallel {
 public:
  AllGatherAttention(Communicator& cp_group, const GPTConfig& cfg, bool zigzag);
  Communicator& group() { return comm_; }
  const CpWork& work() const { return work_; }
  std::vector<CpChunk> chunks_of(int owner, int T_local) const;  // given, as RingAttention's

  // TODO(lab10-5): gather, compute, merge; the backward's reduce-scatter. README.md#ring-or-all-gather
  void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                         const std::vector<CpChunk>& chunks) override;
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          int NH, const std::vector<CpChunk>& chunks) override;

 private:
  Communicator& comm_;
  GPTConfig cfg_;
  bool zigzag_;
  CpWork work_;
};

// TODO(lab10-6): one optimizer step of this rank's shard. micro_batches: the WHOLE sequences (B, T) of each
// micro-step, the same on every rank of the cp group (and of the tp group); this rank trains on its slice of
// each (slice_sequence with the model's cp_chunks; T_local = T / model.shard().cp_size, the model knows its
// shard, no layout is passed). Groups: `tp_group` (nullptr or size 1: none) holds the
// other tensor-parallel slices of the same tokens; `cp_group` and `dp_group` (nullptr or size 1: none) hold
// ranks of this rank's tp_rank only, so their averages are of this tp shard's gradients. Contract: on return
// every parameter has taken one step of `optimizer` at `lr` on the gradient of the step's mean loss over the
// m micro-batches, the whole sequences and the replicas' batches, that gradient equal on every rank of the cp
// and dp groups and clipped to a WHOLE-model norm (the tp shards' parts added: scalelab/model/optim.h) of at
// most grad_clip (<= 0: no clipping). Returns the loss of this replica's WHOLE sequences (the mean over the
// m micro-batches and the cp group, the same on every rank of the tp x cp block; the training loop averages
// it over the replicas, as in lab 03) and the whole model's gradient norm before clipping.
// README.md#one-training-step and README.md#with-tensor-parallelism
StepResult train_step(GPT2& model, Optimizer& optimizer, Communicator* tp_group, Communicator& cp_group,
                      Communicator* dp_group, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip);

// ---- Given: row copies of (B, T, W) tensors in host memory (CPU or a simulated GPU) along the sequence, and
// the points' scratch tensors, on the tensors' device, category Workspace (cp_given.cpp)
// Rows [t0, t0 + n) of every sequence of x (B, T, W), channels [c0, c0 + w): a new (B, n, w) tensor.
Tensor seq_rows(const Tensor& x, int64_t t0, int64_t n, int64_t c0, int64_t w);
// x[:, t0:t0+n, c0:c0+w] += y (B, n, w).
void add_seq_rows(Tensor& x, const Tensor& y, int64_t t0, int64_t c0);
// lse (B, NH, T): positions [t0, t0 + n) -> (B, NH, n); and back, overwriting.
Tensor lse_rows(const Tensor& lse, int64_t t0, int64_t n);
void set_lse_rows(Tensor& lse, const Tensor& y, int64_t t0);
// A scratch tensor of zeros: an accumulator, a received block, a block's dkv.
Tensor scratch(const Shape& shape, Device device);
// A (B, NH, n) accumulator's lse: -inf everywhere (the log of the empty sum; attention_merge adds onto it).
Tensor minus_inf(const Shape& shape, Device device);
// The rank's slice of token ids (B, T) i32: its chunks' positions in its row order -> (B, T_local).
Tensor slice_sequence(const Tensor& tokens, const std::vector<CpChunk>& chunks, int T_local);
// Every gradient becomes its average over `group` (one all-reduce per unit the model owns).
void average_grads(GPT2& model, Communicator& group, const char* what);

}  // namespace SL_TRACK_LAB10
}  // namespace scalelab::lab10
