// test_lab07_perf.cpp — lab 07's performance checks (label perf), on simulated GPU clusters (virtual time: the
// same bits on any machine, busy or not):
//   lab07.throughput_vs_reference  a tp 2 x pp 2 layout on two nodes of two GPUs (demo model) at least a stated
//                                  fraction as fast as the reference's: what keeping each tensor-parallel group
//                                  inside a node buys (the lesson's placement rule; TODO lab07-1's arithmetic)
//   lab07.mfu_at_gpt7b             the lesson's size, timing only: gpt-7b as tp 4 x pp 2 x dp 2 on 16 simulated
//                                  H100 in two nodes, its MFU within a margin of the reference's
// The harness (runs, summaries): tests/perf/perf_compare.h; docs/grading.md "Performance checks". The program
// runs directly (NP 1 in tests/lab07/CMakeLists.txt) and starts the two lab07_parallel_3d under mpiexec itself.
#include <cstdio>  // defines: std::snprintf
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grading.h"       // defines: grading::run, Check, Record
#include "perf_compare.h"  // defines: perf_test::throughput_check, mfu_check, split_words, SimSpec

namespace grading = scalelab::grading;
namespace perf = scalelab::perf_test;

namespace {

constexpr int kRanks = 4;         // tp 2 x pp 2 x dp 1
constexpr int kRanksPerNode = 2;  // two simulated nodes: NVLink inside, InfiniBand across (the sim backend's own)
constexpr int kSteps = 3;         // step 0 is not timed; every timed step lasts the same virtual time
constexpr const char* kGpu = "h100";
// The track's simulated tokens/s >= kMinFraction x the reference's. Measured (reference, demo model, B 8,
// T 128, 4 micro-batches, 1F1B; the slowest rank): --order tp-dp-pp (tp inside a node) 791,517 tokens/s,
// exposed communication 2.14 ms per step; the tensor-parallel groups across the nodes (--order pp-dp-tp, what
// the planted lab07-tp-across-nodes does to tp-dp-pp) 595,550 and 3.84 ms: 0.752. The grid arithmetic has
// one right answer, so a correct track measures 1.000; 8 ranks (dp 2) show the same, 1,528,670 against
// 1,160,058 (0.759), at twice the cost (9 s a run on 2 cores).
constexpr double kMinFraction = 0.90;

// lab07.mfu_at_gpt7b: gpt-7b (6.59B parameters, V 32,000) as tp 4 x pp 2 x dp 2 = 16 simulated H100 in two
// nodes of 8 (--ranks-per-node 8, the sim backend's own links: NVLink inside a node, InfiniBand across),
// --order tp-dp-pp (a tensor-parallel group and its replica inside a node, the two stages across the nodes),
// 1F1B over m = 4 micro-batches of one sequence (the bubble formula (pp-1)/(m+pp-1) = 0.2), T 2048,
// --precision bf16, --timing-only (nothing computed: 4-15 s of real time a run on the loaded 2-core machine).
// Measured (reference, docs/grading.md "Performance checks"): MFU 49.5 % of the fp32 peak (12,443 tokens/s);
// the planted slow one, the micro-batches sent through the pipeline one at a time
// (lab07-one-micro-batch-at-a-time), MFU 31.5 %: 0.635 x; the tensor-parallel groups across the nodes
// (--order pp-dp-tp, what lab07-tp-across-nodes does to tp-dp-pp) 39.6 %: 0.80 x.
constexpr int kMfuRanks = 16;  // tp 4 x pp 2 x dp 2
constexpr int kMfuRanksPerNode = 8;
constexpr int kMfuMicroBatches = 4;
constexpr int kMfuSteps = 2;  // step 0 is not timed: one timed step (every timed step lasts the same)
// The track's MFU >= kMfuMargin x the reference's (the same margin as labs 03-06).
constexpr double kMfuMargin = 0.97;
// Where the reference must sit: the lesson's good range is 40-55 %, and the kit's model puts this run at 49.5 %
// (of the fp32 peak). The band brackets the measured value, so a change of the device model or of the
// reference that moves it is seen here and re-measured.
constexpr double kRefMfuMin = 0.46;
constexpr double kRefMfuMax = 0.53;

// What both checks' runs share: the graded track's lab07_parallel_3d and the reference's, on `ranks` simulated
// H100s.
perf::SimSpec lab07_spec(int ranks) {
  perf::SimSpec spec;
  spec.lab = "lab07";
  spec.track = grading::track();
  spec.program = "lab07_parallel_3d";
  spec.gpu = kGpu;
  spec.ranks = ranks;
  return spec;
}

}  // namespace

TEST(Lab07Perf, ThroughputVsReference) {
  char target[1024];
  std::snprintf(target, sizeof(target),
                "on %d simulated %s GPUs in 2 nodes of %d (virtual time; NVLink inside a node, InfiniBand across): "
                "simulated tokens/s of your lab07_parallel_3d --tp 2 --pp 2 --order tp-dp-pp >= %.2f x the "
                "reference's with the same arguments (demo model, B 8, T 128, 4 micro-batches, 1F1B). One run each; "
                "deterministic, so it is graded on any machine",
                kRanks, kGpu, kRanksPerNode, kMinFraction);
  const grading::Check check{
      "lab07.throughput_vs_reference", /*points=*/2, target,
      "it runs your whole lab07_parallel_3d (TODOs lab07-1 to lab07-6): pass the other lab07 checks first. "
      "Then, if it is only slower: README 'Coordinates' and 'The placement rule, measured': which ranks share a "
      "node (--ranks-per-node 2: ranks 0-1 and 2-3), and which ranks form each tensor-parallel group in your "
      "layout? Compare the two runs' group figures in <build>/perf-runs/<track>/lab07/lab07-sim-*"};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec = lab07_spec(kRanks);
    spec.args = {"--model",
                 "demo",
                 "--tp",
                 "2",
                 "--pp",
                 "2",
                 "--order",
                 "tp-dp-pp",
                 "--ranks-per-node",
                 std::to_string(kRanksPerNode),
                 "--micro-batch",
                 "8",
                 "--seq-len",
                 "128",
                 "--micro-batches",
                 "4",
                 "--schedule",
                 "1f1b",
                 "--steps",
                 std::to_string(kSteps)};
    perf::SimComparison c;
    perf::throughput_check(record, spec, kMinFraction, &c);
  });
}

TEST(Lab07Perf, MfuAtGpt7b) {
  char target[1024];
  std::snprintf(target, sizeof(target),
                "gpt-7b as tp 4 x pp 2 x dp 2 on %d simulated H100 in 2 nodes of %d (--timing-only, --order "
                "tp-dp-pp, 1F1B, %d micro-batches of 1, T 2048, --precision bf16): the MFU of your "
                "lab07_parallel_3d (summary mfu) >= %.2f x the reference's, and the reference's in %.0f-%.0f %%. "
                "Deterministic, graded on any machine",
                kMfuRanks, kMfuRanksPerNode, kMfuMicroBatches, kMfuMargin, 100 * kRefMfuMin, 100 * kRefMfuMax);
  const grading::Check check{
      "lab07.mfu_at_gpt7b", /*points=*/1, target,
      "it runs your whole lab07_parallel_3d: pass the other lab07 checks first. Then README 'One training step': "
      "one call of lab 06's executor with the layout's schedule runs all m micro-batches, so the stages overlap; "
      "and 'The placement rule, measured': is each tensor-parallel group inside a node? Compare the two runs' "
      "step records (<build>/perf-runs/<track>/lab07/lab07-sim-*)"};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec = lab07_spec(kMfuRanks);
    spec.run_timeout_s = 150;  // 16 ranks on 2 cores: 4-15 s a run, more on a machine busier still
    spec.args = perf::split_words(
        "--model gpt-7b --timing-only --tp 4 --pp 2 --dp 2 --order tp-dp-pp --schedule 1f1b --precision bf16 "
        "--micro-batch 1 --seq-len 2048 --ranks-per-node " +
        std::to_string(kMfuRanksPerNode) + " --micro-batches " + std::to_string(kMfuMicroBatches) + " --steps " +
        std::to_string(kMfuSteps));
    perf::mfu_check(record, spec, kMfuMargin, kRefMfuMin, kRefMfuMax);  // skips without MPI or corpus
  });
}
