// gpt2.h — the GPT-2 model (Radford et al. 2019) with an explicit forward and backward (no autograd),
// so a lab can put communication exactly where its algorithm says. Include this one header for the model;
// it brings its parts:
//   gpt2_layout.h       GPTConfig, ModelShard, the parameter table, counts, dense <-> shard slices
//   hooks.h             HookPoint, HookHandle, the hook lists
//   gpt2_activations.h  AttentionImpl, Recompute, the activation sets and the backward's scratch
//   context_parallel.h  ContextParallel (the attention point of a sequence split across ranks), cp_chunks
//
// Parameters live in "units": unit 0 = embeddings (wte, wpe), units 1..L = transformer blocks h.0..h.L-1,
// unit L+1 = final layernorm ln_f. Each unit's parameters are ONE contiguous buffer, described by a
// parameter table (name, shape, unit, offset). So a lab can shard a unit (FSDP), give it local
// column/row shapes (tensor parallel: ModelShard::tp_size) or own only some units (pipeline: a stage's
// layers) without copying the model (docs/design.md "Parallel layouts").
// The LM head is tied to wte (no separate weight): logits = ln_f(x) @ wte^T. A last pipeline stage
// without the embedding keeps its own copy of wte in unit L+1 (ParamInfo::tied_copy).
//
// Hooks run before/after each unit's forward and backward (add_hook: lists, so DDP, FSDP, tensor- and
// pipeline-parallel code and probes compose on one model). Order in a step:
//   forward:  embed(0), h.0(1) ... h.L-1(L), ln_f(L+1), then the LM head reads unit 0 again
//   backward: before_backward(0), LM head (writes dwte), ln_f(L+1), h.L-1(L) ... h.0(1), embeddings,
//             after_backward(0)
// Unit 0's backward encloses all the others: the tied LM head is unit 0's weight, so its gradient
// starts first and is complete only at after_backward(0) (mind this when overlapping all-reduces).
// Tests: tests/common/model/test_gpt2_fixture.cpp (against PyTorch), tests/common/model/test_gpt2.cpp
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/core/precision.h"          // defines: PrecisionPolicy
#include "scalelab/core/tensor.h"             // defines: Tensor
#include "scalelab/model/context_parallel.h"  // defines: ContextParallel (the point; identity for cp = 1), CpChunk
#include "scalelab/model/gpt2_activations.h"  // defines: GPT2Activations, BlockActivations, BackwardScratch, Recompute
#include "scalelab/model/gpt2_layout.h"       // defines: GPTConfig, ModelShard, ParamInfo, gpt2_param_table
#include "scalelab/model/hooks.h"             // defines: HookPoint, HookHandle, HookLists
#include "scalelab/model/tensor_parallel.h"   // defines: TensorParallel (the points; identity for tp = 1)

namespace scalelab {

// The initial weights of every unit, one unit at a time: calls sink(unit, w) for unit 0 .. L+1 in
// order, w a (unit numel,) fp32 CPU tensor (category Workspace) valid during the call. The same
// values GPT2's constructor draws from `seed`, so a sharded model (lab 04) can keep only its shard of
// each unit and start exactly where a 1-rank model does, without ever holding the whole model.
void gpt2_initial_weights(const GPTConfig& cfg, uint64_t seed,
                          const std::function<void(int unit, const Tensor& w)>& sink);

class GPT2 {
 public:
  // Allocates parameters (policy.param_dtype, category Params) and gradients (fp32, category Grads) on
  // `device`, and initialises the weights from `seed` (GPT-2 init: normal std 0.02, the residual
  // projections c_proj scaled by 1/sqrt(2L), layernorm weight 1, biases 0). Policies: fp32, bf16_mixed,
  // bf16_compute (precision.h); throws for others (e.g. bf16 gradients, bf16 matmuls over fp32 params).
  explicit GPT2(const GPTConfig& cfg, const PrecisionPolicy& policy = PrecisionPolicy::fp32(),
                Device device = Device::CPU, uint64_t seed = 0);
  // A shard of the model (ModelShard; validated): only its units, with the local shapes of its table, and
  // the dense model's initial weights for `seed`, sliced (copy_dense_to_shard): tp = N starts where tp = 1
  // does. A tensor-parallel shard (tp > 1) needs set_tensor_parallel before its first forward.
  GPT2(const GPTConfig& cfg, const ModelShard& shard, const PrecisionPolicy& policy = PrecisionPolicy::fp32(),
       Device device = Device::CPU, uint64_t seed = 0);
  // A model WITHOUT parameter or gradient storage (like PyTorch's meta device before FSDP
  // materializes a module): unit_params(u) and unit_grads(u) are empty tensors until the caller
  // installs buffers of the unit's size (or larger: views use offsets from the table). forward and
  // backward throw, naming the unit, when a unit they reach has no buffer. Used by lab 04.
  static GPT2 without_storage(const GPTConfig& cfg, const PrecisionPolicy& policy = PrecisionPolicy::fp32(),
                              Device device = Device::CPU);
  GPT2(GPT2&&) = default;
  GPT2& operator=(GPT2&&) = default;

  const GPTConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  bool owns_unit(int unit) const { return shard_.owns_unit(unit, cfg_); }
  const PrecisionPolicy& policy() const { return policy_; }
  Device device() const { return device_; }
  const std::vector<ParamInfo>& param_table() const { return table_; }
  int num_units() const { return cfg_.n_layer + 2; }
  int64_t num_params() const;  // this shard's, from the table: the same whether or not buffers are installed

  // Flat buffer of a unit's parameters (policy.param_dtype) and its gradients (fp32). Assignable: a
  // lab may install its own buffer (a gathered copy) and release it again (assign Tensor()).
  Tensor& unit_params(int unit) { return params_.at(unit); }
  Tensor& unit_grads(int unit) { return grads_.at(unit); }
  // Views of one named parameter / gradient, shaped as in the table. Throws on an unknown name.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  const ParamInfo& info(const std::string& name) const;

  void init_weights(uint64_t seed);  // gpt2_initial_weights (sliced for a shard) into the installed buffers

  // ---- One forward and backward, activations owned by the model (the single-stage labs 01-04)
  // tokens (B,T) i32 on the model's device, T <= max_seq_len. With targets (B,T): computes probs and
  // returns the mean cross-entropy loss (nats); without: computes logits only and returns NaN.
  // Activations are (re)allocated when B or T change (category Activations; under bf16-compute also
  // the bf16 matmul-operand scratch, Activations, and the fp32 small-parameter scratch, Workspace).
  float forward(const Tensor& tokens, const Tensor* targets);
  // Gradients of the mean loss of the last forward (which must have had targets), ADDED to the grad
  // buffers: call zero_grad() first unless you accumulate micro-batches.
  void backward();
  void zero_grad();

  const Tensor& logits() const { return acts_.logits(); }  // (B,T,V) after a forward without targets

  // ---- Caller-owned activations and stage entry / exit (pipelines, several micro-batches in flight)
  // A set for batches of (B, T), allocated now (category Activations) for the units this shard owns, and
  // the model's backward scratch for (B, T) if it has none yet.
  GPT2Activations make_activations(int B, int T);
  // input: tokens (B,T) i32 on a stage with the embedding, else the hidden state (stream) fp32 entering the
  // stage (copied into the set). targets (B,T) i32 or nullptr on a stage with the head: returns the mean
  // loss (NaN without targets, or on a stage without the head). The stage's output: acts.output().
  float forward(GPT2Activations& acts, const Tensor& input, const Tensor* targets);
  // Gradients of that forward, ADDED to the grad buffers. d_output: nullptr on a stage with the head (it
  // starts from the loss, which needed targets), else d(loss)/d(acts.output()) (stream). d_input: on a
  // stage without the embedding, receives d(loss)/d(input) (stream); nullptr elsewhere.
  void backward(GPT2Activations& acts, const Tensor* d_output, Tensor* d_input);

  // ---- The same backward in two parts (a zero-bubble pipeline: Qi et al. 2024, "Zero Bubble Pipeline
  // Parallelism", arXiv:2401.10241, Sec. 2): B, the input gradient the previous stage waits for, now; W, the
  // weight gradients only the optimizer needs, later. backward_input then backward_weight on one set ADD
  // exactly the bits backward(acts, d_output, d_input) adds and return the same d_input
  // (tests/common/model/test_split_backward.cpp).
  // backward_input: arguments as backward's. Computes d_input and the layernorms' gradients (cheap, and they
  // need the activations B frees); each matmul's dout is kept in the set, in the memory of a forward-only
  // tensor of its shape (no allocation), with what the weight gradients read (each matmul's input, the
  // head's dlogits, the embedding's tokens); everything else of the set is freed. On a shard whose LM head
  // has its own copy of wte (a last pipeline stage without the embedding) it also ADDS the head's weight
  // gradient and frees dlogits (B,T,V) and ln_f's output: dlogits is the largest tensor a set would keep for
  // W, read there by that one matmul, and the copy's gradient has no other adder, so its sum over
  // micro-batches runs in B's order, backward()'s (the cost: the head's dW matmul, 2*B*T*C*V FLOPs, moves
  // from W into B on that stage). With the embedding's wte (the whole model) the head's part stays in W,
  // where the embedding's part follows it as in backward(). Fires every BeforeBackward hook backward()
  // fires, in the same order, and no AfterBackward hook.
  // backward_weight: ADDS the matmuls' weight and bias gradients, the LM head's (unless backward_input did)
  // and the embedding's, in backward()'s order, then frees the whole set (it is empty again: the next
  // micro-batch gets a new one).
  // Fires every AfterBackward hook backward() fires, in its order (a unit's gradients are
  // complete at its AfterBackward). Refused: tensor parallelism (tp > 1) and Recompute::Full (the re-run's
  // working set is shared, so it cannot wait for W).
  void backward_input(GPT2Activations& acts, const Tensor* d_output, Tensor* d_input);
  void backward_weight(GPT2Activations& acts);

  // The tensor-parallel points (tensor_parallel.h) the blocks, the embedding and the head call; the model
  // does not own it. nullptr: the identity (only valid for tp = 1). Lab 05 installs its implementation.
  void set_tensor_parallel(TensorParallel* tp) { tp_ = tp; }
  // The context-parallel point (context_parallel.h) the blocks' attention calls; not owned. nullptr: the
  // identity (only valid for cp = 1). Lab 10 installs its ring. A cp > 1 shard takes tokens (B, T/cp) (its
  // slice of each sequence, positions as cp_chunks says: the position embedding reads and its gradient
  // writes those rows of wpe) and returns the mean loss over its own B*T/cp tokens: the group's average of
  // the ranks' losses and gradients (as data parallelism averages them) is the dense model's.
  void set_context_parallel(ContextParallel* cp) { cp_ = cp; }

  // Adds `fn` at `point` (see HookOrder) and returns the handle that removes it. A hook runs for every unit
  // at its point, in forward and backward alike, also in evaluation and sampling. Hooks added or removed
  // while hooks at that point are running take effect from the next unit.
  [[nodiscard]] HookHandle add_hook(HookPoint point, Hook fn, HookOrder order = HookOrder::Last);
  int num_hooks(HookPoint point) const;  // installed at `point`

  // Frees the model's own activations and its backward scratch (e.g. before a bigger model is built).
  void free_activations();

  // Materialized (the default) or Flash; changing it frees the activations (the next forward allocates
  // what the new choice saves). A context-parallel shard (cp > 1) runs Flash and refuses Materialized.
  void set_attention(AttentionImpl impl);
  AttentionImpl attention() const { return attention_; }

  // Activation recompute (Recompute, gpt2_activations.h) for every block, or for block `layer` (0-based,
  // global; one this shard owns, else scalelab::Error). Frees the model's own activations and scratch; a
  // caller-owned set made before the change is refused by forward/backward (make a new one).
  void set_recompute(Recompute mode);
  void set_recompute(int layer, Recompute mode);
  Recompute recompute(int layer) const { return recompute_.at(layer); }

 private:
  GPT2(bool allocate, const GPTConfig& cfg, const ModelShard& shard, const PrecisionPolicy& policy, Device device);
  // The model's choices that shape its activations (gpt2_activations.h), for allocate_activations & co.
  ActivationSpec activation_spec() const {
    return {cfg_, shard_, attention_, recompute_, device_, policy_.activation_dtype};
  }
  void ensure_scratch(int B, int T);      // the backward's scratch for (B, T), reallocated when they change
  void ensure_activations(int B, int T);  // the model's own set and the scratch, for (B, T)
  // The fp32 weights of a unit that the fp32 ops read, laid out as f32_offset_ says:
  //   fp32:         the parameter buffer itself;
  //   bf16-mixed:   an fp32 copy of the whole bf16 unit, made for this unit's forward/backward (category
  //                 Workspace, freed when the caller drops it; lab 04's memory estimator counts it);
  //   bf16-compute: scratch_.small_params_f32, refilled with this unit's non-matmul parameters (layernorm
  //                 weights, biases, embeddings); the block's matmul weights are read in bf16 in place.
  //                 One buffer for all units: valid until the next call.
  Tensor unit_weights_f32(int unit);
  void run_hooks(HookPoint point, int unit);  // every hook at `point`, in order, for `unit`
  // The table entries forward and backward read, resolved from their names once at construction, so the
  // hot loop indexes the table instead of searching it by name.
  struct BlockParams {  // h.<l>.: the table index of each of the block's twelve tensors
    int ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
    int ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
  };
  std::vector<BlockParams> blocks_;  // (L,): entries of blocks the shard does not own are -1
  // One block's forward from its input x (stream) into ba, the unit's weights w: the forward pass's body and
  // the Full recompute's re-run alike (no hooks: the caller runs them).
  void block_forward(BlockActivations& ba, const Tensor& x, const Tensor& w, const BlockParams& b);
  // One block's backward, block_forward's mirror: from ba (what that forward kept, or the Full recompute's
  // re-run of it) and the block's input x (stream), with the unit's weights w. dresidual (stream) enters as
  // d(loss)/d(block output) and leaves as d(loss)/d(x); the block's gradients are ADDED to the unit's grad
  // buffer. No hooks: the caller runs them.
  // keep_for_weight (backward_input): the input gradient and the layernorms' only; each matmul's dout is
  // copied into the forward-only tensor of its shape for block_backward_weight.
  void block_backward(Tensor& dresidual, BlockActivations& ba, const Tensor& x, const Tensor& w, const BlockParams& b,
                      bool keep_for_weight = false);
  // The four matmuls' weight and bias gradients from what block_backward(keep_for_weight) kept in ba.
  void block_backward_weight(BlockActivations& ba, const Tensor& w, const BlockParams& b);
  // backward() and backward_input(): split false / true.
  // The split backward computes the LM head's weight gradient in backward_input: the head's wte is its own
  // copy (the tied one of a last stage), not the embedding's, which backward_weight adds to.
  bool head_weight_in_input() const { return head_wte_ != wte_; }
  void backward_impl(GPT2Activations& acts, const Tensor* d_output, Tensor* d_input, bool split);
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;  // -1: not in this shard
  int head_wte_ = -1;                           // the wte the LM head reads: wte_ (unit 0) or the tied copy in unit L+1
  int index_of(const std::string& name) const;  // table index; throws on an unknown name
  // fp32 view of table entry `i` inside unit_weights_f32(its unit). Throws for a matmul weight under
  // bf16-compute (it has no fp32 copy; use matmul_weight).
  Tensor weight_view(const Tensor& unit_f32, int i) const;
  // The weight operand of a matmul in the policy's matmul dtype: weight_view(unit_f32, i) when the
  // matmuls are fp32; under bf16-compute the bf16 parameter itself (a view of the parameter buffer).
  Tensor matmul_weight(const Tensor& unit_f32, int i) const;
  Tensor param_at(int i) const;  // param() and grad() by table index
  Tensor grad_at(int i) const;
  // The model's matmuls in the policy's precision: fp32 -> matmul_forward / matmul_backward as given;
  // bf16-compute -> inp (and dout) rounded to bf16 in scratch_, then matmul_*_bf16 with the bf16
  // weight; out and every gradient fp32 with the ops' `+=` rule. The backward's outputs are optional as
  // matmul_backward's are: dinp alone (dweight, dbias nullptr) now and dweight (+ dbias) alone later give
  // the bits of one call with all three.
  void policy_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
  void policy_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                              const Tensor& weight);
  // A row-parallel linear (the two c_proj): the matmul, g (or the sequence-parallel reduce-scatter), then the
  // bias once; and its backward. See gpt2.cpp.
  void row_parallel_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);
  void row_parallel_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, Tensor& dout, const Tensor& inp,
                             const Tensor& weight);

  TensorParallel& tp() const;   // the installed points, or the identity
  ContextParallel& cp() const;  // the installed point, or the identity
  // The position embedding of the shard's slice: wpe (maxT, C) -> rows whose row t is position chunk(t)'s
  // (a view for one chunk; a gather into Workspace scratch for the zig-zag's two), and its gradient back.
  Tensor slice_wpe(const Tensor& wpe) const;
  void embedding_backward_slice(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

  GPTConfig cfg_;
  ModelShard shard_;
  PrecisionPolicy policy_;
  Device device_;
  std::vector<ParamInfo> table_;
  std::vector<Tensor> params_, grads_;  // per unit
  // Per table entry: where its fp32 values sit in unit_weights_f32(unit). The table offset (fp32,
  // bf16-mixed); under bf16-compute a slot in scratch_.small_params_f32, or -1 for a block's matmul weight.
  std::vector<int64_t> f32_offset_;
  int64_t f32_scratch_numel_ = 0;     // bf16-compute: elements of scratch_.small_params_f32 (the largest unit's need)
  GPT2Activations acts_;              // the model's own set (forward(tokens, targets) / backward())
  BackwardScratch scratch_;           // shared by every set of this model (gpt2_activations.h)
  std::shared_ptr<HookLists> hooks_;  // shared with the HookHandles (weakly): survives a move
  TensorParallel* tp_ = nullptr;      // not owned; nullptr: the identity
  ContextParallel* cp_ = nullptr;     // not owned; nullptr: the identity
  std::vector<CpChunk> cp_chunks_;    // the shard's positions for the current set's T (cp_chunks), set per pass
  AttentionImpl attention_ = AttentionImpl::Materialized;
  std::vector<Recompute> recompute_;  // (L,) per block, Recompute::None unless set_recompute
};

}  // namespace scalelab
