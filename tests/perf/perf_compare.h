// perf_compare.h — the harness of the graded performance checks (docs/grading.md "Performance checks"):
// run the graded track's lab program and the reference's once each, with identical arguments, on a
// simulated GPU cluster (--device sim --backend sim: virtual time, so the figures are the same bits on
// any machine, busy or not), read tokens/s, MFU and exposed communication from their summaries
// (docs/log_schema.md) and compare. A graded test calls it from inside grading::run (tests/support/grading.h):
//   tests/lab03/test_lab03_perf.cpp   lab03.throughput_vs_reference, lab03.mfu_at_gpt2_small
//   tests/lab04/test_lab04_perf.cpp   lab04.throughput_vs_reference, lab04.peak_memory_within_estimate,
//                                     lab04.mfu_at_gpt2_xl
//   tests/lab05/test_lab05_perf.cpp   lab05.mfu_at_gpt7b
//   tests/lab06/test_lab06_perf.cpp   lab06.mfu_at_gpt7b
//   tests/lab07/test_lab07_perf.cpp   lab07.throughput_vs_reference, lab07.mfu_at_gpt7b
// Implementation: perf_compare.cpp. It starts the programs with fork/exec under mpiexec: the test
// program itself never initialises MPI (graded_main's communicator is "local" outside mpiexec).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include "grading.h"  // defines: grading::Record

namespace scalelab::perf_test {

// Where the programs are and how to launch them (compile definitions from tests/perf/perf.cmake).
struct Paths {
  std::string mpiexec;        // "" when the build has no MPI
  std::string binary_dir;     // CMAKE_BINARY_DIR: bin/<track>/labNN_x
  std::string reference_dir;  // the reference's programs: <binary_dir>/bin/reference, or SL_PERF_REFERENCE_DIR
                              // (scripts/check_mistakes.py: the unpatched reference, beside a patched track)
  std::string source_dir;     // the repository: the programs run there (data/kjv)
};
Paths paths();

// One finished run of a lab program under mpiexec.
struct RunResult {
  int exit_code = -1;  // 3: a TODO not implemented (run_on_all_ranks); -1: did not start
  bool timed_out = false;
  double wall_s = 0;        // the whole mpiexec, start-up included (real time: for the log line only)
  std::string output_tail;  // the last lines of its stdout + stderr
  std::string todo;         // "lab03-7 micro_steps_per_step" when a NotImplemented ended it
  std::string todo_file;    // "labs/03_ddp/ddp.cpp" (from the message), for NotImplemented's hint
  int todo_line = 0;
  std::vector<nlohmann::json> summaries;  // the `summary` record of each rank (rank order)
  nlohmann::json run_record;              // rank 0's `run` record
  bool ok() const { return exit_code == 0 && !timed_out; }
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

// SL_PERF_TRACK_ARGS: extra arguments for the graded track's run only (e.g. "--mode naive": a planted slow
// implementation without patching), for measuring a check itself; never set by the grader. A record made
// with it says "not a grade".
std::vector<std::string> env_track_extra_args();

// ---------------------------------------------------------------------------------------------
// The simulated cluster's figures of one run

// What a speed check reads from the ranks' summaries, all in virtual time. Over ranks the least favourable
// value, as a step lasts until its slowest rank is done.
struct SimFigures {
  double tokens_per_s = 0;  // min over ranks of summary.tokens_per_s (timed steps, virtual)
  double mfu = 0;           // min over ranks of summary.mfu (model FLOPs / simulated dense peak)
  double exposed_ms = 0;    // max over ranks of summary.comm_ms: communication the step waited for, per step
  double busy_ms = 0;       // max over ranks of summary.comm_busy_ms: communication in flight, per step
  std::string gpu_name;     // summary.sim_gpu_name, "simulated H100 SXM"
};
// Throws scalelab::Error when a summary lacks a figure or says it is not simulated (clock != "virtual").
SimFigures sim_figures(const RunResult& r);

// The simulated cluster every run of a check gets: --device sim --backend sim --sim-gpu <gpu>, and the
// link options of the check ("--link ethernet100", "--ranks-per-node 2", ...: the check's comment says why).
struct SimSpec {
  std::string lab;                            // "lab03": log directory and run-id prefix
  std::string track;                          // "learner" | "reference": which bin/<track>/ is graded
  std::string program;                        // "lab03_ddp"
  std::vector<std::string> args;              // identical for both runs (minus --log-dir, --run-id)
  std::vector<std::string> track_extra_args;  // SL_PERF_TRACK_ARGS (measuring the check itself only)
  std::string gpu = "h100";                   // --sim-gpu
  int ranks = 2;
  double run_timeout_s = 120;  // s of real time, one run: ends a hang (ctest's TIMEOUT is above two of these)
};
// `spec.args` with the sim options in front and the quiet-run options every check shares after them
// ("--threads 1 --val-every 0 --val-batches 1 --sample-tokens 0 --timeline-steps 0 --quiet", each unless
// spec.args names it): what both runs get.
std::vector<std::string> sim_args(const SimSpec& spec);

// One run of the track, then one of the reference (the track first: an unwritten TODO is reported after
// one run). Deterministic: no pairs, no medians, no calibration, nothing about the machine's load.
struct SimComparison {
  RunResult track_run, ref_run;
  SimFigures track, ref;
  double ratio = 0;    // track.tokens_per_s / ref.tokens_per_s
  double seconds = 0;  // real time of both runs (for the log line; never compared)
};
// Throws scalelab::NotImplemented when the track's program exits 3, scalelab::Error with the output tail
// when a program fails otherwise. Logs: <build>/perf-runs/<track>/<lab>/<lab>-sim-{track,ref}-<gtest name>/
// (one directory per check: two checks of a lab may run at once).
SimComparison compare_on_sim(const SimSpec& spec);

// "simulated H100 SXM, virtual time: 809,031 tokens/s vs the reference's 809,031 (ratio 1.000); MFU 7.3 % vs
// 7.3 %; exposed communication 0.32 of 0.88 ms busy per step vs 0.32 of 0.88 ms" (with a "not a grade"
// prefix when SL_PERF_TRACK_ARGS was set).
std::string describe(const SimSpec& spec, const SimComparison& c);

// The body of a throughput check (tests/labNN/test_labNN_perf.cpp), inside its grading::run: skips
// (GTEST_SKIP, returns false) when sim_prerequisites says why; otherwise takes SL_PERF_TRACK_ARGS into
// `spec`, runs compare_on_sim, writes describe() as the measured text, expects the track's simulated
// tokens/s >= min_fraction x the reference's, and returns true with the comparison in *out (for the
// check's own further assertions: the exposed communication).
bool throughput_check(grading::Record& record, SimSpec spec, double min_fraction, SimComparison* out);

// The body of an MFU check at the lesson's size (lab03.mfu_at_gpt2_small, lab04.mfu_at_gpt2_xl,
// lab05.mfu_at_gpt7b, lab06.mfu_at_gpt7b, lab07.mfu_at_gpt7b): throughput_check with min_fraction = margin
// (one model, the same arguments: tokens/s and MFU are in the same ratio), then expects the track's MFU >=
// margin x the reference's, and the reference's MFU inside [ref_min, ref_max], the band measured for that
// setup (docs/grading.md "Performance checks"), so a change of the device model or of the reference that
// moves it is seen. Returns throughput_check's answer.
bool mfu_check(grading::Record& record, SimSpec spec, double margin, double ref_min, double ref_max);

// "" when a speed check can run here (mpiexec in the build, the corpus present or made now), else why not:
// the skip reason, one the learner can fix (install MPI, make the corpus).
std::string sim_prerequisites();

// ---------------------------------------------------------------------------------------------
// What the runs need

// "" when <repo>/data/kjv holds train and val shards; otherwise runs scripts/prepare_corpus.sh (output in
// <build>/perf-runs/prepare_corpus.out; seconds, where the bible-kjv package is installed or installable)
// and returns "" once the shards exist, else why not and what to run: the reason of a skip the learner
// can fix (a fresh clone has no data/kjv).
std::string ensure_corpus();

}  // namespace scalelab::perf_test
