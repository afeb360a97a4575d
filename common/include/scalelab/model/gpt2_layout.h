// gpt2_layout.h — the shape of GPT-2 without the model: its config (GPTConfig), the part of it one rank holds
// (ModelShard), the parameter table (ParamInfo, gpt2_param_table), counts per unit and the dense <-> shard
// slice copies. Pure functions of the config and the shard (no model, no storage), shared by the model
// (gpt2.h), the optimizers, the memory estimator (measure/memory_estimator.h), lab 08's reshard and lab 09's
// planner. Units: 0 = embeddings (wte, wpe), 1..L = blocks h.0..h.L-1, L+1 = final layernorm ln_f.
// Tests: tests/common/model/test_model_shard.cpp, tests/common/model/test_gpt2.cpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/core/tensor.h"  // defines: Tensor, Shape

namespace scalelab {

struct GPTConfig {
  int max_seq_len = 256;  // maxT: rows of wpe
  int vocab_size = 256;   // V: 256 for the byte-level tokenizer
  int n_layer = 4;        // L
  int n_head = 4;         // NH
  int n_embd = 256;       // C
  // Named presets, V = 256 (bytes) in all: "tiny" (tests; 7,872 parameters), "demo" (the CPU demo; 1.88M),
  // and "d12", "d24", "d36", "d48": maxT 1024 and the L, C of GPT-2's four sizes (Radford et al. 2019,
  // Table 2; NH as in the released models). With the byte vocabulary they hold 86.0M, 303.6M, 710.0M and
  // 1477.6M parameters (gpt2_num_params); GPT-2's 50,257-token vocabulary makes the same shapes 124M, 355M,
  // 774M and 1558M.
  // The lesson's sizes, for timing-only runs on the simulated GPU (docs/simulation.md "Timing-only runs"):
  // "gpt2-124m", "gpt2-350m", "gpt2-1.5b" are GPT-2 small, medium and XL with its 50,257-token vocabulary
  // and maxT 1024 (Radford et al. 2019, Table 2: 117M, 345M, 1542M as the paper counts; 124.4M, 354.8M,
  // 1557.6M by gpt2_num_params). "gpt-7b" and "gpt-70b" are GPT-2-shaped decoders (this kit's block: learned
  // positions, LayerNorm, a 4C GELU MLP, tied embeddings) with Llama 2's C, L, NH, V = 32,000 and maxT 4096
  // (Touvron et al. 2023, Table 1 and Sec. 2.2): 6.59B and 64.7B parameters, not Llama's (which has a
  // SwiGLU MLP of 2.7C, RMSNorm and untied embeddings); docs/references.md, "Model sizes". Throws on unknown
  // names, naming the presets.
  static GPTConfig preset(const std::string& name);
  static bool is_preset(const std::string& name);  // preset(name) would not throw
  // True for the lesson's sizes: their V is part of their size, so a lab program keeps it (the byte tokenizer's
  // ids, 0..255, are a subset); the other presets take the tokenizer's V (driver::open_data).
  static bool has_own_vocabulary(const std::string& name);
  static std::vector<std::string> preset_names();  // tiny, demo, d12, ..., gpt-70b
  void validate() const;                           // throws if C % NH != 0 or any size <= 0
  std::string str() const;
};

// How a tensor-parallel group cuts one tensor of a block (ParamInfo's split): dim -1 keeps it whole on every
// rank (replicated); dim 0 cuts its first dimension (a linear's output rows, torch's (out, in) layout), dim 1
// its second (a linear's input columns). `blocks` first cuts that dimension into equal blocks, then each block
// into tp chunks; the rank holds chunk tp_rank of every block.
struct TpSplit {
  int dim = -1;
  int blocks = 1;
};
// The decision behind the cut: a block's tensor, named without its "h.<l>." prefix ("ln_1.weight",
// "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", ..., "mlp.c_proj.bias"), to its split.
// Lab 05 writes it (labs/05_tensor_parallel: block_split); the model only applies it.
using TpSplitRule = TpSplit (*)(const std::string& block_tensor);

// Which part of the model one rank holds (docs/design.md "Parallel layouts"): a tensor-parallel slice of
// every matrix (tp_rank of tp_size) of the blocks first_layer..last_layer, with or without the embedding
// (the first pipeline stage) and the final layernorm and LM head (the last). The default is the whole,
// dense model. Unit ids stay global: a shard simply has no storage, no table entries and no hooks for the
// units it does not own.
struct ModelShard {
  int tp_rank = 0, tp_size = 1;    // tensor parallel: this rank's index and the group's size
  int first_layer = 0;             // blocks [first_layer, last_layer], 0-based (unit = layer + 1)
  int last_layer = -1;             // -1: the last block, L-1
  bool has_embedding = true;       // unit 0 (wte, wpe): the first stage
  bool has_head = true;            // unit L+1 (ln_f) and the tied LM head: the last stage
  bool sequence_parallel = false;  // tp > 1: layernorms and the residual stream split along T too
                                   // (Korthikanti et al. 2022, Sec. 4.2.2)
  TpSplitRule tp_split = nullptr;  // tp > 1: how each block tensor is cut (required when the shard owns a block)
  // Context parallel (docs/context_parallel.md): this rank holds a slice of T/cp_size tokens of every
  // sequence and the whole parameters; cp_chunks (context_parallel.h) says which positions. cp > 1 needs the
  // flash attention (the model sets it) and the model's context-parallel point (GPT2::set_context_parallel).
  int cp_rank = 0, cp_size = 1;
  bool cp_zigzag = false;  // cp > 1: chunks r and 2cp-1-r of 2cp (balanced causal work), else one contiguous slice
  static ModelShard dense() { return {}; }
  // Throws scalelab::Error, with the numbers and a hint, unless the shard fits cfg: 0 <= tp_rank < tp_size,
  // NH % tp == 0, 4C % tp == 0, V % tp == 0 (the vocabulary is never padded silently), a non-empty range of
  // layers inside [0, L), (sequence parallel) tp > 1, 0 <= cp_rank < cp_size, cp_size <= max_seq_len, and
  // not both sequence parallelism and cp > 1 (both would split the sequence).
  void validate(const GPTConfig& cfg) const;
  int last(const GPTConfig& cfg) const { return last_layer < 0 ? cfg.n_layer - 1 : last_layer; }
  int num_blocks(const GPTConfig& cfg) const { return last(cfg) - first_layer + 1; }  // blocks the shard holds
  bool owns_unit(int unit, const GPTConfig& cfg) const;                               // 0..L+1
  bool is_dense(const GPTConfig& cfg) const;                                          // the whole model, tp = 1
  std::string str() const;  // "tp 1/2 | layers 0-3 | embedding | head" (and "| cp 1/2" when cp > 1)
};

struct ParamInfo {
  std::string name;    // PyTorch-style: "wte", "h.3.attn.c_attn.weight", "ln_f.bias"
  Shape shape;         // the shard's local shape; linear weights are (out, in) like torch.nn.Linear
  int unit = 0;        // 0 = embed, 1..L = blocks, L+1 = ln_f
  int64_t offset = 0;  // element offset inside the unit's buffer
  int64_t numel = 0;
  bool decay = false;  // weight decay applies (matrices and embeddings, not biases or layernorm)
  // Where the local tensor comes from in the dense model (copy_dense_to_shard): the dense shape, cut along
  // split_dim (0 rows, 1 columns; -1: replicated, the whole tensor) into split_blocks equal blocks, each
  // block into tp_size chunks; the rank holds chunk tp_rank of every block (TpSplit; a block tensor's comes
  // from ModelShard::tp_split).
  Shape dense_shape;
  int split_dim = -1;
  int split_blocks = 1;
  bool tp_replicated = true;  // every rank of the tp group holds the same values (split_dim == -1)
  bool tied_copy = false;     // the last stage's copy of wte for the tied head (the first stage owns wte)
};

// Builds the parameter table for a config and a shard (no allocation): the shard's local shapes, in
// unit order, each unit's tensors packed from offset 0. Validates the shard (ModelShard::validate). With
// tp > 1 each block tensor is cut as shard.tp_split says (wte always by vocabulary rows, wpe and ln_f
// replicated); throws if a block is owned without a rule, or the rule's cut does not divide the tensor.
// Used by the model, optimizers, estimators.
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

}  // namespace scalelab
