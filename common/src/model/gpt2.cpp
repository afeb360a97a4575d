// gpt2.cpp — GPT-2 forward and backward over the ops of ops.h, unit by unit (gpt2.h).
// The layer structure follows GPT-2 (Radford et al. 2019) as llm.c's train_gpt2.c writes it out:
//   x = wte[tokens] + wpe;  per block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x));
//   logits = ln_f(x) @ wte^T (tied LM head); loss = mean cross-entropy.
// Precision (precision.h): the matmuls run in the policy's matmul dtype (policy_matmul_forward/backward),
// every other op in fp32 on unit_weights_f32.
// Tests: tests/common/model/test_gpt2_fixture.cpp (PyTorch float64 fixture), tests/common/model/test_gpt2.cpp,
//        tests/common/ops/test_bf16_compute.cpp
#include "scalelab/model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "scalelab/core/error.h"
#include "scalelab/ops/ops.h"
#include "scalelab/core/rng.h"

namespace scalelab {

// ---------------------------------------------------------------------------------------------
// Config and parameter table

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  //                              maxT   V     L   NH  C
  if (name == "tiny") c = GPTConfig{16, 64, 2, 2, 16};       // tests; matches tests/fixtures/gpt2_tiny.json
  else if (name == "demo") c = GPTConfig{256, 256, 4, 4, 192};  // ~1.9M params: the CPU demo
  else if (name == "d12") c = GPTConfig{1024, 256, 12, 12, 768};   // GPT-2 124M shapes
  else if (name == "d24") c = GPTConfig{1024, 256, 24, 16, 1024};  // GPT-2 350M
  else if (name == "d36") c = GPTConfig{1024, 256, 36, 20, 1280};  // GPT-2 774M
  else if (name == "d48") c = GPTConfig{1024, 256, 48, 25, 1600};  // GPT-2 1558M
  else SL_FAIL("use one of: tiny, demo, d12, d24, d36, d48", "unknown model preset '%s'", name.c_str());
  return c;
}

void GPTConfig::validate() const {
  SL_CHECK(max_seq_len > 0 && vocab_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
           "all sizes must be positive: %s", str().c_str());
  SL_CHECK_HINT(n_embd % n_head == 0, "pick n_embd a multiple of n_head", "C=%d not divisible by NH=%d", n_embd,
                n_head);
}

std::string GPTConfig::str() const {
  std::ostringstream os;
  os << "GPTConfig(maxT=" << max_seq_len << ", V=" << vocab_size << ", L=" << n_layer << ", NH=" << n_head
     << ", C=" << n_embd << ")";
  return os.str();
}

std::vector<ParamInfo> gpt2_param_table(const GPTConfig& cfg) {
  cfg.validate();
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, maxT = cfg.max_seq_len, L = cfg.n_layer;
  std::vector<ParamInfo> t;
  int unit = 0;
  int64_t offset = 0;
  auto add = [&](const std::string& name, const Shape& shape, bool decay) {
    const int64_t n = numel_of(shape);
    t.push_back({name, shape, unit, offset, n, decay});
    offset += n;
  };
  auto next_unit = [&] { ++unit; offset = 0; };
  // unit 0: embeddings
  add("wte", {V, C}, true);
  add("wpe", {maxT, C}, true);
  // units 1..L: blocks
  for (int64_t l = 0; l < L; ++l) {
    next_unit();
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C}, false);
    add(p + "ln_1.bias", {C}, false);
    add(p + "attn.c_attn.weight", {3 * C, C}, true);
    add(p + "attn.c_attn.bias", {3 * C}, false);
    add(p + "attn.c_proj.weight", {C, C}, true);
    add(p + "attn.c_proj.bias", {C}, false);
    add(p + "ln_2.weight", {C}, false);
    add(p + "ln_2.bias", {C}, false);
    add(p + "mlp.c_fc.weight", {4 * C, C}, true);
    add(p + "mlp.c_fc.bias", {4 * C}, false);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, true);
    add(p + "mlp.c_proj.bias", {C}, false);
  }
  // unit L+1: final layernorm
  next_unit();
  add("ln_f.weight", {C}, false);
  add("ln_f.bias", {C}, false);
  return t;
}

int64_t gpt2_num_params(const GPTConfig& cfg, bool with_wpe) {
  int64_t n = 0;
  for (const ParamInfo& p : gpt2_param_table(cfg)) {
    if (!with_wpe && p.name == "wpe") continue;
    n += p.numel;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Model

std::vector<int64_t> gpt2_unit_numel(const GPTConfig& cfg) {
  std::vector<int64_t> n(cfg.n_layer + 2, 0);
  for (const ParamInfo& p : gpt2_param_table(cfg)) n[p.unit] += p.numel;
  return n;
}

// A block's four linear weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj): read by their matmuls
// and nothing else. (wte is a matmul weight too, the tied LM head, but the encoder reads it in fp32.)
static bool is_block_matmul_weight(const ParamInfo& p, int L) {
  return p.unit >= 1 && p.unit <= L && p.shape.size() == 2;
}

GPT2::GPT2(const GPTConfig& cfg, const PrecisionPolicy& policy, Device device, uint64_t seed)
    : GPT2(/*allocate=*/true, cfg, policy, device) {
  init_weights(seed);
}

GPT2 GPT2::without_storage(const GPTConfig& cfg, const PrecisionPolicy& policy, Device device) {
  return GPT2(/*allocate=*/false, cfg, policy, device);
}

GPT2::GPT2(bool allocate, const GPTConfig& cfg, const PrecisionPolicy& policy, Device device)
    : cfg_(cfg), policy_(policy), device_(device), table_(gpt2_param_table(cfg)),
      hooks_(std::make_shared<detail::HookRegistry>()) {
  SL_CHECK_HINT(policy.grad_dtype == DType::F32 && policy.master_dtype == DType::F32,
                "use --precision fp32 or bf16 (bf16 parameters, fp32 gradients and master weights)",
                "unsupported precision policy %s: gradients and master weights must be f32",
                policy.name().c_str());
  SL_CHECK(policy.param_dtype == DType::F32 || policy.param_dtype == DType::BF16,
           "parameter dtype %s is not f32 or bf16", dtype_name(policy.param_dtype));
  SL_CHECK_HINT(policy.matmul_dtype == DType::F32 ||
                    (policy.matmul_dtype == DType::BF16 && policy.param_dtype == DType::BF16),
                "use --precision bf16-compute (bf16 parameters and bf16 matmul operands)",
                "unsupported precision policy %s: bf16 matmuls read the bf16 parameters in place, so they need "
                "bf16 parameters",
                policy.name().c_str());
  // Where each parameter's fp32 values sit for the fp32 ops (unit_weights_f32).
  if (policy.matmul_dtype == DType::BF16) {
    // Pack each unit's non-matmul parameters; every slot starts on a multiple of 4 floats (16 bytes), since
    // cuBLASLt's bias epilogue wants a 16-byte aligned bias (common/src/ops/cuda/matmul.cu). A block needs
    // 13C floats (+ padding); unit 0 (V + maxT) * C: the encoder reads wte and wpe in fp32.
    std::vector<int64_t> used(num_units(), 0);  // floats of the scratch used per unit
    for (const ParamInfo& p : table_) {
      if (is_block_matmul_weight(p, cfg.n_layer)) {
        f32_offset_.push_back(-1);
        continue;
      }
      const int64_t slot = (used[p.unit] + 3) / 4 * 4;
      f32_offset_.push_back(slot);
      used[p.unit] = slot + p.numel;
    }
    f32_scratch_numel_ = *std::max_element(used.begin(), used.end());
  } else {
    for (const ParamInfo& p : table_) f32_offset_.push_back(p.offset);  // the unit's own layout
  }
  // The entries forward and backward read, by table index (BlockParams).
  wte_ = index_of("wte");
  wpe_ = index_of("wpe");
  lnf_w_ = index_of("ln_f.weight");
  lnf_b_ = index_of("ln_f.bias");
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    auto at = [&](const char* n) { return index_of(p + n); };
    blocks_.push_back({at("ln_1.weight"), at("ln_1.bias"), at("attn.c_attn.weight"), at("attn.c_attn.bias"),
                       at("attn.c_proj.weight"), at("attn.c_proj.bias"), at("ln_2.weight"), at("ln_2.bias"),
                       at("mlp.c_fc.weight"), at("mlp.c_fc.bias"), at("mlp.c_proj.weight"), at("mlp.c_proj.bias")});
  }
  params_.resize(num_units());
  grads_.resize(num_units());
  if (!allocate) return;
  const std::vector<int64_t> unit_numel = gpt2_unit_numel(cfg);
  for (int u = 0; u < num_units(); ++u) {
    params_[u] = Tensor::empty({unit_numel[u]}, policy.param_dtype, device, MemCategory::Params);
    grads_[u] = Tensor::zeros({unit_numel[u]}, DType::F32, device, MemCategory::Grads);
  }
}

int64_t GPT2::num_params() const { return gpt2_num_params(cfg_); }

int GPT2::index_of(const std::string& name) const {
  for (size_t i = 0; i < table_.size(); ++i)
    if (table_[i].name == name) return static_cast<int>(i);
  SL_FAIL("parameter names are listed by gpt2_param_table(); e.g. \"h.0.attn.c_attn.weight\"",
          "no parameter named '%s'", name.c_str());
}

const ParamInfo& GPT2::info(const std::string& name) const { return table_[index_of(name)]; }

Tensor GPT2::param_at(int i) const {
  const ParamInfo& p = table_[i];
  SL_CHECK(params_[p.unit].defined(), "unit %d's parameters (for %s) are not in memory (no buffer installed)",
           p.unit, p.name.c_str());
  return params_[p.unit].view(p.offset, p.shape);
}

Tensor GPT2::grad_at(int i) const {
  const ParamInfo& p = table_[i];
  SL_CHECK_HINT(grads_[p.unit].defined(),
                "a sharded model must install a unit's gradient buffer before its backward, e.g. in a "
                "HookPoint::BeforeBackward hook (lab 04 README \"ZeRO-2\")",
                "unit %d's gradient buffer (for %s) is not in memory", p.unit, p.name.c_str());
  return grads_[p.unit].view(p.offset, p.shape);
}

Tensor GPT2::param(const std::string& name) const { return param_at(index_of(name)); }
Tensor GPT2::grad(const std::string& name) const { return grad_at(index_of(name)); }

// GPT-2 initialisation (as in GPT-2 / nanoGPT): weights N(0, 0.02); the two residual projections per
// block (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)) so the residual stream's variance does not grow
// with depth (Radford et al. 2019, Sec. 2.3); layernorm weight 1; biases 0. Drawn in table order on
// the CPU from one random stream, one unit at a time.
void gpt2_initial_weights(const GPTConfig& cfg, uint64_t seed,
                          const std::function<void(int unit, const Tensor& w)>& sink) {
  const std::vector<ParamInfo> table = gpt2_param_table(cfg);
  const std::vector<int64_t> unit_numel = gpt2_unit_numel(cfg);
  Rng rng(seed);
  const float proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layer);
  for (int u = 0; u < cfg.n_layer + 2; ++u) {
    Tensor host = Tensor::empty({unit_numel[u]}, DType::F32, Device::CPU, MemCategory::Workspace);
    float* w = host.data<float>();
    for (const ParamInfo& p : table) {
      if (p.unit != u) continue;
      float* x = w + p.offset;
      const bool is_ln_weight = p.name.find("ln_") != std::string::npos && p.name.find(".weight") != std::string::npos;
      const bool is_bias = p.shape.size() == 1 && !is_ln_weight;
      const bool is_proj = p.name.find("c_proj.weight") != std::string::npos;
      for (int64_t i = 0; i < p.numel; ++i) {
        if (is_ln_weight) x[i] = 1.0f;
        else if (is_bias) x[i] = 0.0f;
        else x[i] = (is_proj ? proj_std : 0.02f) * rng.normal();
      }
    }
    sink(u, host);
  }
}

void GPT2::init_weights(uint64_t seed) {
  gpt2_initial_weights(cfg_, seed, [this](int u, const Tensor& host) {
    SL_CHECK(params_[u].defined(), "init_weights: unit %d has no parameter buffer installed", u);
    Tensor dst = params_[u].view(0, {host.numel()});
    if (dst.dtype() == DType::F32 && device_ == Device::CPU) {
      dst.copy_from(host);
    } else {
      Tensor staged = Tensor::empty({host.numel()}, dst.dtype(), Device::CPU, MemCategory::Workspace);
      cast(staged, host);
      dst.copy_from(staged);
    }
  });
}

void GPT2::zero_grad() {
  for (Tensor& g : grads_)
    if (g.defined()) g.zero_();
}

void GPT2::free_activations() { acts_ = Activations{}; }

void GPT2::set_attention(AttentionImpl impl) {
  if (impl == attention_) return;
  attention_ = impl;
  free_activations();
}

const char* attention_impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::Materialized ? "materialized" : "flash";
}

AttentionImpl attention_impl_from_name(const std::string& name) {
  if (name == "materialized") return AttentionImpl::Materialized;
  if (name == "flash") return AttentionImpl::Flash;
  SL_FAIL("use --attention materialized (saves the (B,NH,T,T) scores; fastest while they fit), flash (saves "
          "(B,NH,T) and recomputes the scores in the backward) or auto",
          "unknown attention implementation '%s'", name.c_str());
}

int64_t attention_scores_bytes(const GPTConfig& cfg, int B, int T) {
  const int64_t one = static_cast<int64_t>(B) * cfg.n_head * T * T * static_cast<int64_t>(sizeof(float));
  return (cfg.n_layer + 1) * one;  // L saved att, plus the datt scratch of the backward
}

AttentionImpl choose_attention(const GPTConfig& cfg, int B, int T, int64_t memory_budget_bytes) {
  if (memory_budget_bytes <= 0) return AttentionImpl::Materialized;
  return attention_scores_bytes(cfg, B, T) > memory_budget_bytes / 4 ? AttentionImpl::Flash
                                                                       : AttentionImpl::Materialized;
}

void GPT2::ensure_activations(int B, int T) {
  if (acts_.B == B && acts_.T == T) return;
  free_activations();
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size, NH = cfg_.n_head, L = cfg_.n_layer;
  auto act = [&](const Shape& s) { return Tensor::empty(s, DType::F32, device_, MemCategory::Activations); };
  Activations& a = acts_;
  a.B = B;
  a.T = T;
  a.encoded = act({B, T, C});
  for (int64_t l = 0; l < L; ++l) {
    a.ln1.push_back(act({B, T, C}));
    a.ln1_mean.push_back(act({B, T}));
    a.ln1_rstd.push_back(act({B, T}));
    a.qkv.push_back(act({B, T, 3 * C}));
    if (attention_ == AttentionImpl::Materialized)
      a.att.push_back(act({B, NH, T, T}));
    else
      a.lse.push_back(act({B, NH, T}));
    a.atty.push_back(act({B, T, C}));
    a.attproj.push_back(act({B, T, C}));
    a.residual2.push_back(act({B, T, C}));
    a.ln2.push_back(act({B, T, C}));
    a.ln2_mean.push_back(act({B, T}));
    a.ln2_rstd.push_back(act({B, T}));
    a.fch.push_back(act({B, T, 4 * C}));
    a.fch_gelu.push_back(act({B, T, 4 * C}));
    a.fcproj.push_back(act({B, T, C}));
    a.residual3.push_back(act({B, T, C}));
  }
  a.lnf = act({B, T, C});
  a.lnf_mean = act({B, T});
  a.lnf_rstd = act({B, T});
  a.logits = act({B, T, V});
  a.probs = act({B, T, V});
  a.losses = act({B, T});
  a.tokens = Tensor::empty({B, T}, DType::I32, device_, MemCategory::Activations);
  a.targets = Tensor::empty({B, T}, DType::I32, device_, MemCategory::Activations);
  // gradient scratch, reused layer after layer
  a.dresidual = act({B, T, C});
  a.dln = act({B, T, C});
  a.datty = act({B, T, C});
  a.dqkv = act({B, T, 3 * C});
  a.dfch = act({B, T, 4 * C});
  a.dfch_gelu = act({B, T, 4 * C});
  if (attention_ == AttentionImpl::Materialized) a.datt = act({B, NH, T, T});
  if (policy_.matmul_dtype == DType::BF16) {
    // bf16-compute scratch, allocated once per (B,T) and reused by every matmul / unit in turn. Nothing bf16
    // is saved for backward (it re-rounds the saved fp32 activation), so bf16-compute keeps exactly the fp32
    // policy's activations plus these. The operand scratch scales with B*T like the gradient scratch above,
    // so it is counted with it (Activations); the parameter scratch scales with the model and lives for one
    // unit's pass, like bf16-mixed's fp32 unit copy (Workspace).
    //   matmul inputs: ln1, atty, ln2, lnf (B,T,C), fch_gelu (B,T,4C)
    //   matmul douts:  dresidual (B,T,C), dqkv (B,T,3C), dfch (B,T,4C), dlogits (B,T,V)
    a.matmul_inp_bf16 = Tensor::empty({B * T * 4 * C}, DType::BF16, device_, MemCategory::Activations);
    a.matmul_dout_bf16 = Tensor::empty({B * T * std::max(4 * C, V)}, DType::BF16, device_, MemCategory::Activations);
    a.small_params_f32 = Tensor::empty({f32_scratch_numel_}, DType::F32, device_, MemCategory::Workspace);
  }
}

Tensor GPT2::unit_weights_f32(int unit) {
  SL_CHECK_HINT(params_[unit].defined(),
                "a sharded model must install (gather) a unit's parameters before its forward and backward, "
                "e.g. in hooks.before_forward / before_backward (lab 04 README \"ZeRO-3\")",
                "unit %d's parameters are not in memory (no buffer installed)", unit);
  if (policy_.param_dtype == DType::F32) return params_[unit];
  if (policy_.matmul_dtype == DType::BF16) {
    // bf16-compute: only the parameters the fp32 ops read, cast into their slots of the one scratch buffer
    // (no allocation per pass); the matmul weights stay bf16 (matmul_weight).
    SL_CHECK(acts_.small_params_f32.defined(), "unit_weights_f32(%d) before ensure_activations", unit);
    for (size_t i = 0; i < table_.size(); ++i) {
      const ParamInfo& p = table_[i];
      if (p.unit != unit || f32_offset_[i] < 0) continue;
      Tensor dst = acts_.small_params_f32.view(f32_offset_[i], {p.numel});
      cast(dst, params_[unit].view(p.offset, {p.numel}));
    }
    return acts_.small_params_f32;
  }
  // Emulated bf16 (bf16-mixed): the parameters are stored in 16 bits; compute reads an fp32 copy of this unit only.
  Tensor w = Tensor::empty({params_[unit].numel()}, DType::F32, device_, MemCategory::Workspace);
  cast(w, params_[unit]);
  return w;
}

Tensor GPT2::weight_view(const Tensor& unit_f32, int i) const {
  const ParamInfo& p = table_[i];
  const int64_t offset = f32_offset_[i];
  SL_CHECK(offset >= 0, "%s is read only by its bf16 matmul under %s and has no fp32 copy (use matmul_weight)",
           p.name.c_str(), policy_.name().c_str());
  return unit_f32.view(offset, p.shape);
}

Tensor GPT2::matmul_weight(const Tensor& unit_f32, int i) const {
  if (policy_.matmul_dtype == DType::F32) return weight_view(unit_f32, i);
  return param_at(i);  // bf16-compute: the bf16 parameter itself, no copy
}

// ---------------------------------------------------------------------------------------------
// The model's matmuls in the policy's precision (c_attn, attn c_proj, c_fc, mlp c_proj, the LM head).
// bf16-compute rounds the fp32 operands to bf16 (round to nearest even, as torch.autocast does) into
// scratch and runs the bf16 matmul: each operand moves by at most 2^-8 of itself (half an ulp of 8
// significant bits), the products and the fp32 sums are then exact up to fp32 rounding (ops.h). Outputs and
// gradients stay fp32.

void GPT2::policy_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias) {
  if (policy_.matmul_dtype == DType::F32) {
    matmul_forward(out, inp, weight, bias);
    return;
  }
  Tensor inp_bf16 = acts_.matmul_inp_bf16.view(0, inp.shape());
  cast(inp_bf16, inp);
  matmul_forward_bf16(out, inp_bf16, weight, bias);
}

void GPT2::policy_matmul_backward(Tensor* dinp, Tensor& dweight, Tensor* dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight) {
  if (policy_.matmul_dtype == DType::F32) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight);
    return;
  }
  // inp is re-rounded from the saved fp32 activation: the same bits the forward multiplied (rounding is
  // deterministic), without keeping a bf16 copy of every activation alive until the backward.
  Tensor dout_bf16 = acts_.matmul_dout_bf16.view(0, dout.shape());
  cast(dout_bf16, dout);
  Tensor inp_bf16 = acts_.matmul_inp_bf16.view(0, inp.shape());
  cast(inp_bf16, inp);
  matmul_backward_bf16(dinp, dweight, dbias, dout_bf16, inp_bf16, weight);
}

// ---------------------------------------------------------------------------------------------
// Hooks

namespace detail {
// The hook lists of one model, one per HookPoint, in run order. Entries are shared_ptr so that running a
// point copies only pointers: a hook that adds or removes hooks while it runs changes the lists, not the
// copy being walked (the change takes effect from the next unit).
struct HookRegistry {
  struct Entry {
    uint64_t id;
    std::shared_ptr<const Hook> fn;
  };
  std::array<std::vector<Entry>, 4> lists;
  uint64_t next_id = 1;
  std::vector<Entry>& at(HookPoint point) { return lists[static_cast<int>(point)]; }
};
}  // namespace detail

const char* hook_point_name(HookPoint point) {
  switch (point) {
    case HookPoint::BeforeForward: return "before_forward";
    case HookPoint::AfterForward: return "after_forward";
    case HookPoint::BeforeBackward: return "before_backward";
    case HookPoint::AfterBackward: return "after_backward";
  }
  return "?";
}

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    registry_ = std::move(other.registry_);
    point_ = other.point_;
    id_ = other.id_;
    other.registry_.reset();
    other.id_ = 0;
  }
  return *this;
}

void HookHandle::remove() {
  if (const auto reg = registry_.lock()) {
    auto& list = reg->at(point_);
    list.erase(std::remove_if(list.begin(), list.end(), [this](const auto& e) { return e.id == id_; }), list.end());
  }
  registry_.reset();
  id_ = 0;
}

bool HookHandle::active() const {
  const auto reg = registry_.lock();
  if (!reg) return false;
  const auto& list = reg->at(point_);
  return std::any_of(list.begin(), list.end(), [this](const auto& e) { return e.id == id_; });
}

HookHandle GPT2::add_hook(HookPoint point, Hook fn, HookOrder order) {
  SL_CHECK(static_cast<bool>(fn), "add_hook(%s): the hook is empty", hook_point_name(point));
  auto& list = hooks_->at(point);
  const uint64_t id = hooks_->next_id++;
  detail::HookRegistry::Entry e{id, std::make_shared<const Hook>(std::move(fn))};
  if (order == HookOrder::First) list.insert(list.begin(), std::move(e));
  else list.push_back(std::move(e));
  return HookHandle(hooks_, point, id);
}

int GPT2::num_hooks(HookPoint point) const { return static_cast<int>(hooks_->at(point).size()); }

void GPT2::run_hooks(HookPoint point, int unit) {
  const auto& list = hooks_->at(point);
  if (list.empty()) return;
  const std::vector<detail::HookRegistry::Entry> snapshot = list;  // see HookRegistry
  const UnitHookArgs args{unit, params_.at(unit), grads_.at(unit)};
  for (const auto& e : snapshot) (*e.fn)(args);
}

float GPT2::forward(const Tensor& tokens, const Tensor* targets) {
  SL_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32, "tokens must be (B, T) i32, got %s %s",
           shape_str(tokens.shape()).c_str(), dtype_name(tokens.dtype()));
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  SL_CHECK_HINT(T <= cfg_.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "sequence length T=%d exceeds max_seq_len=%d", T, cfg_.max_seq_len);
  ensure_activations(B, T);
  Activations& a = acts_;
  const int L = cfg_.n_layer, NH = cfg_.n_head;
  a.tokens.copy_from(tokens);
  have_targets_ = targets != nullptr;
  if (targets) {
    SL_CHECK(targets->shape() == tokens.shape() && targets->dtype() == DType::I32,
             "targets %s must match tokens %s (i32)", shape_str(targets->shape()).c_str(),
             shape_str(tokens.shape()).c_str());
    a.targets.copy_from(*targets);
  }

  // embeddings
  run_hooks(HookPoint::BeforeForward, 0);
  {
    Tensor w = unit_weights_f32(0);
    encoder_forward(a.encoded, a.tokens, weight_view(w, wte_), weight_view(w, wpe_));
  }
  run_hooks(HookPoint::AfterForward, 0);

  // transformer blocks
  Tensor x = a.encoded;  // (B,T,C) the residual stream entering the block
  for (int l = 0; l < L; ++l) {
    const int unit = 1 + l;
    run_hooks(HookPoint::BeforeForward, unit);
    Tensor w = unit_weights_f32(unit);
    const BlockParams& b = blocks_[l];
    Tensor qkv_b = weight_view(w, b.c_attn_b), proj_b = weight_view(w, b.attn_proj_b);
    Tensor fc_b = weight_view(w, b.c_fc_b), fcproj_b = weight_view(w, b.mlp_proj_b);
    layernorm_forward(a.ln1[l], a.ln1_mean[l], a.ln1_rstd[l], x, weight_view(w, b.ln_1_w), weight_view(w, b.ln_1_b));
    policy_matmul_forward(a.qkv[l], a.ln1[l], matmul_weight(w, b.c_attn_w), &qkv_b);
    if (attention_ == AttentionImpl::Materialized)
      attention_forward(a.atty[l], a.att[l], a.qkv[l], NH);
    else
      attention_forward_flash(a.atty[l], a.lse[l], a.qkv[l], NH);
    policy_matmul_forward(a.attproj[l], a.atty[l], matmul_weight(w, b.attn_proj_w), &proj_b);
    residual_forward(a.residual2[l], x, a.attproj[l]);
    layernorm_forward(a.ln2[l], a.ln2_mean[l], a.ln2_rstd[l], a.residual2[l], weight_view(w, b.ln_2_w),
                      weight_view(w, b.ln_2_b));
    policy_matmul_forward(a.fch[l], a.ln2[l], matmul_weight(w, b.c_fc_w), &fc_b);
    gelu_forward(a.fch_gelu[l], a.fch[l]);
    policy_matmul_forward(a.fcproj[l], a.fch_gelu[l], matmul_weight(w, b.mlp_proj_w), &fcproj_b);
    residual_forward(a.residual3[l], a.residual2[l], a.fcproj[l]);
    x = a.residual3[l];
    run_hooks(HookPoint::AfterForward, unit);
  }

  // final layernorm
  run_hooks(HookPoint::BeforeForward, L + 1);
  {
    Tensor w = unit_weights_f32(L + 1);
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, weight_view(w, lnf_w_), weight_view(w, lnf_b_));
  }
  run_hooks(HookPoint::AfterForward, L + 1);

  // LM head, tied to wte: logits (B,T,V) = lnf (B,T,C) @ wte (V,C)^T
  {
    Tensor w = unit_weights_f32(0);  // bf16-compute reads wte in bf16 and needs none of it (a small cast)
    policy_matmul_forward(a.logits, a.lnf, matmul_weight(w, wte_), nullptr);
  }
  if (!targets) return std::numeric_limits<float>::quiet_NaN();

  softmax_crossentropy_forward(a.losses, a.probs, a.logits, a.targets);
  // mean loss over B*T positions; summed in double on the host
  Tensor host_losses = a.losses;
  if (device_ != Device::CPU) {
    host_losses = Tensor::empty(a.losses.shape(), DType::F32, Device::CPU, MemCategory::Workspace);
    host_losses.copy_from(a.losses);
  }
  const float* lp = host_losses.data<float>();
  double sum = 0.0;
  for (int64_t i = 0; i < host_losses.numel(); ++i) sum += lp[i];
  return static_cast<float>(sum / static_cast<double>(B * T));
}

void GPT2::backward() {
  SL_CHECK_HINT(have_targets_ && acts_.B > 0, "call forward(tokens, &targets) before backward()",
                "backward() without a forward pass that had targets");
  Activations& a = acts_;
  const int B = a.B, T = a.T, L = cfg_.n_layer, NH = cfg_.n_head;
  Tensor dlogits = a.logits;  // logits are not needed any more: reuse their memory for dlogits
  // d(mean loss)/d(loss[b,t]) = 1/(B*T)
  softmax_crossentropy_backward(dlogits, a.probs, a.targets, 1.0f / static_cast<float>(B * T));

  // Unit 0's backward begins here: the tied LM head is unit 0's weight, and ends with the embeddings.
  run_hooks(HookPoint::BeforeBackward, 0);
  // LM head backward: writes the first part of dwte (unit 0 is complete only after the encoder)
  Tensor& dlnf = a.dln;
  dlnf.zero_();
  {
    Tensor w = unit_weights_f32(0);
    Tensor dwte = grad_at(wte_);
    policy_matmul_backward(&dlnf, dwte, nullptr, dlogits, a.lnf, matmul_weight(w, wte_));
  }

  // final layernorm backward: dresidual = d(residual stream leaving the last block)
  run_hooks(HookPoint::BeforeBackward, L + 1);
  a.dresidual.zero_();
  {
    Tensor w = unit_weights_f32(L + 1);
    Tensor dw = grad_at(lnf_w_), db = grad_at(lnf_b_);
    layernorm_backward(a.dresidual, dw, db, dlnf, a.residual3[L - 1], weight_view(w, lnf_w_), a.lnf_mean,
                       a.lnf_rstd);
  }
  run_hooks(HookPoint::AfterBackward, L + 1);

  // blocks, last to first. dresidual enters as d(residual3[l]) and leaves as d(block input).
  for (int l = L - 1; l >= 0; --l) {
    const int unit = 1 + l;
    run_hooks(HookPoint::BeforeBackward, unit);
    Tensor w = unit_weights_f32(unit);
    const BlockParams& b = blocks_[l];
    auto W = [&](int i) { return weight_view(w, i); };     // fp32 (layernorm weights)
    auto MW = [&](int i) { return matmul_weight(w, i); };  // in the policy's matmul dtype
    auto G = [&](int i) { return grad_at(i); };
    const Tensor& block_in = l == 0 ? a.encoded : a.residual3[l - 1];

    // MLP branch: residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2))))
    Tensor dfcproj_w = G(b.mlp_proj_w), dfcproj_b = G(b.mlp_proj_b);
    a.dfch_gelu.zero_();
    policy_matmul_backward(&a.dfch_gelu, dfcproj_w, &dfcproj_b, a.dresidual, a.fch_gelu[l], MW(b.mlp_proj_w));
    a.dfch.zero_();
    gelu_backward(a.dfch, a.fch[l], a.dfch_gelu);
    Tensor dfc_w = G(b.c_fc_w), dfc_b = G(b.c_fc_b);
    a.dln.zero_();
    policy_matmul_backward(&a.dln, dfc_w, &dfc_b, a.dfch, a.ln2[l], MW(b.c_fc_w));
    // the skip connection passes dresidual through unchanged; ln_2's backward ADDS its part to it
    Tensor dln2_w = G(b.ln_2_w), dln2_b = G(b.ln_2_b);
    layernorm_backward(a.dresidual, dln2_w, dln2_b, a.dln, a.residual2[l], W(b.ln_2_w), a.ln2_mean[l],
                       a.ln2_rstd[l]);

    // attention branch: residual2 = block_in + c_proj(attention(c_attn(ln_1(block_in))))
    Tensor dproj_w = G(b.attn_proj_w), dproj_b = G(b.attn_proj_b);
    a.datty.zero_();
    policy_matmul_backward(&a.datty, dproj_w, &dproj_b, a.dresidual, a.atty[l], MW(b.attn_proj_w));
    a.dqkv.zero_();
    if (attention_ == AttentionImpl::Materialized)
      attention_backward(a.dqkv, a.datt, a.datty, a.qkv[l], a.att[l], NH);
    else
      attention_backward_flash(a.dqkv, a.datty, a.qkv[l], a.atty[l], a.lse[l], NH);
    Tensor dqkv_w = G(b.c_attn_w), dqkv_b = G(b.c_attn_b);
    a.dln.zero_();
    policy_matmul_backward(&a.dln, dqkv_w, &dqkv_b, a.dqkv, a.ln1[l], MW(b.c_attn_w));
    Tensor dln1_w = G(b.ln_1_w), dln1_b = G(b.ln_1_b);
    layernorm_backward(a.dresidual, dln1_w, dln1_b, a.dln, block_in, W(b.ln_1_w), a.ln1_mean[l],
                       a.ln1_rstd[l]);
    run_hooks(HookPoint::AfterBackward, unit);
  }

  // embeddings: dwte gets the token rows, dwpe the position rows
  {
    Tensor dwte = grad_at(wte_), dwpe = grad_at(wpe_);
    encoder_backward(dwte, dwpe, a.dresidual, a.tokens);
  }
  run_hooks(HookPoint::AfterBackward, 0);
  (void)B;
  (void)T;
}

}  // namespace scalelab
