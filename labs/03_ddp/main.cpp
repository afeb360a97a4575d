// main.cpp — lab 03: data-parallel training of GPT-2 on N ranks; tokens/s, MFU and what the gradient
// all-reduce costs (exposed and hidden behind backward).
// The driver is shared by both tracks: it calls the functions of ddp.h, which come from your
// labs/03_ddp/ddp.cpp (bin/learner/lab03_ddp) or from the reference solutions/03_ddp/ddp.cpp
// (bin/reference/lab03_ddp). The loop around the step (data, validation, logs, summary) is
// common/include/scalelab/driver/train_loop.h. Lesson: labs/03_ddp/README.md. Log schema: docs/log_schema.md.
//
//   mpirun -np 2 build/bin/reference/lab03_ddp --data data/kjv --model demo --mode overlap --steps 100
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf, std::snprintf
#include <string>
#include <vector>

#include "ddp.h"                     // defines: lab03::broadcast_parameters, GradSync, train_step, ... (YOU)
#include "lab_parts.h"               // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "scalelab/comm/comm.h"      // defines: Communicator
#include "scalelab/core/threads.h"   // defines: set_num_threads
#include "scalelab/driver/driver.h"  // defines: driver::DistributedOptions, make_link, comm_stats, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/metrics.h"       // defines: RunLogger, TimeSpan
#include "scalelab/model/gpt2.h"            // defines: GPT2, HookPoint
#include "scalelab/model/optim.h"           // defines: Optimizer
#include "step_timeline.h"                  // defines: StepTimeline (the compute spans of a timeline record)
#include "train_step.h"                     // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;
using scalelab::lab03_driver::StepTimeline;

// The options labs 03 and 04 share (scalelab/driver/driver.h: --device ... --timeline-steps) and lab 03's own.
struct Options : driver::DistributedOptions {
  std::string mode = "overlap";  // naive | bucketed | overlap
  double bucket_mb = 1.0;        // MiB of fp32 gradients per bucket
};

static int run(const Options& o, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, link, data (disjoint per rank), model (identical on every rank), optimizer, peak
  driver::check_train_options(o);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);        // cores / ranks on this node, unless --threads
  driver::set_links(comm, o, driver::ClusterOptions{});  // --link (sim: its own links unless named)
  const lab03::SyncMode mode = lab03::sync_mode_from_name(o.mode);
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * world;
  const int micro_steps = lab03::micro_steps_per_step(global_batch, o.micro_batch, world);  // YOUR TODO lab03-7
  driver::RunData data =
      driver::open_data(o, lab_parts(), o.micro_batch, micro_steps, /*dp_rank=*/rank, /*dp_size=*/world);

  const PrecisionPolicy policy = driver::precision_policy(o);  // --precision, --activations
  // A different seed on every rank, on purpose: broadcast_parameters must make the replicas identical
  // (rank 0's weights, the same as a 1-rank run with this --seed).
  GPT2 model(data.cfg, policy, device, o.seed + static_cast<uint64_t>(rank));
  driver::apply_recompute(o, model);
  lab03::broadcast_parameters(model, comm);  // YOUR TODO lab03-1; before the optimizer copies the weights
  const OptimizerConfig oc = driver::optimizer_config(o);
  Optimizer optimizer(model, oc);
  lab03::GradSync sync(model, comm, mode, o.bucket_mb);  // buckets (YOUR TODO lab03-3) and, for overlap, the hook
  StepTimeline timeline(model);                          // after GradSync: its hooks run after GradSync's

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, comm, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);

  RunLogger log("lab03", driver::run_id_all_ranks(comm, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);  // memory_*_bytes of the step records: this rank's device
  const LinkModel& link = comm.link_model();
  nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
  config.update({{"n_params", model.num_params()},
                 {"micro_batch", o.micro_batch},
                 {"global_batch", global_batch},
                 {"micro_steps", micro_steps},
                 {"backend", comm.backend()},
                 {"mode", o.mode},
                 {"bucket_mb", o.bucket_mb},
                 {"num_buckets", sync.buckets().size()},
                 {"link", link.name},
                 {"link_slowdown", o.link_slowdown},
                 {"timeline_steps", o.timeline_steps}});
  RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, world, threads, policy, device, peak);
  if (link.enabled()) run_rec.extra["simulated"] = true;
  log.log_run(run_rec);

  if (rank == 0) {
    std::printf("lab03 | %s | %lld params | %d ranks (%s) x %d threads | mode %s", data.cfg.str().c_str(),
                static_cast<long long>(model.num_params()), world, comm.backend().c_str(), threads, o.mode.c_str());
    if (mode != lab03::SyncMode::Naive) std::printf(", %zu buckets of %g MiB", sync.buckets().size(), o.bucket_mb);
    std::printf(" | link %s%s\n", link.name.c_str(), link.enabled() ? " (simulated)" : "");
    std::printf(
        "global batch %d = micro-batch %d x %d ranks x %d micro-steps | T=%d | %s | peak %.1f GFLOP/s per "
        "rank (%s)\n",
        global_batch, o.micro_batch, world, micro_steps, o.seq_len, policy.name().c_str(), peak.flops_per_s / 1e9,
        peak.source.c_str());
    std::printf("logs: %s (one file per rank)\n", log.path().c_str());
  }

  // ------------------------------------------------------------------------------------------------
  // Training: the driver's loop around lab 03's step
  driver::TrainLoop loop(o, {"lab03", o.micro_batch, micro_steps, global_batch}, &comm, model, data, log, peak,
                         flops_tok, device);
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    return lab03::train_step(model, optimizer, sync, micro, lr, o.grad_clip);  // YOUR step
  };
  loop.before_step = [&](double step_start_ms, double, bool want_timeline) {
    if (want_timeline) timeline.begin(step_start_ms);
  };
  loop.after_step = [&](double, double, bool want_timeline) {
    driver::StepMeasure m;
    if (want_timeline) m.spans = timeline.end();
    const driver::CommStats cs = driver::comm_stats(comm.events(), Communicator::now_ms(), "all_reduce");
    m.comm_ms = sync.last_finish_ms();  // the part of the step spent waiting for gradients
    m.comm_busy_ms = cs.busy_ms;
    m.comm_modeled_ms = cs.modeled_ms;
    m.simulated = cs.simulated;
    m.extra = {{"comm_busy_ms", cs.busy_ms}, {"allreduce_payload_bytes", cs.all_reduce_bytes}};
    return m;
  };
  loop.progress = [](const driver::StepMeasure& m, double) {
    char s[96];
    std::snprintf(s, sizeof(s), "all-reduce %6.1f ms exposed of %6.1f busy", m.comm_ms, m.comm_busy_ms);
    return std::string(s);
  };
  const driver::Summary s = loop.run();

  // ------------------------------------------------------------------------------------------------
  // Summary (every rank logs its own; rank 0 prints)
  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, /*simulated=*/link.enabled());
  if (rank == 0) summary["sample"] = s.sample;  // printable ASCII (sample_text)
  log.log_summary(summary);
  if (rank == 0) {
    driver::print_summary_headline(s, peak, world);
    std::printf(
        "\ngradient all-reduce per step: the step waited %.1f ms for it (exposed); the transport was busy "
        "%.1f ms",
        s.comm_ms, s.comm_busy_ms);
    if (link.enabled()) std::printf(", of which the simulated link charged %.1f ms", s.comm_modeled_ms);
    std::printf("\n");
    if (!s.sample.empty()) std::printf("\n== sample ==\n%s\n", s.sample.c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 03: data-parallel GPT-2 on N ranks (mpirun -np N); reports loss, tokens/s, MFU, communication"};
  Options o;
  driver::add_distributed_options(app, o, "lab03");
  app.get_option("--device")
      ->description(
          "cpu, cuda (a build with the CUDA backend and a GPU; one GPU per rank "
          "with --backend nccl, or ranks sharing one through --backend mpi) or sim (a simulated GPU per rank, "
          "virtual time: --backend sim; docs/simulation.md)");
  app.get_option("--seed")->description("seed of the weights (rank 0's) and the data order");
  app.add_option("--mode", o.mode,
                 "gradient all-reduce: naive (per tensor), bucketed, overlap (buckets during "
                 "backward)")
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "MiB of fp32 gradients per bucket (0: one bucket per tensor)")
      ->capture_default_str()
      ->check(driver::finite_non_negative());
  driver::add_link_options(app, o);
  app.get_option("--link-slowdown")
      ->description(
          "make the simulated link this many times slower (README "
          "'Measured')");
  app.get_option("--timeline-steps")
      ->description(
          "steps 1..N log a timeline record of their compute and "
          "communication (0: none)");
  CLI11_PARSE(app, argc, argv);

  return driver::run_on_all_ranks(app, o, o.backend, [&](Communicator& comm) { return run(o, comm); });
}
