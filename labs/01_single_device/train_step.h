// train_step.h — what the learner writes in lab 01, declared once for both tracks.
//   labs/01_single_device/train_step.cpp       the learner's file (TODO blocks)   -> library lab01_learner
//   solutions/01_single_device/train_step.cpp  the reference (same file, filled)  -> library lab01_ref
// The two tracks live in distinct inline namespaces (scalelab::lab01::learner / ::ref) chosen by
// SL_TRACK_LAB01, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/01_single_device/README.md   Graded tests: tests/lab01/test_lab01.cpp
#pragma once

#include <cstdint>

#include "scalelab/model/batch.h"
#include "scalelab/model/gpt2.h"
#include "scalelab/model/optim.h"
#include "scalelab/core/tensor.h"

#ifndef SL_TRACK_LAB01
#define SL_TRACK_LAB01 ref
#endif

namespace scalelab::lab01 {
inline namespace SL_TRACK_LAB01 {

// What one optimizer step measured (besides time, which the driver measures around the call): the mean
// cross-entropy of the batch and the global gradient norm BEFORE clipping (scalelab/model/batch.h).
using scalelab::StepResult;

// TODO(lab01-1): one training step on the batch (inputs, targets): (B, T) i32 token ids on the model's
// device. Contract: on return every parameter has moved once, by `optimizer` at learning rate lr, along the
// gradient of THIS batch's mean cross-entropy (no earlier batch's gradient left in it), that gradient's
// global norm clipped to at most grad_clip (<= 0: no clipping; scalelab/model/optim.h). Returns the loss and
// the global gradient norm before clipping. README: "One training step".
StepResult train_step(GPT2& model, Optimizer& optimizer, const Tensor& inputs, const Tensor& targets, float lr,
                      float grad_clip);

// TODO(lab01-2): training FLOPs (forward + backward) per token of GPT-2 with sequence length T, in the
// kit's convention (README.md#counting-flops: which weights count, how attention counts). Units: FLOP per
// token; the same number the planner (lab 09) and the MFU of every lab use.
double flops_per_token(const GPTConfig& cfg, int T);

// TODO(lab01-3), TODO(lab01-4): throughput and Model FLOPs Utilisation from measured quantities.
// tokens: tokens processed (B*T per step, summed); seconds: wall time they took (> 0).
double tokens_per_second(int64_t tokens, double seconds);
// mfu: the fraction of the devices' peak that the model's FLOPs use, in [0, 1] (0.42, not 42; PaLM App. B,
// README "Tokens per second and MFU"). peak_flops_per_s: per device (datasheet or the calibration of lab
// 00/common); num_devices devices of that peak each.
double mfu(double tokens_per_s, double flops_per_token, double peak_flops_per_s, int num_devices);

}  // namespace SL_TRACK_LAB01
}  // namespace scalelab::lab01
