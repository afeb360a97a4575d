// test_lab03_perf.cpp — lab 03's performance check (label perf): on a simulated GPU cluster (virtual time,
// so the same bits on any machine, busy or not), the track's data-parallel training is at least a stated
// fraction as fast as the reference's with the same arguments, and its overlap hides the all-reduce. The
// harness (runs, summaries): tests/perf/perf_compare.h. How the fraction was chosen, from measurements:
// docs/grading.md "Performance checks". The program runs directly (NP 1 in tests/lab03/CMakeLists.txt): it
// starts bin/<track>/lab03_ddp and the reference's lab03_ddp under mpiexec itself, one after the other.
#include <cstdio>  // defines: std::snprintf
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grading.h"       // defines: grading::run, Check, Record
#include "perf_compare.h"  // defines: perf_test::throughput_check, SimSpec, SimComparison

namespace grading = scalelab::grading;
namespace perf = scalelab::perf_test;

namespace {

constexpr int kRanks = 2;
constexpr int kSteps = 3;  // step 0 is not timed; every timed step lasts the same virtual time
constexpr const char* kGpu = "h100";
// The link: 100 Gb/s Ethernet between the two simulated H100s, where the demo model's gradient all-reduce
// (0.88 ms busy per step) costs about half of the step's compute (2.2 ms), as on a real cluster. Measured
// (reference, B 8, T 128, tokens/s of overlap / naive): the GPU's own NVLink 898,722 / 692,139 (0.77: the
// all-reduce is too short to tell bucketing from overlap), infiniband 867,468 / 487,114 (bucketed 0.88),
// ethernet100 809,031 / 438,818 (bucketed 0.80): the widest gap between a blocking and an overlapped sync.
constexpr const char* kLink = "ethernet100";
// The track's simulated tokens/s >= kMinFraction x the reference's. Measured on ethernet100 (docs/grading.md
// "Performance checks"): sound alternatives, modelled by the reference with other bucket caps, 0.995
// (--bucket-mb 0.25), 1.018 (2), 0.979 (4); the planted slow ones: launching every bucket after backward
// (lab03-overlap-launch-after-backward: 0.830; --mode bucketed, every bucket after backward: 0.801), one
// all-reduce per tensor (lab03-bucket-per-tensor, the buckets of --bucket-mb 0: 0.677), naive (--mode naive: 0.542).
constexpr double kMinFraction = 0.90;
// The step waits for at most this share of the all-reduce's busy time (overlap's point: the rest runs under
// backward). Measured: the reference 0.318 of 0.881 ms (0.36; 0.27 at --bucket-mb 0.25, 0.57 at 4: only the
// last bucket is exposed); blocking syncs wait for all of it, and more (--mode bucketed 1.011 of 0.881 ms).
constexpr double kMaxExposedShare = 0.5;

}  // namespace

TEST(Lab03Perf, ThroughputVsReference) {
  char target[1024];
  std::snprintf(target, sizeof(target),
                "on %d simulated %s GPUs (virtual time, --link %s): simulated tokens/s of your lab03_ddp "
                "--mode overlap >= %.2f x the reference's with the same arguments (demo model, B 8, T 128, "
                "--bucket-mb 1), and the exposed all-reduce (summary comm_ms) <= %.2f x its busy time "
                "(comm_busy_ms). One run each; deterministic, so it is graded on any machine",
                kRanks, kGpu, kLink, kMinFraction, kMaxExposedShare);
  const grading::Check check{
      "lab03.throughput_vs_reference", /*points=*/2, target,
      "README 'Overlap': compare comm_ms (exposed) and comm_busy_ms of the two runs' step records "
      "(<build>/perf-runs/<track>/lab03/lab03-sim-*); is each bucket's all-reduce started during backward and "
      "waited for only once, at the end, and are the buckets large (not one call per tensor)?"};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec;
    spec.lab = "lab03";
    spec.track = grading::track();
    spec.program = "lab03_ddp";
    spec.gpu = kGpu;
    spec.ranks = kRanks;
    spec.args = {"--model",          "demo",
                 "--mode",           "overlap",
                 "--bucket-mb",      "1",
                 "--link",           kLink,
                 "--micro-batch",    "8",
                 "--seq-len",        "128",
                 "--steps",          std::to_string(kSteps),
                 "--threads",        "1",
                 "--val-every",      "0",
                 "--val-batches",    "1",
                 "--sample-tokens",  "0",
                 "--timeline-steps", "0",
                 "--quiet"};
    perf::SimComparison c;
    if (!perf::throughput_check(record, spec, kMinFraction, &c)) return;  // skipped: no MPI, no corpus
    EXPECT_LE(c.track.exposed_ms, kMaxExposedShare * c.track.busy_ms)
        << "the step waited " << c.track.exposed_ms << " ms for the all-reduce, which was busy " << c.track.busy_ms
        << " ms: overlap should hide most of it under backward";
  });
}
