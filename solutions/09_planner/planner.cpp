// planner.cpp — lab 09: the planner. Memory per device and predicted step time of a tp x pp x dp layout,
// and the layouts of a cluster ranked by them. Declared in labs/09_planner/planner.h; the lesson is
// labs/09_planner/README.md. Only the code between TODO(lab09-N) BEGIN/END is yours to write; the rest is
// shared by both tracks (labs/09_planner/planner.cpp and solutions/09_planner/planner.cpp).
#include "planner.h"

#include <algorithm>  // defines: std::max, std::min, std::stable_sort
#include <cstdio>     // defines: std::snprintf
#include <string>     // defines: std::to_string

#include "scalelab/core/error.h"   // defines: SL_CHECK_HINT, scalelab::Error, scalelab::NotImplemented
#include "scalelab/core/tensor.h"  // defines: dtype_size
#include "train_step.h"            // defines: lab01::flops_per_token, lab01::mfu (lab 01's reference)

namespace scalelab::lab09 {

inline namespace SL_TRACK_LAB09 {

namespace {

// Elements of every parameter the shard holds.
[[maybe_unused]] int64_t shard_numel(const GPTConfig& cfg, const ModelShard& s) {
  int64_t n = 0;
  for (int64_t u : gpt2_unit_numel(cfg, s)) n += u;
  return n;
}

int shard_blocks(const GPTConfig& cfg, const ModelShard& s) { return s.last(cfg) - s.first_layer + 1; }

}  // namespace

// =============================================================================================
// Given: the layout's checks, shards and links
// =============================================================================================
std::string to_string(const Layout& x) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "tp %d pp %d dp %d | B %d x m %d | %s%s | zero %d%s | recompute %s", x.tp, x.pp,
                x.dp, x.micro_batch, x.micro_batches, lab06::schedule_name(x.schedule),
                x.chunks > 1 ? (" v " + std::to_string(x.chunks)).c_str() : "", x.zero_stage,
                x.sequence_parallel ? " | sp" : "", recompute_name(x.recompute));
  return buf;
}

std::string to_string(const Cluster& c) {
  char buf[220];
  std::snprintf(buf, sizeof buf, "%d devices, %d a node, %.1f GB each, %.4g TFLOP/s x %.2f; links %s inside a "
                "node, %s across", c.devices, c.devices_per_node, c.memory_bytes / 1e9, c.peak_flops_per_s / 1e12,
                c.efficiency, c.intra.name.c_str(), c.inter.name.c_str());
  return buf;
}

void check_layout(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  cfg.validate();
  SL_CHECK_HINT(x.tp >= 1 && x.pp >= 1 && x.dp >= 1 && x.micro_batch >= 1 && x.micro_batches >= 1 && x.chunks >= 1,
                "tp, pp, dp, the micro-batch B, the micro-batches m and the chunks v are 1 or more",
                "layout %s has a size below 1", to_string(x).c_str());
  SL_CHECK_HINT(x.devices() == c.devices, "a layout uses every device of the cluster: tp x pp x dp = devices",
                "tp %d x pp %d x dp %d = %d devices, the cluster has %d", x.tp, x.pp, x.dp, x.devices(), c.devices);
  SL_CHECK_HINT(static_cast<int64_t>(x.dp) * x.micro_batch * x.micro_batches == w.global_batch,
                "every replica runs m micro-batches of B sequences: dp x B x m = the global batch",
                "dp %d x B %d x m %d != global batch %d", x.dp, x.micro_batch, x.micro_batches, w.global_batch);
  SL_CHECK_HINT(x.zero_stage >= 0 && x.zero_stage <= 3, "ZeRO stages are 0 (DDP), 1, 2 and 3",
                "ZeRO stage %d", x.zero_stage);
  SL_CHECK_HINT(w.seq_len >= 1 && w.seq_len <= cfg.max_seq_len,
                "T is at most the model's position embeddings (maxT): a longer maxT, or a shorter T",
                "T %d with maxT %d", w.seq_len, cfg.max_seq_len);
  SL_CHECK_HINT(!x.sequence_parallel || (x.tp > 1 && static_cast<int64_t>(x.micro_batch) * w.seq_len % x.tp == 0),
                "sequence parallelism splits the B*T token rows over the tp group: tp > 1 dividing B*T",
                "sequence parallel with tp %d and B*T %d", x.tp, x.micro_batch * w.seq_len);
  SL_CHECK_HINT(w.lora_rank == 0 || (x.tp == 1 && x.pp == 1 && x.zero_stage == 0),
                "the planner's LoRA fine-tune replicates the frozen base on every device: tp 1, pp 1, ZeRO 0",
                "LoRA rank %d with %s", w.lora_rank, to_string(x).c_str());
  lab06::make_layout(cfg, x.pp, 0, x.schedule, x.micro_batches, x.chunks);  // lab 06's rules of the partition
  chunk_shard(cfg, x, 0, 0).validate(cfg);                                   // the tp split of the model
}

ModelShard chunk_shard(const GPTConfig& cfg, const Layout& x, int stage, int chunk) {
  const lab06::PipelineLayout pl = lab06::make_layout(cfg, x.pp, stage, x.schedule, x.micro_batches, x.chunks);
  ModelShard s = lab06::chunk_shard(cfg, pl, chunk);
  s.tp_size = x.tp;
  s.sequence_parallel = x.sequence_parallel;
  s.validate(cfg);
  return s;
}

GroupLinks group_links(const Cluster& c, const Layout& x) {
  auto link = [&](int extent) { return extent <= c.devices_per_node ? c.intra : c.inter; };
  return {link(x.tp), /*pp=*/link(x.devices()), /*dp=*/link(x.tp * x.dp)};
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

DeviceMemory device_memory(const GPTConfig& cfg, const Layout& x, const Workload& w) {
  DeviceMemory fullest;
  for (int s = 0; s < x.pp; ++s) {
    const DeviceMemory d = stage_memory(cfg, x, s, w);
    if (s == 0 || d.total() > fullest.total()) fullest = d;
  }
  return fullest;
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
                "%s, %s, %s on top; micro-batch %d x %d per replica%s%s, ZeRO %d, recompute %s: %.4g tokens/s "
                "predicted (step %.4g ms, bubble %.1f%%, dp %.1f%%), MFU %.1f%%, %.2f GB a device (stage %d)",
                group("tp", x.tp, x.tp).c_str(), group("pp", x.pp, x.devices()).c_str(),
                group("dp", x.dp, x.tp * x.dp).c_str(), x.micro_batch, x.micro_batches,
                x.chunks > 1 ? (", interleaved v " + std::to_string(x.chunks)).c_str() : "",
                x.sequence_parallel ? ", sequence parallel" : "", x.zero_stage, recompute_name(x.recompute),
                c.time.tokens_per_s, c.time.step_ms, 100.0 * c.time.bubble_ms / c.time.step_ms,
                100.0 * c.time.dp_ms / c.time.step_ms, 100.0 * c.time.mfu, c.memory.total() / 1e9, c.memory.stage);
  return buf;
}

// =============================================================================================
// Memory
// =============================================================================================
int activation_sets(const Layout& x, int stage) {
  // TODO(lab09-1) BEGIN  the sets a stage holds at its peak, for each schedule
  const int p = x.pp, m = x.micro_batches, v = x.chunks;
  switch (x.schedule) {
    case lab06::ScheduleKind::GPipe: return m;                           // every forward before any backward
    case lab06::ScheduleKind::OneFOneB: return std::min(m, p - stage);  // the warm-up's forwards, then one in one out
    case lab06::ScheduleKind::Interleaved: return std::min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v);
  }
  // TODO(lab09-1) END
  return 0;
}

DeviceMemory stage_memory(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w) {
  DeviceMemory d;
  d.stage = stage;
  // TODO(lab09-2) BEGIN  this stage's model state and activations, chunk by chunk
  d.sets = activation_sets(x, stage);
  const int64_t Bp = static_cast<int64_t>(dtype_size(w.policy.param_dtype));
  const int64_t Bg = static_cast<int64_t>(dtype_size(w.policy.grad_dtype));
  const int64_t K = optimizer_bytes_per_param(w.policy, w.optimizer);
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard s = chunk_shard(cfg, x, stage, chunk);
    if (w.lora_rank > 0) {  // the frozen base, and the adapters with their gradients and optimizer state
      const int64_t adapters = lora_adapter_numel(cfg, s, w.lora_rank);
      d.state.params += (shard_numel(cfg, s) + adapters) * Bp;
      d.state.grads += adapters * Bg;
      d.state.optimizer_state += adapters * K;
    } else {
      const ModelStateBytes peak =
          estimate_model_state(cfg, s, x.dp, x.zero_stage, w.policy, w.optimizer, w.prefetch).peak;
      d.state.params += peak.params;
      d.state.grads += peak.grads;
      d.state.optimizer_state += peak.optimizer_state;
    }
    d.activations += gpt2_activation_bytes(cfg, s, x.micro_batch, w.seq_len, chunk_sets(x, d.sets, chunk),
                                           x.recompute, w.attention);
  }
  // TODO(lab09-2) END
  return d;
}

// =============================================================================================
// Time
// =============================================================================================
StageFlops stage_flops(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w) {
  StageFlops f;
  // TODO(lab09-3) BEGIN  one micro-batch's forward, backward and recompute FLOPs on one device of the stage
  const double BT = static_cast<double>(x.micro_batch) * w.seq_len, T = w.seq_len, C = cfg.n_embd;
  const double V = cfg.vocab_size, tp = x.tp;
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard s = chunk_shard(cfg, x, stage, chunk);
    const int blocks = shard_blocks(cfg, s);
    const double fwd = blocks * BT * (24.0 * C * C + 4.0 * T * C) / tp + (s.has_head ? BT * 2.0 * C * V / tp : 0.0);
    f.forward += fwd;
    f.backward += (w.lora_rank > 0 ? 1.0 : 2.0) * fwd;  // LoRA: the inputs' gradients only
    f.recompute += blocks * BT * recompute_flops_per_token(cfg, w.seq_len, x.recompute) / cfg.n_layer / tp;
  }
  // TODO(lab09-3) END
  return f;
}

StageComm stage_comm(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  StageComm c;
  [[maybe_unused]] const int n = x.tp;
  [[maybe_unused]] const int64_t BT = static_cast<int64_t>(x.micro_batch) * w.seq_len;
  [[maybe_unused]] const int64_t act = BT * cfg.n_embd * w.activation_bytes;  // bytes of one (B, T, C) activation
  // TODO(lab09-4) BEGIN  tp and pp per micro-batch on one device of the stage
  const LinkModel& tl = links.tp;
  // one block's forward: 2 all-reduces (g after attention's and the MLP's row-parallel linear), or under
  // sequence parallelism an all-gather before each column-parallel region and a reduce-scatter after it; the
  // backward has the same again, full recompute the forward's once more
  const double block_fwd = x.sequence_parallel
                               ? 2.0 * (tl.seconds("all_gather", act / n, n) + tl.seconds("reduce_scatter", act, n))
                               : 2.0 * tl.seconds("all_reduce", act, n);
  const double block = block_fwd * (x.recompute == Recompute::Full ? 3.0 : 2.0);
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard s = chunk_shard(cfg, x, stage, chunk);
    c.tp_s += shard_blocks(cfg, s) * block;
    if (s.has_embedding)  // the vocabulary-parallel embedding's sum (sp: its reduce-scatter, and back)
      c.tp_s += x.sequence_parallel ? tl.seconds("reduce_scatter", act, n) + tl.seconds("all_gather", act / n, n)
                                    : tl.seconds("all_reduce", act, n);
    if (s.has_head)  // the head's f (sp: gather and back), cross-entropy's max and its two sums (one message)
      c.tp_s += (x.sequence_parallel ? tl.seconds("all_gather", act / n, n) + tl.seconds("reduce_scatter", act, n)
                                     : tl.seconds("all_reduce", act, n)) +
                tl.seconds("all_reduce", BT * 4, n) + tl.seconds("all_reduce", BT * 8, n);
    // the activation forward unless the last virtual stage, its gradient back unless the first
    const int64_t boundary = x.sequence_parallel ? act / n : act;
    c.pp_s += ((s.has_head ? 0 : 1) + (s.has_embedding ? 0 : 1)) * links.pp.seconds("send", boundary, 2);
  }
  // TODO(lab09-4) END
  return c;
}

double dp_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  double t = 0;
  [[maybe_unused]] const int n = x.dp;
  [[maybe_unused]] const int64_t Br = static_cast<int64_t>(dtype_size(w.policy.reduce_dtype));  // gradients on the wire
  [[maybe_unused]] const int64_t Bp = static_cast<int64_t>(dtype_size(w.policy.param_dtype));   // parameters on the wire
  // TODO(lab09-4) BEGIN  after the last backward: dp's sync per the ZeRO stage, wte's, sp's layernorms'
  const LinkModel& dl = links.dp;
  const double m = x.micro_batches;
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard s = chunk_shard(cfg, x, stage, chunk);
    for (int64_t numel : gpt2_unit_numel(cfg, s)) {  // one call per unit, as labs 04 and 07 sync (FSDP: per block)
      if (numel == 0) continue;  // a unit this chunk does not hold
      if (w.lora_rank > 0) {     // only the adapters train: one all-reduce of all of them
        numel = lora_adapter_numel(cfg, s, w.lora_rank);
        t += dl.seconds("all_reduce", numel * Br, n);
        break;
      }
      const int64_t shard = (numel + n - 1) / n;  // ZeRO pads each unit to n equal shards (lab 04)
      switch (x.zero_stage) {
        case 0: t += dl.seconds("all_reduce", numel * Br, n); break;
        case 1: t += dl.seconds("reduce_scatter", n * shard * Br, n) + dl.seconds("all_gather", shard * Bp, n); break;
        case 2: t += m * dl.seconds("reduce_scatter", n * shard * Br, n) + dl.seconds("all_gather", shard * Bp, n); break;
        default:  // gathered for every micro-batch's forward and backward, its gradient reduce-scattered
          t += m * (2.0 * dl.seconds("all_gather", shard * Bp, n) + dl.seconds("reduce_scatter", n * shard * Br, n));
      }
    }
    if (x.pp > 1 && (s.has_embedding || s.has_head))  // Megatron's tied wte: first and last stage sum its gradient
      t += links.pp.seconds("all_reduce", static_cast<int64_t>(cfg.vocab_size / x.tp) * cfg.n_embd * Br, 2);
    if (x.sequence_parallel)  // each layernorm weight and bias saw only this rank's rows: summed over tp (lab 05)
      t += (4 * shard_blocks(cfg, s) + (s.has_head ? 2 : 0)) * links.tp.seconds("all_reduce", cfg.n_embd * Br, x.tp);
  }
  // TODO(lab09-4) END
  return t;
}

StepTime step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  StepTime t;
  [[maybe_unused]] const GroupLinks links = group_links(c, x);
  [[maybe_unused]] const double F = c.flops_per_s();  // FLOP/s sustained
  // TODO(lab09-5) BEGIN  the slowest slot, the schedule and its bubble, dp, the optimizer; tokens/s, MFU, HFU
  double dp_s = 0, optimizer_bytes = 0;
  const int64_t Bp = static_cast<int64_t>(dtype_size(w.policy.param_dtype));
  const int64_t Bg = static_cast<int64_t>(dtype_size(w.policy.grad_dtype));
  const int64_t K = optimizer_bytes_per_param(w.policy, w.optimizer);
  for (int s = 0; s < x.pp; ++s) {
    const StageFlops f = stage_flops(cfg, x, s, w);
    const StageComm cm = stage_comm(cfg, x, s, links, w);
    const bool simulated = w.uniform_compute_ms > 0;  // a forward takes the given time, a backward twice
    const double fwd_s = simulated ? w.uniform_compute_ms / 1e3 : f.forward / F;
    const double bwd_s = simulated ? 2 * w.uniform_compute_ms / 1e3 : (f.backward + f.recompute) / F;
    const double slot_s = fwd_s + bwd_s + cm.tp_s + cm.pp_s;
    if (s == 0 || 1e3 * slot_s > t.slot_ms) {
      t.slowest_stage = s;
      t.compute_ms = 1e3 * (fwd_s + bwd_s);
      t.tp_ms = 1e3 * cm.tp_s;
      t.pp_ms = 1e3 * cm.pp_s;
      t.slot_ms = 1e3 * slot_s;
    }
    // dp: what this stage's group carries; with overlap, what outlasts the compute it runs beside (ZeRO-3's
    // gathers every forward and backward, ZeRO-2's reduce-scatters every backward, else the last backward)
    double stage_dp = dp_seconds(cfg, x, s, links, w);
    if (w.overlap_dp) {
      const double m = x.micro_batches;
      const double beside = x.zero_stage == 3 ? m * (fwd_s + bwd_s) : x.zero_stage == 2 ? m * bwd_s : bwd_s;
      stage_dp = std::max(0.0, stage_dp - beside);
    }
    dp_s = std::max(dp_s, stage_dp);
    // the optimizer: every parameter this device updates, weight read and written, gradient read twice (the
    // clipping norm, the update), optimizer state read and written
    double updated = 0;
    for (int chunk = 0; chunk < x.chunks; ++chunk) {
      const ModelShard sh = chunk_shard(cfg, x, s, chunk);
      updated += w.lora_rank > 0 ? lora_adapter_numel(cfg, sh, w.lora_rank) : shard_numel(cfg, sh);
    }
    if (x.zero_stage >= 1) updated /= x.dp;
    optimizer_bytes = std::max(optimizer_bytes, updated * (2 * Bp + 2 * Bg + 2 * K));
  }
  const double bubble_slots = (x.pp - 1.0) / x.chunks;
  t.pipeline_ms = (x.micro_batches + bubble_slots) * t.slot_ms;
  t.bubble_ms = bubble_slots * t.slot_ms;
  t.dp_ms = 1e3 * dp_s;
  t.optimizer_ms = c.memory_bandwidth_bytes_per_s > 0 ? 1e3 * optimizer_bytes / c.memory_bandwidth_bytes_per_s : 0;
  t.step_ms = t.pipeline_ms + t.dp_ms + t.optimizer_ms;
  const int64_t tokens = static_cast<int64_t>(x.dp) * x.micro_batches * x.micro_batch * w.seq_len;
  t.tokens_per_s = tokens / (t.step_ms / 1e3);
  // lab 01's model FLOPs (the whole model's, whatever the split); LoRA runs no weight gradients: 2/3 of them
  const double model = lab01::flops_per_token(cfg, w.seq_len) * (w.lora_rank > 0 ? 2.0 / 3.0 : 1.0);
  t.mfu = lab01::mfu(t.tokens_per_s, model, c.peak_flops_per_s, x.devices());
  t.hfu = lab01::mfu(t.tokens_per_s, model + recompute_flops_per_token(cfg, w.seq_len, x.recompute),
                     c.peak_flops_per_s, x.devices());
  // TODO(lab09-5) END
  return t;
}

// =============================================================================================
// The plan
// =============================================================================================
std::vector<Candidate> plan(const GPTConfig& cfg, const Workload& w, const Cluster& c) {
  cfg.validate();
  SL_CHECK_HINT(c.devices >= 1, "a cluster has 1 or more devices (--gpus N)", "a cluster of %d devices", c.devices);
  SL_CHECK_HINT(c.devices_per_node >= 1, "a node has 1 or more devices (--gpus-per-node N)", "%d devices per node",
                c.devices_per_node);
  SL_CHECK_HINT(c.flops_per_s() > 0, "give the devices' peak FLOP/s and an efficiency (--peak-tflops, --efficiency)",
                "peak %g FLOP/s x efficiency %g: a cluster with no compute", c.peak_flops_per_s, c.efficiency);
  SL_CHECK_HINT(w.global_batch >= 1 && w.seq_len >= 1, "the global batch and T are 1 or more (--global-batch, --seq-len)",
                "global batch %d, T %d", w.global_batch, w.seq_len);
  std::vector<Candidate> rows;
  // TODO(lab09-6) BEGIN  every layout, refused with its reason or predicted; the fitting ones first, fastest first
  for (int tp = 1; tp <= c.devices; ++tp) {
    if (c.devices % tp) continue;
    for (int pp = 1; pp <= c.devices / tp; ++pp) {
      if ((c.devices / tp) % pp) continue;
      const int dp = c.devices / (tp * pp);
      for (int B = 1; B <= w.global_batch; ++B) {
        if (w.global_batch % (static_cast<int64_t>(dp) * B)) continue;
        for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
          for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp)
            for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
              Candidate row;
              Layout& x = row.layout;
              x.tp = tp;
              x.pp = pp;
              x.dp = dp;
              x.micro_batch = B;
              x.micro_batches = w.global_batch / (dp * B);
              x.zero_stage = zero;
              x.sequence_parallel = sp == 1;
              x.recompute = r;
              try {
                check_layout(cfg, x, w, c);
                row.memory = device_memory(cfg, x, w);
                row.time = step_time(cfg, x, w, c);
                row.why_not = memory_refusal(row.memory, c);
                row.fits = row.why_not.empty();
              } catch (const NotImplemented&) {
                throw;  // a TODO of this lab: not a refusal
              } catch (const Error& e) {
                row.why_not = refusal_text(e);
              }
              rows.push_back(row);
            }
      }
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return false;
    if (a.time.tokens_per_s != b.time.tokens_per_s) return a.time.tokens_per_s > b.time.tokens_per_s;
    return a.memory.total() < b.memory.total();
  });
  // TODO(lab09-6) END
  return rows;
}

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
