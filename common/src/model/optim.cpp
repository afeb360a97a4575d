// optim.cpp — AdamW / SGD over a GPT2's units, gradient clipping, the learning-rate schedule (optim.h).
// Tests: tests/common/model/test_gpt2_fixture.cpp (10 steps of each against torch.optim), tests/common/model/test_optim.cpp
#include "scalelab/model/optim.h"

#include <cmath>

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value
#include "scalelab/core/error.h"
#include "scalelab/ops/ops.h"

namespace scalelab {

OptimizerConfig::Kind OptimizerConfig::kind_from_name(const std::string& name) {
  if (name == "adamw") return Kind::AdamW;
  if (name == "sgd") return Kind::SGD;
  SL_FAIL("use --optimizer adamw or --optimizer sgd", "unknown optimizer '%s'", name.c_str());
}

const char* OptimizerConfig::kind_name(Kind kind) { return kind == Kind::AdamW ? "adamw" : "sgd"; }

Optimizer::Optimizer(GPT2& model, const OptimizerConfig& cfg) : model_(model), cfg_(cfg) {
  const Device dev = model.device();
  for (int u = 0; u < model.num_units(); ++u) {
    if (!model.owns_unit(u)) {  // a pipeline stage: no state for another stage's units
      m_.emplace_back();
      v_.emplace_back();
      master_.emplace_back();
      continue;
    }
    const int64_t n = model.unit_params(u).numel();
    if (cfg.kind == OptimizerConfig::Kind::AdamW) {
      m_.push_back(Tensor::zeros({n}, DType::F32, dev, MemCategory::OptimizerState));
      v_.push_back(Tensor::zeros({n}, DType::F32, dev, MemCategory::OptimizerState));
    } else {
      m_.emplace_back();
      v_.emplace_back();
    }
    if (model.policy().has_master_copy()) {
      // fp32 master weights: the optimizer updates these; the bf16 parameters are rounded copies.
      Tensor master = Tensor::empty({n}, DType::F32, dev, MemCategory::OptimizerState);
      cast(master, model.unit_params(u));
      master_.push_back(master);
    } else {
      master_.emplace_back();
    }
  }
}

void Optimizer::step(float lr) {
  ++t_;
  for (int u = 0; u < model_.num_units(); ++u) {
    if (!model_.owns_unit(u)) continue;
    Tensor& params = model_.unit_params(u);
    Tensor weights = master_[u].defined() ? master_[u] : params;  // the fp32 tensor to update
    const Tensor& grads = model_.unit_grads(u);
    // Weight decay differs per parameter (matrices yes, biases and layernorm no), so update the unit
    // in table order, one parameter view at a time.
    for (const ParamInfo& p : model_.param_table()) {
      if (p.unit != u) continue;
      Tensor w = weights.view(p.offset, {p.numel});
      const Tensor g = grads.view(p.offset, {p.numel});
      const float wd = p.decay ? cfg_.weight_decay : 0.0f;
      if (cfg_.kind == OptimizerConfig::Kind::AdamW) {
        Tensor m = m_[u].view(p.offset, {p.numel}), v = v_[u].view(p.offset, {p.numel});
        adamw_update(w, g, m, v, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, t_);
      } else {
        sgd_update(w, g, lr, wd);
      }
    }
    if (master_[u].defined()) cast(params, master_[u]);  // round the new fp32 weights into bf16 storage
  }
}

float grad_norm(GPT2& model) {
  double sq = 0.0;
  for (int u = 0; u < model.num_units(); ++u) sq += sum_squares(model.unit_grads(u));
  return static_cast<float>(std::sqrt(sq));
}

void scale_grads(GPT2& model, float s) {
  for (int u = 0; u < model.num_units(); ++u)
    if (model.unit_grads(u).defined()) scale_(model.unit_grads(u), s);
}

// As torch.nn.utils.clip_grad_norm_: scale = max_norm / (norm + 1e-6), applied only when < 1.
float clip_factor(float norm, float max_norm) {
  SL_CHECK_HINT(std::isfinite(norm), "lower the learning rate, or look for a bad batch",
                "gradient norm is %g (not finite)", norm);
  if (max_norm <= 0.0f) return 1.0f;
  const float scale = max_norm / (norm + 1e-6f);
  return scale < 1.0f ? scale : 1.0f;
}

void clip_grads(const std::vector<GPT2*>& models, float norm, float max_norm) {
  const float scale = clip_factor(norm, max_norm);
  if (scale < 1.0f)
    for (GPT2* m : models) scale_grads(*m, scale);
}

float clip_grad_norm(GPT2& model, float max_norm) {
  const float norm = grad_norm(model);
  clip_grads({&model}, norm, max_norm);
  return norm;
}

double grad_sum_squares(GPT2& model) {
  const bool tp_rank0 = model.shard().tp_rank == 0;
  double sq = 0.0;
  for (int u = 0; u < model.num_units(); ++u) {
    if (!model.owns_unit(u) || !model.unit_grads(u).defined()) continue;
    // A unit whose every tensor counts is summed whole (the dense model's arithmetic); otherwise tensor
    // by tensor, leaving out what another rank counts.
    bool whole = true;
    for (const ParamInfo& p : model.param_table())
      if (p.unit == u && (p.tied_copy || (p.tp_replicated && !tp_rank0))) whole = false;
    if (whole) {
      sq += sum_squares(model.unit_grads(u));
      continue;
    }
    for (const ParamInfo& p : model.param_table()) {
      if (p.unit != u || p.tied_copy || (p.tp_replicated && !tp_rank0)) continue;
      sq += sum_squares(model.unit_grads(u).view(p.offset, {p.numel}));
    }
  }
  return sq;
}

float global_grad_norm(GPT2& model, const std::vector<Communicator*>& groups) {
  return global_grad_norm(std::vector<GPT2*>{&model}, groups);
}

float global_grad_norm(const std::vector<GPT2*>& models, const std::vector<Communicator*>& groups) {
  double sq = 0.0;
  for (GPT2* m : models) sq += grad_sum_squares(*m);
  for (Communicator* g : groups) {
    if (g == nullptr || g->size() == 1) continue;
    sq = all_reduce_value(*g, static_cast<float>(sq), ReduceOp::Sum, "grad norm");  // f32: the communicator's
  }
  return static_cast<float>(std::sqrt(sq));
}

float clip_grad_norm(GPT2& model, float max_norm, const std::vector<Communicator*>& groups) {
  return clip_grad_norm(std::vector<GPT2*>{&model}, max_norm, groups);
}

float clip_grad_norm(const std::vector<GPT2*>& models, float max_norm, const std::vector<Communicator*>& groups) {
  const float norm = global_grad_norm(models, groups);
  clip_grads(models, norm, max_norm);
  return norm;
}

float LRSchedule::at(int step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  const int decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0 || step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / decay_steps;  // in [0, 1)
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));                   // 1 -> 0
  return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

}  // namespace scalelab
