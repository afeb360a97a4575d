// layouts.cpp — lab 09's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): a layout's checks, shards and links, the sizes of a shard, the refusals' words, the
// fullest stage, a plan's row evaluated and the rows ranked (what the cp axis and the offload re-rank use),
// and the one-line explanation of a plan's row. Declared under "Given" in labs/09_planner/planner.h. It calls
// the TODO functions of its own track (stage_memory; step_time through cp_step_time): yours in
// labs/09_planner/planner.cpp, the reference's in solutions/09_planner/planner.cpp.
#include "planner.h"

#include <algorithm>  // defines: std::max, std::stable_sort
#include <cstdint>    // defines: int64_t
#include <cstdio>     // defines: std::snprintf
#include <string>     // defines: std::string, std::to_string
#include <vector>     // defines: std::vector

#include "scalelab/core/error.h"   // defines: SL_CHECK_HINT, scalelab::Error, scalelab::NotImplemented
#include "scalelab/model/gpt2_layout.h"  // defines: gpt2_unit_numel (offload_step's units)
#include "scalelab/ops/op_cost.h"  // defines: OpCost, op_seconds, op_cost::<op> (the simulated device's charges)
#include "tensor_parallel.h"       // defines: lab05::block_split (lab 05's reference: the tp split)

namespace scalelab::lab09 {

inline namespace SL_TRACK_LAB09 {

// =============================================================================================
// A layout's checks, shards and links; the sizes of a shard
// =============================================================================================
int64_t shard_numel(const GPTConfig& cfg, const ModelShard& s) {
  int64_t n = 0;
  for (int64_t u : gpt2_unit_numel(cfg, s)) n += u;
  return n;
}

int shard_blocks(const GPTConfig& cfg, const ModelShard& s) { return s.last(cfg) - s.first_layer + 1; }

std::string to_string(const Layout& x) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "tp %d pp %d dp %d | B %d x m %d | %s%s | zero %d%s | recompute %s", x.tp, x.pp, x.dp,
                x.micro_batch, x.micro_batches, lab06::schedule_name(x.schedule),
                x.chunks > 1 ? (" v " + std::to_string(x.chunks)).c_str() : "", x.zero_stage,
                x.sequence_parallel ? " | sp" : "", recompute_name(x.recompute));
  return x.cp > 1 ? std::string(buf) + " | cp " + std::to_string(x.cp) : std::string(buf);
}

std::string to_string(const Cluster& c) {
  char buf[220];
  std::snprintf(buf, sizeof buf,
                "%d devices, %d a node, %.1f GB each, %.4g TFLOP/s x %.2f; links %s inside a "
                "node, %s across",
                c.devices, c.devices_per_node, c.memory_bytes / 1e9, c.peak_flops_per_s / 1e12, c.efficiency,
                c.intra.name.c_str(), c.inter.name.c_str());
  return buf;
}

void check_plan_inputs(const GPTConfig& cfg, const Workload& w, const Cluster& c) {
  cfg.validate();
  SL_CHECK_HINT(c.devices >= 1, "a cluster has 1 or more devices (--gpus N)", "a cluster of %d devices", c.devices);
  SL_CHECK_HINT(c.devices_per_node >= 1, "a node has 1 or more devices (--gpus-per-node N)", "%d devices per node",
                c.devices_per_node);
  SL_CHECK_HINT(c.flops_per_s() > 0, "give the devices' peak FLOP/s and an efficiency (--peak-tflops, --efficiency)",
                "peak %g FLOP/s x efficiency %g: a cluster with no compute", c.peak_flops_per_s, c.efficiency);
  SL_CHECK_HINT(w.global_batch >= 1 && w.seq_len >= 1,
                "the global batch and T are 1 or more (--global-batch, --seq-len)", "global batch %d, T %d",
                w.global_batch, w.seq_len);
}

void check_layout(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  cfg.validate();
  SL_CHECK_HINT(x.tp >= 1 && x.pp >= 1 && x.dp >= 1 && x.cp >= 1 && x.micro_batch >= 1 && x.micro_batches >= 1 &&
                    x.chunks >= 1,
                "tp, pp, dp, cp, the micro-batch B, the micro-batches m and the chunks v are 1 or more",
                "layout %s has a size below 1", to_string(x).c_str());
  SL_CHECK_HINT(x.devices() == c.devices, "a layout uses every device of the cluster: tp x pp x dp x cp = devices",
                "tp %d x pp %d x dp %d x cp %d = %d devices, the cluster has %d", x.tp, x.pp, x.dp, x.cp, x.devices(),
                c.devices);
  SL_CHECK_HINT(static_cast<int64_t>(x.dp) * x.micro_batch * x.micro_batches == w.global_batch,
                "every replica runs m micro-batches of B sequences: dp x B x m = the global batch",
                "dp %d x B %d x m %d != global batch %d", x.dp, x.micro_batch, x.micro_batches, w.global_batch);
  SL_CHECK_HINT(x.zero_stage >= 0 && x.zero_stage <= 3, "ZeRO stages are 0 (DDP), 1, 2 and 3", "ZeRO stage %d",
                x.zero_stage);
  SL_CHECK_HINT(w.seq_len >= 1 && w.seq_len <= cfg.max_seq_len,
                "T is at most the model's position embeddings (maxT): a longer maxT, or a shorter T",
                "T %d with maxT %d", w.seq_len, cfg.max_seq_len);
  SL_CHECK_HINT(!x.sequence_parallel || (x.tp > 1 && static_cast<int64_t>(x.micro_batch) * w.seq_len % x.tp == 0),
                "sequence parallelism splits the B*T token rows over the tp group: tp > 1 dividing B*T",
                "sequence parallel with tp %d and B*T %d", x.tp, x.micro_batch * w.seq_len);
  SL_CHECK_HINT(w.lora_rank == 0 || (x.tp == 1 && x.pp == 1 && x.zero_stage == 0),
                "the planner's LoRA fine-tune replicates the frozen base on every device: tp 1, pp 1, ZeRO 0",
                "LoRA rank %d with %s", w.lora_rank, to_string(x).c_str());
  check_context_parallel(x, w);                                             // lab 10's rules (cp_terms.cpp)
  lab06::make_layout(cfg, x.pp, 0, x.schedule, x.micro_batches, x.chunks);  // lab 06's rules of the partition
  chunk_shard(cfg, x, 0, 0).validate(cfg);                                  // the tp split of the model
}

ModelShard chunk_shard(const GPTConfig& cfg, const Layout& x, int stage, int chunk) {
  const lab06::PipelineLayout pl = lab06::make_layout(cfg, x.pp, stage, x.schedule, x.micro_batches, x.chunks);
  ModelShard s = lab06::chunk_shard(cfg, pl, chunk);
  s.tp_size = x.tp;
  s.tp_split = &lab05::block_split;  // lab 05's column/row split of each block tensor
  s.sequence_parallel = x.sequence_parallel;
  s.cp_size = x.cp;  // cp rank 0 of the zig-zag: every cp rank holds the same parameters (lab 10)
  s.cp_zigzag = x.cp > 1;
  s.validate(cfg);
  return s;
}

GroupLinks group_links(const Cluster& c, const Layout& x) {
  auto link = [&](int extent) { return extent <= c.devices_per_node ? c.intra : c.inter; };
  return {link(x.tp), /*pp=*/link(x.devices()), /*dp=*/link(x.tp * x.cp * x.dp), /*cp=*/link(x.tp * x.cp)};
}

int64_t lora_adapter_numel(const GPTConfig& cfg, const ModelShard& shard, int rank) {
  // a (r, in) and b (out, r) for c_attn (C -> 3C), attn c_proj (C -> C), c_fc (C -> 4C), mlp c_proj (4C -> C)
  const int64_t C = cfg.n_embd, per_block = static_cast<int64_t>(rank) * ((C + 3 * C) + 2 * C + 5 * C + 5 * C);
  return shard_blocks(cfg, shard) * per_block;
}

int chunk_sets(const Layout& x, int sets, int chunk) {
  if (x.chunks == 1) return sets;
  int n = 0;  // the first `sets` forwards of the interleaved schedule go p to a chunk, chunk 0 first, round and round
  for (int k = 0; k < sets; ++k) n += (k / x.pp) % x.chunks == chunk;
  return n;
}

std::string refusal_text(const Error& e) {
  // what() is the report block: "[scalelab] check failed in ...", "[scalelab]   <message>", "stmt: ...", "hint: ..."
  std::string message, hint;
  const std::string report = e.what();
  size_t at = 0;
  for (int line = 0; at < report.size(); ++line) {
    size_t end = report.find('\n', at);
    if (end == std::string::npos) end = report.size();
    std::string text = report.substr(at, end - at);
    const size_t body = text.find_first_not_of(' ', text.rfind(']') == std::string::npos ? 0 : text.find(']') + 1);
    text = body == std::string::npos ? "" : text.substr(body);
    if (line == 1) message = text;
    if (text.rfind("hint: ", 0) == 0) hint = text.substr(6);
    at = end + 1;
  }
  if (message.empty()) return report;
  return hint.empty() ? message : message + " (" + hint + ")";
}

std::string memory_refusal(const DeviceMemory& m, const Cluster& c) {
  if (static_cast<double>(m.total()) <= c.memory_bytes) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, "needs %.2f GB a device (stage %d), has %.2f GB", m.total() / 1e9, m.stage,
                c.memory_bytes / 1e9);
  return buf;
}

// =============================================================================================
// Per-op pricing: the simulated GPU's charges summed over a stage's ops (planner.h, "Per-op pricing")
// =============================================================================================
namespace {
constexpr int64_t kF32Bytes = 4;  // bytes of an f32 element or an i32 token id

// How a stage's ops are priced: the kit's own run (fp32, every op_cost as counted), or a 16-bit framework's
// (Workload::activation_bytes == 2, as Megatron-LM runs: its matmuls and attention in bf16 on the tensor
// cores, each memory-bound op's activation traffic in 16 bits, so its bytes scaled by 2/4).
struct Pricing {
  const GpuModel& gpu;
  int tp = 1;                   // n: the tensor-parallel group (lab 05's split; rank 0's shard, which
                                // also holds wpe)
  bool sp = false;              // sequence parallel: the stream's layernorms, residuals, biases on N/n rows
  DType math = DType::F32;      // the matmuls' and attention's operands
  double activation_scale = 1;  // bytes of an activation element / 4
  // op_seconds, with the activation traffic at the pricing's width (a matmul's operands are in `math`
  // already) and attention's products in `math`
  double seconds(OpCost op) const {
    if (op.op_class != OpClass::Matmul) op.bytes *= activation_scale;
    if (op.op_class == OpClass::Attention) op.math = math;
    return op_seconds(op, gpu);
  }
  double zero(int64_t elements) const {
    return gpu.zero_seconds(static_cast<int64_t>(kF32Bytes * activation_scale * elements));
  }
};

Pricing pricing(const Layout& x, const Workload& w, const GpuModel& gpu) {
  const bool framework = w.activation_bytes == 2;
  return {gpu, x.tp, x.sequence_parallel, framework ? DType::BF16 : DType::F32, w.activation_bytes / 4.0};
}

// A row-parallel linear's forward (gpt2.cpp row_parallel_forward): the product, then (tp > 1) the bias
// added once after g's sum, on this rank's N/n rows under sequence parallelism.
double row_parallel_forward_seconds(const Pricing& p, int64_t N, int64_t C, int64_t OC) {
  if (p.tp == 1) return p.seconds(op_cost::matmul_forward(N, C, OC, true, p.math));
  const int64_t rows = p.sp ? N / p.tp : N;
  return p.seconds(op_cost::matmul_forward(N, C, OC, false, p.math)) + p.seconds(op_cost::add_bias(rows, OC));
}

// Seconds of the ops one block's forward issues (gpt2.cpp block_forward, lab 05's split over n ranks):
// N = B T rows, Nl the stream's rows (N / n under sequence parallelism, else N).
double block_forward_seconds(const GPTConfig& cfg, int64_t B, int64_t T, AttentionImpl attention, const Pricing& p) {
  const int64_t n = p.tp, N = B * T, Nl = p.sp ? N / n : N, C = cfg.n_embd, NH = cfg.n_head;
  const OpCost ops[] = {
      op_cost::layernorm_forward(Nl, C),
      op_cost::matmul_forward(N, C, 3 * C / n, true, p.math),  // c_attn, column-parallel
      attention == AttentionImpl::Flash ? op_cost::attention_forward_flash(B, T, C / n, NH / n)
                                        : op_cost::attention_forward(B, T, C / n, NH / n),
      op_cost::residual_forward(Nl * C),
      op_cost::layernorm_forward(Nl, C),
      op_cost::matmul_forward(N, C, 4 * C / n, true, p.math),  // c_fc, column-parallel
      op_cost::gelu_forward(N * 4 * C / n),
      op_cost::residual_forward(Nl * C),
  };
  double s = 0;
  for (const OpCost& op : ops) s += p.seconds(op);
  return s + row_parallel_forward_seconds(p, N, C / n, C)     // attn c_proj
         + row_parallel_forward_seconds(p, N, 4 * C / n, C);  // mlp c_proj
}

// Seconds of one block's backward (gpt2.cpp block_backward): its six zeroed scratch gradients, the
// matmuls' three gradients, and what the recompute mode runs again.
double block_backward_seconds(const GPTConfig& cfg, int64_t B, int64_t T, AttentionImpl attention, Recompute mode,
                              const Pricing& p) {
  const int64_t n = p.tp, N = B * T, Nl = p.sp ? N / n : N, C = cfg.n_embd, NH = cfg.n_head;
  // dfch_gelu, dfch (N,4C/n); dln_full (N,C); datty (N,C/n); dqkv (N,3C/n); dln_full again (N,C)
  const int64_t zeroed[] = {N * 4 * C / n, N * 4 * C / n, N * C, N * C / n, N * 3 * C / n, N * C};
  const OpCost ops[] = {
      op_cost::matmul_backward(N, 4 * C / n, C, true, true, true, p.math),  // mlp c_proj
      op_cost::gelu_backward(N * 4 * C / n),
      op_cost::matmul_backward(N, C, 4 * C / n, true, true, true, p.math),  // c_fc
      op_cost::layernorm_backward(Nl, C),
      op_cost::matmul_backward(N, C / n, C, true, true, true, p.math),  // attn c_proj
      attention == AttentionImpl::Flash ? op_cost::attention_backward_flash(B, T, C / n, NH / n)
                                        : op_cost::attention_backward(B, T, C / n, NH / n),
      op_cost::matmul_backward(N, C, 3 * C / n, true, true, true, p.math),  // c_attn
      op_cost::layernorm_backward(Nl, C),
  };
  double s = 0;
  for (int64_t e : zeroed) s += p.zero(e);
  for (const OpCost& op : ops) s += p.seconds(op);
  if (mode == Recompute::Full) s += block_forward_seconds(cfg, B, T, attention, p);
  if (mode == Recompute::Selective && attention != AttentionImpl::Flash)  // the scores again
    s += p.seconds(op_cost::attention_forward(B, T, C / n, NH / n));
  return s;
}
}  // namespace

void check_per_op_pricing(const Layout& x, const Workload& w) {
  SL_CHECK_HINT(w.activation_bytes == 2 || (w.policy.matmul_dtype == DType::F32 && w.policy.param_dtype == DType::F32),
                "use --precision fp32 with --per-op (the kit's bf16 policy's casts are not priced yet), or "
                "--activation-bytes 2 to price a 16-bit framework's step (Megatron-LM's)",
                "per-op pricing covers the kit's fp32 policy, or a 16-bit framework");
  SL_CHECK_HINT(w.activation_bytes == 2 || w.activation_bytes == 4, "--activation-bytes is 4 (this kit) or 2",
                "per-op pricing with %d-byte activations", w.activation_bytes);
  SL_CHECK_HINT(w.optimizer == OptimizerConfig::Kind::AdamW && w.lora_rank == 0,
                "use --optimizer adamw and no --lora with --per-op", "per-op pricing covers full AdamW training only");
  (void)x;  // every tp, pp, dp, ZeRO stage and schedule check_layout accepts
}

StageOpSeconds stage_op_seconds(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w,
                                const GpuModel& gpu) {
  check_per_op_pricing(x, w);
  const Pricing p = pricing(x, w, gpu);
  const int64_t n = x.tp, B = x.micro_batch, T = w.seq_len, N = B * T, Nl = x.sequence_parallel ? N / n : N;
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, Vl = V / n;
  // a (B,T,C) stream copy (Nl rows under sequence parallelism), at the pricing's activation width
  const double sim_copy =
      gpu.copy_seconds(static_cast<int64_t>(kF32Bytes * p.activation_scale * Nl * C), Device::SIM, Device::SIM);
  StageOpSeconds s;
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard sh = chunk_shard(cfg, x, stage, chunk);
    // forward: the input into the activation set (the tokens, or the hidden state received), the embedding
    // (tp > 1: this rank's vocabulary rows, and wpe on rank 0, lab 05's embedding_forward)
    if (sh.has_embedding) {
      s.forward += gpu.copy_seconds(kF32Bytes * N, Device::SIM, Device::SIM);
      s.forward +=
          p.seconds(n == 1 ? op_cost::encoder_forward(B, T, C) : op_cost::encoder_forward_vocab_shard(B, T, C, true));
    } else {
      s.forward += sim_copy;
    }
    for (int l = sh.first_layer; l <= sh.last(cfg); ++l) {
      s.forward += block_forward_seconds(cfg, B, T, w.attention, p);
      s.backward += block_backward_seconds(cfg, B, T, w.attention, x.recompute, p);
    }
    // backward: the embedding's gradients, or d(input) handed back
    if (sh.has_embedding)
      s.backward += p.seconds(n == 1 ? op_cost::encoder_backward(B, T, C)
                                     : op_cost::encoder_backward_vocab_shard(B, T, C, Vl, true));
    else s.backward += sim_copy;
    if (sh.has_head) {
      // the targets in, ln_f, the tied head (column-parallel over the vocabulary), the loss (tp > 1: lab 05's
      // row max, partial sums and finish), the losses copied to the host for their mean
      s.forward += gpu.copy_seconds(kF32Bytes * N, Device::SIM, Device::SIM);
      s.forward += p.seconds(op_cost::layernorm_forward(Nl, C));
      s.forward += p.seconds(op_cost::matmul_forward(N, C, Vl, false, p.math));
      if (n == 1) {
        s.forward += p.seconds(op_cost::softmax_crossentropy_forward(N, V));
      } else {
        s.forward += p.seconds(op_cost::logits_row_max(N, Vl)) +
                     p.seconds(op_cost::crossentropy_vocab_shard_partials(N, Vl)) +
                     p.seconds(op_cost::crossentropy_vocab_shard_finish(N, Vl));
      }
      s.forward += gpu.copy_seconds(kF32Bytes * N, Device::CPU, Device::SIM);
      // the loss's gradient, dln_full and dresidual zeroed, the head's two gradients, ln_f's
      s.backward += p.seconds(n == 1 ? op_cost::softmax_crossentropy_backward(N, V)
                                     : op_cost::crossentropy_vocab_shard_backward(N, Vl));
      s.backward += p.zero(N * C) + p.zero(Nl * C);
      s.backward += p.seconds(op_cost::matmul_backward(N, C, Vl, true, true, false, p.math));
      s.backward += p.seconds(op_cost::layernorm_backward(Nl, C));
    } else {
      s.backward += sim_copy;  // d(output) received, copied into dresidual
    }
  }
  return s;
}

// The groups the gradient norm's sum of squares is all-reduced over, as host values (step_op_seconds): those
// that split the model's gradients, tp, pp and, ZeRO >= 1, dp; a group of one is left out.
static bool norm_over_tp(const Layout& x) { return x.tp > 1; }
static bool norm_over_pp(const Layout& x) { return x.pp > 1; }
static bool norm_over_dp(const Layout& x) { return x.zero_stage >= 1 && x.dp > 1; }

// AdamW's update of a stage's parameters (its chunk's table and unit sizes): one call per parameter, or under
// ZeRO >= 1 one per parameter that overlaps the rank's contiguous 1/dp of its unit (lab 04's optimizer_step:
// rank r owns elements [r s, r s + s) of a unit of n, s = ceil(n / dp)), on the rank with the most to do. A
// 16-bit framework also casts the fp32 master weights it updated to the 16-bit copy it computes with.
static double update_seconds(const std::vector<ParamInfo>& table, const std::vector<int64_t>& units, const Layout& x,
                             const Workload& w, const GpuModel& gpu) {
  auto update = [&](int64_t n) {
    return op_seconds(op_cost::adamw_update(n), gpu) +
           (w.activation_bytes == 2 ? op_seconds(op_cost::cast(n, DType::BF16, DType::F32), gpu) : 0.0);
  };
  const int ranks = x.zero_stage >= 1 ? x.dp : 1;
  double slowest = 0;
  for (int r = 0; r < ranks; ++r) {
    double t = 0;
    for (const ParamInfo& p : table) {
      const int64_t n = units[p.unit], shard = (n + ranks - 1) / ranks;
      const int64_t begin = std::min(n, r * shard), end = std::min(n, begin + shard);
      const int64_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel, end);
      if (lo < hi) t += update(hi - lo);
    }
    slowest = std::max(slowest, t);
  }
  return slowest;
}

double step_op_seconds(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w, const GpuModel& gpu) {
  check_per_op_pricing(x, w);
  const int64_t N = static_cast<int64_t>(x.micro_batch) * w.seq_len;
  const bool other_tp_rank = x.tp > 1;  // the norm priced on a tp rank other than 0: it skips the replicated tensors
  auto shard = [&](int64_t n) { return x.zero_stage >= 1 ? (n + x.dp - 1) / x.dp : n; };  // lab 04's padded 1/dp
  bool head = false;
  double s = 0;
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard sh = chunk_shard(cfg, x, stage, chunk);
    const std::vector<ParamInfo> table = gpt2_param_table(cfg, sh);
    head = head || sh.has_head;
    const std::vector<int64_t> units = gpt2_unit_numel(cfg, sh);
    for (int u = 0; u < static_cast<int>(units.size()); ++u) {
      const int64_t n = units[u];
      if (n == 0) continue;                  // a unit this stage does not hold
      s += gpu.zero_seconds(kF32Bytes * n);  // zero_grad
      // the gradient norm (common's grad_sum_squares): the unit whole, or tensor by tensor leaving out the tied
      // copy and (other tp ranks) the replicated tensors; ZeRO: the unit's shard (lab 04)
      bool whole = x.zero_stage >= 1;
      if (!whole) {
        whole = true;
        for (const ParamInfo& p : table)
          if (p.unit == u && (p.tied_copy || (p.tp_replicated && other_tp_rank))) whole = false;
      }
      if (whole) {
        s += op_seconds(op_cost::sum_squares(shard(n)), gpu);
      } else {
        for (const ParamInfo& p : table)
          if (p.unit == u && !p.tied_copy && !(p.tp_replicated && other_tp_rank))
            s += op_seconds(op_cost::sum_squares(p.numel), gpu);
      }
      if (x.micro_batches > 1) s += op_seconds(op_cost::scale(shard(n)), gpu);  // the m gradients' sum made a mean
      if (w.grad_clipped) s += op_seconds(op_cost::scale(shard(n)), gpu);       // clipping
    }
    s += update_seconds(table, units, x, w, gpu);
  }
  // the norm's host values (comm/host_values.h): one float up from the device and back per group
  const int groups = norm_over_tp(x) + norm_over_pp(x) + norm_over_dp(x);
  for (int g = 0; g < groups; ++g)
    s += gpu.copy_seconds(kF32Bytes, Device::CPU, Device::SIM) + gpu.copy_seconds(kF32Bytes, Device::SIM, Device::CPU);
  // every micro-batch's tokens (and, on the stage with the head, its targets) from the host
  const double batch = gpu.copy_seconds(kF32Bytes * N, Device::SIM, Device::CPU);
  return s + x.micro_batches * batch * (head ? 2 : 1);
}

StepTime per_op_step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c,
                          const GpuModel& gpu) {
  double slot_s = 0, step_s = 0;
  for (int s = 0; s < x.pp; ++s) {
    const StageOpSeconds o = stage_op_seconds(cfg, x, s, w, gpu);
    slot_s = std::max(slot_s, o.forward + o.backward);
    step_s = std::max(step_s, step_op_seconds(cfg, x, s, w, gpu));
  }
  // the norm's all-reduces of one float, each on its group's link (tp, pp, dp: group_links)
  const GroupLinks links = group_links(c, x);
  if (norm_over_tp(x)) step_s += links.tp.seconds("all_reduce", kF32Bytes, x.tp);
  if (norm_over_pp(x)) step_s += links.pp.seconds("all_reduce", kF32Bytes, x.pp);
  if (norm_over_dp(x)) step_s += links.dp.seconds("all_reduce", kF32Bytes, x.dp);
  Workload priced = w;
  priced.uniform_compute_ms = 1e3 * slot_s / 3;  // step_time's slot: a forward u and a backward 2 u
  Cluster bare = c;
  bare.memory_bandwidth_bytes_per_s = 0;  // the optimizer: step_op_seconds instead
  StepTime t = step_time(cfg, x, priced, bare);
  const double old_step_ms = t.step_ms;
  t.optimizer_ms = 1e3 * step_s;
  t.step_ms += t.optimizer_ms;
  t.tokens_per_s *= old_step_ms / t.step_ms;  // the same tokens in the longer step
  t.mfu *= old_step_ms / t.step_ms;
  t.hfu *= old_step_ms / t.step_ms;
  return t;
}

DeviceMemory device_memory(const GPTConfig& cfg, const Layout& x, const Workload& w) {
  DeviceMemory fullest;
  const Workload local = cp_local_workload(x, w);  // cp > 1: one cp rank's T / cp tokens
  for (int s = 0; s < x.pp; ++s) {
    const DeviceMemory d = offload_memory(stage_memory(cfg, x, s, local), w);
    if (s == 0 || d.total() > fullest.total()) fullest = d;
  }
  return fullest;
}

DeviceMemory offload_memory(DeviceMemory m, const Workload& w) {
  if (w.offload_optimizer) m.state.optimizer_state = 0;  // estimate_memory(..., offload_optimizer): on the host
  return m;
}

OffloadStep offload_step(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w, const Cluster& c) {
  SL_CHECK_HINT(c.host_link_bytes_per_s > 0 && c.host_memory_bytes_per_s > 0,
                "e.g. the simulated H100's 50e9 and 50e9 (Cluster's defaults)",
                "offload needs the host link's and the host memory's bandwidth > 0 (got %g and %g bytes/s)",
                c.host_link_bytes_per_s, c.host_memory_bytes_per_s);
  const int64_t Bp = static_cast<int64_t>(dtype_size(w.policy.param_dtype));
  const int64_t Bg = static_cast<int64_t>(dtype_size(w.policy.grad_dtype));
  struct Unit {
    int64_t shard;
    bool kept;
  };
  std::vector<Unit> kept, blocks;  // lab 04's order: the units kept gathered first
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard sh = chunk_shard(cfg, x, stage, chunk);
    const std::vector<int64_t> numel = gpt2_unit_numel(cfg, sh);
    for (size_t u = 0; u < numel.size(); ++u) {
      if (numel[u] == 0) continue;
      const int64_t n = w.lora_rank > 0 ? 0 : numel[u];
      const int64_t shard = x.zero_stage >= 1 ? (n + x.dp - 1) / x.dp : n;
      const bool block = u >= 1 && u + 1 < numel.size();
      (x.zero_stage == 3 && block ? blocks : kept).push_back({shard, !(x.zero_stage == 3 && block)});
    }
  }
  if (w.lora_rank > 0) {  // the adapters only: one unit of them, kept
    kept.clear();
    blocks.clear();
    int64_t n = 0;
    for (int chunk = 0; chunk < x.chunks; ++chunk) n += lora_adapter_numel(cfg, chunk_shard(cfg, x, stage, chunk), w.lora_rank);
    kept.push_back({n, true});
  }
  kept.insert(kept.end(), blocks.begin(), blocks.end());
  OffloadStep r;
  double down_end = 0, host = 0, up_free = 0;
  std::vector<double> down_ends;
  for (const Unit& u : kept) {  // every gradient down at once, one after another on the copy stream
    down_end += c.host_copy_launch_s + static_cast<double>(u.shard * Bg) / c.host_link_bytes_per_s;
    down_ends.push_back(down_end);
    r.down_bytes += u.shard * Bg;
  }
  for (size_t i = 0; i < kept.size(); ++i) {
    const Unit& u = kept[i];
    double bytes = w.optimizer == OptimizerConfig::Kind::AdamW ? op_cost::adamw_update(u.shard).bytes
                                                               : op_cost::sgd_update(u.shard).bytes;
    if (Bp != 4) bytes += op_cost::cast(u.shard, w.policy.param_dtype, DType::F32).bytes;  // rounded for its trip up
    const double update_s = bytes / c.host_memory_bytes_per_s;
    host = std::max(host, down_ends[i]) + update_s;  // the host waits for this unit's gradient, then updates
    r.host_s += update_s;
    const double up_end = std::max(host, up_free) + c.host_copy_launch_s +
                          static_cast<double>(u.shard * Bp) / c.host_link_bytes_per_s;
    up_free = up_end;
    r.up_bytes += u.shard * Bp;
    if (u.kept) host = up_end;  // needed now: its all-gather follows
  }
  r.step_s = host;
  return r;
}

StepTime with_offload(const StepTime& t, const GPTConfig& cfg, const Layout& x, const Workload& w,
                      const Cluster& c) {
  if (!w.offload_optimizer) return t;
  double slowest_s = 0;
  for (int s = 0; s < x.pp; ++s) slowest_s = std::max(slowest_s, offload_step(cfg, x, s, w, c).step_s);
  StepTime r = t;
  r.optimizer_ms = 1e3 * slowest_s;
  r.step_ms = t.step_ms - t.optimizer_ms + r.optimizer_ms;
  const double speed = t.step_ms / r.step_ms;  // tokens/s, MFU and HFU scale with the step
  r.tokens_per_s = t.tokens_per_s * speed;
  r.mfu = t.mfu * speed;
  r.hfu = t.hfu * speed;
  return r;
}

// =============================================================================================
// A plan's rows: one candidate predicted or refused, and the rows ranked (planner.h, "Given")
// =============================================================================================
Candidate evaluate_candidate(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  Candidate row;
  row.layout = x;
  try {
    check_layout(cfg, x, w, c);
    row.memory = device_memory(cfg, x, w);
    row.time = cp_step_time(cfg, x, w, c);  // cp 1: step_time itself
    row.why_not = memory_refusal(row.memory, c);
    row.fits = row.why_not.empty();
  } catch (const NotImplemented&) {
    throw;  // a TODO of this lab: not a refusal
  } catch (const Error& e) {
    row.why_not = refusal_text(e);
  }
  return row;
}

void rank_candidates(std::vector<Candidate>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return false;  // the refused rows keep their order
    if (a.time.tokens_per_s != b.time.tokens_per_s) return a.time.tokens_per_s > b.time.tokens_per_s;
    return a.memory.total() < b.memory.total();
  });
}

std::string explain(const Candidate& c, const Cluster& cluster) {
  const Layout& x = c.layout;
  // "tp 4 inside a node (nvlink)", or "tp 1" for a group of one (nothing to communicate)
  auto group = [&](const char* name, int size, int extent) {
    std::string g = std::string(name) + " " + std::to_string(size);
    if (size > 1) {
      const bool inside = extent <= cluster.devices_per_node;
      const std::string& link = (inside ? cluster.intra : cluster.inter).name;
      g += (inside ? " inside a node (" : " across nodes (") + (link == "none" ? "no link model" : link) + ")";
    }
    return g;
  };
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "%s%s, %s, %s on top; micro-batch %d x %d per replica%s%s, ZeRO %d, recompute %s: %.4g tokens/s "
                "predicted (step %.4g ms, bubble %.1f%%, dp %.1f%%), MFU %.1f%%, %.2f GB a device (stage %d)",
                group("tp", x.tp, x.tp).c_str(), x.cp > 1 ? (", " + group("cp", x.cp, x.tp * x.cp)).c_str() : "",
                group("pp", x.pp, x.devices()).c_str(), group("dp", x.dp, x.tp * x.cp * x.dp).c_str(), x.micro_batch,
                x.micro_batches, x.chunks > 1 ? (", interleaved v " + std::to_string(x.chunks)).c_str() : "",
                x.sequence_parallel ? ", sequence parallel" : "", x.zero_stage, recompute_name(x.recompute),
                c.time.tokens_per_s, c.time.step_ms, 100.0 * c.time.bubble_ms / c.time.step_ms,
                100.0 * c.time.dp_ms / c.time.step_ms, 100.0 * c.time.mfu, c.memory.total() / 1e9, c.memory.stage);
  return buf;
}

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
