// test_lab05_np4.cpp — lab 05's graded checks on 4 ranks (mpiexec -n 4 --oversubscribe; NP 4): one group of
// four, and two groups of two with two data-parallel replicas, against one process running the whole model.
// Shared bodies and tolerances: lab05_support.h. Lesson: labs/05_tensor_parallel/README.md.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "grading.h"              // defines: grading::Check, grading::run, grading::all_ranks
#include "lab05_support.h"        // defines: the shared check bodies, tp_config
#include "scalelab/core/error.h"  // defines: scalelab::Error, NotImplemented

namespace {

using namespace scalelab;
using namespace scalelab::lab05_test;
namespace grading = scalelab::grading;

}  // namespace

TEST(Lab05Tp4, GradientsMatchDenseFourRanks) {
  const grading::Check check{"lab05.gradients_match_dense_four_ranks", 2,
                             "tp = 4: the loss and every gradient as the dense model's (gradients_match_dense)",
                             "README 'The picture'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_gradients_match_dense(false)); });
}

TEST(Lab05Tp4, SequenceParallelGradientsMatchDenseFourRanks) {
  const grading::Check check{"lab05.sequence_parallel_gradients_match_dense_four_ranks", 2,
                             "tp = 4 with sequence parallelism: the loss and every gradient as the dense model's",
                             "README 'Sequence parallel'"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_gradients_match_dense(true)); });
}

TEST(Lab05Tp4, CollectivesPerLayerFourRanks) {
  const grading::Check check{"lab05.collectives_per_layer_four_ranks", 1,
                             "tp = 4: the same collectives per layer as at tp = 2, with and without sequence "
                             "parallelism",
                             "README 'What each collective carries'"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_collectives_per_layer(false);
    record.measured(a + " | sequence parallel: " + expect_collectives_per_layer(true));
  });
}

TEST(Lab05Tp4, ActivationMemoryMatchesFormulaFourRanks) {
  const grading::Check check{"lab05.activation_memory_matches_formula_four_ranks", 1,
                             "tp = 4: one activation set within 5 % of the formula, TP and TP + SP",
                             "README 'Activation memory'"};
  grading::run(check, [](grading::Record& record) {
    const std::string a = expect_activation_memory_matches_formula(false);
    record.measured(a + " | sequence parallel: " + expect_activation_memory_matches_formula(true));
  });
}

// tp = 2 x dp = 2: each group trains on its half of the global batch; after train_step's data-parallel
// average every rank's parameters equal its slice of one process's after the same SGD steps on the whole
// global batch.
TEST(Lab05Tp4, DataParallelReplicasOfTwoWayGroups) {
  const grading::Check check{"lab05.data_parallel_replicas_of_two_way_groups", 2,
                             "tp fastest (rank r: tp_rank r % 2, dp_rank r / 2); 2 groups of tp = 2 on halves of the "
                             "global batch: after 2 SGD steps (m = 1, then 2 micro-batches) every parameter within "
                             "1e-6 of its slice of one process on the whole batch",
                             "README 'One training step': the order of the steps (accumulate, make whole, average "
                             "across replicas, clip on the whole model's norm)"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = tp_config();
    Communicator& w = world();
    const lab05::Layout layout = lab05::make_layout(cfg, w.size(), w.rank(), 2, false);
    const bool tp_fastest = layout.tp == 2 && layout.dp == 2 && layout.tp_rank == w.rank() % 2 &&
                            layout.dp_rank == w.rank() / 2;  // a group of consecutive ranks: inside a node
    EXPECT_TRUE(grading::all_ranks(tp_fastest, on_rank("tp_rank " + std::to_string(layout.tp_rank) + ", dp_rank " +
                                                       std::to_string(layout.dp_rank) + ": tp must vary fastest")));
    std::unique_ptr<Communicator> tp_group = w.split(layout.dp_rank, layout.tp_rank);
    std::unique_ptr<Communicator> dp_group = w.split(layout.tp_rank, layout.dp_rank);
    lab05::MegatronPoints points(*tp_group, false);
    GPT2 model(cfg, lab05::shard_of(layout), PrecisionPolicy::fp32(), Device::CPU, kModelSeed);
    model.set_tensor_parallel(&points);
    OptimizerConfig sgd;
    sgd.kind = OptimizerConfig::Kind::SGD;
    sgd.weight_decay = 0.0f;
    Optimizer opt(model, sgd);
    std::unique_ptr<GPT2> dense = make_model(cfg);
    Optimizer dense_opt(*dense, sgd);
    std::string bad;
    for (int step = 0; step < 2 && bad.empty(); ++step) {
      const GlobalBatch g = random_global_batch(kDataSeed + 20 + step, 4, 16, cfg.vocab_size);
      one_process_train_step(*dense, dense_opt, g, 0.1f, 1.0f);
      const int m = step + 1;  // step 0: one micro-batch of this replica's 2 rows; step 1: two of one row
      std::vector<MicroBatch> micro;
      for (int i = 0; i < m; ++i) {
        const GlobalBatch rows = batch_rows(g, 2 * layout.dp_rank + i * (2 / m), 2 / m);  // this replica's half
        micro.push_back(MicroBatch{rows.inputs, rows.targets});
      }
      lab05::train_step(model, opt, points, dp_group.get(), micro, 0.1f, 1.0f);
      bad = compare_with_dense_slices(model, *dense, /*grads=*/false, 0, 1e-6, nullptr);
      if (!bad.empty()) bad = "after step " + std::to_string(step) + " (m = " + std::to_string(m) + "): " + bad;
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank(bad)));
    record.measured(bad.empty() ? "every parameter of both replicas as one process's after 2 SGD steps (m = 1, 2)"
                                : bad);
  });
}

TEST(Lab05Tp4, BadLayoutsFailOnEveryRankFourRanks) {
  const grading::Check check{"lab05.bad_layouts_fail_on_every_rank_four_ranks", 1,
                             "make_layout gives tp = 4 on 4 ranks (tp_rank = rank, dp 1) and refuses, on every rank "
                             "and before any collective, tp = 3 (not dividing 4 ranks), tp = 8 (more than the ranks), "
                             "NH = 3 heads with tp = 2",
                             "README 'The layout'"};
  grading::run(check, [](grading::Record& record) {
    const int n = world().size(), r = world().rank();
    GPTConfig three_heads = tp_config();  // NH = 3 heads of 16 channels: not divisible by tp = 2
    three_heads.n_head = 3;
    three_heads.n_embd = 48;
    const lab05::Layout good = lab05::make_layout(tp_config(), n, r, n, false);  // a NotImplemented ends it here
    const bool good_ok = good.tp == n && good.dp == 1 && good.tp_rank == r && good.dp_rank == 0;
    EXPECT_TRUE(grading::all_ranks(good_ok, on_rank("tp " + std::to_string(good.tp) + " dp " + std::to_string(good.dp) +
                                                    " tp_rank " + std::to_string(good.tp_rank) +
                                                    " for tp = " + std::to_string(n))));
    const GPTConfig thirds{16, 96, 2, 6, 48};  // NH, 4C and V divide by 3: only the ranks do not
    int refused = 0;
    for (const auto& [cfg, tp] : {std::pair<GPTConfig, int>{thirds, 3}, {tp_config(), 2 * n}, {three_heads, 2}}) {
      try {
        lab05::make_layout(cfg, n, r, tp, false);
      } catch (const NotImplemented&) {
        throw;
      } catch (const Error&) {
        ++refused;
      }
    }
    EXPECT_TRUE(grading::all_ranks(refused == 3, on_rank(std::to_string(refused) + " of 3 bad layouts refused")));
    record.measured("the good layout right; %d of 3 bad layouts refused on every rank", refused);
  });
}
