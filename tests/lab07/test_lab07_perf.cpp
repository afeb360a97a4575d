// test_lab07_perf.cpp — lab 07's performance check (label perf): a tp 2 x pp 2 layout on two simulated nodes
// of two GPUs (virtual time: the same bits on any machine) is at least a stated fraction as fast as the
// reference's, which is what keeping each tensor-parallel group inside a node buys (the lesson's placement
// rule; the rank -> coordinates arithmetic of TODO lab07-1 decides where a group lands). The harness (runs,
// summaries): tests/perf/perf_compare.h; docs/grading.md "Performance checks". The program runs directly
// (NP 1 in tests/lab07/CMakeLists.txt) and starts the two lab07_parallel_3d under mpiexec itself.
#include <cstdio>  // defines: std::snprintf
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grading.h"       // defines: grading::run, Check, Record
#include "perf_compare.h"  // defines: perf_test::throughput_check, SimSpec, SimComparison

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
    perf::SimSpec spec;
    spec.lab = "lab07";
    spec.track = grading::track();
    spec.program = "lab07_parallel_3d";
    spec.gpu = kGpu;
    spec.ranks = kRanks;
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
