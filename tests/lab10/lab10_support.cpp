// lab10_support.cpp — lab 10's shared check bodies (lab10_support.h).
#include "lab10_support.h"

#include <algorithm>  // defines: std::max, std::min, std::sort
#include <cmath>      // defines: std::fabs
#include <cstdio>     // defines: std::snprintf
#include <memory>
#include <string>  // defines: std::to_string
#include <utility>  // defines: std::move
#include <vector>

#include "grading.h"                  // defines: grading::all_ranks
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/clock.h"      // defines: clock_now_ms (virtual on the simulated cluster)
#include "scalelab/core/error.h"      // defines: scalelab::Error
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "sim_cluster.h"             // defines: test::SimulatedCluster, test::on_device

namespace scalelab::lab10_test {

using test::on_device;
using test::SimulatedCluster;

GPTConfig cp_config() { return GPTConfig{16, 64, 2, 4, 32}; }

static std::string on_rank_if(const std::string& s) { return s.empty() ? s : on_rank(s); }

// The cp group's mean of a float (each rank's own loss, or its work).
static float group_mean(Communicator& group, float x) {
  Tensor t = Tensor::empty({1});
  t.data<float>()[0] = x;
  group.all_reduce(t, ReduceOp::Avg, "check mean");
  return t.data<float>()[0];
}

std::string expect_gradients_match_dense(const std::string& variant, bool zigzag) {
  const GPTConfig cfg = cp_config();
  const int B = 2, T = 16;
  const GlobalBatch g = random_global_batch(kDataSeed, B, T, cfg.vocab_size);
  std::unique_ptr<GPT2> dense = make_model(cfg);
  const float want = one_process_gradients(*dense, g);

  std::unique_ptr<Communicator> comm = fresh_comm();
  const int cp = comm->size();
  const lab10::Layout layout = lab10::make_layout(cfg, cp, comm->rank(), 1, cp, zigzag, T);
  GPT2 model(cfg, lab10::shard_of(layout), PrecisionPolicy::fp32(), Device::CPU, kModelSeed);
  lab10::RingAttention ring(*comm, cfg, zigzag);
  lab10::AllGatherAttention gather(*comm, cfg, zigzag);
  if (variant == "ring") model.set_context_parallel(&ring);
  else model.set_context_parallel(&gather);
  const std::vector<CpChunk> chunks = cp_chunks(model.shard(), cfg, layout.T_local);
  const Tensor x = lab10::slice_sequence(g.inputs, chunks, layout.T_local);
  const Tensor y = lab10::slice_sequence(g.targets, chunks, layout.T_local);
  model.zero_grad();
  const float loss = group_mean(*comm, model.forward(x, &y));
  model.backward();
  for (int u = 0; u < model.num_units(); ++u) comm->all_reduce(model.unit_grads(u), ReduceOp::Avg, "check grads");

  std::string bad;
  double worst = 0;
  if (std::fabs(loss - want) > kRtol * std::fabs(want)) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "the group's mean loss %.7f, the dense model's %.7f", loss, want);
    bad = buf;
  }
  if (bad.empty()) bad = compare_with_dense_slices(model, *dense, /*grads=*/true, kRtol, 0, &worst);
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  char buf[200];
  std::snprintf(buf, sizeof(buf), "cp %d, %s, %s: loss %.6f as dense; every gradient within %.2g (relative)", cp,
                variant.c_str(), zigzag ? "zig-zag" : "contiguous", loss, worst);
  return bad.empty() ? buf : bad;
}

std::string expect_sgd_steps_match_dense(int tp, int cp, bool zigzag) {
  const GPTConfig cfg = cp_config();
  constexpr float kLr = 0.1f, kClip = 1.0f;
  constexpr int kB = 2, kT = 16;
  Communicator& w = world();
  const lab10::Layout layout = lab10::make_layout(cfg, w.size(), w.rank(), tp, cp, zigzag, kT);
  // The groups as the driver splits them (given: split_groups).
  lab10::Groups groups = lab10::split_groups(w, layout);
  std::unique_ptr<Communicator> tp_group = std::move(groups.tp), cp_group = std::move(groups.cp),
                                dp_group = std::move(groups.dp);
  OptimizerConfig sgd;
  sgd.kind = OptimizerConfig::Kind::SGD;
  sgd.weight_decay = 0.0f;
  std::unique_ptr<GPT2> dense = make_model(cfg);
  Optimizer dense_opt(*dense, sgd);
  GPT2 model(cfg, lab10::shard_of(layout), PrecisionPolicy::fp32(), Device::CPU, kModelSeed);
  lab10::RingAttention ring(*cp_group, cfg, zigzag);
  model.set_context_parallel(&ring);
  lab05::MegatronPoints points(*tp_group, /*sequence_parallel=*/false);  // lab 05's reference
  if (layout.tp > 1) model.set_tensor_parallel(&points);
  Optimizer opt(model, sgd);
  std::string bad;
  double worst = 0;
  float first_norm = 0;
  for (int step = 0; step < 3 && bad.empty(); ++step) {
    const GlobalBatch g = random_global_batch(kDataSeed + step, kB * layout.dp, kT, cfg.vocab_size);
    const OneProcessStep d = one_process_train_step(*dense, dense_opt, g, kLr, kClip);
    if (step == 0) first_norm = d.grad_norm;
    const GlobalBatch rows = batch_rows(g, static_cast<int64_t>(layout.dp_rank) * kB, kB);  // this replica's
    const StepResult r = lab10::train_step(model, opt, tp_group.get(), *cp_group, dp_group.get(),
                                           {MicroBatch{rows.inputs, rows.targets}}, kLr, kClip);
    const float loss = group_mean(*dp_group, r.loss);  // the replicas' mean: the global batch's
    char buf[200];
    if (std::fabs(loss - d.loss) > kRtol * std::fabs(d.loss)) {
      std::snprintf(buf, sizeof(buf), "step %d: the loss %.7f, the dense %.7f (lab10-6 train_step)", step, loss,
                    d.loss);
      bad = buf;
    } else if (std::fabs(r.grad_norm - d.grad_norm) > kRtol * d.grad_norm) {
      std::snprintf(buf, sizeof(buf), "step %d: the gradient norm %.7f, the dense %.7f (%.3fx; lab10-6 train_step)",
                    step, r.grad_norm, d.grad_norm, r.grad_norm / d.grad_norm);
      bad = buf;
    } else {
      bad = compare_with_dense_slices(model, *dense, /*grads=*/false, kRtol, 0, &worst);
      if (!bad.empty()) bad = "after step " + std::to_string(step) + ": " + bad;
    }
  }
  // With tp the check is of the whole-model norm: it must have clipped, or a shard's own norm would pass too.
  if (bad.empty() && tp > 1 && !(first_norm > kClip))
    bad = "the test's premise: the dense gradient norm " + std::to_string(first_norm) + " does not exceed the clip " +
          std::to_string(kClip) + " (the check must clip)";
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  char buf[240];
  std::snprintf(buf, sizeof(buf),
                "tp %d x cp %d x dp %d%s: 3 SGD steps (the first's norm %.3f clipped to %.1f), every parameter "
                "within %.2g (relative) of dense",
                layout.tp, cp, layout.dp, zigzag ? " (zig-zag)" : "", first_norm, kClip, worst);
  return bad.empty() ? buf : bad;
}

// Every rank's attention work of one forward (ring), gathered on every rank: [pairs, computed, skipped] x cp.
static std::vector<float> ring_work(Communicator& comm, bool zigzag) {
  const GPTConfig cfg = cp_config();
  const int cp = comm.size(), T = 16;
  const lab10::Layout layout = lab10::make_layout(cfg, cp, comm.rank(), 1, cp, zigzag, T);
  GPT2 model(cfg, lab10::shard_of(layout), PrecisionPolicy::fp32(), Device::CPU, kModelSeed);
  lab10::RingAttention ring(comm, cfg, zigzag);
  model.set_context_parallel(&ring);
  const GlobalBatch g = random_global_batch(kDataSeed, 1, T, cfg.vocab_size);
  const std::vector<CpChunk> chunks = cp_chunks(model.shard(), cfg, layout.T_local);
  model.forward(lab10::slice_sequence(g.inputs, chunks, layout.T_local), nullptr);  // one layer's work is kept
  Tensor mine = Tensor::empty({3}), all = Tensor::empty({3 * cp});
  mine.data<float>()[0] = static_cast<float>(ring.work().pairs);
  mine.data<float>()[1] = static_cast<float>(ring.work().blocks_computed);
  mine.data<float>()[2] = static_cast<float>(ring.work().blocks_skipped);
  comm.all_gather(mine, all, "check work");
  return {all.data<float>(), all.data<float>() + all.numel()};
}

std::string expect_zigzag_balances_work() {
  std::unique_ptr<Communicator> comm = fresh_comm();
  const int cp = comm->size();
  const std::vector<float> plain = ring_work(*comm, false), zig = ring_work(*comm, true);
  auto spread = [&](const std::vector<float>& w) {  // max / min of the ranks' pairs
    float lo = w[0], hi = w[0];
    for (int r = 0; r < cp; r++) lo = std::min(lo, w[3 * r]), hi = std::max(hi, w[3 * r]);
    return lo > 0 ? hi / lo : 1e9f;
  };
  std::string bad;
  char buf[240];
  const int Tl = 16 / cp;
  for (int r = 0; r < cp && bad.empty(); r++) {
    // contiguous: rank r sees r whole blocks and its diagonal; the cp-1-r later blocks are skipped
    const float want_pairs = static_cast<float>(r * Tl * Tl + Tl * (Tl + 1) / 2);
    if (plain[3 * r] != want_pairs || plain[3 * r + 1] != r + 1 || plain[3 * r + 2] != cp - 1 - r) {
      std::snprintf(buf, sizeof(buf),
                    "contiguous, rank %d: %.0f pairs in %.0f blocks, %.0f skipped; expected %.0f pairs in %d blocks, "
                    "%d skipped (lab10-2 visible_pairs, lab10-3 the skip)",
                    r, plain[3 * r], plain[3 * r + 1], plain[3 * r + 2], want_pairs, r + 1, cp - 1 - r);
      bad = buf;
    }
  }
  const float s_plain = spread(plain), s_zig = spread(zig);
  if (bad.empty() && !(s_zig <= 1.05f)) {
    std::snprintf(buf, sizeof(buf), "zig-zag: the busiest rank does %.3fx the least busy one's pairs (<= 1.05 wanted)",
                  s_zig);
    bad = buf;
  }
  if (bad.empty() && !(s_plain >= 2.0f)) {
    std::snprintf(buf, sizeof(buf), "contiguous: spread %.3fx, expected the causal imbalance (>= 2)", s_plain);
    bad = buf;
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), bad));
  std::snprintf(buf, sizeof(buf),
                "cp %d: pairs per rank, busiest / least busy: contiguous %.2fx, zig-zag %.3fx; rank 0 skips %.0f of "
                "%d blocks contiguous",
                cp, s_plain, s_zig, plain[2], cp);
  return bad.empty() ? buf : bad;
}

std::string expect_activation_memory_falls_as_one_over_cp() {
  const GPTConfig cfg = cp_config();
  const int B = 2, T = 16;
  Communicator& w = world();
  const int cp = w.size();
  Allocator& alloc = Allocator::get(Device::CPU);
  auto acts = [&] { return alloc.stats().current_bytes[static_cast<int>(MemCategory::Activations)]; };
  std::unique_ptr<GPT2> dense = make_model(cfg);
  dense->set_attention(AttentionImpl::Flash);          // as a cp shard runs: (B, NH, T) lse, no (T, T) matrix
  GPT2Activations d0 = dense->make_activations(B, T);  // the first set also allocates the backward scratch
  int64_t before = acts();
  GPT2Activations d = dense->make_activations(B, T);
  const int64_t dense_bytes = acts() - before;
  const lab10::Layout layout = lab10::make_layout(cfg, cp, w.rank(), 1, cp, false, T);
  GPT2 model(cfg, lab10::shard_of(layout), PrecisionPolicy::fp32(), Device::CPU, kModelSeed);
  GPT2Activations a0 = model.make_activations(B, layout.T_local);
  before = acts();
  GPT2Activations a = model.make_activations(B, layout.T_local);
  const int64_t bytes = acts() - before;
  std::string bad;
  char buf[200];
  if (bytes * cp != dense_bytes) {
    std::snprintf(buf, sizeof(buf), "cp %d: %lld activation bytes per rank, the dense model %lld: %.3fx, not 1/%d", cp,
                  static_cast<long long>(bytes), static_cast<long long>(dense_bytes),
                  static_cast<double>(bytes) / dense_bytes, cp);
    bad = buf;
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  std::snprintf(buf, sizeof(buf), "cp %d: one set (B=%d, T=%d, flash) %lld bytes per rank, dense %lld (1/%d exactly)",
                cp, B, T, static_cast<long long>(bytes), static_cast<long long>(dense_bytes), cp);
  return bad.empty() ? buf : bad;
}

// make_layout's coordinates for one rank, "tp_rank cp_rank dp_rank T_local" (and tp cp dp) against the wanted.
static std::string layout_mismatch(const GPTConfig& cfg, int world, int rank, int tp, int cp, int T,
                                   const lab10::Layout& want) {
  const lab10::Layout l = lab10::make_layout(cfg, world, rank, tp, cp, false, T);
  if (l.tp == want.tp && l.cp == want.cp && l.dp == want.dp && l.tp_rank == want.tp_rank &&
      l.cp_rank == want.cp_rank && l.dp_rank == want.dp_rank && l.T_local == want.T_local)
    return "";
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "make_layout(world %d, rank %d, tp %d, cp %d, T %d): tp %d cp %d dp %d, tp_rank %d cp_rank %d "
                "dp_rank %d, T_local %d; expected tp %d cp %d dp %d, tp_rank %d cp_rank %d dp_rank %d, T_local %d "
                "(rank = tp_rank + tp (cp_rank + cp dp_rank))",
                world, rank, tp, cp, T, l.tp, l.cp, l.dp, l.tp_rank, l.cp_rank, l.dp_rank, l.T_local, want.tp,
                want.cp, want.dp, want.tp_rank, want.cp_rank, want.dp_rank, want.T_local);
  return buf;
}

std::string expect_layout_and_refusals() {
  const GPTConfig cfg = cp_config();
  std::string bad;
  // Fields: tp, cp, dp, tp_rank, cp_rank, dp_rank, zigzag, T_local.
  struct Want {
    int world, rank, tp, cp;
    lab10::Layout l;
  };
  const Want wanted[] = {
      {8, 5, 1, 2, {1, 2, 4, 0, 1, 2, false, 8}},  // cp fastest without tp: rank 5 = cp 1 of replica 2
      {8, 5, 2, 2, {2, 2, 2, 1, 0, 1, false, 8}},  // tp 2 x cp 2 x dp 2: rank 5 = tp 1, cp 0, replica 1
      {8, 6, 2, 2, {2, 2, 2, 0, 1, 1, false, 8}},  // rank 6 = tp 0, cp 1, replica 1
      {8, 3, 2, 2, {2, 2, 2, 1, 1, 0, false, 8}},  // rank 3 = tp 1, cp 1, replica 0
      {8, 7, 4, 2, {4, 2, 1, 3, 1, 0, false, 8}},  // tp 4 x cp 2: rank 7 = tp 3, cp 1
  };
  for (const Want& x : wanted)
    if (bad.empty()) bad = layout_mismatch(cfg, x.world, x.rank, x.tp, x.cp, 16, x.l);
  struct Bad {
    int world, tp, cp, T;
    bool zigzag;
    const char* what;
  };
  const Bad refused[] = {{2, 1, 4, 16, false, "cp 4 > 2 ranks"},
                         {4, 1, 3, 15, false, "cp 3 does not divide 4 ranks"},
                         {2, 1, 2, 14, true, "T 14 not divisible by 2 cp = 4 (zig-zag)"},
                         {2, 1, 2, 15, false, "T 15 not divisible by cp 2"},
                         {2, 1, 2, 32, false, "T 32 > max_seq_len 16"},
                         {4, 0, 2, 16, false, "tp 0"},
                         {4, 2, 4, 16, false, "tp 2 x cp 4 = 8 > 4 ranks"},
                         {8, 2, 3, 12, false, "tp 2 x cp 3 = 6 does not divide 8 ranks"},
                         {6, 3, 2, 16, false, "tp 3 does not divide NH 4 heads"}};
  for (const Bad& b : refused) {
    bool threw = false;
    try {
      lab10::make_layout(cfg, b.world, 0, b.tp, b.cp, b.zigzag, b.T);
    } catch (const scalelab::Error&) {
      threw = true;
    }
    if (!threw && bad.empty()) bad = std::string("make_layout accepted ") + b.what;
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), bad));
  return bad.empty() ? "tp fastest, then cp (8 ranks: tp 2 x cp 2 x dp 2, tp 4 x cp 2, cp 2 x dp 4); refused: cp "
                       "or tp x cp > ranks, not dividing them, tp 0, tp not dividing NH, T not divisible by cp or "
                       "2 cp, T > max_seq_len"
                     : bad;
}

std::string expect_visible_pairs() {
  struct Case {
    CpChunk q, kv;
    int64_t want;
  };
  const Case cases[] = {{{0, 0, 4}, {0, 0, 4}, 10},    // the diagonal: 1 + 2 + 3 + 4
                        {{4, 0, 4}, {0, 0, 4}, 16},    // wholly in the past
                        {{0, 0, 4}, {4, 0, 4}, 0},     // wholly in the future
                        {{2, 0, 4}, {4, 0, 4}, 3},     // straddling: positions 4, 5 see 1 and 2 keys
                        {{12, 4, 4}, {4, 0, 4}, 16}};  // zig-zag: a late chunk against an early one
  std::string bad;
  for (const Case& c : cases) {
    const int64_t got = lab10::visible_pairs(c.q, c.kv);
    if (got != c.want && bad.empty())
      bad = "visible_pairs(q at " + std::to_string(c.q.position) + " x " + std::to_string(c.q.length) + ", kv at " +
            std::to_string(c.kv.position) + " x " + std::to_string(c.kv.length) + ") = " + std::to_string(got) +
            ", expected " + std::to_string(c.want);
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), bad));
  return bad.empty() ? "diagonal 10, past 16, future 0, straddling 3, zig-zag 16" : bad;
}

namespace {

// One forward and backward of the ring on the simulated cluster: its virtual time (the slowest rank's) and
// how long this rank was blocked in the ring's waits; and of the backward alone (the calls issued after the
// forward returned), how long this rank was blocked and how long some transfer of it was in flight (the union
// of its calls' [issue_ms, end_ms]: the whole ring transfer, as this rank saw it).
struct RingTime {
  double step_ms = 0, waited_ms = 0;
  double backward_waited_ms = 0, backward_in_flight_ms = 0;
};

// The length of the union of the calls' [issue_ms, end_ms] intervals (ms): how long some call was in flight.
double in_flight_ms(std::vector<CommEvent> events) {
  std::sort(events.begin(), events.end(),
            [](const CommEvent& a, const CommEvent& b) { return a.issue_ms < b.issue_ms; });
  double total = 0, open_start = 0, open_end = -1;
  for (const CommEvent& e : events) {
    if (e.issue_ms > open_end) {  // a gap: close the interval so far, open a new one
      if (open_end > open_start) total += open_end - open_start;
      open_start = e.issue_ms;
      open_end = e.end_ms;
    } else {
      open_end = std::max(open_end, e.end_ms);
    }
  }
  if (open_end > open_start) total += open_end - open_start;
  return total;
}
RingTime simulated_ring(Communicator& world, bool overlap) {
  const GPTConfig cfg = cp_config();
  const int cp = world.size(), T = 16, B = 2;
  const lab10::Layout layout = lab10::make_layout(cfg, cp, world.rank(), 1, cp, true, T);
  GPT2 model(cfg, lab10::shard_of(layout), PrecisionPolicy::fp32(), Device::SIM, kModelSeed);
  std::unique_ptr<Communicator> group = world.split(0, world.rank(), "cp");
  lab10::RingAttention ring(*group, cfg, true, overlap);
  model.set_context_parallel(&ring);
  const GlobalBatch g = random_global_batch(kDataSeed, B, T, cfg.vocab_size);
  const std::vector<CpChunk> chunks = cp_chunks(model.shard(), cfg, layout.T_local);
  const Tensor x = on_device(lab10::slice_sequence(g.inputs, chunks, layout.T_local), Device::SIM);
  const Tensor y = on_device(lab10::slice_sequence(g.targets, chunks, layout.T_local), Device::SIM);
  world.barrier();  // the ranks' compute streams meet
  group->clear_events();
  const double start = clock_now_ms();
  model.zero_grad();
  model.forward(x, &y);
  const double backward_start = Communicator::now_ms();  // the clock CommEvent times are on
  model.backward();
  world.barrier();
  RingTime t;
  t.step_ms = clock_now_ms() - start;
  std::vector<CommEvent> backward;
  for (const CommEvent& e : group->events()) {
    t.waited_ms += e.wait_ms;
    if (e.issue_ms >= backward_start) {
      backward.push_back(e);
      t.backward_waited_ms += e.wait_ms;
    }
  }
  t.backward_in_flight_ms = in_flight_ms(backward);
  return t;
}
}  // namespace

std::string expect_ring_overlaps_transfers() {
  SimulatedCluster cluster;
  std::unique_ptr<Communicator> world = make_communicator("sim");
  LinkModel link = LinkModel::preset("pcie");  // a slow link: each kv block's transfer is worth hiding
  world->set_link_model(link);
  const RingTime waits = simulated_ring(*world, /*overlap=*/false), overlapped = simulated_ring(*world, true);
  std::string bad;
  char buf[400];
  if (!(overlapped.step_ms < waits.step_ms) || !(overlapped.waited_ms < waits.waited_ms)) {
    std::snprintf(buf, sizeof(buf),
                  "the ring that posts each transfer before computing: %.4f ms, blocked %.4f ms; the one that waits "
                  "first: %.4f ms, blocked %.4f ms (virtual): the transfer is not under the compute (lab10-3)",
                  overlapped.step_ms, overlapped.waited_ms, waits.step_ms, waits.waited_ms);
    bad = buf;
  }
  // The forward on its own: the overlapped ring's forward must block less than the waiting one's (a forward that
  // waits before computing would otherwise hide behind an overlapped backward in the totals above).
  const double forward_overlapped = overlapped.waited_ms - overlapped.backward_waited_ms;
  const double forward_waits = waits.waited_ms - waits.backward_waited_ms;
  if (bad.empty() && !(forward_overlapped < 0.999 * forward_waits)) {
    std::snprintf(buf, sizeof(buf),
                  "the overlapped ring's forward was blocked %.4f ms, the waiting one's %.4f ms (virtual): the forward "
                  "does not compute while the next kv block travels (lab10-3)",
                  forward_overlapped, forward_waits);
    bad = buf;
  }
  // The backward honours the flag too: waiting, it is blocked for the whole time its transfers are in flight
  // (nothing under them); overlapped, for less (the next kv block travels under the compute).
  if (bad.empty() && !(waits.backward_waited_ms >= (1.0 - 1e-9) * waits.backward_in_flight_ms &&
                       waits.backward_in_flight_ms > 0)) {
    std::snprintf(buf, sizeof(buf),
                  "with overlap false the backward was blocked %.4f ms of the %.4f ms its transfers were in flight "
                  "(virtual): it does not wait for each kv hand-over before computing (lab10-4)",
                  waits.backward_waited_ms, waits.backward_in_flight_ms);
    bad = buf;
  }
  if (bad.empty() && !(overlapped.backward_waited_ms < 0.999 * overlapped.backward_in_flight_ms)) {
    std::snprintf(buf, sizeof(buf),
                  "the overlapped backward was blocked %.4f ms of the %.4f ms its transfers were in flight (virtual): "
                  "no kv hand-over travels under the compute (lab10-4)",
                  overlapped.backward_waited_ms, overlapped.backward_in_flight_ms);
    bad = buf;
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  std::snprintf(buf, sizeof(buf),
                "cp %d, zig-zag, simulated H100s on pcie: forward + backward %.4f ms overlapped vs %.4f ms waiting "
                "(blocked %.4f vs %.4f ms); the backward blocked %.4f of %.4f ms in flight vs %.4f of %.4f ms "
                "(virtual)",
                world->size(), overlapped.step_ms, waits.step_ms, overlapped.waited_ms, waits.waited_ms,
                overlapped.backward_waited_ms, overlapped.backward_in_flight_ms, waits.backward_waited_ms,
                waits.backward_in_flight_ms);
  return bad.empty() ? buf : bad;
}

}  // namespace scalelab::lab10_test
