// optim.h — optimizers over a GPT2's units, the learning-rate schedule, gradient-norm clipping.
// Tests: tests/common/model/test_gpt2_fixture.cpp (10 AdamW and 10 SGD steps against PyTorch)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"  // defines: Communicator (the groups of a split model's norm)
#include "scalelab/model/gpt2.h"

namespace scalelab {

struct OptimizerConfig {
  enum class Kind { AdamW, SGD } kind = Kind::AdamW;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;       // AdamW; GPT-3 paper values (Brown et al. 2020, App. B)
  float weight_decay = 0.1f;                            // applied only where ParamInfo::decay is true
  static Kind kind_from_name(const std::string& name);  // "adamw" | "sgd"; throws with a hint otherwise
  static const char* kind_name(Kind kind);              // "adamw" | "sgd"
};

// Holds the optimizer state for every unit: AdamW m and v (fp32, category OptimizerState) and, when the
// policy stores parameters in bf16, the fp32 master weights (also OptimizerState). step() updates the
// master (or the params directly) and writes the result back into the model's parameters.
class Optimizer {
 public:
  Optimizer(GPT2& model, const OptimizerConfig& cfg);
  // One update with learning rate lr using the model's current gradients. Increments step_count().
  void step(float lr);
  int64_t step_count() const { return t_; }
  void set_step_count(int64_t t) { t_ = t; }
  const OptimizerConfig& config() const { return cfg_; }
  // State tensors per unit (for checkpoints): m, v (empty for SGD), master (empty without a master copy).
  std::vector<Tensor>& m() { return m_; }
  std::vector<Tensor>& v() { return v_; }
  std::vector<Tensor>& master() { return master_; }

 private:
  GPT2& model_;
  OptimizerConfig cfg_;
  int64_t t_ = 0;
  std::vector<Tensor> m_, v_, master_;
};

// Scales all gradients so their global L2 norm is at most max_norm (as torch.nn.utils.clip_grad_norm_).
// Returns the norm before clipping. max_norm <= 0 disables clipping (the norm is still returned).
float clip_grad_norm(GPT2& model, float max_norm);
// Global L2 norm of all gradients.
float grad_norm(GPT2& model);

// ---- The pieces every training step is made of (labs 01 and 03-07 scale and clip the same way)
// Multiplies every gradient the model holds by s (units without storage are skipped): s = 1/m turns the
// sum over m accumulated micro-batches into their mean, the gradient of the whole batch's mean loss.
void scale_grads(GPT2& model, float s);
// The factor torch.nn.utils.clip_grad_norm_ scales every gradient by when their global norm is `norm`:
// max_norm / (norm + 1e-6) when that is below 1, else 1 (and 1 for max_norm <= 0: no clipping). Throws
// scalelab::Error, with a hint, for a norm that is not finite (a diverged step or a bad batch).
float clip_factor(float norm, float max_norm);
// Clips several models (a pipeline rank's chunks, or one) by ONE norm of them all: scale_grads of each by
// clip_factor(norm, max_norm); nothing is touched when that factor is 1.
void clip_grads(const std::vector<GPT2*>& models, float norm, float max_norm);

// ---- A model split across ranks (ModelShard: tensor and pipeline parallel)
// The sum of squares of this shard's part of the WHOLE model's gradient, in double: every tensor it owns,
// except the tp-replicated ones on tp ranks other than 0 (each rank of the group holds the same values:
// counted once) and the last stage's copy of wte (the first stage counts wte). The dense model: all of it.
double grad_sum_squares(GPT2& model);
// The whole model's gradient norm: grad_sum_squares summed over `groups` (the groups whose ranks hold
// different parts of the model; nullptr entries are skipped), so every shard clips on the dense model's
// norm, not on its own part. Collective on every group given. The sums travel as fp32 (the
// communicator reduces f32): the norm agrees with the dense one to about 1e-7 relative.
float global_grad_norm(GPT2& model, const std::vector<Communicator*>& groups);
// The same over several models of this rank (a pipeline rank's chunks): their grad_sum_squares summed,
// then over `groups`.
float global_grad_norm(const std::vector<GPT2*>& models, const std::vector<Communicator*>& groups);
// clip_grad_norm on global_grad_norm: every shard (every chunk of every shard) scales by the same factor.
float clip_grad_norm(GPT2& model, float max_norm, const std::vector<Communicator*>& groups);
float clip_grad_norm(const std::vector<GPT2*>& models, float max_norm, const std::vector<Communicator*>& groups);

// Linear warmup to max_lr over warmup_steps, then cosine decay to min_lr at total_steps
// (Loshchilov & Hutter 2017, SGDR, without restarts). step counts from 0.
struct LRSchedule {
  float max_lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup_steps = 0;
  int total_steps = 1;
  float at(int step) const;
};

}  // namespace scalelab
