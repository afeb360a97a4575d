// step_probe.h — what lab 04's driver measures around each step (main.cpp; the same for both tracks):
// the communication the step waited for, and the compute spans of its `timeline` record. Not part of
// the lesson's algorithm: the lab's concept is in fsdp.h / fsdp.cpp.
//
// Exposed communication: how long the step WAITED for collectives (not how long they were in flight).
// The communicator records the caller's wait per call (CommEvent::wait_ms: time blocked in Work::wait()
// or a blocking call), and their sum is the step's comm_ms. The probe also measures the same thing from
// the outside, as a check logged beside it (comm_hooks_ms; docs/labs/04_fsdp.md "Reading the numbers"):
//   - time inside FSDP's model hooks (use_params waits for a gather, after_backward finishes the
//     previous unit's reduce-scatter),
//   - the gap after each backward's last hook until the next micro-step starts or the clipping's
//     all-reduce is issued: finish_backward() (ZeRO-2/3) or reduce_scatter_all() (ZeRO-1),
//   - the blocking collectives after backward: the norm's all-reduce, the optimizer's all-gathers of
//     the units kept gathered (end - issue of their events).
// It includes the bookkeeping next to the waits (zeroing a unit's full gradient, copying a shard into
// the gather buffer, adding the reduced shard, the 1/m scaling and the norm's sum of squares): a slight
// overestimate, under 1 ms per step for the demo model.
#pragma once

#include <algorithm>  // defines: std::max
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"          // defines: Communicator, CommEvent
#include "scalelab/core/clock.h"         // defines: clock_pause_ms (--slow-rank: a sleep, or virtual time)
#include "scalelab/driver/driver.h"      // defines: driver::CommStats, comm_stats (common/)
#include "scalelab/driver/train_loop.h"  // defines: driver::StepMeasure
#include "scalelab/measure/metrics.h"    // defines: TimeSpan
#include "scalelab/model/gpt2.h"         // defines: GPT2, HookPoint, HookOrder

namespace scalelab::lab04_driver {

struct StepComm {
  double exposed_ms = 0;     // the step waited this long: the sum of its events' wait_ms
  double hooks_ms = 0;       // the same, measured from outside by the hook timers (a check)
  driver::CommStats totals;  // the event log's sums: busy_ms, modeled_ms, payload bytes per op
};

// Times the hooks FSDP added (a hook of its own before theirs at each point, HookOrder::First, and one
// after): the --slow-rank sleep, the time inside FSDP's hooks (exposed communication), and the compute
// spans of a `timeline` record:
//   "data"               step start .. train_step called
//   "forward"/"backward" the passes, split where a hook waited >= kWaitSpanMs ("comm wait" between)
//   "comm wait"          a hook that long, and the gap after a backward (finish_backward / reduce_scatter_all)
//   "clip + optimizer"   from the end of that gap to the end of the step (the norm's all-reduce, the
//                        update, the all-gathers of kept units; those show among the events)
// Hooks run in evaluation and sampling too: only calls between begin() and end() are measured.
class StepProbe {
 public:
  StepProbe(GPT2& model, double slow_ms) : slow_ms_(slow_ms) {
    for (const HookPoint p :
         {HookPoint::BeforeForward, HookPoint::AfterForward, HookPoint::BeforeBackward, HookPoint::AfterBackward}) {
      const Phase phase = p == HookPoint::BeforeForward || p == HookPoint::AfterForward ? Phase::Forward
                                                                                        : Phase::Backward;
      hooks_.push_back(model.add_hook(
          p,
          [this, p, phase](const UnitHookArgs& a) {
            if (recording_ && p == HookPoint::BeforeForward && a.unit == 0 && slow_ms_ > 0)
              clock_pause_ms(slow_ms_);  // --slow-rank (simulated GPU: its compute stream, nothing sleeps):
            enter(phase);                // compute that takes longer, once per micro-step
          },
          HookOrder::First));
      // after_backward(0) is the last hook of a backward (gpt2.h)
      hooks_.push_back(model.add_hook(p, [this, p, phase](const UnitHookArgs& a) {
        leave(phase, p == HookPoint::AfterBackward && a.unit == 0);
      }));
    }
  }
  StepProbe(const StepProbe&) = delete;
  StepProbe& operator=(const StepProbe&) = delete;

  void begin(double step_start_ms, double data_end_ms) {
    spans_ = {{"data", step_start_ms, data_end_ms}};
    recording_ = true;
    phase_ = Phase::None;
    hook_ms_ = gap_ms_ = 0;
    gap_start_ms_ = -1;
  }

  // end() as the training loop's after_step reports it (driver::StepMeasure): exposed and busy communication,
  // the spans when want_timeline, and the step record's keys (compute_ms = step - data wait - exposed).
  driver::StepMeasure measure(const std::vector<CommEvent>& events, double step_ms, double data_wait_ms,
                              bool want_timeline) {
    driver::StepMeasure m;
    const StepComm sc = end(events, want_timeline ? &m.spans : nullptr);
    m.comm_ms = sc.exposed_ms;
    m.comm_busy_ms = sc.totals.busy_ms;
    m.comm_modeled_ms = sc.totals.modeled_ms;
    m.simulated = sc.totals.simulated;
    m.extra = {{"compute_ms", step_ms - data_wait_ms - sc.exposed_ms},
               {"comm_hooks_ms", sc.hooks_ms},
               {"comm_busy_ms", sc.totals.busy_ms},
               {"gather_payload_bytes", sc.totals.all_gather_bytes},
               {"reduce_scatter_payload_bytes", sc.totals.reduce_scatter_bytes},
               {"allreduce_payload_bytes", sc.totals.all_reduce_bytes}};
    return m;
  }

  // After train_step returned (device synchronized): this step's communication and its spans.
  StepComm end(const std::vector<CommEvent>& events, std::vector<TimeSpan>* spans) {
    const double now = Communicator::now_ms();
    recording_ = false;
    StepComm c;
    c.totals = driver::comm_stats(events, now);
    double blocking_ms = 0, waited_ms = 0, gap_end_ms = now;
    const double after_backward_ms = last_backward_end_ms_;
    bool gap_closed = gap_start_ms_ < 0;
    for (const CommEvent& e : events) {
      const double end_ms = e.end_ms > 0 ? e.end_ms : now;
      waited_ms += e.wait_ms;
      if (!e.async && e.issue_ms >= after_backward_ms) {  // blocking, after the last backward
        blocking_ms += end_ms - e.issue_ms;
        if (!gap_closed) {  // the first one ends the finish_backward gap
          gap_ms_ += std::max(0.0, e.issue_ms - gap_start_ms_);
          gap_end_ms = e.issue_ms;
          gap_closed = true;
        }
      }
    }
    if (!gap_closed) {  // no blocking call after the last backward (a learner's variant): up to the end
      gap_ms_ += now - gap_start_ms_;
      gap_end_ms = now;
    }
    c.hooks_ms = hook_ms_ + gap_ms_ + blocking_ms;
    c.exposed_ms = waited_ms;
    if (spans) {
      if (phase_ != Phase::None) close_span(after_backward_ms);
      if (gap_start_ms_ >= 0) spans_.push_back({"comm wait", gap_start_ms_, gap_end_ms});
      spans_.push_back({"clip + optimizer", gap_end_ms, now});
      *spans = std::move(spans_);
    }
    spans_.clear();
    return c;
  }

 private:
  enum class Phase { None, Forward, Backward };
  static constexpr double kWaitSpanMs = 0.2;  // ms: shorter hooks stay inside their compute span

  // Before FSDP's hook at a point: the previous backward's gap ends here, a pass begins at its first hook.
  void enter(Phase phase) {
    if (!recording_) return;
    const double t0 = Communicator::now_ms();
    enter_ms_ = t0;
    if (gap_start_ms_ >= 0) {  // the previous backward's gap (finish_backward) ends at this micro-step
      gap_ms_ += t0 - gap_start_ms_;
      spans_.push_back({"comm wait", gap_start_ms_, t0});
      gap_start_ms_ = -1;
    }
    if (phase_ != phase) {  // a pass begins at its first hook; the previous one ends there
      if (phase_ != Phase::None) close_span(t0);
      spans_.push_back({phase == Phase::Forward ? "forward" : "backward", t0, t0});
      phase_ = phase;
    }
  }
  // After FSDP's hook: the time inside it, a "comm wait" span when that was long.
  void leave(Phase phase, bool ends_backward) {
    if (!recording_) return;
    const double t0 = enter_ms_, t1 = Communicator::now_ms();
    hook_ms_ += t1 - t0;
    if (t1 - t0 >= kWaitSpanMs) {  // split the pass: compute, then the wait, then compute again
      close_span(t0);
      spans_.push_back({"comm wait", t0, t1});
      spans_.push_back({phase == Phase::Forward ? "forward" : "backward", t1, t1});
    }
    if (ends_backward) {
      close_span(t1);
      phase_ = Phase::None;
      gap_start_ms_ = t1;
      last_backward_end_ms_ = t1;
    }
  }
  void close_span(double t) {  // an empty compute span (two waits in a row) is dropped
    spans_.back().end_ms = t;
    if (spans_.back().end_ms <= spans_.back().start_ms && spans_.back().name != std::string("data")) spans_.pop_back();
  }

  std::vector<HookHandle> hooks_;
  double slow_ms_ = 0;
  bool recording_ = false;
  Phase phase_ = Phase::None;
  std::vector<TimeSpan> spans_;
  double hook_ms_ = 0, gap_ms_ = 0;  // ms
  double gap_start_ms_ = -1, last_backward_end_ms_ = 0;
  double enter_ms_ = 0;  // when the hook now running at a point was entered
};

}  // namespace scalelab::lab04_driver
