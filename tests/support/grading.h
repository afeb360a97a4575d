// grading.h — the contract between a graded test and scripts/grade (docs/design.md "Tests and the grading
// contract"; the record format is documented in docs/grading.md).
//   grading.cpp                 the implementation (library sl_test_support)
//   tests/grading/graded_main.cpp  main() of every graded test program (track, ranks, output file)
//   cmake/scalelab.cmake        sl_add_graded_test: one ctest per check and track, each its own process
//
// A graded check is one GoogleTest TEST whose body declares the check and runs its assertions
// inside scalelab::grading::run:
//
//   TEST(Lab01SingleDevice, FlopsPerToken) {
//     const grading::Check check{"lab01.flops_per_token", /*points=*/3,
//                                /*target=*/"6N + 12LTC, relative error <= 1e-9",
//                                /*hint=*/"README 'Counting FLOPs': what N counts"};
//     grading::run(check, [&](grading::Record& record) {
//       ...EXPECT_/ASSERT_ as usual...
//       record.measured("%.6g FLOP/token", value);
//     });
//   }
//
// run() records the check's declaration as GoogleTest properties (so they land in the JSON that
// --gtest_output=json:... writes), runs the body, turns a scalelab::NotImplemented escaping from the
// learner's code into the status not_implemented (the test fails with the TODO id in its message,
// the program does not crash), any other exception into failed, and records the final status:
// passed / failed / not_implemented / skipped. The ctest name is derived from the TEST name
// (FlopsPerToken -> lab01.flops_per_token), so run() insists that the id matches it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace scalelab::grading {

// What a check promises; all four land in the record (docs/grading.md lists the JSON keys).
struct Check {
  std::string id;      // stable: "lab01.train_step_matches_reference"; never renamed once published
  int points = 1;      // what the check is worth when it passes
  std::string target;  // what must hold, in words and numbers: "losses equal the reference bit for bit"
  std::string hint;    // where to look when it fails: a concept or README section, never the answer
};

// What the body measured. The last call wins; the grader prints it beside the target.
class Record {
 public:
  void measured(const std::string& text);
  void measured(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  const std::string& measured_text() const { return measured_; }

  // Call just before a GTEST_SKIP that the learner cannot fix by changing code (the machine is shared,
  // too few cores or GPUs): the grader labels the skip "optional" and prints `how_to_run_by_hand`, the
  // command that gives the measurement anyway (recorded as check_optional). A skip without it is one
  // the learner can fix, and its reason must say how.
  void optional(const std::string& how_to_run_by_hand) { optional_ = how_to_run_by_hand; }
  const std::string& optional_text() const { return optional_; }

 private:
  std::string measured_;
  std::string optional_;
};

// Declares `check`, runs `body` and records the status. Call it once, as the whole TEST body.
// In a multi-rank test every rank must call it: the statuses of all ranks are combined (the worst
// wins; a message every rank agrees on is reported once, as one rank's would be, differing ones with
// their ranks, a rank's exception before the other ranks' wait timeouts), and so are their measured
// texts (one when they agree; else one line per distinct text with its ranks and status, the ranks that
// did not pass first), so rank 0's record speaks for all ranks.
// (A rank that throws while the others wait in a collective still leaves them waiting: the check's
// ctest timeout ends that, and the grader reports it as timed out.)
void run(const Check& check, const std::function<void(Record&)>& body);

// The statuses, as written to the record's "check_status" key.
inline constexpr const char* kPassed = "passed";
inline constexpr const char* kFailed = "failed";
inline constexpr const char* kNotImplemented = "not_implemented";
inline constexpr const char* kSkipped = "skipped";

// ---------------------------------------------------------------------------------------------
// Rank-collective assertions.
//
// An ASSERT that fails on one rank returns from that rank's test body while the others walk on into
// the next collective and wait forever. So in a multi-rank check EVERY rank evaluates the condition
// locally, the pass flags are reduced (logical AND) across ranks, and only then does each rank
// assert on the combined flag; the failure messages of all ranks are gathered so a failure on rank 3
// is reported, not only rank 0's:
//
//   bool ok = max_abs_err <= kAtol;                                  // every rank, no early return
//   ASSERT_TRUE(grading::all_ranks(ok, "max |grad - ref| = " + std::to_string(max_abs_err)));
//
// all_ranks() is itself a collective: call it on every rank, in the same order.

// The collectives the helpers use. The default is a world of one rank (both are the identity). The
// communicator plugs in here (a multi-rank graded_main or test sets it before RUN_ALL_TESTS):
//   grading::set_rank_reducer({comm.rank(), comm.size(), and_fn, gather_fn});
struct RankReducer {
  int rank = 0;
  int size = 1;
  // Logical AND of every rank's flag; every rank receives the result.
  std::function<bool(bool local_ok)> all_and;
  // Every rank's string, indexed by rank; every rank receives all of them.
  std::function<std::vector<std::string>(const std::string& local)> all_gather;
};
void set_rank_reducer(RankReducer reducer);
const RankReducer& rank_reducer();

// true on every rank iff `local_ok` is true on every rank; otherwise a failure whose message says what
// each failing rank reported, once per distinct message: "all 4 ranks: <message>" when they agree,
// "rank 1: <a>; ranks 0, 2: <b>" when they differ (a leading "rank r: " a rank put on its own message
// is dropped: the report names the ranks). Collective.
::testing::AssertionResult all_ranks(bool local_ok, const std::string& local_message = "");

// messages[r] is rank r's message ("" = nothing to report): each distinct message once, with the
// ranks that sent it ("all 4 ranks", "rank 1", "ranks 0, 2-3"), in order of the lowest such rank.
// How all_ranks and run() report.
struct RankGroup {
  std::string ranks;  // "all 4 ranks", "rank 1", "ranks 0, 2-3"
  std::string message;
};
std::vector<RankGroup> group_by_message(const std::vector<std::string>& messages);

// The error lines of a program's output first (error, fail, abort, exception, timed out, killed, hint:, ...:
// at most max_lines of them), then its last lines: what a failure message quotes of a run's log, since a
// message is cut after 2000 characters and a log's first lines are its start-up, not its error.
std::string error_excerpt(const std::string& log, size_t max_lines = 12);

// ---------------------------------------------------------------------------------------------
// Program-level settings, made by graded_main.cpp (tests/grading/) before RUN_ALL_TESTS.

// The track this program was linked against ("learner" or "reference"); recorded as check_track.
void set_track(const std::string& track);
const std::string& track();

// The rank the launcher gave this process (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID; 0 when
// run directly). Available before any communicator exists, so main() can pick per-rank output files.
int launcher_rank();

// Environment switches read by run() (set by the grader and by sl_add_graded_test):
//   SL_GRADING_DESCRIBE=1      record the declaration only, do not run the body (status "described"):
//                              how the grader names a check whose process crashed or timed out.
//   SL_GRADING_SKIP="<reason>" skip every check with this reason (e.g. a multi-rank check in a build
//                              without MPI); the record says skipped, ctest says Skipped.

}  // namespace scalelab::grading
