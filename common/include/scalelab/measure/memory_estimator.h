// memory_estimator.h — bytes per rank of model state (params, grads, optimizer state) and activations
// for data parallelism with ZeRO stages 0..3 (Rajbhandari et al. 2019, arXiv 1910.02054, Sec. 5):
// the paper-level formula for any Psi, and the exact count for this kit's GPT-2 as lab 04 lays it out
// (per-unit shards, padding, root units, gathers in flight), which the counting allocator measures.
// Formulas and the checks: docs/memory.md. CLI: tools/sl_memory.cpp.
// Tests: tests/common/measure/test_memory_estimator.cpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/model/gpt2.h"      // defines: GPTConfig, gpt2_unit_numel
#include "scalelab/model/optim.h"     // defines: OptimizerConfig::Kind
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace scalelab {

// Bytes per rank of the three kinds of model state (the allocator's categories Params, Grads,
// OptimizerState).
struct ModelStateBytes {
  int64_t params = 0;           // bytes, parameters in policy.param_dtype
  int64_t grads = 0;            // bytes, gradients in policy.grad_dtype
  int64_t optimizer_state = 0;  // bytes, AdamW m and v (fp32) and the fp32 master copy if any
  int64_t total() const { return params + grads + optimizer_state; }  // bytes
};

// K of the ZeRO paper: optimizer-state bytes per parameter = (AdamW ? 8 : 0) (m and v, fp32)
// + (policy.has_master_copy() ? 4 : 0) (fp32 master weights). SGD without momentum keeps none.
// bf16 mixed + AdamW: K = 12 (the paper's mixed-precision Adam); fp32 + AdamW: K = 8.
int optimizer_bytes_per_param(const PrecisionPolicy& policy, OptimizerConfig::Kind opt);

// The paper-level model state per device (ZeRO, Sec. 5 and Fig. 1): psi parameters, world_size = N
// data-parallel ranks, stage 0 = no sharding (DDP / one device), 1 = P_os (optimizer state sharded),
// 2 = P_os+g (and gradients), 3 = P_os+g+p (and parameters). Bytes per parameter come from the policy:
// params dtype_size(param_dtype), grads dtype_size(grad_dtype), optimizer K (above). Each sharded
// category is divided by N exactly (no padding, no rounding beyond the final byte: llround).
// Paper check: policy {bf16, master f32, grad bf16} + AdamW, psi = 7.5e9, N = 64 -> 120, 31.4, 16.6,
// 1.9 GB (1e9 bytes). Throws on stage outside 0..3, world_size <= 0 or psi < 0.
ModelStateBytes zero_model_state_bytes(double psi, int world_size, int stage, const PrecisionPolicy& policy,
                                       OptimizerConfig::Kind opt);

// The policy the ZeRO paper assumes: fp16/bf16 parameters and gradients, fp32 master (K = 12 with AdamW).
// This kit keeps fp32 gradients (PrecisionPolicy::bf16_mixed, 2 + 4 + 12 = 18 bytes/param).
PrecisionPolicy zero_paper_policy();

// Activation bytes of one forward+backward as this kit's GPT2 allocates them (GPT2::ensure_activations,
// category Activations: fp32, tokens and targets i32), for micro-batch B and sequence length T:
//   per layer (18*B*T*C + 4*B*T + B*NH*T*T) floats, plus encoded, lnf (B,T,C), lnf_mean, lnf_rstd,
//   losses (B,T), logits and probs (B,T,V), tokens and targets (B,T) i32, and the backward scratch
//   dresidual, dln, datty (B,T,C), dqkv (B,T,3C), dfch, dfch_gelu (B,T,4C), datt (B,NH,T,T).
// Exact: equals the allocator's Activations bytes after GPT2::forward(tokens, &targets). Bytes.
// With activation recompute (gpt2.h Recompute, the same mode for every block; materialized attention):
//   selective: per layer without att (18*B*T*C + 4*B*T), plus ONE recomputed att (B,NH,T,T) for the model;
//   full:      per layer only the block's output (B*T*C), plus ONE working block (18*B*T*C + 4*B*T +
//              B*NH*T*T) for the model. docs/memory.md "Activation recompute".
// activation_dtype BF16: 16-bit activations, as the shard version below counts them.
int64_t gpt2_activation_bytes(const GPTConfig& cfg, int micro_batch, int seq_len, Recompute recompute = Recompute::None,
                              DType activation_dtype = DType::F32);

// The same for one model of a parallel layout: a ModelShard (tensor-parallel slice tp_size, sequence
// parallel, a pipeline stage's layers, with or without the embedding and the head) holding `sets` activation
// sets of (B, T) at once (GPT2::make_activations: a pipeline keeps one per micro-batch in flight, GPipe m,
// 1F1B at most p - stage), with its one backward scratch and recompute buffers. Bytes of category
// Activations, exact: what the allocator counts after `sets` make_activations on such a GPT2 (fp32 or
// bf16-mixed; bf16-compute's bf16 operand scratch is refused). With S the stream (B*T*C, or B*T*C/tp under
// sequence parallelism), R its rows (B*T or B*T/tp), K = B*(NH/tp)*T*T the scores, F = B*T*C/tp:
//   a set:   embedding S + B*T (tokens) or the stage's input S; per block 6S + 12F + 4R (+ 2*B*T*C gathered
//            ln1/ln2 under sequence parallelism) + K (materialized, none) or B*(NH/tp)*T (flash), only S
//            with full recompute; the head S + 2R + B*T*C (sp) + 2*B*T*V/tp + 2*B*T (losses, targets)
//   once:    scratch 2S + 12F + K (materialized) (+ 2*B*T*C under sequence parallelism); selective
//            (materialized) one K; full one block's whole set
// all times 4 bytes. activation_dtype BF16 (PrecisionPolicy::activation_dtype, 16-bit activations): a block
// (none, selective) keeps 2*(3S + 12F + 2*B*T*C (sp) + K (materialized, none)) + 4*(S + 4R + B*(NH/tp)*T
// (flash)) bytes (no attproj, fcproj; gpt2_activations.h), and the once-buffers add one fp32 working block
// (none mode; the same one full recompute uses). Throws, with a hint, on a shard that does not fit cfg,
// sets < 1 or an activation dtype other than F32 and BF16.
int64_t gpt2_activation_bytes(const GPTConfig& cfg, const ModelShard& shard, int micro_batch, int seq_len, int sets,
                              Recompute recompute, AttentionImpl attention, DType activation_dtype = DType::F32);

// Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4.1: one transformer layer stores s*b*h*(34 + 5*a*s/h)
// bytes with 16-bit activations, 1-byte dropout masks and no recomputation (s = T, b = B, h = C, a = NH);
// returned for all L layers (n_layer times the formula; embeddings and the LM head not included). Bytes.
// It differs from gpt2_activation_bytes: this kit stores fp32 (2x), keeps llm.c's tensor set (both the
// pre- and post-softmax attention matrix in one (B,NH,T,T) att, GELU input and output, layernorm
// mean/rstd), has no dropout (no masks), and adds the logits/probs and backward scratch.
// With recompute (the paper's Table 2, tensor parallelism t = 1): selective keeps s*b*h*34 bytes a layer
// (Sec. 5: the 5*a*s/h term of the attention scores, softmax and dropout is recomputed), full keeps 2*s*b*h
// (the layer's 16-bit input, Sec. 4.3).
int64_t korthikanti_activation_bytes(const GPTConfig& cfg, int micro_batch, int seq_len,
                                     Recompute recompute = Recompute::None);

// Model state of one rank: what it holds between steps and the largest it holds during one, per category.
struct ModelStateEstimate {
  ModelStateBytes persistent;  // bytes held between steps, per category
  ModelStateBytes peak;        // the largest bytes per category during a step
};

// The exact model state of one rank holding `shard` (a tensor-parallel slice, a pipeline stage's layers;
// ModelShard::dense() for the whole model) whose units are sharded over world_size data-parallel ranks at
// a ZeRO stage, as lab 04 lays them out (and lab 07's ZeRO-1 across the replicas): n_u =
// gpt2_unit_numel(cfg, shard)[u] (0 for a unit the shard does not hold), and the formulas of
// estimate_memory below over those units; in stage 3 the gathered working copies are min(1 + prefetch,
// the shard's blocks) of its largest block. Bytes. Throws on bad arguments, with a hint.
ModelStateEstimate estimate_model_state(const GPTConfig& cfg, const ModelShard& shard, int world_size, int stage,
                                        const PrecisionPolicy& policy, OptimizerConfig::Kind opt, int prefetch);

// Lab 04 part 3, --offload optimizer (ZeRO-Offload, Ren et al., USENIX ATC 2021, Sec. 3): host memory
// per rank, what the counting allocator books in MemPlace::Host, exact, persistent (the same at the peak).
// s_u as estimate_memory below (stage 0: n_u), Bp = dtype_size(param_dtype). Bytes:
//   optimizer_state  sum s_u * (4 + (AdamW ? 8 : 0))   the fp32 master shard (always, even under fp32) + m, v
//   grads            sum s_u * 4                        the gradient shard copied down for the update
//   params           sum s_u * Bp when Bp != 4          the updated shard rounded for its copy up (bf16)
ModelStateBytes offload_host_bytes(const GPTConfig& cfg, int world_size, int stage, const PrecisionPolicy& policy,
                                   OptimizerConfig::Kind opt);

// Per-rank memory of lab 04's data-parallel training of GPT-2 at a ZeRO stage.
struct MemoryEstimate {
  ModelStateBytes persistent;                 // bytes held between steps, per category (device memory)
  ModelStateBytes peak;                       // the largest bytes per category during a step (device memory)
  ModelStateBytes host;                       // host memory (MemPlace::Host): offload_host_bytes, else 0
  int64_t activations_bytes = 0;              // gpt2_activation_bytes (exact, this kit's model, the policy's
                                              // activation_dtype)
  int64_t activations_korthikanti_bytes = 0;  // korthikanti_activation_bytes (for comparison only)
  // peak model state + activations, bytes. The per-category peaks are summed, which is the step's peak
  // in this kit: in ZeRO-3 the gathered parameters and full gradients coexist during backward, with
  // the activations allocated from the first forward on. CPU bf16 emulation workspace is not counted.
  int64_t total_peak_bytes() const { return peak.total() + activations_bytes; }
};

// The exact per-rank estimate for lab 04's layout (units u = 0 embeddings, 1..L blocks, L+1 ln_f;
// n_u = gpt2_unit_numel(cfg)[u]; shard s_u = ceil(n_u / N), padded P_u = N * s_u; stage 0: s_u = P_u
// = n_u). In stage 3 units 0 and L+1 are kept gathered for the whole step (FSDP's root unit). Bytes:
//   persistent params  sum_kept P_u*Bp + sum_other s_u*Bp         (Bp = dtype_size(param_dtype))
//              grads   stages 0/1: sum P_u*Bg; stages 2/3: sum s_u*Bg   (Bg = dtype_size(grad_dtype))
//              optim   sum s_u*K
//   peak       params  + (stage 3) min(1 + prefetch, L) * max_{u=1..L} P_u*Bp  (gathered working copies)
//              grads   + (stages 2/3) Bg*(P_0 + W), W = max(P_{L+1}, max_{u=1..L} (P_u + P_{u+1})):
//                      unit 0's full gradient lives through the whole backward (tied LM head first,
//                      embeddings last); besides it the unit computing and the one whose
//                      reduce-scatter is still in flight
//              optim   = persistent
// prefetch = all-gathers allowed in flight beyond the unit in use (0 = none). micro_batch, seq_len:
// B and T of the activations (0 and 0 = no activations); recompute: every block's (gpt2_activation_bytes).
// offload_optimizer (lab 04 part 3): the device's optimizer_state is 0, persistent and peak (sum s_u*K
// less device memory: K = 12 bf16 + AdamW, 8 fp32 + AdamW), and host = offload_host_bytes.
// Throws on bad arguments, with a hint.
MemoryEstimate estimate_memory(const GPTConfig& cfg, int world_size, int stage, const PrecisionPolicy& policy,
                               OptimizerConfig::Kind opt, int prefetch, int micro_batch, int seq_len,
                               Recompute recompute = Recompute::None, bool offload_optimizer = false);

// The FAQ "how many devices do I need?": the smallest world size N, a power of two <= max_world, at
// which the paper-level model state of psi parameters (zero_model_state_bytes) plus extra_bytes
// (e.g. activations per rank, bytes) fits in device_bytes (bytes) at this stage; -1 if none.
int min_devices_to_fit(double psi, int stage, const PrecisionPolicy& policy, OptimizerConfig::Kind opt,
                       double device_bytes, int64_t extra_bytes = 0, int max_world = 1024);
// The same with the exact estimate for a config: estimate_memory(...).total_peak_bytes() <= device_bytes
// (activations included when micro_batch and seq_len are > 0).
int min_devices_to_fit(const GPTConfig& cfg, int stage, const PrecisionPolicy& policy, OptimizerConfig::Kind opt,
                       int prefetch, int micro_batch, int seq_len, double device_bytes, int max_world = 1024);

// Printable tables (GB = 1e9 bytes as the paper prints; GiB = 2^30 bytes as nvidia-smi and
// PyTorch report), one row per stage (and world size), `stages` from 0..3:
// the exact estimate per rank: params / grads / optimizer persistent and peak, activations, totals;
// in GB/GiB, or MB/MiB (1e6 / 2^20 bytes) when every total is under 1 GB (the CPU models), or in
// bytes with exact_bytes (to compare with the allocator's memory_<category>_bytes).
std::string format_memory_table(const GPTConfig& cfg, const std::vector<int>& world_sizes,
                                const std::vector<int>& stages, const PrecisionPolicy& policy,
                                OptimizerConfig::Kind opt, int prefetch, int micro_batch, int seq_len,
                                bool exact_bytes = false);
// the paper-level table (formula and GB per device for each N), as ZeRO's Fig. 1.
std::string format_zero_table(double psi, const std::vector<int>& world_sizes, const std::vector<int>& stages,
                              const PrecisionPolicy& policy, OptimizerConfig::Kind opt);
// the FAQ: devices of device_bytes needed per stage for psi parameters (paper-level model state plus
// extra_bytes per rank), with the per-device bytes at that N.
std::string format_fit_table(double psi, const std::vector<int>& stages, const PrecisionPolicy& policy,
                             OptimizerConfig::Kind opt, double device_bytes, int64_t extra_bytes = 0,
                             int max_world = 1024);

}  // namespace scalelab
