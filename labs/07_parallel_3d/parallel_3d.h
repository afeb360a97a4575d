// parallel_3d.h — what the learner writes in lab 07 (3D parallelism), declared once for both tracks.
//   labs/07_parallel_3d/parallel_3d.cpp       the learner's file (TODO blocks)   -> lab07_learner
//   solutions/07_parallel_3d/parallel_3d.cpp  the reference (same file, filled)  -> lab07_ref
//   labs/07_parallel_3d/rank_3d.cpp           the given code (build_rank, the grid's words, forward_loss):
//                                             compiled into both libraries, each calling its own track's TODOs
// The two tracks live in distinct inline namespaces (scalelab::lab07::learner / ::ref) chosen by
// SL_TRACK_LAB07, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/07_parallel_3d/README.md   Graded tests: tests/lab07/ (test_lab07*.cpp)
//
// Tensor, pipeline and data parallelism at once (Narayanan et al. 2021, arXiv:2104.04473, Sec. 3: "PTD-P"):
// the world's ranks form a grid tp x pp x dp. Each pipeline stage is split across a tensor-parallel group
// (lab 05's points), the stages run lab 06's schedules, and the whole tp x pp model is replicated dp times
// with gradients averaged across the replicas (lab 03), or their optimizer state sharded across them
// (ZeRO-1, lab 04). Labs 04, 05 and 06 are linked from their REFERENCE (solutions/), so a gap there does not
// block this lab. What you write:
//   coordinates          a rank's (tp, pp, dp) from its rank and the order of the axes         TODO lab07-1
//   group members        the ranks of its tp, pp, dp and embedding groups                      TODO lab07-2
//   the layout           the grid checked (sizes, the model, the placement rule)               TODO lab07-3
//   the communicators    the four groups, split from the world                                TODO lab07-4
//   data parallel        every gradient averaged across the replicas                           TODO lab07-5
//   the training step    one optimizer step of the tp x pp x dp model                         TODO lab07-6
//   ZeRO-1 (optional)    the replicas shard the optimizer state instead (lab 04's functions)   TODO lab07-7
// (README.md#the-picture draws the 2 x 2 x 2 grid.)
// A fourth axis, given (README.md#a-fourth-axis-context-parallel): --cp N splits every sequence across N ranks
// with lab 10's REFERENCE ring attention (the zig-zag), the grid becoming tp x cp x pp x dp. Your functions
// above serve it unchanged: coords_of, rank_of and group_members loop over parse_order's four axes, and
// build_rank (given) adds the ring's group and trades your dp group for the cp x dp one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp.h"  // defines: lab04::FsdpState, reduce_scatter_grads_async, optimizer_step (lab 04's reference)
#include "pipeline_parallel.h"  // defines: lab06::PipelineLayout, Stage, StageExchange, ScheduleKind (lab 06's reference)
#include "scalelab/comm/comm.h"       // defines: Communicator
#include "scalelab/comm/rank_grid.h"  // defines: GridAxis, GridCoords (the types; the arithmetic is yours here)
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/model/batch.h"     // defines: MicroBatch, StepResult
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig, ModelShard
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig
#include "context_parallel_lab.h"     // defines: lab10::RingAttention (lab 10's reference: the fourth axis)
#include "tensor_parallel.h"          // defines: lab05::MegatronPoints (lab 05's reference)

#ifndef SL_TRACK_LAB07
#define SL_TRACK_LAB07 ref
#endif

namespace scalelab::lab07 {
inline namespace SL_TRACK_LAB07 {

// ---------------------------------------------------------------------------------------------
// The grid, as pure arithmetic (no communicator: tests and tables can use it for any world size)

// The sizes of the axes and their order: the axes listed from FASTEST- to SLOWEST-varying, joined by
// '-' ("tp-dp-pp": consecutive ranks differ in tp_rank first; Megatron-LM's RankGenerator orders the same
// way, megatron/core/parallel_state.py). README.md#coordinates. cp (context parallel, the given fourth axis:
// README.md#a-fourth-axis-context-parallel) is 1 unless the run splits the sequence; an order may name it
// ("tp-cp-dp-pp") or leave it out, which places it right after tp (Megatron-LM's default "tp-cp-ep-dp-pp").
struct Grid {
  int tp = 1, pp = 1, dp = 1;
  std::string order = "tp-dp-pp";
  int cp = 1;                     // after order: {tp, pp, dp, order} still reads as before
  int size(GridAxis axis) const;  // tp, pp, dp or cp
  int world_size() const { return tp * cp * pp * dp; }
  // "tp 2 x pp 2 x dp 2 (order tp-dp-pp)"; with cp > 1 "tp 2 x cp 2 x pp 2 x dp 1 (order tp-cp-dp-pp)"
  std::string describe() const;
};

// Given. The order parsed, fastest axis first, always four axes: "tp-dp-pp" -> {TP, CP, DP, PP} (cp right
// after tp when the order leaves it out; a size-1 axis changes no rank), "tp-cp-dp-pp" -> the same. Throws
// scalelab::Error naming the order, with a hint, unless it is a permutation of tp, pp and dp with cp at most
// once.
std::vector<GridAxis> parse_order(const std::string& order);

// TODO(lab07-1): the coordinates of `rank` (0 <= rank < g.world_size()) in the grid's order (Grid above:
// the first axis of g.order varies fastest), and the inverse: rank_of(g, coords_of(g, r)) == r for every
// rank, every coordinate in 0 .. its axis' size - 1. README.md#coordinates
GridCoords coords_of(const Grid& g, int rank);
int rank_of(const Grid& g, const GridCoords& c);

// TODO(lab07-2): the world ranks of `rank`'s group along `axis` (the ranks whose other coordinates equal
// its own), ordered by the coordinate along `axis` (0 first). And the world ranks of its embedding group,
// the copies of the tied wte whose gradients must add up (README.md#the-tied-embedding), first stage first;
// empty for a rank that holds no copy. Example, 2 x 2 x 2 in tp-dp-pp: rank 5's dp group is {5, 7}, its
// embedding group {1, 5}. README.md#the-groups (its table says who is in each group for every pp)
std::vector<int> group_members(const Grid& g, GridAxis axis, int rank);
std::vector<int> embedding_members(const Grid& g, int rank);

// ---------------------------------------------------------------------------------------------
// The layout of one rank

struct Layout {
  Grid grid;
  GridCoords coords;               // this rank's
  int ranks_per_node = 0;          // the (simulated) node size: node = world rank / ranks_per_node; 0: one node
  lab06::PipelineLayout pipeline;  // p = grid.pp, v, m, schedule; stage = coords.pp_rank
};

// TODO(lab07-3): the layout of `rank` of `world_size`, or a clear error (scalelab::Error, the numbers and what
// to change) thrown alike on every rank before any communication for every layout that cannot run: an
// order or grid sizes that do not make world_size ranks, a model that does not split by tp or by pp (labs
// 05 and 06 know their own rules), and, when `placement_rule` is asked for with ranks_per_node > 0, a
// layout that breaks the placement rule of README.md#the-layout (no tensor-parallel group spans nodes).
Layout make_layout(const GPTConfig& cfg, const Grid& grid, int world_size, int rank, lab06::ScheduleKind schedule,
                   int m, int v, int ranks_per_node, bool placement_rule);

// Given. The shard of chunk `chunk` of this rank: lab 06's layers of its virtual stage, lab 05's slice
// tp_rank of tp of each of them (no sequence parallelism in this lab).
ModelShard chunk_shard(const GPTConfig& cfg, const Layout& layout, int chunk);

// ---------------------------------------------------------------------------------------------
// The communicators

// This rank's four groups. tp, pp, dp: never null (a group of one rank where the axis has size 1);
// embedding: null on a middle stage. Each is a Communicator named after its group ("tp", "pp", "dp",
// "embedding"), its rank the coordinate along its axis (tp->rank() == coords.tp_rank; the embedding group:
// first stage 0, last stage 1).
// With context parallel (grid.cp > 1; README.md#a-fourth-axis-context-parallel) build_rank (given) adds cp,
// the ring's group ("cp": the ranks differing only in cp_rank, its rank cp_rank), and REPLACES dp by the
// gradient group of every rank holding the same parameters: the cp x dp ranks with this rank's tp_rank and
// pp_rank ("dp-cp", Megatron-LM's data-parallel group with context parallelism; its rank
// cp_rank + cp * dp_rank). Their slices of the sequences are equally long, so the mean over it of the
// gradients and of the loss is the global batch's mean, and ZeRO-1 shards over it. cp 1: cp is null and dp
// is make_groups' own.
struct Groups {
  std::unique_ptr<Communicator> tp, pp, dp, embedding;
  std::unique_ptr<Communicator> cp;  // set by build_rank when grid.cp > 1 (else null), never by make_groups
};
// TODO(lab07-4): the groups of layout's rank, split from `world` (whose rank is the grid rank). Collective:
// every rank of world calls it, with the same layout sizes. The links follow world's topology (set it
// before). README.md#the-groups
Groups make_groups(Communicator& world, const Layout& layout);

// ---------------------------------------------------------------------------------------------
// Everything one rank holds (given), and the step

// One rank of a 3D-parallel run: its layout and groups, lab 05's points over its tp group, its v chunks
// (each a GPT2 built for chunk_shard, the dense model's slices, with the points installed), and lab 06's
// Stage and StageExchange over its pp group. Then either an optimizer per chunk (plain data parallel) or,
// with ZeRO-1, per chunk lab 04's state of ONE rank of the dp group: each unit's parameters and gradients in
// a buffer padded to dp equal shards (the model's unit buffers are views of it), and the optimizer state
// of this rank's shard only.
struct Rank3D {
  Layout layout;
  Groups groups;
  std::unique_ptr<lab05::MegatronPoints> points;
  std::unique_ptr<lab10::RingAttention> ring;  // cp > 1: lab 10's reference ring over groups.cp (else null)
  std::vector<std::unique_ptr<GPT2>> models;
  std::vector<std::unique_ptr<Optimizer>> optimizers;    // plain data parallel (empty with ZeRO-1)
  std::vector<std::unique_ptr<lab04::FsdpState>> zero1;  // ZeRO-1: one per chunk (empty without)
  std::unique_ptr<lab06::Stage> stage;
  std::unique_ptr<lab06::StageExchange> exchange;
};
// Given. Builds this rank's part: make_groups (collective over world), the chunks, the stage and the
// exchange (collective over the pp group), and the optimizers or (zero1) the ZeRO-1 states over the dp group.
// grid.cp > 1: check_context_parallel's refusals first, then (collective over world) the "cp" and "dp-cp"
// groups of Groups, and on every chunk flash attention with lab 10's reference RingAttention (zig-zag) over
// the cp group.
std::unique_ptr<Rank3D> build_rank(Communicator& world, const GPTConfig& cfg, const Layout& layout,
                                   const OptimizerConfig& optimizer, const PrecisionPolicy& policy, Device device,
                                   uint64_t seed, bool zero1 = false);
// Given. The sum of squares of this rank's part of the WHOLE model's gradient, read from ZeRO-1 shards: the
// elements of each unit's grad_shard that are real parameters (ShardLayout::owned), except the
// tp-replicated ones on tp ranks other than 0 and the last stage's copy of wte (grad_sum_squares' rules,
// applied to this rank's shards).
double zero1_sum_squares(const lab04::FsdpState& s);

// TODO(lab07-5): every gradient of every chunk of this rank becomes its average over the data-parallel
// replicas (`dp`: this rank's dp group; size 1: nothing to do). README.md#data-parallel-on-top
void average_over_dp(lab06::Stage& stage, Communicator& dp);

// TODO(lab07-6): one optimizer step of the 3D-parallel model over this replica's m micro-batches (each
// (B, T) i32 inputs and targets; every rank of one replica, all its stages and tensor-parallel ranks, gets
// the same ones; with the given fourth axis cp > 1, each rank its cp_slices of them, and r.groups.dp is the
// cp x dp group: README.md#a-fourth-axis-context-parallel), with lab 06's schedule over lab 05's tensor-parallel stages. Contract: every chunk takes
// one optimizer step at lr on the gradient of the GLOBAL batch's mean loss (every replica's micro-batches),
// the dense model's, the tied wte's copies kept equal, clipped on the WHOLE model's norm (grad_clip <= 0:
// none; clip_grad_norm's clipping, scalelab/model/optim.h); with ZeRO-1 (r.zero1 not empty) the update is
// zero1_update's. Returns the loss of the global batch (the mean over the micro-batches and the replicas)
// and the norm before clipping, the same on every rank. README.md#one-training-step
StepResult train_step(Rank3D& r, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip);

// TODO(lab07-7): ZeRO-1 (Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 5.1) across the dp group, called
// once the tied embedding is synced. Contract: every chunk's parameters take the update plain data
// parallel would make (the replicas' mean gradient, clipped on the whole model's norm; grad_clip <= 0:
// none), computed with lab 04's functions on each chunk's state, every replica keeping only its shard's
// optimizer state, and the new parameters whole again on every replica. Returns the norm before clipping,
// the same on every rank. README.md#zero-1-across-the-replicas
float zero1_update(Rank3D& r, float lr, float grad_clip);

// Given. What the fourth axis refuses, thrown alike on every rank before any collective (scalelab::Error with
// the numbers and a hint): cp < 1, or (cp > 1) sequences of seq_len tokens that the zig-zag cannot cut into
// 2 cp equal chunks, or longer than the model's max_seq_len. Lab 07 has no sequence parallelism (the
// tensor-parallel points run without it) and build_rank sets flash attention itself, the two other
// conditions of lab 10's ring. seq_len 0: only cp is checked (build_rank, before the sequences are known).
void check_context_parallel(const GPTConfig& cfg, const Grid& grid, int seq_len);

// Given. This rank's cp slice of each of a replica's micro-batches: the (B, T) i32 inputs and targets of the
// WHOLE sequences -> the (B, T / cp) tokens its chunks hold (lab10::slice_sequence with the model's
// cp_chunks: zig-zag chunks cp_rank and 2 cp - 1 - cp_rank). cp 1: the micro-batches themselves. What
// train_step takes with cp > 1 (the pipeline's stages then exchange (B, T / cp, C) activations). Throws as
// check_context_parallel for a T it cannot cut.
std::vector<MicroBatch> cp_slices(const Rank3D& r, const std::vector<MicroBatch>& whole);

// Given. The loss (nats per token) of one batch (tokens, targets: (B, T) i32, the WHOLE sequences) through
// this replica's pipeline, forward only (lab06::forward_loss; cp > 1: on this rank's cp slice), averaged over
// the dp group (the replicas, each passing its own batch; with cp > 1 the cp x dp group, the slices too): the
// same on every rank. Collective over the replica and the dp group.
float forward_loss(Rank3D& r, const Tensor& tokens, const Tensor& targets);

}  // namespace SL_TRACK_LAB07
}  // namespace scalelab::lab07
