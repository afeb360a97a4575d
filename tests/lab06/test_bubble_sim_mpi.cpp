// test_bubble_sim_mpi.cpp — the pipeline bubble on the simulated cluster, through lab 06's REFERENCE (not graded;
// sl_add_mpi_test at 2 and 4 ranks): with equal stage compute (a uniform time that replaces the ops' modelled
// time) and free messages, every stage's bubble of GPipe, 1F1B and interleaved 1F1B equals
// (p - 1) / (v m + p - 1) within 1e-9, in the window from the first forward's start to the last backward's
// end over all stages (labs/06_pipeline_parallel/README.md "Measuring the bubble"). The measurement is the
// graded checks' (lab06_support.h simulated_bubbles); here it runs every schedule at both rank counts and at
// more than one m, so the equality is the simulator's, not the graded cases' alone.
#include <gtest/gtest.h>

#include <cmath>   // defines: std::fabs
#include <string>  // defines: std::to_string
#include <vector>

#include "lab06_support.h"  // defines: BubbleCase, simulated_bubbles, kBubbleTol
#include "mpi_test.h"       // defines: test::world

namespace {

using namespace scalelab;
using namespace scalelab::lab06_test;

// Every stage's bubble of one case against the formula; the report names the case.
void expect_formula(ScheduleKind kind, int m, int v) {
  const int p = scalelab::test::world().size();
  double window_ms = 0;
  const std::vector<double> got = simulated_bubbles({{kind, m, v}, 100.0}, &window_ms);
  lab06::PipelineLayout l;
  l.p = p;
  l.m = m;
  l.v = v;
  const double want = lab06::bubble_formula(l);
  // The window itself: (v m + p - 1) slots of one micro-batch's forward and backward, 3 F / v each.
  EXPECT_NEAR(window_ms, (v * m + p - 1) * 300.0 / v, 1e-9 * window_ms);
  ASSERT_EQ(static_cast<int>(got.size()), p);
  for (int s = 0; s < p; ++s)
    EXPECT_NEAR(got[s], want, kBubbleTol) << lab06::schedule_name(kind) << " p " << p << " m " << m << " v " << v
                                          << ", stage " << s << " (window " << window_ms << " ms)";
}

TEST(Lab06BubbleSim, GpipeEqualsTheFormula) {
  for (int m : {1, 4, 8}) expect_formula(ScheduleKind::GPipe, m, 1);
}

TEST(Lab06BubbleSim, OneFOneBEqualsTheFormula) {
  for (int m : {1, 3, 4, 8}) expect_formula(ScheduleKind::OneFOneB, m, 1);
}

TEST(Lab06BubbleSim, InterleavedEqualsTheFormula) {
  const int p = scalelab::test::world().size();
  const std::vector<int> chunks = p == 2 ? std::vector<int>{2, 4} : std::vector<int>{2};  // p v divides 8 layers
  for (int m : {p, 2 * p})
    for (int v : chunks) expect_formula(ScheduleKind::Interleaved, m, v);
}

}  // namespace
