// main.cpp — lab 08: lab 07's 3D-parallel GPT-2, made to survive failures. Every --checkpoint-every steps
// each rank writes its shard and rank 0 the manifest and the completion marker (YOUR save_checkpoint);
// --resume latest goes on from the newest complete checkpoint (YOUR newest_complete_checkpoint), bit for bit
// at the same layout; old checkpoints are deleted by YOUR retain_checkpoints. A fault can be injected
// (--fail-at-step, --fail-rank, --fail-mode kill|hang), and every rank leaves a heartbeat per step for
// scripts/supervise, which restarts the job when a rank dies or falls silent. Every step's loss goes to YOUR
// decide_rollback: on a spike every rank rolls back to the newest complete checkpoint and skips the spike's
// data windows (--poison-at-step provokes one). At the end YOUR find_stragglers names the slow ranks
// (--slow-rank provokes one). The loop around the step is common/include/scalelab/driver/train_loop.h; the step is lab 07's
// reference. Lesson: labs/08_resilience/README.md.
//
//   mpirun -np 2 build/bin/reference/lab08_resilience --checkpoint-dir runs/ckpt --checkpoint-every 5 --steps 20
//   scripts/supervise --heartbeat-timeout-s 30 -- mpirun -np 2 build/bin/reference/lab08_resilience
//       --checkpoint-dir runs/ckpt --checkpoint-every 5 --steps 20 --resume latest --fail-at-step 12 --fail-rank 1
//   mpirun -np 2 build/bin/reference/lab08_resilience --checkpoint-dir runs/ckpt --steps 40 --poison-at-step 30
//   mpirun -np 4 build/bin/reference/lab08_resilience --uniform-compute-ms 20 --slow-rank 2 --slow-factor 2
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none; or scripts/run 08 ...)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <algorithm>  // defines: std::max
#include <cstdio>     // defines: std::printf
#include <fstream>    // defines: std::ifstream (the manifest's digest)
#include <iterator>   // defines: std::istreambuf_iterator
#include <optional>   // defines: std::optional (the checkpoint every rank chose)
#include <string>
#include <vector>

#include "faults.h"                     // defines: lab08::Faults, Heartbeat, add_fault_options (given)
#include "group_probe.h"                // defines: lab07_driver::communicators, waited_ms
#include "lab_parts.h"                  // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "parallel_3d.h"                // defines: lab07::make_layout, build_rank, train_step (lab 07's reference)
#include "reshard.h"                    // defines: lab08::rebase_loader_state (given)
#include "resilience.h"                 // defines: lab08::save_checkpoint, newest_complete_checkpoint, ... (YOU)
#include "scalelab/comm/comm.h"         // defines: Communicator
#include "scalelab/comm/host_values.h"  // defines: broadcast_values (the resume step)
#include "scalelab/core/clock.h"        // defines: clock_is_virtual (checkpoint times stay real time)
#include "scalelab/core/error.h"        // defines: SL_CHECK_HINT
#include "scalelab/core/threads.h"      // defines: set_num_threads
#include "scalelab/data/shard.h"        // defines: data::fnv1a64 (the manifest's digest)
#include "scalelab/driver/driver.h"     // defines: driver::DistributedOptions, set_links, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/metrics.h"       // defines: RunLogger
#include "train_step.h"                     // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;
using lab08::wall_ms;

struct Options : driver::DistributedOptions, driver::ClusterOptions, driver::PipelineOptions, lab08::FaultOptions {
  Options() { sample_tokens = 0; }
  int tp = 1, pp = 1, dp = 0;  // dp 0: the ranks / (tp x pp)
  std::string order = "tp-dp-pp";
  bool zero1 = false;
  std::string checkpoint_dir;  // empty: no checkpoints
  int checkpoint_every = 10;
  int keep_last = 3;
  std::string resume = "none";  // none | latest
  bool reshard = false;         // --resume may load a checkpoint of another layout
  lab08::SpikeConfig spike;     // the rollback decision's window, history and z threshold (0: off)
  int max_rollbacks = 3;
  std::string skip_list;      // a skip list to honour from the start (default: <checkpoint-dir>/skip_list.json)
  int straggler_window = 20;  // steps the straggler report looks at (the last ones; 0: no report)
  double straggler_threshold = 1.25;
};

// Thrown out of the training loop by a step whose rollback decision said so (the same step on every rank).
struct Rollback {
  int64_t step;
  std::string reason;
  float loss;  // the step's loss (not logged as a step: the step is not accepted)
};

// The checkpoint --resume latest would load, as a line the ranks compare before anything runs (driver.h
// run_on_all_ranks): "--resume checkpoint=step 4, manifest 0x..." (FNV-1a 64 of its manifest file), or
// "none". Each rank chooses in its own --checkpoint-dir (on a cluster, possibly its own node's disk).
static std::string checkpoint_line(const lab08::CheckpointChoice& c) {
  std::string value = "none";
  if (c.step >= 0) {
    std::ifstream f(c.dir + "/" + lab08::kManifestName, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    char buf[80];
    std::snprintf(buf, sizeof(buf), "step %lld, manifest 0x%016llx", static_cast<long long>(c.step),
                  static_cast<unsigned long long>(data::fnv1a64(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                                bytes.size())));
    value = buf;
  }
  return "--resume checkpoint=" + value;
}

// `chosen`: the checkpoint this rank chose before the first collective (multi-rank runs with --resume
// latest), which rank 0 loads; empty: rank 0 chooses here.
static int run(const Options& o, Communicator& world, const std::optional<lab08::CheckpointChoice>& chosen) {
  const int rank = world.rank(), n = world.size();
  driver::check_train_options(o);
  if (!o.checkpoint_dir.empty())
    driver::check_writable_dir("--checkpoint-dir", o.checkpoint_dir);  // not at the first save
  SL_CHECK_HINT(o.resume == "none" || o.resume == "latest", "--resume none or --resume latest", "--resume %s",
                o.resume.c_str());
  SL_CHECK_HINT(o.resume == "none" || !o.checkpoint_dir.empty(), "add --checkpoint-dir DIR",
                "--resume latest reads the checkpoints of --checkpoint-dir, which is not set");
  SL_CHECK_HINT(o.slow_rank < 0 || o.uniform_compute_ms > 0, "add --uniform-compute-ms 20 (the others' compute time)",
                "--slow-rank slows a rank's uniform compute time, which is off");
  driver::check_rank_option("--fail-rank", o.fail_rank, n, /*none_ok=*/false);  // a rank outside: no fault at all
  driver::check_rank_option("--poison-rank", o.poison_rank, n, /*none_ok=*/false);
  driver::check_rank_option("--slow-rank", o.slow_rank, n);  // -1: none
  lab08::Faults faults(o, rank, o.seed);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  world.set_wait_timeout(o.wait_timeout_s);
  driver::set_links(world, o, o);
  lab07::Grid grid{o.tp, o.pp, o.dp, o.order};
  if (grid.dp == 0 && o.tp > 0 && o.pp > 0) grid.dp = n / (o.tp * o.pp) > 0 ? n / (o.tp * o.pp) : 1;
  const lab07::Layout layout = lab07::make_layout(GPTConfig::preset(o.model), grid, n, rank,
                                                  lab06::schedule_from_name(o.schedule), o.micro_batches, o.chunks,
                                                  o.ranks_per_node, /*placement_rule=*/false);
  driver::RunData data =
      driver::open_data(o, lab_parts(), o.micro_batch, o.micro_batches, layout.coords.dp_rank, grid.dp);
  const OptimizerConfig oc = driver::optimizer_config(o);
  const PrecisionPolicy policy = driver::precision_policy(o);  // --precision, --activations
  std::unique_ptr<lab07::Rank3D> part = lab07::build_rank(world, data.cfg, layout, oc, policy, device, o.seed, o.zero1);
  for (auto& m : part->models) driver::apply_recompute(o, *m);

  // Checkpoint writes and loads are timed on the wall clock (wall_ms): the files and the disk are real, not
  // simulated, and a failure's restart is a real process. On the simulated GPU they say so.
  const std::string real_time_note = clock_is_virtual() ? " (real time: the disk is not simulated)" : "";

  // ------------------------------------------------------------------------------------------------
  // Resume: rank 0 chooses (YOUR newest_complete_checkpoint), every rank loads the same step
  int64_t start_step = 0;
  Rng sample_rng(o.seed ^ 0x5eed);
  auto load_newest = [&]() -> bool {  // collective; false when there is no complete checkpoint
    int32_t step = 0;
    if (rank == 0) {
      const lab08::CheckpointChoice c = chosen ? *chosen : lab08::newest_complete_checkpoint(o.checkpoint_dir);
      for (const std::string& s : c.skipped) std::printf("skipped %s\n", s.c_str());
      step = static_cast<int32_t>(c.step);
    }
    const int64_t s = broadcast_values(world, {step}, 0, "resume step")[0];
    if (s < 0) return false;
    const double t0 = wall_ms();
    const lab08::ResumeState st =
        lab08::load_checkpoint(world, lab08::step_dir(o.checkpoint_dir, s), *part, o.zero1, o.reshard);
    data.train->restore(lab08::rebase_loader_state(data::LoaderState::from_bytes(st.loader), data.train->config()));
    sample_rng.set_state(st.rng);
    start_step = st.step;
    if (rank == 0)
      std::printf("loaded %s (step %lld%s) in %.0f ms%s\n", lab08::step_dir(o.checkpoint_dir, s).c_str(),
                  static_cast<long long>(start_step), st.resharded ? ", resharded" : "", wall_ms() - t0,
                  real_time_note.c_str());
    return true;
  };
  if (o.resume == "latest" && !load_newest() && rank == 0)
    std::printf("no complete checkpoint in %s: starting at step 0\n", o.checkpoint_dir.c_str());
  const std::string skip_path = !o.skip_list.empty()       ? o.skip_list
                                : o.checkpoint_dir.empty() ? ""
                                                           : o.checkpoint_dir + "/skip_list.json";
  lab08::SkipList skip = skip_path.empty() ? lab08::SkipList{} : lab08::SkipList::load(skip_path);

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, world, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);
  RunLogger log("lab08", driver::run_id_all_ranks(world, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);
  const int global_batch = o.micro_batch * o.micro_batches * grid.dp;
  nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
  config.update({{"tp", grid.tp},
                 {"pp", grid.pp},
                 {"dp", grid.dp},
                 {"order", grid.order},
                 {"zero1", o.zero1},
                 {"schedule", o.schedule},
                 {"micro_batches", o.micro_batches},
                 {"chunks", o.chunks},
                 {"micro_batch", o.micro_batch},
                 {"global_batch", global_batch},
                 {"backend", world.backend()},
                 {"checkpoint_dir", o.checkpoint_dir},
                 {"checkpoint_every", o.checkpoint_every},
                 {"keep_last", o.keep_last},
                 {"resume", o.resume},
                 {"reshard", o.reshard},
                 {"start_step", start_step},
                 {"attempt", lab08::attempt()},
                 {"fail_at_step", o.fail_at_step},
                 {"fail_rank", o.fail_rank},
                 {"fail_mode", o.fail_mode},
                 {"fail_in_checkpoint", o.fail_in_checkpoint},
                 {"fail_mtbf_s", o.fail_mtbf_s},
                 {"spike_window", o.spike.window},
                 {"spike_min_history", o.spike.min_history},
                 {"spike_z", o.spike.z_threshold},
                 {"poison_at_step", o.poison_at_step},
                 {"poison_rank", o.poison_rank},
                 {"skip_list", skip_path},
                 {"skipped_windows", skip.positions().size()},
                 {"uniform_compute_ms", o.uniform_compute_ms},
                 {"slow_rank", o.slow_rank},
                 {"slow_factor", o.slow_factor}});
  log.log_run(driver::make_run_record(config, SL_TRACK_NAME, n, threads, policy, device, peak));
  if (rank == 0)
    std::printf("lab08 | %s | %d ranks = %s%s | checkpoints every %d steps in %s | attempt %d\n",
                data.cfg.str().c_str(), n, grid.describe().c_str(), o.zero1 ? " + ZeRO-1" : "", o.checkpoint_every,
                o.checkpoint_dir.empty() ? "(none)" : o.checkpoint_dir.c_str(), lab08::attempt());

  // ------------------------------------------------------------------------------------------------
  // Training: lab 07's step; around it the faults, the heartbeat, the rollback decision, the timings and the
  // checkpoints
  driver::TrainLoop loop(o, {"lab08", o.micro_batch, o.micro_batches, global_batch}, &world, *part->models.front(),
                         data, log, peak, flops_tok, device);
  loop.sample_rng = sample_rng;
  const double compute_f = o.uniform_compute_ms * faults.compute_factor();
  part->stage->set_uniform_compute(compute_f, 2 * compute_f);  // 0: as the compute takes
  const std::vector<Communicator*> comms = lab07_driver::communicators(*part);
  int64_t step_i = start_step;  // the step about to run
  const int64_t first_step = start_step;
  std::vector<float> history;  // the losses of the accepted steps first_step, first_step + 1, ...
  std::vector<lab08::SkipList::Position> step_windows;  // the loader positions this step read
  lab08::RankTimes times;                               // this rank's compute and wait per step
  times.rank = rank;
  lab08::Heartbeat heartbeat(o.heartbeat_dir, rank);
  loop.next_batch = [&](MicroBatch& mb) {  // the loader, minus the skip list's windows
    data::Batch b = data.train->next();
    while (skip.contains(b.epoch, b.batch_in_epoch)) b = data.train->next();
    step_windows.push_back({b.epoch, b.batch_in_epoch});
    faults.poison(b, step_i, o.micro_batches);
    data::load_batch(b, mb.inputs, mb.targets);
  };
  loop.before_step = [&](double, double, bool) {
    for (Communicator* c : comms)
      if (c != nullptr) c->clear_events();
    part->stage->clear();
  };
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    faults.before_step(step_i);
    const StepResult r = lab07::train_step(*part, micro, lr, o.grad_clip);
    if (o.spike.z_threshold > 0) {  // --spike-z 0: no rollback decision
      const lab08::SpikeDecision d = lab08::decide_rollback(world, history, r.loss, r.grad_norm, o.spike);  // YOURS
      if (d.rollback) throw Rollback{step_i, d.reason, r.loss};
    }
    history.push_back(r.loss);
    return r;
  };
  loop.forward_loss = [&](const Tensor& x, const Tensor& y) { return lab07::forward_loss(*part, x, y); };
  loop.after_step = [&](double step_ms, double, bool) {
    const double wait = lab07_driver::waited_ms(comms);
    times.compute_ms.push_back(part->stage->compute_ms());
    times.wait_ms.push_back(wait);
    heartbeat.beat(step_i, step_ms);
    step_windows.clear();
    ++step_i;
    driver::StepMeasure m;
    m.comm_ms = wait;
    m.extra = {{"compute_ms", times.compute_ms.back()}, {"wait_ms", wait}};
    return m;
  };
  if (!o.checkpoint_dir.empty()) {
    loop.checkpoint_every = o.checkpoint_every;
    loop.save_checkpoint = [&](int64_t next_step) {
      lab08::ResumeState st;
      st.step = next_step;
      st.loader = data.train->state().to_bytes();
      st.rng = loop.sample_rng.state();
      if (faults.in_checkpoint(next_step)) {  // a rank lost mid-checkpoint: its shard is written, then it is
        lab08::write_shard(lab08::step_dir(o.checkpoint_dir, next_step), *part, rank, st);  // gone before the
        faults.strike("in the checkpoint of step", next_step);                              // manifest and marker
      }
      const double t0 = wall_ms();
      const std::string dir = lab08::save_checkpoint(world, o.checkpoint_dir, *part, st, o.zero1);  // YOURS
      if (rank == 0) {
        const std::vector<std::string> deleted = lab08::retain_checkpoints(o.checkpoint_dir, o.keep_last);  // YOURS
        std::printf("checkpoint %s in %.0f ms%s%s\n", dir.c_str(), wall_ms() - t0, real_time_note.c_str(),
                    deleted.empty() ? "" : (" (deleted " + std::to_string(deleted.size()) + " older)").c_str());
      }
    };
  }
  // A spike: every rank rolls back to the newest complete checkpoint, skips the spike step's windows, goes on.
  driver::Summary s;
  int rollbacks = 0;
  for (;; ++rollbacks) {
    try {
      s = loop.run(start_step);
      break;
    } catch (const Rollback& rb) {
      SL_CHECK_HINT(rollbacks < o.max_rollbacks, "lower the learning rate, or look at the data the skip list names",
                    "step %lld: %s; that is rollback %d (--max-rollbacks %d)", static_cast<long long>(rb.step),
                    rb.reason.c_str(), rollbacks + 1, o.max_rollbacks);
      SL_CHECK_HINT(!o.checkpoint_dir.empty(), "give --checkpoint-dir: a rollback needs a checkpoint",
                    "step %lld: %s, and there is no checkpoint to roll back to", static_cast<long long>(rb.step),
                    rb.reason.c_str());
      for (const lab08::SkipList::Position& p : step_windows) skip.add(p);  // the same positions on every rank
      if (rank == 0) skip.save(skip_path);
      SL_CHECK_HINT(load_newest(), "checkpoint more often (--checkpoint-every)",
                    "step %lld: %s, and no complete checkpoint in %s", static_cast<long long>(rb.step),
                    rb.reason.c_str(), o.checkpoint_dir.c_str());
      loop.sample_rng = sample_rng;
      history.resize(static_cast<size_t>(std::max<int64_t>(0, start_step - first_step)));  // the steps kept
      log.log("rollback", {{"step", rb.step},
                           {"loss", rb.loss},
                           {"reason", rb.reason},
                           {"to_step", start_step},
                           {"skipped_windows", step_windows.size()},
                           {"skip_list", skip_path}});
      if (rank == 0)
        std::printf("rollback at step %lld (%s): back to step %lld, skipping its %zu windows (%s)\n",
                    static_cast<long long>(rb.step), rb.reason.c_str(), static_cast<long long>(start_step),
                    step_windows.size(), skip_path.c_str());
      step_windows.clear();
      step_i = start_step;
    }
  }

  // ------------------------------------------------------------------------------------------------
  // Summary: the straggler report (YOUR find_stragglers) over the last steps of every rank
  // (nothing ran when the run resumed at its last step: on every rank alike)
  const bool report = o.straggler_window > 0 && !times.compute_ms.empty();  // --straggler-window 0: none
  const std::vector<lab08::RankTimes> all = report ? lab08::gather_rank_times(world, times, o.straggler_window)
                                                   : std::vector<lab08::RankTimes>{};
  const std::vector<lab08::Straggler> slow = all.empty() ? std::vector<lab08::Straggler>{}
                                                         : lab08::find_stragglers(all, o.straggler_threshold);
  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, /*simulated=*/false);
  summary["stragglers"] = lab08::stragglers_json(slow);
  log.log_summary(summary);
  if (rank == 0) {
    driver::print_summary_headline(s, peak, n);
    if (rollbacks > 0)
      std::printf("\n(after %d rollback(s): the summary covers steps %lld to %d, the run since the last one)",
                  rollbacks, static_cast<long long>(start_step), o.steps);
    if (report)
      std::printf("\nstragglers over the last %zu steps:%s", all.front().compute_ms.size(),
                  slow.empty() ? " none" : "");
    std::printf("\n");
    lab08::print_stragglers(slow);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 08: 3D-parallel GPT-2 with sharded checkpoints, resume and fault injection (mpirun -np N)"};
  Options o;
  driver::add_distributed_options(app, o, "lab08");
  app.add_option("--tp", o.tp, "tensor-parallel group size")->capture_default_str()->check(driver::positive_int());
  app.add_option("--pp", o.pp, "pipeline stages")->capture_default_str()->check(driver::positive_int());
  app.add_option("--dp", o.dp, "data-parallel replicas (0: the ranks / (tp x pp))")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--order", o.order, "the grid's axes, fastest-varying first")->capture_default_str();
  app.add_flag("--zero1", o.zero1, "shard the optimizer state across the data-parallel group (ZeRO-1)");
  driver::add_cluster_options(app, o);
  driver::add_pipeline_options(app, o);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write sharded checkpoints here (empty: none)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (and one after the last)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--keep-last", o.keep_last, "complete checkpoints kept (retention)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--resume", o.resume, "none, or latest: the newest complete checkpoint in --checkpoint-dir")
      ->capture_default_str();
  app.add_flag("--reshard", o.reshard, "--resume may load a checkpoint written at another layout (the same model)");
  lab08::add_fault_options(app, o);
  app.add_option("--spike-window", o.spike.window, "losses the z-score's mean and std are taken over")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--spike-min-history", o.spike.min_history, "accepted losses before the z-score applies")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--spike-z", o.spike.z_threshold,
                 "a loss this many standard deviations above the mean is a spike "
                 "(0: no rollback decision)")
      ->capture_default_str()
      ->check(driver::finite_non_negative());
  app.add_option("--max-rollbacks", o.max_rollbacks, "spikes rolled back before the run gives up")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--skip-list", o.skip_list,
                 "windows to skip from the start, {\"skip\": [[epoch, batch], ...]} "
                 "(default: <checkpoint-dir>/skip_list.json, where rollbacks add theirs)");
  app.add_option("--straggler-window", o.straggler_window, "the straggler report's steps (the last ones; 0: no report)")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--straggler-threshold", o.straggler_threshold,
                 "a rank whose median compute exceeds this times "
                 "the typical rank's is a straggler")
      ->capture_default_str()
      ->check(driver::finite_in_range(1, INFINITY));
  driver::add_link_options(app, o);
  CLI11_PARSE(app, argc, argv);
  // With --resume latest every rank chooses its checkpoint before the first collective, which compares them.
  std::optional<lab08::CheckpointChoice> chosen;
  auto checkpoint_to_resume = [&]() -> std::vector<std::string> {
    if (o.resume != "latest" || o.checkpoint_dir.empty()) return {};
    chosen = lab08::newest_complete_checkpoint(o.checkpoint_dir);
    return {checkpoint_line(*chosen)};
  };
  return driver::run_on_all_ranks(
      app, o, o.backend, [&](Communicator& comm) { return run(o, comm, chosen); }, checkpoint_to_resume);
}
