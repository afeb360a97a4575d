// test_lab04_offload.cpp — lab 04 part 3's graded checks on 2 ranks, compiled into the 2-rank program
// (test_lab04_np2, mpiexec -n 2): --offload optimizer (ZeRO-Offload, Ren et al., USENIX ATC 2021, Sec. 4)
// trains exactly as the optimizer on the device does, step for step; the device's memory falls by exactly
// the estimator's figure (the allocator's places, MemPlace::Device and ::Host, against estimate_memory's
// offload terms); and on the simulated H100 the copies overlap: every upload is waited for, the compute stream
// waits for uploads no longer than the reference design's bound (copy_wait_stats), and the step is shorter
// with overlap than without.
// Every rank evaluates every assertion; grading::all_ranks combines them.
#include <gtest/gtest.h>

#include <algorithm>  // defines: std::max, std::min
#include <cmath>      // defines: std::fabs
#include <cstdint>    // defines: int64_t
#include <cstdio>     // defines: std::snprintf
#include <memory>     // defines: std::unique_ptr
#include <string>
#include <vector>

#include "fsdp.h"                               // defines: lab04::* (the track under test)
#include "grading.h"                            // defines: grading::Check, grading::run, grading::all_ranks
#include "lab04_support.h"                      // defines: fresh_comm, make_fsdp, memory_config, rank_micro_batches
#include "memory_report.h"                      // defines: lab04_driver::offload_pcie_bytes_per_step
#include "scalelab/comm/comm.h"                 // defines: Communicator, make_communicator
#include "scalelab/core/allocator.h"            // defines: Allocator, MemStats, MemPlace
#include "scalelab/core/clock.h"                // defines: VirtualClock
#include "scalelab/core/host_copy.h"            // defines: copy_wait_stats, CopyWaitStats
#include "scalelab/core/sim_gpu.h"              // defines: GpuModel, sim_gpu, sim_gpu_set, sim_gpu_clear
#include "scalelab/measure/memory_estimator.h"  // defines: estimate_memory (offload_optimizer)

namespace {

using namespace scalelab;
using namespace scalelab::lab04_test;
namespace grading = scalelab::grading;

// Losses of the offloaded run against the on-device run, relative, per step. Both make the same fp32 (or
// bf16-mixed) arithmetic in the same order on the same CPU kernels, the host's AdamW included, so they are
// equal bit for bit (measured: 0 in every configuration, fp32 and bf16); 1e-6 is the bound. A real
// mistake (a stale gradient, a missed upload, the device copy updated) is off by 1e-4 or more after one step.
constexpr double kOffloadLossRtol = 1e-6;

std::unique_ptr<lab04::FSDP> make_offloaded(const GPTConfig& cfg, const PrecisionPolicy& policy, Communicator& comm,
                                            int stage, lab04::Offload offload, bool overlap = true,
                                            Device device = Device::CPU) {
  lab04::FsdpOptions o;
  o.stage = stage_of(stage);
  o.prefetch = 1;
  o.overlap = overlap;
  o.optimizer = adamw();
  o.offload = offload;
  return std::make_unique<lab04::FSDP>(cfg, policy, device, kModelSeed, comm, o);
}

// max |a - b| over two (n,) fp32 CPU tensors.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return d;
}

}  // namespace

TEST(Lab04Fsdp, OffloadTrainsLikeOnDevice) {
  const grading::Check check{
      "lab04.offload_trains_like_on_device", /*points=*/4,
      /*target=*/
      "2 ranks, tiny model, AdamW, clipping at 0.05, 3 steps of 2 micro-steps, stages 1-3, fp32 and bf16 (and "
      "ZeRO-3 without overlap): with --offload optimizer every step's loss and gradient norm within 1e-6 "
      "relative of the same run with the optimizer on the device, and every parameter equal after the steps",
      /*hint=*/
      "README 'Part 3: offload': update the host's master with the gradient copied down (wait for ITS copy "
      "first), send the rounded result up into param_shard, and wait for a unit's upload before its next "
      "forward (finish_params_upload)"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = tiny_config();
    constexpr int kSteps = 3, kMicroSteps = 2;
    std::string problem;
    double worst_loss = 0.0, worst_param = 0.0;
    struct Case {
      int stage;
      PrecisionPolicy policy;
      bool overlap;
    };
    std::vector<Case> cases;
    for (const PrecisionPolicy& p : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed()})
      for (int st = 1; st <= 3; ++st) cases.push_back({st, p, true});
    cases.push_back({3, PrecisionPolicy::bf16_mixed(), false});
    for (const Case& c : cases) {
      std::unique_ptr<Communicator> comm_dev = fresh_comm(), comm_host = fresh_comm();
      const int rank = comm_dev->rank(), n = comm_dev->size();
      std::unique_ptr<lab04::FSDP> on_device =
          make_offloaded(cfg, c.policy, *comm_dev, c.stage, lab04::Offload::None, c.overlap);
      std::unique_ptr<lab04::FSDP> offloaded =
          make_offloaded(cfg, c.policy, *comm_host, c.stage, lab04::Offload::Optimizer, c.overlap);
      char where[96];
      std::snprintf(where, sizeof(where), "ZeRO-%d %s%s", c.stage, c.policy.name().c_str(),
                    c.overlap ? "" : " overlap off");
      for (int step = 0; step < kSteps; ++step) {
        const GlobalBatch g =
            random_global_batch(kDataSeed + step, kMicroBatch * n * kMicroSteps, cfg.max_seq_len, cfg.vocab_size);
        const std::vector<lab04::MicroBatch> mb = rank_micro_batches(g, rank, n, kMicroSteps, kMicroBatch);
        const StepResult want = lab04::train_step(*on_device, mb, 1e-3f, 0.05f);
        const StepResult got = lab04::train_step(*offloaded, mb, 1e-3f, 0.05f);
        const double rel_loss = std::fabs(got.loss - want.loss) / std::max(1e-30, std::fabs(double{want.loss}));
        const double rel_norm = std::fabs(got.grad_norm - want.grad_norm) /
                                std::max(1e-30, std::fabs(double{want.grad_norm}));
        worst_loss = std::max({worst_loss, rel_loss, rel_norm});
        if (problem.empty() && !(rel_loss <= kOffloadLossRtol && rel_norm <= kOffloadLossRtol)) {
          char buf[256];
          std::snprintf(buf, sizeof(buf),
                        "%s, step %d, rank %d: loss %.9g offloaded vs %.9g on the device, grad norm %.9g vs %.9g",
                        where, step + 1, rank, got.loss, want.loss, got.grad_norm, want.grad_norm);
          problem = buf;
        }
      }
      for (int u = 0; u < on_device->state().num_units(); ++u) {
        const Tensor want = on_device->gather_unit_f32(u), got = offloaded->gather_unit_f32(u);
        const double d = max_abs_diff(got, want);
        worst_param = std::max(worst_param, d);
        if (problem.empty() && !(d == 0.0)) {
          char buf[256];
          std::snprintf(buf, sizeof(buf), "%s: unit %d's parameters differ by up to %g after %d steps", where, u, d,
                        kSteps);
          problem = buf;
        }
      }
    }
    EXPECT_TRUE(grading::all_ranks(problem.empty(), problem)) << "offloaded against on-device training";
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "%zu configurations x %d steps: worst relative loss/norm difference %.3g, "
                  "largest parameter difference %.3g",
                  cases.size(), kSteps, worst_loss, worst_param);
    record.measured(buf);
  });
}

TEST(Lab04Fsdp, OffloadDeviceMemoryFallsByEstimate) {
  const grading::Check check{
      "lab04.offload_device_memory_falls_by_estimate", /*points=*/3,
      /*target=*/
      "2 ranks, L=8 C=64 model, AdamW, stages 1-3, fp32 and bf16: with --offload optimizer the device holds no "
      "optimizer state, its peak falls by exactly the estimator's figure (sum s_u*K bytes), and the host place "
      "holds exactly estimate_memory's host bytes per category",
      /*hint=*/
      "README 'Part 3: offload': master, m and v ALL in host memory (Device::CPU, MemPlace::Host), none on the "
      "device; host_grads fp32, host_params only when the parameters are not fp32"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = memory_config();
    constexpr int kT = 16;
    const int rank = world().rank(), n = world().size();
    Allocator& alloc = Allocator::get(Device::CPU);
    const MemCategory cats[3] = {MemCategory::Params, MemCategory::Grads, MemCategory::OptimizerState};
    std::string problem, measured;
    char buf[256];
    for (const PrecisionPolicy& policy : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed()}) {
      for (int st = 1; st <= 3; ++st) {
        int64_t dev_peak[2] = {0, 0}, dev_optim[2] = {0, 0}, host_bytes[3] = {0, 0, 0};
        for (int off = 0; off < 2; ++off) {
          const MemStats base = alloc.stats(MemPlace::Device), host_base = alloc.stats(MemPlace::Host);
          std::unique_ptr<Communicator> comm = fresh_comm();
          std::unique_ptr<lab04::FSDP> fsdp =
              make_offloaded(cfg, policy, *comm, st, off ? lab04::Offload::Optimizer : lab04::Offload::None);
          const GlobalBatch g = random_global_batch(kDataSeed, n, kT, cfg.vocab_size);
          const std::vector<lab04::MicroBatch> mb = rank_micro_batches(g, rank, n, 1, 1);
          lab04::train_step(*fsdp, mb, 1e-3f, 1.0f);  // the first step allocates the activations
          alloc.reset_peak();
          lab04::train_step(*fsdp, mb, 1e-3f, 1.0f);
          const MemStats dev = alloc.stats(MemPlace::Device), host = alloc.stats(MemPlace::Host);
          dev_peak[off] = dev.total_peak_bytes - base.total_current_bytes;
          dev_optim[off] = dev.peak_bytes[static_cast<int>(MemCategory::OptimizerState)] -
                           base.current_bytes[static_cast<int>(MemCategory::OptimizerState)];
          if (off)
            for (int c = 0; c < 3; ++c)
              host_bytes[c] = host.current_bytes[static_cast<int>(cats[c])] -
                              host_base.current_bytes[static_cast<int>(cats[c])];
        }
        const auto est = [&](bool off) {
          return estimate_memory(cfg, n, st, policy, OptimizerConfig::Kind::AdamW, 1, 0, 0, Recompute::None, off);
        };
        const MemoryEstimate e_dev = est(false), e_off = est(true);
        const int64_t want_drop = e_dev.peak.total() - e_off.peak.total();
        const int64_t want_host[3] = {e_off.host.params, e_off.host.grads, e_off.host.optimizer_state};
        const int64_t drop = dev_peak[0] - dev_peak[1];
        if (problem.empty() && dev_optim[1] != 0) {
          std::snprintf(buf, sizeof(buf), "ZeRO-%d %s: %lld bytes of optimizer state on the device with offload", st,
                        policy.name().c_str(), static_cast<long long>(dev_optim[1]));
          problem = buf;
        }
        if (problem.empty() && drop != want_drop) {
          std::snprintf(buf, sizeof(buf),
                        "ZeRO-%d %s: the device's peak fell by %lld bytes with offload, the estimator says %lld", st,
                        policy.name().c_str(), static_cast<long long>(drop), static_cast<long long>(want_drop));
          problem = buf;
        }
        for (int c = 0; c < 3; ++c)
          if (problem.empty() && host_bytes[c] != want_host[c]) {
            std::snprintf(buf, sizeof(buf), "ZeRO-%d %s: host %s %lld bytes, the estimator says %lld", st,
                          policy.name().c_str(), mem_category_name(cats[c]), static_cast<long long>(host_bytes[c]),
                          static_cast<long long>(want_host[c]));
            problem = buf;
          }
        std::snprintf(buf, sizeof(buf), "%sZeRO-%d %s: device peak %lld -> %lld B, host %lld B",
                      measured.empty() ? "" : "; ", st, policy.name().c_str(), static_cast<long long>(dev_peak[0]),
                      static_cast<long long>(dev_peak[1]),
                      static_cast<long long>(host_bytes[0] + host_bytes[1] + host_bytes[2]));
        measured += buf;
      }
    }
    EXPECT_TRUE(grading::all_ranks(problem.empty(), problem)) << "device and host bytes against estimate_memory";
    record.measured(measured);
  });
}

TEST(Lab04Fsdp, OffloadCopiesOverlapOnSimulatedH100) {
  const grading::Check check{
      "lab04.offload_copies_overlap_on_simulated_h100", /*points=*/2,
      /*target=*/
      "2 simulated H100s (virtual time), L=8 C=64 model, ZeRO-3 bf16, AdamW, --offload optimizer, second step: "
      "every upload waited for (none dropped unwaited); the compute stream waits for uploads at most as long as "
      "the units kept gathered take to upload (they are needed at once) plus half the smallest block's upload "
      "(each block's upload left in flight until its next forward); and the step is shorter with overlap than "
      "without",
      /*hint=*/
      "README 'Part 3: offload': leave a ZeRO-3 block's upload in flight (wait in finish_params_upload, right "
      "before its all-gather), wait at once only for the units kept gathered or when s.overlap is false; "
      "never drop a copy's handle without wait()"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = memory_config();
    constexpr int kT = 32;
    constexpr int kUp = static_cast<int>(VirtualClock::CopyDir::ToDevice);
    double step_ms[3] = {0, 0, 0};  // offload with overlap, offload without, on the device with overlap
    double exposed_up_s = 0.0, bound_s = 0.0, kept_up_s = 0.0;
    long long unwaited_up = 0, waited_up = 0;
    int num_units = 0;
    for (int run = 0; run < 3; ++run) {
      sim_gpu_set(GpuModel::preset("h100"));  // the virtual clock from 0
      {
        std::unique_ptr<Communicator> comm = make_communicator("sim");
        const int rank = comm->rank(), n = comm->size();
        std::unique_ptr<lab04::FSDP> fsdp = make_offloaded(cfg, PrecisionPolicy::bf16_mixed(), *comm, 3,
                                                           run == 2 ? lab04::Offload::None : lab04::Offload::Optimizer,
                                                           run != 1, Device::SIM);
        const GlobalBatch g = random_global_batch(kDataSeed, n, kT, cfg.vocab_size);
        std::vector<lab04::MicroBatch> mb = rank_micro_batches(g, rank, n, 1, 1);
        for (lab04::MicroBatch& b : mb) {  // the batch on the device, as a GPU program copies it in
          Tensor in = Tensor::empty(b.inputs.shape(), b.inputs.dtype(), Device::SIM);
          Tensor tg = Tensor::empty(b.targets.shape(), b.targets.dtype(), Device::SIM);
          in.copy_from(b.inputs);
          tg.copy_from(b.targets);
          b = lab04::MicroBatch{in, tg};
        }
        lab04::train_step(*fsdp, mb, 1e-3f, 1.0f);
        const double t0 = VirtualClock::get().compute_s();
        const CopyWaitStats before = copy_wait_stats();
        lab04::train_step(*fsdp, mb, 1e-3f, 1.0f);
        step_ms[run] = 1e3 * (VirtualClock::get().compute_s() - t0);
        if (run == 0) {  // the second step waits for the first's block uploads and its own kept units'
          const CopyWaitStats after = copy_wait_stats();
          exposed_up_s = after.exposed_s[kUp] - before.exposed_s[kUp];
          unwaited_up = after.unwaited[kUp] - before.unwaited[kUp];
          waited_up = after.waited[kUp] - before.waited[kUp];
          // The reference design's bound, from the same copy model: a unit kept gathered is all-gathered in
          // the update itself, so its whole upload is exposed; a block's travels during the host's work and
          // the forward until its own all-gather, so none of it should be (half the smallest as a margin).
          const auto elem = static_cast<int64_t>(dtype_size(PrecisionPolicy::bf16_mixed().param_dtype));
          double smallest_block_s = 0.0;
          const lab04::FsdpState& s = fsdp->state();
          num_units = s.num_units();
          for (const lab04::UnitShard& us : s.units) {
            const double up_s = sim_gpu().copy_seconds(us.layout.shard * elem, Device::SIM, Device::CPU);
            if (us.keep_gathered)
              kept_up_s += up_s;
            else
              smallest_block_s = smallest_block_s == 0.0 ? up_s : std::min(smallest_block_s, up_s);
          }
          bound_s = kept_up_s + 0.5 * smallest_block_s;
        }
      }
      sim_gpu_clear();
      Allocator::get(Device::SIM).set_capacity_bytes(0);
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), "second step: %lld uploads dropped without wait() (of %d units)", unwaited_up,
                  num_units);
    EXPECT_TRUE(grading::all_ranks(unwaited_up == 0, buf)) << "every upload waited for";
    std::snprintf(buf, sizeof(buf),
                  "second step: the compute stream waited %.3f us for uploads, the bound is %.3f us (the kept "
                  "units' uploads %.3f us + half the smallest block's); %lld uploads waited for",
                  1e6 * exposed_up_s, 1e6 * bound_s, 1e6 * kept_up_s, waited_up);
    EXPECT_TRUE(grading::all_ranks(exposed_up_s <= bound_s, buf)) << "exposed upload time";
    std::snprintf(buf, sizeof(buf), "step %.3f ms offloaded with overlap, %.3f ms without (on the device %.3f ms)",
                  step_ms[0], step_ms[1], step_ms[2]);
    EXPECT_TRUE(grading::all_ranks(step_ms[0] < step_ms[1], buf)) << "simulated step times";
    const lab04_driver::PcieBytes pcie =
        lab04_driver::offload_pcie_bytes_per_step(cfg, world().size(), 3, PrecisionPolicy::bf16_mixed());
    std::snprintf(buf + std::string(buf).size(), sizeof(buf) - std::string(buf).size(),
                  "; uploads exposed %.3f us (bound %.3f us); host link %lld B down + %lld B up per step, "
                  "simulated h100",
                  1e6 * exposed_up_s, 1e6 * bound_s, static_cast<long long>(pcie.down),
                  static_cast<long long>(pcie.up));
    record.measured(buf);
  });
}
