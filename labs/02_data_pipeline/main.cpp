// main.cpp — lab 02: the starvation experiment. Times the kit's loader and a naive one alone (no model),
// then trains GPT-2 through the kit's training loop fed by each, and prints how much of every step waited
// for data, against what the model consumes. The program is shared by both tracks: on the learner track
// the kit's loader is YOUR labs/02_data_pipeline/shard_loader.cpp (bin/learner/lab02_data_pipeline, the
// training loop and its validation pass included: labs/CMakeLists.txt), on the reference track
// solutions/02_data_pipeline/shard_loader.cpp (bin/reference/lab02_data_pipeline). The naive loader is
// naive_loader.h; the training step is lab 01's reference. Lesson: labs/02_data_pipeline/README.md.
// Log schema: docs/log_schema.md (each loader's run is its own run directory, <run-id>-kit and -naive).
//
//   build/bin/reference/lab02_data_pipeline --data data/kjv --model demo --steps 20
//   build/bin/reference/lab02_data_pipeline --model demo --loader kit --read-delay-ms 20 --prefetch off
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <chrono>   // defines: std::chrono::duration (--read-delay-ms)
#include <cmath>    // defines: std::isnan
#include <cstdio>   // defines: std::printf
#include <cstring>  // defines: std::memcmp (losses compared bit for bit)
#include <string>
#include <thread>  // defines: std::this_thread::sleep_for (--read-delay-ms)
#include <vector>

#include "lab_parts.h"                      // defines: lab_parts (YOUR loader; lab 01's reference MFU)
#include "naive_loader.h"                   // defines: lab02_driver::NaiveTextLoader (the loader compared with)
#include "scalelab/core/error.h"            // defines: SL_CHECK_HINT
#include "scalelab/core/threads.h"          // defines: set_num_threads
#include "scalelab/data/batch.h"            // defines: data::load_batch
#include "scalelab/driver/driver.h"         // defines: driver::TrainOptions, make_run_record, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data, time_source_alone (common/)
#include "scalelab/measure/calibration.h"   // defines: Peak (the MFU denominator; driver::run_peak)
#include "scalelab/measure/metrics.h"       // defines: RunLogger, make_run_id
#include "scalelab/model/gpt2.h"            // defines: GPT2
#include "scalelab/model/optim.h"           // defines: Optimizer
#include "train_step.h"                     // defines: lab01::train_step, flops_per_token (lab 01's reference)

using namespace scalelab;
using scalelab::lab02_driver::NaiveTextLoader;

struct Options : driver::TrainOptions {
  Options() {
    steps = 20;     // a short run: the data wait shows from step 1
    val_every = 0;  // validation at the start and the end only
    val_batches = 2;
    sample_tokens = 0;   // no sample: this lab is about the data
    timeline_steps = 0;  // no communication
  }
  int batch = 8;                  // B: sequences per step
  std::string loader = "both";    // kit, naive or both (kit first, then naive, each on a fresh model)
  std::string text;               // the raw text of the naive loader ("": <data>/kjv.txt)
  std::string prefetch = "on";    // the kit loader's prefetch thread: on or off
  int prefetch_depth = 2;         // batches it prepares ahead
  double read_delay_ms = 0;       // ms slept before every kit batch is read (a simulated slow disk)
  int alone_batches = 2000;       // batches of the kit loader timed alone
  int naive_alone_batches = 100;  // batches of the naive loader timed alone (each reads the whole text)
};

// What one loader measured: alone, then feeding the training loop.
struct LoaderRun {
  std::string loader;             // "kit" or "naive"
  double alone_tokens_per_s = 0;  // tokens/s of the loader alone, no model
  driver::Summary s;              // the training run (means over its timed steps)
  std::vector<float> losses;      // every step's loss, to compare the two loaders' runs bit for bit
  double consumption() const {    // tokens/s the model eats when it never waits: tokens / (step - data wait)
    const double compute_ms = s.step_ms - s.data_wait_ms;
    return compute_ms > 0 ? s.tokens_per_s * s.step_ms / compute_ms : 0.0;
  }
  double wait_share() const { return s.step_ms > 0 ? s.data_wait_ms / s.step_ms : 0.0; }  // fraction of a step
};

// A ratio for the table: 3 significant digits up to 100, whole numbers above.
static std::string ratio_text(double r) {
  char s[32];
  std::snprintf(s, sizeof(s), r >= 100 ? "%.0fx" : (r >= 10 ? "%.1fx" : "%.2fx"), r);
  return s;
}

static int run(const Options& o) {
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, data (the kit loader is this track's), the naive loader, peak FLOP/s
  driver::check_train_options(o);
  SL_CHECK_HINT(o.steps >= 2, "step 0 is the warm-up and is not timed: use --steps 2 or more (20 by default)",
                "--steps %d leaves no timed step to compare the loaders on", o.steps);
  SL_CHECK_HINT(o.loader == "kit" || o.loader == "naive" || o.loader == "both", "use --loader kit, naive or both",
                "--loader '%s'", o.loader.c_str());
  SL_CHECK_HINT(o.prefetch == "on" || o.prefetch == "off", "use --prefetch on or --prefetch off", "--prefetch '%s'",
                o.prefetch.c_str());
  SL_CHECK_HINT(o.read_delay_ms >= 0, "--read-delay-ms is a sleep in ms, >= 0", "--read-delay-ms %g", o.read_delay_ms);
  SL_CHECK_HINT(o.alone_batches > 0 && o.naive_alone_batches > 0, "time each loader alone for at least one batch",
                "--loader-alone-batches %d, --naive-alone-batches %d", o.alone_batches, o.naive_alone_batches);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  driver::RunData data = driver::open_data(o, lab_parts(), o.batch, /*micro_steps=*/1, /*dp_rank=*/0, /*dp_size=*/1);
  data.train.reset();  // each run below opens its own, with this program's prefetch and read delay
  data::LoaderConfig kit_config = data.loader;
  kit_config.prefetch = o.prefetch == "on";
  kit_config.prefetch_depth = o.prefetch_depth;
  if (o.read_delay_ms > 0) {
    const auto delay = std::chrono::duration<double, std::milli>(o.read_delay_ms);
    kit_config.on_assemble = [delay](int64_t, int64_t) { std::this_thread::sleep_for(delay); };
  }
  const std::string text_path = o.text.empty() ? o.data + "/kjv.txt" : o.text;

  const PrecisionPolicy policy = driver::precision_policy(o);                  // --precision, --activations
  const Peak peak = driver::run_peak(device, policy, threads, o.calibration);  // the MFU denominator
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);
  const std::string run_id = o.run_id.empty() ? make_run_id() : o.run_id;
  std::vector<std::string> loaders;
  if (o.loader != "naive") loaders.push_back("kit");
  if (o.loader != "kit") loaders.push_back("naive");

  std::printf(
      "lab02 | %s | B=%d T=%d | %s | %d thread%s | kit loader: prefetch %s (depth %d), read delay %g ms | "
      "naive loader: %s\n",
      data.cfg.str().c_str(), o.batch, o.seq_len, policy.name().c_str(), threads, threads == 1 ? "" : "s",
      o.prefetch.c_str(), o.prefetch_depth, o.read_delay_ms, text_path.c_str());

  std::vector<LoaderRun> runs;
  for (const std::string& which : loaders) {
    LoaderRun r;
    r.loader = which;
    // --------------------------------------------------------------------------------------------
    // The loader alone, no model: a fresh one, so the training run below starts at batch 0 too
    if (which == "kit") {
      r.alone_tokens_per_s =
          driver::time_loader_alone(data.parts.open_loader, o.data, kit_config, o.alone_batches, 0.0, nullptr);
    } else {
      NaiveTextLoader alone(text_path, o.data, data.loader);
      const driver::FillBatch fill = [&](MicroBatch& mb) { data::load_batch(alone.next(), mb.inputs, mb.targets); };
      r.alone_tokens_per_s = driver::time_source_alone(fill, o.batch, o.seq_len, o.naive_alone_batches, nullptr);
    }

    // --------------------------------------------------------------------------------------------
    // Training through the kit's loop, a fresh model per loader (the same seed: the same start)
    data.train = data.parts.open_loader(o.data, "train", kit_config);  // the kit loader (the loop's data.train)
    std::unique_ptr<NaiveTextLoader> naive;
    GPT2 model(data.cfg, policy, device, o.seed);
    driver::apply_recompute(o, model);
    const OptimizerConfig oc = driver::optimizer_config(o);
    Optimizer optimizer(model, oc);
    RunLogger log("lab02", run_id + "-" + which, /*rank=*/0, o.log_dir);
    nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
    config.update({{"n_params", model.num_params()},
                   {"B", o.batch},
                   {"loader", which},
                   {"prefetch", which == "kit" && kit_config.prefetch},
                   {"prefetch_depth", o.prefetch_depth},
                   {"read_delay_ms", which == "kit" ? o.read_delay_ms : 0.0},
                   {"text", text_path}});
    log.log_run(driver::make_run_record(config, SL_TRACK_NAME, /*world_size=*/1, threads, policy, device, peak));
    log.log("loader_alone", {{"tokens_per_s", r.alone_tokens_per_s},
                             {"batches", which == "kit" ? o.alone_batches : o.naive_alone_batches}});
    if (!o.quiet) std::printf("\n== %s loader: logs %s\n", which.c_str(), log.path().c_str());

    driver::TrainLoop loop(o, {"lab02", o.batch, /*micro_steps=*/1, /*global_batch=*/o.batch}, /*comm=*/nullptr, model,
                           data, log, peak, flops_tok, device);
    loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
      const StepResult step = lab01::train_step(model, optimizer, micro[0].inputs, micro[0].targets, lr, o.grad_clip);
      r.losses.push_back(step.loss);
      return step;
    };
    if (which == "naive") {
      naive = std::make_unique<NaiveTextLoader>(text_path, o.data, data.loader);
      loop.next_batch = [&](MicroBatch& mb) { data::load_batch(naive->next(), mb.inputs, mb.targets); };
    }
    r.s = loop.run();

    nlohmann::json summary = driver::summary_record(r.s, peak, /*comm=*/false, /*simulated=*/false);
    summary.update({{"loader", which},
                    {"steps", r.s.steps},
                    {"step_ms", r.s.step_ms},
                    {"data_wait_ms", r.s.data_wait_ms},
                    {"data_wait_share", r.wait_share()},
                    {"loader_alone_tokens_per_s", r.alone_tokens_per_s},
                    {"consumption_tokens_per_s", r.consumption()}});
    log.log_summary(summary);
    runs.push_back(std::move(r));
  }

  // ------------------------------------------------------------------------------------------------
  // The table: each loader alone against what the model eats, and what it cost the training steps
  std::printf("\n== the starvation experiment: %s, B=%d x T=%d, %d thread%s, %lld timed steps each ==\n",
              o.model.c_str(), o.batch, o.seq_len, threads, threads == 1 ? "" : "s",
              static_cast<long long>(runs.front().s.timed_steps));
  std::printf("%-6s | %16s | %14s | %9s | %13s | %10s | %18s\n", "loader", "alone tokens/s", "train tokens/s",
              "step ms", "data wait ms", "wait share", "alone / model eats");
  for (const LoaderRun& r : runs) {
    std::printf("%-6s | %16.0f | %14.0f | %9.2f | %13.3f | %9.1f%% | %18s\n", r.loader.c_str(), r.alone_tokens_per_s,
                r.s.tokens_per_s, r.s.step_ms, r.s.data_wait_ms, 100.0 * r.wait_share(),
                ratio_text(r.alone_tokens_per_s / r.consumption()).c_str());
  }
  std::printf("the model eats %.0f tokens/s when it never waits (tokens per step / (step - data wait), the %s run)\n",
              runs.front().consumption(), runs.front().loader.c_str());
  if (!runs.front().s.simulated.empty()) {  // --device sim: the step is virtual, the loaders are this host's
    std::printf(
        "(%s: step ms and data wait are the simulated GPU's, the copy of each batch to it; the host "
        "really waited",
        runs.front().s.simulated.c_str());
    for (const LoaderRun& r : runs) std::printf(" %.3f ms (%s)", r.s.host_data_wait_ms, r.loader.c_str());
    std::printf(" per step for the loaders, real time, not part of the virtual step)\n");
  }
  if (runs.size() == 2) {
    const std::vector<float>& a = runs[0].losses;
    const std::vector<float>& b = runs[1].losses;
    size_t first_diff = 0;
    while (first_diff < a.size() && first_diff < b.size() &&
           std::memcmp(&a[first_diff], &b[first_diff], sizeof(float)) == 0)
      ++first_diff;
    if (first_diff == a.size() && a.size() == b.size())
      std::printf("losses: kit and naive runs identical, bit for bit, at all %zu steps (the same windows)\n", a.size());
    else
      std::printf("losses: kit and naive runs DIFFER from step %zu (kit %.7g, naive %.7g): not the same windows\n",
                  first_diff, first_diff < a.size() ? a[first_diff] : NAN, first_diff < b.size() ? b[first_diff] : NAN);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{
      "lab 02: the data loader in isolation and under the model (kit loader vs a naive one); reports "
      "tokens/s and the data-wait share of the step"};
  Options o;
  driver::add_train_options(app, o, "lab02");  // --device --model --seq-len, the schedule, --precision ... --quiet
  app.get_option("--threads")->description("CPU threads (0: all cores)");
  app.add_option("--batch", o.batch, "B: sequences per step")->capture_default_str()->check(driver::positive_int());
  app.add_option("--loader", o.loader,
                 "kit (pre-tokenized shards, memory-mapped, prefetched), naive (raw text read "
                 "and tokenized for every batch, no prefetch) or both")
      ->capture_default_str();
  app.add_option("--text", o.text, "the raw text of the naive loader (default: <data>/kjv.txt)");
  app.add_option("--prefetch", o.prefetch, "the kit loader's prefetch thread: on or off")->capture_default_str();
  app.add_option("--prefetch-depth", o.prefetch_depth, "batches the prefetch thread prepares ahead")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--read-delay-ms", o.read_delay_ms,
                 "sleep this long before every kit batch is read: a simulated "
                 "slow disk (README 'Prefetch')")
      ->capture_default_str()
      ->check(driver::finite_non_negative());
  app.add_option("--loader-alone-batches", o.alone_batches, "batches of the kit loader timed alone, no model")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--naive-alone-batches", o.naive_alone_batches, "batches of the naive loader timed alone")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  CLI11_PARSE(app, argc, argv);
  return driver::run_single_process(app, o,
                                    [&] { return run(o); });  // exit 3: a TODO not written yet; 1: another error
}
