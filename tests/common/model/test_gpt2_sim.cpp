// test_gpt2_sim.cpp — GPT-2 on the simulated GPU (Device::SIM, docs/simulation.md): the CPU kernels compute,
// so the loss, the gradients and the updated weights are the CPU's bit for bit, while the virtual clock
// advances by exactly the modelled cost of every op and copy of the step (listed here by hand from the
// model's code, common/src/model/gpt2.cpp), and the same run gives the same virtual time every time. Every
// path of common/model (precisions, attention, recompute, clipping, sampling, checkpoints) runs on SIM.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>  // defines: std::remove
#include <cstring>
#include <random>
#include <vector>

#include "scalelab/core/allocator.h"          // defines: Allocator, Device
#include "scalelab/core/clock.h"              // defines: VirtualClock
#include "scalelab/core/sim_gpu.h"            // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "scalelab/core/tensor.h"             // defines: Tensor
#include "scalelab/model/gpt2.h"              // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"             // defines: Optimizer, OptimizerConfig, clip_grad_norm
#include "scalelab/model/sample.h"            // defines: sample_text
#include "scalelab/model/train_checkpoint.h"  // defines: save_train_checkpoint, load_train_checkpoint
#include "scalelab/ops/op_cost.h"             // defines: op_seconds, op_cost::<op>

namespace scalelab {
namespace {

constexpr int kB = 2, kT = 8;  // batch, sequence length (tiny: maxT 16, V 64, L 2, NH 2, C 16)

// (B,T) i32 tokens uniform in [0, V), on the host (mt19937's sequence is fixed by the standard).
Tensor random_tokens(int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({kB, kT}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

// A device tensor's bytes, read as host code must: through a copy to the CPU.
std::vector<uint8_t> host_bytes(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.dtype(), Device::CPU);
  h.copy_from(t);
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// How a run differs from the default (fp32, materialized attention, no recompute, no clipping).
struct Variant {
  const char* name = "fp32";
  PrecisionPolicy policy = PrecisionPolicy::fp32();
  AttentionImpl attention = AttentionImpl::Materialized;
  Recompute recompute = Recompute::None;
  float clip = 0.0f;  // max gradient norm; 0: no clipping
};

struct StepResult {
  float loss = 0;
  std::vector<std::vector<uint8_t>> grads, params;  // per unit, after the step
  double step_s = 0;                                // virtual seconds of the second step (0 on CPU)
};

// Two training steps of the tiny model on `device` (zero_grad, forward from host tokens, backward, AdamW);
// the second is the one compared and timed (the first allocates the activations and the scratch).
StepResult train(Device device, const GpuModel* gpu, const Variant& v = Variant{}) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  if (gpu != nullptr) sim_gpu_set(*gpu);
  GPT2 model(cfg, v.policy, device, /*seed=*/7);
  model.set_attention(v.attention);
  model.set_recompute(v.recompute);
  Optimizer opt(model, OptimizerConfig{});
  StepResult r;
  for (int step = 0; step < 2; ++step) {
    const Tensor tokens = random_tokens(cfg.vocab_size, 100 + step),
                 targets = random_tokens(cfg.vocab_size, 200 + step);
    const double t0 = VirtualClock::get().compute_s();
    model.zero_grad();
    r.loss = model.forward(tokens, &targets);
    model.backward();
    if (v.clip > 0) clip_grad_norm(model, v.clip);
    opt.step(1e-3f);
    r.step_s = VirtualClock::get().compute_s() - t0;
  }
  for (int u = 0; u < model.num_units(); ++u) {
    r.grads.push_back(host_bytes(model.unit_grads(u)));
    r.params.push_back(host_bytes(model.unit_params(u)));
  }
  if (gpu != nullptr) {
    sim_gpu_clear();
    Allocator::get(Device::SIM).set_capacity_bytes(0);
  }
  return r;
}

// What one step of the tiny fp32 model should cost on `gpu`, op by op in the order the model runs them
// (gpt2.cpp forward / backward, optim.cpp Optimizer::step), each added to `t` as the clock adds it.
double expected_step_end(const GPTConfig& cfg, const GpuModel& gpu, double t) {
  const int64_t B = kB, T = kT, C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size, N = B * T;
  auto op = [&](const OpCost& c) { t += op_seconds(c, gpu); };
  auto zero = [&](int64_t floats) { t += gpu.zero_seconds(4 * floats); };
  auto upload = [&](int64_t bytes) { t += gpu.copy_seconds(bytes, Device::SIM, Device::CPU); };
  auto download = [&](int64_t bytes) { t += gpu.copy_seconds(bytes, Device::CPU, Device::SIM); };
  // zero_grad: every unit's gradient buffer
  for (int64_t n : gpt2_unit_numel(cfg)) zero(n);
  // forward: tokens and targets up, the embedding, L blocks, ln_f, the tied head, the loss, the losses down
  upload(4 * N);
  upload(4 * N);
  op(op_cost::encoder_forward(B, T, C));
  for (int l = 0; l < cfg.n_layer; ++l) {
    op(op_cost::layernorm_forward(N, C));
    op(op_cost::matmul_forward(N, C, 3 * C, true));
    op(op_cost::attention_forward(B, T, C, NH));
    op(op_cost::matmul_forward(N, C, C, true));
    op(op_cost::residual_forward(N * C));
    op(op_cost::layernorm_forward(N, C));
    op(op_cost::matmul_forward(N, C, 4 * C, true));
    op(op_cost::gelu_forward(N * 4 * C));
    op(op_cost::matmul_forward(N, 4 * C, C, true));
    op(op_cost::residual_forward(N * C));
  }
  op(op_cost::layernorm_forward(N, C));
  op(op_cost::matmul_forward(N, C, V, false));
  op(op_cost::softmax_crossentropy_forward(N, V));
  download(4 * N);
  // backward: the loss and the head, ln_f, the blocks last to first (each scratch gradient zeroed before the
  // op that adds into it), the embedding
  op(op_cost::softmax_crossentropy_backward(N, V));
  zero(N * C);
  op(op_cost::matmul_backward(N, C, V, true, true, false));
  zero(N * C);
  op(op_cost::layernorm_backward(N, C));
  for (int l = 0; l < cfg.n_layer; ++l) {
    zero(N * 4 * C);
    op(op_cost::matmul_backward(N, 4 * C, C, true, true, true));
    zero(N * 4 * C);
    op(op_cost::gelu_backward(N * 4 * C));
    zero(N * C);
    op(op_cost::matmul_backward(N, C, 4 * C, true, true, true));
    op(op_cost::layernorm_backward(N, C));
    zero(N * C);
    op(op_cost::matmul_backward(N, C, C, true, true, true));
    zero(N * 3 * C);
    op(op_cost::attention_backward(B, T, C, NH));
    zero(N * C);
    op(op_cost::matmul_backward(N, C, 3 * C, true, true, true));
    op(op_cost::layernorm_backward(N, C));
  }
  op(op_cost::encoder_backward(B, T, C));
  // AdamW: one update per parameter, unit by unit in table order
  for (int u = 0; u < cfg.n_layer + 2; ++u)
    for (const ParamInfo& p : gpt2_param_table(cfg))
      if (p.unit == u) op(op_cost::adamw_update(p.numel));
  return t;
}

TEST(Gpt2Sim, AStepOnTheSimulatedGpuComputesTheCpusBitsAndChargesEveryOpAndCopy) {
  const GpuModel h100 = GpuModel::preset("h100");
  const StepResult cpu = train(Device::CPU, nullptr);
  const StepResult sim = train(Device::SIM, &h100);
  EXPECT_EQ(sim.loss, cpu.loss);
  ASSERT_EQ(sim.grads.size(), cpu.grads.size());
  for (size_t u = 0; u < cpu.grads.size(); ++u) {
    EXPECT_EQ(sim.grads[u], cpu.grads[u]) << "unit " << u << ": gradients differ";
    EXPECT_EQ(sim.params[u], cpu.params[u]) << "unit " << u << ": weights after AdamW differ";
  }
  EXPECT_EQ(cpu.step_s, 0.0) << "a CPU run charges nothing to the virtual clock";
  // The clock's sum and this one add the same terms in the same order; the tolerance only forgives a
  // different association of the sums, far below the smallest term (one 5 us launch in a ~ms step).
  const double expected = expected_step_end(GPTConfig::preset("tiny"), h100, 0.0);
  EXPECT_NEAR(sim.step_s, expected, 1e-12 * expected);
  EXPECT_GT(sim.step_s, 0.0);
}

TEST(Gpt2Sim, TheSameRunGivesTheSameVirtualTimeEveryTime) {
  const GpuModel a100 = GpuModel::preset("a100");
  const StepResult first = train(Device::SIM, &a100);
  const StepResult second = train(Device::SIM, &a100);
  EXPECT_EQ(first.step_s, second.step_s);  // bit for bit: nothing reads the wall clock
  EXPECT_EQ(first.loss, second.loss);
  // Another GPU model gives another time, the same arithmetic.
  const GpuModel rtx = GpuModel::preset("rtx4090");
  const StepResult other = train(Device::SIM, &rtx);
  EXPECT_NE(other.step_s, first.step_s);
  EXPECT_EQ(other.loss, first.loss);
}

// Every path of the model runs with all its tensors on SIM (no host read of device memory anywhere in
// common/model) and computes the CPU's bits: the bf16 policies (casts, master weights), flash attention,
// both recompute modes, gradient clipping (sum_squares, scale_).
TEST(Gpt2Sim, EveryPathOfTheModelComputesTheCpusBitsOnSim) {
  const GpuModel h200 = GpuModel::preset("h200");
  Variant bf16_mixed, bf16_compute, flash, selective, full, clip;
  bf16_mixed.name = "bf16_mixed";
  bf16_mixed.policy = PrecisionPolicy::bf16_mixed();
  bf16_compute.name = "bf16_compute";
  bf16_compute.policy = PrecisionPolicy::bf16_compute();
  flash.name = "flash attention";
  flash.attention = AttentionImpl::Flash;
  selective.name = "selective recompute";
  selective.recompute = Recompute::Selective;
  full.name = "full recompute";
  full.recompute = Recompute::Full;
  clip.name = "clip_grad_norm";
  clip.clip = 1e-3f;  // far below the tiny model's gradient norm: every gradient is scaled
  for (const Variant& v : {bf16_mixed, bf16_compute, flash, selective, full, clip}) {
    const StepResult cpu = train(Device::CPU, nullptr, v);
    const StepResult sim = train(Device::SIM, &h200, v);
    EXPECT_EQ(sim.loss, cpu.loss) << v.name;
    EXPECT_EQ(sim.grads, cpu.grads) << v.name;
    EXPECT_EQ(sim.params, cpu.params) << v.name;
    EXPECT_GT(sim.step_s, 0.0) << v.name;
  }
}

// Sampling reads the logits and a checkpoint the weights through copies to the host, so both work on SIM.
TEST(Gpt2Sim, SamplingAndTrainCheckpointsWorkOnSim) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // the byte vocabulary sample_text needs
  sim_gpu_set(GpuModel::preset("h100"));
  GPT2 cpu_model(cfg, PrecisionPolicy::fp32(), Device::CPU, /*seed=*/3);
  GPT2 sim_model(cfg, PrecisionPolicy::fp32(), Device::SIM, /*seed=*/3);
  Rng rng_cpu(11), rng_sim(11);
  EXPECT_EQ(sample_text(sim_model, "In the beginning", 8, rng_sim),
            sample_text(cpu_model, "In the beginning", 8, rng_cpu));

  Optimizer opt(sim_model, OptimizerConfig{});
  TrainState state;
  state.step = 5;
  const std::string path = ::testing::TempDir() + "gpt2_sim_ckpt.bin";
  save_train_checkpoint(path, sim_model, opt, state);
  GPT2 loaded(cfg, PrecisionPolicy::fp32(), Device::SIM, /*seed=*/99);  // other weights until loaded
  Optimizer loaded_opt(loaded, OptimizerConfig{});
  EXPECT_EQ(load_train_checkpoint(path, loaded, loaded_opt).step, 5);
  for (int u = 0; u < loaded.num_units(); ++u)
    EXPECT_EQ(host_bytes(loaded.unit_params(u)), host_bytes(sim_model.unit_params(u))) << "unit " << u;
  std::remove(path.c_str());
  sim_gpu_clear();
  Allocator::get(Device::SIM).set_capacity_bytes(0);
}

}  // namespace
}  // namespace scalelab
