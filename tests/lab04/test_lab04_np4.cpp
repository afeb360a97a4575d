// test_lab04_np4.cpp — lab 04's graded checks on 4 ranks (mpiexec -n 4; sl_add_graded_test NP 4): the
// properties of test_lab04_np2.cpp where a bug can hide at 2 ranks (an average over 2 that is really
// "divide by 2", a shard offset that is right only for rank 0 and 1), and units whose size 4 does NOT
// divide: padding in every unit, a last rank that owns fewer elements, and one that owns none. On
// correctness and counts alone: with more ranks than the development machine's 2 cores nothing here
// depends on timing (docs/design.md). The bodies are shared with the other programs (lab04_support.h).
#include <gtest/gtest.h>

#include <cstdint>  // defines: int64_t
#include <string>
#include <vector>

#include "fsdp.h"                 // defines: lab04::* (the track under test)
#include "grading.h"              // defines: grading::Check, grading::run, grading::all_ranks
#include "lab04_support.h"        // defines: configs, expect_grad_shards_match, expect_steps_match, ...
#include "scalelab/model/gpt2.h"  // defines: gpt2_unit_numel

namespace {

using namespace scalelab;
using namespace scalelab::lab04_test;
namespace grading = scalelab::grading;

}  // namespace

TEST(Lab04Fsdp4, GradShardsEqualSingleProcessFourRanks) {
  const grading::Check check{
      "lab04.grad_shards_equal_single_process_four_ranks", /*points=*/2,
      /*target=*/
      "4 ranks x 2 sequences, stages 1, 2, 3, one train_step (fp32, AdamW, no clipping): every rank's "
      "grad_shard_owned equals its slice of the one-process gradient of the 8 sequences, "
      "||got - want|| <= 1e-5 ||want|| + 1e-9 per unit",
      /*hint=*/
      "README 'Reduce-scatter': ReduceOp::Avg divides by the world size, whatever it is; rank r's chunk "
      "starts at r * shard"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (int st = 1; st <= 3; ++st) {
      measured += (measured.empty() ? "" : " | ") + expect_grad_shards_match(tiny_config(), stage_of(st), 1);
    }
    record.measured(measured);
  });
}

TEST(Lab04Fsdp4, AdamwStepsMatchSingleProcessFourRanks) {
  const grading::Check check{
      "lab04.adamw_steps_match_single_process_four_ranks", /*points=*/2,
      /*target=*/
      "4 ranks, stages 1, 2, 3, 3 AdamW steps (lr 1e-3, wd 0.1, clip 0.05 active): parameters within 1e-4 "
      "of one process, loss and gradient norm within 1e-5 relative, kept units consistent, every step",
      /*hint=*/"README 'The update': the gradient norm sums the squares of ALL ranks' shards (one all_reduce)"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (int st = 1; st <= 3; ++st) measured += (measured.empty() ? "" : " | ") + adamw_steps(st, tiny_config());
    record.measured(measured);
  });
}

TEST(Lab04Fsdp4, UnevenUnitsMatchSingleProcess) {
  const grading::Check check{
      "lab04.uneven_units_match_single_process", /*points=*/3,
      /*target=*/
      "4 ranks, units that 4 does not divide (C=9 model: 711, 1089, 1089, 18 elements; C=3 model: 72, 147, "
      "6, where rank 3 owns none of ln_f), stages 1, 2, 3: grad shards equal the one-process gradient "
      "(1e-5 relative per unit), 3 AdamW steps within 1e-4 of one process, padding stays zero",
      /*hint=*/
      "README 'Shards and padding': the model sees [0, n) only; the optimizer updates [0, owned) of the "
      "shard (owned may be 0); padding is never written"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (const GPTConfig& cfg : {uneven_config(), sliver_config()}) {
      // The check's precondition (both tracks): these sizes really leave padding at 4 ranks.
      const std::vector<int64_t> n = gpt2_unit_numel(cfg), P = padded_sizes(cfg, 4);
      int padded_units = 0;
      for (size_t u = 0; u < n.size(); ++u) padded_units += P[u] > n[u];
      if (cfg.n_embd == 9) {
        EXPECT_EQ(padded_units, static_cast<int>(n.size())) << "every unit of the C=9 model is padded";
      }
      if (cfg.n_embd == 3) {
        EXPECT_EQ(n.back(), 6) << "ln_f of the C=3 model: 6 elements, shard 2, rank 3 owns none";
      }
      for (int st = 1; st <= 3; ++st) {
        measured += (measured.empty() ? "" : " | ") + std::string("C=") + std::to_string(cfg.n_embd) + " " +
                    expect_grad_shards_match(cfg, stage_of(st), 1) + "; " + adamw_steps(st, cfg);
      }
    }
    record.measured(measured);
  });
}

TEST(Lab04Fsdp4, MemoryMatchesEstimateFourRanks) {
  const grading::Check check{
      "lab04.memory_matches_estimate_four_ranks", /*points=*/2,
      /*target=*/
      "4 ranks, L=8 C=64 model, AdamW, prefetch 1, stages 1-3, fp32 and bf16: each rank's params, grads "
      "and optimizer_state bytes (persistent and peak during a step) within 5 % of estimate_memory",
      /*hint=*/
      "README 'Reduce-scatter' and 'ZeRO-3': the optimizer state, the gradient shards and (ZeRO-3) the "
      "parameter shards are 1/N of the PADDED unit on every rank"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_memory_matches_estimate()); });
}

TEST(Lab04Fsdp4, CommunicationVolumeFourRanks) {
  const grading::Check check{
      "lab04.communication_volume_four_ranks", /*points=*/2,
      /*target=*/
      "4 ranks, the C=9 model (every unit padded), one train_step of 2 micro-steps, stages 1-3, fp32 and "
      "bf16: per unit the collectives of lab04.communication_volume_per_stage with the PADDED sizes "
      "(reduce_scatter 4 * ceil(n/4) elements, all_gather ceil(n/4)); ZeRO-1's bus bytes equal an fp32 "
      "all_reduce of the padded gradient",
      /*hint=*/"README 'Shards and padding': collectives move the padded buffer (equal chunks), never the unit's n"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_communication_volume(uneven_config())); });
}
