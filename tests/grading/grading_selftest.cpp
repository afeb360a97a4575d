// grading_selftest.cpp — checks with KNOWN outcomes, one per status, for the grading machinery's own
// test (tests/grading/test_grading_records.py runs each TEST alone and reads its JSON record, as
// scripts/grade does). Several of these fail on purpose; the program is never graded itself.
// "lab99" is no lab: the ids only have to follow the labNN.<snake_case TEST name> rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grading.h"              // defines: grading::run, grading::all_ranks, RankReducer
#include "scalelab/core/error.h"  // defines: scalelab::NotImplemented, scalelab::Error

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
  grading::run({"lab99.throws_not_implemented", 1, "a TODO", "write it"},
               [](grading::Record&) { throw scalelab::NotImplemented("lab99-4 some_function"); });
}

TEST(GradingSelftest, ThrowsError) {
  grading::run({"lab99.throws_error", 1, "no error", "read the error"},
               [](grading::Record&) { SL_CHECK(1 > 2, "planted check failure: %d > %d", 1, 2); });
}

TEST(GradingSelftest, Skips) {
  grading::run({"lab99.skips", 5, "needs a GPU", "-"}, [](grading::Record&) { GTEST_SKIP() << "no GPU here"; });
}

TEST(GradingSelftest, SkipsOptional) {
  grading::run({"lab99.skips_optional", 2, "a timing", "-"}, [](grading::Record& record) {
    record.optional("time it by hand: planted command");
    GTEST_SKIP() << "the machine is shared";
  });
}

TEST(GradingSelftest, IdDoesNotMatchName) {
  grading::run({"lab99.some_other_name", 1, "-", "-"}, [](grading::Record&) {});
}

// A pretend world of 2 ranks in one process: rank 1 (simulated by the reducer) fails, this rank passes.
// The combined record must say failed and carry rank 1's message: what a real communicator delivers.
TEST(GradingSelftest, OtherRankFails) {
  int gathers = 0;
  grading::set_rank_reducer(
      {/*rank=*/0, /*size=*/2, [](bool) { return false; } /* rank 1 fails */,
       [&gathers](const std::string& local) {
         // run() gathers the statuses first, then the messages, then the measured texts.
         static const char* const kRank1[] = {"failed", "planted failure on rank 1", "rank 1 off by 0.5"};
         return std::vector<std::string>{local, kRank1[gathers++ % 3]};
       }});
  grading::run({"lab99.other_rank_fails", 1, "all ranks pass", "-"},
               [](grading::Record& record) { record.measured("rank 0 fine"); });
  grading::set_rank_reducer({});  // back to a world of one
}

// A pretend world of 3: rank 1 throws, ranks 0 and 2 then time out waiting for it in a collective. The
// record must name rank 1's exception first (the cause), the timeouts after it.
TEST(GradingSelftest, ExceptionBeforeWaitTimeouts) {
  const std::string timeout = "rank 0 waited 20.0 s for all_reduce 'grads': it did not complete";
  int gathers = 0;
  grading::set_rank_reducer({0, 3, [](bool) { return false; },
                             [&](const std::string& local) {
                               const int i = gathers++ % 3;  // statuses, messages, measured texts
                               if (i == 0) return std::vector<std::string>{local, "failed", "failed"};
                               if (i == 1)
                                 return std::vector<std::string>{local, "scalelab::Error thrown:\nplanted on rank 1",
                                                                 "rank 2 waited 20.0 s for all_reduce 'grads': it "
                                                                 "did not complete"};
                               return std::vector<std::string>{local, local, local};
                             }});
  grading::run({"lab99.exception_before_wait_timeouts", 1, "-", "-"},
               [&](grading::Record&) { ADD_FAILURE() << timeout; });
  grading::set_rank_reducer({});
}

// error_excerpt: a log's error lines first, then its last lines; not its first lines.
TEST(GradingSelftest, ErrorExcerpt) {
  grading::run({"lab99.error_excerpt", 1, "-", "-"}, [](grading::Record&) {
    std::string log;
    for (int i = 0; i < 30; ++i) log += "step " + std::to_string(i) + " loss 3.1\n";
    log += "[scalelab] error: shard rank_1.bin is 64 bytes short\n  hint: see the checkpoint\n";
    for (int i = 30; i < 40; ++i) log += "step " + std::to_string(i) + " loss 3.0\n";
    const std::string e = grading::error_excerpt(log);
    EXPECT_EQ(e.rfind("[scalelab] error: shard rank_1.bin is 64 bytes short\n  hint: see the checkpoint\n", 0), 0u)
        << e;
    EXPECT_NE(e.find("step 39 loss 3.0"), std::string::npos) << e;  // and the log's end
    EXPECT_EQ(e.find("step 0 loss"), std::string::npos) << e;       // not its start
  });
}

// all_ranks: true only when every rank's flag is; the failure lists the failing ranks' messages.
TEST(GradingSelftest, AllRanksReports) {
  grading::run({"lab99.all_ranks_reports", 1, "-", "-"}, [](grading::Record&) {
    grading::set_rank_reducer({0, 2, [](bool) { return false; } /* rank 1 fails */,
                               [](const std::string& local) {
                                 return std::vector<std::string>{local, "err 0.5"};
                               }});
    const ::testing::AssertionResult combined = grading::all_ranks(true, "unused");
    grading::set_rank_reducer({});
    EXPECT_FALSE(combined);
    EXPECT_STREQ(combined.message(), "rank 1: err 0.5");
    EXPECT_TRUE(grading::all_ranks(true));  // a world of one: the identity
  });
}

// Ranks that report the same message are named once; different messages are kept apart, each with its ranks.
TEST(GradingSelftest, AllRanksGroupsIdenticalMessages) {
  grading::run({"lab99.all_ranks_groups_identical_messages", 1, "-", "-"}, [](grading::Record&) {
    // 4 ranks that all fail the same way, each having put its own "rank r: " in front (on_rank)
    grading::set_rank_reducer(
        {0, 4, [](bool) { return false; },
         [](const std::string&) {
           return std::vector<std::string>{"rank 0: err 0.5", "rank 1: err 0.5", "rank 2: err 0.5", "rank 3: err 0.5"};
         }});
    const ::testing::AssertionResult agree = grading::all_ranks(false, "rank 0: err 0.5");
    grading::set_rank_reducer({0, 4, [](bool) { return false; },
                               [](const std::string&) {
                                 return std::vector<std::string>{"a", "", "a", "b"};
                               }});
    const ::testing::AssertionResult differ = grading::all_ranks(false, "a");
    grading::set_rank_reducer({});
    EXPECT_STREQ(agree.message(), "all 4 ranks: err 0.5");
    EXPECT_STREQ(differ.message(), "ranks 0, 2: a; rank 3: b");
    const std::vector<grading::RankGroup> g = grading::group_by_message({"x", "x", "x", "y", "x"});
    ASSERT_EQ(g.size(), 2u);
    EXPECT_EQ(g[0].ranks, "ranks 0-2, 4");
    EXPECT_EQ(g[1].ranks, "rank 3");
  });
}
