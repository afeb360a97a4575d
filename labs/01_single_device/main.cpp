// main.cpp — lab 01: train GPT-2 on one device and measure tokens/s and MFU.
// The driver is shared by both tracks: it calls the functions of train_step.h, which come from your
// labs/01_single_device/train_step.cpp (bin/learner/lab01_single_device) or from the reference
// solutions/01_single_device/train_step.cpp (bin/reference/lab01_single_device). The loop around the
// step (data, validation, logs, checkpoints, summary) is common/include/scalelab/driver/train_loop.h.
// Lesson: labs/01_single_device/README.md. Log schema: docs/log_schema.md.
//
//   build/bin/reference/lab01_single_device --data data/kjv --model demo --steps 300
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf
#include <filesystem>
#include <string>
#include <vector>

#include "lab_parts.h"                      // defines: lab_parts (YOUR tokens_per_second and mfu; lab 02's loader)
#include "scalelab/core/error.h"            // defines: SL_CHECK_HINT
#include "scalelab/core/threads.h"          // defines: set_num_threads
#include "scalelab/driver/driver.h"         // defines: driver::TrainOptions, make_run_record, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/calibration.h"  // defines: Peak (the MFU denominator: calibration or datasheet; driver::run_peak)
#include "scalelab/measure/metrics.h"         // defines: RunLogger (JSONL logs)
#include "scalelab/model/checkpoint.h"        // defines: checkpoint_path, latest_checkpoint
#include "scalelab/model/gpt2.h"              // defines: GPT2, GPTConfig, AttentionImpl, choose_attention
#include "scalelab/model/optim.h"             // defines: Optimizer
#include "scalelab/model/train_checkpoint.h"  // defines: save_train_checkpoint, load_train_checkpoint
#include "train_step.h"                       // defines: train_step, flops_per_token (YOU)

using namespace scalelab;

// The options every lab driver has (scalelab/driver/driver.h: --device, --model, --seq-len, the schedule, ...)
// and lab 01's own.
struct Options : driver::TrainOptions {
  Options() {
    steps = 300;         // one device and no communication: a longer run than labs 03 and 04 default to
    timeline_steps = 0;  // no communication to put on a timeline
  }
  int batch = 8;               // B: sequences per step
  std::string checkpoint_dir;  // empty: no checkpoints
  int checkpoint_every = 0;
  std::string resume;              // a checkpoint file, or "latest" (in --checkpoint-dir)
  double mem_cap_mb = 0;           // simulated device memory cap, MiB (0: none)
  std::string attention = "auto";  // materialized, flash, or auto (common/include/scalelab/model/gpt2.h AttentionImpl)
};

static int run(const Options& o) {
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, data, model, optimizer, peak FLOP/s
  driver::check_train_options(o);
  if (!o.checkpoint_dir.empty())
    driver::check_writable_dir("--checkpoint-dir", o.checkpoint_dir);  // not at the first save
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  if (o.mem_cap_mb > 0) Allocator::get(device).set_capacity_bytes(static_cast<int64_t>(o.mem_cap_mb * (1 << 20)));
  driver::RunData data = driver::open_data(o, lab_parts(), o.batch, /*micro_steps=*/1, /*dp_rank=*/0, /*dp_size=*/1);

  const PrecisionPolicy policy = driver::precision_policy(o);  // --precision, --activations
  GPT2 model(data.cfg, policy, device, o.seed);
  const auto [attention, attention_why] =
      driver::attention_from_option(o.attention, data.cfg, o.batch, o.seq_len, device);
  model.set_attention(attention);
  driver::apply_recompute(o, model);  // --recompute
  const OptimizerConfig oc = driver::optimizer_config(o);
  Optimizer optimizer(model, oc);

  const Peak peak = driver::run_peak(device, policy, threads, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);  // YOUR TODO lab01-2

  // ------------------------------------------------------------------------------------------------
  // Resume: model, optimizer, the loader's position and the sample's random stream, from a checkpoint
  int64_t start_step = 0;
  std::string run_id = o.run_id;
  std::string resume_path = o.resume;
  Rng sample_rng(o.seed ^ 0x5eedull);
  if (resume_path == "latest") {
    SL_CHECK_HINT(!o.checkpoint_dir.empty(), "add --checkpoint-dir DIR (where the earlier run wrote its checkpoints)",
                  "--resume latest needs --checkpoint-dir");
    resume_path = latest_checkpoint(o.checkpoint_dir);
    if (resume_path.empty()) std::printf("no checkpoint in %s: starting at step 0\n", o.checkpoint_dir.c_str());
  }
  if (!resume_path.empty()) {
    TrainState st = load_train_checkpoint(resume_path, model, optimizer);
    data.train->restore(data::LoaderState::from_bytes(st.loader_state));
    sample_rng = st.rng;
    start_step = st.step;
    if (run_id.empty()) run_id = st.meta.value("run_id", "");  // continue the same run's log
    const int saved_steps = st.meta.value("steps", o.steps);
    if (saved_steps != o.steps)
      std::printf("note: the checkpoint's run had --steps %d, this one %d: the cosine schedule changes length\n",
                  saved_steps, o.steps);
    std::printf("resumed from %s at step %lld\n", resume_path.c_str(), static_cast<long long>(start_step));
  }
  if (run_id.empty()) run_id = make_run_id();
  RunLogger log("lab01", run_id, /*rank=*/0, o.log_dir);
  nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
  config.update({{"n_params", model.num_params()},
                 {"B", o.batch},
                 {"attention", attention_impl_name(model.attention())},
                 {"attention_choice", attention_why}});
  log.log_run(driver::make_run_record(config, SL_TRACK_NAME, /*world_size=*/1, threads, policy, device, peak));

  std::printf("lab01 | %s | %lld params | B=%d T=%d | %s | %s attention (%s) | %d threads | peak %.1f GFLOP/s (%s)\n",
              data.cfg.str().c_str(), static_cast<long long>(model.num_params()), o.batch, o.seq_len,
              policy.name().c_str(), attention_impl_name(model.attention()), attention_why.c_str(), threads,
              peak.flops_per_s / 1e9, peak.source.c_str());
  std::printf("logs: %s\n", log.path().c_str());

  // ------------------------------------------------------------------------------------------------
  // Training: the driver's loop around lab 01's step, with this track's throughput and MFU
  driver::TrainLoop loop(o, {"lab01", o.batch, /*micro_steps=*/1, /*global_batch=*/o.batch}, /*comm=*/nullptr, model,
                         data, log, peak, flops_tok, device);
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    return lab01::train_step(model, optimizer, micro[0].inputs, micro[0].targets, lr, o.grad_clip);  // YOUR step
  };
  loop.sample_rng = sample_rng;
  if (!o.checkpoint_dir.empty()) {
    loop.checkpoint_every = o.checkpoint_every;
    loop.save_checkpoint = [&](int64_t next_step) {
      TrainState st;
      st.step = next_step;
      st.loader_state = data.train->state().to_bytes();
      st.rng = loop.sample_rng;
      st.meta = {{"run_id", run_id}, {"steps", o.steps}};
      std::filesystem::create_directories(o.checkpoint_dir);
      save_train_checkpoint(checkpoint_path(o.checkpoint_dir, next_step), model, optimizer, st);
    };
  }
  const driver::Summary s = loop.run(start_step);

  // ------------------------------------------------------------------------------------------------
  // Summary and a sample
  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/false, /*simulated=*/false);
  summary.update({{"steps", s.steps}, {"memory_peak_bytes", s.memory.total_peak_bytes}, {"sample", s.sample}});
  log.log_summary(summary);
  driver::print_summary_headline(s, peak, /*num_devices=*/0);
  std::printf(" | peak memory %.1f MiB\n", s.memory.total_peak_bytes / 1048576.0);
  if (!s.sample.empty()) std::printf("\n== sample ==\n%s\n", s.sample.c_str());
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 01: train GPT-2 on one device; reports loss, tokens/s and MFU"};
  Options o;
  driver::add_train_options(app, o, "lab01");  // --device --model --seq-len, the schedule, --precision ... --quiet
  app.get_option("--threads")->description("CPU threads (0: all cores)");
  app.get_option("--sample-tokens")->description("bytes of text to generate at the end");
  app.add_option("--batch", o.batch, "B: sequences per step")->capture_default_str()->check(driver::positive_int());
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write checkpoints here (empty: none)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (and one at the end)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--resume", o.resume, "a checkpoint file, or 'latest' in --checkpoint-dir");
  app.add_option("--attention", o.attention,
                 "materialized (saves the (B,NH,T,T) scores), flash (saves (B,NH,T), recomputes the scores in the "
                 "backward) or auto (flash when the scores would take over a quarter of the memory)")
      ->check(CLI::IsMember({"auto", "materialized", "flash"}))
      ->capture_default_str();
  app.add_option("--memory-cap-mb,--mem-cap-mb", o.mem_cap_mb, "simulated device memory cap in MiB (0: none)")
      ->capture_default_str()
      ->check(driver::finite_in_range(0, 1e9));
  CLI11_PARSE(app, argc, argv);
  return driver::run_single_process(app, o,
                                    [&] { return run(o); });  // exit 3: a TODO not written yet; 1: another error
}
