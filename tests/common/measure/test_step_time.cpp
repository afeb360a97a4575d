// test_step_time.cpp — the step-time model (scalelab/measure/step_time.h, common/src/measure/step_time.cpp):
// each term against a count by hand from the header's formulas: one device is 3 forwards of FLOPs; the
// pipeline's (m + p - 1) slots and its (p - 1) / m bubble; full recompute adds one forward of the blocks and,
// under tensor parallelism, the forward's collectives once more; data parallelism adds the gradient's
// all-reduce as the link model charges it; bad layouts and clusters are refused with a hint.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"                    // defines: error_message, contains
#include "scalelab/comm/comm.h"              // defines: LinkModel
#include "scalelab/measure/step_time.h"      // defines: estimate_step_time, StepLayout, StepCluster
#include "scalelab/model/gpt2.h"             // defines: GPTConfig, gpt2_num_params, Recompute

namespace {

using scalelab::GPTConfig;
using scalelab::LinkModel;
using scalelab::Recompute;
using scalelab::StepCluster;
using scalelab::StepLayout;
using scalelab::StepTime;
using scalelab::test::contains;
using scalelab::test::error_message;

constexpr double kFlops = 1e11;  // FLOP/s one device sustains

StepCluster cluster(const std::string& link = "none") {
  StepCluster c;
  c.flops_per_s = kFlops;
  c.tp_link = c.pp_link = c.dp_link = LinkModel::preset(link);
  return c;
}

}  // namespace

// One device, no communication: the step is m micro-batches of forward + backward = 3 forwards, the forward
// B*T*(L*(24C^2 + 4TC) + 2CV) FLOPs; MFU is the model's FLOPs (lab 01's 6N + 12LTC) over that time.
TEST(StepTime, OneDeviceIsThreeForwardsOfFlops) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  StepLayout x;
  x.micro_batch = 4;
  x.micro_batches = 2;
  x.seq_len = 256;
  const StepTime t = scalelab::estimate_step_time(cfg, x, cluster());
  const double B = 4, T = 256, C = 768, L = 12, V = 256;
  const double fwd = B * T * (L * (24 * C * C + 4 * T * C) + 2 * C * V);
  EXPECT_DOUBLE_EQ(t.forward_ms, 1e3 * fwd / kFlops);
  EXPECT_DOUBLE_EQ(t.backward_ms, 2 * t.forward_ms);
  EXPECT_DOUBLE_EQ(t.step_ms, 2 * 3 * t.forward_ms);
  EXPECT_EQ(t.bubble_ms, 0.0);
  EXPECT_EQ(t.tp_ms + t.pp_ms + t.dp_ms, 0.0);
  EXPECT_DOUBLE_EQ(t.tokens_per_s, 2 * B * T / (t.step_ms / 1e3));
  const double model = 6.0 * scalelab::gpt2_num_params(cfg, false) + 12 * L * T * C;
  EXPECT_NEAR(t.mfu, t.tokens_per_s * model / kFlops, 1e-12);
  EXPECT_DOUBLE_EQ(t.hfu, t.mfu);
  // the count above is the matmuls' and attention's; 6N + 12LTC counts layernorm and bias parameters too
  EXPECT_GT(t.mfu, 0.99);
  EXPECT_LT(t.mfu, 1.01);
}

// GPipe / 1F1B: m + p - 1 slots of the slowest stage, p - 1 of them idle, so the bubble is (p - 1) / m of the
// ideal (Narayanan et al. 2021, Sec. 2.2). demo, pp 2: 2 blocks each; the last stage's head makes it slower.
TEST(StepTime, PipelineIsMPlusPMinusOneSlotsOfTheSlowestStage) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // L=4, C=192, V=256
  StepLayout x;
  x.pp = 2;
  x.micro_batch = 2;
  x.seq_len = 64;
  for (int m : {1, 4, 8}) {
    x.micro_batches = m;
    const StepTime t = scalelab::estimate_step_time(cfg, x, cluster());
    const double B = 2, T = 64, C = 192, V = 256;
    const double last_stage_fwd = B * T * (2 * (24 * C * C + 4 * T * C) + 2 * C * V);
    EXPECT_DOUBLE_EQ(t.forward_ms, 1e3 * last_stage_fwd / kFlops);
    EXPECT_DOUBLE_EQ(t.pipeline_ms, (m + 1) * t.slot_ms);
    EXPECT_DOUBLE_EQ(t.bubble_ms / (t.pipeline_ms - t.bubble_ms), 1.0 / m);
  }
}

// Full recompute: the backward runs every block's forward again (recompute_flops_per_token), HFU counts it,
// MFU does not; under tensor parallelism the forward's collectives happen a third time per block.
TEST(StepTime, FullRecomputeAddsAForwardOfTheBlocksAndItsCollectives) {
  const GPTConfig cfg = GPTConfig::preset("d12");
  StepLayout x;
  x.tp = 2;
  x.micro_batch = 4;
  x.seq_len = 256;
  const StepTime none = scalelab::estimate_step_time(cfg, x, cluster("nvlink"));
  x.recompute = Recompute::Full;
  const StepTime full = scalelab::estimate_step_time(cfg, x, cluster("nvlink"));
  const double B = 4, T = 256, C = 768, L = 12;
  EXPECT_NEAR(full.backward_ms - none.backward_ms, 1e3 * B * T * L * (24 * C * C + 4 * T * C) / 2 / kFlops, 1e-9);
  EXPECT_LT(full.mfu, none.mfu);
  EXPECT_GT(full.hfu, full.mfu);
  const LinkModel nv = LinkModel::preset("nvlink");
  const double ar = nv.seconds("all_reduce", static_cast<int64_t>(B * T * C) * 4, 2);
  EXPECT_NEAR(full.tp_ms - none.tp_ms, 1e3 * L * 2 * ar, 1e-9);
  EXPECT_GT(none.tp_ms, 1e3 * L * 4 * ar);  // 4 per block, plus the embedding's, the head's and cross-entropy's
}

// Data parallelism adds the gradient all-reduce the link model charges (ZeRO-1: a reduce-scatter and an
// all-gather of the same bytes, the same bus traffic); the global batch grows with dp.
TEST(StepTime, DataParallelAddsTheGradientAllReduce) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  StepLayout x;
  x.micro_batch = 4;
  x.seq_len = 64;
  const StepTime one = scalelab::estimate_step_time(cfg, x, cluster("ethernet100"));
  x.dp = 4;
  const StepTime four = scalelab::estimate_step_time(cfg, x, cluster("ethernet100"));
  const double C = 192, V = 256, L = 4;
  const int64_t grad_bytes = static_cast<int64_t>(L * (12 * C * C + 13 * C) + V * C + cfg.max_seq_len * C) * 4;
  EXPECT_NEAR(four.dp_ms, 1e3 * LinkModel::preset("ethernet100").seconds("all_reduce", grad_bytes, 4), 1e-9);
  EXPECT_DOUBLE_EQ(four.pipeline_ms, one.pipeline_ms);
  EXPECT_NEAR(four.tokens_per_s, 4 * one.tokens_per_s * one.step_ms / four.step_ms, 1e-6);
  x.zero1 = true;
  const StepTime z1 = scalelab::estimate_step_time(cfg, x, cluster("ethernet100"));
  EXPECT_GT(z1.dp_ms, 0.9 * four.dp_ms);
  EXPECT_LT(z1.dp_ms, 1.1 * four.dp_ms);
}

// A layout the model cannot take, or a cluster with no compute: a clear error naming the numbers.
TEST(StepTime, BadLayoutsAndClustersAreRefused) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // NH = 4, L = 4
  StepLayout x;
  x.tp = 3;
  EXPECT_TRUE(contains(error_message([&] { scalelab::estimate_step_time(cfg, x, cluster()); }), "3")) << "tp 3";
  x.tp = 1;
  x.pp = 5;
  const std::string pp = error_message([&] { scalelab::estimate_step_time(cfg, x, cluster()); });
  EXPECT_TRUE(contains(pp, "pp=5") && contains(pp, "L=4")) << pp;
  x.pp = 1;
  x.micro_batches = 0;
  EXPECT_TRUE(contains(error_message([&] { scalelab::estimate_step_time(cfg, x, cluster()); }), "m=0"));
  x.micro_batches = 1;
  StepCluster none = cluster();
  none.flops_per_s = 0;
  const std::string c = error_message([&] { scalelab::estimate_step_time(cfg, x, none); });
  EXPECT_TRUE(contains(c, "no compute")) << c;
}
