// step_timeline.h — the compute spans of lab 03's `timeline` records (main.cpp; the same for both tracks),
// stamped by hooks on the model. Not part of the lesson's algorithm: the lab's concept is in ddp.h / ddp.cpp.
#pragma once

#include <utility>  // defines: std::move
#include <vector>

#include "scalelab/comm/comm.h"        // defines: Communicator::now_ms
#include "scalelab/measure/metrics.h"  // defines: TimeSpan
#include "scalelab/model/gpt2.h"       // defines: GPT2, HookPoint, HookHandle

namespace scalelab::lab03_driver {

// The compute spans of one step for its `timeline` record, stamped by the model's hooks on the
// communication clock (Communicator::now_ms()) so they line up with the step's CommEvents:
//   "data"             step start .. train_step called (loading this rank's micro-batches)
//   "forward"          first before_forward .. the first before_backward after it (the LM head and the
//                      loss run after the last unit's hook, so the next backward is the honest end)
//   "backward"         first before_backward .. last after_backward, whichever units fire them
//   "sync + optimizer" last after_backward .. train_step returned and the device is done: waiting for
//                      the last all-reduces, clipping, the optimizer update
// Gradient accumulation gives one forward and one backward span per micro-step. Its hooks are added
// after GradSync's (overlap mode), so they run after it at each point. On a GPU the forward/backward
// stamps are host times of asynchronous launches: only the step's end is synchronized.
class StepTimeline {
 public:
  explicit StepTimeline(GPT2& model) {
    hooks_.push_back(model.add_hook(HookPoint::BeforeForward, [this](const UnitHookArgs&) {
      if (recording_ && phase_ != Phase::Forward) open("forward", Phase::Forward);
    }));
    hooks_.push_back(model.add_hook(HookPoint::BeforeBackward, [this](const UnitHookArgs&) {
      if (recording_ && phase_ != Phase::Backward) open("backward", Phase::Backward);
    }));
    hooks_.push_back(model.add_hook(HookPoint::AfterBackward,
                                    [this](const UnitHookArgs&) { last_backward_ms_ = Communicator::now_ms(); }));
  }

  void begin(double step_start_ms) {  // call just before train_step
    spans_ = {{"data", step_start_ms, Communicator::now_ms()}};
    recording_ = true;
    phase_ = Phase::None;
  }
  std::vector<TimeSpan> end() {  // call once the step is done (device synchronized)
    close();
    const double now = Communicator::now_ms();
    if (!spans_.empty() && spans_.back().name == "backward")
      spans_.push_back({"sync + optimizer", spans_.back().end_ms, now});
    recording_ = false;
    return std::move(spans_);
  }

 private:
  enum class Phase { None, Forward, Backward };
  void close() {  // a backward ends at its last after_backward hook, a forward when the next span opens
    if (phase_ == Phase::None) return;
    spans_.back().end_ms = phase_ == Phase::Backward ? last_backward_ms_ : Communicator::now_ms();
    phase_ = Phase::None;
  }
  void open(const char* name, Phase phase) {
    close();
    const double now = Communicator::now_ms();
    spans_.push_back({name, now, now});
    last_backward_ms_ = now;
    phase_ = phase;
  }
  std::vector<HookHandle> hooks_;
  std::vector<TimeSpan> spans_;
  bool recording_ = false;
  Phase phase_ = Phase::None;
  double last_backward_ms_ = 0;
};

}  // namespace scalelab::lab03_driver
