// lab07_support.h — what lab 07's graded checks share (tests/lab07/test_lab07_np*.cpp): the model they
// split, a 3D-parallel run of the track under test over all ranks, the grid's table computed here by another
// method than the learner's (strides, not digits), the dense reference (ONE process, the whole model, on
// every rank), the bytes each group must carry, and the check bodies run at 4 and at 8 ranks.
// Implementation: lab07_support.cpp. What each check means: labs/07_parallel_3d/README.md ("The checks").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data_parallel.h"         // defines: dp_test::world, fresh_comm, random_global_batch, ... (tests/support)
#include "grading.h"               // defines: grading::Record
#include "parallel_3d.h"           // defines: lab07::* (the track under test)
#include "scalelab/comm/comm.h"    // defines: Communicator
#include "scalelab/model/gpt2.h"   // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"  // defines: OptimizerConfig

namespace scalelab::lab07_test {

using namespace dp_test;
using lab06::ScheduleKind;

// maxT 16, V 64, L 4, NH 2, C 16: tp 2 splits the heads, 4C and V; pp 2 takes 2 layers a stage (1 a chunk
// with v = 2).
GPTConfig grid_config();
constexpr int kT = 8;  // tokens per sequence; kMicroBatch (2) sequences per micro-batch

// The six orders of the three axes, the lesson's first.
const std::vector<std::string>& all_orders();

// ---------------------------------------------------------------------------------------------
// The table, computed here: stride(a) = the product of the sizes of the axes before a in the order;
// coordinate a of rank r = (r / stride(a)) % size(a); the group along a = r + (i - c_a) stride(a).
struct TableRow {
  GridCoords coords;
  std::vector<int> tp, pp, dp, embedding;  // world ranks in the group's rank order; embedding empty: none
};
std::vector<TableRow> expected_table(const lab07::Grid& g);

// ---------------------------------------------------------------------------------------------
// A 3D-parallel run of the track under test over every rank of a fresh communicator (lab07::make_layout,
// lab07::build_rank), with ranks_per_node simulated ranks per node (0: one node).
struct Run3D {
  std::unique_ptr<Communicator> world;  // fresh: an empty event log
  lab07::Layout layout;
  std::unique_ptr<lab07::Rank3D> rank;
};
struct Case {
  lab07::Grid grid;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int m = 2;
  int v = 1;
  bool zero1 = false;  // ZeRO-1 across the dp group (lab07::zero1_update) instead of the plain average
};
Run3D make_run(const GPTConfig& cfg, const Case& c, OptimizerConfig::Kind optimizer = OptimizerConfig::Kind::SGD);
std::string case_name(const Case& c);

// Replica d's m micro-batches of a global batch of dp x m x kMicroBatch rows: micro-batch i takes rows
// [(d m + i) B, +B).
std::vector<MicroBatch> replica_micro_batches(const GlobalBatch& g, int d, int m);

// The sums of m x dp micro-batches' gradients in another order than one forward of the global batch, and
// the tensor-parallel sums: rounding. Measured on grid_config for the layouts of these checks: at most
// 5.8e-7 of a tensor's largest entry (rank 0's records of both programs), so the bound leaves a factor
// above 10. A
// wrong factor (a missing 1/m or 1/dp, a replica's gradient left out, the tied embedding's other half
// missing) is order 1.
constexpr double kGradRtol = 1e-5;

// ---------------------------------------------------------------------------------------------
// Check bodies shared by the 4- and 8-rank programs; they assert through grading::all_ranks and return
// what they measured.

// coords_of, rank_of, group_members and embedding_members against expected_table, for every grid and order.
std::string expect_grid_arithmetic(const std::vector<lab07::Grid>& grids);
// make_groups: every group's world ranks, name and rank against the table; every member of a group sees
// the same members; with ranks_per_node, each group's link is the intra link exactly when its members share
// a node. For every order of `sizes`.
std::string expect_groups_from_splits(const lab07::Grid& sizes, int ranks_per_node);
// One train_step (SGD, lr 0) per case against the dense model's gradients of the same global batch, per
// tensor of every chunk (its tp slice of its layers), and the loss.
std::string expect_gradients_match_dense(const std::vector<Case>& cases);
// `steps` steps of the case with `optimizer` (lr, clip) against the dense model's: the loss and the norm
// of every step, and every parameter afterwards. A grid with cp > 1 (the fourth axis) trains each rank on
// lab07::cp_slices of its replica's micro-batches; the dense model sees the whole sequences.
std::string expect_steps_match_dense(const Case& c, OptimizerConfig::Kind optimizer, int steps, float lr,
                                     float grad_clip);
// One step per case: the payload bytes each group's events carried (tensors only: events of more than
// kScalarElements elements; the norm and the loss travel however the step likes) against what the layout
// must move (README "What each group carries").
constexpr int64_t kScalarElements = 4;
std::string expect_group_bytes(const std::vector<Case>& cases);
// ZeRO-1 (c.zero1, AdamW): the optimizer state this rank holds after building its part and one step is
// exactly AdamW's m and v of its dp shard of every owned unit (the allocator, category OptimizerState), and
// the dp group carried, per step, one reduce-scatter of every padded unit gradient and one all-gather of
// every shard of parameters, nothing else of tensor size.
std::string expect_zero1_state_sharded(const Case& c);
// make_layout refuses the bad layouts of this rank count on every rank, and accepts the good ones.
std::string expect_bad_layouts_refused();

}  // namespace scalelab::lab07_test
