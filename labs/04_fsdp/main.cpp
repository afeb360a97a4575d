// main.cpp — lab 04: GPT-2 trained with ZeRO-1/2/3 (FSDP) on N ranks; tokens/s, MFU, memory per rank
// (measured next to the estimator's prediction) and the communication the step waited for.
// The driver is shared by both tracks: it calls the functions of fsdp.h, which come from your
// labs/04_fsdp/fsdp.cpp (bin/learner/lab04_fsdp) or from the reference solutions/04_fsdp/fsdp.cpp
// (bin/reference/lab04_fsdp). The loop around the step (data, validation, logs, summary) is
// common/include/scalelab/driver/train_loop.h; what the driver measures around a step, step_probe.h and memory_report.h.
// Lesson: labs/04_fsdp/README.md. Log schema: docs/log_schema.md.
//
//   mpirun -np 4 build/bin/reference/lab04_fsdp --model demo --stage 3 --steps 50
//   mpirun -np 4 build/bin/reference/lab04_fsdp --model d12 --estimate      # the memory table, no training
//   mpirun -np 2 build/bin/reference/lab04_fsdp --model demo --offload optimizer  # part 3: AdamW on the host
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf, std::snprintf
#include <memory>  // defines: std::unique_ptr
#include <string>
#include <vector>

#include "ddp.h"                      // defines: lab03::micro_steps_per_step (lab 03's reference)
#include "fsdp.h"                     // defines: lab04::FSDP, train_step, ZeroStage, ... (YOU)
#include "lab_parts.h"                // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "memory_report.h"            // defines: memory_summary, print_memory_table
#include "scalelab/comm/comm.h"       // defines: Communicator
#include "scalelab/core/allocator.h"  // defines: Allocator (the --memory-cap-mb cap)
#include "scalelab/core/error.h"      // defines: OutOfMemory, SL_CHECK_HINT
#include "scalelab/core/threads.h"    // defines: set_num_threads
#include "scalelab/driver/driver.h"   // defines: driver::DistributedOptions, make_link, ... (common/)
#include "scalelab/driver/option_checks.h"      // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"         // defines: driver::TrainLoop, open_data, out_of_memory_report
#include "scalelab/measure/memory_estimator.h"  // defines: estimate_memory, format_memory_table
#include "scalelab/measure/metrics.h"           // defines: RunLogger
#include "step_probe.h"                         // defines: StepProbe (exposed communication, timeline spans)
#include "train_step.h"                         // defines: lab01::flops_per_token

using namespace scalelab;
using namespace scalelab::lab04_driver;

// The options labs 03 and 04 share (scalelab/driver/driver.h: --device ... --timeline-steps) and lab 04's own.
struct Options : driver::DistributedOptions {
  // FSDP
  int stage = 3;                 // ZeRO stage 1, 2 or 3
  int prefetch = 1;              // ZeRO-3 all-gathers in flight beyond the unit in use
  std::string overlap = "on";    // on | off (FsdpOptions::overlap)
  double memory_cap_mb = 0;      // MiB of simulated device memory per rank (0: no cap)
  bool estimate = false;         // print the estimator's table and exit
  std::string offload = "none";  // part 3: none | optimizer (FsdpOptions::offload)
  // The scaling lab's knobs (README "Why not 2x?")
  double loader_delay_ms = 0;     // ms slept in every batch fetch of this rank (counted as data wait)
  int slow_rank = -1;             // this rank adds slow_ms per micro-step inside its compute
  double slow_ms = 0;             // ms
  int loader_alone_batches = 20;  // batches timed with the loader alone, before training (0: skip)
  int gathers_prefetched() const { return overlap == "on" ? prefetch : 0; }  // --overlap off: no prefetch
};

static int run(const Options& o, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, link, data (disjoint per rank), the estimate, the peak, the memory cap
  driver::check_train_options(o);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  driver::set_links(comm, o, driver::ClusterOptions{});  // --link (sim: its own links unless named)
  const lab04::ZeroStage stage = lab04::zero_stage_from_int(o.stage);
  driver::check_rank_option("--slow-rank", o.slow_rank, world);  // -1: none
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * world;
  const int micro_steps = lab03::micro_steps_per_step(global_batch, o.micro_batch, world);  // lab 03's rule
  driver::RunData data =
      driver::open_data(o, lab_parts(), o.micro_batch, micro_steps, /*dp_rank=*/rank, /*dp_size=*/world);
  const GPTConfig& cfg = data.cfg;
  const PrecisionPolicy policy = driver::precision_policy(o);  // --precision, --activations
  const OptimizerConfig::Kind opt_kind = OptimizerConfig::kind_from_name(o.optimizer);
  const lab04::Offload offload = lab04::offload_from_name(o.offload);
  SL_CHECK_HINT(offload == lab04::Offload::None || !o.timing_only,
                "drop --timing-only: the offloaded state is real host memory, and its update real arithmetic",
                "--offload %s with --timing-only", o.offload.c_str());
  const MemoryEstimate est = estimate_memory(cfg, world, o.stage, policy, opt_kind, o.gathers_prefetched(),
                                             o.micro_batch, o.seq_len, Recompute::None,
                                             offload == lab04::Offload::Optimizer);
  if (o.estimate) {  // the table only
    if (rank == 0)
      print_estimate(cfg, world, policy, opt_kind, o.optimizer, o.gathers_prefetched(), o.micro_batch, o.seq_len,
                     o.memory_cap_mb);
    return 0;
  }
  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, comm,
                                                  o.calibration);  // before the cap: calibration allocates
  const double flops_tok = lab01::flops_per_token(cfg, o.seq_len);
  const double loader_alone_tok_s = o.loader_alone_batches > 0
                                        ? driver::time_loader_alone(data.parts.open_loader, o.data, data.loader,
                                                                    o.loader_alone_batches, o.loader_delay_ms, &comm)
                                        : kNotMeasured;  // tokens/s of this rank

  RunLogger log("lab04", driver::run_id_all_ranks(comm, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);  // memory_*_bytes of the step records: this rank's device
  const LinkModel& link = comm.link_model();
  // The simulated device memory of this rank: from here on an allocation beyond it throws OutOfMemory.
  const int64_t cap_bytes = static_cast<int64_t>(o.memory_cap_mb * kMiB);
  if (cap_bytes > 0) Allocator::get(device).set_capacity_bytes(cap_bytes);

  // ------------------------------------------------------------------------------------------------
  // The sharded model, and training. An out-of-memory anywhere below (building the shards, the first
  // forward's activations, a gather) ends the job with a report on the rank that ran out. `fsdp` lives
  // outside the try so that on an error it is leaked, not destroyed: its destructor waits for
  // collectives in flight, which peers that are not failing might never finish (a hang, not an error).
  std::unique_ptr<lab04::FSDP> fsdp;
  std::unique_ptr<driver::TrainLoop> loop;
  try {
    lab04::FsdpOptions fo;
    fo.stage = stage;
    fo.prefetch = o.prefetch;
    fo.overlap = o.overlap == "on";
    fo.optimizer = driver::optimizer_config(o);
    fo.offload = offload;
    fsdp = std::make_unique<lab04::FSDP>(cfg, policy, device, o.seed, comm, fo);  // YOUR TODO lab04-1 inside
    GPT2& model = fsdp->model();
    driver::apply_recompute(o, model);
    StepProbe probe(model, rank == o.slow_rank ? o.slow_ms : 0.0);  // times the hooks FSDP added

    nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
    config.update({{"n_params", model.num_params()},
                   {"stage", o.stage},
                   {"prefetch", o.prefetch},
                   {"overlap", o.overlap},
                   {"micro_batch", o.micro_batch},
                   {"global_batch", global_batch},
                   {"micro_steps", micro_steps},
                   {"world_size", world},
                   {"backend", comm.backend()},
                   {"link", link.name},
                   {"link_slowdown", o.link_slowdown},
                   {"loader_delay_ms", o.loader_delay_ms},
                   {"slow_rank", o.slow_rank},
                   {"slow_ms", o.slow_ms},
                   {"loader_alone_batches", o.loader_alone_batches},
                   {"memory_cap_bytes", cap_bytes},
                   {"memory_estimated_peak_bytes", est.total_peak_bytes()},
                   {"exposed_comm_method", "CommEvent::wait_ms"},
                   {"timeline_steps", o.timeline_steps}});
    if (offload != lab04::Offload::None) config["offload"] = o.offload;  // absent: none (logs as before)
    RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, world, threads, policy, device, peak);
    if (link.enabled() || cap_bytes > 0) run_rec.extra["simulated"] = true;
    log.log_run(run_rec);
    if (o.loader_alone_batches > 0)
      log.log("loader_alone", {{"tokens_per_s", loader_alone_tok_s}, {"batches", o.loader_alone_batches}});

    if (rank == 0) {
      std::printf("lab04 | %s | %lld params | %d ranks (%s) x %d threads | %s | prefetch %d | overlap %s | link %s%s\n",
                  cfg.str().c_str(), static_cast<long long>(model.num_params()), world, comm.backend().c_str(), threads,
                  lab04::zero_stage_name(stage), o.gathers_prefetched(), o.overlap.c_str(), link.name.c_str(),
                  link.enabled() ? " (simulated)" : "");
      std::printf(
          "global batch %d = micro-batch %d x %d ranks x %d micro-steps | T=%d | %s | %s | peak %.1f GFLOP/s "
          "per rank (%s)\n",
          global_batch, o.micro_batch, world, micro_steps, o.seq_len, policy.name().c_str(), o.optimizer.c_str(),
          peak.flops_per_s / 1e9, peak.source.c_str());
      print_estimate_line(est, cap_bytes);
      if (offload != lab04::Offload::None)
        print_offload_line(est, offload_pcie_bytes_per_step(cfg, world, o.stage, policy));
      if (o.loader_alone_batches > 0)
        std::printf("loader alone (rank 0, %d batches, no model): %.0f tokens/s%s\n", o.loader_alone_batches,
                    loader_alone_tok_s, device == Device::SIM ? " (this host, real time)" : "");
      if (o.slow_rank >= 0 && o.slow_ms > 0)
        std::printf("rank %d %s %g ms per micro-step (--slow-rank)\n", o.slow_rank,
                    device == Device::SIM ? "adds (virtual time)" : "sleeps", o.slow_ms);
      std::printf("logs: %s (one file per rank)\n", log.path().c_str());
      std::fflush(stdout);
    }

    // ----------------------------------------------------------------------------------------------
    // Training: the driver's loop around lab 04's step
    loop = std::make_unique<driver::TrainLoop>(o,
                                               driver::LoopSpec{"lab04", o.micro_batch, micro_steps, global_batch,
                                                                /*sample_on_every_rank=*/true},
                                               &comm, model, data, log, peak, flops_tok, device);
    MemStats between_steps{};  // after the last step: what stays between steps (the persistent state)
    loop->step = [&](std::vector<MicroBatch>& micro, float lr) {
      return lab04::train_step(*fsdp, micro, lr, o.grad_clip);  // YOUR step (lab04-9)
    };
    loop->loader_delay_ms = o.loader_delay_ms;
    loop->before_step = [&](double step_start_ms, double data_end_ms, bool) {
      probe.begin(step_start_ms, data_end_ms);
    };
    loop->after_step = [&](double step_ms, double data_wait_ms, bool want_timeline) {
      const driver::StepMeasure m = probe.measure(comm.events(), step_ms, data_wait_ms, want_timeline);
      between_steps = Allocator::get(device).stats();
      return m;
    };
    loop->progress = [&](const driver::StepMeasure& m, double) {
      char s[128];
      std::snprintf(s, sizeof(s), "comm %6.1f ms exposed of %6.1f busy | peak %.1f MiB", m.comm_ms, m.comm_busy_ms,
                    between_steps.total_peak_bytes / kMiB);
      return std::string(s);
    };
    const driver::Summary s = loop->run();

    // ----------------------------------------------------------------------------------------------
    // Summary (every rank logs its own; rank 0 prints)
    const MemStats mem = Allocator::get(device).stats();
    nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, /*simulated=*/link.enabled());
    summary.update({{"data_wait_ms", s.data_wait_ms}, {"compute_ms", s.step_ms - s.data_wait_ms - s.comm_ms}});
    summary.update(memory_summary(between_steps, mem, est, cap_bytes));
    if (offload != lab04::Offload::None)
      summary.update(offload_summary(Allocator::get(Device::CPU).stats(MemPlace::Host), est,
                                     offload_pcie_bytes_per_step(cfg, world, o.stage, policy)));
    if (o.loader_alone_batches > 0) summary["loader_alone_tokens_per_s"] = loader_alone_tok_s;
    if (rank == 0) summary["sample"] = s.sample;  // printable ASCII (sample_text)
    log.log_summary(summary);
    if (rank == 0) {
      driver::print_summary_headline(s, peak, world);
      std::printf(
          "\nper step %.1f ms = compute %.1f + data wait %.1f + communication %.1f exposed (the step waited; "
          "CommEvent::wait_ms) | the transport was busy %.1f ms",
          s.step_ms, s.step_ms - s.data_wait_ms - s.comm_ms, s.data_wait_ms, s.comm_ms, s.comm_busy_ms);
      if (link.enabled()) std::printf(", of which the simulated link charged %.1f ms", s.comm_modeled_ms);
      std::printf("\n");
      print_memory_table(between_steps, mem, est, cap_bytes);
      if (offload != lab04::Offload::None) print_host_memory(Allocator::get(Device::CPU).stats(MemPlace::Host), est);
      if (!s.sample.empty()) std::printf("\n== sample ==\n%s\n", s.sample.c_str());
    }
    return 0;
  } catch (const OutOfMemory& e) {
    driver::OomContext c{"lab04",       loop ? loop->doing() : "building the sharded model (FSDP constructor)",
                         rank,          world,
                         o.model,       cfg,
                         o.stage,       policy,
                         opt_kind,      o.gathers_prefetched(),
                         o.micro_batch, o.seq_len,
                         device};
    const std::string report = driver::out_of_memory_report(e, c);
    log.log("out_of_memory", {{"doing", c.doing},
                              {"memory_cap_bytes", cap_bytes},
                              {"memory_estimated_peak_bytes", est.total_peak_bytes()}});
    fsdp.release();             // on purpose: see above
    throw OutOfMemory(report);  // run_on_all_ranks prints it with the rank and ends the whole job
  } catch (...) {
    fsdp.release();
    throw;
  }
}

int main(int argc, char** argv) {
  CLI::App app{"lab 04: GPT-2 with ZeRO-1/2/3 (FSDP) on N ranks (mpirun -np N); loss, tokens/s, MFU, memory per rank"};
  Options o;
  driver::add_distributed_options(app, o, "lab04");
  app.get_option("--precision")
      ->description(
          "fp32 or bf16 (= bf16-mixed: bf16 params, fp32 master shard, gradients and reduce; "
          "emulated on CPU). bf16-compute (bf16 matmul operands, lab 01) is refused here: the "
          "memory estimator does not model its matmul scratch");
  app.get_option("--sample-tokens")
      ->description(
          "bytes of text generated at the end (by every rank: ZeRO-3 "
          "forwards are collective; rank 0 prints)");
  driver::add_link_options(app, o);
  app.add_option("--stage", o.stage,
                 "ZeRO stage: 1 (optimizer state), 2 (+ gradients), 3 (+ parameters, FSDP "
                 "FULL_SHARD)")
      ->capture_default_str()
      ->check(driver::int_in_range(1, 3));
  app.add_option("--prefetch", o.prefetch, "ZeRO-3: all-gathers in flight beyond the unit in use (0: none)")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--overlap", o.overlap,
                 "on: collectives overlap compute; off: every collective waited for at once, "
                 "no prefetch")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--memory-cap-mb", o.memory_cap_mb,
                 "simulated device memory per rank, MiB (0: no cap); beyond it "
                 "an allocation fails with an out-of-memory report")
      ->capture_default_str()
      ->check(driver::finite_in_range(0, 1e9));
  app.add_option("--offload", o.offload,
                 "part 3: optimizer = the fp32 master shard, AdamW's moments and the update in host memory "
                 "(ZeRO-Offload); gradients go down and parameters up over the host link each step")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "optimizer"}));
  app.add_flag("--estimate", o.estimate,
               "print the memory estimator's table for this config at this world size "
               "(stages 0-3) and exit without training");
  app.add_option("--loader-delay-ms", o.loader_delay_ms,
                 "wait this long in every batch fetch (a slow loader, counted as data "
                 "wait; a sleep, or virtual time with --device sim)")
      ->capture_default_str()
      ->check(driver::finite_non_negative());
  app.add_option("--slow-rank", o.slow_rank,
                 "this rank computes --slow-ms longer per micro-step (a straggler; "
                 "-1: none)")
      ->capture_default_str()
      ->check(driver::int_in_range(-1, INT32_MAX));
  app.add_option("--slow-ms", o.slow_ms,
                 "ms the --slow-rank adds per micro-step, inside its compute (a sleep, or virtual time)")
      ->capture_default_str()
      ->check(driver::finite_non_negative());
  app.add_option("--loader-alone-batches", o.loader_alone_batches,
                 "before training, time the loader alone for N "
                 "batches with no model (0: skip)")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  CLI11_PARSE(app, argc, argv);

  return driver::run_on_all_ranks(app, o, o.backend, [&](Communicator& comm) { return run(o, comm); });
}
