// gpt2_activations.cpp — the attention and recompute choices, and the tensors a forward keeps for its backward:
// the activation sets, one block's tensors and the backward's scratch (gpt2_activations.h). The memory
// estimator counts exactly these (gpt2_activation_bytes, common/src/measure/memory_estimator.cpp).
// Tests: tests/common/model/test_recompute.cpp, tests/common/model/test_gpt2.cpp (Gpt2Attention.*)
#include "scalelab/model/gpt2_activations.h"

#include <algorithm>

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL

namespace scalelab {

// ---------------------------------------------------------------------------------------------
// The choices

const char* attention_impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::Materialized ? "materialized" : "flash";
}

AttentionImpl attention_impl_from_name(const std::string& name) {
  if (name == "materialized") return AttentionImpl::Materialized;
  if (name == "flash") return AttentionImpl::Flash;
  SL_FAIL(
      "use --attention materialized (saves the (B,NH,T,T) scores; fastest while they fit), flash (saves "
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

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    default: return "full";
  }
}

Recompute recompute_from_name(const std::string& name) {
  for (Recompute m : {Recompute::None, Recompute::Selective, Recompute::Full})
    if (name == recompute_name(m)) return m;
  SL_FAIL(
      "use --recompute none (keep every activation), selective (recompute attention's scores in the "
      "backward) or full (keep only each block's input and re-run the block in the backward)",
      "unknown recompute mode '%s'", name.c_str());
}

double recompute_flops_per_token(const GPTConfig& cfg, int T, Recompute mode) {
  const double L = cfg.n_layer, C = cfg.n_embd, attention = 4.0 * T * C;  // Q K^T and att @ V, 2 FLOPs a MAC
  if (mode == Recompute::Selective) return L * attention;
  // Full: the four matmuls (c_attn 3C^2, attn c_proj C^2, c_fc and mlp c_proj 4C^2 each) plus attention
  if (mode == Recompute::Full) return L * (24.0 * C * C + attention);
  return 0.0;
}

// ---------------------------------------------------------------------------------------------
// The tensors

namespace {
// The residual stream: (B,T,C), or this rank's (B*T/tp, C) rows of it with sequence parallelism.
Shape stream_shape(const ActivationSpec& spec, int B, int T) {
  const int64_t C = spec.cfg.n_embd, tp = spec.shard.tp_size;
  return spec.shard.sequence_parallel ? Shape{static_cast<int64_t>(B) * T / tp, C} : Shape{B, T, C};
}
// One value per token row of the stream: (B,T), or (B*T/tp) with sequence parallelism.
Shape rows_shape(const ActivationSpec& spec, int B, int T) {
  return spec.shard.sequence_parallel ? Shape{static_cast<int64_t>(B) * T / spec.shard.tp_size} : Shape{B, T};
}
Tensor activation(const ActivationSpec& spec, const Shape& shape) {
  return Tensor::empty(shape, DType::F32, spec.device, MemCategory::Activations);
}
// A tensor the 16-bit policy stores in spec.saved_dtype (gpt2_activations.h "The tensors").
Tensor saved_activation(const ActivationSpec& spec, const Shape& shape) {
  return Tensor::empty(shape, spec.saved_dtype, spec.device, MemCategory::Activations);
}
}  // namespace

const Tensor& GPT2Activations::output() const {
  SL_CHECK_HINT(!blocks.empty(), "call forward(acts, input, targets) first", "no forward has run on this set");
  return blocks.back().residual3;
}

GPT2Activations allocate_activations(const ActivationSpec& spec, int B, int T) {
  const GPTConfig& cfg = spec.cfg;
  const ModelShard& shard = spec.shard;
  const int64_t C = cfg.n_embd, tp = shard.tp_size, Vl = cfg.vocab_size / tp;
  const bool sp = shard.sequence_parallel;
  SL_CHECK_HINT(!sp || (static_cast<int64_t>(B) * T) % tp == 0,
                "with sequence parallelism the B*T token rows are split into tp equal blocks",
                "B*T=%lld not divisible by tp=%lld", static_cast<long long>(B) * T, static_cast<long long>(tp));
  const Shape stream = stream_shape(spec, B, T), rows = rows_shape(spec, B, T);
  auto act = [&](const Shape& s) { return activation(spec, s); };
  GPT2Activations a;
  a.B_ = B;
  a.T_ = T;
  if (shard.has_embedding) {
    a.encoded = act(stream);
    a.tokens = Tensor::empty({B, T}, DType::I32, spec.device, MemCategory::Activations);
  } else {
    a.input = act(stream);
  }
  for (int l = shard.first_layer; l <= shard.last(cfg); ++l)
    a.blocks.push_back(allocate_block_activations(spec, B, T, spec.recompute.at(l)));
  if (shard.has_head) {
    a.lnf = act(stream);
    a.lnf_mean = act(rows);
    a.lnf_rstd = act(rows);
    a.lnf_full = sp ? act({B, T, C}) : a.lnf;
    a.head_logits = act({B, T, Vl});
    a.probs = act({B, T, Vl});
    a.losses = act({B, T});
    a.targets = Tensor::empty({B, T}, DType::I32, spec.device, MemCategory::Activations);
  }
  return a;
}

BlockActivations allocate_block_activations(const ActivationSpec& spec, int B, int T, Recompute mode) {
  const int64_t C = spec.cfg.n_embd, tp = spec.shard.tp_size, NHl = spec.cfg.n_head / tp;
  const bool sp = spec.shard.sequence_parallel;
  const Shape stream = stream_shape(spec, B, T), rows = rows_shape(spec, B, T);
  const bool bf16 = spec.saved_dtype != DType::F32;
  auto act = [&](const Shape& s) { return activation(spec, s); };          // fp32 in every policy
  auto saved = [&](const Shape& s) { return saved_activation(spec, s); };  // 16-bit with bf16 activations
  BlockActivations b;
  b.mode = mode;
  b.residual3 = act(stream);              // the block's output: kept in every mode (the next block's input)
  if (mode == Recompute::Full) return b;  // the rest lives in the model's BackwardScratch::work while it is needed
  b.ln1 = saved(stream);
  b.ln1_mean = act(rows);
  b.ln1_rstd = act(rows);
  b.ln1_full = sp ? saved({B, T, C}) : b.ln1;
  b.qkv = saved({B, T, 3 * C / tp});
  if (spec.attention == AttentionImpl::Flash) b.lse = act({B, NHl, T});
  else if (mode == Recompute::None)
    b.att = saved({B, NHl, T, T});  // Selective: recomputed into BackwardScratch::att_recompute in the backward
  b.atty = saved({B, T, C / tp});
  if (!bf16) b.attproj = act(stream);  // 16-bit: only the working block holds it (the backward never reads it)
  b.residual2 = saved(stream);
  b.ln2 = saved(stream);
  b.ln2_mean = act(rows);
  b.ln2_rstd = act(rows);
  b.ln2_full = sp ? saved({B, T, C}) : b.ln2;
  b.fch = saved({B, T, 4 * C / tp});
  b.fch_gelu = saved({B, T, 4 * C / tp});
  if (!bf16) b.fcproj = act(stream);
  return b;
}

BackwardScratch allocate_backward_scratch(const ActivationSpec& spec, int B, int T, DType matmul_dtype,
                                          int64_t small_params_numel) {
  const GPTConfig& cfg = spec.cfg;
  const ModelShard& shard = spec.shard;
  const int64_t C = cfg.n_embd, tp = shard.tp_size, NHl = cfg.n_head / tp, V = cfg.vocab_size;
  auto act = [&](const Shape& s) { return activation(spec, s); };
  BackwardScratch s;
  s.B = B;
  s.T = T;
  // gradient scratch, reused layer after layer
  s.dresidual = act(stream_shape(spec, B, T));
  s.dln = act(stream_shape(spec, B, T));
  s.datty = act({B, T, C / tp});
  s.dqkv = act({B, T, 3 * C / tp});
  s.dfch = act({B, T, 4 * C / tp});
  s.dfch_gelu = act({B, T, 4 * C / tp});
  if (spec.attention == AttentionImpl::Materialized) s.datt = act({B, NHl, T, T});
  if (shard.sequence_parallel) {
    s.dln_full = act({B, T, C});
    s.y_full = act({B, T, C});
  }
  // Activation recompute: one block's working set (Full), the recomputed scores (Selective, materialized)
  bool any_full = false, any_selective = false;
  for (int l = shard.first_layer; l <= shard.last(cfg); ++l) {
    any_full |= spec.recompute.at(l) == Recompute::Full;
    any_selective |= spec.recompute.at(l) == Recompute::Selective;
  }
  if (any_full || spec.saved_dtype != DType::F32) {  // one fp32 block: Full's re-run, 16-bit's compute
    ActivationSpec f32 = spec;
    f32.saved_dtype = DType::F32;
    s.work = allocate_block_activations(f32, B, T, Recompute::None);
  }
  if (any_selective && spec.attention == AttentionImpl::Materialized) s.att_recompute = act({B, NHl, T, T});
  if (matmul_dtype == DType::BF16) {
    // bf16-compute scratch, allocated once per (B,T) and reused by every matmul / unit in turn. Nothing bf16
    // is saved for backward (it re-rounds the saved fp32 activation), so bf16-compute keeps exactly the fp32
    // policy's activations plus these. The operand scratch scales with B*T like the gradient scratch above,
    // so it is counted with it (Activations); the parameter scratch scales with the model and lives for one
    // unit's pass, like bf16-mixed's fp32 unit copy (Workspace).
    //   matmul inputs: ln1, atty, ln2, lnf (B,T,C), fch_gelu (B,T,4C)
    //   matmul douts:  dresidual (B,T,C), dqkv (B,T,3C), dfch (B,T,4C), dlogits (B,T,V)
    s.matmul_inp_bf16 = Tensor::empty({B * T * 4 * C}, DType::BF16, spec.device, MemCategory::Activations);
    s.matmul_dout_bf16 =
        Tensor::empty({B * T * std::max(4 * C, V)}, DType::BF16, spec.device, MemCategory::Activations);
    s.small_params_f32 = Tensor::empty({small_params_numel}, DType::F32, spec.device, MemCategory::Workspace);
  }
  return s;
}

}  // namespace scalelab
