// test_per_op_pricing.cpp — lab 09's given per-op pricing (labs/09_planner/layouts.cpp: stage_op_seconds)
// against the simulated device's own clock: the tiny model's forward and backward on Device::SIM, timed by
// the virtual clock that charges every op, copy and zeroing (common's per-op cost model), must take the
// seconds the planner's sum says, for each recompute mode and attention. The whole step against the lab
// programs' runs: tests/lab09/check_per_op_plan.py (ctest lab09.per_op_plan_vs_sim).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lab09_support.h"            // defines: lab09_test::layout
#include "planner.h"                  // defines: lab09::stage_op_seconds (this program links lab09_ref)
#include "scalelab/core/allocator.h"  // defines: Allocator (the SIM capacity, reset after)
#include "scalelab/core/clock.h"      // defines: VirtualClock
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig, Recompute, AttentionImpl

namespace {

using namespace scalelab;
using namespace scalelab::lab09;

// Makes the H100 model the active GPU for one test, and leaves none active (capacity uncapped) after it.
struct ActiveGpu {
  explicit ActiveGpu(const GpuModel& model) { sim_gpu_set(model); }
  ~ActiveGpu() {
    sim_gpu_clear();
    Allocator::get(Device::SIM).set_capacity_bytes(0);
  }
};

struct Measured {
  double forward = 0, backward = 0;  // seconds on the virtual clock's compute stream
};

// One micro-batch of B sequences of T tokens through the dense model on the simulated device (the second
// one: the first allocates the activations and scratch, as a lab's first step does).
Measured run_on_sim(const GPTConfig& cfg, int B, int T, Recompute mode, AttentionImpl attention) {
  GPT2 model(cfg, PrecisionPolicy::fp32(), Device::SIM, 1337);
  model.set_recompute(mode);
  model.set_attention(attention);
  Tensor host = Tensor::empty({B, T}, DType::I32, Device::CPU);
  for (int64_t i = 0; i < host.numel(); ++i)
    host.data<int32_t>()[i] = static_cast<int32_t>((7 * i + 3) % cfg.vocab_size);
  Tensor tokens = Tensor::empty({B, T}, DType::I32, Device::SIM),
         targets = Tensor::empty({B, T}, DType::I32, Device::SIM);
  tokens.copy_from(host);
  targets.copy_from(host);
  Measured m;
  VirtualClock& clock = VirtualClock::get();
  for (int pass = 0; pass < 2; ++pass) {
    const double t0 = clock.compute_s();
    model.forward(tokens, &targets);
    const double t1 = clock.compute_s();
    model.backward();
    m = {t1 - t0, clock.compute_s() - t1};
  }
  return m;
}

TEST(PerOpPricing, AStagesOpsCostWhatTheSimulatedDeviceCharges) {
  const GpuModel gpu = GpuModel::preset("h100");
  ActiveGpu active(gpu);
  GPTConfig cfg = GPTConfig::preset("tiny");
  const int B = 2, T = 16;
  cfg.max_seq_len = T;
  Workload w;
  w.seq_len = T;
  w.global_batch = B;
  w.policy = PrecisionPolicy::fp32();
  for (AttentionImpl attention : {AttentionImpl::Materialized, AttentionImpl::Flash})
    for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      w.attention = attention;
      Layout x = lab09_test::layout(1, 1, 1, B, 1);
      x.recompute = mode;
      const StageOpSeconds priced = stage_op_seconds(cfg, x, 0, w, gpu);
      const Measured sim = run_on_sim(cfg, B, T, mode, attention);
      SCOPED_TRACE(std::string("recompute ") + recompute_name(mode) +
                   (attention == AttentionImpl::Flash ? ", flash" : ", materialized"));
      EXPECT_NEAR(priced.forward, sim.forward, 1e-9 * sim.forward) << "forward, seconds";
      EXPECT_NEAR(priced.backward, sim.backward, 1e-9 * sim.backward) << "backward, seconds";
    }
}

}  // namespace
