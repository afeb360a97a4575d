// parallel_3d.cpp — lab 07: 3D parallelism (tensor x pipeline x data; Narayanan et al. 2021,
// arXiv:2104.04473, Sec. 3). The ranks as a grid, the four groups every rank needs, and one training step
// that composes lab 05's tensor-parallel stages, lab 06's schedule and lab 03's data-parallel average.
// Declared in labs/07_parallel_3d/parallel_3d.h; the lesson is labs/07_parallel_3d/README.md. Only the code
// between TODO(lab07-N) BEGIN/END is yours to write; the rest is shared by both tracks
// (labs/07_parallel_3d/parallel_3d.cpp and solutions/07_parallel_3d/parallel_3d.cpp).
#include "parallel_3d.h"

#include <algorithm>  // defines: std::find, std::count
#include <cmath>      // defines: std::sqrt, std::isfinite
#include <string>     // defines: std::to_string

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL, scalelab::NotImplemented
#include "scalelab/ops/ops.h"     // defines: scale_

namespace scalelab::lab07 {
inline namespace SL_TRACK_LAB07 {

int Grid::size(GridAxis axis) const { return axis == GridAxis::TP ? tp : axis == GridAxis::PP ? pp : dp; }

std::string Grid::describe() const {
  return "tp " + std::to_string(tp) + " x pp " + std::to_string(pp) + " x dp " + std::to_string(dp) + " (order " +
         order + ")";
}

std::vector<GridAxis> parse_order(const std::string& order) {
  std::vector<GridAxis> axes;
  size_t begin = 0;
  for (;;) {
    const size_t end = order.find('-', begin);
    const std::string name = order.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    bool known = false;
    for (GridAxis a : {GridAxis::TP, GridAxis::PP, GridAxis::DP}) {
      if (name != grid_axis_name(a)) continue;
      known = std::count(axes.begin(), axes.end(), a) == 0;
      axes.push_back(a);
    }
    SL_CHECK_HINT(known && axes.size() <= 3, "list tp, pp and dp once each, fastest-varying first, joined by '-': "
                  "tp-dp-pp (the lesson's placement), tp-pp-dp, dp-tp-pp, ...", "--order '%s' is not a permutation "
                  "of tp, pp and dp", order.c_str());
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  SL_CHECK_HINT(axes.size() == 3, "name all three axes: tp-dp-pp, tp-pp-dp, ...",
                "--order '%s' is not a permutation of tp, pp and dp", order.c_str());
  return axes;
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

std::unique_ptr<Rank3D> build_rank(Communicator& world, const GPTConfig& cfg, const Layout& layout,
                                   const OptimizerConfig& optimizer, const PrecisionPolicy& policy, Device device,
                                   uint64_t seed) {
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
    if (layout.grid.tp > 1) r->models.back()->set_tensor_parallel(r->points.get());  // lab 05's points (tp 1: none)
    r->optimizers.push_back(std::make_unique<Optimizer>(*r->models.back(), optimizer));
    chunks.push_back(r->models.back().get());
  }
  r->stage = std::make_unique<lab06::Stage>(chunks, layout.pipeline);
  r->exchange = std::make_unique<lab06::StageExchange>(*r->groups.pp, layout.pipeline);
  return r;
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
  //   Labs 05 and 06 each wrote a step for one kind of split; this one composes them and adds the replicas.
  //   Which groups does the norm sum over, and which not? Which loss is the global batch's? README.md#one-training-step
  throw scalelab::NotImplemented("lab07-6 train_step");
  // TODO(lab07-6) END
  return result;
}

float forward_loss(Rank3D& r, const Tensor& tokens, const Tensor& targets) {
  Tensor loss = Tensor::empty({1}, DType::F32);
  loss.data<float>()[0] = lab06::forward_loss(*r.stage, *r.exchange, tokens, targets);  // this replica's batch
  if (r.groups.dp->size() > 1) r.groups.dp->all_reduce(loss, ReduceOp::Avg, "eval loss (dp)");
  return loss.data<float>()[0];
}

}  // namespace SL_TRACK_LAB07
}  // namespace scalelab::lab07
