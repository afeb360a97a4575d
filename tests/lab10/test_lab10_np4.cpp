// test_lab10_np4.cpp — lab 10's graded checks on 4 ranks (mpiexec -n 4; sl_add_graded_test NP 4): the ring
// and the all-gather variant at cp 4, contiguous and zig-zag, against ONE process running the whole sequences;
// cp 2 x dp 2 and tp 2 x cp 2 training steps; the work per rank at cp 4. lab10_support.h has the bodies.
// Lesson: labs/10_context_parallel/README.md ("What the tests check").
#include <gtest/gtest.h>

#include <string>

#include "grading.h"        // defines: grading::Check, grading::run
#include "lab10_support.h"  // defines: the shared check bodies

namespace {

using namespace scalelab::lab10_test;
namespace grading = scalelab::grading;

}  // namespace

TEST(Lab10Cp4, RingMatchesDenseFourRanks) {
  const grading::Check check{"lab10.ring_matches_dense_four_ranks", 3,
                             "the ring at cp 4, contiguous and zig-zag: loss and every gradient within 1e-5 of dense",
                             "README 'The ring': the owner of the block in hand after s steps; dkv's last hop"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_gradients_match_dense("ring", false);
    record.measured(a + "; " + expect_gradients_match_dense("ring", true));
  });
}

TEST(Lab10Cp4, AllGatherMatchesDenseFourRanks) {
  const grading::Check check{"lab10.all_gather_matches_dense_four_ranks", 2,
                             "the all-gather variant at cp 4, zig-zag: loss and every gradient as dense",
                             "README 'Ring or all-gather'"};
  grading::run(check,
               [](grading::Record& record) { record.measured(expect_gradients_match_dense("allgather", true)); });
}

TEST(Lab10Cp4, CpTimesDpStepsMatchDense) {
  const grading::Check check{"lab10.cp_times_dp_steps_match_dense", 3,
                             "cp 2 x dp 2 (cp fastest without tp): 3 SGD steps of train_step, every parameter as "
                             "the dense model's on the global batch",
                             "README 'One training step': the gradient averages over the cp group AND the replicas; "
                             "the loss returned is the cp group's mean"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_sgd_steps_match_dense(1, 2, false)); });
}

TEST(Lab10Cp4, CpTimesTpStepsMatchDense) {
  const grading::Check check{"lab10.cp_times_tp_steps_match_dense", 3,
                             "tp 2 x cp 2 (tp fastest; lab 05's reference points), ring, zig-zag: 3 SGD steps of "
                             "train_step clipped at 1.0 (the dense norm above it), the loss, the whole model's "
                             "gradient norm and every parameter's tp slice as the dense model's",
                             "README 'With tensor parallelism': the norm is the whole model's, summed over the tp "
                             "group; the cp ring runs among the ranks of one tp_rank; the loss returned is the cp "
                             "group's mean"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_sgd_steps_match_dense(2, 2, true)); });
}

TEST(Lab10Cp4, ZigZagBalancesWorkFourRanks) {
  const grading::Check check{
      "lab10.zig_zag_balances_work_four_ranks", 2,
      "cp 4: contiguous pairs per rank the causal triangle's (busiest 5.8x the least at T 16), zig-zag "
      "within 5 %",
      "README 'The causal imbalance and the zig-zag'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_zigzag_balances_work()); });
}

TEST(Lab10Cp4, ActivationMemoryFallsAsOneOverCpFourRanks) {
  const grading::Check check{"lab10.activation_memory_falls_as_one_over_cp_four_ranks", 1,
                             "cp 4: one activation set at the layout's T_local exactly 1/4 of the dense model's",
                             "README 'The layout': T_local is a rank's share of each sequence"};
  grading::run(check,
               [](grading::Record& record) { record.measured(expect_activation_memory_falls_as_one_over_cp()); });
}
