// test_lab08_np4.cpp — lab 08's straggler check on 4 ranks (mpiexec -n 4; sl_add_graded_test NP 4): lab 07's
// reference at dp 4 on the tiny model, every rank's forward taking 10 ms (backward 20), one rank 3 times
// longer; the track's find_stragglers must name that rank, for each of the 4. The uniform compute is a sleep,
// so 4 ranks on 2 cores keep their times. Lesson: labs/08_resilience/README.md ("Stragglers").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data_parallel.h"  // defines: dp_test::fresh_comm, random_global_batch, batch_rows, tiny_config
#include "grading.h"        // defines: grading::Check, grading::run, grading::all_ranks
#include "parallel_3d.h"    // defines: lab07::make_layout, build_rank, train_step (lab 07's reference)
#include "resilience.h"     // defines: lab08::find_stragglers (the track)

namespace {

using namespace scalelab;
namespace grading = scalelab::grading;

constexpr int kT = 8, kSteps = 5;
constexpr double kForwardMs = 10, kSlowFactor = 3;

// This rank's compute and wait per step over kSteps steps of dp 4, rank `slow` kSlowFactor times slower.
lab08::RankTimes run_with_slow_rank(int slow) {
  auto world = dp_test::fresh_comm();
  const GPTConfig cfg = dp_test::tiny_config();
  const lab07::Layout layout = lab07::make_layout(cfg, {1, 1, world->size(), "tp-dp-pp"}, world->size(), world->rank(),
                                                  lab06::ScheduleKind::OneFOneB, 1, 1, 0, false);
  auto part = lab07::build_rank(*world, cfg, layout, OptimizerConfig{}, PrecisionPolicy::fp32(), Device::CPU,
                                dp_test::kModelSeed);
  const double f = kForwardMs * (world->rank() == slow ? kSlowFactor : 1.0);
  part->stage->set_uniform_compute(f, 2 * f);
  lab08::RankTimes t;
  t.rank = world->rank();
  for (int step = 0; step < kSteps; ++step) {
    const dp_test::GlobalBatch g =
        dp_test::random_global_batch(dp_test::kDataSeed + step, world->size() * dp_test::kMicroBatch, kT, 64);
    const dp_test::GlobalBatch rows =
        dp_test::batch_rows(g, int64_t{world->rank()} * dp_test::kMicroBatch, dp_test::kMicroBatch);
    part->groups.dp->clear_events();
    part->stage->clear();
    lab07::train_step(*part, {{rows.inputs, rows.targets}}, 1e-2f, 1.0f);
    double wait = 0;
    for (const CommEvent& e : part->groups.dp->events()) wait += e.wait_ms;
    t.compute_ms.push_back(part->stage->compute_ms());
    t.wait_ms.push_back(wait);
  }
  return t;
}

}  // namespace

TEST(Lab08Straggler, SlowRankNamedFourRanks) {
  const grading::Check check{"lab08.slow_rank_named_four_ranks", 3,
                             "dp 4, every forward 10 ms and backward 20 ms of sleep, one rank 3x slower, 5 steps: "
                             "find_stragglers (threshold 1.25) over the gathered times names exactly that rank, for "
                             "each of the 4 ranks in turn",
                             "README 'Stragglers'"};
  grading::run(check, [](grading::Record& record) {
    std::string named;
    for (int slow = 0; slow < 4; ++slow) {
      const lab08::RankTimes mine = run_with_slow_rank(slow);
      auto world = dp_test::fresh_comm();
      const std::vector<lab08::RankTimes> all = lab08::gather_rank_times(*world, mine, kSteps);
      const std::vector<lab08::Straggler> found = lab08::find_stragglers(all, 1.25);
      std::string got;
      for (const lab08::Straggler& s : found) got += (got.empty() ? "" : ",") + std::to_string(s.rank);
      ASSERT_TRUE(grading::all_ranks(found.size() == 1 && found[0].rank == slow,
                                     "rank " + std::to_string(slow) + " slowed: find_stragglers named [" + got + "]"));
      char line[96];
      std::snprintf(line, sizeof(line), "%s%d: %.2fx, others waited %.0f ms", named.empty() ? "" : "; ", slow,
                    found[0].ratio, found[0].others_wait_ms);
      named += line;
    }
    record.measured("slowed rank named each time (%s)", named.c_str());
  });
}
