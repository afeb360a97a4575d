// test_lab03_perf.cpp — lab 03's performance checks (label perf): on a simulated GPU cluster (virtual time,
// so the same bits on any machine, busy or not), the track's data-parallel training is at least a stated
// fraction as fast as the reference's with the same arguments, and its overlap hides the all-reduce; at the
// lesson's size (GPT-2 124M on 8 simulated H100, timing only) its MFU is within a margin of the reference's. The
// harness (runs, summaries): tests/perf/perf_compare.h. How the fraction was chosen, from measurements:
// docs/grading.md "Performance checks". The program runs directly (NP 1 in tests/lab03/CMakeLists.txt): it
// starts bin/<track>/lab03_ddp and the reference's lab03_ddp under mpiexec itself, one after the other.
#include <cstdio>  // defines: std::snprintf
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grading.h"       // defines: grading::run, Check, Record
#include "perf_compare.h"  // defines: perf_test::throughput_check, mfu_check, split_words, SimSpec, SimComparison

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

// lab03.mfu_at_gpt2_small: the lesson's setup, GPT-2 small (124M) on 8 simulated H100 over their NVLink (the
// GPU's own intra-node link), T 1024, micro-batch 8, bf16 matmuls on the tensor cores (--precision
// bf16-compute), --timing-only (nothing computed: about a second of real time a run). Measured (reference,
// docs/grading.md "Performance checks"): MFU 11.25 % (1,041,097 tokens/s; all-reduce 1.12 ms exposed of 5.15
// busy, step 63 ms); the planted slow sync that launches every bucket from the last hook
// (lab03-overlap-launch-when-all-ready) 0.947 x, --mode bucketed 0.931 x, --mode naive 0.877 x; sound
// alternatives: --bucket-mb 0 (one bucket per tensor) 0.987 x, --bucket-mb 4 1.003 x, --bucket-mb 25 1.006 x.
constexpr int kMfuRanks = 8;
constexpr int kMfuSteps = 2;  // step 0 is not timed: one timed step (every timed step lasts the same)
// The track's MFU >= kMfuMargin x the reference's: over NVLink the all-reduce (5.2 ms busy) is 8 % of the
// 63 ms step, so a sync that hides little of it costs 5-7 % and a sound variant at most 1.3 %.
constexpr double kMfuMargin = 0.97;
// Where the reference must sit. The lesson's good range for this setup is 40-55 % of the bf16 peak; the
// kit's model puts it at 11.3 %: its attention materialises the T x T scores and runs in fp32 (the fp32
// units, 67 of the H100's 989 TFLOP/s, at efficiency 0.5): 12 B T^2 C FLOPs a layer, 28 ms of the 63 ms
// step at T 1024, and the elementwise ops (LayerNorm, GELU, softmax, AdamW) are separate fp32 passes over HBM.
// Fused bf16 flash attention is what takes real runs to 40-55 %. The band brackets the measured value, so
// a change of the device model or of the reference that moves it is seen here and re-measured.
constexpr double kRefMfuMin = 0.10;
constexpr double kRefMfuMax = 0.13;

}  // namespace

TEST(Lab03Perf, MfuAtGpt2Small) {
  char target[1024];
  std::snprintf(target, sizeof(target),
                "GPT-2 124M on %d simulated H100 over NVLink (--timing-only, T 1024, B 8, bf16 tensor cores, "
                "--mode overlap --bucket-mb 1): the MFU of your lab03_ddp (summary mfu) >= %.2f x the "
                "reference's, and the reference's in %.0f-%.0f %% (the kit's device model: docs/grading.md). "
                "Deterministic, graded on any machine",
                kMfuRanks, kMfuMargin, 100 * kRefMfuMin, 100 * kRefMfuMax);
  const grading::Check check{
      "lab03.mfu_at_gpt2_small", /*points=*/1, target,
      "README 'Overlap': at GPT-2 124M the all-reduce is short next to the step, so only a sync that exposes "
      "all of it shows here. Compare comm_ms (exposed) and comm_busy_ms of the two runs "
      "(<build>/perf-runs/<track>/lab03/lab03-sim-*): is each bucket launched from the hook that finishes it?"};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec;
    spec.lab = "lab03";
    spec.track = grading::track();
    spec.program = "lab03_ddp";
    spec.gpu = kGpu;
    spec.ranks = kMfuRanks;
    spec.args = {"--model",
                 "gpt2-124m",
                 "--timing-only",
                 "--precision",
                 "bf16-compute",
                 "--mode",
                 "overlap",
                 "--bucket-mb",
                 "1",
                 "--link",
                 "nvlink",
                 "--micro-batch",
                 "8",
                 "--seq-len",
                 "1024",
                 "--steps",
                 std::to_string(kMfuSteps)};
    perf::mfu_check(record, spec, kMfuMargin, kRefMfuMin, kRefMfuMax);  // skips without MPI or corpus
  });
}

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
    spec.args = perf::split_words(std::string("--model demo --mode overlap --bucket-mb 1 --link ") + kLink +
                                  " --micro-batch 8 --seq-len 128 --steps " + std::to_string(kSteps));
    perf::SimComparison c;
    if (!perf::throughput_check(record, spec, kMinFraction, &c)) return;  // skipped: no MPI, no corpus
    EXPECT_LE(c.track.exposed_ms, kMaxExposedShare * c.track.busy_ms)
        << "the step waited " << c.track.exposed_ms << " ms for the all-reduce, which was busy " << c.track.busy_ms
        << " ms: overlap should hide most of it under backward";
  });
}
