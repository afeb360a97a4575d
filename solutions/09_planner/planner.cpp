// planner.cpp — lab 09: the planner. Memory per device and predicted step time of a tp x pp x dp layout,
// and the layouts of a cluster ranked by them. Declared in labs/09_planner/planner.h; the lesson is
// labs/09_planner/README.md. Only the code between TODO(lab09-N) BEGIN/END is yours to write. What these
// functions call besides (the layout's checks, shards and links, the words of a plan) is given once, in
// labs/09_planner/layouts.cpp, and compiled into both tracks.
#include "planner.h"

#include <algorithm>  // defines: std::max, std::min, std::stable_sort
#include <cstdint>    // defines: int64_t
#include <vector>     // defines: std::vector

#include "scalelab/core/error.h"   // defines: SL_CHECK_HINT, scalelab::Error, scalelab::NotImplemented
#include "scalelab/core/tensor.h"  // defines: dtype_size
#include "train_step.h"            // defines: lab01::flops_per_token, lab01::mfu (lab 01's reference)

namespace scalelab::lab09 {

inline namespace SL_TRACK_LAB09 {

// =============================================================================================
// Memory
// =============================================================================================
int activation_sets(const Layout& x, int stage) {
  // TODO(lab09-1) BEGIN  the sets a stage holds at its peak, for each schedule
  const int p = x.pp, m = x.micro_batches, v = x.chunks;
  switch (x.schedule) {
    case lab06::ScheduleKind::GPipe: return m;                          // every forward before any backward
    case lab06::ScheduleKind::OneFOneB: return std::min(m, p - stage);  // the warm-up's forwards, then one in one out
    case lab06::ScheduleKind::Interleaved: return std::min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v);
    case lab06::ScheduleKind::ZbH1: return std::min(m, p);  // 1F1B's p - s, plus s awaiting their W (at most)
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
    d.activations += gpt2_activation_bytes(cfg, s, x.micro_batch, w.seq_len, chunk_sets(x, d.sets, chunk), x.recompute,
                                           w.attention, w.policy.activation_dtype);
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
  // BT: the token rows of a micro-batch; act: the bytes of one (B, T, C) activation
  [[maybe_unused]] const int64_t BT = int64_t{x.micro_batch} * w.seq_len, act = BT * cfg.n_embd * w.activation_bytes;
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
    // the activation forward unless the last virtual stage, its gradient back unless the first: 1/tp of it
    // a rank under sequence parallelism, or under Megatron's scatter/gather, which all-gathers it on arrival
    const int sends = (s.has_head ? 0 : 1) + (s.has_embedding ? 0 : 1);
    const bool scatter_gather = w.pp_scatter_gather && n > 1 && !x.sequence_parallel;
    const int64_t boundary = x.sequence_parallel || scatter_gather ? act / n : act;
    c.pp_s += sends * links.pp.seconds("send", boundary, 2);
    if (scatter_gather) c.pp_s += sends * tl.seconds("all_gather", boundary, n);
  }
  // TODO(lab09-4) END
  return c;
}

double dp_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  double t = 0;
  [[maybe_unused]] const int n = x.dp;
  // bytes an element on the wire: Br of the gradients, Bp of the parameters
  [[maybe_unused]] const int64_t Br = dtype_size(w.policy.reduce_dtype), Bp = dtype_size(w.policy.param_dtype);
  // TODO(lab09-4) BEGIN  after the last backward: dp's sync per the ZeRO stage, wte's, sp's layernorms'
  const LinkModel& dl = links.dp;
  const double m = x.micro_batches;
  for (int chunk = 0; chunk < x.chunks; ++chunk) {
    const ModelShard s = chunk_shard(cfg, x, stage, chunk);
    for (int64_t numel : gpt2_unit_numel(cfg, s)) {  // one call per unit, as labs 04 and 07 sync (FSDP: per block)
      if (numel == 0) continue;                      // a unit this chunk does not hold
      if (w.lora_rank > 0) {                         // only the adapters train: one all-reduce of all of them
        numel = lora_adapter_numel(cfg, s, w.lora_rank);
        t += dl.seconds("all_reduce", numel * Br, n);
        break;
      }
      const int64_t shard = (numel + n - 1) / n;  // ZeRO pads each unit to n equal shards (lab 04)
      switch (x.zero_stage) {
        case 0: t += dl.seconds("all_reduce", numel * Br, n); break;
        case 1: t += dl.seconds("reduce_scatter", n * shard * Br, n) + dl.seconds("all_gather", shard * Bp, n); break;
        case 2:
          t += m * dl.seconds("reduce_scatter", n * shard * Br, n) + dl.seconds("all_gather", shard * Bp, n);
          break;
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
  // ZB-H1 (lab 06 "Zero bubble"): (p - 1)(T_F + T_B - T_W) with I = W = half the backward, a third of a slot each
  const double bubble_slots = x.schedule == lab06::ScheduleKind::ZbH1 ? (x.pp - 1.0) / 3 : (x.pp - 1.0) / x.chunks;
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
  t.hfu = lab01::mfu(t.tokens_per_s, model + recompute_flops_per_token(cfg, w.seq_len, x.recompute), c.peak_flops_per_s,
                     x.devices());
  // TODO(lab09-5) END
  return t;
}

// =============================================================================================
// The plan
// =============================================================================================
std::vector<Candidate> plan(const GPTConfig& cfg, const Workload& w, const Cluster& c) {
  check_plan_inputs(cfg, w, c);  // given (layouts.cpp): a model, a cluster with compute, a batch
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
