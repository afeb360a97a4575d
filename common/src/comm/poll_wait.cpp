// poll_wait.cpp — the polling wait of the GPU backends (poll_wait.h).
#include "scalelab/comm/poll_wait.h"

#include <algorithm>  // defines: std::min

#include "scalelab/core/error.h"  // defines: SL_CHECK

namespace scalelab {

const char* poll_outcome_name(PollOutcome o) {
  switch (o) {
    case PollOutcome::Done: return "done";
    case PollOutcome::Failed: return "failed";
    case PollOutcome::Deadline: return "deadline";
  }
  return "?";
}

PollOutcome poll_until(const PollLoop& loop) {
  SL_CHECK(loop.done && loop.now_ms && loop.sleep_ms, "poll_until needs done, now_ms and sleep_ms");
  SL_CHECK(loop.first_sleep_ms > 0 && loop.max_sleep_ms >= loop.first_sleep_ms,
           "poll_until: back-off from %g ms up to %g ms must be positive and growing", loop.first_sleep_ms,
           loop.max_sleep_ms);
  double sleep = loop.first_sleep_ms;
  for (;;) {
    if (loop.done()) return PollOutcome::Done;
    if (loop.failed && loop.failed()) return PollOutcome::Failed;
    if (loop.deadline_ms > 0 && loop.now_ms() >= loop.deadline_ms) return PollOutcome::Deadline;
    loop.sleep_ms(sleep);
    sleep = std::min(2 * sleep, loop.max_sleep_ms);
  }
}

}  // namespace scalelab
