// parallel_3d.cpp — lab 07: 3D parallelism (tensor x pipeline x data; Narayanan et al. 2021,
// arXiv:2104.04473, Sec. 3). The ranks as a grid, the four groups every rank needs, and one training step
// that composes lab 05's tensor-parallel stages, lab 06's schedule and lab 03's data-parallel average.
// Declared in labs/07_parallel_3d/parallel_3d.h; the lesson is labs/07_parallel_3d/README.md. Only the code
// between TODO(lab07-N) BEGIN/END is yours to write. The code that builds a rank's part around them
// (build_rank, its ZeRO-1 state, the grid's words) is given once, in labs/07_parallel_3d/rank_3d.cpp.
#include "parallel_3d.h"

#include <cmath>   // defines: std::sqrt, std::isfinite
#include <memory>  // defines: std::unique_ptr
#include <string>  // defines: std::string, std::to_string
#include <vector>  // defines: std::vector

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value
#include "scalelab/core/error.h"        // defines: SL_CHECK_HINT, SL_FAIL, scalelab::NotImplemented
#include "scalelab/ops/ops.h"           // defines: scale_

namespace scalelab::lab07 {
inline namespace SL_TRACK_LAB07 {

// =============================================================================================
// Coordinates
// =============================================================================================
GridCoords coords_of(const Grid& g, int rank) {
  GridCoords c;
  // TODO(lab07-1) BEGIN  rank -> its (tp, pp, dp) coordinates in the grid's order
  SL_CHECK_HINT(rank >= 0 && rank < g.world_size(), "grid ranks are 0 .. tp x pp x dp - 1",
                "%s: rank %d is out of range", g.describe().c_str(), rank);
  int rest = rank;
  for (GridAxis a : parse_order(g.order)) {  // fastest first: rank = c[a0] + size[a0] * (c[a1] + size[a1] * c[a2])
    c[a] = rest % g.size(a);
    rest /= g.size(a);
  }
  // TODO(lab07-1) END
  return c;
}

int rank_of(const Grid& g, const GridCoords& c) {
  int rank = 0;
  // TODO(lab07-1) BEGIN  the inverse
  const std::vector<GridAxis> axes = parse_order(g.order);
  for (auto a = axes.rbegin(); a != axes.rend(); ++a) {  // slowest first (Horner's rule)
    SL_CHECK_HINT(c[*a] >= 0 && c[*a] < g.size(*a), "each coordinate is 0 .. its axis' size - 1",
                  "%s: %s_rank %d is out of range", g.describe().c_str(), grid_axis_name(*a), c[*a]);
    rank = rank * g.size(*a) + c[*a];
  }
  // TODO(lab07-1) END
  return rank;
}

// =============================================================================================
// The groups, as lists of ranks
// =============================================================================================
std::vector<int> group_members(const Grid& g, GridAxis axis, int rank) {
  std::vector<int> members;
  // TODO(lab07-2) BEGIN  the members of rank's group along `axis`, by their coordinate along it
  GridCoords c = coords_of(g, rank);
  for (int i = 0; i < g.size(axis); ++i) {
    c[axis] = i;
    members.push_back(rank_of(g, c));
  }
  // TODO(lab07-2) END
  return members;
}

std::vector<int> embedding_members(const Grid& g, int rank) {
  std::vector<int> members;
  // TODO(lab07-2) BEGIN  the first and the last stage of rank's pipeline, or nothing on a middle stage
  GridCoords c = coords_of(g, rank);
  if (c.pp_rank != 0 && c.pp_rank != g.pp - 1) return members;  // a middle stage holds no copy of wte
  c.pp_rank = 0;
  members.push_back(rank_of(g, c));
  c.pp_rank = g.pp - 1;
  if (g.pp > 1) members.push_back(rank_of(g, c));
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
  parse_order(grid.order);
  SL_CHECK_HINT(grid.tp >= 1 && grid.pp >= 1 && grid.dp >= 1, "use 1 for an axis that is not split",
                "%s: every size must be >= 1", grid.describe().c_str());
  if (grid.world_size() != world_size) {
    const int rest = grid.tp * grid.cp * grid.pp;  // every axis but dp (cp 1 without context parallelism)
    const std::string hint = world_size % rest == 0 ? "give --dp " + std::to_string(world_size / rest) + " (= " +
                                                          std::to_string(world_size) + " ranks / (tp x cp x pp))"
                                                    : "choose --tp, --cp and --pp whose product divides the " +
                                                          std::to_string(world_size) + " ranks (mpirun -np)";
    SL_FAIL(hint, "%s = %d ranks, but there are %d", grid.describe().c_str(), grid.world_size(), world_size);
  }
  l.grid = grid;
  l.coords = coords_of(grid, rank);
  l.ranks_per_node = ranks_per_node;
  ModelShard tp_slice;  // the model must split into tp slices: NH, 4C and V divisible by tp
  tp_slice.tp_size = grid.tp;
  tp_slice.validate(cfg);
  l.pipeline = lab06::make_layout(cfg, grid.pp, l.coords.pp_rank, schedule, m, v);  // p <= L, the schedule's rules
  if (placement_rule && ranks_per_node > 0) {
    for (int r = 0; r < world_size; ++r) {  // every tp group, not only this rank's: every rank throws alike
      const std::vector<int> tp_group = group_members(grid, GridAxis::TP, r);
      const int first_node = tp_group.front() / ranks_per_node, last_node = tp_group.back() / ranks_per_node;
      SL_CHECK_HINT(first_node == last_node,
                    "TP inside a node: put tp first in --order (tp-dp-pp) with tp dividing --ranks-per-node, or "
                    "leave out --placement-rule to measure the other placement",
                    "%s with %d ranks per node: the tensor-parallel group of rank %d (ranks %d..%d) spans nodes %d "
                    "to %d, while --placement-rule asks for every tp group inside one node",
                    grid.describe().c_str(), ranks_per_node, r, tp_group.front(), tp_group.back(), first_node,
                    last_node);
    }
  }
  // TODO(lab07-3) END
  return l;
}

// =============================================================================================
// The communicators
// =============================================================================================
Groups make_groups(Communicator& world, const Layout& layout) {
  Groups g;
  // TODO(lab07-4) BEGIN  four splits of world, in the same order on every rank
  const int me = world.rank();
  // color: the group's first member (the same for all its members, different for every other group);
  // key: the coordinate along the axis, so the group's rank is that coordinate.
  for (GridAxis axis : {GridAxis::TP, GridAxis::PP, GridAxis::DP}) {
    const std::vector<int> members = group_members(layout.grid, axis, me);
    std::unique_ptr<Communicator> c = world.split(members.front(), layout.coords[axis], grid_axis_name(axis));
    (axis == GridAxis::TP ? g.tp : axis == GridAxis::PP ? g.pp : g.dp) = std::move(c);
  }
  const std::vector<int> emb = embedding_members(layout.grid, me);  // every rank calls split, the middle ones too
  g.embedding = world.split(emb.empty() ? Communicator::kNoColor : emb.front(), layout.coords.pp_rank, "embedding");
  // TODO(lab07-4) END
  return g;
}

// =============================================================================================
// Data parallel on top
// =============================================================================================
void average_over_dp(lab06::Stage& stage, Communicator& dp) {
  // TODO(lab07-5) BEGIN  the mean of every gradient over the replicas
  if (dp.size() == 1) return;
  for (int c = 0; c < stage.num_chunks(); ++c) {
    GPT2& model = stage.chunk(c);
    for (int u = 0; u < model.num_units(); ++u)
      if (model.owns_unit(u))
        dp.all_reduce(model.unit_grads(u), ReduceOp::Avg,
                      "dp chunk " + std::to_string(c) + " unit " + std::to_string(u));
  }
  // TODO(lab07-5) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(Rank3D& r, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  StepResult result;
  // TODO(lab07-6) BEGIN  one optimizer step of the tp x pp x dp model
  lab06::Stage& stage = *r.stage;
  const lab06::PipelineLayout& pl = r.layout.pipeline;
  const int m = static_cast<int>(micro_batches.size());
  SL_CHECK_HINT(m == pl.m, "give the layout's micro-batches", "%d micro-batches for a layout of m = %d", m, pl.m);
  for (int c = 0; c < stage.num_chunks(); ++c) stage.chunk(c).zero_grad();
  const float loss_sum = lab06::run_schedule(stage, *r.exchange, lab06::schedule_for(pl), micro_batches);
  for (int c = 0; c < stage.num_chunks(); ++c) {
    GPT2& model = stage.chunk(c);
    for (int u = 0; u < model.num_units(); ++u)
      if (model.owns_unit(u)) scale_(model.unit_grads(u), 1.0f / static_cast<float>(m));
  }
  lab06::sync_tied_embedding(stage, r.groups.embedding.get());

  // The loss of the global batch: the last stage's mean over m (0 on the other stages) summed over the
  // stages, then the mean over the replicas, each of which saw its own part of the batch.
  // A host value (all_reduce_value stages it through the communicator's device).
  float loss = r.exchange->is_last(pl.v - 1) ? loss_sum / static_cast<float>(m) : 0.0f;
  if (r.groups.pp->size() > 1) loss = all_reduce_value(*r.groups.pp, loss, ReduceOp::Sum, "loss (pp)");
  if (r.groups.dp->size() > 1) loss = all_reduce_value(*r.groups.dp, loss, ReduceOp::Avg, "loss (dp)");
  result.loss = loss;

  if (!r.zero1.empty()) {
    result.grad_norm = zero1_update(r, lr, grad_clip);  // the replicas shard the update instead
  } else {
    average_over_dp(stage, *r.groups.dp);
    // The whole model's norm: this rank's chunks, then its tp group (the slices), then its pp group (the
    // stages). Not the dp group: after the average every replica holds the same gradients.
    double local = 0.0;
    for (int c = 0; c < stage.num_chunks(); ++c) local += grad_sum_squares(stage.chunk(c));
    float sq = static_cast<float>(local);  // f32: the communicator reduces f32
    if (r.groups.tp->size() > 1) sq = all_reduce_value(*r.groups.tp, sq, ReduceOp::Sum, "grad norm (tp)");
    if (r.groups.pp->size() > 1) sq = all_reduce_value(*r.groups.pp, sq, ReduceOp::Sum, "grad norm (pp)");
    result.grad_norm = std::sqrt(sq);
    SL_CHECK_HINT(std::isfinite(result.grad_norm), "lower the learning rate, or look for a bad batch",
                  "gradient norm is %g (not finite)", result.grad_norm);
    const float scale = grad_clip / (result.grad_norm + 1e-6f);
    for (int c = 0; c < stage.num_chunks(); ++c) {
      GPT2& model = stage.chunk(c);
      if (grad_clip > 0.0f && scale < 1.0f)
        for (int u = 0; u < model.num_units(); ++u)
          if (model.owns_unit(u)) scale_(model.unit_grads(u), scale);
      r.optimizers.at(c)->step(lr);
    }
  }
  // TODO(lab07-6) END
  return result;
}

// =============================================================================================
// ZeRO-1 across the replicas
// =============================================================================================
float zero1_update(Rank3D& r, float lr, float grad_clip) {
  float norm = 0.0f;
  // TODO(lab07-7) BEGIN  ZeRO-1 across the replicas: the same update, the optimizer state sharded
  // 1. Every owned unit's gradient averaged over the replicas, each keeping only its shard: launch them
  //    all, then finish them all (lab 04's ZeRO-1 reduces once per step, after the last micro-batch).
  for (auto& s : r.zero1)
    for (int u = 0; u < s->num_units(); ++u)
      if (s->units[u].layout.numel > 0) lab04::reduce_scatter_grads_async(*s, u);
  for (auto& s : r.zero1)
    for (int u = 0; u < s->num_units(); ++u)
      if (s->units[u].layout.numel > 0) lab04::finish_reduce_scatter(*s, u);
  // 2. The whole model's norm: the dp shards are disjoint parts of it, the tp slices and the stages too.
  double local = 0.0;
  for (const auto& s : r.zero1) local += zero1_sum_squares(*s);
  float sq = static_cast<float>(local);  // f32: the communicator reduces f32
  for (Communicator* g : {r.groups.dp.get(), r.groups.tp.get(), r.groups.pp.get()})
    if (g->size() > 1) sq = all_reduce_value(*g, sq, ReduceOp::Sum, "grad norm (" + g->name() + ")");
  norm = std::sqrt(sq);
  SL_CHECK_HINT(std::isfinite(norm), "lower the learning rate, or look for a bad batch",
                "gradient norm is %g (not finite)", norm);
  // 3. Clip the shards, then lab 04's update of each chunk's shard (it all-gathers the new parameters).
  const float scale = grad_clip / (norm + 1e-6f);
  for (auto& s : r.zero1) {
    if (grad_clip > 0.0f && scale < 1.0f)
      for (lab04::UnitShard& us : s->units)
        if (us.layout.numel > 0) scale_(us.grad_shard, scale);
    lab04::optimizer_step(*s, lr);
  }
  // TODO(lab07-7) END
  return norm;
}

}  // namespace SL_TRACK_LAB07
}  // namespace scalelab::lab07
