// test_lab04_perf.cpp — lab 04's performance checks (label perf), run through the lab's own program:
//   lab04.throughput_vs_reference     on a simulated GPU cluster (virtual time: the same bits on any machine),
//                                     ZeRO-3 training at least a stated fraction as fast as the reference's
//                                     with the same arguments, its prefetch hiding the gathers
//   lab04.peak_memory_within_estimate the program's measured peak memory per rank and category within the
//                                     estimator's bound (scalelab/measure/memory_estimator.h) + 5 %
//   lab04.mfu_at_gpt2_xl              the lesson's size, timing only: GPT-2 1.5B with ZeRO-3 on 8 simulated
//                                     H100 over NVLink, its MFU within a margin of the reference's
// The harness (runs, summaries): tests/perf/perf_compare.h. How the fraction was chosen, from measurements:
// docs/grading.md "Performance checks". The program runs directly (NP 1 in tests/lab04/CMakeLists.txt) and
// starts bin/<track>/lab04_fsdp and the reference's lab04_fsdp under mpiexec itself, one after the other.
#include <cstdint>  // defines: int64_t
#include <cstdio>   // defines: std::snprintf
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grading.h"                            // defines: grading::run, Check, Record
#include "perf_compare.h"                       // defines: perf_test::throughput_check, mfu_check, run_program
#include "scalelab/core/error.h"                // defines: scalelab::Error, NotImplemented, SL_CHECK_HINT
#include "scalelab/model/gpt2.h"                // defines: GPTConfig, gpt2_num_params
#include "scalelab/measure/memory_estimator.h"  // defines: estimate_memory
#include "scalelab/model/optim.h"               // defines: OptimizerConfig
#include "scalelab/core/precision.h"            // defines: PrecisionPolicy
#include "scalelab/data/shard.h"                // defines: data::list_shards, read_shard_header (the corpus's V)

namespace grading = scalelab::grading;
namespace perf = scalelab::perf_test;
using namespace scalelab;

namespace {

constexpr int kRanks = 2;
constexpr int kSteps = 3;  // per throughput run: step 0 is not timed; every timed step lasts the same virtual time
constexpr const char* kGpu = "h100";
constexpr int kMicroBatch = 8;
constexpr int kSeqLen = 128;
constexpr int kStage = 3;
constexpr int kPrefetch = 1;
// The throughput runs use lab 03's link (tests/lab03/test_lab03_perf.cpp: 100 Gb/s Ethernet between the two
// simulated H100s); the memory run none. Measured (reference, tokens/s of --prefetch 1 / --prefetch 0 /
// --overlap off): the GPU's own NVLink 906,190 / 873,258 / 846,545 (0.96, 0.93: the gathers are too short to
// matter), infiniband 851,266 / 749,941 / 726,033, ethernet100 789,347 / 600,090 / 584,684: the widest gap.
constexpr const char* kLink = "ethernet100";
// The track's simulated tokens/s >= kMinFraction x the reference's. Measured on ethernet100 (docs/grading.md
// "Performance checks"): the reference with --prefetch 2 1.000 (a sound alternative: a deeper prefetch does
// not hurt); the planted slow ones: no prefetch (lab04-no-prefetch; --prefetch 0: 0.760), blocking gathers
// (lab04-gather-blocking), every gather and reduce-scatter waited for at once (--overlap off: 0.741).
constexpr double kMinFraction = 0.90;
// The step waits for at most this share of the communication's busy time (prefetch's point: a unit's gather
// travels while the previous unit computes). Measured: the reference 0.509 of 1.317 ms on its slower rank
// (0.39); without prefetch 1.327 of 1.317 ms (1.01), with --overlap off 1.417 of 1.317 ms.
constexpr double kMaxExposedShare = 0.5;
// Measured peak per category <= the estimator's peak x kMemorySlack. The estimator is exact for the
// reference (tests/lab04 MemoryMatchesEstimate checks equality on its own model); 5 % leaves room for a
// learner's different but sound bookkeeping (a temporary buffer), not for a second copy of a unit.
constexpr double kMemorySlack = 1.05;

// The lab program's arguments, the same for the track and the reference (the device comes from the caller:
// perf_test::sim_args, or --device cpu for the memory run).
std::vector<std::string> lab04_args(int steps, bool link) {
  std::vector<std::string> args = {"--model",
                                   "demo",
                                   "--stage",
                                   std::to_string(kStage),
                                   "--prefetch",
                                   std::to_string(kPrefetch),
                                   "--overlap",
                                   "on",
                                   "--micro-batch",
                                   std::to_string(kMicroBatch),
                                   "--seq-len",
                                   std::to_string(kSeqLen),
                                   "--steps",
                                   std::to_string(steps),
                                   "--loader-alone-batches",
                                   "0"};
  if (link) args.insert(args.end(), {"--link", kLink});
  return args;
}

// lab04.mfu_at_gpt2_xl: the lesson's setup, GPT-2 XL (1.5B) sharded with ZeRO-3 over 8 simulated H100 and
// their NVLink (the GPU's own intra-node link), T 1024, micro-batch 1 (what fits a 1.5B step beside its
// activations), --precision bf16 (bf16 parameters, fp32 compute: the estimator, and so lab 04, models fp32
// and bf16-mixed only), --timing-only (nothing computed: about a second of real time a run). With one
// sequence a rank, the gathers (two a unit and step, forward and backward) and the reduce-scatters are a
// real share of the step, which is what prefetch hides. Measured (reference, docs/grading.md "Performance
// checks"): MFU 54.1 % of the fp32 peak (28,184 tokens/s); --prefetch 2 1.000 x; the planted slow ones: the
// prefetched gather waited for at once (lab04-prefetch-waits-for-next) and no prefetch (--prefetch 0)
// 0.912 x, --overlap off 0.901 x.
constexpr const char* kMfuModel = "gpt2-1.5b";
constexpr int kMfuRanks = 8;
constexpr int kMfuSteps = 2;  // step 0 is not timed: one timed step (every timed step lasts the same)
// The track's MFU >= kMfuMargin x the reference's: between the sound alternative (1.000) and the slow ones
// (<= 0.912).
constexpr double kMfuMargin = 0.97;
// Where the reference must sit: the lesson's good range is 40-55 %, and the kit's model puts this run at
// 54.1 % (of the fp32 peak: lab 04's matmuls are fp32, so that is its MFU's denominator). The band brackets
// the measured value, so a change of the device model or of the reference that moves it is seen here.
constexpr double kRefMfuMin = 0.50;
constexpr double kRefMfuMax = 0.58;

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", bytes / (1024.0 * 1024.0));
  return b;
}

}  // namespace

TEST(Lab04Perf, ThroughputVsReference) {
  char target[1024];
  std::snprintf(
      target, sizeof(target),
      "on %d simulated %s GPUs (virtual time, --link %s): simulated tokens/s of your lab04_fsdp --stage %d "
      "--prefetch %d --overlap on >= %.2f x the reference's with the same arguments (demo model, B %d, T %d), "
      "and the exposed communication (summary comm_ms, the slower rank) <= %.2f x its busy time "
      "(comm_busy_ms). One run each; deterministic, so it is graded on any machine",
      kRanks, kGpu, kLink, kStage, kPrefetch, kMinFraction, kMicroBatch, kSeqLen, kMaxExposedShare);
  const grading::Check check{
      "lab04.throughput_vs_reference", /*points=*/2, target,
      "docs/labs/04_fsdp.md 'Reading the numbers': compare comm_ms (exposed) with comm_busy_ms and compute_ms in "
      "the two runs' step records (<build>/perf-runs/<track>/lab04/lab04-sim-*); is the next unit's all-gather "
      "issued (async) before the current unit computes (prefetch), and is each reduce-scatter waited for only when "
      "its buffer is needed?"};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec;
    spec.lab = "lab04";
    spec.track = grading::track();
    spec.program = "lab04_fsdp";
    spec.gpu = kGpu;
    spec.ranks = kRanks;
    spec.args = lab04_args(kSteps, /*link=*/true);
    perf::SimComparison c;
    if (!perf::throughput_check(record, spec, kMinFraction, &c)) return;  // skipped: no MPI, no corpus
    EXPECT_LE(c.track.exposed_ms, kMaxExposedShare * c.track.busy_ms)
        << "the step waited " << c.track.exposed_ms << " ms for communication that was busy " << c.track.busy_ms
        << " ms: prefetch should hide the gathers under the previous unit's compute";
  });
}

TEST(Lab04Perf, MfuAtGpt2Xl) {
  char target[1024];
  std::snprintf(target, sizeof(target),
                "GPT-2 1.5B, ZeRO-3, on %d simulated H100 over NVLink (--timing-only, T 1024, B 1, --precision "
                "bf16, --prefetch %d --overlap on): the MFU of your lab04_fsdp (summary mfu) >= %.2f x the "
                "reference's, and the reference's in %.0f-%.0f %%. Deterministic, graded on any machine",
                kMfuRanks, kPrefetch, kMfuMargin, 100 * kRefMfuMin, 100 * kRefMfuMax);
  const grading::Check check{
      "lab04.mfu_at_gpt2_xl", /*points=*/1, target,
      "README 'Prefetch': with one sequence a rank the gathers are a real share of the step. Compare comm_ms "
      "(exposed) and comm_busy_ms of the two runs (<build>/perf-runs/<track>/lab04/lab04-sim-*): is the next "
      "block's gather started before this block computes, and waited for only when that block needs it?"};
  grading::run(check, [&](grading::Record& record) {
    perf::SimSpec spec;
    spec.lab = "lab04";
    spec.track = grading::track();
    spec.program = "lab04_fsdp";
    spec.gpu = kGpu;
    spec.ranks = kMfuRanks;
    spec.args = perf::override_args(lab04_args(kMfuSteps, /*link=*/false),
                                    {"--model", kMfuModel, "--timing-only", "--precision", "bf16", "--micro-batch", "1",
                                     "--seq-len", "1024", "--link", "nvlink"});
    perf::mfu_check(record, spec, kMfuMargin, kRefMfuMin, kRefMfuMax);  // skips without MPI or corpus
  });
}

TEST(Lab04Perf, PeakMemoryWithinEstimate) {
  char target[1024];
  std::snprintf(
      target, sizeof(target),
      "lab04_fsdp on %d simulated %s GPUs (demo model, --stage %d --prefetch %d, B=%d, T=%d, fp32, AdamW, 3 steps): on "
      "every rank the measured peak of params, grads, optimizer state and activations "
      "(memory_<category>_peak_bytes of the summary) <= %.2f x estimate_memory's peak of that category",
      kRanks, kGpu, kStage, kPrefetch, kMicroBatch, kSeqLen, kMemorySlack);
  const grading::Check check{
      "lab04.peak_memory_within_estimate", /*points=*/1, target,
      "README 'ZeRO-3' and 'Prefetch', and docs/memory.md: which buffers may be alive at once in ZeRO-3 (a gathered "
      "unit is freed after its forward and its backward; at most 1 + prefetch are gathered; a full gradient lives "
      "only until its reduce-scatter is done); the run's summary prints the measured and estimated tables"};
  grading::run(check, [&](grading::Record& record) {
    const perf::Paths p = perf::paths();
    const std::string missing = perf::sim_prerequisites();
    if (!missing.empty()) GTEST_SKIP() << missing;

    // The estimator's bound, computed here from the same configuration (the corpus decides V).
    const std::string data = p.source_dir + "/data/kjv";
    const std::vector<std::string> shards = data::list_shards(data, "train");
    SL_CHECK_HINT(!shards.empty(), "scripts/prepare_corpus.sh writes data/kjv", "no training shards in %s",
                  data.c_str());
    GPTConfig cfg = GPTConfig::preset("demo");
    cfg.vocab_size = static_cast<int>(data::read_shard_header(shards[0], /*verify_checksum=*/false).vocab_size);
    const MemoryEstimate est = estimate_memory(cfg, kRanks, kStage, PrecisionPolicy::from_name("fp32"),
                                               OptimizerConfig::kind_from_name("adamw"), kPrefetch, kMicroBatch,
                                               kSeqLen);

    // One run of the track's program on the simulated GPUs: their allocator counts device memory exactly, as the
    // CPU's does (the same bytes per category, measured), and the run is as cheap as one on CPU.
    const std::string program = p.binary_dir + "/bin/" + grading::track() + "/lab04_fsdp";
    const std::string log_dir = p.binary_dir + "/perf-runs/" + grading::track();
    perf::SimSpec spec;
    spec.gpu = kGpu;
    spec.args = lab04_args(/*steps=*/3, /*link=*/false);
    const perf::RunResult r =
        perf::run_program("lab04", program, perf::sim_args(spec), kRanks, log_dir, "lab04-memory", /*timeout_s=*/100);
    if (r.exit_code == 3) {
      if (!r.todo.empty()) throw NotImplemented(r.todo, r.todo_file.c_str(), r.todo_line);
      throw NotImplemented("lab04-? (lab04_fsdp exited 3: a TODO is not implemented)");
    }
    ASSERT_TRUE(r.ok()) << "lab04_fsdp "
                        << (r.timed_out ? "timed out" : "failed (exit " + std::to_string(r.exit_code) + ")")
                        << "; last lines of its output (" << log_dir << "/lab04-memory.out):\n"
                        << r.output_tail;
    const int64_t n_params = r.run_record.contains("config") ? r.run_record["config"].value("n_params", int64_t{0}) : 0;
    ASSERT_EQ(n_params, gpt2_num_params(cfg)) << "the run's model is not the one the bound was computed for";

    struct Row {
      const char* name;
      int64_t bound;
    };
    const Row rows[] = {{"params", est.peak.params},
                        {"grads", est.peak.grads},
                        {"optimizer_state", est.peak.optimizer_state},
                        {"activations", est.activations_bytes}};
    std::string measured, over;
    for (size_t rank = 0; rank < r.summaries.size(); ++rank) {
      const nlohmann::json& s = r.summaries[rank];
      ASSERT_TRUE(s.is_object() && !s.empty()) << "rank " << rank << " logged no summary";
      measured += (rank ? "; rank " : "rank ") + std::to_string(rank) + ":";
      for (const Row& row : rows) {
        const std::string key = std::string("memory_") + row.name + "_peak_bytes";
        ASSERT_TRUE(s.contains(key) && s[key].is_number()) << "rank " << rank << "'s summary has no " << key;
        const double got = s[key].get<double>();
        measured += std::string(" ") + row.name + " " + mib(got) + "/" + mib(row.bound);
        if (got > kMemorySlack * static_cast<double>(row.bound))
          over += "rank " + std::to_string(rank) + " " + row.name + ": " + mib(got) + " MiB > " +
                  std::to_string(kMemorySlack).substr(0, 4) + " x " + mib(row.bound) + " MiB\n";
      }
    }
    record.measured("peak MiB measured/estimated per rank and category: " + measured);
    std::printf("[perf] %s\n", record.measured_text().c_str());
    EXPECT_TRUE(over.empty()) << over;
  });
}
