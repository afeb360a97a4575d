// test_planner_model.cpp — the reference planner (solutions/09_planner/planner.cpp, lab09_ref): each term
// against a count by hand from the README's formulas, the memory of a stage against the counting allocator
// of the models it would build, and the plan's order and refusals. (The graded checks compare a track with
// this model; these tests are why the model can be trusted.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "expect_error.h"             // defines: error_message, contains
#include "lab09_support.h"            // defines: lab09_test::layout
#include "planner.h"                  // defines: lab09::* (the reference: this program links lab09_ref)
#include "scalelab/core/allocator.h"  // defines: Allocator, MemStats, MemCategory
#include "scalelab/core/sim_gpu.h"    // defines: sim_gpu_set, sim_gpu_clear, sim_set_timing_only
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig
#include "scalelab/model/gpt2.h"      // defines: GPT2, gpt2_num_params
#include "scalelab/model/gpt2_layout.h"  // defines: gpt2_unit_numel

namespace {

using namespace scalelab;
using namespace scalelab::lab09;
using scalelab::lab09_test::layout;
using scalelab::test::contains;
using scalelab::test::error_message;

constexpr double kFlops = 1e11;  // FLOP/s one device sustains

Cluster cpu(int devices, const std::string& link = "none") {
  Cluster c;
  c.devices = devices;
  c.devices_per_node = devices;
  c.peak_flops_per_s = kFlops;
  c.efficiency = 1.0;
  c.intra = c.inter = LinkModel::preset(link);
  return c;
}

// Bytes the allocator holds now in the categories the planner counts: params, grads, optimizer state,
// activations (not the step's workspace, communication buffers or loader batches).
int64_t model_bytes_now() {
  const MemStats st = Allocator::get(Device::CPU).stats();
  int64_t n = 0;
  for (MemCategory c : {MemCategory::Params, MemCategory::Grads, MemCategory::OptimizerState, MemCategory::Activations})
    n += st.current_bytes[static_cast<int>(c)];
  return n;
}

Workload workload(int T, int global_batch) {
  Workload w;
  w.seq_len = T;
  w.global_batch = global_batch;
  w.policy = PrecisionPolicy::fp32();
  return w;
}

// workload(T, global_batch) with flash attention: what context parallelism runs (lab 10's shards).
Workload flash_workload(int T, int global_batch) {
  Workload w = workload(T, global_batch);
  w.attention = AttentionImpl::Flash;
  return w;
}

// Layout x with every sequence split over cp ranks (lab 10's zig-zag).
Layout with_cp(Layout x, int cp) {
  x.cp = cp;
  return x;
}

// The cp tests' demo run: the demo model, T 64, a batch of 2 sequences as one micro-batch (B 2, m 1), flash
// attention, tp = pp = dp = 1; at(cp) is its layout on cp ranks.
struct CpDemo {
  GPTConfig cfg = GPTConfig::preset("demo");
  Workload w = flash_workload(64, 2);
  Layout at(int cp) const { return with_cp(layout(1, 1, 1, 2, 1), cp); }
};

}  // namespace

// One device, no communication: the step is m micro-batches of forward + backward = 3 forwards, the forward
// B*T*(L*(24C^2 + 4TC) + 2CV) FLOPs; MFU is the model's FLOPs (lab 01's 6N + 12LTC) over that time.
TEST(PlannerModel, OneDeviceIsThreeForwardsOfFlops) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  const Layout x = layout(1, 1, 1, 4, 2);
  const StepTime t = step_time(cfg, x, workload(256, 8), cpu(1));
  const double B = 4, T = 256, C = 768, L = 12, V = 256;
  const double fwd = B * T * (L * (24 * C * C + 4 * T * C) + 2 * C * V);
  EXPECT_DOUBLE_EQ(t.compute_ms, 3e3 * fwd / kFlops);
  EXPECT_DOUBLE_EQ(t.step_ms, 2 * t.compute_ms);
  EXPECT_EQ(t.bubble_ms, 0.0);
  EXPECT_EQ(t.tp_ms + t.pp_ms + t.dp_ms + t.optimizer_ms, 0.0);
  EXPECT_DOUBLE_EQ(t.tokens_per_s, 2 * B * T / (t.step_ms / 1e3));
  const double model = 6.0 * gpt2_num_params(cfg, false) + 12 * L * T * C;
  EXPECT_NEAR(t.mfu, t.tokens_per_s * model / kFlops, 1e-12);
  EXPECT_DOUBLE_EQ(t.hfu, t.mfu);
  // the count above is the matmuls' and attention's; 6N + 12LTC counts layernorm and bias parameters too
  EXPECT_GT(t.mfu, 0.99);
  EXPECT_LT(t.mfu, 1.01);
}

// 1F1B: m + p - 1 slots of the slowest stage, p - 1 of them idle, so the bubble is (p - 1) / m of the ideal
// (Narayanan et al. 2021, Sec. 2.2). demo, pp 2: 2 blocks each; the last stage's head makes it the slower.
TEST(PlannerModel, PipelineIsMPlusPMinusOneSlotsOfTheSlowestStage) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // L=4, C=192, V=256
  for (int m : {1, 4, 8}) {
    const StepTime t = step_time(cfg, layout(1, 2, 1, 2, m), workload(64, 2 * m), cpu(2));
    const double B = 2, T = 64, C = 192, V = 256;
    const double last_stage_fwd = B * T * (2 * (24 * C * C + 4 * T * C) + 2 * C * V);
    EXPECT_EQ(t.slowest_stage, 1);
    EXPECT_DOUBLE_EQ(t.compute_ms, 3e3 * last_stage_fwd / kFlops);
    EXPECT_DOUBLE_EQ(t.pipeline_ms, (m + 1) * t.slot_ms);
    EXPECT_DOUBLE_EQ(t.bubble_ms / (t.pipeline_ms - t.bubble_ms), 1.0 / m);
  }
}

// Full recompute: the backward runs every block's forward again (recompute_flops_per_token), HFU counts it,
// MFU does not; under tensor parallelism the forward's collectives happen a third time per block.
TEST(PlannerModel, FullRecomputeAddsAForwardOfTheBlocksAndItsCollectives) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  Layout x = layout(2, 1, 1, 4, 1);
  const Workload w = workload(256, 4);
  const StepTime none = step_time(cfg, x, w, cpu(2, "nvlink"));
  x.recompute = Recompute::Full;
  const StepTime full = step_time(cfg, x, w, cpu(2, "nvlink"));
  const double B = 4, T = 256, C = 768, L = 12;
  EXPECT_NEAR(full.compute_ms - none.compute_ms, 1e3 * B * T * L * (24 * C * C + 4 * T * C) / 2 / kFlops, 1e-9);
  EXPECT_LT(full.mfu, none.mfu);
  EXPECT_GT(full.hfu, full.mfu);
  const LinkModel nv = LinkModel::preset("nvlink");
  const double ar = nv.seconds("all_reduce", static_cast<int64_t>(B * T * C) * 4, 2);
  EXPECT_NEAR(full.tp_ms - none.tp_ms, 1e3 * L * 2 * ar, 1e-9);
  // 4 per block, the embedding's, the head's, and cross-entropy's max and sums
  const double ce = nv.seconds("all_reduce", static_cast<int64_t>(B * T) * 4, 2) +
                    nv.seconds("all_reduce", static_cast<int64_t>(B * T) * 8, 2);
  EXPECT_NEAR(none.tp_ms, 1e3 * ((4 * L + 2) * ar + ce), 1e-9);
}

// The pipeline's boundary under tp: each of the tp ranks sends the whole (B, T, C) activation (lab 07), or,
// with Megatron-LM's scatter/gather (Narayanan et al. 2021, Sec. 4.1), 1/tp of it over the pp link and the
// receiver all-gathers it over tp; sequence parallelism already sends 1/tp and gathers nothing more.
// Stage 0 of pp 2 sends its activation forward and receives one gradient: one message and one gather.
TEST(PlannerModel, ScatterGatherSendsATpthOfTheBoundaryAndGathersItOverTp) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  Cluster c = cpu(8, "nvlink");
  c.devices_per_node = 4;  // tp inside a node, pp across
  c.inter = LinkModel::preset("infiniband");
  Workload w = workload(1024, 64);
  w.activation_bytes = 2;
  const Layout x = layout(4, 2, 1, 16, 4);
  const GroupLinks links = group_links(c, x);
  const int64_t act = int64_t{16} * 1024 * 768 * 2;  // B T C, 2 bytes: 25 MB
  const double whole = links.pp.seconds("send", act, 2);
  const double split = links.pp.seconds("send", act / 4, 2) + links.tp.seconds("all_gather", act / 4, 4);
  for (int s : {0, 1}) {
    EXPECT_NEAR(stage_comm(cfg, x, s, links, w).pp_s, whole, 1e-15) << "stage " << s << ", lab 07's sends";
    w.pp_scatter_gather = true;
    EXPECT_NEAR(stage_comm(cfg, x, s, links, w).pp_s, split, 1e-15) << "stage " << s << ", scatter/gather";
    EXPECT_LT(split, whole / 2);  // InfiniBand carries a quarter of the bytes, NVLink gathers the rest
    w.pp_scatter_gather = false;
  }
  // under sequence parallelism the boundary is already 1/tp a rank: the option changes nothing
  Layout sp = x;
  sp.sequence_parallel = true;
  const double before = stage_comm(cfg, sp, 0, links, w).pp_s;
  w.pp_scatter_gather = true;
  EXPECT_DOUBLE_EQ(stage_comm(cfg, sp, 0, links, w).pp_s, before);
  EXPECT_NEAR(before, links.pp.seconds("send", act / 4, 2), 1e-15);
}

// Data parallelism adds the gradient sync the link model charges, one call per unit as labs 04 and 07 run it
// (4 bytes of every parameter, wpe included): ZeRO-0 an all-reduce of each unit; ZeRO-1 a reduce-scatter of
// each unit's gradient padded to dp equal shards and an all-gather of its parameters' shard (the same bus
// traffic, twice the latencies); ZeRO-3 two all-gathers and a reduce-scatter a unit for each micro-batch.
TEST(PlannerModel, DataParallelAddsTheGradientSyncOfItsZeroStage) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const LinkModel eth = LinkModel::preset("ethernet100");
  const StepTime one = step_time(cfg, layout(1, 1, 1, 4, 1), workload(64, 4), cpu(1, "ethernet100"));
  Layout x = layout(1, 1, 4, 4, 1);
  const StepTime four = step_time(cfg, x, workload(64, 16), cpu(4, "ethernet100"));
  double ar = 0, rs_ag = 0, z3 = 0;  // seconds, by hand
  for (int64_t n : gpt2_unit_numel(cfg)) {
    const int64_t shard = (n + 3) / 4;
    ar += eth.seconds("all_reduce", n * 4, 4);
    rs_ag += eth.seconds("reduce_scatter", 4 * shard * 4, 4) + eth.seconds("all_gather", shard * 4, 4);
    z3 += 2 * eth.seconds("all_gather", shard * 4, 4) + eth.seconds("reduce_scatter", 4 * shard * 4, 4);
  }
  EXPECT_NEAR(four.dp_ms, 1e3 * ar, 1e-9);
  EXPECT_DOUBLE_EQ(four.pipeline_ms, one.pipeline_ms);
  EXPECT_NEAR(four.tokens_per_s, 4 * one.tokens_per_s * one.step_ms / four.step_ms, 1e-6);
  x.zero_stage = 1;
  EXPECT_NEAR(step_time(cfg, x, workload(64, 16), cpu(4, "ethernet100")).dp_ms, 1e3 * rs_ag, 1e-9);
  x.zero_stage = 3;
  const StepTime zero3 = step_time(cfg, x, workload(64, 16), cpu(4, "ethernet100"));
  EXPECT_NEAR(zero3.dp_ms, 1e3 * z3, 1e-9);
  EXPECT_GT(zero3.dp_ms, 1.5 * four.dp_ms);  // ZeRO's 1.5x (Rajbhandari et al. 2019, Sec. 7), and latencies
}

// The memory of a stage is what the allocator counts when the stage's model is built and holds its sets:
// parameters, gradients and AdamW's state (fp32) and `sets` activation sets of every shard kind.
TEST(PlannerModel, StageMemoryEqualsTheAllocator) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const Workload w = workload(64, 8);
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp)
        for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
          Layout x = layout(tp, pp, 1, 2, 4);
          x.sequence_parallel = sp == 1;
          x.recompute = r;
          for (int s = 0; s < pp; ++s) {
            const DeviceMemory want = stage_memory(cfg, x, s, w);
            const int64_t before = model_bytes_now();
            {
              GPT2 model(cfg, chunk_shard(cfg, x, s, 0), w.policy, Device::CPU, /*seed=*/1);
              model.set_recompute(r);
              Optimizer opt(model, OptimizerConfig{});  // AdamW: m and v
              std::vector<GPT2Activations> sets;
              for (int k = 0; k < want.sets; ++k) sets.push_back(model.make_activations(x.micro_batch, w.seq_len));
              const int64_t got = model_bytes_now() - before;
              EXPECT_EQ(got, want.total()) << to_string(x) << " stage " << s;
            }
          }
        }
}

// 16-bit activations (--activations bf16) at the lesson's sizes, in timing-only mode on a simulated H100
// (docs/simulation.md "Timing-only runs": nothing computed, memory counted to the byte, not backed): the
// allocator's peak of Activations over one forward and backward of the model equals common's estimator
// (gpt2_activation_bytes; estimate_memory for the dense model) and the planner's stage_memory, for GPT-2 124M
// on one device and Llama-2-7B's shape at 2 x 4096 tokens a device, ZeRO-3 over 8, flash attention (each rank
// holds the whole model's activations under data parallelism).
TEST(PlannerModel, SixteenBitActivationsAtLessonSizesEqualTheAllocatorTimingOnly) {
  sim_gpu_set(GpuModel::preset("h100"));
  sim_set_timing_only(true);
  Allocator& sim = Allocator::get(Device::SIM);
  sim.set_capacity_bytes(0);  // the 7B model's state on one simulated device: counted, not capped
  PrecisionPolicy policy = PrecisionPolicy::bf16_mixed();
  policy.activation_dtype = DType::BF16;
  struct Case {
    const char* preset;
    int dp, zero, B, T;
    AttentionImpl attention;
  };
  for (const Case& c : {Case{"gpt2-124m", 1, 0, 8, 1024, AttentionImpl::Materialized},
                        Case{"gpt-7b", 8, 3, 2, 4096, AttentionImpl::Flash}}) {
    const GPTConfig cfg = GPTConfig::preset(c.preset);
    Workload w = workload(c.T, c.B * c.dp);
    w.policy = policy;
    w.attention = c.attention;
    const Layout x = layout(1, 1, c.dp, c.B, 1, c.zero);
    const int64_t planner = stage_memory(cfg, x, 0, w).activations;
    const int64_t estimator =
        gpt2_activation_bytes(cfg, ModelShard::dense(), c.B, c.T, 1, Recompute::None, c.attention, DType::BF16);
    if (c.attention == AttentionImpl::Materialized) {  // estimate_memory models the dense model's materialized
      EXPECT_EQ(estimate_memory(cfg, c.dp, c.zero, policy, w.optimizer, w.prefetch, c.B, c.T).activations_bytes,
                estimator);
    }
    const int64_t before = sim.stats().current_bytes[static_cast<int>(MemCategory::Activations)];
    sim.reset_peak();
    {
      GPT2 model(cfg, policy, Device::SIM, /*seed=*/1);
      model.set_attention(c.attention);
      Tensor tokens = Tensor::zeros({c.B, c.T}, DType::I32), targets = Tensor::zeros({c.B, c.T}, DType::I32);
      model.forward(tokens, &targets);
      model.zero_grad();
      model.backward();
    }
    const int64_t allocator = sim.stats().peak_bytes[static_cast<int>(MemCategory::Activations)] - before;
    EXPECT_EQ(allocator, estimator) << c.preset;
    EXPECT_EQ(planner, estimator) << c.preset;
    std::printf("%s B %d T %d, bf16 activations: allocator peak %lld bytes, estimator %lld, planner %lld\n", c.preset,
                c.B, c.T, static_cast<long long>(allocator), static_cast<long long>(estimator),
                static_cast<long long>(planner));
  }
  sim_set_timing_only(false);
  sim_gpu_clear();
}

// Offload (lab 04 part 3) in the plan: a dp layout's device memory with --offload optimizer is lab 04's
// estimate_memory with its offload terms, byte for byte per category (lab 04's graded
// offload_device_memory_falls_by_estimate holds the allocator to the same figures), and its step pays the
// copies and the host's AdamW: down 4 and up Bp bytes an element of the shard, the host's update at least
// 28 bytes an element at the host's bandwidth.
TEST(PlannerModel, OffloadMemoryEqualsLab04sEstimateAndTheStepPaysTheHost) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  for (const PrecisionPolicy& policy : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed()})
    for (int zero = 1; zero <= 3; ++zero) {
      Workload w = workload(64, 8);
      w.policy = policy;
      w.offload_optimizer = true;
      const Layout x = [&] {
        Layout l = layout(1, 1, 2, 4, 1);
        l.zero_stage = zero;
        return l;
      }();
      const DeviceMemory got = device_memory(cfg, x, w);
      const MemoryEstimate want = estimate_memory(cfg, 2, zero, policy, OptimizerConfig::Kind::AdamW, w.prefetch, 0, 0,
                                                  Recompute::None, /*offload_optimizer=*/true);
      EXPECT_EQ(got.state.params, want.peak.params) << to_string(x) << " " << policy.name();
      EXPECT_EQ(got.state.grads, want.peak.grads) << to_string(x) << " " << policy.name();
      EXPECT_EQ(got.state.optimizer_state, 0) << to_string(x) << " " << policy.name();
      Workload on_device = w;
      on_device.offload_optimizer = false;
      EXPECT_EQ(device_memory(cfg, x, on_device).state.optimizer_state,
                estimate_memory(cfg, 2, zero, policy, OptimizerConfig::Kind::AdamW, w.prefetch, 0, 0).peak.optimizer_state);
      // the copies: s_u elements a unit, fp32 gradients down, the parameter dtype up
      const Cluster c = cpu(2, "nvlink");
      const OffloadStep o = offload_step(cfg, x, 0, w, c);
      int64_t elements = 0;
      for (int64_t n : gpt2_unit_numel(cfg)) elements += (n + 1) / 2;
      EXPECT_EQ(o.down_bytes, 4 * elements);
      EXPECT_EQ(o.up_bytes, static_cast<int64_t>(dtype_size(policy.param_dtype)) * elements);
      EXPECT_GE(o.host_s, 28.0 * elements / c.host_memory_bytes_per_s);
      EXPECT_GE(o.step_s, o.host_s);
      const StepTime t = with_offload(step_time(cfg, x, on_device, c), cfg, x, w, c);
      EXPECT_NEAR(t.optimizer_ms, 1e3 * o.step_s, 1e-12);
      EXPECT_NEAR(t.step_ms, t.pipeline_ms + t.dp_ms + t.optimizer_ms, 1e-9);
    }
}

// The plan: every row uses the whole cluster and the whole global batch, the fitting rows come first by
// predicted tokens/s, a layout the model refuses (d12's 12 heads and tp 8) says why.
TEST(PlannerModel, RowsCoverTheClusterAndTheBatchFittingOnesFirstByTokensPerSecond) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  Workload w = workload(1024, 16);
  w.policy = PrecisionPolicy::bf16_mixed();
  Cluster c = cpu(8, "nvlink");
  c.memory_bytes = 80e9;
  const std::vector<Candidate> rows = plan(cfg, w, c);
  ASSERT_FALSE(rows.empty());
  ASSERT_TRUE(rows.front().fits);
  bool seen_unfit = false, tp8_refused = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Layout& x = rows[i].layout;
    EXPECT_EQ(x.devices(), 8);
    EXPECT_EQ(x.dp * x.micro_batch * x.micro_batches, 16);
    if (!rows[i].fits) {
      seen_unfit = true;
      EXPECT_FALSE(rows[i].why_not.empty());
      if (x.tp == 8) tp8_refused |= contains(rows[i].why_not, "NH");
    } else {
      EXPECT_FALSE(seen_unfit) << "a fitting row after one that does not fit, at " << i;
      if (i > 0 && rows[i - 1].fits) {
        EXPECT_GE(rows[i - 1].time.tokens_per_s, rows[i].time.tokens_per_s);
      }
    }
  }
  EXPECT_TRUE(tp8_refused);
}

// The given rows and ranking (layouts.cpp: evaluate_candidate, rank_candidates; what plan_with_cp and the
// offload's re-ranking use) against the plan: every row evaluated again on its own is the plan's row, and the
// rows ranked again from the reverse order come back in the plan's order (the refused ones reversed: a stable
// sort keeps the order it is given). On a memory half the fitting layouts fit, so memory refusals and
// check_layout's (tp 8 against 12 heads) are both among them.
TEST(PlannerModel, GivenRowsAndRankingAgreeWithThePlan) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  Workload w = workload(1024, 16);
  w.policy = PrecisionPolicy::bf16_mixed();
  Cluster c = cpu(8, "nvlink");
  c.memory_bytes = 80e9;
  std::vector<double> totals;
  for (const Candidate& r : plan(cfg, w, c))
    if (r.fits) totals.push_back(static_cast<double>(r.memory.total()));
  ASSERT_GT(totals.size(), 2u);
  std::nth_element(totals.begin(), totals.begin() + totals.size() / 2, totals.end());
  c.memory_bytes = totals[totals.size() / 2];
  const std::vector<Candidate> rows = plan(cfg, w, c);
  int fits = 0, memory_refused = 0, layout_refused = 0;
  std::vector<Candidate> again;
  for (const Candidate& r : rows) {
    fits += r.fits;
    memory_refused += contains(r.why_not, "GB a device");
    layout_refused += !r.fits && !contains(r.why_not, "GB a device");
    const Candidate e = evaluate_candidate(cfg, r.layout, w, c);
    EXPECT_EQ(to_string(e.layout), to_string(r.layout));
    EXPECT_EQ(e.fits, r.fits) << to_string(r.layout);
    EXPECT_EQ(e.why_not, r.why_not) << to_string(r.layout);
    EXPECT_EQ(e.memory.total(), r.memory.total()) << to_string(r.layout);
    EXPECT_EQ(e.time.step_ms, r.time.step_ms) << to_string(r.layout);
    again.push_back(e);
  }
  EXPECT_GT(fits, 0);
  EXPECT_GT(memory_refused, 0);
  EXPECT_GT(layout_refused, 0);
  std::reverse(again.begin(), again.end());
  rank_candidates(again);
  ASSERT_EQ(again.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(again[i].fits, rows[i].fits) << "row " << i;
    if (rows[i].fits) {  // the same place in the ranking (rows tied on tokens/s and memory may swap)
      EXPECT_EQ(again[i].time.tokens_per_s, rows[i].time.tokens_per_s) << "row " << i;
      EXPECT_EQ(again[i].memory.total(), rows[i].memory.total()) << "row " << i;
    } else {
      EXPECT_EQ(to_string(again[i].layout), to_string(rows[fits + rows.size() - 1 - i].layout)) << "row " << i;
    }
  }
}

// The lesson's rule from the ranking alone: on 4 nodes of 4 devices (NVLink inside, InfiniBand across), with
// d24 (16 heads) too large for one 4 GB device, the best layout keeps its tensor-parallel group inside a node,
// and the best with tp 8 (two nodes) is slower than the best with tp 4.
TEST(PlannerModel, TheBestLayoutKeepsTensorParallelInsideANode) {
  const GPTConfig cfg = GPTConfig::preset("d24");
  Workload w = workload(1024, 64);
  w.policy = PrecisionPolicy::bf16_mixed();
  Cluster c = cpu(16, "nvlink");
  c.devices_per_node = 4;
  c.peak_flops_per_s = 989e12;
  c.efficiency = 0.4;
  c.inter = LinkModel::preset("infiniband");
  c.memory_bytes = 4e9;
  const std::vector<Candidate> rows = plan(cfg, w, c);
  ASSERT_TRUE(rows.front().fits);
  std::printf("  [plan] d24 on 4 nodes x 4 x 4 GB: %s\n", explain(rows.front(), c).c_str());
  EXPECT_LE(rows.front().layout.tp, c.devices_per_node);
  double best_tp[17] = {0};
  for (const Candidate& r : rows)
    if (r.fits) best_tp[r.layout.tp] = std::max(best_tp[r.layout.tp], r.time.tokens_per_s);
  ASSERT_GT(best_tp[4], 0.0);
  ASSERT_GT(best_tp[8], 0.0);
  EXPECT_GT(best_tp[4], best_tp[8]);
}

// A layout the model or the cluster cannot take: a clear error naming the numbers.
TEST(PlannerModel, BadLayoutsAreRefusedWithTheNumbers) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // NH = 4, L = 4
  const Workload w = workload(64, 8);
  auto msg = [&](const Layout& x, int devices) {
    return error_message([&] { check_layout(cfg, x, w, cpu(devices)); });
  };
  EXPECT_TRUE(contains(msg(layout(3, 1, 1, 8, 1), 3), "NH=4")) << msg(layout(3, 1, 1, 8, 1), 3);
  EXPECT_TRUE(contains(msg(layout(1, 5, 1, 8, 1), 5), "5 stages")) << msg(layout(1, 5, 1, 8, 1), 5);
  EXPECT_TRUE(contains(msg(layout(1, 1, 2, 8, 1), 2), "global batch 8")) << msg(layout(1, 1, 2, 8, 1), 2);
  EXPECT_TRUE(contains(msg(layout(1, 1, 2, 4, 1), 4), "the cluster has 4")) << msg(layout(1, 1, 2, 4, 1), 4);
  Layout sp = layout(1, 1, 1, 8, 1);
  sp.sequence_parallel = true;
  EXPECT_TRUE(contains(msg(sp, 1), "tp 1")) << msg(sp, 1);
}

// ---------------------------------------------------------------------------------------------
// The cp axis (cp_terms.cpp, docs/context_parallel.md "The planner's cp axis")

// The model lab 10 builds for layout x's first rank (tp slice 0, cp rank 0 of the zig-zag, flash attention) with
// an AdamW optimizer and the planner's sets at T / cp: asserts the allocator's bytes (all, and the activations)
// equal device_memory's, prints them under `label`, and returns the planner's figure.
static DeviceMemory expect_lab10_memory_is_the_planners(const GPTConfig& cfg, const Layout& x, const Workload& w,
                                                        const char* label) {
  const DeviceMemory want = device_memory(cfg, x, w);
  const int64_t before = model_bytes_now();
  GPT2 model(cfg, chunk_shard(cfg, x, 0, 0), w.policy, Device::CPU, /*seed=*/1);
  model.set_attention(AttentionImpl::Flash);
  Optimizer opt(model, OptimizerConfig{});  // AdamW: m and v
  const int64_t acts_before =
      Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(MemCategory::Activations)];
  std::vector<GPT2Activations> sets;
  for (int k = 0; k < want.sets; ++k) sets.push_back(model.make_activations(x.micro_batch, w.seq_len / x.cp));
  const int64_t acts =
      Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(MemCategory::Activations)] - acts_before;
  EXPECT_EQ(model_bytes_now() - before, want.total()) << to_string(x);
  EXPECT_EQ(acts, want.activations) << to_string(x);
  std::printf("  [%s] demo, B 2, T 64, flash: tp %d x cp %d holds %lld activation bytes a rank (allocator %lld), "
              "%lld in all\n",
              label, x.tp, x.cp, static_cast<long long>(want.activations), static_cast<long long>(acts),
              static_cast<long long>(want.total()));
  return want;
}

// Lab 10's memory: a cp rank's model holding its sets at T / cp counts, in the allocator, exactly the planner's
// device_memory: the state of the whole model and 1/cp of cp 1's activations (every activation term of the
// flash model is linear in T).
TEST(PlannerModel, CpMemoryEqualsLab10sAllocator) {
  const CpDemo demo;
  int64_t cp1_activations = 0;
  for (int cp : {1, 2, 4}) {
    const Layout x = demo.at(cp);
    check_layout(demo.cfg, x, demo.w, cpu(cp));
    const DeviceMemory want = expect_lab10_memory_is_the_planners(demo.cfg, x, demo.w, "cp");
    if (cp == 1) cp1_activations = want.activations;
    EXPECT_EQ(want.activations * cp, cp1_activations) << to_string(x);
  }
}

// cp composed with tp (lab 10's tp x cp grid): the same for tp 2 x cp 2, whose activations differ from cp 2's
// alone (tp splits the heads and the MLP's width: the comparison can fail).
TEST(PlannerModel, CpTimesTpMemoryEqualsTheAllocator) {
  const CpDemo demo;
  const Layout x = with_cp(layout(2, 1, 1, 2, 1), 2);
  check_layout(demo.cfg, x, demo.w, cpu(4));
  const DeviceMemory want = expect_lab10_memory_is_the_planners(demo.cfg, x, demo.w, "cp x tp");
  EXPECT_NE(want.activations, device_memory(demo.cfg, demo.at(2), demo.w).activations);
}

// The zig-zag gives every rank exactly 1/cp of the causal pairs; the contiguous split's last rank the most.
TEST(PlannerModel, CpAttentionShareIsTheZigZagsOneOverCp) {
  for (int cp : {1, 2, 4, 8}) EXPECT_DOUBLE_EQ(cp_attention_share(cp, 64, true), 1.0 / cp) << "cp " << cp;
  // contiguous, cp 2, T 4: rank 1 holds positions 2, 3: 3 + 4 pairs of 10
  EXPECT_DOUBLE_EQ(cp_attention_share(2, 4, false), 7.0 / 10.0);
  EXPECT_GT(cp_attention_share(4, 64, false), 1.5 / 4);
}

// Without links, cp ranks that split the sequence do exactly what one device does, divided by cp (the
// zig-zag's attention share 1/cp, the rest per token): the step is 1/cp of one device's, the MFU the same.
TEST(PlannerModel, CpStepWithoutLinksIsOneDevicesOverCp) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const Workload w = flash_workload(256, 4);
  const StepTime one = cp_step_time(cfg, layout(1, 1, 1, 2, 2), w, cpu(1));
  for (int cp : {2, 4}) {
    const Layout x = with_cp(layout(1, 1, 1, 2, 2), cp);
    const StepTime t = cp_step_time(cfg, x, w, cpu(cp));
    EXPECT_NEAR(t.step_ms * cp, one.step_ms, 1e-9 * one.step_ms) << "cp " << cp;
    EXPECT_NEAR(t.mfu, one.mfu, 1e-12) << "cp " << cp;
    EXPECT_NEAR(t.tokens_per_s, cp * one.tokens_per_s, 1e-6 * t.tokens_per_s) << "cp " << cp;
    EXPECT_EQ(t.cp_ms, 0.0);
  }
}

// The ring on a slow link, by hand: each layer's forward waits for cp - 1 hand-overs less a forward step of
// attention each, the backward for cp - 1 less a backward step and cp dkv hand-overs; then the cp group's
// all-reduce of every unit's gradient and of the loss.
TEST(PlannerModel, CpRingAndGradientAverageByHand) {
  const CpDemo demo;
  const GPTConfig& cfg = demo.cfg;
  const Workload& w = demo.w;
  const Layout x = demo.at(4);
  const Cluster c = cpu(4, "ethernet100");
  const LinkModel& l = c.intra;
  const double T = 64, C = cfg.n_embd, F = c.flops_per_s(), L = cfg.n_layer;
  const double hop = l.seconds("send", 2 * (64 / 4) * 2 * cfg.n_embd * 4, 2);
  const double step = 2 * 4 * C * T * T / 4 / F / 4;  // one ring step's forward attention: 1/cp of the rank's
  ASSERT_GT(hop, 2 * step);                           // the link is the slower: the hand-overs show
  const CpSlot s = cp_slot_seconds(cfg, x, 0, group_links(c, x), w, c);
  EXPECT_NEAR(s.ring_s, L * (3 * (hop - step) + 3 * (hop - 2 * step) + 4 * hop), 1e-12);
  EXPECT_NEAR(s.attention_s, L * 3 * 2 * 4 * C * (T * T / 4 - 16.0 * 16.0) / F, 1e-12);
  double grads = 0;
  for (int64_t n : gpt2_unit_numel(cfg, chunk_shard(cfg, x, 0, 0))) grads += l.seconds("all_reduce", n * 4, 4);
  EXPECT_NEAR(cp_grad_seconds(cfg, x, 0, group_links(c, x), w), grads, 1e-12);
  const StepTime t = cp_step_time(cfg, x, w, c);
  EXPECT_NEAR(t.cp_ms, 1e3 * s.ring_s, 1e-9);
  EXPECT_NEAR(t.dp_ms, 1e3 * (grads + l.seconds("all_reduce", 4, 4)), 1e-9);
}

// Placement: ranks fill tp, then cp, then dp: with tp 2 and cp 4 on nodes of 8 the ring stays inside a node
// and dp crosses; with cp 8 the ring itself crosses.
TEST(PlannerModel, CpGroupSitsBetweenTpAndDp) {
  Cluster c = cpu(32, "nvlink");
  c.devices_per_node = 8;
  c.inter = LinkModel::preset("infiniband");
  Layout x = with_cp(layout(2, 1, 4, 1, 1), 4);
  GroupLinks g = group_links(c, x);
  EXPECT_EQ(g.tp.name, "nvlink");
  EXPECT_EQ(g.cp.name, "nvlink");
  EXPECT_EQ(g.dp.name, "infiniband");
  x.cp = 8;
  x.dp = 2;
  g = group_links(c, x);
  EXPECT_EQ(g.cp.name, "infiniband");
}

// cp rows the lab cannot run are refused with the reason; the ranking with cp holds them all.
TEST(PlannerModel, CpRefusalsAndTheSearch) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  Workload w = workload(64, 4);
  Layout x = layout(1, 1, 1, 4, 1);
  x.cp = 2;
  EXPECT_TRUE(contains(error_message([&] { check_layout(cfg, x, w, cpu(2)); }), "materialized"));
  w.attention = AttentionImpl::Flash;
  x.cp = 3;
  EXPECT_TRUE(contains(error_message([&] { check_layout(cfg, x, w, cpu(3)); }), "multiple of 6"));
  const std::vector<Candidate> rows = plan_with_cp(cfg, w, cpu(4), 4);
  int with_cp[5] = {0};
  for (const Candidate& r : rows) {
    EXPECT_EQ(r.layout.devices(), 4);
    if (r.fits) with_cp[r.layout.cp]++;
  }
  EXPECT_GT(with_cp[1], 0);
  EXPECT_GT(with_cp[2], 0);
  EXPECT_GT(with_cp[4], 0);
}

// The longest sequence that fits: T fits, T + 2 cp does not; more cp, a longer T.
TEST(PlannerModel, CpLongestSequenceFitsAndTheNextDoesNot) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const Workload w = flash_workload(64, 1);
  int previous = 0;
  for (int cp : {1, 2, 4}) {
    const Layout x = with_cp(layout(1, 1, 1, 1, 1), cp);
    Cluster c = cpu(cp);
    c.memory_bytes = 60e6;
    const LongestSequence l = longest_sequence(cfg, x, w, c, 1 << 16);
    ASSERT_GT(l.seq_len, 0);
    EXPECT_LE(static_cast<double>(l.memory.total()), c.memory_bytes);
    GPTConfig grown = cfg;
    grown.max_seq_len = l.seq_len + 2 * cp;
    Workload next = w;
    next.seq_len = l.seq_len + 2 * cp;
    EXPECT_GT(static_cast<double>(device_memory(grown, x, next).total()), c.memory_bytes) << "cp " << cp;
    EXPECT_GT(l.seq_len, previous) << "cp " << cp;
    std::printf("  [cp] demo in 60 MB a device, B 1: cp %d fits T %d\n", cp, l.seq_len);
    previous = l.seq_len;
  }
}
