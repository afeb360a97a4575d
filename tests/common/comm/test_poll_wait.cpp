// test_poll_wait.cpp — the polling loop of the nccl backend's wait() (scalelab/comm/poll_wait.h), on a fake
// clock: whichever of "done", "failed" and the deadline comes first ends it, and it backs off between polls.
// The backend gives it cudaEventQuery and ncclCommGetAsyncError, which need GPUs (a dead peer needs two).
#include <gtest/gtest.h>

#include <vector>

#include "scalelab/comm/poll_wait.h"  // defines: poll_until, PollLoop, PollOutcome
#include "scalelab/core/error.h"      // defines: Error

using scalelab::PollLoop;
using scalelab::PollOutcome;
using scalelab::poll_until;

namespace {

// A fake clock that sleeping advances, and events at given times on it (ms; < 0: never).
struct Scenario {
  Scenario(double done_at_ms, double failed_at_ms, double deadline_ms)
      : done_at(done_at_ms), failed_at(failed_at_ms), deadline(deadline_ms) {}
  double done_at, failed_at, deadline;
  double now = 0;
  std::vector<double> sleeps;
  PollOutcome run() {
    PollLoop loop;
    loop.done = [this] { return done_at >= 0 && now >= done_at; };
    loop.failed = [this] { return failed_at >= 0 && now >= failed_at; };
    loop.now_ms = [this] { return now; };
    loop.sleep_ms = [this](double ms) {
      sleeps.push_back(ms);
      now += ms;
    };
    loop.deadline_ms = deadline;
    return poll_until(loop);
  }
};

}  // namespace

TEST(PollWait, DoneFirstEndsTheWaitDone) {
  Scenario s{/*done_at=*/5, /*failed_at=*/50, /*deadline=*/100};
  EXPECT_EQ(s.run(), PollOutcome::Done);
  EXPECT_GE(s.now, 5.0);
  EXPECT_LT(s.now, 5.0 + 1.0 + 1e-9);  // seen within one longest sleep
}

TEST(PollWait, AnAsyncErrorFirstEndsTheWaitFailed) {
  Scenario s{/*done_at=*/-1, /*failed_at=*/3, /*deadline=*/100};  // a dead peer: the op never finishes
  EXPECT_EQ(s.run(), PollOutcome::Failed);
  EXPECT_LT(s.now, 3.0 + 1.0 + 1e-9);
}

TEST(PollWait, TheDeadlineFirstEndsTheWait) {
  Scenario s{/*done_at=*/-1, /*failed_at=*/-1, /*deadline=*/10};
  EXPECT_EQ(s.run(), PollOutcome::Deadline);
  EXPECT_GE(s.now, 10.0);
}

// Without a deadline it still ends on an error: the blocking wait it replaces would have hung.
TEST(PollWait, WithoutADeadlineAnErrorStillEndsIt) {
  Scenario s{/*done_at=*/-1, /*failed_at=*/1000, /*deadline=*/0};
  EXPECT_EQ(s.run(), PollOutcome::Failed);
}

// Checked in the order done, failed, deadline: a finished op is not reported as failed or late.
TEST(PollWait, DoneWinsTiesAndIsSeenWithoutSleeping) {
  Scenario s{/*done_at=*/0, /*failed_at=*/0, /*deadline=*/0.5};
  s.now = 1;  // all three hold at the first poll
  EXPECT_EQ(s.run(), PollOutcome::Done);
  EXPECT_TRUE(s.sleeps.empty());
  Scenario f{/*done_at=*/-1, /*failed_at=*/0, /*deadline=*/0.5};
  f.now = 1;
  EXPECT_EQ(f.run(), PollOutcome::Failed);
}

TEST(PollWait, SleepsBackOffFrom20UsTo1Ms) {
  Scenario s{/*done_at=*/-1, /*failed_at=*/-1, /*deadline=*/20};
  s.run();
  ASSERT_GE(s.sleeps.size(), 8u);
  EXPECT_DOUBLE_EQ(s.sleeps[0], 0.02);
  EXPECT_DOUBLE_EQ(s.sleeps[1], 0.04);
  EXPECT_DOUBLE_EQ(s.sleeps.back(), 1.0);
}

TEST(PollWait, ADoneThatThrowsPassesItsErrorOn) {
  PollLoop loop;
  loop.done = []() -> bool { throw scalelab::Error("cudaEventQuery: an illegal memory access"); };
  loop.now_ms = [] { return 0.0; };
  loop.sleep_ms = [](double) {};
  EXPECT_THROW(poll_until(loop), scalelab::Error);
}
