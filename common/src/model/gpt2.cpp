// gpt2.cpp — the GPT-2 model (gpt2.h): construction and initialisation, the policy's matmuls, and the forward
// and backward over the ops of ops.h, unit by unit; a block's are block_forward and block_backward; the
// backward also runs in two parts, backward_input (B) and backward_weight (W), for zero-bubble pipelines.
// The layer structure follows GPT-2 (Radford et al. 2019) as llm.c's train_gpt2.c writes it out:
//   x = wte[tokens] + wpe;  per block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x));
//   logits = ln_f(x) @ wte^T (tied LM head); loss = mean cross-entropy.
// Precision (precision.h): the matmuls run in the policy's matmul dtype (policy_matmul_forward/backward),
// every other op in fp32 on unit_weights_f32.
// A shard of the model (ModelShard: a tensor-parallel slice, a pipeline stage) runs the same code on its
// local shapes, calling the tensor-parallel points (tensor_parallel.h) where Megatron-LM communicates;
// their identity is the dense model, bit for bit. docs/design.md "Parallel layouts".
// Its parts: gpt2_layout.cpp (config, shard, table), hooks.cpp, gpt2_activations.cpp (sets, scratch).
// Tests: tests/common/model/test_gpt2_fixture.cpp (PyTorch float64 fixture), tests/common/model/test_gpt2.cpp,
//        tests/common/model/test_model_shard.cpp, tests/common/ops/test_bf16_compute.cpp
#include "scalelab/model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "scalelab/core/error.h"    // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL
#include "scalelab/core/rng.h"      // defines: Rng (the initial weights)
#include "scalelab/core/sim_gpu.h"  // defines: sim_timing_only (--timing-only: no initial weights)
#include "scalelab/ops/ops.h"       // defines: the ops the forward and backward call

namespace scalelab {

// ---------------------------------------------------------------------------------------------
// The model: construction, the table's views, initialisation, the choices

// A block's four linear weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), and the last stage's copy
// of wte: read by their matmuls and nothing else. (unit 0's wte is a matmul weight too, the tied LM head,
// but the encoder reads it in fp32.)
static bool is_matmul_only_weight(const ParamInfo& p, int L) {
  return (p.unit >= 1 && p.unit <= L && p.shape.size() == 2) || p.tied_copy;
}

GPT2::GPT2(const GPTConfig& cfg, const PrecisionPolicy& policy, Device device, uint64_t seed)
    : GPT2(/*allocate=*/true, cfg, ModelShard::dense(), policy, device) {
  init_weights(seed);
}

GPT2::GPT2(const GPTConfig& cfg, const ModelShard& shard, const PrecisionPolicy& policy, Device device, uint64_t seed)
    : GPT2(/*allocate=*/true, cfg, shard, policy, device) {
  init_weights(seed);
}

GPT2 GPT2::without_storage(const GPTConfig& cfg, const PrecisionPolicy& policy, Device device) {
  return GPT2(/*allocate=*/false, cfg, ModelShard::dense(), policy, device);
}

GPT2::GPT2(bool allocate, const GPTConfig& cfg, const ModelShard& shard, const PrecisionPolicy& policy, Device device)
    : cfg_(cfg),
      shard_(shard),
      policy_(policy),
      device_(device),
      table_(gpt2_param_table(cfg, shard)),
      hooks_(std::make_shared<HookLists>()) {
  SL_CHECK_HINT(policy.grad_dtype == DType::F32 && policy.master_dtype == DType::F32,
                "use --precision fp32 or bf16 (bf16 parameters, fp32 gradients and master weights)",
                "unsupported precision policy %s: gradients and master weights must be f32", policy.name().c_str());
  SL_CHECK(policy.param_dtype == DType::F32 || policy.param_dtype == DType::BF16,
           "parameter dtype %s is not f32 or bf16", dtype_name(policy.param_dtype));
  SL_CHECK_HINT(policy.matmul_dtype == DType::F32 ||
                    (policy.matmul_dtype == DType::BF16 && policy.param_dtype == DType::BF16),
                "use --precision bf16-compute (bf16 parameters and bf16 matmul operands)",
                "unsupported precision policy %s: bf16 matmuls read the bf16 parameters in place, so they need "
                "bf16 parameters",
                policy.name().c_str());
  SL_CHECK_HINT(policy.activation_dtype == DType::F32 || policy.activation_dtype == DType::BF16,
                "use --activations fp32 or bf16", "unsupported activation dtype %s",
                dtype_name(policy.activation_dtype));
  // Context parallel: the point returns out and lse (the flash op's activations), never the (T, T) scores.
  if (shard_.cp_size > 1) attention_ = AttentionImpl::Flash;
  // Where each parameter's fp32 values sit for the fp32 ops (unit_weights_f32).
  if (policy.matmul_dtype == DType::BF16) {
    // Pack each unit's non-matmul parameters; every slot starts on a multiple of 4 floats (16 bytes), since
    // cuBLASLt's bias epilogue wants a 16-byte aligned bias (common/src/ops/cuda/matmul.cu). A block needs
    // 13C floats (+ padding); unit 0 (V + maxT) * C: the encoder reads wte and wpe in fp32.
    std::vector<int64_t> used(num_units(), 0);  // floats of the scratch used per unit
    for (const ParamInfo& p : table_) {
      if (is_matmul_only_weight(p, cfg.n_layer)) {
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
  // The entries forward and backward read, by table index (BlockParams); -1 where the shard has none.
  auto find = [&](const std::string& name) {
    for (size_t i = 0; i < table_.size(); ++i)
      if (table_[i].name == name) return static_cast<int>(i);
    return -1;
  };
  wte_ = find("wte");  // unit 0's, or the tied copy in unit L+1 (the only wte of such a shard)
  wpe_ = find("wpe");
  lnf_w_ = find("ln_f.weight");
  lnf_b_ = find("ln_f.bias");
  head_wte_ = shard.has_head ? wte_ : -1;
  if (!shard.has_embedding) wte_ = -1;  // no embedding to look up in
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    auto at = [&](const char* n) { return find(p + n); };
    blocks_.push_back({at("ln_1.weight"), at("ln_1.bias"), at("attn.c_attn.weight"), at("attn.c_attn.bias"),
                       at("attn.c_proj.weight"), at("attn.c_proj.bias"), at("ln_2.weight"), at("ln_2.bias"),
                       at("mlp.c_fc.weight"), at("mlp.c_fc.bias"), at("mlp.c_proj.weight"), at("mlp.c_proj.bias")});
  }
  recompute_.assign(cfg.n_layer, Recompute::None);
  params_.resize(num_units());
  grads_.resize(num_units());
  if (!allocate) return;
  const std::vector<int64_t> unit_numel = gpt2_unit_numel(cfg, shard);
  for (int u = 0; u < num_units(); ++u) {
    if (!owns_unit(u)) continue;
    params_[u] = Tensor::empty({unit_numel[u]}, policy.param_dtype, device, MemCategory::Params);
    grads_[u] = Tensor::zeros({unit_numel[u]}, DType::F32, device, MemCategory::Grads);
  }
}

int64_t GPT2::num_params() const {
  int64_t n = 0;
  for (const ParamInfo& p : table_) n += p.numel;
  return n;
}

int GPT2::index_of(const std::string& name) const {
  for (size_t i = 0; i < table_.size(); ++i)
    if (table_[i].name == name) return static_cast<int>(i);
  SL_FAIL("parameter names are listed by gpt2_param_table(); e.g. \"h.0.attn.c_attn.weight\"",
          "no parameter named '%s' in this model (%s)", name.c_str(), shard_.str().c_str());
}

const ParamInfo& GPT2::info(const std::string& name) const { return table_[index_of(name)]; }

Tensor GPT2::param_at(int i) const {
  const ParamInfo& p = table_[i];
  SL_CHECK(params_[p.unit].defined(), "unit %d's parameters (for %s) are not in memory (no buffer installed)", p.unit,
           p.name.c_str());
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

TensorParallel& GPT2::tp() const {
  static TensorParallel identity;  // stateless: the dense model's points
  if (tp_ != nullptr) return *tp_;
  SL_CHECK_HINT(shard_.tp_size == 1,
                "a tensor-parallel shard needs set_tensor_parallel(...) with the points "
                "of its tp group (lab 05) before its first forward",
                "tp=%d shard without tensor-parallel points", shard_.tp_size);
  return identity;
}

ContextParallel& GPT2::cp() const {
  static ContextParallel identity;  // stateless: the flash op on the whole sequence
  if (cp_ != nullptr) return *cp_;
  SL_CHECK_HINT(shard_.cp_size == 1,
                "a context-parallel shard needs set_context_parallel(...) with the point of its cp group "
                "(lab 10) before its first forward",
                "cp=%d shard without a context-parallel point", shard_.cp_size);
  return identity;
}

Tensor GPT2::slice_wpe(const Tensor& wpe) const {
  const int64_t C = cfg_.n_embd, maxT = wpe.size(0);
  if (cp_chunks_.size() == 1) {  // contiguous (and cp = 1: position 0, wpe itself)
    const int64_t p = cp_chunks_[0].position;
    return wpe.view(p * C, {maxT - p, C});
  }
  Tensor rows =
      Tensor::empty({cp_chunks_.back().row + cp_chunks_.back().length, C}, DType::F32, device_, MemCategory::Workspace);
  for (const CpChunk& c : cp_chunks_) {
    Tensor dst = rows.view(int64_t{c.row} * C, {c.length, C});
    dst.copy_from(wpe.view(int64_t{c.position} * C, {c.length, C}));
  }
  return rows;
}

// dwte += the token rows, dwpe += the rows of the shard's positions (cp_chunks_), through the embedding point.
void GPT2::embedding_backward_slice(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  TensorParallel& points = tp();
  const int64_t C = cfg_.n_embd, maxT = dwpe.size(0);
  if (cp_chunks_.size() == 1) {
    const int64_t p = cp_chunks_[0].position;
    Tensor dwpe_rows = dwpe.view(p * C, {maxT - p, C});
    points.embedding_backward(dwte, dwpe_rows, dout, tokens);
    return;
  }
  Tensor rows =
      Tensor::zeros({cp_chunks_.back().row + cp_chunks_.back().length, C}, DType::F32, device_, MemCategory::Workspace);
  points.embedding_backward(dwte, rows, dout, tokens);
  for (const CpChunk& c : cp_chunks_) {
    Tensor dst = dwpe.view(int64_t{c.position} * C, {c.length, C});
    add_(dst, rows.view(int64_t{c.row} * C, {c.length, C}));
  }
}

// GPT-2 initialisation (as in GPT-2 / nanoGPT): weights N(0, 0.02); the two residual projections per
// block (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)) so the residual stream's variance does not grow
// with depth (Radford et al. 2019, Sec. 2.3); layernorm weight 1; biases 0. Drawn in table order on
// the CPU from one random stream, one unit at a time.
void gpt2_initial_weights(const GPTConfig& cfg, uint64_t seed,
                          const std::function<void(int unit, const Tensor& w)>& sink) {
  if (sim_timing_only()) return;  // --timing-only: no arithmetic reads the weights, so none are drawn (gpt2.h)
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

// Writes fp32 host values into a parameter buffer of the policy's dtype on the model's device.
static void write_params(Tensor& dst, const Tensor& host, Device device) {
  if (dst.dtype() == DType::F32 && device == Device::CPU) {
    dst.copy_from(host);
  } else {
    Tensor staged = Tensor::empty({host.numel()}, dst.dtype(), Device::CPU, MemCategory::Workspace);
    cast(staged, host);
    dst.copy_from(staged);
  }
}

void GPT2::init_weights(uint64_t seed) {
  if (shard_.is_dense(cfg_)) {
    gpt2_initial_weights(cfg_, seed, [this](int u, const Tensor& host) {
      SL_CHECK(params_[u].defined(), "init_weights: unit %d has no parameter buffer installed", u);
      Tensor dst = params_[u].view(0, {host.numel()});
      write_params(dst, host, device_);
    });
    return;
  }
  // A shard: the dense model's weights, one dense unit at a time, sliced into the shard's units. The
  // last stage's copy of wte comes from dense unit 0, which arrives first: kept until unit L+1 is written.
  const std::vector<ParamInfo> dense = gpt2_param_table(cfg_);
  Tensor wte_copy;  // (V/tp * C,) fp32 host: the tied copy's slice, while dense unit L+1 is not here yet
  gpt2_initial_weights(cfg_, seed, [&](int u, const Tensor& dense_unit) {
    for (const ParamInfo& q : dense) {
      if (q.unit != u) continue;
      for (size_t i = 0; i < table_.size(); ++i) {
        const ParamInfo& p = table_[i];
        if (p.name != q.name) continue;
        if (p.tied_copy) {
          wte_copy = Tensor::empty({p.numel}, DType::F32, Device::CPU, MemCategory::Workspace);
          copy_dense_to_shard(p, shard_, dense_unit.view(q.offset, {q.numel}), wte_copy);
        }
      }
    }
    if (!owns_unit(u)) return;
    SL_CHECK(params_[u].defined(), "init_weights: unit %d has no parameter buffer installed", u);
    Tensor host = Tensor::empty({params_[u].numel()}, DType::F32, Device::CPU, MemCategory::Workspace);
    for (const ParamInfo& p : table_) {
      if (p.unit != u) continue;
      Tensor dst = host.view(p.offset, {p.numel});
      if (p.tied_copy) {
        dst.copy_from(wte_copy);
        continue;
      }
      for (const ParamInfo& q : dense)
        if (q.name == p.name) copy_dense_to_shard(p, shard_, dense_unit.view(q.offset, {q.numel}), dst);
    }
    write_params(params_[u], host, device_);
  });
}

void GPT2::zero_grad() {
  for (Tensor& g : grads_)
    if (g.defined()) g.zero_();
}

void GPT2::free_activations() {
  acts_ = GPT2Activations{};
  scratch_ = BackwardScratch{};
}

void GPT2::set_attention(AttentionImpl impl) {
  if (impl == attention_) return;
  SL_CHECK_HINT(shard_.cp_size == 1, "context parallelism merges each row's blocks by their log-sum-exp: keep Flash",
                "set_attention(Materialized) on a context-parallel shard (%s)", shard_.str().c_str());
  attention_ = impl;
  free_activations();
}

void GPT2::set_recompute(Recompute mode) {
  for (int l = shard_.first_layer; l <= shard_.last(cfg_); ++l) recompute_[l] = mode;
  free_activations();
}

void GPT2::set_recompute(int layer, Recompute mode) {
  SL_CHECK_HINT(layer >= shard_.first_layer && layer <= shard_.last(cfg_),
                "recompute is chosen for the blocks this shard owns (0-based global layer numbers)",
                "set_recompute: layer %d is not a block of this shard (%s)", layer, shard_.str().c_str());
  recompute_[layer] = mode;
  free_activations();
}

// ---------------------------------------------------------------------------------------------
// Hooks (the lists: hooks.h)

HookHandle GPT2::add_hook(HookPoint point, Hook fn, HookOrder order) {
  const uint64_t id = hooks_->add(point, std::move(fn), order);
  return HookHandle(hooks_, point, id);
}

int GPT2::num_hooks(HookPoint point) const { return hooks_->size(point); }

void GPT2::run_hooks(HookPoint point, int unit) {
  hooks_->run(point, UnitHookArgs{unit, params_.at(unit), grads_.at(unit)});
}

// ---------------------------------------------------------------------------------------------
// Activations: the sets (caller-owned, or the model's own) and the backward's scratch, allocated as
// gpt2_activations.h says for this model's choices

void GPT2::ensure_scratch(int B, int T) {
  if (scratch_.B == B && scratch_.T == T) return;
  scratch_ = BackwardScratch{};  // freed before the new one is allocated: the two never coexist
  scratch_ = allocate_backward_scratch(activation_spec(), B, T, policy_.matmul_dtype, f32_scratch_numel_);
}

GPT2Activations GPT2::make_activations(int B, int T) {
  SL_CHECK(B > 0 && T > 0, "make_activations(B=%d, T=%d): both must be positive", B, T);
  SL_CHECK_HINT(T <= cfg_.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "sequence length T=%d exceeds max_seq_len=%d", T, cfg_.max_seq_len);
  GPT2Activations a = allocate_activations(activation_spec(), B, T);
  ensure_scratch(B, T);
  return a;
}

void GPT2::ensure_activations(int B, int T) {
  if (acts_.B_ == B && acts_.T_ == T) return;
  free_activations();
  acts_ = allocate_activations(activation_spec(), B, T);
  ensure_scratch(B, T);
}

Tensor GPT2::unit_weights_f32(int unit) {
  SL_CHECK_HINT(params_[unit].defined(),
                "a sharded model must install (gather) a unit's parameters before its forward and backward, "
                "e.g. in a HookPoint::BeforeForward / BeforeBackward hook (lab 04 README \"ZeRO-3\")",
                "unit %d's parameters are not in memory (no buffer installed)", unit);
  if (policy_.param_dtype == DType::F32) return params_[unit];
  if (policy_.matmul_dtype == DType::BF16) {
    // bf16-compute: only the parameters the fp32 ops read, cast into their slots of the one scratch buffer
    // (no allocation per pass); the matmul weights stay bf16 (matmul_weight).
    SL_CHECK(scratch_.small_params_f32.defined(), "unit_weights_f32(%d) before ensure_scratch", unit);
    for (size_t i = 0; i < table_.size(); ++i) {
      const ParamInfo& p = table_[i];
      if (p.unit != unit || f32_offset_[i] < 0) continue;
      Tensor dst = scratch_.small_params_f32.view(f32_offset_[i], {p.numel});
      cast(dst, params_[unit].view(p.offset, {p.numel}));
    }
    return scratch_.small_params_f32;
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
  Tensor inp_bf16 = scratch_.matmul_inp_bf16.view(0, inp.shape());
  cast(inp_bf16, inp);
  matmul_forward_bf16(out, inp_bf16, weight, bias);
}

void GPT2::policy_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                                  const Tensor& weight) {
  if (policy_.matmul_dtype == DType::F32) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight);
    return;
  }
  // inp is re-rounded from the saved fp32 activation: the same bits the forward multiplied (rounding is
  // deterministic), without keeping a bf16 copy of every activation alive until the backward. Only dweight
  // reads it: without dweight the view is passed for its shape, unfilled.
  Tensor dout_bf16 = scratch_.matmul_dout_bf16.view(0, dout.shape());
  cast(dout_bf16, dout);
  Tensor inp_bf16 = scratch_.matmul_inp_bf16.view(0, inp.shape());
  if (dweight != nullptr) cast(inp_bf16, inp);
  matmul_backward_bf16(dinp, dweight, dbias, dout_bf16, inp_bf16, weight);
}

// A row-parallel linear (attn c_proj, mlp c_proj): out = g(inp @ W^T) + bias, the bias added once, after the
// reduction (Megatron-LM Sec. 3), by g itself. With one rank the reduction is the identity and the bias goes
// into the matmul (the dense model's arithmetic, bit for bit). With sequence parallelism g is the
// reduce-scatter into out (Nl,C); y_full (B,T,C) holds the partial product meanwhile.
void GPT2::row_parallel_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  TensorParallel& points = tp();
  if (shard_.tp_size == 1) {
    policy_matmul_forward(out, inp, weight, &bias);
    points.g_forward(out, nullptr);  // the bias is in already
  } else if (shard_.sequence_parallel) {
    policy_matmul_forward(scratch_.y_full, inp, weight, nullptr);
    points.sp_scatter_forward(scratch_.y_full, out, &bias);
  } else {
    policy_matmul_forward(out, inp, weight, nullptr);
    points.g_forward(out, &bias);
  }
}

// ---------------------------------------------------------------------------------------------
// 16-bit activations (PrecisionPolicy::activation_dtype BF16; gpt2_activations.h "The tensors"): a block
// computes in the fp32 working block, and what its backward reads is kept rounded to bf16.

// The fp32 block a 16-bit set's block computes in: the shared working block, with the set's own fp32 tensors
// (residual3, the layernorm statistics, lse) in place of the working block's, and no att where the set keeps
// none (Selective: the scores go to att_recompute, as without 16-bit activations).
static BlockActivations working_block(const BlockActivations& work, const BlockActivations& kept) {
  BlockActivations v = work;
  v.mode = kept.mode;
  v.residual3 = kept.residual3;
  v.ln1_mean = kept.ln1_mean;
  v.ln1_rstd = kept.ln1_rstd;
  v.ln2_mean = kept.ln2_mean;
  v.ln2_rstd = kept.ln2_rstd;
  v.lse = kept.lse;
  if (!kept.att.defined()) v.att = Tensor();
  return v;
}

// Every tensor a 16-bit set keeps in bf16, paired with the working block's fp32 one (the gathered *_full
// only under sequence parallelism: else they are ln1 and ln2 themselves).
static std::vector<std::pair<Tensor*, Tensor*>> rounded_pairs(BlockActivations& kept, BlockActivations& v, bool sp) {
  std::vector<std::pair<Tensor*, Tensor*>> pairs = {
      {&kept.ln1, &v.ln1}, {&kept.qkv, &v.qkv}, {&kept.atty, &v.atty},        {&kept.residual2, &v.residual2},
      {&kept.ln2, &v.ln2}, {&kept.fch, &v.fch}, {&kept.fch_gelu, &v.fch_gelu}};
  if (kept.att.defined()) pairs.push_back({&kept.att, &v.att});
  if (sp) {
    pairs.push_back({&kept.ln1_full, &v.ln1_full});
    pairs.push_back({&kept.ln2_full, &v.ln2_full});
  }
  return pairs;
}

// ---------------------------------------------------------------------------------------------
// Forward

void GPT2::block_forward(BlockActivations& ba, const Tensor& x, const Tensor& w, const BlockParams& b) {
  TensorParallel& points = tp();
  const int NHl = cfg_.n_head / shard_.tp_size;
  Tensor qkv_b = weight_view(w, b.c_attn_b), proj_b = weight_view(w, b.attn_proj_b);
  Tensor fc_b = weight_view(w, b.c_fc_b), fcproj_b = weight_view(w, b.mlp_proj_b);
  // attention: x + c_proj(attention(c_attn(ln_1(x)))), c_attn column-parallel, c_proj row-parallel
  layernorm_forward(ba.ln1, ba.ln1_mean, ba.ln1_rstd, x, weight_view(w, b.ln_1_w), weight_view(w, b.ln_1_b));
  if (shard_.sequence_parallel) points.sp_gather_forward(ba.ln1, ba.ln1_full);
  else points.f_forward(ba.ln1_full);
  policy_matmul_forward(ba.qkv, ba.ln1_full, matmul_weight(w, b.c_attn_w), &qkv_b);
  if (attention_ == AttentionImpl::Flash) cp().attention_forward(ba.atty, ba.lse, ba.qkv, NHl, cp_chunks_);
  else  // Selective keeps no att: the scores go to the shared buffer and are recomputed in the backward
    attention_forward(ba.atty, ba.att.defined() ? ba.att : scratch_.att_recompute, ba.qkv, NHl);
  row_parallel_forward(ba.attproj, ba.atty, matmul_weight(w, b.attn_proj_w), proj_b);
  residual_forward(ba.residual2, x, ba.attproj);
  // MLP: residual2 + c_proj(gelu(c_fc(ln_2(residual2)))), c_fc column-parallel, c_proj row-parallel
  layernorm_forward(ba.ln2, ba.ln2_mean, ba.ln2_rstd, ba.residual2, weight_view(w, b.ln_2_w), weight_view(w, b.ln_2_b));
  if (shard_.sequence_parallel) points.sp_gather_forward(ba.ln2, ba.ln2_full);
  else points.f_forward(ba.ln2_full);
  policy_matmul_forward(ba.fch, ba.ln2_full, matmul_weight(w, b.c_fc_w), &fc_b);
  gelu_forward(ba.fch_gelu, ba.fch);
  row_parallel_forward(ba.fcproj, ba.fch_gelu, matmul_weight(w, b.mlp_proj_w), fcproj_b);
  residual_forward(ba.residual3, ba.residual2, ba.fcproj);
}

float GPT2::forward(const Tensor& tokens, const Tensor* targets) {
  SL_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32, "tokens must be (B, T) i32, got %s %s",
           shape_str(tokens.shape()).c_str(), dtype_name(tokens.dtype()));
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  SL_CHECK_HINT(T <= cfg_.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "sequence length T=%d exceeds max_seq_len=%d", T, cfg_.max_seq_len);
  ensure_activations(B, T);
  return forward(acts_, tokens, targets);
}

float GPT2::forward(GPT2Activations& a, const Tensor& input, const Tensor* targets) {
  SL_CHECK_HINT(!a.empty(), "make the set with model.make_activations(B, T)", "forward on an empty activation set");
  const int B = a.B_, T = a.T_, L = cfg_.n_layer;
  ensure_scratch(B, T);
  TensorParallel& points = tp();
  cp_chunks_ = cp_chunks(shard_, cfg_, T);  // T is the shard's slice: positions as cp_chunks says
  a.have_targets = targets != nullptr;

  // The stage's input: the embedding of the tokens, or the hidden state the previous stage sent.
  if (shard_.has_embedding) {
    SL_CHECK(input.shape() == (Shape{B, T}) && input.dtype() == DType::I32,
             "a stage with the embedding takes tokens (B=%d, T=%d) i32, got %s %s", B, T,
             shape_str(input.shape()).c_str(), dtype_name(input.dtype()));
    a.tokens.copy_from(input);
  } else {
    SL_CHECK(input.shape() == a.input.shape() && input.dtype() == DType::F32,
             "a stage without the embedding takes the hidden state %s f32, got %s %s",
             shape_str(a.input.shape()).c_str(), shape_str(input.shape()).c_str(), dtype_name(input.dtype()));
    a.input.copy_from(input);
  }
  if (targets) {
    SL_CHECK_HINT(shard_.has_head, "only the last stage (the one with the head) computes a loss",
                  "forward with targets on a stage without the head (%s)", shard_.str().c_str());
    SL_CHECK(targets->shape() == (Shape{B, T}) && targets->dtype() == DType::I32, "targets %s must be (B=%d, T=%d) i32",
             shape_str(targets->shape()).c_str(), B, T);
    a.targets.copy_from(*targets);
  }

  // embeddings (vocabulary-parallel under tensor parallelism)
  if (shard_.has_embedding) {
    run_hooks(HookPoint::BeforeForward, 0);
    {
      Tensor w = unit_weights_f32(0);
      points.embedding_forward(a.encoded, a.tokens, weight_view(w, wte_), slice_wpe(weight_view(w, wpe_)));
    }
    run_hooks(HookPoint::AfterForward, 0);
  }

  // transformer blocks
  Tensor x = shard_.has_embedding ? a.encoded : a.input;  // (stream) the residual stream entering the block
  for (int l = shard_.first_layer; l <= shard_.last(cfg_); ++l) {
    const int unit = 1 + l;
    BlockActivations& ba = a.blocks[l - shard_.first_layer];
    const BlockParams& b = blocks_[l];
    SL_CHECK_HINT(ba.mode == recompute_[l], "make a new set (model.make_activations) after set_recompute",
                  "block %d: the activation set keeps '%s', the model now recomputes '%s'", l, recompute_name(ba.mode),
                  recompute_name(recompute_[l]));
    run_hooks(HookPoint::BeforeForward, unit);
    if (ba.mode == Recompute::Full) {
      // the whole block runs in the shared working set; only its output stays in this set
      BlockActivations work = scratch_.work;
      work.residual3 = ba.residual3;
      block_forward(work, x, unit_weights_f32(unit), b);
    } else if (policy_.activation_dtype != DType::F32) {
      // 16-bit activations: compute in the fp32 working block, keep what the backward reads rounded to bf16
      BlockActivations work = working_block(scratch_.work, ba);
      block_forward(work, x, unit_weights_f32(unit), b);
      for (auto [kept, computed] : rounded_pairs(ba, work, shard_.sequence_parallel)) cast(*kept, *computed);
    } else {
      block_forward(ba, x, unit_weights_f32(unit), b);
    }
    x = ba.residual3;
    run_hooks(HookPoint::AfterForward, unit);
  }
  if (!shard_.has_head) return std::numeric_limits<float>::quiet_NaN();  // the output is a.output()

  // final layernorm, then the LM head tied to wte: logits (B,T,V/tp) = lnf (B,T,C) @ wte (V/tp,C)^T, the
  // head column-parallel over the vocabulary. The dense model's head reads unit 0 after ln_f's hooks (its
  // hooks keep unit 0 available); a last stage's own copy of wte is part of unit L+1.
  const bool head_in_unit0 = table_[head_wte_].unit == 0;
  run_hooks(HookPoint::BeforeForward, L + 1);
  {
    Tensor w = unit_weights_f32(L + 1);
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, weight_view(w, lnf_w_), weight_view(w, lnf_b_));
    if (shard_.sequence_parallel) points.sp_gather_forward(a.lnf, a.lnf_full);
    else points.f_forward(a.lnf_full);
    if (!head_in_unit0) policy_matmul_forward(a.head_logits, a.lnf_full, matmul_weight(w, head_wte_), nullptr);
  }
  run_hooks(HookPoint::AfterForward, L + 1);
  if (head_in_unit0) {
    Tensor w = unit_weights_f32(0);  // bf16-compute reads wte in bf16 and needs none of it (a small cast)
    policy_matmul_forward(a.head_logits, a.lnf_full, matmul_weight(w, head_wte_), nullptr);
  }
  if (!targets) return std::numeric_limits<float>::quiet_NaN();

  points.cross_entropy_forward(a.losses, a.probs, a.head_logits, a.targets);
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

// ---------------------------------------------------------------------------------------------
// Backward

void GPT2::backward() {
  SL_CHECK_HINT(acts_.have_targets && acts_.B_ > 0, "call forward(tokens, &targets) before backward()",
                "backward() without a forward pass that had targets");
  backward(acts_, nullptr, nullptr);
}

// The gradient of a row-parallel linear's input: dinp += d(out) @ W, dW += d(out)^T @ inp, dbias += column
// sums of d(out). d(out) is g's backward of dout: the identity, or with sequence parallelism the all-gather
// of dout (Nl,C) into y_full (B,T,C); the bias gradient is then whole on every rank.
void GPT2::row_parallel_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, Tensor& dout, const Tensor& inp,
                                 const Tensor& weight) {
  TensorParallel& points = tp();
  if (shard_.sequence_parallel) {
    points.sp_scatter_backward(dout, scratch_.y_full);
    policy_matmul_backward(dinp, dweight, dbias, scratch_.y_full, inp, weight);
  } else {
    points.g_backward(dout);
    policy_matmul_backward(dinp, dweight, dbias, dout, inp, weight);
  }
}

void GPT2::block_backward(Tensor& dresidual, BlockActivations& ba, const Tensor& x, const Tensor& w,
                          const BlockParams& b, bool keep_for_weight) {
  TensorParallel& points = tp();
  BackwardScratch& s = scratch_;
  const int NHl = cfg_.n_head / shard_.tp_size;
  const bool sp = shard_.sequence_parallel;
  // dln_full: the gradient of a column-parallel region's (gathered) input, partial on each rank
  Tensor& dln_full = sp ? s.dln_full : s.dln;
  auto W = [&](int i) { return weight_view(w, i); };     // fp32 (layernorm weights)
  auto MW = [&](int i) { return matmul_weight(w, i); };  // in the policy's matmul dtype
  auto G = [&](int i) { return grad_at(i); };
  // The matmuls' weight and bias gradients: here, or (keep_for_weight) none now, their douts kept for W.
  auto DW = [&](Tensor& g) { return keep_for_weight ? nullptr : &g; };

  // MLP branch: residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2))))
  Tensor dfcproj_w = G(b.mlp_proj_w), dfcproj_b = G(b.mlp_proj_b);
  s.dfch_gelu.zero_();
  row_parallel_backward(&s.dfch_gelu, DW(dfcproj_w), DW(dfcproj_b), dresidual, ba.fch_gelu, MW(b.mlp_proj_w));
  if (keep_for_weight) ba.fcproj.copy_from(dresidual);  // c_proj's dout, in the memory of its output
  s.dfch.zero_();
  gelu_backward(s.dfch, ba.fch, s.dfch_gelu);
  if (keep_for_weight) ba.fch.copy_from(s.dfch);  // c_fc's dout (B,T,4C), in the memory of its output
  Tensor dfc_w = G(b.c_fc_w), dfc_b = G(b.c_fc_b);
  dln_full.zero_();
  policy_matmul_backward(&dln_full, DW(dfc_w), DW(dfc_b), s.dfch, ba.ln2_full, MW(b.c_fc_w));
  if (sp) points.sp_gather_backward(dln_full, s.dln);  // c_fc is column-parallel: its dinp is partial
  else points.f_backward(s.dln);
  // the skip connection passes dresidual through unchanged; ln_2's backward ADDS its part to it
  Tensor dln2_w = G(b.ln_2_w), dln2_b = G(b.ln_2_b);
  layernorm_backward(dresidual, dln2_w, dln2_b, s.dln, ba.residual2, W(b.ln_2_w), ba.ln2_mean, ba.ln2_rstd);

  // attention branch: residual2 = x + c_proj(attention(c_attn(ln_1(x))))
  Tensor dproj_w = G(b.attn_proj_w), dproj_b = G(b.attn_proj_b);
  s.datty.zero_();
  row_parallel_backward(&s.datty, DW(dproj_w), DW(dproj_b), dresidual, ba.atty, MW(b.attn_proj_w));
  if (keep_for_weight) ba.attproj.copy_from(dresidual);  // attention c_proj's dout, in its output's memory
  s.dqkv.zero_();
  if (attention_ == AttentionImpl::Flash) {
    cp().attention_backward(s.dqkv, s.datty, ba.qkv, ba.atty, ba.lse, NHl, cp_chunks_);
  } else if (ba.att.defined()) {
    attention_backward(s.dqkv, s.datt, s.datty, ba.qkv, ba.att, NHl);
  } else {
    // Selective recompute: the scores again from the kept qkv (Korthikanti Sec. 5). atty is rewritten
    // with the values it already holds (the same op on the same input); only att was missing.
    attention_forward(ba.atty, s.att_recompute, ba.qkv, NHl);
    attention_backward(s.dqkv, s.datt, s.datty, ba.qkv, s.att_recompute, NHl);
  }
  if (keep_for_weight) ba.qkv.copy_from(s.dqkv);  // c_attn's dout (B,T,3C): qkv is read for the last time above
  Tensor dqkv_w = G(b.c_attn_w), dqkv_b = G(b.c_attn_b);
  dln_full.zero_();
  policy_matmul_backward(&dln_full, DW(dqkv_w), DW(dqkv_b), s.dqkv, ba.ln1_full, MW(b.c_attn_w));
  if (sp) points.sp_gather_backward(dln_full, s.dln);
  else points.f_backward(s.dln);
  Tensor dln1_w = G(b.ln_1_w), dln1_b = G(b.ln_1_b);
  layernorm_backward(dresidual, dln1_w, dln1_b, s.dln, x, W(b.ln_1_w), ba.ln1_mean, ba.ln1_rstd);
}

void GPT2::backward(GPT2Activations& a, const Tensor* d_output, Tensor* d_input) {
  backward_impl(a, d_output, d_input, false);
}

void GPT2::backward_input(GPT2Activations& a, const Tensor* d_output, Tensor* d_input) {
  SL_CHECK_HINT(shard_.tp_size == 1, "run backward(acts, ...) under tensor parallelism",
                "backward_input: the split backward is not supported with tensor parallelism (tp = %d)",
                shard_.tp_size);
  SL_CHECK_HINT(policy_.activation_dtype == DType::F32, "use --activations fp32 with a split backward (zb-h1)",
                "backward_input: 16-bit activations are converted into one shared fp32 working block, which "
                "cannot wait for backward_weight");
  for (int l = shard_.first_layer; l <= shard_.last(cfg_); ++l)
    SL_CHECK_HINT(recompute_[l] != Recompute::Full, "use --recompute none or selective with a split backward",
                  "backward_input: block %d recomputes 'full', whose working set cannot wait for backward_weight", l);
  backward_impl(a, d_output, d_input, true);
}

void GPT2::backward_impl(GPT2Activations& a, const Tensor* d_output, Tensor* d_input, bool split) {
  SL_CHECK_HINT(!a.empty() && !a.blocks.empty(), "call forward(acts, input, targets) before backward(acts, ...)",
                "backward on a set no forward has filled");
  SL_CHECK_HINT(!a.weight_pending, "finish it with backward_weight(acts); a set takes one backward",
                "backward on a set whose backward_input already ran");
  const int B = a.B_, T = a.T_, L = cfg_.n_layer;
  ensure_scratch(B, T);
  TensorParallel& points = tp();
  cp_chunks_ = cp_chunks(shard_, cfg_, T);
  BackwardScratch& s = scratch_;
  const bool sp = shard_.sequence_parallel;
  // dln_full: the gradient of a column-parallel region's (gathered) input, partial on each rank
  Tensor& dln_full = sp ? s.dln_full : s.dln;

  if (shard_.has_head) {
    SL_CHECK_HINT(d_output == nullptr && a.have_targets,
                  "the last stage's backward starts from the loss: "
                  "forward(acts, input, &targets), then backward(acts, nullptr, ...)",
                  "backward on the stage with the head needs a forward with targets and no d_output");
    Tensor dlogits = a.head_logits;  // logits are not needed any more: reuse their memory for dlogits
    // d(mean loss)/d(loss[b,t]) = 1/(B*T)
    points.cross_entropy_backward(dlogits, a.probs, a.targets, 1.0f / static_cast<float>(B * T));

    // The LM head's backward writes dwte (unit 0's in the dense model: its backward begins here and ends
    // with the embeddings; the last stage's own copy is part of unit L+1).
    const bool head_in_unit0 = table_[head_wte_].unit == 0;
    if (head_in_unit0) run_hooks(HookPoint::BeforeBackward, 0);
    else run_hooks(HookPoint::BeforeBackward, L + 1);
    dln_full.zero_();
    {
      Tensor w = unit_weights_f32(table_[head_wte_].unit);
      Tensor dwte = grad_at(head_wte_);
      // split: the head's dwte here when the head has its own copy of wte (head_weight_in_input), else in
      // backward_weight, from dlogits, which then stays in head_logits
      const bool dwte_now = !split || head_weight_in_input();
      policy_matmul_backward(&dln_full, dwte_now ? &dwte : nullptr, nullptr, dlogits, a.lnf_full,
                             matmul_weight(w, head_wte_));
    }
    // the head is column-parallel over the vocabulary: dlnf is partial on each rank
    if (sp) points.sp_gather_backward(dln_full, s.dln);
    else points.f_backward(s.dln);

    // final layernorm backward: dresidual = d(residual stream leaving the last block)
    if (head_in_unit0) run_hooks(HookPoint::BeforeBackward, L + 1);
    s.dresidual.zero_();
    {
      Tensor w = unit_weights_f32(L + 1);
      Tensor dw = grad_at(lnf_w_), db = grad_at(lnf_b_);
      layernorm_backward(s.dresidual, dw, db, s.dln, a.blocks.back().residual3, weight_view(w, lnf_w_), a.lnf_mean,
                         a.lnf_rstd);
    }
    if (!split) run_hooks(HookPoint::AfterBackward, L + 1);
  } else {
    SL_CHECK_HINT(d_output != nullptr && d_output->shape() == a.output().shape(),
                  "a stage without the head starts from d(loss)/d(its output), the shape of acts.output()",
                  "backward on a stage without the head needs d_output %s", shape_str(a.output().shape()).c_str());
    s.dresidual.copy_from(*d_output);
  }

  // blocks, last to first. dresidual enters as d(residual3[l]) and leaves as d(block input).
  for (int l = shard_.last(cfg_); l >= shard_.first_layer; --l) {
    const int unit = 1 + l;
    const BlockParams& b = blocks_[l];
    SL_CHECK_HINT(a.blocks[l - shard_.first_layer].mode == recompute_[l],
                  "make a new set (model.make_activations) after set_recompute",
                  "block %d: the activation set keeps '%s', the model now recomputes '%s'", l,
                  recompute_name(a.blocks[l - shard_.first_layer].mode), recompute_name(recompute_[l]));
    run_hooks(HookPoint::BeforeBackward, unit);
    Tensor w = unit_weights_f32(unit);
    const Tensor& block_in = l == shard_.first_layer ? (shard_.has_embedding ? a.encoded : a.input)
                                                     : a.blocks[l - 1 - shard_.first_layer].residual3;
    // Full recompute: re-run the block's forward from its kept input into the working set (with the
    // parameters the BeforeBackward hooks installed, without the forward hooks), then use that set.
    const bool full = recompute_[l] == Recompute::Full;
    const bool rounded = !full && policy_.activation_dtype != DType::F32;
    if (full) block_forward(s.work, block_in, w, b);
    BlockActivations& kept = a.blocks[l - shard_.first_layer];
    // 16-bit activations: the kept bf16 tensors converted back into the fp32 working block
    BlockActivations restored;
    if (rounded) {
      restored = working_block(s.work, kept);
      for (auto [k, v] : rounded_pairs(kept, restored, sp)) cast(*v, *k);
    }
    BlockActivations& ba = full ? s.work : rounded ? restored : kept;
    block_backward(s.dresidual, ba, block_in, w, b, split);
    if (!split) run_hooks(HookPoint::AfterBackward, unit);
  }

  if (shard_.has_embedding && split) {
    // The embedding has no input gradient: all of it is W. Its dout d(encoded) goes into encoded's memory
    // (read for the last time by the first block's ln_1 backward above).
    if (!shard_.has_head) run_hooks(HookPoint::BeforeBackward, 0);
    a.encoded.copy_from(s.dresidual);
  } else if (shard_.has_embedding) {
    // embeddings: dwte gets the token rows (this rank's vocabulary rows), dwpe the position rows. Unit 0's
    // backward began with the head in the dense model; on a first stage without the head it begins here.
    if (!shard_.has_head) run_hooks(HookPoint::BeforeBackward, 0);
    Tensor dwte = grad_at(wte_), dwpe = grad_at(wpe_);
    embedding_backward_slice(dwte, dwpe, s.dresidual, a.tokens);
    run_hooks(HookPoint::AfterBackward, 0);
  } else {
    SL_CHECK_HINT(d_input != nullptr,
                  "a stage without the embedding hands d(loss)/d(input) to the previous stage: "
                  "pass a tensor of acts.output()'s shape as d_input",
                  "backward without d_input on a stage without the embedding");
    d_input->copy_from(s.dresidual);
  }
  if (!split) return;

  // B is done: free what only it read, keep what W reads (each matmul's input and dout, the head's lnf and
  // dlogits unless B did the head's dwte, the embedding's tokens and dout). Without sequence parallelism ln1_full, ln2_full and lnf_full
  // are ln1, ln2 and lnf themselves, so dropping those names frees nothing the full ones hold.
  for (BlockActivations& ba : a.blocks) {
    ba.ln1 = ba.ln1_mean = ba.ln1_rstd = Tensor();
    ba.att = ba.lse = ba.residual2 = Tensor();
    ba.ln2 = ba.ln2_mean = ba.ln2_rstd = Tensor();
    ba.residual3 = Tensor();
  }
  a.input = a.targets = Tensor();
  a.lnf = a.lnf_mean = a.lnf_rstd = a.probs = a.losses = Tensor();
  // The head's weight gradient is done (head_weight_in_input): W reads neither dlogits (B,T,V) nor ln_f's output.
  if (shard_.has_head && head_weight_in_input()) a.head_logits = a.lnf_full = Tensor();
  a.weight_pending = true;
}

void GPT2::block_backward_weight(BlockActivations& ba, const Tensor& w, const BlockParams& b) {
  auto MW = [&](int i) { return matmul_weight(w, i); };  // read for its shape only: no input gradient here
  Tensor dfcproj_w = grad_at(b.mlp_proj_w), dfcproj_b = grad_at(b.mlp_proj_b);
  policy_matmul_backward(nullptr, &dfcproj_w, &dfcproj_b, ba.fcproj, ba.fch_gelu, MW(b.mlp_proj_w));
  Tensor dfc_w = grad_at(b.c_fc_w), dfc_b = grad_at(b.c_fc_b);
  policy_matmul_backward(nullptr, &dfc_w, &dfc_b, ba.fch, ba.ln2_full, MW(b.c_fc_w));
  Tensor dproj_w = grad_at(b.attn_proj_w), dproj_b = grad_at(b.attn_proj_b);
  policy_matmul_backward(nullptr, &dproj_w, &dproj_b, ba.attproj, ba.atty, MW(b.attn_proj_w));
  Tensor dqkv_w = grad_at(b.c_attn_w), dqkv_b = grad_at(b.c_attn_b);
  policy_matmul_backward(nullptr, &dqkv_w, &dqkv_b, ba.qkv, ba.ln1_full, MW(b.c_attn_w));
}

void GPT2::backward_weight(GPT2Activations& a) {
  SL_CHECK_HINT(a.weight_pending, "call backward_input(acts, ...) first; backward_weight finishes it",
                "backward_weight on a set without its backward_input");
  const int L = cfg_.n_layer;
  if (shard_.has_head && !head_weight_in_input()) {
    // the LM head's dwte from dlogits (kept in head_logits) and the ln_f output it multiplied
    Tensor w = unit_weights_f32(table_[head_wte_].unit);
    Tensor dwte = grad_at(head_wte_);
    policy_matmul_backward(nullptr, &dwte, nullptr, a.head_logits, a.lnf_full, matmul_weight(w, head_wte_));
  }
  if (shard_.has_head) run_hooks(HookPoint::AfterBackward, L + 1);  // backward()'s order: the head's unit first
  for (int l = shard_.last(cfg_); l >= shard_.first_layer; --l) {
    block_backward_weight(a.blocks[l - shard_.first_layer], unit_weights_f32(1 + l), blocks_[l]);
    run_hooks(HookPoint::AfterBackward, 1 + l);
  }
  if (shard_.has_embedding) {
    Tensor dwte = grad_at(wte_), dwpe = grad_at(wpe_);
    tp().embedding_backward(dwte, dwpe, a.encoded, a.tokens);
    run_hooks(HookPoint::AfterBackward, 0);
  }
  a = GPT2Activations{};  // W was the last reader: the whole set is freed
}

}  // namespace scalelab
