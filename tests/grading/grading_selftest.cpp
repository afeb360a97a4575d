// grading_selftest.cpp — checks with KNOWN outcomes, one per status, for the grading machinery's own
// test (tests/grading/test_grading_records.py runs each TEST alone and reads its JSON record, as
// scripts/grade does). Several of these fail on purpose; the program is never graded itself.
// "lab99" is no lab: the ids only have to follow the labNN.<snake_case TEST name> rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grading.h"            // defines: grading::run, grading::all_ranks, RankReducer
#include "scalelab/core/error.h"     // defines: scalelab::NotImplemented, scalelab::Error

namespace grading = scalelab::grading;

TEST(GradingSelftest, Passes) {
  grading::run({"lab99.passes", 2, "1 + 1 = 2", "arithmetic"}, [](grading::Record& record) {
    record.measured("1 + 1 = %d", 1 + 1);
    EXPECT_EQ(1 + 1, 2);
  });
}

TEST(GradingSelftest, FailsAnExpectation) {
  grading::run({"lab99.fails_an_expectation", 3, "1 + 1 = 3", "it cannot"}, [](grading::Record& record) {
    record.measured("1 + 1 = 2");
    EXPECT_EQ(1 + 1, 3) << "planted failure";
  });
}

TEST(GradingSelftest, ThrowsNotImplemented) {
  grading::run({"lab99.throws_not_implemented", 1, "a TODO", "write it"}, [](grading::Record&) {
    throw scalelab::NotImplemented("lab99-4 some_function");
  });
}

TEST(GradingSelftest, ThrowsError) {
  grading::run({"lab99.throws_error", 1, "no error", "read the error"}, [](grading::Record&) {
    SL_CHECK(1 > 2, "planted check failure: %d > %d", 1, 2);
  });
}

TEST(GradingSelftest, Skips) {
  grading::run({"lab99.skips", 5, "needs a GPU", "-"}, [](grading::Record&) { GTEST_SKIP() << "no GPU here"; });
}

TEST(GradingSelftest, IdDoesNotMatchName) {
  grading::run({"lab99.some_other_name", 1, "-", "-"}, [](grading::Record&) {});
}

// A pretend world of 2 ranks in one process: rank 1 (simulated by the reducer) fails, this rank passes.
// The combined record must say failed and carry rank 1's message: what a real communicator delivers.
TEST(GradingSelftest, OtherRankFails) {
  int gathers = 0;
  grading::set_rank_reducer({/*rank=*/0, /*size=*/2, [](bool) { return false; }  /* rank 1 fails */,
                             [&gathers](const std::string& local) {
                               // run() gathers the statuses first, then the messages.
                               const std::string rank1 = (gathers++ % 2 == 0) ? "failed" : "planted failure on rank 1";
                               return std::vector<std::string>{local, rank1};
                             }});
  grading::run({"lab99.other_rank_fails", 1, "all ranks pass", "-"}, [](grading::Record& record) {
    record.measured("rank 0 fine");
  });
  grading::set_rank_reducer({});  // back to a world of one
}

// all_ranks: true only when every rank's flag is; the failure lists the failing ranks' messages.
TEST(GradingSelftest, AllRanksReports) {
  grading::run({"lab99.all_ranks_reports", 1, "-", "-"}, [](grading::Record&) {
    grading::set_rank_reducer({0, 2, [](bool) { return false; }  /* rank 1 fails */,
                               [](const std::string& local) { return std::vector<std::string>{local, "err 0.5"}; }});
    const ::testing::AssertionResult combined = grading::all_ranks(true, "unused");
    grading::set_rank_reducer({});
    EXPECT_FALSE(combined);
    EXPECT_STREQ(combined.message(), "rank 1: err 0.5");
    EXPECT_TRUE(grading::all_ranks(true));  // a world of one: the identity
  });
}
