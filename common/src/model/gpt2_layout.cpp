// gpt2_layout.cpp — GPT-2's shape without the model: presets, the shard's checks, the parameter table, counts
// per unit and the dense <-> shard slice copies (gpt2_layout.h). Pure functions of GPTConfig and ModelShard.
// Tests: tests/common/model/test_model_shard.cpp, tests/common/model/test_gpt2.cpp
#include "scalelab/model/gpt2_layout.h"

#include <functional>
#include <sstream>

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL

namespace scalelab {

// ---------------------------------------------------------------------------------------------
// Config

namespace {

struct NamedConfig {
  const char* name;
  GPTConfig cfg;
  bool own_vocabulary = false;  // the lesson's sizes: V is part of the size (gpt2_layout.h)
};

// Comments: parameters with this V (gpt2_num_params); in quotes, what GPT-2's 50,257-token vocabulary
// makes of the same shapes, the size GPT-2 is known by. Sources of the last five: gpt2_layout.h.
//                                         maxT   V      L   NH  C
const NamedConfig kPresets[] = {
    {"tiny", GPTConfig{16, 64, 2, 2, 16}},                      // 7,872: tests; matches tests/fixtures/gpt2_tiny.json
    {"demo", GPTConfig{256, 256, 4, 4, 192}},                   // 1.88M: the CPU demo
    {"d12", GPTConfig{1024, 256, 12, 12, 768}},                 // 86.0M (GPT-2 small's shapes, "124M")
    {"d24", GPTConfig{1024, 256, 24, 16, 1024}},                // 303.6M (GPT-2 medium's, "355M")
    {"d36", GPTConfig{1024, 256, 36, 20, 1280}},                // 710.0M (GPT-2 large's, "774M")
    {"d48", GPTConfig{1024, 256, 48, 25, 1600}},                // 1477.6M (GPT-2 XL's, "1558M")
    {"gpt2-124m", GPTConfig{1024, 50257, 12, 12, 768}, true},   // 124.4M: GPT-2 small
    {"gpt2-350m", GPTConfig{1024, 50257, 24, 16, 1024}, true},  // 354.8M: GPT-2 medium
    {"gpt2-1.5b", GPTConfig{1024, 50257, 48, 25, 1600}, true},  // 1557.6M: GPT-2 XL
    {"gpt-7b", GPTConfig{4096, 32000, 32, 32, 4096}, true},     // 6.59B: Llama 2 7B's C, L, NH, V; GPT-2's block
    {"gpt-70b", GPTConfig{4096, 32000, 80, 64, 8192}, true},    // 64.7B: Llama 2 70B's C, L, NH, V; GPT-2's block
};

}  // namespace

std::vector<std::string> GPTConfig::preset_names() {
  std::vector<std::string> names;
  for (const NamedConfig& p : kPresets) names.push_back(p.name);
  return names;
}

bool GPTConfig::has_own_vocabulary(const std::string& name) {
  for (const NamedConfig& p : kPresets)
    if (name == p.name) return p.own_vocabulary;
  return false;
}

bool GPTConfig::is_preset(const std::string& name) {
  for (const NamedConfig& p : kPresets)
    if (name == p.name) return true;
  return false;
}

GPTConfig GPTConfig::preset(const std::string& name) {
  std::string names;
  for (const NamedConfig& p : kPresets) {
    if (name == p.name) return p.cfg;
    names += std::string(names.empty() ? "" : ", ") + p.name;
  }
  SL_FAIL("use one of: " + names, "unknown model preset '%s'", name.c_str());
  return GPTConfig{};  // not reached: SL_FAIL throws
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

// ---------------------------------------------------------------------------------------------
// The shard

void ModelShard::validate(const GPTConfig& cfg) const {
  cfg.validate();
  const int L = cfg.n_layer, NH = cfg.n_head, C = cfg.n_embd, V = cfg.vocab_size;
  SL_CHECK_HINT(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp_rank is 0 .. tp_size-1",
                "tensor-parallel rank %d of %d", tp_rank, tp_size);
  SL_CHECK_HINT(NH % tp_size == 0,
                "the tensor-parallel degree must divide the number of heads (each rank "
                "computes NH/tp whole heads): pick tp among the divisors of NH",
                "NH=%d heads not divisible by tp=%d", NH, tp_size);
  SL_CHECK_HINT((4 * C) % tp_size == 0, "the tensor-parallel degree must divide the MLP width 4C",
                "4C=%d not divisible by tp=%d", 4 * C, tp_size);
  SL_CHECK_HINT(V % tp_size == 0,
                "the vocabulary is split into tp equal row blocks and is never padded "
                "silently: pick tp dividing V (V=256: 1, 2, 4, 8, ...)",
                "vocabulary V=%d not divisible by tp=%d", V, tp_size);
  const int last_l = last(cfg);
  SL_CHECK_HINT(first_layer >= 0 && first_layer <= last_l && last_l < L,
                "a shard owns a non-empty range of blocks inside [0, L): more pipeline stages than layers?",
                "layers %d..%d of a model with L=%d", first_layer, last_l, L);
  SL_CHECK_HINT(!sequence_parallel || tp_size > 1,
                "sequence parallelism splits along T within a "
                "tensor-parallel group: it needs tp > 1",
                "sequence parallel with tp=%d", tp_size);
  SL_CHECK_HINT(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size, "cp_rank is 0 .. cp_size-1",
                "context-parallel rank %d of %d", cp_rank, cp_size);
  SL_CHECK_HINT(cp_size <= cfg.max_seq_len / (cp_zigzag ? 2 : 1),
                "each rank needs at least one token (two with the zig-zag) of a max_seq_len sequence",
                "context parallel over %d ranks%s, but max_seq_len=%d", cp_size, cp_zigzag ? " (zig-zag)" : "",
                cfg.max_seq_len);
  SL_CHECK_HINT(!(sequence_parallel && cp_size > 1),
                "sequence parallelism and context parallelism both split the sequence: use one of them",
                "sequence parallel with cp=%d", cp_size);
}

bool ModelShard::owns_unit(int unit, const GPTConfig& cfg) const {
  if (unit == 0) return has_embedding;
  if (unit == cfg.n_layer + 1) return has_head;
  return unit - 1 >= first_layer && unit - 1 <= last(cfg);
}

bool ModelShard::is_dense(const GPTConfig& cfg) const {
  return tp_size == 1 && first_layer == 0 && last(cfg) == cfg.n_layer - 1 && has_embedding && has_head &&
         !sequence_parallel;
}

std::string ModelShard::str() const {
  std::ostringstream os;
  os << "tp " << tp_rank << "/" << tp_size << " | layers " << first_layer << "-";
  if (last_layer < 0) os << "L-1";
  else os << last_layer;
  if (has_embedding) os << " | embedding";
  if (has_head) os << " | head";
  if (sequence_parallel) os << " | sequence parallel";
  if (cp_size > 1) os << " | cp " << cp_rank << "/" << cp_size << (cp_zigzag ? " zig-zag" : "");
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// The parameter table

std::vector<ParamInfo> gpt2_param_table(const GPTConfig& cfg, const ModelShard& shard) {
  shard.validate(cfg);
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, maxT = cfg.max_seq_len, L = cfg.n_layer;
  const int64_t tp = shard.tp_size;
  std::vector<ParamInfo> t;
  int unit = 0;
  int64_t offset = 0;
  // dense: the dense model's shape; split: how the shard's slice is cut (ParamInfo).
  auto add = [&](const std::string& name, const Shape& dense, bool decay, TpSplit split = {}) {
    Shape local = dense;
    if (split.dim >= 0) local[split.dim] /= tp;
    const int64_t n = numel_of(local);
    ParamInfo p;
    p.name = name;
    p.shape = local;
    p.unit = unit;
    p.offset = offset;
    p.numel = n;
    p.decay = decay;
    p.dense_shape = dense;
    p.split_dim = split.dim;
    p.split_blocks = split.blocks;
    p.tp_replicated = split.dim < 0;
    t.push_back(p);
    offset += n;
  };
  auto start_unit = [&](int u) {
    unit = u;
    offset = 0;
  };
  // A block tensor's cut: the shard's rule (tp > 1), checked against the dense shape; whole with tp = 1.
  auto block_split = [&](const std::string& name, const Shape& dense) {
    if (tp == 1) return TpSplit{};
    SL_CHECK_HINT(shard.tp_split != nullptr,
                  "a tensor-parallel shard needs ModelShard::tp_split, the rule that says how each block "
                  "tensor is cut (lab 05's block_split; lab 05's shard_of sets it)",
                  "tp=%d shard without a split rule, at %s", shard.tp_size, name.c_str());
    const TpSplit s = shard.tp_split(name);
    const int ndim = static_cast<int>(dense.size());
    SL_CHECK_HINT(s.dim >= -1 && s.dim < ndim && s.blocks >= 1,
                  "dim is -1 (whole on every rank) or a dimension of the tensor; blocks >= 1",
                  "%s %s: split dim %d, blocks %d", name.c_str(), shape_str(dense).c_str(), s.dim, s.blocks);
    SL_CHECK_HINT(s.dim < 0 || dense[s.dim] % (s.blocks * tp) == 0,
                  "the cut dimension must hold blocks x tp equal chunks",
                  "%s %s: dim %d of %lld does not split into %d blocks x tp=%lld", name.c_str(),
                  shape_str(dense).c_str(), s.dim, static_cast<long long>(s.dim < 0 ? 0 : dense[s.dim]), s.blocks,
                  static_cast<long long>(tp));
    return s;
  };
  // unit 0: embeddings. wte is vocabulary-parallel (its V rows cut, lab 05's embedding), wpe replicated.
  if (shard.has_embedding) {
    start_unit(0);
    add("wte", {V, C}, true, TpSplit{0, 1});
    add("wpe", {maxT, C}, true);
  }
  // units 1..L: blocks, each tensor cut as the shard's rule says.
  for (int64_t l = shard.first_layer; l <= shard.last(cfg); ++l) {
    start_unit(static_cast<int>(1 + l));
    const std::string p = "h." + std::to_string(l) + ".";
    auto add_block = [&](const std::string& name, const Shape& dense, bool decay) {
      add(p + name, dense, decay, block_split(name, dense));
    };
    add_block("ln_1.weight", {C}, false);
    add_block("ln_1.bias", {C}, false);
    add_block("attn.c_attn.weight", {3 * C, C}, true);
    add_block("attn.c_attn.bias", {3 * C}, false);
    add_block("attn.c_proj.weight", {C, C}, true);
    add_block("attn.c_proj.bias", {C}, false);
    add_block("ln_2.weight", {C}, false);
    add_block("ln_2.bias", {C}, false);
    add_block("mlp.c_fc.weight", {4 * C, C}, true);
    add_block("mlp.c_fc.bias", {4 * C}, false);
    add_block("mlp.c_proj.weight", {C, 4 * C}, true);
    add_block("mlp.c_proj.bias", {C}, false);
  }
  // unit L+1: final layernorm, and on a last stage without the embedding its own copy of wte for the
  // tied LM head (the first stage owns wte; lab 06 keeps the two copies equal).
  if (shard.has_head) {
    start_unit(static_cast<int>(L + 1));
    add("ln_f.weight", {C}, false);
    add("ln_f.bias", {C}, false);
    if (!shard.has_embedding) {
      add("wte", {V, C}, true, TpSplit{0, 1});
      t.back().tied_copy = true;
    }
  }
  return t;
}

int64_t gpt2_num_params(const GPTConfig& cfg, bool with_wpe) {
  int64_t n = 0;
  for (int64_t u : gpt2_unit_numel(cfg)) n += u;
  return with_wpe ? n : n - static_cast<int64_t>(cfg.max_seq_len) * cfg.n_embd;
}

// The sums of gpt2_param_table's rows per unit, without building the table: the planner asks for them
// for every stage of every layout it weighs, and the table of a 10,000-layer model is 120,000 named rows
// (seconds per layout). The same shapes and the same integer divisions by tp as the table's `add`;
// tests/common/model/test_model_shard.cpp compares the two on many shards.
std::vector<int64_t> gpt2_unit_numel(const GPTConfig& cfg, const ModelShard& shard) {
  shard.validate(cfg);  // the table's own check, so both refuse the same shards
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, maxT = cfg.max_seq_len, L = cfg.n_layer;
  const int64_t tp = shard.tp_size;
  const int64_t wte = (V / tp) * C;  // vocabulary-parallel rows
  // ln_1, ln_2 (weight, bias), whole; c_attn 3C*C/tp + its bias 3C/tp; attn c_proj C*C/tp + its bias C;
  // c_fc 4C*C/tp + its bias 4C/tp; mlp c_proj 4C*C/tp + its bias C (the counts of lab 05's split)
  const int64_t block = 4 * C + ((3 * C) / tp) * C + (3 * C) / tp + C * (C / tp) + C + ((4 * C) / tp) * C +
                        (4 * C) / tp + C * ((4 * C) / tp) + C;
  std::vector<int64_t> n(L + 2, 0);
  if (shard.has_embedding) n[0] = wte + maxT * C;
  for (int64_t l = shard.first_layer; l <= shard.last(cfg); ++l) n[1 + l] = block;
  if (shard.has_head) n[L + 1] = 2 * C + (shard.has_embedding ? 0 : wte);  // ln_f; the tied head's own wte
  return n;
}

// The shard's slice of a dense tensor, as contiguous runs: split_dim 0 cuts rows (of
// numel / dense_shape[0] elements each), one run per block; split_dim 1 cuts columns of a 2-D tensor,
// one run per row. fn(dense_offset, local_offset, count) for every run, in local order.
static void for_each_slice_run(const ParamInfo& p, const ModelShard& shard,
                               const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int64_t n_dense = numel_of(p.dense_shape), tp = shard.tp_size, r = shard.tp_rank;
  if (p.split_dim < 0) {
    fn(0, 0, n_dense);
  } else if (p.split_dim == 0) {
    const int64_t rows = p.dense_shape[0], row = n_dense / rows;
    const int64_t block_rows = rows / p.split_blocks, chunk_rows = block_rows / tp;
    for (int64_t b = 0; b < p.split_blocks; ++b)
      fn((b * block_rows + r * chunk_rows) * row, b * chunk_rows * row, chunk_rows * row);
  } else {
    SL_CHECK(p.dense_shape.size() == 2 && p.split_blocks == 1, "%s: a column split needs a 2-D tensor", p.name.c_str());
    const int64_t rows = p.dense_shape[0], cols = p.dense_shape[1], chunk = cols / tp;
    for (int64_t i = 0; i < rows; ++i) fn(i * cols + r * chunk, i * chunk, chunk);
  }
}

static void check_slice_args(const ParamInfo& p, const Tensor& dense, const Tensor& local) {
  SL_CHECK(dense.numel() == numel_of(p.dense_shape) && local.numel() == p.numel && dense.dtype() == local.dtype(),
           "%s: dense %s %s and local %s %s, expected %s and %s of one dtype", p.name.c_str(),
           shape_str(dense.shape()).c_str(), dtype_name(dense.dtype()), shape_str(local.shape()).c_str(),
           dtype_name(local.dtype()), shape_str(p.dense_shape).c_str(), shape_str(p.shape).c_str());
}

void copy_dense_to_shard(const ParamInfo& p, const ModelShard& shard, const Tensor& dense, Tensor& local) {
  check_slice_args(p, dense, local);
  for_each_slice_run(p, shard, [&](int64_t d, int64_t l, int64_t n) {
    Tensor dst = local.view(l, {n});
    dst.copy_from(dense.view(d, {n}));
  });
}

void copy_shard_to_dense(const ParamInfo& p, const ModelShard& shard, const Tensor& local, Tensor& dense) {
  check_slice_args(p, dense, local);
  for_each_slice_run(p, shard, [&](int64_t d, int64_t l, int64_t n) {
    Tensor dst = dense.view(d, {n});
    dst.copy_from(local.view(l, {n}));
  });
}

}  // namespace scalelab
