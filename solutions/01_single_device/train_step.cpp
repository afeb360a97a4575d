// train_step.cpp — lab 01: one training step, FLOPs per token, tokens/s and MFU.
// Declared in labs/01_single_device/train_step.h. The lesson: labs/01_single_device/README.md.
// Only the code between TODO(lab01-N) BEGIN/END is yours to write; the rest is shared by both tracks.
#include "train_step.h"

#include "scalelab/core/error.h"
#include "scalelab/model/optim.h"

namespace scalelab::lab01 {
inline namespace SL_TRACK_LAB01 {

StepResult train_step(GPT2& model, Optimizer& optimizer, const Tensor& inputs, const Tensor& targets, float lr,
                      float grad_clip) {
  StepResult r;
  // TODO(lab01-1) BEGIN  one training step: zero grads, forward, backward, clip, update
  //   1. model.zero_grad()                        gradients accumulate (+=), so clear them first
  //   2. r.loss = model.forward(inputs, &targets)  mean cross-entropy of the batch
  //   3. model.backward()                          fills the gradients of every parameter
  //   4. r.grad_norm = clip_grad_norm(model, grad_clip)   (optim.h)
  //   5. optimizer.step(lr)
  model.zero_grad();
  r.loss = model.forward(inputs, &targets);
  model.backward();
  r.grad_norm = clip_grad_norm(model, grad_clip);
  optimizer.step(lr);
  // TODO(lab01-1) END
  return r;
}

double flops_per_token(const GPTConfig& cfg, int T) {
  // TODO(lab01-2) BEGIN  FLOPs per token: 6N for the matmuls + 12 L T C for attention
  //   1. N = gpt2_num_params(cfg, /*with_wpe=*/false)   (gpt2.h): no position embeddings
  //      L = cfg.n_layer, C = cfg.n_embd (GPTConfig fields, gpt2.h)
  //   2. matmuls: 2N FLOPs forward + 4N backward per token
  //   3. attention scores and weighted sum: 2 matmuls of T x C per token and layer, times 3 (fwd+bwd)
  const double N = static_cast<double>(gpt2_num_params(cfg, /*with_wpe=*/false));
  const double L = cfg.n_layer, C = cfg.n_embd;
  return 6.0 * N + 12.0 * L * static_cast<double>(T) * C;
  // TODO(lab01-2) END
}

double tokens_per_second(int64_t tokens, double seconds) {
  SL_CHECK(seconds > 0.0, "seconds=%g must be > 0", seconds);
  // TODO(lab01-3) BEGIN  throughput: tokens processed per second of wall time
  //   1. tokens / seconds (seconds > 0 is checked above)
  return static_cast<double>(tokens) / seconds;
  // TODO(lab01-3) END
}

double mfu(double tokens_per_s, double flops_per_token, double peak_flops_per_s, int num_devices) {
  SL_CHECK(peak_flops_per_s > 0.0 && num_devices > 0, "peak_flops_per_s=%g num_devices=%d must be > 0",
           peak_flops_per_s, num_devices);
  // TODO(lab01-4) BEGIN  MFU: achieved model FLOP/s over the peak of all devices
  //   1. achieved = tokens_per_s * flops_per_token      (FLOP/s)
  //   2. divide by peak_flops_per_s * num_devices
  return tokens_per_s * flops_per_token / (peak_flops_per_s * num_devices);
  // TODO(lab01-4) END
}

}  // namespace SL_TRACK_LAB01
}  // namespace scalelab::lab01
