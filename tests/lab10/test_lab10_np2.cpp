// test_lab10_np2.cpp — lab 10's graded checks on 2 ranks (mpiexec -n 2; sl_add_graded_test NP 2): one
// context-parallel group of both ranks, compared with ONE process running the whole sequences (computed on
// every rank; lab10_support.h): the layout, the causal mask's pairs, the model's loss and every gradient
// through the ring and the all-gather variant, contiguous and zig-zag, SGD steps of the training step, the
// attention work per rank and the activation memory. Every rank evaluates every assertion and
// grading::all_ranks combines them. Lesson: labs/10_context_parallel/README.md ("What the tests check").
#include <gtest/gtest.h>

#include "grading.h"        // defines: grading::Check, grading::run
#include "lab10_support.h"  // defines: the shared check bodies

namespace {

using namespace scalelab::lab10_test;
namespace grading = scalelab::grading;

}  // namespace

TEST(Lab10Cp, LayoutAndRefusals) {
  const grading::Check check{"lab10.layout_and_refusals", 1,
                             "make_layout: tp fastest, then cp (world 8: cp 2 rank 5 is cp rank 1 of replica 2; tp 2 "
                             "x cp 2 rank 5 is tp 1, cp 0, replica 1); cp or tp x cp > ranks or not dividing them, "
                             "tp 0, tp not dividing NH, T not divisible by cp (2 cp zig-zag), T > maxT refused",
                             "README 'The layout' and 'With tensor parallelism'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_layout_and_refusals()); });
}

TEST(Lab10Cp, VisiblePairs) {
  const grading::Check check{"lab10.visible_pairs", 1,
                             "visible_pairs on hand-counted blocks: the diagonal's triangle, a past block whole, a "
                             "future block 0, a block straddling the diagonal",
                             "README 'The causal imbalance and the zig-zag': compare ABSOLUTE positions"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_visible_pairs()); });
}

TEST(Lab10Cp, RingMatchesDense) {
  const grading::Check check{"lab10.ring_matches_dense", 3,
                             "the ring at cp 2, contiguous: the group's mean loss and every averaged gradient within "
                             "1e-5 (relative) of the dense model's",
                             "README 'The ring' and 'The ring, backward': merge by lse; the mask by absolute "
                             "positions; every dkv back to its owner"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_gradients_match_dense("ring", false)); });
}

TEST(Lab10Cp, RingZigZagMatchesDense) {
  const grading::Check check{"lab10.ring_zig_zag_matches_dense", 2, "the same with the zig-zag chunks (two per rank)",
                             "README 'The causal imbalance and the zig-zag': a rank's chunks each have their own "
                             "position; the owner's chunks with its block"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_gradients_match_dense("ring", true)); });
}

TEST(Lab10Cp, AllGatherMatchesDense) {
  const grading::Check check{"lab10.all_gather_matches_dense", 2,
                             "the all-gather variant at cp 2, contiguous and zig-zag: loss and gradients as dense",
                             "README 'Ring or all-gather': which collective leaves each owner the SUM of its dkv"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_gradients_match_dense("allgather", false);
    record.measured(a + "; " + expect_gradients_match_dense("allgather", true));
  });
}

TEST(Lab10Cp, SgdStepsMatchDense) {
  const grading::Check check{"lab10.sgd_steps_match_dense", 2,
                             "3 SGD steps of train_step at cp 2 (zig-zag): the loss, the gradient norm and every "
                             "parameter as the dense model's",
                             "README 'One training step': each rank's loss is the mean of its slice; the group's"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_sgd_steps_match_dense(1, 2, true)); });
}

TEST(Lab10Cp, ZigZagBalancesWork) {
  const grading::Check check{"lab10.zig_zag_balances_work", 2,
                             "the ring's pairs per rank: contiguous exactly the causal triangle's (the later blocks "
                             "skipped), zig-zag within 5 %",
                             "README 'The causal imbalance and the zig-zag': skip a block the mask hides wholly"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_zigzag_balances_work()); });
}

TEST(Lab10Cp, ActivationMemoryFallsAsOneOverCp) {
  const grading::Check check{"lab10.activation_memory_falls_as_one_over_cp", 1,
                             "one activation set at the layout's T_local: exactly 1/cp of the dense model's at T",
                             "README 'The layout': T_local is a rank's share of each sequence"};
  grading::run(check,
               [](grading::Record& record) { record.measured(expect_activation_memory_falls_as_one_over_cp()); });
}

TEST(Lab10Cp, RingOverlapsTransfers) {
  const grading::Check check{"lab10.ring_overlaps_transfers", 2,
                             "simulated H100s on pcie, virtual time: forward + backward with the ring's transfers "
                             "posted before the compute shorter, and blocked less, than waiting for each first; "
                             "the forward alone blocked less overlapped than waiting; waiting, the backward "
                             "blocked for all its transfers' time, overlapped for less",
                             "README 'The ring': start the hand-over of the block in hand, compute on it, then wait"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_ring_overlaps_transfers()); });
}
