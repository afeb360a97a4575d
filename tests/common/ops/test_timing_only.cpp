// test_timing_only.cpp — --timing-only on the simulated GPU (core/sim_gpu.h sim_set_timing_only, docs/simulation.md
// "Timing-only runs"): the SIM allocator counts exactly without backing, ops and copies charge what a real run
// charges and compute nothing, host values still move, and no initial weights are drawn.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "scalelab/core/allocator.h"  // defines: Allocator, Device, MemCategory
#include "scalelab/core/clock.h"      // defines: VirtualClock
#include "scalelab/core/sim_gpu.h"    // defines: sim_gpu_set, sim_set_timing_only, SimRealDataScope
#include "scalelab/core/tensor.h"     // defines: Tensor
#include "scalelab/model/gpt2.h"      // defines: gpt2_initial_weights, GPTConfig
#include "scalelab/ops/op_cost.h"     // defines: op_cost::matmul_forward, op_seconds
#include "scalelab/ops/ops.h"         // defines: matmul_forward, sum_squares

namespace scalelab {
namespace {

// An active H100, timing-only on, for one test; both off after it (and the SIM allocator uncapped).
struct TimingOnly {
  TimingOnly() {
    sim_gpu_set(GpuModel::preset("h100"));
    sim_set_timing_only(true);
  }
  ~TimingOnly() {
    sim_set_timing_only(false);
    sim_gpu_clear();
    Allocator::get(Device::SIM).set_capacity_bytes(0);
  }
};

// This process's resident memory, bytes (/proc/self/statm: pages).
int64_t resident_bytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return got == 2 ? static_cast<int64_t>(pages_resident) * 4096 : -1;
}

TEST(TimingOnly, SimMemoryIsCountedExactlyButNotBacked) {
  TimingOnly on;
  const int64_t before = resident_bytes();
  ASSERT_GT(before, 0);
  {
    // 40 GB of "device memory" on a machine of far less: counted to the byte, zeroed (charged), never touched.
    Tensor big = Tensor::zeros({10'000'000'000}, DType::F32, Device::SIM, MemCategory::Activations);
    const MemStats s = Allocator::get(Device::SIM).stats();
    EXPECT_EQ(s.current_bytes[static_cast<int>(MemCategory::Activations)], 40'000'000'000);
    EXPECT_LT(resident_bytes() - before, int64_t{64} << 20) << "the SIM block was backed by host memory";
    EXPECT_GT(VirtualClock::get().compute_s(), 40e9 / 3.35e12) << "zero_ is charged at HBM bandwidth";
  }
  EXPECT_EQ(Allocator::get(Device::SIM).stats().total_current_bytes, 0) << "freed (munmap) and uncounted";
}

TEST(TimingOnly, AnOpChargesItsModelledTimeAndComputesNothing) {
  TimingOnly on;
  // out is 32 MiB: an op that wrote it would make it resident.
  const int64_t N = 2048, C = 16, OC = 4096;
  Tensor h_inp = Tensor::empty({N, C}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < N * C; i++) h_inp.data<float>()[i] = 1.0f;
  Tensor inp = Tensor::empty({N, C}, DType::F32, Device::SIM), w = Tensor::empty({OC, C}, DType::F32, Device::SIM);
  Tensor out = Tensor::empty({N, OC}, DType::F32, Device::SIM);
  inp.copy_from(h_inp);
  const int64_t before = resident_bytes();
  const double t0 = VirtualClock::get().compute_s();
  matmul_forward(out, inp, w, nullptr);
  EXPECT_DOUBLE_EQ(VirtualClock::get().compute_s() - t0,
                   op_seconds(op_cost::matmul_forward(N, C, OC, false), sim_gpu()))
      << "the same charge as a real run's";
  EXPECT_LT(resident_bytes() - before, int64_t{8} << 20) << "the op wrote its 32 MiB output";
  EXPECT_EQ(sum_squares(inp), 0.0) << "the one op with a result reads 0: a norm that clips nothing";
  Tensor h_out = Tensor::empty({4}, DType::F32, Device::CPU);
  for (int64_t i = 0; i < 4; i++) h_out.data<float>()[i] = 7.0f;
  h_out.copy_from(out.view(0, {4}));
  for (int64_t i = 0; i < 4; i++) ASSERT_EQ(h_out.data<float>()[i], 0.0f) << "a copy back reads zeros";
}

TEST(TimingOnly, HostValuesStillMoveInsideARealDataScope) {
  TimingOnly on;
  Tensor h = Tensor::empty({4}, DType::I32, Device::CPU), back = Tensor::empty({4}, DType::I32, Device::CPU);
  for (int i = 0; i < 4; i++) h.data<int32_t>()[i] = 10 + i;
  Tensor d = Tensor::empty({4}, DType::I32, Device::SIM);
  {
    SimRealDataScope real_data;
    EXPECT_FALSE(sim_skips_data());
    d.copy_from(h);
    back.copy_from(d);
  }
  EXPECT_TRUE(sim_skips_data());
  EXPECT_EQ(std::memcmp(h.data<int32_t>(), back.data<int32_t>(), 16), 0) << "the bytes went there and back";
}

TEST(TimingOnly, NoInitialWeightsAreDrawn) {
  TimingOnly on;
  int units = 0;
  gpt2_initial_weights(GPTConfig::preset("tiny"), 1, [&](int, const Tensor&) { units++; });
  EXPECT_EQ(units, 0);
  sim_set_timing_only(false);
  gpt2_initial_weights(GPTConfig::preset("tiny"), 1, [&](int, const Tensor&) { units++; });
  EXPECT_EQ(units, GPTConfig::preset("tiny").n_layer + 2) << "a real run draws every unit";
}

}  // namespace
}  // namespace scalelab
