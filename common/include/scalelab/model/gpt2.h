// gpt2.h — the GPT-2 model (Radford et al. 2019) with an explicit forward and backward (no autograd),
// so a lab can put communication exactly where its algorithm says.
//
// Parameters live in "units": unit 0 = embeddings (wte, wpe), units 1..L = transformer blocks h.0..h.L-1,
// unit L+1 = final layernorm ln_f. Each unit's parameters are ONE contiguous buffer, described by a
// parameter table (name, shape, unit, offset). So a lab can shard a unit (FSDP), give it local
// column/row shapes (tensor parallel) or own only some units (pipeline) without copying the model.
// The LM head is tied to wte (no separate weight): logits = ln_f(x) @ wte^T.
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

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/core/precision.h"
#include "scalelab/core/tensor.h"

namespace scalelab {

struct GPTConfig {
  int max_seq_len = 256;  // maxT: rows of wpe
  int vocab_size = 256;   // V: 256 for the byte-level tokenizer
  int n_layer = 4;        // L
  int n_head = 4;         // NH
  int n_embd = 256;       // C
  // Named presets: "tiny" (tests), "demo" (about 1.9M params, the CPU demo), "d12", "d24", "d36", "d48"
  // (GPT-2 124M/350M/774M/1558M shapes; vocab stays the data's, 256 for bytes). Throws on unknown names.
  static GPTConfig preset(const std::string& name);
  void validate() const;  // throws if C % NH != 0 or any size <= 0
  std::string str() const;
};

struct ParamInfo {
  std::string name;  // PyTorch-style: "wte", "h.3.attn.c_attn.weight", "ln_f.bias"
  Shape shape;       // linear weights are (out, in) like torch.nn.Linear
  int unit;          // 0 = embed, 1..L = blocks, L+1 = ln_f
  int64_t offset;    // element offset inside the unit's buffer
  int64_t numel;
  bool decay;        // weight decay applies (matrices and embeddings, not biases or layernorm)
};

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

// ---------------------------------------------------------------------------------------------
// Hooks: code that runs at fixed points of every forward and backward, unit by unit (the order is in the
// file comment above). DDP launches a bucket's all-reduce when its last gradient is final
// (after_backward), FSDP gathers a unit's parameters before it runs and reduce-scatters its gradients
// after; both are hooks on the same model, as in PyTorch (register_full_backward_hook and friends).

enum class HookPoint { BeforeForward, AfterForward, BeforeBackward, AfterBackward };
const char* hook_point_name(HookPoint point);  // "before_forward", ...

// What a hook is called with: the unit (0 = embeddings, 1..L = blocks, L+1 = ln_f) and its two buffers,
// the flat parameters (policy.param_dtype) and the fp32 gradients. Assignable: a hook may install a buffer
// (FSDP installs a gathered copy before the unit runs) or release one (assign Tensor()).
struct UnitHookArgs {
  int unit;
  Tensor& params;
  Tensor& grads;
};
using Hook = std::function<void(const UnitHookArgs&)>;

// Where add_hook puts a new hook among those already at its point: Last (the default: hooks run in the
// order they were added) or First (before all of them; a probe that times the others).
enum class HookOrder { Last, First };

namespace detail {
struct HookRegistry;  // the model's hook lists (gpt2.cpp), shared with the handles
}

// Returned by GPT2::add_hook; removes its hook when destroyed or on remove(), so an object that adds hooks
// (GradSync, FSDP) removes exactly its own and leaves the others running. Move-only. Safe to outlive the
// model: then it does nothing. An empty (default-constructed or moved-from) handle removes nothing.
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<detail::HookRegistry> registry, HookPoint point, uint64_t id)
      : registry_(std::move(registry)), point_(point), id_(id) {}
  ~HookHandle() { remove(); }
  HookHandle(HookHandle&& other) noexcept { *this = std::move(other); }
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  void remove();               // idempotent
  bool active() const;         // the hook is still installed
 private:
  std::weak_ptr<detail::HookRegistry> registry_;
  HookPoint point_ = HookPoint::BeforeForward;
  uint64_t id_ = 0;
};

// Builds the parameter table for a config (no allocation). Used by the model, optimizers, estimators.
std::vector<ParamInfo> gpt2_param_table(const GPTConfig& cfg);
// Total parameter count; with_wpe=false excludes position embeddings (the MFU convention, see lab 01).
int64_t gpt2_num_params(const GPTConfig& cfg, bool with_wpe = true);
// Elements of each unit's parameter buffer, units 0 .. L+1.
std::vector<int64_t> gpt2_unit_numel(const GPTConfig& cfg);

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
  // A model WITHOUT parameter or gradient storage (like PyTorch's meta device before FSDP
  // materializes a module): unit_params(u) and unit_grads(u) are empty tensors until the caller
  // installs buffers of the unit's size (or larger: views use offsets from the table). forward and
  // backward throw, naming the unit, when a unit they reach has no buffer. Used by lab 04.
  static GPT2 without_storage(const GPTConfig& cfg, const PrecisionPolicy& policy = PrecisionPolicy::fp32(),
                              Device device = Device::CPU);

  const GPTConfig& config() const { return cfg_; }
  const PrecisionPolicy& policy() const { return policy_; }
  Device device() const { return device_; }
  const std::vector<ParamInfo>& param_table() const { return table_; }
  int num_units() const { return cfg_.n_layer + 2; }
  int64_t num_params() const;  // from the table: the same whether or not buffers are installed

  // Flat buffer of a unit's parameters (policy.param_dtype) and its gradients (fp32). Assignable: a
  // lab may install its own buffer (a gathered copy) and release it again (assign Tensor()).
  Tensor& unit_params(int unit) { return params_.at(unit); }
  Tensor& unit_grads(int unit) { return grads_.at(unit); }
  // Views of one named parameter / gradient, shaped as in the table. Throws on an unknown name.
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  const ParamInfo& info(const std::string& name) const;

  void init_weights(uint64_t seed);  // gpt2_initial_weights into the installed buffers

  // tokens (B,T) i32 on the model's device, T <= max_seq_len. With targets (B,T): computes probs and
  // returns the mean cross-entropy loss (nats); without: computes logits only and returns NaN.
  // Activations are (re)allocated when B or T change (category Activations; under bf16-compute also
  // the bf16 matmul-operand scratch, Activations, and the fp32 small-parameter scratch, Workspace).
  float forward(const Tensor& tokens, const Tensor* targets);
  // Gradients of the mean loss of the last forward (which must have had targets), ADDED to the grad
  // buffers: call zero_grad() first unless you accumulate micro-batches.
  void backward();
  void zero_grad();

  const Tensor& logits() const { return acts_.logits; }  // (B,T,V) after a forward without targets

  // Adds `fn` at `point` (see HookOrder) and returns the handle that removes it. A hook runs for every unit
  // at its point, in forward and backward alike, also in evaluation and sampling. Hooks added or removed
  // while hooks at that point are running take effect from the next unit.
  [[nodiscard]] HookHandle add_hook(HookPoint point, Hook fn, HookOrder order = HookOrder::Last);
  int num_hooks(HookPoint point) const;  // installed at `point`

  // Frees activations (e.g. before a bigger model is built in the same process).
  void free_activations();

  // Materialized (the default) or Flash; changing it frees the activations (the next forward allocates
  // what the new choice saves).
  void set_attention(AttentionImpl impl);
  AttentionImpl attention() const { return attention_; }

 private:
  struct Activations {
    int B = 0, T = 0;
    Tensor encoded;                      // (B,T,C)
    std::vector<Tensor> ln1, ln1_mean, ln1_rstd, qkv, att, atty, attproj, residual2, ln2, ln2_mean,
        ln2_rstd, fch, fch_gelu, fcproj, residual3;  // per layer, shapes as in llm.c
    std::vector<Tensor> lse;  // per layer (B,NH,T), Flash attention only (then att and datt stay empty)
    Tensor lnf, lnf_mean, lnf_rstd;      // (B,T,C), (B,T), (B,T)
    Tensor logits;                       // (B,T,V), overwritten by dlogits in backward
    Tensor probs;                        // (B,T,V) softmax of logits, kept for backward
    Tensor losses;                       // (B,T)
    Tensor tokens, targets;              // copies of the last inputs (B,T) i32
    // gradient scratch
    Tensor dresidual, dbuf_btc, dln, datty, dqkv, dfch, dfch_gelu, datt;
    // bf16-compute only (empty otherwise), reused by every matmul in turn:
    Tensor matmul_inp_bf16;   // (B*T*4C,) bf16: the matmul's input activation rounded to bf16
    Tensor matmul_dout_bf16;  // (B*T*max(4C,V),) bf16: the matmul's dout rounded to bf16 (backward)
    Tensor small_params_f32;  // (f32_scratch_numel_,) fp32 copies of one unit's non-matmul parameters
  };
  void ensure_activations(int B, int T);
  // The fp32 weights of a unit that the fp32 ops read, laid out as f32_offset_ says:
  //   fp32:         the parameter buffer itself;
  //   bf16-mixed:   an fp32 copy of the whole bf16 unit, made for this unit's forward/backward (category
  //                 Workspace, freed when the caller drops it; lab 04's memory estimator counts it);
  //   bf16-compute: acts_.small_params_f32, refilled with this unit's non-matmul parameters (layernorm
  //                 weights, biases, embeddings); the block's matmul weights are read in bf16 in place.
  //                 One buffer for all units: valid until the next call.
  Tensor unit_weights_f32(int unit);
  GPT2(bool allocate, const GPTConfig& cfg, const PrecisionPolicy& policy, Device device);
  void run_hooks(HookPoint point, int unit);  // every hook at `point`, in order, for `unit`
  // The table entries forward and backward read, resolved from their names once at construction, so the
  // hot loop indexes the table instead of searching it by name.
  struct BlockParams {  // h.<l>.: the table index of each of the block's twelve tensors
    int ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
    int ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
  };
  std::vector<BlockParams> blocks_;  // (L,)
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
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
  // bf16-compute -> inp (and dout) rounded to bf16 in acts_' scratch, then matmul_*_bf16 with the bf16
  // weight; out and every gradient fp32 with the ops' `+=` rule.
  void policy_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
  void policy_matmul_backward(Tensor* dinp, Tensor& dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                              const Tensor& weight);

  GPTConfig cfg_;
  PrecisionPolicy policy_;
  Device device_;
  std::vector<ParamInfo> table_;
  std::vector<Tensor> params_, grads_;  // per unit
  // Per table entry: where its fp32 values sit in unit_weights_f32(unit). The table offset (fp32,
  // bf16-mixed); under bf16-compute a slot in acts_.small_params_f32, or -1 for a block's matmul weight.
  std::vector<int64_t> f32_offset_;
  int64_t f32_scratch_numel_ = 0;  // bf16-compute: elements of acts_.small_params_f32 (the largest unit's need)
  Activations acts_;
  std::shared_ptr<detail::HookRegistry> hooks_;  // shared with the HookHandles (weakly): survives a move
  AttentionImpl attention_ = AttentionImpl::Materialized;
  bool have_targets_ = false;
};

}  // namespace scalelab
