// main.cpp — lab 08: lab 07's 3D-parallel GPT-2, made to survive failures. Every --checkpoint-every steps
// each rank writes its shard and rank 0 the manifest and the completion marker (YOUR save_checkpoint);
// --resume latest goes on from the newest complete checkpoint (YOUR newest_complete_checkpoint), bit for bit
// at the same layout; old checkpoints are deleted by YOUR retain_checkpoints. A fault can be injected
// (--fail-at-step, --fail-rank, --fail-mode kill|hang), and every rank leaves a heartbeat per step for
// scripts/supervise, which restarts the job when a rank dies or falls silent. The loop around the step is
// labs/common/train_loop.h; the step is lab 07's reference. Lesson: labs/08_resilience/README.md.
//
//   mpirun -np 2 build/bin/reference/lab08_resilience --checkpoint-dir runs/ckpt --checkpoint-every 5 --steps 20
//   scripts/supervise --heartbeat-timeout-s 30 -- mpirun -np 2 build/bin/reference/lab08_resilience
//       --checkpoint-dir runs/ckpt --checkpoint-every 5 --steps 20 --resume latest --fail-at-step 12 --fail-rank 1
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none; or scripts/run 08 ...)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <signal.h>  // defines: raise, SIGKILL
#include <unistd.h>  // defines: sleep

#include <chrono>      // defines: std::chrono::system_clock
#include <cstdio>      // defines: std::printf
#include <cstdlib>     // defines: std::getenv
#include <filesystem>  // defines: std::filesystem::create_directories
#include <fstream>     // defines: std::ofstream
#include <string>
#include <vector>

#include "driver.h"                    // defines: driver::DistributedOptions, set_links, ... (labs/common)
#include "parallel_3d.h"               // defines: lab07::make_layout, build_rank, train_step (lab 07's reference)
#include "resilience.h"                // defines: lab08::save_checkpoint, newest_complete_checkpoint, ... (YOU)
#include "scalelab/comm/comm.h"        // defines: Communicator, run_on_all_ranks
#include "scalelab/core/error.h"       // defines: SL_CHECK_HINT
#include "scalelab/core/threads.h"     // defines: set_num_threads
#include "scalelab/measure/metrics.h"  // defines: RunLogger
#include "train_loop.h"                // defines: driver::TrainLoop, open_data (labs/common)
#include "train_step.h"                // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;

struct Options : driver::DistributedOptions, driver::ClusterOptions, driver::PipelineOptions {
  Options() { sample_tokens = 0; }
  int tp = 1, pp = 1, dp = 0;      // dp 0: the ranks / (tp x pp)
  std::string order = "tp-dp-pp";
  bool zero1 = false;
  std::string checkpoint_dir;      // empty: no checkpoints
  int checkpoint_every = 10;
  int keep_last = 3;
  std::string resume = "none";     // none | latest
  int fail_at_step = -1;           // the fault: rank fail_rank stops when step fail_at_step is about to run
  int fail_rank = 0;
  std::string fail_mode = "kill";  // kill (SIGKILL) | hang (sleeps forever: a silent rank)
  bool fail_in_checkpoint = false; // the fault strikes in the checkpoint of step fail_at_step, after its shard
  std::string heartbeat_dir;       // one line per step and rank here (scripts/supervise watches it)
};

// The restart count scripts/supervise exports (0 for the first attempt or without a supervisor): the fault
// is injected only on the first attempt, so the restarted job gets past it.
static int attempt() {
  const char* a = std::getenv("SL_RESTART");
  return a == nullptr ? 0 : std::atoi(a);
}

static double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

static int run(const Options& o, Communicator& world) {
  const int rank = world.rank(), n = world.size();
  driver::check_train_options(o);
  SL_CHECK_HINT(o.resume == "none" || o.resume == "latest", "--resume none or --resume latest",
                "--resume %s", o.resume.c_str());
  SL_CHECK_HINT(o.resume == "none" || !o.checkpoint_dir.empty(), "add --checkpoint-dir DIR",
                "--resume latest reads the checkpoints of --checkpoint-dir, which is not set");
  SL_CHECK_HINT(o.fail_mode == "kill" || o.fail_mode == "hang", "--fail-mode kill or hang", "--fail-mode %s",
                o.fail_mode.c_str());
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  world.set_wait_timeout(o.wait_timeout_s);
  driver::set_links(world, o, o);
  lab07::Grid grid{o.tp, o.pp, o.dp, o.order};
  if (grid.dp == 0 && o.tp > 0 && o.pp > 0) grid.dp = n / (o.tp * o.pp) > 0 ? n / (o.tp * o.pp) : 1;
  const lab07::Layout layout = lab07::make_layout(GPTConfig::preset(o.model), grid, n, rank,
                                                  lab06::schedule_from_name(o.schedule), o.micro_batches, o.chunks,
                                                  o.ranks_per_node, /*placement_rule=*/false);
  driver::RunData data = driver::open_data(o, o.micro_batch, o.micro_batches, layout.coords.dp_rank, grid.dp);
  OptimizerConfig oc;
  oc.kind = OptimizerConfig::kind_from_name(o.optimizer);
  oc.weight_decay = o.weight_decay;
  const PrecisionPolicy policy = PrecisionPolicy::from_name(o.precision);
  std::unique_ptr<lab07::Rank3D> part = lab07::build_rank(world, data.cfg, layout, oc, policy, device, o.seed, o.zero1);

  // ------------------------------------------------------------------------------------------------
  // Resume: rank 0 chooses (YOUR newest_complete_checkpoint), every rank loads the same step
  int64_t start_step = 0;
  Rng sample_rng(o.seed ^ 0x5eed);
  if (o.resume == "latest") {
    Tensor step = Tensor::zeros({1}, DType::I32, Device::CPU, MemCategory::Workspace);
    if (rank == 0) {
      const lab08::CheckpointChoice c = lab08::newest_complete_checkpoint(o.checkpoint_dir);
      for (const std::string& s : c.skipped) std::printf("skipped %s\n", s.c_str());
      step.data<int32_t>()[0] = static_cast<int32_t>(c.step);
    }
    world.broadcast(step, 0, "resume step");
    const int64_t s = step.data<int32_t>()[0];
    if (s < 0) {
      if (rank == 0) std::printf("no complete checkpoint in %s: starting at step 0\n", o.checkpoint_dir.c_str());
    } else {
      const lab08::ResumeState st = lab08::load_checkpoint(world, lab08::step_dir(o.checkpoint_dir, s), *part, o.zero1);
      data.train->restore(lab02::LoaderState::from_bytes(st.loader));
      sample_rng.set_state(st.rng);
      start_step = st.step;
      if (rank == 0) std::printf("resumed from %s at step %lld\n", lab08::step_dir(o.checkpoint_dir, s).c_str(),
                                 static_cast<long long>(start_step));
    }
  }

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, world, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);
  RunLogger log("lab08", driver::run_id_all_ranks(world, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);
  const int global_batch = o.micro_batch * o.micro_batches * grid.dp;
  const nlohmann::json config = {
      {"model", o.model}, {"tp", grid.tp}, {"pp", grid.pp}, {"dp", grid.dp}, {"order", grid.order},
      {"zero1", o.zero1}, {"schedule", o.schedule}, {"micro_batches", o.micro_batches}, {"chunks", o.chunks},
      {"micro_batch", o.micro_batch}, {"global_batch", global_batch}, {"T", o.seq_len}, {"steps", o.steps},
      {"lr", o.lr}, {"optimizer", o.optimizer}, {"precision", policy.name()}, {"seed", o.seed},
      {"flops_per_token", flops_tok}, {"data", o.data}, {"backend", world.backend()},
      {"checkpoint_dir", o.checkpoint_dir}, {"checkpoint_every", o.checkpoint_every}, {"keep_last", o.keep_last},
      {"resume", o.resume}, {"start_step", start_step}, {"attempt", attempt()}, {"fail_at_step", o.fail_at_step},
      {"fail_rank", o.fail_rank}, {"fail_mode", o.fail_mode}, {"fail_in_checkpoint", o.fail_in_checkpoint}};
  log.log_run(driver::make_run_record(config, SL_TRACK_NAME, n, threads, policy, device, peak));
  if (rank == 0)
    std::printf("lab08 | %s | %d ranks = %s%s | checkpoints every %d steps in %s | attempt %d\n",
                data.cfg.str().c_str(), n, grid.describe().c_str(), o.zero1 ? " + ZeRO-1" : "", o.checkpoint_every,
                o.checkpoint_dir.empty() ? "(none)" : o.checkpoint_dir.c_str(), attempt());

  // ------------------------------------------------------------------------------------------------
  // Training: lab 07's step; the fault, the heartbeat and the checkpoints around it
  driver::TrainLoop loop(o, {"lab08", o.micro_batch, o.micro_batches, global_batch}, &world, *part->models.front(),
                         *data.train, *data.val, log, peak, flops_tok, device);
  loop.sample_rng = sample_rng;
  int64_t step_i = start_step;  // the step about to run
  std::ofstream beats;
  if (!o.heartbeat_dir.empty()) {
    std::filesystem::create_directories(o.heartbeat_dir);
    beats.open(o.heartbeat_dir + "/rank_" + std::to_string(rank) + ".beats", std::ios::app);
  }
  auto inject_fault = [&](const char* where) {
    std::printf("rank %d: injected fault (%s) %s %lld\n", rank, o.fail_mode.c_str(), where,
                static_cast<long long>(o.fail_at_step));
    std::fflush(stdout);
    if (o.fail_mode == "kill") raise(SIGKILL);
    for (;;) sleep(60);  // hang: alive but silent; the others wait in their next collective
  };
  const bool fault_here = rank == o.fail_rank && attempt() == 0;
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    if (fault_here && !o.fail_in_checkpoint && step_i == o.fail_at_step) inject_fault("at step");
    return lab07::train_step(*part, micro, lr, o.grad_clip);
  };
  loop.forward_loss = [&](const Tensor& x, const Tensor& y) { return lab07::forward_loss(*part, x, y); };
  loop.after_step = [&](double step_ms, double, bool) {
    if (beats.is_open()) {  // the heartbeat: one line per step, flushed (its mtime is what the supervisor watches)
      beats << nlohmann::json{{"attempt", attempt()}, {"step", step_i}, {"step_ms", step_ms}, {"wall_ms", wall_ms()}}
                   .dump()
            << std::endl;
    }
    ++step_i;
    return driver::StepMeasure{};
  };
  if (!o.checkpoint_dir.empty()) {
    loop.checkpoint_every = o.checkpoint_every;
    loop.save_checkpoint = [&](int64_t next_step) {
      lab08::ResumeState st;
      st.step = next_step;
      st.loader = data.train->state().to_bytes();
      st.rng = loop.sample_rng.state();
      if (fault_here && o.fail_in_checkpoint && next_step == o.fail_at_step) {  // a rank lost mid-checkpoint:
        lab08::write_shard(lab08::step_dir(o.checkpoint_dir, next_step), *part, rank, st);  // its shard is written,
        inject_fault("in the checkpoint of step");  // then it is gone before the manifest and the marker
      }
      const double t0 = wall_ms();
      const std::string dir = lab08::save_checkpoint(world, o.checkpoint_dir, *part, st, o.zero1);
      if (rank == 0) {
        const std::vector<std::string> deleted = lab08::retain_checkpoints(o.checkpoint_dir, o.keep_last);
        std::printf("checkpoint %s in %.0f ms%s\n", dir.c_str(), wall_ms() - t0,
                    deleted.empty() ? "" : (" (deleted " + std::to_string(deleted.size()) + " older)").c_str());
      }
    };
  }
  const driver::Summary s = loop.run(start_step);
  log.log_summary(driver::summary_record(s, peak, /*comm=*/false, /*simulated=*/false));
  if (rank == 0) {
    driver::print_summary_headline(s, peak, n);
    std::printf("\n");
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 08: 3D-parallel GPT-2 with sharded checkpoints, resume and fault injection (mpirun -np N)"};
  Options o;
  if (const char* hb = std::getenv("SL_HEARTBEAT_DIR")) o.heartbeat_dir = hb;  // scripts/supervise sets it
  driver::add_distributed_options(app, o, "lab08");
  app.add_option("--tp", o.tp, "tensor-parallel group size")->capture_default_str();
  app.add_option("--pp", o.pp, "pipeline stages")->capture_default_str();
  app.add_option("--dp", o.dp, "data-parallel replicas (0: the ranks / (tp x pp))")->capture_default_str();
  app.add_option("--order", o.order, "the grid's axes, fastest-varying first")->capture_default_str();
  app.add_flag("--zero1", o.zero1, "shard the optimizer state across the data-parallel group (ZeRO-1)");
  driver::add_cluster_options(app, o);
  driver::add_pipeline_options(app, o);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write sharded checkpoints here (empty: none)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (and one after the last)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--keep-last", o.keep_last, "complete checkpoints kept (retention)")->capture_default_str();
  app.add_option("--resume", o.resume, "none, or latest: the newest complete checkpoint in --checkpoint-dir")
      ->capture_default_str();
  app.add_option("--fail-at-step", o.fail_at_step, "inject a fault when this step is about to run (-1: none; "
                 "only on the first attempt, SL_RESTART unset or 0)")->capture_default_str();
  app.add_option("--fail-rank", o.fail_rank, "the rank that fails")->capture_default_str();
  app.add_option("--fail-mode", o.fail_mode, "kill (SIGKILL) or hang (alive, silent)")->capture_default_str();
  app.add_flag("--fail-in-checkpoint", o.fail_in_checkpoint, "the fault strikes while the checkpoint of step "
               "--fail-at-step is written: after this rank's shard, before the manifest and the marker");
  app.add_option("--heartbeat-dir", o.heartbeat_dir, "one line per step and rank here (default: $SL_HEARTBEAT_DIR, "
                 "which scripts/supervise sets)");
  driver::add_link_options(app, o);
  CLI11_PARSE(app, argc, argv);
  return run_on_all_ranks(o.backend, [&](Communicator& comm) { return run(o, comm); });
}
