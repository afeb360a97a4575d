// test_fences_sim.cpp — the reference fences that reduce a host value (a norm, a loss, a spike flag) run on
// the sim backend (docs/simulation.md): lab04-7, lab06-8, lab07-6, lab07-7 and lab08-5 on 4 ranks, each
// step on the simulated GPU (Device::SIM, the sim backend: NCCL's contract, device tensors only) gives the
// loss and the gradient norm of the same step on CPU ranks (mpi backend). A fence that all-reduces a CPU
// tensor is refused there ("host tensor"), so these fail on such a body. Not graded: the learner's code is
// graded by the lab checks; this keeps the references usable on a GPU cluster. One TEST per lab, 4 ranks.
#include <gtest/gtest.h>

#include <cmath>  // defines: std::isnan
#include <limits>
#include <memory>
#include <utility>  // defines: std::pair
#include <string>
#include <vector>

#include "data_parallel.h"            // defines: dp_test::random_global_batch, batch_rows, rank_micro_batches
#include "fsdp.h"                     // defines: lab04::FSDP, train_step (reference track)
#include "mpi_test.h"                 // defines: test::world
#include "parallel_3d.h"              // defines: lab07::make_layout, build_rank, train_step
#include "pipeline_parallel.h"        // defines: lab06::make_layout, Stage, StageExchange, train_step
#include "resilience.h"               // defines: lab08::decide_rollback
#include "scalelab/comm/comm.h"       // defines: Communicator, make_communicator
#include "scalelab/comm/rank_grid.h"  // defines: RankGrid
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "scalelab/core/tensor.h"     // defines: Tensor, Device
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig

namespace scalelab {
namespace {

namespace test = scalelab::test;
constexpr uint64_t kSeed = 1234;
constexpr int kB = 2, kT = 8;                // one micro-batch: (B, T) tokens
constexpr float kLr = 1e-3f, kClip = 0.05f;  // a clip that bites: the norm's every factor matters
const GPTConfig kConfig{16, 64, 4, 2, 16};   // maxT, V, L, NH, C: 4 layers for 4 stages

// A run on the simulated cluster: an active H100 model (the virtual clock on) and a sim world, or the
// test's own CPU world on the mpi backend.
struct Cluster {
  bool sim = false;
  std::unique_ptr<Communicator> own;
  Communicator* world = nullptr;
  explicit Cluster(bool simulated) : sim(simulated) {
    if (sim) {
      sim_gpu_set(GpuModel::preset("h100"));
      own = make_communicator("sim");
      world = own.get();
    } else {
      world = &test::world();
    }
  }
  ~Cluster() {
    own.reset();
    if (sim) sim_gpu_clear();
  }
  Device device() const { return sim ? Device::SIM : Device::CPU; }
  // Host tokens on the run's device, as a GPU program copies a batch in.
  Tensor on_device(const Tensor& host) const {
    if (!sim) return host;
    Tensor t = Tensor::empty(host.shape(), host.dtype(), Device::SIM);
    t.copy_from(host);
    return t;
  }
  template <class MB>
  std::vector<MB> moved(std::vector<MB> micro) const {
    for (MB& mb : micro) mb = MB{on_device(mb.inputs), on_device(mb.targets)};
    return micro;
  }
};

// Rows [first, first + m * kB) of the seeded global batch as m micro-batches.
std::vector<MicroBatch> micro_batches(int first_row, int m) {
  const dp_test::GlobalBatch g = dp_test::random_global_batch(kSeed, 64, kT, kConfig.vocab_size);
  std::vector<MicroBatch> out;
  for (int i = 0; i < m; ++i) {
    const dp_test::GlobalBatch rows = dp_test::batch_rows(g, first_row + i * kB, kB);
    out.push_back({rows.inputs, rows.targets});
  }
  return out;
}

// The sim step must give the CPU step's loss and norm: the same arithmetic, the same reduction order.
void expect_same(const char* what, const StepResult& sim, const StepResult& cpu) {
  EXPECT_FLOAT_EQ(sim.loss, cpu.loss) << what << ": the loss on the sim backend";
  EXPECT_FLOAT_EQ(sim.grad_norm, cpu.grad_norm) << what << ": the gradient norm on the sim backend";
  EXPECT_GT(cpu.grad_norm, kClip) << what << ": the clip must bite";
}

// lab04-7 (clip_grad_norm_sharded) inside lab 04's train_step, ZeRO-3.
StepResult fsdp_step(bool simulated) {
  Cluster c(simulated);
  lab04::FsdpOptions o;
  o.stage = lab04::ZeroStage::Zero3;
  lab04::FSDP fsdp(kConfig, PrecisionPolicy::fp32(), c.device(), kSeed, *c.world, o);
  const int n = c.world->size(), r = c.world->rank();
  const std::vector<MicroBatch> all = micro_batches(0, n);
  std::vector<MicroBatch> mine{{c.on_device(all[r].inputs), c.on_device(all[r].targets)}};
  return lab04::train_step(fsdp, mine, kLr, kClip);
}

TEST(FencesOnSim, Lab04ClipGradNormSharded) {
  const StepResult sim = fsdp_step(true), cpu = fsdp_step(false);
  expect_same("lab 04 ZeRO-3", sim, cpu);
}

// lab06-8 (train_step: the norm and the loss in one all-reduce), 4 stages of 1F1B.
StepResult pipeline_step(bool simulated) {
  Cluster c(simulated);
  const int p = c.world->size(), m = 4;
  const lab06::PipelineLayout l =
      lab06::make_layout(kConfig, p, c.world->rank(), lab06::ScheduleKind::OneFOneB, m, /*v=*/1);
  RankGrid grid(*c.world, 1, p, 1);
  GPT2 model(kConfig, lab06::chunk_shard(kConfig, l, 0), PrecisionPolicy::fp32(), c.device(), kSeed);
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  optimizers.push_back(std::make_unique<Optimizer>(model, OptimizerConfig{}));
  lab06::Stage stage({&model}, l);
  lab06::StageExchange exchange(grid.pp(), l);
  return lab06::train_step(stage, exchange, grid.embedding(), optimizers, c.moved(micro_batches(0, m)), kLr, kClip);
}

TEST(FencesOnSim, Lab06TrainStep) {
  const StepResult sim = pipeline_step(true), cpu = pipeline_step(false);
  expect_same("lab 06 1F1B pp 4", sim, cpu);
}

// lab07-6 (the loss over pp then dp, the norm over tp and pp) and lab07-7 (ZeRO-1: the norm over dp, tp, pp).
StepResult grid_step(bool simulated, const lab07::Grid& g, bool zero1) {
  Cluster c(simulated);
  const int m = 2;
  const lab07::Layout layout =
      lab07::make_layout(kConfig, g, c.world->size(), c.world->rank(), lab06::ScheduleKind::OneFOneB, m, 1, 0, false);
  std::unique_ptr<lab07::Rank3D> r = lab07::build_rank(*c.world, kConfig, layout, OptimizerConfig{},
                                                       PrecisionPolicy::fp32(), c.device(), kSeed, zero1);
  const int replica = r->groups.dp->rank();
  return lab07::train_step(*r, c.moved(micro_batches(replica * m * kB, m)), kLr, kClip);
}

TEST(FencesOnSim, Lab07TrainStepAndZero1) {
  lab07::Grid dp_pp;  // loss (pp), loss (dp), grad norm (pp); with ZeRO-1 grad norm (dp), (pp)
  dp_pp.pp = 2;
  dp_pp.dp = 2;
  lab07::Grid tp_pp;  // grad norm (tp), (pp)
  tp_pp.tp = 2;
  tp_pp.pp = 2;
  for (const auto& [g, zero1] : {std::pair{dp_pp, false}, std::pair{dp_pp, true}, std::pair{tp_pp, false}}) {
    const std::string what = g.describe() + (zero1 ? " ZeRO-1" : "");
    const StepResult sim = grid_step(true, g, zero1), cpu = grid_step(false, g, zero1);
    expect_same(what.c_str(), sim, cpu);
  }
}

// lab08-5 (decide_rollback: one flag from every rank): a NaN loss on the last rank rolls every rank back.
TEST(FencesOnSim, Lab08DecideRollback) {
  Cluster c(true);
  const int r = c.world->rank(), n = c.world->size();
  const std::vector<float> history(10, 3.0f);
  const float loss = r == n - 1 ? std::numeric_limits<float>::quiet_NaN() : 3.0f;
  const lab08::SpikeDecision d = lab08::decide_rollback(*c.world, history, loss, 1.0f, lab08::SpikeConfig{});
  EXPECT_TRUE(d.rollback) << "a NaN on rank " << n - 1 << " rolls back rank " << r;
  EXPECT_EQ(d.reason.rfind("rank " + std::to_string(n - 1) + ": loss nan", 0), 0u) << d.reason;
}

}  // namespace
}  // namespace scalelab
