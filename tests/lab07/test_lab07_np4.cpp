// test_lab07_np4.cpp — lab 07's graded checks on 4 ranks (mpiexec -n 4; sl_add_graded_test NP 4): the grid's
// arithmetic for every order, the groups split from the world, bad layouts, and the three 4-rank layouts
// tp 2 x pp 2 x dp 1, tp 2 x pp 1 x dp 2 and tp 1 x pp 2 x dp 2 against the dense model. Shared bodies:
// lab07_support.h. Lesson: labs/07_parallel_3d/README.md.
#include <gtest/gtest.h>

#include "grading.h"        // defines: grading::Check, grading::run
#include "lab07_support.h"  // defines: the shared check bodies

namespace {

using namespace scalelab;
using namespace scalelab::lab07_test;
namespace grading = scalelab::grading;

const Case kTpPp{{2, 2, 1, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1};
const Case kTpDp{{2, 1, 2, "tp-dp-pp"}, ScheduleKind::GPipe, 2, 1};
const Case kTpDpOneMicroBatch{{2, 1, 2, "tp-dp-pp"}, ScheduleKind::GPipe, 1, 1};  // m = 1: no accumulation
const Case kPpDp{{1, 2, 2, "tp-dp-pp"}, ScheduleKind::Interleaved, 2, 2};
const Case kTpDpZero1{{2, 1, 2, "tp-dp-pp"}, ScheduleKind::GPipe, 2, 1, true};
const Case kPpDpZero1{{1, 2, 2, "tp-dp-pp"}, ScheduleKind::Interleaved, 2, 2, true};

}  // namespace

TEST(Lab07Grid, GridArithmetic) {
  const grading::Check check{"lab07.grid_arithmetic", 3,
                             "coords_of, rank_of, group_members and embedding_members for 2x2x1, 2x1x2, 1x2x2, 2x2x2 "
                             "and 2x3x4 in all 6 orders, every rank, equal a table computed another way (strides)",
                             "README 'Coordinates' and 'The groups'"};
  grading::run(check, [](grading::Record& record) {
    record
        .measured(expect_grid_arithmetic({{2, 2, 1, ""}, {2, 1, 2, ""}, {1, 2, 2, ""}, {2, 2, 2, ""}, {2, 3, 4, ""}}));
  });
}

TEST(Lab07Grid4, GroupsFromSplitsFourRanks) {
  const grading::Check check{"lab07.groups_from_splits_four_ranks", 2,
                             "make_groups on 4 ranks, 2 per simulated node, for 2x2x1, 2x1x2 and 1x2x2 in all 6 "
                             "orders: members, names, ranks and links of the four groups as the table",
                             "README 'The groups'"};
  grading::run(check, [](grading::Record& record) {
    std::string m;
    for (const lab07::Grid& g : {lab07::Grid{2, 2, 1, ""}, lab07::Grid{2, 1, 2, ""}, lab07::Grid{1, 2, 2, ""}})
      m += (m.empty() ? "" : "; ") + expect_groups_from_splits(g, 2);
    record.measured(m);
  });
}

TEST(Lab07Grid4, BadLayoutsFailOnEveryRankFourRanks) {
  const grading::Check check{"lab07.bad_layouts_fail_on_every_rank_four_ranks", 2,
                             "make_layout on 4 ranks refuses a grid that is not the ranks, tp not dividing the heads, "
                             "a bad order, a size 0, interleaved m not a multiple of pp, and a tp group across nodes "
                             "under --placement-rule (also a mixed placement, judged for all 6 ranks of tp 2 x dp 3 "
                             "on 2 nodes of 3: one group across, two inside), with the numbers, on every rank; "
                             "accepts the good ones",
                             "README 'The layout'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_bad_layouts_refused()); });
}

TEST(Lab07Step4, GradientsMatchDenseFourRanks) {
  const grading::Check check{"lab07.gradients_match_dense_four_ranks", 4,
                             "one train_step of tp2 x pp2 (1F1B m 2), tp2 x dp2 (GPipe m 2, and m 1) and pp2 x dp2 "
                             "(interleaved v 2, m 2): every gradient of every chunk within 1e-5 of its slice of the "
                             "dense model's on the same global batch, and the loss",
                             "README 'One training step' and 'Data parallel on top'; the failure names the kind of "
                             "difference (a whole factor: a mean or the average; the tied wte's sum; one replica's "
                             "gradient or the wrong group)"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_gradients_match_dense({kTpPp, kTpDp, kTpDpOneMicroBatch, kPpDp}));
  });
}

TEST(Lab07Step4, SgdStepsMatchDenseFourRanks) {
  const grading::Check check{"lab07.sgd_steps_match_dense_four_ranks", 3,
                             "3 SGD steps with clipping at 0.5 of tp2 x dp2, tp2 x pp2 and pp2 x dp2 (interleaved v 2: "
                             "every chunk's gradients zeroed each step): loss, norm (the whole model's) and every "
                             "parameter as the dense model's (1e-5 relative)",
                             "README 'One training step'; the failure names what the ratio to the dense loss or norm "
                             "points to (a whole factor: a mean or the average; a square root: the norm's groups)"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_steps_match_dense(kTpDp, OptimizerConfig::Kind::SGD, 3, 0.5f, 0.5f) + "; " +
                    expect_steps_match_dense(kTpPp, OptimizerConfig::Kind::SGD, 3, 0.5f, 0.5f) + "; " +
                    expect_steps_match_dense(kPpDp, OptimizerConfig::Kind::SGD, 3, 0.5f, 0.5f));
  });
}

TEST(Lab07Step4, GroupBytesFourRanks) {
  const grading::Check check{"lab07.group_bytes_four_ranks", 3,
                             "one step of each 4-rank layout: the bytes of tensors in the tp, pp, dp and embedding "
                             "groups' event logs equal what the layout must move, group by group",
                             "README 'What each group carries'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_group_bytes({kTpPp, kTpDp, kPpDp})); });
}

TEST(Lab07Step4, Zero1StepsMatchDenseFourRanks) {
  const grading::Check check{"lab07.zero1_steps_match_dense_four_ranks", 3,
                             "ZeRO-1 across dp: 3 SGD steps with clipping at 0.5 of tp2 x dp2 (loss, norm and every "
                             "parameter) and 4 AdamW steps of pp2 x dp2 interleaved v 2 (loss and norm) within 1e-5 "
                             "of the dense model's",
                             "README 'ZeRO-1 across the replicas'"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_steps_match_dense(kTpDpZero1, OptimizerConfig::Kind::SGD, 3, 0.5f, 0.5f) + "; " +
                    expect_steps_match_dense(kPpDpZero1, OptimizerConfig::Kind::AdamW, 4, 1e-2f, 1.0f));
  });
}

TEST(Lab07Step4, Zero1StateIsShardedFourRanks) {
  const grading::Check check{"lab07.zero1_state_is_sharded_four_ranks", 2,
                             "ZeRO-1 with AdamW, tp2 x dp2 and pp2 x dp2 (v 2): the allocator's optimizer state is "
                             "exactly m and v of this rank's dp shard of every unit, and the dp group carries one "
                             "reduce-scatter of each padded gradient and one all-gather of each shard a step",
                             "README 'ZeRO-1 across the replicas'"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_zero1_state_sharded(kTpDpZero1) + "; " + expect_zero1_state_sharded(kPpDpZero1));
  });
}
