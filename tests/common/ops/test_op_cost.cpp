// test_op_cost.cpp — the op cost model (scalelab/ops/op_cost.h): FLOPs, bytes and launches of each op class
// counted by hand on small shapes, the roofline of docs/simulation.md rule 2 on a GPU with round figures,
// and the dispatch charging SIM ops to the virtual clock (and to the op profile, in modelled ms).
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, Device
#include "scalelab/core/clock.h"      // defines: VirtualClock
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "scalelab/core/tensor.h"     // defines: Tensor
#include "scalelab/ops/op_cost.h"     // defines: OpCost, op_seconds, op_cost::<op>
#include "scalelab/ops/op_profile.h"  // defines: op_profile_enable, op_profile_table
#include "scalelab/ops/ops.h"         // defines: gelu_forward, matmul_forward

namespace scalelab {
namespace {

using test::contains;
using test::error_message;

void expect_cost(const OpCost& c, double flops, double bytes, int64_t launches, OpClass cls, DType math,
                 const char* what) {
  EXPECT_EQ(c.flops, flops) << what;
  EXPECT_EQ(c.bytes, bytes) << what;
  EXPECT_EQ(c.launches, launches) << what;
  EXPECT_EQ(c.op_class, cls) << what;
  EXPECT_EQ(c.math, math) << what;
}

// Round figures, so that every expected time below is worked out by hand: fp32 1000 FLOP/s, bf16 4000,
// achieved matmul 50 %, attention 25 %; HBM 100 bytes/s, 50 % achieved; 1 s per launch.
GpuModel round_gpu() {
  GpuModel m = GpuModel::preset("h100");
  m.fp32_flops_per_s = 1000;
  m.bf16_flops_per_s = 4000;
  m.eff_matmul = 0.5;
  m.eff_attention = 0.25;
  m.hbm_bytes_per_s = 100;
  m.eff_memory = 0.5;
  m.launch_s = 1;
  return m;
}

// ---- Matmul: inp (N=4, C=3), weight (OC=2, C=3), out (4, 2), bias (2).

TEST(OpCost, MatmulCountsTwoFlopsPerMultiplyAddAndEachOperandOnce) {
  // 2*4*3*2 = 48 FLOPs; r inp 12 + weight 6 + bias 2, w out 8 elements: 28 * 4 bytes
  expect_cost(op_cost::matmul_forward(4, 3, 2, /*bias=*/true), 48, 112, 1, OpClass::Matmul, DType::F32, "fp32");
  // bf16 operands are 2 bytes: r 18 * 2, w out 8 * 4 (no bias)
  expect_cost(op_cost::matmul_forward(4, 3, 2, /*bias=*/false, DType::BF16), 48, 68, 1, OpClass::Matmul, DType::BF16,
              "bf16");
  // backward: dinp GEMM r dout 8, weight 6, r+w dinp 24 -> 152 bytes; dweight GEMM r dout 8, inp 12, r+w
  // dweight 12 -> 128 bytes; dbias: r dout 8, r+w dbias 4 -> 48 bytes, two kernels
  expect_cost(op_cost::matmul_backward(4, 3, 2, true, true, true), 96, 152 + 128 + 48, 4, OpClass::Matmul, DType::F32,
              "backward");
}

TEST(OpCost, MatmulBackwardInPartsCostsWhatItCostsWhole) {
  const OpCost whole = op_cost::matmul_backward(64, 48, 32, true, true, true);
  const OpCost b = op_cost::matmul_backward(64, 48, 32, true, false, false);
  const OpCost w = op_cost::matmul_backward(64, 48, 32, false, true, true);
  EXPECT_EQ(b.flops + w.flops, whole.flops);
  EXPECT_EQ(b.bytes + w.bytes, whole.bytes);
  EXPECT_EQ(b.launches + w.launches, whole.launches);
}

// ---- Attention: B=1, T=4, C=8, NH=2 (HS=4). X = B*T*C = 32 elements, A = B*NH*T*T = 32 scores.

TEST(OpCost, MaterializedAttentionCountsTheWholeSquareAndTheScoresRoundTrips) {
  // per head 2 products of T*T*HS = 64 multiply-adds: 2 * 2 * 64 * 2 heads = 512 FLOPs; bytes 4*(4X + 4A);
  // launches 2 GEMMs per head + the softmax
  expect_cost(op_cost::attention_forward(1, 4, 8, 2), 512, 4 * (4 * 32 + 4 * 32), 5, OpClass::Attention, DType::F32,
              "forward");
  // backward: 4 products (1024 FLOPs); bytes 4*(11X + 7A); 4 GEMMs per head + the softmax backward
  expect_cost(op_cost::attention_backward(1, 4, 8, 2), 1024, 4 * (11 * 32 + 7 * 32), 9, OpClass::Attention, DType::F32,
              "backward");
}

TEST(OpCost, FlashAttentionCountsTheCausalPairsAndTheBackwardsRecomputation) {
  // T(T+1)/2 = 10 pairs per head, HS = 4: forward 2 products * 4 MACs * 2 FLOPs * 10 pairs * 2 heads = 320;
  // r qkv 3X, w out X and lse B*NH*T = 8: 4*(4*32 + 8) bytes, one kernel
  expect_cost(op_cost::attention_forward_flash(1, 4, 8, 2), 320, 4 * (4 * 32 + 8), 1, OpClass::Attention, DType::F32,
              "forward");
  // backward: 7 products per pair (S and dP in both passes, dv, dk, dq): 7 * 2 * 4 * 10 * 2 = 1120 FLOPs;
  // bytes 4*(16X + 5*8); three kernels
  expect_cost(op_cost::attention_backward_flash(1, 4, 8, 2), 1120, 4 * (16 * 32 + 5 * 8), 3, OpClass::Attention,
              DType::F32, "backward");
}

// ---- Memory-bound ops: no FLOPs counted, the elements each kernel reads and writes.

TEST(OpCost, MemoryBoundOpsCountTheirElementsOnce) {
  expect_cost(op_cost::gelu_forward(1000), 0, 4 * 2000, 1, OpClass::MemoryBound, DType::F32, "gelu r inp w out");
  expect_cost(op_cost::gelu_backward(1000), 0, 4 * 4000, 1, OpClass::MemoryBound, DType::F32, "gelu r 2, r+w dinp");
  // layernorm N=4, C=8: r inp 32, weight 8, bias 8; w out 32, mean 4, rstd 4
  expect_cost(op_cost::layernorm_forward(4, 8), 0, 4 * 88, 1, OpClass::MemoryBound, DType::F32, "layernorm");
  // AdamW: r grad, r+w param, m, v: 7 per element
  expect_cost(op_cost::adamw_update(10), 0, 280, 1, OpClass::MemoryBound, DType::F32, "adamw");
  // encoder B=2, T=3, C=4 (N=6): r tokens 6, wte rows 24, wpe rows 24, w out 24; the token check r 6, +1 kernel
  expect_cost(op_cost::encoder_forward(2, 3, 4), 0, 4 * 84, 2, OpClass::MemoryBound, DType::F32, "encoder");
  // cross-entropy N=6, V=10: r logits 60, targets 6; w probs 60, losses 6; the check r 6, +1 kernel
  expect_cost(op_cost::softmax_crossentropy_forward(6, 10), 0, 4 * 138, 2, OpClass::MemoryBound, DType::F32, "xent");
  // cast 10 elements f32 -> bf16: r 40 bytes, w 20
  expect_cost(op_cost::cast(10, DType::BF16, DType::F32), 0, 60, 1, OpClass::MemoryBound, DType::F32, "cast");
}

// ---- The roofline (rule 2) on round_gpu.

TEST(OpCost, SecondsAreLaunchesPlusTheSlowerOfComputeAndMemory) {
  const GpuModel gpu = round_gpu();
  // small matmul: compute 48 / 500 = 0.096 s, memory 112 / 50 = 2.24 s: memory-bound; + 1 launch
  EXPECT_DOUBLE_EQ(op_seconds(op_cost::matmul_forward(4, 3, 2, true), gpu), 1 + 2.24);
  // 64^3 fp32: compute 524288 / 500 = 1048.576 s beats memory 4*(2*4096 + 4096) / 50 = 983.04 s
  EXPECT_DOUBLE_EQ(op_seconds(op_cost::matmul_forward(64, 64, 64, false), gpu), 1 + 1048.576);
  // the same in bf16: the tensor-core peak (524288 / 2000 = 262.144 s) makes it memory-bound:
  // (2*2*4096 + 4*4096) / 50 = 655.36 s
  EXPECT_DOUBLE_EQ(op_seconds(op_cost::matmul_forward(64, 64, 64, false, DType::BF16), gpu), 1 + 655.36);
  // attention at 25 %: compute 512 / 250 = 2.048 s, memory 1024 / 50 = 20.48 s; 5 launches
  EXPECT_DOUBLE_EQ(op_seconds(op_cost::attention_forward(1, 4, 8, 2), gpu), 5 + 20.48);
  // memory-bound: 8000 / 50 = 160 s + 1 launch
  EXPECT_DOUBLE_EQ(op_seconds(op_cost::gelu_forward(1000), gpu), 161);
}

// ---- The dispatch: ops on SIM tensors charge their modelled seconds.

struct ActiveGpu {
  explicit ActiveGpu(const GpuModel& model) { sim_gpu_set(model); }
  ~ActiveGpu() {
    sim_gpu_clear();
    Allocator::get(Device::SIM).set_capacity_bytes(0);
  }
};

TEST(OpCost, AnOpOnSimTensorsAdvancesTheComputeStreamByItsModelledSeconds) {
  const GpuModel gpu = GpuModel::preset("h100");
  Tensor inp = Tensor::zeros({6, 16}, DType::F32, Device::SIM);
  Tensor weight = Tensor::zeros({8, 16}, DType::F32, Device::SIM);
  Tensor bias = Tensor::zeros({8}, DType::F32, Device::SIM);
  Tensor out = Tensor::empty({6, 8}, DType::F32, Device::SIM);
  ActiveGpu active(gpu);  // the clock starts at 0 here
  matmul_forward(out, inp, weight, &bias);
  const double matmul_s = op_seconds(op_cost::matmul_forward(6, 16, 8, true), gpu);
  EXPECT_EQ(VirtualClock::get().compute_s(), matmul_s);
  Tensor act = Tensor::empty({6, 8}, DType::F32, Device::SIM);
  gelu_forward(act, out);
  EXPECT_EQ(VirtualClock::get().compute_s(), matmul_s + op_seconds(op_cost::gelu_forward(48), gpu));
  // CPU tensors are not the simulated GPU's: no charge
  Tensor h_out = Tensor::zeros({6, 8}), h_act = Tensor::empty({6, 8});
  const double before = VirtualClock::get().compute_s();
  gelu_forward(h_act, h_out);
  EXPECT_EQ(VirtualClock::get().compute_s(), before);
}

TEST(OpCost, TheOpProfileRecordsModelledMillisecondsOnSim) {
  const GpuModel gpu = GpuModel::preset("a100");
  Tensor x = Tensor::zeros({1 << 20}, DType::F32, Device::SIM);  // 4 MiB
  Tensor y = Tensor::empty({1 << 20}, DType::F32, Device::SIM);
  ActiveGpu active(gpu);
  op_profile_enable(true);
  op_profile_phase("forward");
  gelu_forward(y, x);
  gelu_forward(y, x);
  const std::vector<OpTime> table = op_profile_table();
  op_profile_enable(false);
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table[0].op, "gelu_forward");
  EXPECT_EQ(table[0].calls, 2);
  const double one_ms = 1e3 * op_seconds(op_cost::gelu_forward(1 << 20), gpu);  // 8 MiB at 85 % of 2.039 TB/s
  EXPECT_DOUBLE_EQ(table[0].ms, 2 * one_ms);
}

TEST(OpCost, AnOpOnSimTensorsWithoutAGpuModelIsRefusedWithAHint) {
  ASSERT_FALSE(sim_gpu_active());
  Tensor x = Tensor::zeros({4}, DType::F32, Device::SIM), y = Tensor::empty({4}, DType::F32, Device::SIM);
  const std::string msg = error_message([&] { gelu_forward(y, x); });
  EXPECT_TRUE(contains(msg, "no simulated GPU model is active")) << msg;
  EXPECT_TRUE(contains(msg, "--sim-gpu h100")) << msg;
}

}  // namespace
}  // namespace scalelab
