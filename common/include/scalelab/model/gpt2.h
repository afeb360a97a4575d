// gpt2.h — the GPT-2 model (Radford et al. 2019) with an explicit forward and backward (no autograd),
// so a lab can put communication exactly where its algorithm says.
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

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/core/precision.h"
#include "scalelab/core/tensor.h"
#include "scalelab/model/tensor_parallel.h"  // defines: TensorParallel (the points; identity for tp = 1)

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

// Which part of the model one rank holds (docs/design.md "Parallel layouts"): a tensor-parallel slice of
// every matrix (tp_rank of tp_size) of the blocks first_layer..last_layer, with or without the embedding
// (the first pipeline stage) and the final layernorm and LM head (the last). The default is the whole,
// dense model. Unit ids stay global: a shard simply has no storage, no table entries and no hooks for the
// units it does not own.
struct ModelShard {
  int tp_rank = 0, tp_size = 1;  // tensor parallel: this rank's index and the group's size
  int first_layer = 0;           // blocks [first_layer, last_layer], 0-based (unit = layer + 1)
  int last_layer = -1;           // -1: the last block, L-1
  bool has_embedding = true;     // unit 0 (wte, wpe): the first stage
  bool has_head = true;          // unit L+1 (ln_f) and the tied LM head: the last stage
  bool sequence_parallel = false;  // tp > 1: layernorms and the residual stream split along T too
                                   // (Korthikanti et al. 2022, Sec. 4.2.2)
  static ModelShard dense() { return {}; }
  // Throws scalelab::Error, with the numbers and a hint, unless the shard fits cfg: 0 <= tp_rank < tp_size,
  // NH % tp == 0, 4C % tp == 0, V % tp == 0 (the vocabulary is never padded silently), a non-empty range of
  // layers inside [0, L), and (sequence parallel) tp > 1.
  void validate(const GPTConfig& cfg) const;
  int last(const GPTConfig& cfg) const { return last_layer < 0 ? cfg.n_layer - 1 : last_layer; }
  bool owns_unit(int unit, const GPTConfig& cfg) const;  // 0..L+1
  bool is_dense(const GPTConfig& cfg) const;               // the whole model, tp = 1
  std::string str() const;  // "tp 1/2 | layers 0-3 | embedding | head"
};

struct ParamInfo {
  std::string name;  // PyTorch-style: "wte", "h.3.attn.c_attn.weight", "ln_f.bias"
  Shape shape;       // the shard's local shape; linear weights are (out, in) like torch.nn.Linear
  int unit = 0;      // 0 = embed, 1..L = blocks, L+1 = ln_f
  int64_t offset = 0;  // element offset inside the unit's buffer
  int64_t numel = 0;
  bool decay = false;  // weight decay applies (matrices and embeddings, not biases or layernorm)
  // Where the local tensor comes from in the dense model (copy_dense_to_shard): the dense shape, cut along
  // split_dim (0 rows, 1 columns; -1: replicated, the whole tensor) into split_blocks equal blocks (3 for
  // c_attn's q | k | v, else 1), each block into tp_size chunks; the rank holds chunk tp_rank of every block.
  Shape dense_shape;
  int split_dim = -1;
  int split_blocks = 1;
  bool tp_replicated = true;  // every rank of the tp group holds the same values (split_dim == -1)
  bool tied_copy = false;     // the last stage's copy of wte for the tied head (the first stage owns wte)
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

// Builds the parameter table for a config and a shard (no allocation): the shard's local shapes, in
// unit order. Used by the model, optimizers, estimators.
std::vector<ParamInfo> gpt2_param_table(const GPTConfig& cfg, const ModelShard& shard = ModelShard::dense());
// Total parameter count of the dense model; with_wpe=false excludes position embeddings (the MFU
// convention, see lab 01).
int64_t gpt2_num_params(const GPTConfig& cfg, bool with_wpe = true);
// Elements of each unit's parameter buffer, units 0 .. L+1 (0 for a unit the shard does not own).
std::vector<int64_t> gpt2_unit_numel(const GPTConfig& cfg, const ModelShard& shard = ModelShard::dense());

// The shard's slice of a dense tensor and back (strided copies; ParamInfo's split): dense (dense_shape)
// and local (shape) fp32 or bf16, same dtype, any device. For dense checkpoints, evaluation and checks.
void copy_dense_to_shard(const ParamInfo& p, const ModelShard& shard, const Tensor& dense, Tensor& local);
void copy_shard_to_dense(const ParamInfo& p, const ModelShard& shard, const Tensor& local, Tensor& dense);

// The initial weights of every unit, one unit at a time: calls sink(unit, w) for unit 0 .. L+1 in
// order, w a (unit numel,) fp32 CPU tensor (category Workspace) valid during the call. The same
// values GPT2's constructor draws from `seed`, so a sharded model (lab 04) can keep only its shard of
// each unit and start exactly where a 1-rank model does, without ever holding the whole model.
void gpt2_initial_weights(const GPTConfig& cfg, uint64_t seed,
                          const std::function<void(int unit, const Tensor& w)>& sink);

class GPT2;

// The activations of one forward pass, owned by the caller (model.make_activations): what the backward of
// that micro-batch needs. A pipeline keeps one set per micro-batch in flight (GPipe m, 1F1B at most p).
// All fp32 in category Activations, shapes as in llm.c with the shard's local sizes (3C/tp, 4C/tp, NH/tp,
// V/tp under tensor parallelism). "Stream" is the residual stream's shape: (B,T,C), or with sequence
// parallelism this rank's (B*T/tp, C) token rows of it (tensor_parallel.h); "rows" (B,T) or (B*T/tp).
struct BlockActivations {  // one transformer block; with Recompute::Full only residual3 is its own
  Recompute mode = Recompute::None;  // what the set keeps for this block (the model's choice when it was made)
  Tensor ln1, ln1_mean, ln1_rstd;  // stream, rows, rows
  Tensor ln1_full;                 // (B,T,C): the gathered ln1 (sequence parallel; else ln1 itself)
  Tensor qkv;                      // (B,T,3C/tp)
  Tensor att;                      // (B,NH/tp,T,T) materialized attention
  Tensor lse;                      // (B,NH/tp,T) flash attention (att stays empty)
  Tensor atty;                     // (B,T,C/tp)
  Tensor attproj, residual2;       // stream
  Tensor ln2, ln2_mean, ln2_rstd;  // stream, rows, rows
  Tensor ln2_full;                 // (B,T,C) (sequence parallel; else ln2 itself)
  Tensor fch, fch_gelu;            // (B,T,4C/tp)
  Tensor fcproj, residual3;        // stream; residual3 is the block's output
};
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
  int B_ = 0, T_ = 0;
  Tensor tokens, targets;          // copies of the inputs (B,T) i32 (targets: the stage with the head)
  Tensor input;                    // (stream) copy of the hidden state entering a stage without the embedding
  Tensor encoded;                  // (stream) the embedding's output
  std::vector<BlockActivations> blocks;  // the owned blocks, first_layer first
  Tensor lnf, lnf_mean, lnf_rstd;  // stream, rows, rows
  Tensor lnf_full;                 // (B,T,C) (sequence parallel; else lnf itself)
  Tensor head_logits;              // (B,T,V/tp) the LM head's output, overwritten by dlogits in backward
  Tensor probs;                    // (B,T,V/tp) softmax of logits, kept for backward
  Tensor losses;                   // (B,T)
  bool have_targets = false;
};

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

  // The tensor-parallel points (tensor_parallel.h) the blocks, the embedding and the head call; the model
  // does not own it. nullptr: the identity (only valid for tp = 1). Lab 05 installs its implementation.
  void set_tensor_parallel(TensorParallel* tp) { tp_ = tp; }

  // Adds `fn` at `point` (see HookOrder) and returns the handle that removes it. A hook runs for every unit
  // at its point, in forward and backward alike, also in evaluation and sampling. Hooks added or removed
  // while hooks at that point are running take effect from the next unit.
  [[nodiscard]] HookHandle add_hook(HookPoint point, Hook fn, HookOrder order = HookOrder::Last);
  int num_hooks(HookPoint point) const;  // installed at `point`

  // Frees the model's own activations and its backward scratch (e.g. before a bigger model is built).
  void free_activations();

  // Materialized (the default) or Flash; changing it frees the activations (the next forward allocates
  // what the new choice saves).
  void set_attention(AttentionImpl impl);
  AttentionImpl attention() const { return attention_; }

  // Activation recompute (Recompute above) for every block, or for block `layer` (0-based, global; one this
  // shard owns, else scalelab::Error). Frees the model's own activations and scratch; a caller-owned set
  // made before the change is refused by forward/backward (make a new one).
  void set_recompute(Recompute mode);
  void set_recompute(int layer, Recompute mode);
  Recompute recompute(int layer) const { return recompute_.at(layer); }

 private:
  // What one backward needs besides a set, shared by every set of the model (a backward runs one micro-
  // batch at a time): the gradient scratch, reused layer after layer, and the bf16-compute operand scratch.
  struct Scratch {
    int B = 0, T = 0;
    Tensor dresidual, dln, datty, dqkv, dfch, dfch_gelu, datt;  // as llm.c, the shard's local sizes
    Tensor dln_full, y_full;  // (B,T,C) sequence parallel: a gathered gradient, a partial row-parallel output
    // bf16-compute only (empty otherwise), reused by every matmul in turn:
    Tensor matmul_inp_bf16;   // (B*T*4C,) bf16: the matmul's input activation rounded to bf16
    Tensor matmul_dout_bf16;  // (B*T*max(4C,V),) bf16: the matmul's dout rounded to bf16 (backward)
    Tensor small_params_f32;  // (f32_scratch_numel_,) fp32 copies of one unit's non-matmul parameters
    // Activation recompute (empty unless an owned block needs them), shared by every set like the above:
    BlockActivations work;  // Full: one block's whole working set, for the forward and the backward's re-run
    Tensor att_recompute;   // Selective, materialized attention: (B,NH/tp,T,T) the recomputed scores
  };
  GPT2Activations allocate_set(int B, int T);  // a set's tensors (no scratch)
  void ensure_scratch(int B, int T);
  void ensure_activations(int B, int T);  // the model's own set and the scratch, for (B, T)
  // The fp32 weights of a unit that the fp32 ops read, laid out as f32_offset_ says:
  //   fp32:         the parameter buffer itself;
  //   bf16-mixed:   an fp32 copy of the whole bf16 unit, made for this unit's forward/backward (category
  //                 Workspace, freed when the caller drops it; lab 04's memory estimator counts it);
  //   bf16-compute: scratch_.small_params_f32, refilled with this unit's non-matmul parameters (layernorm
  //                 weights, biases, embeddings); the block's matmul weights are read in bf16 in place.
  //                 One buffer for all units: valid until the next call.
  Tensor unit_weights_f32(int unit);
  GPT2(bool allocate, const GPTConfig& cfg, const ModelShard& shard, const PrecisionPolicy& policy, Device device);
  void run_hooks(HookPoint point, int unit);  // every hook at `point`, in order, for `unit`
  // The table entries forward and backward read, resolved from their names once at construction, so the
  // hot loop indexes the table instead of searching it by name.
  struct BlockParams {  // h.<l>.: the table index of each of the block's twelve tensors
    int ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
    int ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
  };
  std::vector<BlockParams> blocks_;  // (L,): entries of blocks the shard does not own are -1
  BlockActivations allocate_block(int B, int T, Recompute mode);  // a block's tensors as `mode` keeps them
  // One block's forward from its input x (stream) into ba, the unit's weights w: the forward pass's body and
  // the Full recompute's re-run alike (no hooks: the caller runs them).
  void block_forward(BlockActivations& ba, const Tensor& x, const Tensor& w, const BlockParams& b);
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;  // -1: not in this shard
  int head_wte_ = -1;  // the wte the LM head reads: wte_ (unit 0) or the tied copy in unit L+1
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
  // weight; out and every gradient fp32 with the ops' `+=` rule.
  void policy_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
  void policy_matmul_backward(Tensor* dinp, Tensor& dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                              const Tensor& weight);
  // A row-parallel linear (the two c_proj): the matmul, g (or the sequence-parallel reduce-scatter), then the
  // bias once; and its backward. See gpt2.cpp.
  void row_parallel_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);
  void row_parallel_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, Tensor& dout, const Tensor& inp,
                             const Tensor& weight);

  TensorParallel& tp() const;  // the installed points, or the identity

  GPTConfig cfg_;
  ModelShard shard_;
  PrecisionPolicy policy_;
  Device device_;
  std::vector<ParamInfo> table_;
  std::vector<Tensor> params_, grads_;  // per unit
  // Per table entry: where its fp32 values sit in unit_weights_f32(unit). The table offset (fp32,
  // bf16-mixed); under bf16-compute a slot in scratch_.small_params_f32, or -1 for a block's matmul weight.
  std::vector<int64_t> f32_offset_;
  int64_t f32_scratch_numel_ = 0;  // bf16-compute: elements of scratch_.small_params_f32 (the largest unit's need)
  GPT2Activations acts_;  // the model's own set (forward(tokens, targets) / backward())
  Scratch scratch_;
  std::shared_ptr<detail::HookRegistry> hooks_;  // shared with the HookHandles (weakly): survives a move
  TensorParallel* tp_ = nullptr;                 // not owned; nullptr: the identity
  AttentionImpl attention_ = AttentionImpl::Materialized;
  std::vector<Recompute> recompute_;  // (L,) per block, Recompute::None unless set_recompute
};

}  // namespace scalelab
