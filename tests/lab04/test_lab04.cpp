// test_lab04.cpp — lab 04's single-process graded checks: shard_layout (a pure function: sizes that
// divide and sizes that do not, more ranks than elements, refused arguments), and FSDP on ONE rank
// (the local communicator): every stage must train exactly like GPT2 + Optimizer, and its memory must be
// what estimate_memory says. The multi-rank checks: test_lab04_np2.cpp and test_lab04_np4.cpp. Built twice
// by sl_add_graded_test (tests/lab04/CMakeLists.txt): against lab04_learner (labs/04_fsdp/fsdp.cpp) and
// lab04_ref (solutions/04_fsdp/fsdp.cpp). Every expected value is computed here, independently of the track.
#include <gtest/gtest.h>

#include <cstdint>  // defines: int64_t
#include <string>
#include <vector>

#include "fsdp.h"                 // defines: lab04::shard_layout, ZeroStage (the track under test)
#include "grading.h"              // defines: grading::Check, grading::run, grading::Record
#include "lab04_support.h"        // defines: tiny_config, expect_grad_shards_match, expect_steps_match, ...
#include "scalelab/core/error.h"  // defines: scalelab::Error, scalelab::NotImplemented

namespace {

using namespace scalelab;
using namespace scalelab::lab04_test;
namespace grading = scalelab::grading;

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(Lab04Fsdp, ShardLayoutPadsToEqualChunks) {
  const grading::Check check{
      "lab04.shard_layout_pads_to_equal_chunks", /*points=*/2,
      /*target=*/
      "for numel/ranks 12/4, 10/4, 5/4, 3/4, 1/8, 7/1, 1089/4, 711/2, 2^33+1/3 and every rank: shard = "
      "ceil(n/N), padded = N*shard, begin = rank*shard, owned = clamp(n - begin, 0, shard); the owned "
      "ranges tile [0, n) exactly; numel < 1, rank outside [0, N), N < 1 throw scalelab::Error",
      /*hint=*/
      "README 'Shards and padding': collectives need equal chunks; the last ranks may own fewer real "
      "elements, or none (10 elements on 4 ranks: 3, 3, 3, 1)"};
  grading::run(check, [](grading::Record& record) {
    struct Case {
      int64_t numel;
      int world;
    };
    const Case cases[] = {
        {12, 4}, {10, 4}, {5, 4}, {3, 4}, {1, 8}, {7, 1}, {1089, 4}, {711, 2}, {(int64_t{1} << 33) + 1, 3}};
    std::string problem;
    int layouts = 0;
    for (const Case& c : cases) {
      const int64_t shard = (c.numel + c.world - 1) / c.world;  // the README's rule, written here
      int64_t covered = 0;                                      // owned ranges must tile [0, numel)
      for (int r = 0; r < c.world; ++r) {
        const lab04::ShardLayout l = lab04::shard_layout(c.numel, r, c.world);
        ++layouts;
        const int64_t begin = r * shard;
        const int64_t owned = std::max<int64_t>(0, std::min(shard, c.numel - begin));
        if (problem.empty() && (l.numel != c.numel || l.shard != shard || l.padded != shard * c.world ||
                                l.begin != begin || l.owned != owned)) {
          problem = "shard_layout(" + std::to_string(c.numel) + ", rank " + std::to_string(r) + ", " +
                    std::to_string(c.world) + " ranks) = {numel " + std::to_string(l.numel) + ", shard " +
                    std::to_string(l.shard) + ", padded " + std::to_string(l.padded) + ", begin " +
                    std::to_string(l.begin) + ", owned " + std::to_string(l.owned) + "}, expected {" +
                    std::to_string(c.numel) + ", " + std::to_string(shard) + ", " + std::to_string(shard * c.world) +
                    ", " + std::to_string(begin) + ", " + std::to_string(owned) + "}";
        }
        if (l.owned > 0) {
          if (problem.empty() && l.begin != covered) problem = "owned ranges leave a gap or overlap";
          covered = l.begin + l.owned;
        }
      }
      if (problem.empty() && covered != c.numel) {
        problem = std::to_string(c.numel) + " on " + std::to_string(c.world) + " ranks: the owned ranges cover [0, " +
                  std::to_string(covered) + ")";
      }
    }
    // Refused arguments (after the valid calls, so an unwritten TODO reports not_implemented first).
    struct Bad {
      int64_t numel;
      int rank, world;
    };
    const Bad bad[] = {{0, 0, 4}, {-5, 0, 2}, {10, -1, 4}, {10, 4, 4}, {10, 0, 0}};
    int refused = 0;
    for (const Bad& b : bad) {
      try {
        lab04::shard_layout(b.numel, b.rank, b.world);
      } catch (const NotImplemented&) {
        throw;  // a TODO stub: let grading::run report it
      } catch (const Error&) {
        ++refused;
        continue;
      }
      if (problem.empty()) {
        problem = "shard_layout(" + std::to_string(b.numel) + ", " + std::to_string(b.rank) + ", " +
                  std::to_string(b.world) + ") was accepted";
      }
    }
    record.measured("%d layouts checked, %d of 5 bad arguments refused%s%s", layouts, refused,
                    problem.empty() ? "" : "; ", problem.c_str());
    EXPECT_TRUE(problem.empty()) << problem;
  });
}

TEST(Lab04Fsdp, OneRankTrainsLikeGpt2) {
  // On one rank every collective is a copy, so FSDP must give GPT2 + Optimizer's numbers up to the
  // order of a few float sums (the sharded gradient norm adds the units' sums of squares itself).
  const grading::Check check{
      "lab04.one_rank_trains_like_gpt2", /*points=*/1,
      /*target=*/
      "1 rank (local communicator), tiny model, stages 1, 2, 3: the gradient shard equals the GPT2 "
      "gradient (1e-5 relative per unit); 3 AdamW steps (lr 1e-3, clip 0.05 active): parameters within "
      "1e-6 of GPT2 + Optimizer, loss and gradient norm within 1e-5 relative",
      /*hint=*/"README 'The picture': with N = 1 each shard is the whole unit; start with ZeRO-1 and one rank"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (int st = 1; st <= 3; ++st) {
      measured += (measured.empty() ? "" : " | ") + expect_grad_shards_match(tiny_config(), stage_of(st), 1);
      StepsSpec spec;
      spec.cfg = tiny_config();
      spec.stage = stage_of(st);
      spec.opt = adamw();
      spec.lr = 1e-3f;
      spec.grad_clip = 0.05f;
      spec.tol.atol = 1e-6;
      measured += "; " + expect_steps_match(spec);
    }
    record.measured(measured);
  });
}

TEST(Lab04Fsdp, MemoryMatchesEstimateOneRank) {
  const grading::Check check{
      "lab04.memory_matches_estimate_one_rank", /*points=*/1,
      /*target=*/
      "1 rank, L=8 C=64 model, AdamW, prefetch 1, stages 1-3, fp32 and bf16: the allocator's params, "
      "grads and optimizer_state bytes (persistent and peak during a step) within 5 % of estimate_memory",
      /*hint=*/
      "README 'Reduce-scatter' and 'ZeRO-3': ZeRO-2/3 free the full gradient once reduce-scattered; ZeRO-3 frees gathered "
      "blocks after use; the optimizer keeps m, v (and the bf16 policy's fp32 master) of its shard only"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_memory_matches_estimate()); });
}
