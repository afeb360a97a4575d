// perf_compare.h — the harness of the graded performance checks (docs/grading.md "Performance checks"):
// run the reference track's lab program and the graded track's with identical arguments on N ranks,
// alternately, read tokens/s, MFU and memory from their JSONL logs (docs/log_schema.md) and compare.
// A graded test calls it from inside grading::run (tests/support/grading.h):
//   tests/lab03/test_lab03_perf.cpp   lab03.throughput_vs_reference
//   tests/lab04/test_lab04_perf.cpp   lab04.throughput_vs_reference, lab04.peak_memory_within_estimate
// Implementation: perf_compare.cpp. It starts the programs with fork/exec under mpiexec: the test
// program itself never initialises MPI (graded_main's communicator is "local" outside mpiexec).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include "cpu_sample.h"  // defines: CpuSample, sample_cpu, other_cores, load_1min (tests/support)
#include "grading.h"     // defines: grading::Record

namespace scalelab::perf_test {

using test::CpuSample;
using test::load_1min;
using test::other_cores;
using test::sample_cpu;

// Where the programs are and how to launch them (compile definitions from tests/labNN/CMakeLists.txt).
struct Paths {
  std::string mpiexec;     // "" when the build has no MPI
  std::string binary_dir;  // CMAKE_BINARY_DIR: bin/reference/labNN_x and bin/<track>/labNN_x
  std::string source_dir;  // the repository: the programs run there (data/kjv, lab 00's runs/calibration)
};
Paths paths();

// Can this machine time `ranks` ranks fairly? The rule (docs/design.md "Timing is never asserted with
// more ranks than cores"): one core per rank on CPU (the cores this process may run on, from its
// affinity mask), one GPU per rank when the build has CUDA and a GPU is visible (two ranks on one GPU
// time-share it: NCCL refuses, MPI serialises). Otherwise `fair` is false and `reason` says why.
struct Machine {
  bool fair = false;
  std::string reason;          // why not, for the skip record
  std::string device = "cpu";  // "cpu" or "cuda": the --device the runs use
  int cores = 0;               // CPUs in this process's affinity mask
  int gpus = 0;                // visible CUDA devices (0 in a CPU-only build)
  double load_1min = 0;        // /proc/loadavg, to read the noise of a measurement by
};
Machine check_machine(int ranks);
// A timing is fair only if the ranks had a core each: cores - others >= ranks - kMaxShortfallCores
// (sample_cpu / other_cores, tests/support/cpu_sample.h).
constexpr double kMaxShortfallCores = 0.25;  // cores: what others may take of the ranks' share
constexpr int kExtraPairs = 2;               // pairs measured again when a run shared its cores, before skipping
constexpr double kRetryWindowS = 40;         // s: no pair is measured again once the runs have taken this long
// "" when fair, else the skip reason ("the machine is shared: other processes used 1.62 of its 2 cores ...").
std::string busy_reason(double others, int cores, int ranks, const std::string& when);

// One finished run of a lab program under mpiexec.
struct RunResult {
  int exit_code = -1;  // 3: a TODO not implemented (run_on_all_ranks); -1: did not start
  bool timed_out = false;
  double wall_s = 0;        // the whole mpiexec, start-up included
  std::string output_tail;  // the last lines of its stdout + stderr
  std::string todo;         // "lab03-7 micro_steps_per_step" when a NotImplemented ended it
  std::string todo_file;    // "labs/03_ddp/ddp.cpp" (from the message), for NotImplemented's hint
  int todo_line = 0;
  std::vector<nlohmann::json> summaries;  // the `summary` record of each rank (rank order)
  nlohmann::json run_record;              // rank 0's `run` record
  // Tokens/s of each timed step (step >= 1): the step's tokens over the SLOWEST rank's step_ms. The
  // ranks meet in every step's collectives, so their step times agree to a few ms; the max is the honest one.
  std::vector<double> step_tokens_per_s;
  double median_tokens_per_s() const;  // median of step_tokens_per_s; 0 when empty
  bool ok() const { return exit_code == 0 && !timed_out; }
  double other_cores = 0;  // cores other processes kept busy during this run (set by compare_with_reference)
};

// Runs `mpiexec -n ranks <program> <args> --log-dir <log_dir> --run-id <run_id>` from the repository,
// stdout+stderr to <log_dir>/<run_id>.out, killed after timeout_s; then reads
// <log_dir>/<lab>/<run_id>/rank<k>.jsonl. `lab` is the log directory name ("lab03").
RunResult run_program(const std::string& lab, const std::string& program, const std::vector<std::string>& args,
                      int ranks, const std::string& log_dir, const std::string& run_id, double timeout_s);

// `args` with `extra` applied: "--key value" pairs of `extra` replace the same key in `args` or are
// appended ("--flag" alone when no value follows). CLI11 refuses an option given twice.
std::vector<std::string> override_args(std::vector<std::string> args, const std::vector<std::string>& extra);
std::vector<std::string> split_words(const std::string& text);  // on whitespace

// The throughput comparison of one lab: `pairs` pairs of runs, order T R | R T | T R ... (the track
// first, so an unwritten TODO is reported after one short run; alternating cancels a drift of the
// machine's load). ratio = median tokens/s of all the track's timed steps / the same for the reference,
// over the pairs in which no run shared its cores with other processes (CPU; others are measured again).
struct Comparison {
  std::vector<RunResult> track_runs, ref_runs;  // in the order they ran within each kind
  std::vector<double> pair_ratios;              // per pair: track run median / reference run median
  double track_tokens_per_s = 0;                // pooled median over the track's timed steps
  double ref_tokens_per_s = 0;
  double ratio = 0;                             // track / reference
  double load_before = 0, load_after = 0;       // /proc/loadavg, 1 min
  double seconds = 0;                           // wall time of all runs
  double others_before = 0, others_during = 0;  // cores other processes used: a second idle after the
                                                // first run (when that run shared its cores), all runs
  int pairs_dropped = 0;                        // pairs left out: a run shared its cores (measured again)
  std::string calibration_note;                 // CPU: the one peak every run divided by, and where it came from
  std::string unfair;                           // not "": the machine was shared; skip with this reason
                                                // (then the runs may not have happened: check it first)
};
struct CompareSpec {
  std::string lab;                            // "lab03": log directory and run-id prefix
  std::string check;                          // "throughput_vs_reference": the check id after "labNN."
  std::string device = "cpu";                 // Machine::device: the busy-machine rule applies to CPU runs
  std::string track;                          // "learner" | "reference": which bin/<track>/ is graded
  std::string program;                        // "lab03_ddp"
  std::vector<std::string> args;              // identical for both (minus --log-dir, --run-id)
  std::vector<std::string> track_extra_args;  // SL_PERF_TRACK_ARGS: measuring the check itself only
  int ranks = 2;
  int pairs = 2;
  bool ignore_busy = false;   // SL_PERF_IGNORE_BUSY: time even on a shared machine (measuring the check)
  double run_timeout_s = 90;  // s, one run
  double budget_s = 200;      // s, all runs: kept under the ctest TIMEOUT, so this program (not ctest)
                              // ends a run that hangs, and mpiexec takes its ranks down with it
};
// Throws scalelab::NotImplemented when the track's program exits 3 (its first run), scalelab::Error with
// the output tail when a program fails otherwise. CPU runs all get --calibration shared_calibration(t)
// (t: the --threads of spec.args), so the MFU of the track's runs and of the reference's compare.
// Runs that do not fit in spec.budget_s leave `unfair` set (the machine was too slow or busy), not an error.
Comparison compare_with_reference(const CompareSpec& spec);

// ---------------------------------------------------------------------------------------------
// What the runs need

// "" when <repo>/data/kjv holds train and val shards; otherwise runs scripts/prepare_corpus.sh (output in
// <build>/perf-runs/prepare_corpus.out; seconds, where the bible-kjv package is installed or installable)
// and returns "" once the shards exist, else why not and what to run: the reason of a skip the learner
// can fix (a fresh clone has no data/kjv).
std::string ensure_corpus();

// The one calibration (MFU peak) of CPU runs with `threads` threads per rank that every run of a check
// divides by, and a sentence saying which it is. SL_PERF_CALIBRATION=<file> (scripts/grade sets it: one
// calibration for the whole grade) is used as it is. Otherwise the cache runs/calibration/cpu_<t>t.json is
// resolved once (load_or_calibrate: measured again only when it is missing, for another CPU model, thread
// count or BLAS build, or provably stale: a 0.2 s pass ran 1.5x faster than it, which a GEMM's fastest call
// can only do if the cached peak was measured while other programs held the cores) and frozen in a copy,
// <build>/perf-runs/calibration_cpu_<t>t.json, so every run reads the same bits.
struct SharedCalibration {
  std::string file;  // what --calibration gets
  std::string note;  // "every run divides by the cached calibration, 118.2 GFLOP/s (...)" / "... measured now: ..."
};
SharedCalibration shared_calibration(int threads);

// The command that gives a skipped timing by hand, for grading::Record::optional: with shared_machine,
// the check itself under SL_PERF_IGNORE_BUSY=1 (its record says "not a grade"); otherwise (too few cores
// or GPUs for a fair timing) the two programs run one after the other with scripts/run, to compare their
// tokens/s.
std::string by_hand(const CompareSpec& spec, bool shared_machine);

// "MFU 8.6 % (track) vs 8.7 % (reference) of 118.2 GFLOP/s per rank: calibrated sgemm, ...": the summary
// MFU of the last run of each kind with the peak it divides by and that peak's source (run record).
std::string describe_mfu(const RunResult& track, const RunResult& ref);

// Environment, for measuring the check itself (docs/grading.md "Performance checks"), never set by the
// grader: SL_PERF_PAIRS (pairs of runs, default `fallback`), SL_PERF_BUDGET_S (the time budget of all
// runs; run the test program directly, not under ctest's TIMEOUT, when raising it), SL_PERF_TRACK_ARGS
// (extra arguments for the graded track's runs only, e.g. "--mode naive": a planted slow implementation),
// SL_PERF_IGNORE_BUSY=1 (time even when other processes use the cores: to see how noise moves the ratio).
int env_pairs(int fallback);
bool env_ignore_busy();
double env_budget_s(double fallback);
std::vector<std::string> env_track_extra_args();

// The body of a throughput check (tests/lab03/test_lab03_perf.cpp, tests/lab04/test_lab04_perf.cpp), the
// last statement of its grading::run: takes the SL_PERF_* switches above into `spec`, runs
// compare_with_reference, writes the measured text (ratio, pairs, MFU with its peak source, the machine's
// state) and expects ratio >= min_fraction. Skips (GTEST_SKIP) when no pair of runs had the cores to itself.
void throughput_check(grading::Record& record, CompareSpec spec, const Machine& machine, double min_fraction);

}  // namespace scalelab::perf_test
