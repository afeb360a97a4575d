// train_step.cpp — lab 01: one training step, FLOPs per token, tokens/s and MFU.
// Declared in labs/01_single_device/train_step.h. The lesson: labs/01_single_device/README.md.
// Only the code between TODO(lab01-N) BEGIN/END is yours to write: this file holds nothing else.
#include "train_step.h"

#include "scalelab/core/error.h"
#include "scalelab/model/optim.h"

namespace scalelab::lab01 {
inline namespace SL_TRACK_LAB01 {

StepResult train_step(GPT2& model, Optimizer& optimizer, const Tensor& inputs, const Tensor& targets, float lr,
                      float grad_clip) {
  StepResult r;
  // TODO(lab01-1) BEGIN  one training step on (inputs, targets)
  //   Done when: every parameter has moved once, by the optimizer, along the clipped gradient of THIS
  //   batch's mean loss, and r holds that loss and the gradient norm before clipping.
  //   The idea: README "One training step". Hints, one tier at a time: scripts/hint 01-1
  throw scalelab::NotImplemented("lab01-1 train_step");
  // TODO(lab01-1) END
  return r;
}

double flops_per_token(const GPTConfig& cfg, int T) {
  // TODO(lab01-2) BEGIN  the model's training FLOPs per token
  //   Done when: it returns the kit's convention for forward + backward FLOPs per token at sequence
  //   length T (the matmuls of every weight that is a matmul, plus attention's T x T work).
  //   The idea: README "Counting FLOPs". Hints, one tier at a time: scripts/hint 01-2
  throw scalelab::NotImplemented("lab01-2 flops_per_token");
  // TODO(lab01-2) END
}

double tokens_per_second(int64_t tokens, double seconds) {
  SL_CHECK(seconds > 0.0, "seconds=%g must be > 0", seconds);
  // TODO(lab01-3) BEGIN  throughput: tokens processed per second of wall time
  //   The idea: README "Tokens per second and MFU". Hints, one tier at a time: scripts/hint 01-3
  throw scalelab::NotImplemented("lab01-3 tokens_per_second");
  // TODO(lab01-3) END
}

double mfu(double tokens_per_s, double flops_per_token, double peak_flops_per_s, int num_devices) {
  SL_CHECK(peak_flops_per_s > 0.0 && num_devices > 0, "peak_flops_per_s=%g num_devices=%d must be > 0",
           peak_flops_per_s, num_devices);
  // TODO(lab01-4) BEGIN  MFU: the fraction of the devices' peak the model's FLOPs use
  //   Done when: it returns a fraction (0.42, not 42) for num_devices devices of this peak each.
  //   The idea: README "Tokens per second and MFU". Hints, one tier at a time: scripts/hint 01-4
  throw scalelab::NotImplemented("lab01-4 mfu");
  // TODO(lab01-4) END
}

}  // namespace SL_TRACK_LAB01
}  // namespace scalelab::lab01
