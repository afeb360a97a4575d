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
