// test_lab03_np4.cpp — lab 03's graded checks on 4 ranks (mpiexec -n 4; sl_add_graded_test NP 4): the
// same properties as test_lab03_np2.cpp where a bug can hide at 2 ranks (an average over 2 that is
// really "divide by 2", a ring that only works for a pair), on correctness alone: with more ranks than
// the development machine's 2 cores nothing here depends on timing (docs/design.md). The bodies are shared
// with the 2-rank program (lab03_support.h). Lesson: labs/03_ddp/README.md ("What the tests check").
#include <gtest/gtest.h>

#include <string>

#include "ddp.h"                   // defines: lab03::SyncMode (the track under test)
#include "grading.h"               // defines: grading::Check, grading::run
#include "lab03_support.h"         // defines: expect_reduced_gradients_match, expect_steps_match
#include "scalelab/model/optim.h"  // defines: OptimizerConfig

namespace {

using namespace scalelab;
using namespace scalelab::lab03_test;
namespace grading = scalelab::grading;

const lab03::SyncMode kModes[] = {lab03::SyncMode::Naive, lab03::SyncMode::Bucketed, lab03::SyncMode::Overlap};

}  // namespace

TEST(Lab03Ddp4, GradsEqualSingleProcessFourRanks) {
  const grading::Check check{
      "lab03.grads_equal_single_process_four_ranks", /*points=*/2,
      /*target=*/
      "4 ranks x 2 sequences, naive, bucketed and overlap: every reduced gradient tensor equals the "
      "one-process gradient of the 8 sequences within 1e-5 of its largest entry; identical on every rank",
      /*hint=*/"README 'Naive data parallel': ReduceOp::Avg divides by the world size, whatever it is"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (const lab03::SyncMode mode : kModes) {
      measured += (measured.empty() ? "" : " | ") + expect_reduced_gradients_match(mode);
    }
    record.measured(measured);
  });
}

TEST(Lab03Ddp4, SgdStepsMatchSingleProcessFourRanks) {
  constexpr double kParamAtol = 1e-5;  // as in lab03.sgd_steps_match_single_process (test_lab03_np2.cpp)
  const grading::Check check{
      "lab03.sgd_steps_match_single_process_four_ranks", /*points=*/2,
      /*target=*/
      "3 train_steps of plain SGD (lr 0.5, no clipping), 4 ranks x 2 micro-steps, each mode: gradients "
      "(1e-5 relative) and parameters (1e-5 absolute) match one process on the global batch of 16; "
      "parameters identical on every rank after every step",
      /*hint=*/
      "README 'Gradient accumulation': micro-steps per optimizer step and the 1/m of the accumulated "
      "gradient do not depend on the world size"};
  grading::run(check, [](grading::Record& record) {
    OptimizerConfig sgd;
    sgd.kind = OptimizerConfig::Kind::SGD;
    sgd.weight_decay = 0.0f;
    std::string measured;
    for (const lab03::SyncMode mode : kModes) {
      measured += (measured.empty() ? "" : " | ") + expect_steps_match(mode, sgd, /*lr=*/0.5f, /*grad_clip=*/0.0f,
                                                                       /*steps=*/3, /*micro_steps=*/2, kParamAtol);
    }
    record.measured(measured);
  });
}
