// poll_wait.h — the loop a GPU backend's wait() runs instead of blocking in cudaEventSynchronize: it asks
// "done?" and "failed?" (for the nccl backend: cudaEventQuery of the op's done event, ncclCommGetAsyncError
// of its communicator) until one says yes or a deadline passes, sleeping a little longer each round. A
// blocking wait never learns that a peer died (NCCL's kernel waits for it for ever); this loop does.
// Pure (no CUDA, no NCCL: the callables and the clock are given), so it is tested on any machine.
// Tests: tests/common/comm/test_poll_wait.cpp
#pragma once

#include <functional>

namespace scalelab {

enum class PollOutcome { Done, Failed, Deadline };
const char* poll_outcome_name(PollOutcome o);  // "done", "failed", "deadline"

struct PollLoop {
  std::function<bool()> done;               // the op has finished (may throw: its error goes to the caller)
  std::function<bool()> failed;             // an error was reported asynchronously (null: never)
  std::function<double()> now_ms;           // the clock the deadline is on (ms)
  std::function<void(double ms)> sleep_ms;  // waits that long (tests: advances their clock)
  double deadline_ms = 0;                   // on now_ms's clock; <= 0: no deadline
  double first_sleep_ms = 0.02;             // the back-off: 20 us, doubled each round ...
  double max_sleep_ms = 1.0;                // ... up to 1 ms (a finished op is seen within ~1 ms)
};

// Polls in this order each round: done, failed, the deadline; then sleeps. So an op that is done is
// reported done even if an error arrives at the same time, and a deadline that has passed still gives a
// done or failed op its answer first. Returns what ended the wait.
PollOutcome poll_until(const PollLoop& loop);

}  // namespace scalelab
