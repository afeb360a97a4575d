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

// TODO(lab01-1): one training step, in the order every framework uses:
//   zero the gradients, forward (loss), backward (gradients), clip the global gradient norm to
//   grad_clip (<= 0: no clipping), optimizer update with learning rate lr.
// inputs, targets: (B, T) i32 token ids on the model's device. Returns the loss and the norm.
// README: "One training step".
StepResult train_step(GPT2& model, Optimizer& optimizer, const Tensor& inputs, const Tensor& targets, float lr,
                      float grad_clip);

// TODO(lab01-2): training FLOPs per token of GPT-2 with sequence length T, the kit's convention
// (README.md#counting-flops): 6 N + 12 L T C, where N = parameters without the position embeddings
// (the tied wte counted once: it is the LM head's matmul), L layers, C channels; attention counted
// whole, without the causal saving (PaLM, Chowdhery et al. 2022, App. B). Units: FLOP per token.
double flops_per_token(const GPTConfig& cfg, int T);

// TODO(lab01-3), TODO(lab01-4): throughput and Model FLOPs Utilisation from measured quantities.
// tokens: tokens processed (B*T per step, summed); seconds: wall time they took (> 0).
double tokens_per_second(int64_t tokens, double seconds);
// mfu = tokens_per_s * flops_per_token / (peak_flops_per_s * num_devices), a fraction in [0, 1]
// (PaLM App. B). peak_flops_per_s: per device (datasheet or the calibration of lab 00/common).
double mfu(double tokens_per_s, double flops_per_token, double peak_flops_per_s, int num_devices);

}  // namespace SL_TRACK_LAB01
}  // namespace scalelab::lab01
