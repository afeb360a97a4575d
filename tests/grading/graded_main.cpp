// graded_main.cpp — main() of every graded test program; sl_add_graded_test (cmake/scalelab.cmake)
// links it instead of gtest_main. What it adds to a plain GoogleTest main:
//   - tells the grading records which track this program was linked against (SL_GRADED_TRACK);
//   - under mpiexec, only rank 0 writes the JSON file the grader reads; rank r writes <file>.rank<r>.json
//     and prints only its failures, prefixed "[rank r]" (rank 0's record already combines all ranks,
//     see grading::run);
//   - --sl_expect_checks=Suite.A,Suite.B: instead of running, checks that the program's TESTs are
//     exactly the CHECKS listed in CMake, so a check cannot be written and then never graded;
//   - under mpiexec, a communicator of its own (make_communicator("auto")) behind the rank-collective
//     helpers (grading::all_ranks, grading::run's combined status): tests/support/rank_reducer.h;
//   - a check failed after a communicator wait timed out (comm.h comm_wait_timed_out): ends at once,
//     without MPI_Finalize, which would wait for a peer stuck where the timeout cannot free it.
// The API a graded test uses: tests/support/grading.h. The record format: docs/grading.md.
#include <cstdio>
#include <cstdlib>  // defines: std::_Exit
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "grading.h"
#include "failures_only_printer.h"  // defines: test::FailuresOnlyPrinter
#include "rank_reducer.h"           // defines: test::make_rank_reducer
#include "scalelab/comm/comm.h"     // defines: make_communicator
#include "scalelab/core/error.h"    // defines: scalelab::Error

#ifndef SL_GRADED_TRACK
#define SL_GRADED_TRACK "unknown"
#endif

namespace {

namespace grading = scalelab::grading;

using scalelab::test::FailuresOnlyPrinter;  // ranks other than 0 print failures only

// "json:dir/x.json" -> "json:dir/x.rank1.json" (a bare "json" or a directory is left alone: GoogleTest
// then names the file after the program, which is rank-unique enough for debugging).
std::string per_rank_output(const std::string& output, int rank) {
  const std::string ext = ".json";
  if (output.rfind("json:", 0) != 0 || output.size() < ext.size() ||
      output.compare(output.size() - ext.size(), ext.size(), ext) != 0) {
    return output;
  }
  return output.substr(0, output.size() - ext.size()) + ".rank" + std::to_string(rank) + ext;
}

// Compares the registered TESTs with a comma-separated list; prints the differences. 0 when equal.
int expect_checks(const std::string& csv) {
  std::set<std::string> listed, registered;
  std::stringstream ss(csv);
  for (std::string name; std::getline(ss, name, ',');) {
    if (!name.empty()) listed.insert(name);
  }
  const ::testing::UnitTest& ut = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < ut.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *ut.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      registered.insert(std::string(suite.name()) + "." + suite.GetTestInfo(t)->name());
    }
  }
  int problems = 0;
  for (const std::string& name : registered) {
    if (!listed.count(name)) {
      std::printf("TEST %s is not in the CHECKS of sl_add_graded_test: it would never be graded\n", name.c_str());
      ++problems;
    }
  }
  for (const std::string& name : listed) {
    if (!registered.count(name)) {
      std::printf("CHECKS lists %s but no such TEST is compiled into this program\n", name.c_str());
      ++problems;
    }
  }
  if (problems == 0) std::printf("%zu checks, all listed in CMake\n", registered.size());
  return problems == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Before InitGoogleTest: GoogleTest opens its JSON writer while parsing the flags.
  const int rank = grading::launcher_rank();
  const std::string kOutputFlag = "--gtest_output=";
  std::string rank_output;  // keeps the rewritten flag alive for argv
  for (int i = 1; i < argc && rank != 0; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(kOutputFlag, 0) == 0) {
      rank_output = kOutputFlag + per_rank_output(arg.substr(kOutputFlag.size()), rank);
      argv[i] = rank_output.data();
    }
  }
  ::testing::InitGoogleTest(&argc, argv);  // removes the --gtest_* flags it understood from argv
  grading::set_track(SL_GRADED_TRACK);

  const std::string kExpectFlag = "--sl_expect_checks=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(kExpectFlag, 0) == 0) return expect_checks(arg.substr(kExpectFlag.size()));
  }

  // The rank-collective helpers (grading.h, RankReducer) run on a communicator of their own, so their
  // calls never appear in the event log of the communicator a check inspects. Run directly (one rank)
  // "auto" gives the local backend and the helpers stay the identity.
  std::shared_ptr<scalelab::Communicator> reducer_comm;
  try {
    reducer_comm = scalelab::make_communicator("auto");
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  if (reducer_comm->size() > 1) grading::set_rank_reducer(scalelab::test::make_rank_reducer(reducer_comm));

  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnlyPrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  // A deadlock that a wait timeout reported: a peer may still be inside a collective MPI cannot cancel
  // (comm.h set_wait_timeout), and then this rank's MPI_Finalize (or a communicator's destructor)
  // waits for it forever. The JSON record is written by now: end here, without MPI_Finalize, which
  // makes mpirun end the stuck ranks too (measured with a peer stuck in an all_reduce: the job ended
  // 3 s after the timeout; with a normal exit it hung in MPI_Finalize). Only after a
  // failure: a check that provokes a timeout on purpose and passes exits normally (cancelled sends and
  // recvs alone do not hold up MPI_Finalize), since mpirun fails any rank that skips it.
  if (rc != 0 && scalelab::comm_wait_timed_out()) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "[scalelab] rank %d: a communicator wait timed out; exiting now (code %d) without "
                 "MPI_Finalize, which could wait forever for a stuck peer\n",
                 rank, rc);
    std::fflush(stderr);
    std::_Exit(rc);
  }
  // The communicator ends before MPI does (MPI_Finalize runs at exit).
  grading::set_rank_reducer({});
  reducer_comm.reset();
  return rc;
}
