// test_lab05_perf.cpp — lab 05's performance check (label perf): at the lesson's size (a 7B-class model split
// tensor-parallel 8 ways over 8 simulated H100 and their NVLink, timing only: virtual time, so the same bits on
// any machine, busy or not), the track's MFU is within a margin of the reference's with the same arguments.
// The harness (runs, summaries): tests/perf/perf_compare.h. How the margin was chosen, from measurements:
// docs/grading.md "Performance checks". The program runs directly (NP 1 in tests/lab05/CMakeLists.txt): it
// starts bin/<track>/lab05_tensor_parallel and the reference's under mpiexec itself, one after the other.
#include <cstdio>  // defines: std::snprintf
#include <string>

#include <gtest/gtest.h>

#include "grading.h"       // defines: grading::run, Check, Record
#include "perf_compare.h"  // defines: perf_test::mfu_check, split_words, SimSpec

namespace grading = scalelab::grading;
namespace perf = scalelab::perf_test;

namespace {

// lab05.mfu_at_gpt7b: gpt-7b (6.59B parameters, V 32,000: divisible by 8, unlike GPT-2's 50,257) as one
// tensor-parallel group of 8 simulated H100 over their NVLink, T 2048, micro-batch 1, --precision bf16 (bf16
// parameters, fp32 compute), --timing-only (nothing computed: about a second of real time a run). Measured
// (reference, docs/grading.md "Performance checks"): MFU 54.8 % of the fp32 peak (6,886 tokens/s; 133
// tensor-parallel calls, 28.1 ms of the 297 ms step); --sequence-parallel 1.001 x (a sound alternative); the
// planted slow one, g's backward all-reducing its already identical gradient (lab05-g-backward-averages),
// 0.956 x (41.8 ms of communication); the whole link twice slower (--link-slowdown 2) 0.914 x.
constexpr const char* kGpu = "h100";
constexpr int kRanks = 8;
constexpr int kSteps = 2;  // step 0 is not timed: one timed step (every timed step lasts the same)
// The track's MFU >= kMfuMargin x the reference's (the same margin as labs 03 and 04).
constexpr double kMfuMargin = 0.97;
// Where the reference must sit: the lesson's good range is 40-55 %, and the kit's model puts this run at 54.8 %
// (of the fp32 peak: the run's matmuls are fp32). The band brackets the measured value, so a change of the
// device model or of the reference that moves it is seen here and re-measured.
constexpr double kRefMfuMin = 0.50;
constexpr double kRefMfuMax = 0.58;

}  // namespace

TEST(Lab05Perf, MfuAtGpt7b) {
  char target[1024];
  std::snprintf(target, sizeof(target),
                "gpt-7b, tensor parallel over %d simulated H100 on NVLink (--timing-only, --tp 8, T 2048, B 1, "
                "--precision bf16): the MFU of your lab05_tensor_parallel (summary mfu) >= %.2f x the "
                "reference's, and the reference's in %.0f-%.0f %%. Deterministic, graded on any machine",
                kRanks, kMfuMargin, 100 * kRefMfuMin, 100 * kRefMfuMax);
  const grading::Check check{
      "lab05.mfu_at_gpt7b", /*points=*/1, target,
      "README 'f and g': a layer of the split block needs one all-reduce forward (g) and one backward (f), no "
      "more. Compare the tp calls and comm_ms of the two runs (<build>/perf-runs/<track>/lab05/lab05-sim-*)."};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec;
    spec.lab = "lab05";
    spec.track = grading::track();
    spec.program = "lab05_tensor_parallel";
    spec.gpu = kGpu;
    spec.ranks = kRanks;
    spec.args = perf::split_words(
        "--model gpt-7b --timing-only --tp 8 --precision bf16 --link nvlink --micro-batch 1 --seq-len 2048 --steps " +
        std::to_string(kSteps));
    perf::mfu_check(record, spec, kMfuMargin, kRefMfuMin, kRefMfuMax);  // skips without MPI or corpus
  });
}
