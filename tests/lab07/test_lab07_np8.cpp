// test_lab07_np8.cpp — lab 07's graded checks on 8 ranks (mpiexec -n 8; sl_add_graded_test NP 8): the
// 2 x 2 x 2 grid of the lesson on two simulated nodes of 4 ranks, every axis split at once. Shared bodies:
// lab07_support.h. Lesson: labs/07_parallel_3d/README.md.
#include <gtest/gtest.h>

#include "grading.h"        // defines: grading::Check, grading::run
#include "lab07_support.h"  // defines: the shared check bodies

namespace {

using namespace scalelab;
using namespace scalelab::lab07_test;
namespace grading = scalelab::grading;

const Case k3D{{2, 2, 2, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1};
const Case k3DReversed{{2, 2, 2, "pp-dp-tp"}, ScheduleKind::Interleaved, 2, 2};
// The fourth axis (README 'A fourth axis: context parallel'): every sequence split across a cp group of 2 by
// lab 10's reference ring; the gradient group is cp x dp.
const Case k4D{{2, 2, 1, "tp-cp-dp-pp", 2}, ScheduleKind::OneFOneB, 2, 1};
const Case k4DNoTp{{1, 2, 2, "tp-cp-dp-pp", 2}, ScheduleKind::OneFOneB, 2, 1};

}  // namespace

TEST(Lab07Grid8, GroupsFromSplitsEightRanks) {
  const grading::Check check{"lab07.groups_from_splits_eight_ranks", 3,
                             "make_groups on 8 ranks, 4 per simulated node, 2x2x2 in all 6 orders: members, names, "
                             "ranks and links of the four groups as the table (docs/rank_grid.md for tp-dp-pp)",
                             "README 'The groups' and 'The placement rule'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_groups_from_splits({2, 2, 2, ""}, 4)); });
}

TEST(Lab07Step8, GradientsMatchDenseEightRanks) {
  const grading::Check check{"lab07.gradients_match_dense_eight_ranks", 4,
                             "one train_step of tp2 x pp2 x dp2, order tp-dp-pp (1F1B m 2) and pp-dp-tp (interleaved "
                             "v 2 m 2): every gradient within 1e-5 of its slice of the dense model's, and the loss",
                             "README 'One training step'; the failure names the kind of difference (a whole factor: a "
                             "mean or the average; the tied wte's sum; one replica's gradient or the wrong group)"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_gradients_match_dense({k3D, k3DReversed}));
  });
}

TEST(Lab07Step8, AdamwLossCurveEightRanks) {
  const grading::Check check{"lab07.adamw_loss_curve_eight_ranks", 3,
                             "5 AdamW steps of tp2 x pp2 x dp2 (1F1B m 2, clipping at 1): every step's loss and norm "
                             "within 1e-5 (relative) of one process on the same global batches",
                             "README 'One training step'"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_steps_match_dense(k3D, OptimizerConfig::Kind::AdamW, 5, 1e-2f, 1.0f));
  });
}

TEST(Lab07Step8, GroupBytesEightRanks) {
  const grading::Check check{"lab07.group_bytes_eight_ranks", 2,
                             "one step of tp2 x pp2 x dp2: the bytes of tensors in each group's event log equal what "
                             "the layout must move",
                             "README 'What each group carries'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_group_bytes({k3D})); });
}

TEST(Lab07Grid8, BadLayoutsFailOnEveryRankEightRanks) {
  const grading::Check check{"lab07.bad_layouts_fail_on_every_rank_eight_ranks", 1,
                             "the same bad layouts at 8 ranks, and 8 stages for 4 layers, refused on every rank",
                             "README 'The layout'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_bad_layouts_refused()); });
}

TEST(Lab07Step8, FourAxesStepsMatchDense) {
  const grading::Check check{"lab07.four_axes_steps_match_dense", 2,
                             "3 SGD steps with clipping at 0.5 of tp2 x cp2 x pp2 x dp1 and cp2 x pp2 x dp2 (order "
                             "tp-cp-dp-pp, 1F1B m 2; lab 10's reference ring over the cp group, the gradients averaged "
                             "over cp x dp): loss, norm and every parameter as the dense model's (1e-5 relative)",
                             "README 'A fourth axis: context parallel': your coordinates, groups and step serve a "
                             "fourth axis unchanged only if they hold for any axis the order names"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_steps_match_dense(k4D, OptimizerConfig::Kind::SGD, 3, 0.5f, 0.5f) + "; " +
                    expect_steps_match_dense(k4DNoTp, OptimizerConfig::Kind::SGD, 3, 0.5f, 0.5f));
  });
}
