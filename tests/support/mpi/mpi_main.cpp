// mpi_main.cpp — main() of every multi-rank test program (sl_add_mpi_test, cmake/scalelab.cmake).
// What it adds to a plain GoogleTest main:
//   - the world communicator, make_communicator("auto"), for the tests (mpi_test.h: test::world());
//   - a second communicator for the rank-collective helpers (grading::all_ranks, rank_reducer.h), so
//     their calls never appear in the event log a test inspects;
//   - ranks other than 0 print only their failures, prefixed "[rank r]";
//   - after each TEST every rank learns which ranks failed it, and rank 0 prints them;
//   - the exit status is the same on every rank: 0 only if every rank passed every TEST.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "grading.h"                // defines: grading::set_rank_reducer, grading::RankReducer
#include "mpi_test.h"               // defines: test::world
#include "failures_only_printer.h"  // defines: test::FailuresOnlyPrinter
#include "rank_reducer.h"           // defines: test::make_rank_reducer
#include "scalelab/comm/comm.h"     // defines: make_communicator
#include "scalelab/core/error.h"    // defines: scalelab::Error

namespace {

namespace grading = scalelab::grading;
std::unique_ptr<scalelab::Communicator> g_world;

using scalelab::test::FailuresOnlyPrinter;  // ranks other than 0 print failures only

// After each TEST: which ranks failed it (a collective on the reducer's communicator, entered by every
// rank in the same order because every rank runs the same TESTs).
class RankSummary : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const grading::RankReducer& rr = grading::rank_reducer();
    const bool passed = !info.result()->Failed();
    if (rr.all_and(passed)) return;
    const std::vector<std::string> status = rr.all_gather(passed ? "" : "failed");
    if (rr.rank != 0) return;
    std::string ranks;
    for (size_t r = 0; r < status.size(); ++r) {
      if (!status[r].empty()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    std::printf("[  RANKS   ] %s.%s failed on rank(s) %s of %d\n", info.test_suite_name(), info.name(), ranks.c_str(),
                rr.size);
    std::fflush(stdout);
  }
};

}  // namespace

namespace scalelab::test {
Communicator& world() { return *g_world; }
}  // namespace scalelab::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::shared_ptr<scalelab::Communicator> reducer_comm;
  try {
    g_world = scalelab::make_communicator("auto");
    reducer_comm = scalelab::make_communicator("auto");
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const int rank = g_world->rank();
  grading::set_rank_reducer(scalelab::test::make_rank_reducer(reducer_comm));
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnlyPrinter(rank));
  }
  listeners.Append(new RankSummary);

  const int rc = RUN_ALL_TESTS();
  const bool all_passed = grading::rank_reducer().all_and(rc == 0);
  if (rank == 0) {
    std::printf("[  RANKS   ] %s on all %d ranks\n", all_passed ? "PASSED" : "FAILED", g_world->size());
  }
  // Communicators end before MPI does (MPI_Finalize runs at exit).
  grading::set_rank_reducer({});
  reducer_comm.reset();
  g_world.reset();
  return all_passed ? 0 : 1;
}
