// batch.h — what one training step consumes and returns, the same in every lab: a micro-batch of token
// ids and the step's result. Lab 01's train_step, lab 03's and lab 04's, and the training loop every lab
// driver runs (common/include/scalelab/driver/train_loop.h) all speak these two types.
#pragma once

#include "scalelab/core/tensor.h"  // defines: Tensor

namespace scalelab {

// One micro-batch: B sequences of T tokens, and for each position the token that follows it.
struct MicroBatch {
  Tensor inputs;   // (B, T) i32 token ids, B = the micro-batch
  Tensor targets;  // (B, T) i32, the next tokens
};

// What one optimizer step measured, besides its time (the caller measures that around the call).
struct StepResult {
  float loss = 0.0f;       // mean cross-entropy of THIS rank's micro-batches, nats per token
  float grad_norm = 0.0f;  // global L2 norm of the (synchronised) gradients BEFORE clipping
};

}  // namespace scalelab
