// test_lab06_np4.cpp — lab 06's graded checks on 4 ranks (mpiexec -n 4; sl_add_graded_test NP 4): four
// stages, where the middle ones neither embed nor compute the loss, 1F1B's warm-up differs on every stage
// and m < p happens. Shared bodies: lab06_support.h. Lesson: labs/06_pipeline_parallel/README.md.
#include <gtest/gtest.h>

#include "grading.h"        // defines: grading::Check, grading::run
#include "lab06_support.h"  // defines: the shared check bodies

namespace {

using namespace scalelab;
using namespace scalelab::lab06_test;
namespace grading = scalelab::grading;

}  // namespace

TEST(Lab06Pp4, GradientsMatchDenseFourStages) {
  const grading::Check check{
      "lab06.gradients_match_dense_four_stages", 3,
      "p = 4: GPipe m = 2 (m < p), 1F1B m = 3 and 8, interleaved v = 2 m = 4: loss within 1e-6 and "
      "every gradient of every stage and chunk within 1e-5 of the dense model's, each stage's "
      "order as the schedule",
      "README 'The exchange': a middle stage receives and sends in both directions"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_gradients_match_dense({{ScheduleKind::GPipe, 2, 1},
                                                  {ScheduleKind::OneFOneB, 3, 1},
                                                  {ScheduleKind::OneFOneB, 8, 1},
                                                  {ScheduleKind::Interleaved, 4, 2}}));
  });
}

TEST(Lab06Pp4, ActivationMemoryFourStages) {
  const grading::Check check{
      "lab06.activation_memory_four_stages", 2,
      "p = 4, m = 8: GPipe holds 8 sets on every stage, 1F1B 4, 3, 2, 1; interleaved v = 2 m = 4 "
      "8, 8, 7, 5 chunk sets: the allocator's peak equals the schedule's exactly",
      "README 'Why 1F1B'"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_activation_memory({{ScheduleKind::GPipe, 8, 1},
                                              {ScheduleKind::OneFOneB, 8, 1},
                                              {ScheduleKind::Interleaved, 4, 2}}));
  });
}

TEST(Lab06Pp4, BubbleMatchesFormulaFourStages) {
  const grading::Check check{
      "lab06.bubble_matches_formula_four_stages", 2,
      "p = 4 on simulated H100s over a free link, uniform compute (forward F = 100 ms, backward 2F): "
      "GPipe and 1F1B m = 4, bubble 3/7, interleaved v = 2 m = 4, 3/11, each stage within 1e-9",
      "README 'Measuring the bubble'"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_bubble_matches_formula({{{ScheduleKind::GPipe, 4, 1}, 100.0},
                                                   {{ScheduleKind::OneFOneB, 4, 1}, 100.0},
                                                   {{ScheduleKind::Interleaved, 4, 2}, 100.0}}));
  });
}

TEST(Lab06Pp4, ZbH1FourStages) {
  const grading::Check check{
      "lab06.zb_h1_four_stages", 3,
      "p = 4, ZB-H1 on simulated H100s, uniform compute (F = I = W = 100 ms): bubble (p - 1)/(3m + p - 1) within "
      "1e-9 for m = 4, 8 (3/15, 3/27); m = 8 on the CPU: activation peak = the schedule's walk, on every stage at "
      "most 1F1B's largest stage peak",
      "README 'Zero bubble'"};
  grading::run(check, [](grading::Record& record) {
    const std::string bubble =
        expect_bubble_matches_formula({{{ScheduleKind::ZbH1, 4, 1}, 100.0}, {{ScheduleKind::ZbH1, 8, 1}, 100.0}});
    record.measured(bubble + "; " + expect_activation_memory({{ScheduleKind::ZbH1, 8, 1}}));
  });
}

TEST(Lab06Pp4, BadLayoutsFailOnEveryRankFourStages) {
  const grading::Check check{"lab06.bad_layouts_fail_on_every_rank_four_stages", 1,
                             "the same layouts as at 2 ranks, refused on all 4", "README 'The partition'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_bad_layouts_refused()); });
}
