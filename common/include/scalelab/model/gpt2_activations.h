// gpt2_activations.h — what GPT-2's forward keeps for its backward, and the choices that decide it: the
// attention implementation (AttentionImpl) and activation recompute (Recompute); the activation sets
// (GPT2Activations of BlockActivations) and the backward's scratch (BackwardScratch), with the functions
// that allocate them for a model's config, shard and choices (ActivationSpec). GPT2 (gpt2.h) makes and
// fills them; the memory estimator counts the same tensors (gpt2_activation_bytes, measure/memory_estimator.h).
// Tests: tests/common/model/test_recompute.cpp, tests/common/model/test_gpt2.cpp (Gpt2Attention.*)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/core/tensor.h"        // defines: Tensor, Shape, DType, Device
#include "scalelab/model/gpt2_layout.h"  // defines: GPTConfig, ModelShard

namespace scalelab {

// How the model's causal attention keeps what its backward needs (ops.h). Both compute the same outputs and
// gradients (to fp32 rounding: tests/common/model/test_gpt2.cpp); they differ in memory and speed.
enum class AttentionImpl {
  Materialized,  // attention_forward: saves the scores att (B,NH,T,T) fp32 per layer (plus one datt of that
                 // size for the backward); cuBLAS GEMMs on the GPU. The default: fastest while the scores fit.
  Flash,         // attention_forward_flash: saves lse (B,NH,T) fp32 per layer and recomputes the scores in
                 // the backward (Dao et al. 2022, arXiv:2205.14135). For when the scores do not fit.
};
const char* attention_impl_name(AttentionImpl impl);  // "materialized" or "flash"
// "materialized" or "flash"; throws scalelab::Error naming the accepted values otherwise.
AttentionImpl attention_impl_from_name(const std::string& name);
// Bytes the materialized attention keeps for a (B,T) batch: L saved att (B,NH,T,T) plus one datt, fp32.
int64_t attention_scores_bytes(const GPTConfig& cfg, int B, int T);
// The "auto" choice of lab drivers: Flash when the materialized scores would take more than a quarter of
// `memory_budget_bytes` (the device's memory or the simulated cap), so that parameters, optimizer state
// and the other activations keep at least three quarters; Materialized otherwise, and when the budget
// is unknown (0: the CPU without a cap).
AttentionImpl choose_attention(const GPTConfig& cfg, int B, int T, int64_t memory_budget_bytes);

// Activation recompute: what a block keeps from its forward for its backward, traded against compute
// (Chen et al. 2016, arXiv:1604.06174; Korthikanti et al. 2022, arXiv:2205.05198, Sec. 5). Every mode gives
// the same loss and gradients bit for bit: the forward is deterministic and has no dropout, so the backward's
// re-run computes exactly what the first run did. A per-block choice (GPT2::set_recompute); lab drivers take
// --recompute none|selective|full for every block. Bytes of each: docs/memory.md "Activation recompute".
enum class Recompute {
  None,       // keep everything below (BlockActivations): no extra compute
  Selective,  // Korthikanti Sec. 5: do not keep the scores att (B,NH/tp,T,T); the backward recomputes them
              // (Q K^T, the causal softmax and att @ V) from the kept qkv into one shared buffer. Costs
              // attention's two batched matmuls again, 4*B*T^2*C/tp FLOPs a layer (causal half counted
              // full, as lab 01's MFU does). Flash attention keeps no scores: Selective changes nothing there.
  Full,       // keep only the block's output (the next block's input, stream); the backward first re-runs
              // the whole block's forward into one shared working set, then runs its backward. Costs one
              // more forward of every block (2N+attention FLOPs a token), and under tensor parallelism the
              // forward's g all-reduces again.
};
const char* recompute_name(Recompute mode);  // "none", "selective", "full"
// "none", "selective" or "full"; throws scalelab::Error naming the accepted values otherwise.
Recompute recompute_from_name(const std::string& name);
// FLOPs per token the recompute adds in the backward, every block in `mode`, at sequence length T, with
// lab 01's convention (2 FLOPs a multiply-add; attention's T x T work counted full, causal half included):
//   selective: L * 4*T*C (Q K^T and att @ V again); full: a forward of every block, L * (24*C^2 + 4*T*C)
//   (its four matmuls, 2 x 12 C^2) plus attention; none: 0. The dense model's count: a shard's FLOPs are the
// whole model's, as MFU's are. MFU divides the model's FLOPs by time; HFU (hardware FLOPs utilization,
// Korthikanti et al. 2022, Sec. 6) adds these.
double recompute_flops_per_token(const GPTConfig& cfg, int T, Recompute mode);

// ---------------------------------------------------------------------------------------------
// The tensors. All fp32 in category Activations, shapes as in llm.c with the shard's local sizes (3C/tp,
// 4C/tp, NH/tp, V/tp under tensor parallelism). "Stream" is the residual stream's shape: (B,T,C), or with
// sequence parallelism this rank's (B*T/tp, C) token rows of it (tensor_parallel.h); "rows" (B,T) or (B*T/tp).
// With 16-bit activations (ActivationSpec::saved_dtype BF16, PrecisionPolicy::activation_dtype) a block in
// mode None or Selective keeps ln1, ln1_full, qkv, att, atty, residual2, ln2, ln2_full, fch and fch_gelu in
// bf16, keeps ln*_mean, ln*_rstd, lse and residual3 in fp32, and does not keep attproj and fcproj (the
// backward never reads them); the forward runs in BackwardScratch::work (fp32) and rounds into the set,
// the backward converts the set back into work before the block's backward (GPT2::block_forward).

struct BlockActivations {            // one transformer block; with Recompute::Full only residual3 is its own
  Recompute mode = Recompute::None;  // what the set keeps for this block (the model's choice when it was made)
  Tensor ln1, ln1_mean, ln1_rstd;    // stream, rows, rows
  Tensor ln1_full;                   // (B,T,C): the gathered ln1 (sequence parallel; else ln1 itself)
  Tensor qkv;                        // (B,T,3C/tp)
  Tensor att;                        // (B,NH/tp,T,T) materialized attention
  Tensor lse;                        // (B,NH/tp,T) flash attention (att stays empty)
  Tensor atty;                       // (B,T,C/tp)
  Tensor attproj, residual2;         // stream
  Tensor ln2, ln2_mean, ln2_rstd;    // stream, rows, rows
  Tensor ln2_full;                   // (B,T,C) (sequence parallel; else ln2 itself)
  Tensor fch, fch_gelu;              // (B,T,4C/tp)
  Tensor fcproj, residual3;          // stream; residual3 is the block's output
};

class GPT2;
struct ActivationSpec;

// The activations of one forward pass, owned by the caller (model.make_activations): what the backward of
// that micro-batch needs. A pipeline keeps one set per micro-batch in flight (GPipe m, 1F1B at most p).
class GPT2Activations {
 public:
  GPT2Activations() = default;
  int B() const { return B_; }
  int T() const { return T_; }
  bool empty() const { return B_ == 0; }
  // The hidden state leaving the stage (stream): the last owned block's output (stages without the head).
  const Tensor& output() const;
  const Tensor& logits() const { return head_logits; }  // (B,T,V/tp) after a forward without targets

 private:
  friend class GPT2;
  friend GPT2Activations allocate_activations(const ActivationSpec& spec, int B, int T);
  int B_ = 0, T_ = 0;
  Tensor tokens, targets;                // copies of the inputs (B,T) i32 (targets: the stage with the head)
  Tensor input;                          // (stream) copy of the hidden state entering a stage without the embedding
  Tensor encoded;                        // (stream) the embedding's output
  std::vector<BlockActivations> blocks;  // the owned blocks, first_layer first
  Tensor lnf, lnf_mean, lnf_rstd;        // stream, rows, rows
  Tensor lnf_full;                       // (B,T,C) (sequence parallel; else lnf itself)
  Tensor head_logits;                    // (B,T,V/tp) the LM head's output, overwritten by dlogits in backward
  Tensor probs;                          // (B,T,V/tp) softmax of logits, kept for backward
  Tensor losses;                         // (B,T)
  bool have_targets = false;
  bool weight_pending = false;  // GPT2::backward_input ran, backward_weight has not: only what W reads is left
};

// What one backward needs besides a set, shared by every set of a model (a backward runs one micro-batch at
// a time): the gradient scratch, reused layer after layer, and the bf16-compute operand scratch.
struct BackwardScratch {
  int B = 0, T = 0;
  Tensor dresidual, dln, datty, dqkv, dfch, dfch_gelu, datt;  // as llm.c, the shard's local sizes
  Tensor dln_full, y_full;  // (B,T,C) sequence parallel: a gathered gradient, a partial row-parallel output
  // bf16-compute only (empty otherwise), reused by every matmul in turn:
  Tensor matmul_inp_bf16;   // (B*T*4C,) bf16: the matmul's input activation rounded to bf16
  Tensor matmul_dout_bf16;  // (B*T*max(4C,V),) bf16: the matmul's dout rounded to bf16 (backward)
  Tensor small_params_f32;  // (small_params_numel,) fp32 copies of one unit's non-matmul parameters
  // Activation recompute (empty unless a block needs them), shared by every set like the above:
  BlockActivations work;  // Full: one block's whole working set, for the forward and the backward's re-run;
                          // 16-bit activations: the fp32 block the forward computes in and the backward reads
  Tensor att_recompute;   // Selective, materialized attention: (B,NH/tp,T,T) the recomputed scores
};

// What the tensors' shapes depend on besides (B, T): the model's config and shard, its attention
// implementation and each block's recompute mode, and the device they live on (GPT2::make_activations
// passes the model's own).
struct ActivationSpec {
  GPTConfig cfg;
  ModelShard shard;
  AttentionImpl attention = AttentionImpl::Materialized;
  std::vector<Recompute> recompute;  // (L,) per block, global layer index
  Device device = Device::CPU;
  DType saved_dtype = DType::F32;  // F32 or BF16: PrecisionPolicy::activation_dtype (the 16-bit set above)
};

// A set for batches of (B, T): the shard's units only (the embedding's, its blocks' as each block's mode
// keeps them, the head's). Throws when sequence parallelism cannot split B*T rows into tp blocks.
GPT2Activations allocate_activations(const ActivationSpec& spec, int B, int T);
// One block's tensors as `mode` keeps them (Full: residual3 only) in spec.saved_dtype (the 16-bit set above).
BlockActivations allocate_block_activations(const ActivationSpec& spec, int B, int T, Recompute mode);
// The backward's scratch for (B, T). matmul_dtype BF16 (bf16-compute) adds the operand scratch and
// small_params_numel floats for one unit's fp32 non-matmul parameters (category Workspace). The working
// block `work` (fp32, mode None) is there when a block recomputes Full or spec.saved_dtype is BF16.
BackwardScratch allocate_backward_scratch(const ActivationSpec& spec, int B, int T, DType matmul_dtype,
                                          int64_t small_params_numel);

}  // namespace scalelab
