// cp_terms.cpp — lab 09's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the planner's context-parallel axis (lab 10's ring attention over cp ranks), priced
// around the learner's functions. Declared under "Context parallelism" in labs/09_planner/planner.h; the
// lesson is docs/context_parallel.md, "The planner's cp axis". It calls the TODO functions of its own track
// (stage_flops, stage_comm, step_time, plan): yours in labs/09_planner/planner.cpp, the reference's in
// solutions/09_planner/planner.cpp.
#include <algorithm>  // defines: std::max
#include <cstdint>    // defines: int64_t
#include <vector>     // defines: std::vector

#include "planner.h"
#include "scalelab/core/error.h"   // defines: SL_CHECK_HINT
#include "scalelab/core/tensor.h"  // defines: dtype_size
#include "train_step.h"            // defines: lab01::flops_per_token, lab01::mfu (lab 01's reference)

namespace scalelab::lab09 {

inline namespace SL_TRACK_LAB09 {

void check_context_parallel(const Layout& x, const Workload& w) {
  if (x.cp == 1) return;
  SL_CHECK_HINT(w.seq_len % (2 * x.cp) == 0,
                "the zig-zag cuts every sequence into 2 cp equal chunks: a T that is a multiple of 2 cp",
                "cp %d with T %d (not a multiple of %d)", x.cp, w.seq_len, 2 * x.cp);
  SL_CHECK_HINT(w.attention == AttentionImpl::Flash,
                "context parallelism runs the flash attention, as lab 10's shards do: --attention flash",
                "cp %d with the materialized (T x T) attention", x.cp);
  SL_CHECK_HINT(!x.sequence_parallel, "sequence parallelism and cp both split the sequence: one of them",
                "cp %d with sequence parallelism", x.cp);
  SL_CHECK_HINT(w.lora_rank == 0, "the planner's cp rows train the whole model, as lab 10 does: no --lora",
                "cp %d with LoRA rank %d", x.cp, w.lora_rank);
  SL_CHECK_HINT(w.uniform_compute_ms == 0,
                "the ring's overlap needs the attention's own time: price compute by FLOPs (no --uniform-compute-ms)",
                "cp %d with a uniform compute of %g ms", x.cp, w.uniform_compute_ms);
}

Workload cp_local_workload(const Layout& x, const Workload& w) {
  Workload local = w;
  local.seq_len = w.seq_len / std::max(1, x.cp);
  return local;
}

double cp_attention_share(int cp, int T, bool zigzag) {
  const int pieces = zigzag ? 2 * cp : cp;
  SL_CHECK_HINT(cp >= 1 && T >= pieces && T % pieces == 0, "T splits into cp (2 cp with the zig-zag) equal chunks",
                "cp %d, T %d%s", cp, T, zigzag ? ", zig-zag" : "");
  const int64_t c = T / pieces;
  // Chunk i against chunk j (i, j of `pieces`, each c tokens): all c^2 pairs when j < i, the triangle
  // c (c + 1) / 2 when j == i, none when j > i: lab 10's visible_pairs by absolute positions.
  auto chunk_pairs = [&](int64_t i) { return i * c * c + c * (c + 1) / 2; };
  int64_t busiest = 0;
  for (int r = 0; r < cp; ++r)
    busiest = std::max(busiest, zigzag ? chunk_pairs(r) + chunk_pairs(2 * cp - 1 - r) : chunk_pairs(r));
  const int64_t all = static_cast<int64_t>(T) * (T + 1) / 2;
  return static_cast<double>(busiest) / static_cast<double>(all);
}

CpSlot cp_slot_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w,
                       const Cluster& c) {
  CpSlot s;
  if (x.cp == 1) return s;
  const int cp = x.cp;
  const double B = x.micro_batch, T = w.seq_len, Tl = T / cp, C = cfg.n_embd, F = c.flops_per_s();
  int blocks = 0;
  for (int chunk = 0; chunk < x.chunks; ++chunk) blocks += shard_blocks(cfg, chunk_shard(cfg, x, stage, chunk));
  // Lab 01's attention FLOPs (4 T C a token, the whole T x T square) of one block's forward on this rank: its
  // share of the sequence's pairs; your terms at T / cp counted B Tl 4 Tl C of it.
  const double share = cp_attention_share(cp, w.seq_len, /*zigzag=*/true);
  const double attention_fwd = B * 4.0 * C / x.tp * T * T * share, at_local = B * 4.0 * C / x.tp * Tl * Tl;
  const double passes = 3.0 + (x.recompute == Recompute::None ? 0.0 : 1.0);  // forward, backward 2x, recompute
  s.attention_s = blocks * passes * (attention_fwd - at_local) / F;
  // The ring, one layer: each of the cp steps computes about 1/cp of the rank's blocks (the zig-zag evens
  // them) while the next kv block travels; the backward's dkv travels after its step, waited for.
  const int64_t kv_bytes = static_cast<int64_t>(x.micro_batch) * (w.seq_len / cp) * 2 * cfg.n_embd / x.tp *
                           w.activation_bytes;
  const double hop = links.cp.seconds("send", kv_bytes, 2);
  const double fwd_step = attention_fwd / F / cp, bwd_step = 2 * fwd_step;
  const double forward = (cp - 1) * std::max(0.0, hop - fwd_step);
  const double backward = (cp - 1) * std::max(0.0, hop - bwd_step) + cp * hop;
  s.ring_s = blocks * (forward * (x.recompute == Recompute::Full ? 2.0 : 1.0) + backward);
  return s;
}

double cp_grad_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  if (x.cp == 1) return 0;
  const int64_t Br = dtype_size(w.policy.reduce_dtype);
  double t = 0;
  for (int chunk = 0; chunk < x.chunks; ++chunk)
    for (int64_t numel : gpt2_unit_numel(cfg, chunk_shard(cfg, x, stage, chunk)))
      if (numel > 0) t += links.cp.seconds("all_reduce", numel * Br, x.cp);
  return t;
}

StepTime cp_step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  if (x.cp == 1) return step_time(cfg, x, w, c);
  const Workload local = cp_local_workload(x, w);
  StepTime t = step_time(cfg, x, local, c);  // yours: one cp rank's T / cp tokens, as if they were whole sequences
  const GroupLinks links = group_links(c, x);
  const double bubble_slots = t.slot_ms > 0 ? t.bubble_ms / t.slot_ms : 0;  // your schedule's, in slots
  double slot_s = 0, grads_s = 0;
  for (int s = 0; s < x.pp; ++s) {
    const StageFlops f = stage_flops(cfg, x, s, local);
    const StageComm cm = stage_comm(cfg, x, s, links, local);
    const CpSlot extra = cp_slot_seconds(cfg, x, s, links, w, c);
    const double compute_s = f.total() / c.flops_per_s() + extra.attention_s;
    const double stage_slot = compute_s + cm.tp_s + cm.pp_s + extra.ring_s;
    if (s == 0 || stage_slot > slot_s) {
      slot_s = stage_slot;
      t.slowest_stage = s;
      t.compute_ms = 1e3 * compute_s;
      t.tp_ms = 1e3 * cm.tp_s;
      t.pp_ms = 1e3 * cm.pp_s;
      t.cp_ms = 1e3 * extra.ring_s;
    }
    grads_s = std::max(grads_s, cp_grad_seconds(cfg, x, s, links, w));
  }
  t.slot_ms = 1e3 * slot_s;
  t.bubble_ms = bubble_slots * t.slot_ms;
  t.pipeline_ms = x.micro_batches * t.slot_ms + t.bubble_ms;
  // the gradients averaged over cp after dp's sync (lab 10's train_step), and the loss's average over cp
  t.dp_ms += 1e3 * (grads_s + links.cp.seconds("all_reduce", 4, x.cp));
  t.step_ms = t.pipeline_ms + t.dp_ms + t.optimizer_ms;
  const int64_t tokens = static_cast<int64_t>(x.dp) * x.micro_batches * x.micro_batch * w.seq_len;
  t.tokens_per_s = tokens / (t.step_ms / 1e3);
  const double model = lab01::flops_per_token(cfg, w.seq_len);
  t.mfu = lab01::mfu(t.tokens_per_s, model, c.peak_flops_per_s, x.devices());
  t.hfu = lab01::mfu(t.tokens_per_s, model + recompute_flops_per_token(cfg, w.seq_len, x.recompute), c.peak_flops_per_s,
                     x.devices());
  return t;
}

std::vector<Candidate> plan_with_cp(const GPTConfig& cfg, const Workload& w, const Cluster& c, int max_cp) {
  SL_CHECK_HINT(max_cp >= 1, "--max-cp is 1 (no context parallelism) or more", "max cp %d", max_cp);
  std::vector<Candidate> rows = plan(cfg, w, c);  // cp 1: yours
  for (int cp = 2; cp <= max_cp && cp <= c.devices; cp *= 2) {
    if (c.devices % cp) continue;
    Cluster rest = c;  // the tp x pp x dp splits of devices / cp: your plan enumerates them
    rest.devices = c.devices / cp;
    Layout split;
    split.cp = cp;
    Workload local = cp_local_workload(split, w);
    local.seq_len = std::max(1, local.seq_len);
    for (const Candidate& split_row : plan(cfg, local, rest)) {
      Layout x = split_row.layout;
      x.cp = cp;
      rows.push_back(evaluate_candidate(cfg, x, w, c));  // on the whole cluster and sequence; a refusal kept
    }
  }
  rank_candidates(rows);
  return rows;
}

LongestSequence longest_sequence(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c,
                                 int max_seq_len) {
  const int step = 2 * x.cp;  // T: a multiple of the zig-zag's 2 cp chunks (cp 1: of 2)
  auto at = [&](int T) {      // the layout's memory at T, the position embedding grown to T
    GPTConfig grown = cfg;
    grown.max_seq_len = T;
    Workload wt = w;
    wt.seq_len = T;
    check_layout(grown, x, wt, c);
    return device_memory(grown, x, wt);
  };
  LongestSequence best;
  const DeviceMemory first = at(step);
  if (static_cast<double>(first.total()) > c.memory_bytes) return best;
  best = {step, first};
  int64_t lo = 1, hi = std::max(1, max_seq_len / step);  // in units of `step`: lo fits; find the last that does
  if (hi <= lo) return best;
  const DeviceMemory top = at(static_cast<int>(hi * step));
  if (static_cast<double>(top.total()) <= c.memory_bytes) return {static_cast<int>(hi * step), top};
  while (hi - lo > 1) {  // memory grows with T: bisect between a fitting lo and a refused hi
    const int64_t mid = (lo + hi) / 2;
    const DeviceMemory m = at(static_cast<int>(mid * step));
    if (static_cast<double>(m.total()) <= c.memory_bytes) {
      lo = mid;
      best = {static_cast<int>(mid * step), m};
    } else {
      hi = mid;
    }
  }
  return best;
}

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
