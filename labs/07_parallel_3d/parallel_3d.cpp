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
  //   Consecutive ranks differ first along the order's first axis (Grid above), every coordinate in 0 .. that
  //   axis' size - 1, every rank a different triple. README.md#coordinates
  throw scalelab::NotImplemented("lab07-1 coords_of");
  // TODO(lab07-1) END
  return c;
}

int rank_of(const Grid& g, const GridCoords& c) {
  int rank = 0;
  // TODO(lab07-1) BEGIN  the inverse
  //   The rank whose coordinates are c: rank_of(g, coords_of(g, r)) == r for every rank r.
  throw scalelab::NotImplemented("lab07-1 rank_of");
  // TODO(lab07-1) END
  return rank;
}

// =============================================================================================
// The groups, as lists of ranks
// =============================================================================================
std::vector<int> group_members(const Grid& g, GridAxis axis, int rank) {
  std::vector<int> members;
  // TODO(lab07-2) BEGIN  the members of rank's group along `axis`, by their coordinate along it
  //   Every rank that shares rank's other two coordinates, ordered by the coordinate along `axis` (0 first).
  //   README.md#the-groups
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
  // TODO(lab07-6) BEGIN  one optimizer step of the tp x pp x dp model
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
  // TODO(lab07-7) BEGIN  ZeRO-1 across the replicas: the same update, the optimizer state sharded
  //   Done when: every chunk took the update plain data parallel would make (the replicas' mean gradient,
  //   clipped on the whole model's norm), each replica keeping the optimizer state of its own shard only, with
  //   lab 04's functions. Which groups hold disjoint parts of the norm now? README.md#zero-1-across-the-replicas
  throw scalelab::NotImplemented("lab07-7 zero1_update");
  // TODO(lab07-7) END
  return norm;
}

}  // namespace SL_TRACK_LAB07
}  // namespace scalelab::lab07
