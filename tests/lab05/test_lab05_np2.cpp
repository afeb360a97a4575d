// test_lab05_np2.cpp — lab 05's graded checks on 2 ranks (mpiexec -n 2; sl_add_graded_test NP 2): one
// tensor-parallel group of both ranks, compared with ONE process running the whole model on the same batch
// (computed on every rank; lab05_support.h): the points alone on exact or random values, then the model's
// loss and every gradient against the matching slice of the dense gradient, steps of plain SGD (which cannot
// hide a wrongly scaled gradient) and of AdamW, the collectives the event log shows per layer, and the
// activation memory against the kit's formula. Every rank evaluates every assertion and grading::all_ranks
// combines them (grading.h), so a failure on one rank never leaves the other waiting.
// Lesson: labs/05_tensor_parallel/README.md ("What the tests check").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "grading.h"              // defines: grading::Check, grading::run, grading::all_ranks
#include "lab05_support.h"        // defines: the shared check bodies, tp_config, make_tp_model
#include "scalelab/core/error.h"  // defines: scalelab::Error

namespace {

using namespace scalelab;
using namespace scalelab::lab05_test;
namespace grading = scalelab::grading;

}  // namespace

TEST(Lab05Tp, ConjugateOperatorsAreExact) {
  const grading::Check check{"lab05.conjugate_operators_are_exact", 2,
                             "on exact integers (100 x rank + i): f identity forward and the group's sum backward; "
                             "g the sum forward with the bias added once, identity backward",
                             "README 'f and g': which direction of each operator communicates, and how often the "
                             "bias belongs in the output"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_f_and_g_exact()); });
}

TEST(Lab05Tp, VocabEmbeddingMatchesDense) {
  const grading::Check check{"lab05.vocab_embedding_matches_dense", 2,
                             "with wte split by vocabulary rows: the embedding's output, dwte's rows and dwpe equal "
                             "the dense embedding's bit for bit, with and without sequence parallelism",
                             "README 'The vocabulary split': tokens of other ranks' rows contribute zero; the "
                             "positions belong in the sum once"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_embedding_matches_dense(false);
    record.measured(a + "; sequence parallel: " + expect_embedding_matches_dense(true));
  });
}

TEST(Lab05Tp, VocabCrossEntropyMatchesDense) {
  const grading::Check check{"lab05.vocab_cross_entropy_matches_dense", 2,
                             "logits split by vocabulary columns: every row's loss, this rank's columns of the "
                             "softmax and of dlogits within 1e-6 (relative) of the dense cross-entropy's",
                             "README 'The vocabulary split': a row's loss needs the max, the sum of exponentials "
                             "and the target's logit over all V columns"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_cross_entropy_matches_dense()); });
}

TEST(Lab05Tp, BlockSplitMatchesDense) {
  const grading::Check check{"lab05.block_split_matches_dense", 2,
                             "block_split cuts each of the twelve block tensors and refuses other names; the model "
                             "cut by it at tp = 2: the loss within 1e-6 of the dense model's and every gradient "
                             "within 1e-5 (relative to the tensor) of its dense slice",
                             "README 'The column/row split': which input does each linear see whole, and which "
                             "output must stay a part until g; a head's q, k and v belong on one rank"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_block_split_matches_dense()); });
}

TEST(Lab05Tp, GradientsMatchDense) {
  const grading::Check check{"lab05.gradients_match_dense", 3,
                             "one forward and backward at tp = 2: the loss within 1e-6 of the dense model's and "
                             "every parameter's gradient within 1e-5 (relative to the tensor) of its dense slice",
                             "README 'The picture': which operator makes which gradient whole; the tensor and index "
                             "named in the failure tell which point is wrong"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_gradients_match_dense(false)); });
}

TEST(Lab05Tp, SequenceParallelGradientsMatchDense) {
  const grading::Check check{"lab05.sequence_parallel_gradients_match_dense", 3,
                             "the same with sequence parallelism, after sync_replicated_grads: the layernorms' "
                             "gradients whole on every rank",
                             "README 'Sequence parallel': the conjugate pairs, and which replicated gradients are "
                             "partial"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_gradients_match_dense(true)); });
}

TEST(Lab05Tp, SgdStepsMatchDense) {
  const grading::Check check{"lab05.sgd_steps_match_dense", 2,
                             "3 steps of train_step with plain SGD and clipping, with m = 1, 2 and 4 micro-batches: "
                             "the loss (the mean over the micro-batches), the norm (the whole model's) and every "
                             "parameter as the dense model's",
                             "README 'One training step': the loss and the gradient are means over the micro-batches "
                             "(each accumulated once); the norm is the whole model's, not this rank's shard's"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_sgd_steps_match_dense(false)); });
}

TEST(Lab05Tp, SequenceParallelSgdStepsMatchDense) {
  const grading::Check check{"lab05.sequence_parallel_sgd_steps_match_dense", 2,
                             "the same 3 SGD steps (m = 1, 2, 4) with sequence parallelism",
                             "README 'Sequence parallel' and 'One training step'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_sgd_steps_match_dense(true)); });
}

TEST(Lab05Tp, CollectivesPerLayer) {
  const grading::Check check{"lab05.collectives_per_layer", 2,
                             "from the event log, per forward and backward of L = 2 layers, the collectives of "
                             "(B,T,C) tensors: 2L+1 all-reduces each way; with sequence parallelism none, 2L+1 "
                             "all-gathers and 2L+1 reduce-scatters each way",
                             "README 'What each collective carries'"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_collectives_per_layer(false);
    record.measured(a + " | sequence parallel: " + expect_collectives_per_layer(true));
  });
}

TEST(Lab05Tp, ActivationMemoryMatchesFormula) {
  const grading::Check check{"lab05.activation_memory_matches_formula", 2,
                             "one activation set per rank, counted by the allocator, within 5 % of the kit's formula "
                             "for TP and for TP + SP (README 'Activation memory')",
                             "README 'Activation memory': what a shard keeps, and what sequence parallelism splits"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_activation_memory_matches_formula(false);
    record.measured(a + " | sequence parallel: " + expect_activation_memory_matches_formula(true));
  });
}

// N AdamW steps at tp = 2 follow the one-process curve: the same arithmetic but for the order of fp32 sums,
// which AdamW's normalised update does not amplify much over a few steps.
TEST(Lab05Tp, AdamwLossCurveFollowsOneRank) {
  const grading::Check check{"lab05.adamw_loss_curve_follows_one_rank", 2,
                             "6 AdamW steps at tp = 2: every step's loss within 1e-5 (relative) of the one-process "
                             "run's",
                             "README 'One training step'"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = tp_config();
    OptimizerConfig adamw;
    std::unique_ptr<GPT2> dense = make_model(cfg);
    Optimizer dense_opt(*dense, adamw);
    TpSetup s = make_tp_model(cfg, false);
    Optimizer opt(*s.model, adamw);
    double worst = 0;
    std::string curve;
    for (int step = 0; step < 6; ++step) {
      const GlobalBatch g = random_global_batch(kDataSeed + 10 + step, 2, 16, cfg.vocab_size);
      const OneProcessStep d = one_process_train_step(*dense, dense_opt, g, 3e-3f, 1.0f);
      MicroBatch mb{g.inputs, g.targets};
      const StepResult r = lab05::train_step(*s.model, opt, *s.points, nullptr, {mb}, 3e-3f, 1.0f);
      worst = std::max(worst, std::fabs(static_cast<double>(r.loss) - d.loss) / d.loss);
      char buf[48];
      std::snprintf(buf, sizeof(buf), "%s%.5f", curve.empty() ? "" : " ", r.loss);
      curve += buf;
    }
    EXPECT_TRUE(grading::all_ranks(worst <= 1e-5, on_rank("worst relative loss difference " + std::to_string(worst))));
    record.measured("losses " + curve + "; worst relative difference from one process " + std::to_string(worst));
  });
}
