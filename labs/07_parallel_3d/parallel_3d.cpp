// parallel_3d.cpp — lab 07: 3D parallelism (tensor x pipeline x data; Narayanan et al. 2021,
// arXiv:2104.04473, Sec. 3). The ranks as a grid, the four groups every rank needs, and one training step
// that composes lab 05's tensor-parallel stages, lab 06's schedule and lab 03's data-parallel average.
// Declared in labs/07_parallel_3d/parallel_3d.h; the lesson is labs/07_parallel_3d/README.md. Only the code
// between TODO(lab07-N) BEGIN/END is yours to write; the rest is shared by both tracks
// (labs/07_parallel_3d/parallel_3d.cpp and solutions/07_parallel_3d/parallel_3d.cpp).
#include "parallel_3d.h"

#include <algorithm>  // defines: std::max, std::min
#include <cmath>      // defines: std::sqrt, std::isfinite
#include <string>     // defines: std::to_string

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value (the eval loss, any backend)
#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL, scalelab::NotImplemented
#include "scalelab/ops/ops.h"     // defines: scale_, cast, sum_squares

namespace scalelab::lab07 {
inline namespace SL_TRACK_LAB07 {

int Grid::size(GridAxis axis) const { return axis == GridAxis::TP ? tp : axis == GridAxis::PP ? pp : dp; }

std::string Grid::describe() const {
  return "tp " + std::to_string(tp) + " x pp " + std::to_string(pp) + " x dp " + std::to_string(dp) + " (order " +
         order + ")";
}

std::vector<GridAxis> parse_order(const std::string& order) {
  GridLayout probe;  // common's parser; its error names the order and lists good ones
  probe.order = order;
  return probe.axes();
}

// =============================================================================================
// Coordinates
// =============================================================================================
GridCoords coords_of(const Grid& g, int rank) {
  GridCoords c;
  // TODO(lab07-1) BEGIN  the digits of rank, the order's first axis the least significant
  //   The coordinates are the digits of `rank` in a mixed-radix number: one digit per axis, the order's first
  //   axis the least significant, each digit in 0 .. that axis' size - 1. README.md#coordinates
  throw scalelab::NotImplemented("lab07-1 coords_of");
  // TODO(lab07-1) END
  return c;
}

int rank_of(const Grid& g, const GridCoords& c) {
  int rank = 0;
  // TODO(lab07-1) BEGIN  the inverse
  //   The number whose digits are c's coordinates, in the order's radix: coords_of's inverse.
  throw scalelab::NotImplemented("lab07-1 rank_of");
  // TODO(lab07-1) END
  return rank;
}

// =============================================================================================
// The groups, as lists of ranks
// =============================================================================================
std::vector<int> group_members(const Grid& g, GridAxis axis, int rank) {
  std::vector<int> members;
  // TODO(lab07-2) BEGIN  the ranks that differ from `rank` only along `axis`, by that coordinate
  //   Keep rank's other two coordinates, run the coordinate along `axis` over its range. README.md#the-groups
  throw scalelab::NotImplemented("lab07-2 group_members");
  // TODO(lab07-2) END
  return members;
}

std::vector<int> embedding_members(const Grid& g, int rank) {
  std::vector<int> members;
  // TODO(lab07-2) BEGIN  the first and the last stage of rank's pipeline, or nothing on a middle stage
  //   The ranks that hold a copy of the tied wte in rank's pipeline (same tp and dp coordinates), first stage
  //   first. README.md#the-tied-embedding
  throw scalelab::NotImplemented("lab07-2 embedding_members");
  // TODO(lab07-2) END
  return members;
}

// =============================================================================================
// The layout
// =============================================================================================
Layout make_layout(const GPTConfig& cfg, const Grid& grid, int world_size, int rank, lab06::ScheduleKind schedule,
                   int m, int v, int ranks_per_node, bool placement_rule) {
  Layout l;
  // TODO(lab07-3) BEGIN  this rank's layout, or the same clear error on every rank
  //   Every layout that cannot run, refused with the numbers and what to change, the same on every rank, before
  //   any message: the grid's sizes against the ranks, the model against tp and pp (labs 05 and 06 know how to
  //   check their part), and, when asked, the placement rule for EVERY tensor-parallel group. README.md#the-layout
  throw scalelab::NotImplemented("lab07-3 make_layout");
  // TODO(lab07-3) END
  return l;
}

ModelShard chunk_shard(const GPTConfig& cfg, const Layout& layout, int chunk) {
  ModelShard s = lab06::chunk_shard(cfg, layout.pipeline, chunk);  // its layers, embedding, head
  s.tp_rank = layout.coords.tp_rank;                                // and lab 05's slice of each
  s.tp_size = layout.grid.tp;
  return s;
}

// =============================================================================================
// The communicators
// =============================================================================================
Groups make_groups(Communicator& world, const Layout& layout) {
  Groups g;
  // TODO(lab07-4) BEGIN  four splits of world, in the same order on every rank
  //   One split of world per group; a split's color names the group, its key orders the ranks inside it.
  //   Every rank calls every split, in the same order, even the ones it does not join. README.md#the-groups
  throw scalelab::NotImplemented("lab07-4 make_groups");
  // TODO(lab07-4) END
  return g;
}

namespace {

// Lab 04's ZeRO-1 state of one chunk on this rank of the dp group, built around the chunk's own buffers as
// lab04::FSDP builds it around a dense model: per owned unit, its parameters and gradients moved into
// buffers padded to dp equal shards (the model's unit buffers become views of their first n elements),
// this rank's shard of each a view, and the optimizer state (AdamW's m and v; the fp32 master copy under
// a 16-bit policy) of that shard only. A unit the chunk does not own gets an empty layout.
std::unique_ptr<lab04::FsdpState> make_zero1_state(GPT2& model, Communicator& dp, const OptimizerConfig& oc) {
  auto s = std::make_unique<lab04::FsdpState>(
      lab04::FsdpState{model, dp, lab04::ZeroStage::Zero1, oc, /*prefetch=*/0, /*optimizer_steps=*/0, {}, {}});
  s->units.resize(model.num_units());
  const Device device = model.device();
  for (int u = 0; u < model.num_units(); ++u) {
    lab04::UnitShard& us = s->units[u];
    if (!model.owns_unit(u)) {
      us.keep_gathered = false;  // nothing to gather, update or reduce
      continue;
    }
    us.layout = lab04::shard_layout(model.unit_params(u).numel(), dp.rank(), dp.size());
    const lab04::ShardLayout& l = us.layout;
    us.full_params = Tensor::zeros({l.padded}, model.unit_params(u).dtype(), device, MemCategory::Params);
    us.full_params.view(0, {l.numel}).copy_from(model.unit_params(u));  // padding stays 0
    model.unit_params(u) = us.full_params.view(0, {l.numel});           // the chunk's own buffer is freed
    us.param_shard = us.full_params.view(l.begin, {l.shard});
    us.full_grads = Tensor::zeros({l.padded}, DType::F32, device, MemCategory::Grads);
    model.unit_grads(u) = us.full_grads.view(0, {l.numel});
    us.grad_shard = us.full_grads.view(l.begin, {l.shard});
    if (oc.kind == OptimizerConfig::Kind::AdamW) {
      us.m = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
      us.v = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
    }
    if (model.policy().has_master_copy()) {
      us.master = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
      cast(us.master, us.param_shard);
    }
  }
  return s;
}

}  // namespace

std::unique_ptr<Rank3D> build_rank(Communicator& world, const GPTConfig& cfg, const Layout& layout,
                                   const OptimizerConfig& optimizer, const PrecisionPolicy& policy, Device device,
                                   uint64_t seed, bool zero1) {
  auto r = std::make_unique<Rank3D>();
  r->layout = layout;
  r->groups = make_groups(world, layout);  // YOUR groups
  SL_CHECK(r->groups.tp && r->groups.pp && r->groups.dp, "make_groups left the tp, pp or dp group empty");
  SL_CHECK(r->groups.tp->size() == layout.grid.tp && r->groups.pp->size() == layout.grid.pp &&
               r->groups.dp->size() == layout.grid.dp,
           "make_groups: groups of %d, %d, %d ranks for %s", r->groups.tp->size(), r->groups.pp->size(),
           r->groups.dp->size(), layout.grid.describe().c_str());
  r->points = std::make_unique<lab05::MegatronPoints>(*r->groups.tp, /*sequence_parallel=*/false);
  std::vector<GPT2*> chunks;
  for (int c = 0; c < layout.pipeline.v; ++c) {
    r->models.push_back(std::make_unique<GPT2>(cfg, chunk_shard(cfg, layout, c), policy, device, seed));
    GPT2& model = *r->models.back();
    if (layout.grid.tp > 1) model.set_tensor_parallel(r->points.get());  // lab 05's points (tp 1: none)
    if (zero1) r->zero1.push_back(make_zero1_state(model, *r->groups.dp, optimizer));
    else r->optimizers.push_back(std::make_unique<Optimizer>(model, optimizer));
    chunks.push_back(&model);
  }
  r->stage = std::make_unique<lab06::Stage>(chunks, layout.pipeline);
  r->exchange = std::make_unique<lab06::StageExchange>(*r->groups.pp, layout.pipeline);
  return r;
}

double zero1_sum_squares(const lab04::FsdpState& s) {
  const bool tp_rank0 = s.model.shard().tp_rank == 0;
  double sq = 0.0;
  for (const ParamInfo& p : s.model.param_table()) {
    if (p.tied_copy || (p.tp_replicated && !tp_rank0)) continue;  // counted by another rank
    const lab04::ShardLayout& l = s.units.at(p.unit).layout;
    const int64_t lo = std::max(p.offset, l.begin), hi = std::min(p.offset + p.numel, l.begin + l.owned);
    if (lo < hi) sq += sum_squares(s.units[p.unit].grad_shard.view(lo - l.begin, {hi - lo}));
  }
  return sq;
}

// =============================================================================================
// Data parallel on top
// =============================================================================================
void average_over_dp(lab06::Stage& stage, Communicator& dp) {
  // TODO(lab07-5) BEGIN  the mean of every gradient over the replicas
  //   What lab 03 did for one model, for each chunk this rank holds, over the replicas only.
  //   README.md#data-parallel-on-top
  throw scalelab::NotImplemented("lab07-5 average_over_dp");
  // TODO(lab07-5) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(Rank3D& r, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  StepResult result;
  // TODO(lab07-6) BEGIN  the schedule over tp stages, 1/m, tied wte, dp average, the whole model's norm, step
  //   Labs 05 and 06 each wrote a step for one kind of split; this one composes them and adds the replicas:
  //   with r.zero1 not empty the replicas shard the update (zero1_update) instead of averaging the gradients.
  //   Which groups does the norm sum over, and which not? Which loss is the global batch's? README.md#one-training-step
  throw scalelab::NotImplemented("lab07-6 train_step");
  // TODO(lab07-6) END
  return result;
}

// =============================================================================================
// ZeRO-1 across the replicas
// =============================================================================================
float zero1_update(Rank3D& r, float lr, float grad_clip) {
  float norm = 0.0f;
  // TODO(lab07-7) BEGIN  reduce-scatter over dp, the norm from the shards, clip them, lab 04's sharded step
  //   Lab 04's ZeRO-1, with lab 04's functions, on every chunk's state: the gradients reduce-scattered over the
  //   replicas, the norm from the shards (which groups hold disjoint parts of it now?), the shards clipped, the
  //   sharded update. README.md#zero-1-across-the-replicas
  throw scalelab::NotImplemented("lab07-7 zero1_update");
  // TODO(lab07-7) END
  return norm;
}

float forward_loss(Rank3D& r, const Tensor& tokens, const Tensor& targets) {
  const float loss = lab06::forward_loss(*r.stage, *r.exchange, tokens, targets);  // this replica's batch
  return r.groups.dp->size() > 1 ? all_reduce_value(*r.groups.dp, loss, ReduceOp::Avg, "eval loss (dp)") : loss;
}

}  // namespace SL_TRACK_LAB07
}  // namespace scalelab::lab07
