// main.cpp — lab 01: train GPT-2 on one device and measure tokens/s and MFU.
// The driver is shared by both tracks: it calls the functions of train_step.h, which come from your
// labs/01_single_device/train_step.cpp (bin/learner/lab01_single_device) or from the reference
// solutions/01_single_device/train_step.cpp (bin/reference/lab01_single_device).
// Lesson: labs/01_single_device/README.md. Log schema: docs/log_schema.md.
//
//   build/bin/reference/lab01_single_device --data data/kjv --model demo --steps 300
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <chrono>    // defines: std::chrono::steady_clock (step timing)
#include <cmath>     // defines: std::exp
#include <cstdio>    // defines: std::printf
#include <filesystem>
#include <string>
#include <utility>   // defines: std::pair
#include <vector>

#include "driver.h"                     // defines: driver::TrainOptions, evaluate, make_run_record, ... (labs/common)
#include "scalelab/measure/calibration.h"       // defines: device_peak (the MFU denominator: calibration or datasheet)
#include "scalelab/model/checkpoint.h"        // defines: checkpoint_path, latest_checkpoint
#include "scalelab/core/device.h"            // defines: cuda_device_count, cuda_device_memory_bytes, device_synchronize
#include "scalelab/core/error.h"             // defines: scalelab::Error, NotImplemented
#include "scalelab/model/gpt2.h"              // defines: GPT2, GPTConfig, AttentionImpl, choose_attention
#include "scalelab/measure/metrics.h"           // defines: RunLogger (JSONL logs)
#include "scalelab/model/sample.h"            // defines: sample_text
#include "scalelab/model/optim.h"             // defines: Optimizer, LRSchedule
#include "scalelab/core/threads.h"           // defines: set_num_threads
#include "scalelab/model/train_checkpoint.h"  // defines: save_train_checkpoint, load_train_checkpoint
#include "shard_loader.h"               // defines: scalelab::lab02::ShardLoader (lab 02's reference)
#include "train_step.h"                 // defines: train_step, flops_per_token, tokens_per_second, mfu (YOU)

using namespace scalelab;
using Clock = std::chrono::steady_clock;

// The options every lab driver has (labs/common/driver.h: --device, --model, --seq-len, the schedule, ...)
// and lab 01's own.
struct Options : driver::TrainOptions {
  Options() { steps = 300; }   // one device and no communication: a longer run than labs 03 and 04 default to
  int batch = 8;               // B: sequences per step
  std::string checkpoint_dir;  // empty: no checkpoints
  int checkpoint_every = 0;
  std::string resume;          // a checkpoint file, or "latest" (in --checkpoint-dir)
  double mem_cap_mb = 0;       // simulated device memory cap, MiB (0: none)
  std::string attention = "auto";  // materialized, flash, or auto (common/include/scalelab/model/gpt2.h AttentionImpl)
};

// --attention auto: flash when the materialized scores would take over a quarter of the memory there is,
// the simulated cap if one is set, else the GPU's memory (choose_attention, gpt2.h). On the CPU without a
// cap: materialized. Returns the choice and, for the header line and the log, why.
static std::pair<AttentionImpl, std::string> attention_from_option(const Options& o, const GPTConfig& cfg,
                                                                   Device device) {
  if (o.attention != "auto") return {attention_impl_from_name(o.attention), "--attention " + o.attention};
  const int64_t cap = Allocator::get(device).capacity_bytes();
  const int64_t budget = cap > 0 ? cap : device == Device::CUDA ? cuda_device_memory_bytes() : 0;
  const AttentionImpl impl = choose_attention(cfg, o.batch, o.seq_len, budget);
  if (budget == 0) return {impl, "auto: no memory budget to compare with (no --memory-cap-mb)"};
  constexpr double kMiB = 1 << 20;
  char why[160];
  std::snprintf(why, sizeof(why), "auto: the scores, %.1f MiB, are %s a quarter of the %.0f MiB %s",
                attention_scores_bytes(cfg, o.batch, o.seq_len) / kMiB,
                impl == AttentionImpl::Flash ? "over" : "within", budget / kMiB, cap > 0 ? "cap" : "GPU memory");
  return {impl, why};
}

static int run(const Options& o) {
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, model, optimizer, data, peak FLOP/s
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  if (o.mem_cap_mb > 0) Allocator::get(device).set_capacity_bytes(static_cast<int64_t>(o.mem_cap_mb * (1 << 20)));

  GPTConfig cfg = GPTConfig::preset(o.model);
  SL_CHECK_HINT(o.seq_len <= cfg.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "--seq-len %d > max_seq_len %d of model '%s'", o.seq_len, cfg.max_seq_len, o.model.c_str());
  lab02::LoaderConfig lc;
  lc.B = o.batch;
  lc.T = o.seq_len;
  lc.seed = o.seed;
  lab02::ShardLoader train_data(o.data, "train", lc);
  driver::ValidationSplit val(o.data, lc, o.val_batches);  // the same first val_batches batches every pass
  cfg.vocab_size = train_data.vocab_size();  // the tokenizer decides V (256 for bytes)

  const PrecisionPolicy policy = PrecisionPolicy::from_name(o.precision);
  GPT2 model(cfg, policy, device, o.seed);
  const auto [attention, attention_why] = attention_from_option(o, cfg, device);
  model.set_attention(attention);
  OptimizerConfig oc;
  oc.kind = OptimizerConfig::kind_from_name(o.optimizer);
  oc.weight_decay = o.weight_decay;
  Optimizer optimizer(model, oc);
  LRSchedule schedule{o.lr, o.min_lr, o.warmup, o.steps};

  const Peak peak = device_peak(device, policy, threads);
  const double flops_tok = lab01::flops_per_token(cfg, o.seq_len);
  Rng rng(o.seed ^ 0x5eedull);

  // ------------------------------------------------------------------------------------------------
  // Resume
  int64_t start_step = 0;
  std::string run_id = o.run_id;
  std::string resume_path = o.resume;
  if (resume_path == "latest") {
    SL_CHECK_HINT(!o.checkpoint_dir.empty(), "add --checkpoint-dir DIR (where the earlier run wrote its checkpoints)",
                  "--resume latest needs --checkpoint-dir");
    resume_path = latest_checkpoint(o.checkpoint_dir);
    if (resume_path.empty())
      std::printf("no checkpoint in %s: starting at step 0\n", o.checkpoint_dir.c_str());
  }
  if (!resume_path.empty()) {
    TrainState st = load_train_checkpoint(resume_path, model, optimizer);
    train_data.restore(lab02::LoaderState::from_bytes(st.loader_state));
    rng = st.rng;
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
  nlohmann::json config = {{"model", o.model},       {"n_params", model.num_params()}, {"B", o.batch},
                           {"T", o.seq_len},         {"steps", o.steps},               {"lr", o.lr},
                           {"optimizer", o.optimizer}, {"precision", policy.name()},   {"seed", o.seed},
                           {"flops_per_token", flops_tok}, {"data", o.data},           {"device", o.device},
                           {"attention", attention_impl_name(model.attention())},
                           {"attention_choice", attention_why}};
  log.log_run(driver::make_run_record(config, SL_TRACK_NAME, /*world_size=*/1, threads, policy, device, peak));

  std::printf("lab01 | %s | %lld params | B=%d T=%d | %s | %s attention (%s) | %d threads | peak %.1f GFLOP/s (%s)\n",
              cfg.str().c_str(), static_cast<long long>(model.num_params()), o.batch, o.seq_len, policy.name().c_str(),
              attention_impl_name(model.attention()), attention_why.c_str(), threads, peak.flops_per_s / 1e9,
              peak.source.c_str());
  std::printf("logs: %s\n", log.path().c_str());

  // ------------------------------------------------------------------------------------------------
  // Training
  Tensor x = Tensor::empty({o.batch, o.seq_len}, DType::I32, device, MemCategory::Data);  // inputs (B, T)
  Tensor y = Tensor::empty({o.batch, o.seq_len}, DType::I32, device, MemCategory::Data);  // targets (B, T)
  float val_loss = driver::evaluate(model, val, x, y);
  const float val_loss_start = val_loss;
  std::printf("step %5lld | val loss %.4f\n", static_cast<long long>(start_step), val_loss);
  log.log_eval(start_step, val_loss);

  double timed_seconds = 0.0;  // steps after the first (warm-up) one
  int64_t timed_tokens = 0;
  float loss = 0.0f;
  const auto t_run = Clock::now();
  for (int64_t step = start_step; step < o.steps; ++step) {
    const auto t0 = Clock::now();
    const lab02::Batch batch = train_data.next();  // blocks only if the prefetch thread is behind
    lab02::load_batch(batch, x, y);
    const float lr = schedule.at(static_cast<int>(step));

    const lab01::StepResult r = lab01::train_step(model, optimizer, x, y, lr, o.grad_clip);  // YOUR step
    device_synchronize(device);  // GPU work is asynchronous: the step ends when the device is done

    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t tokens = static_cast<int64_t>(o.batch) * o.seq_len;
    const double tok_s = lab01::tokens_per_second(tokens, seconds);
    const double step_mfu = peak.flops_per_s > 0 ? lab01::mfu(tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/1)
                                                 : kNotMeasured;
    if (step > start_step) {  // the first step allocates activations and warms caches: not timed
      timed_seconds += seconds;
      timed_tokens += tokens;
    }
    loss = r.loss;

    StepRecord rec;
    rec.step = step;
    rec.loss = r.loss;
    rec.lr = lr;
    rec.tokens = tokens;
    rec.step_ms = seconds * 1e3;
    rec.data_wait_ms = batch.wait_ms;
    rec.tokens_per_s = tok_s;
    rec.mfu = step_mfu;
    rec.grad_norm = r.grad_norm;
    log.log_step(rec);

    const bool last = step + 1 == o.steps;
    if (!o.quiet && (step % 10 == 0 || last)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_run).count();
      const double eta = elapsed / static_cast<double>(step + 1 - start_step) * static_cast<double>(o.steps - step - 1);
      std::printf("step %5lld | loss %.4f | lr %.2e | %7.0f tok/s | MFU %5.1f%% | data wait %.2f ms | ETA %.0f s\n",
                  static_cast<long long>(step), r.loss, lr, tok_s, 100.0 * step_mfu, batch.wait_ms, eta);
      std::fflush(stdout);
    }
    if ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last) {
      val_loss = driver::evaluate(model, val, x, y);
      std::printf("step %5lld | val loss %.4f\n", static_cast<long long>(step + 1), val_loss);
      log.log_eval(step + 1, val_loss);
    }
    if (!o.checkpoint_dir.empty() && ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || last)) {
      TrainState st;
      st.step = step + 1;
      st.loader_state = train_data.state().to_bytes();
      st.rng = rng;
      st.meta = {{"run_id", run_id}, {"steps", o.steps}};
      std::filesystem::create_directories(o.checkpoint_dir);
      save_train_checkpoint(checkpoint_path(o.checkpoint_dir, step + 1), model, optimizer, st);
    }
  }

  // ------------------------------------------------------------------------------------------------
  // Summary and a sample
  const double mean_tok_s = timed_seconds > 0 ? static_cast<double>(timed_tokens) / timed_seconds : 0.0;
  const double mean_mfu = peak.flops_per_s > 0 && mean_tok_s > 0
                              ? lab01::mfu(mean_tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/1)
                              : kNotMeasured;
  const MemStats mem = Allocator::get(device).stats();
  nlohmann::json summary = {{"steps", o.steps - start_step}, {"final_loss", loss},
                            {"val_loss_start", val_loss_start}, {"val_loss_end", val_loss},
                            {"tokens_per_s", mean_tok_s},    {"mfu", mean_mfu},  // token-weighted over timed steps
                            {"peak_flops_per_s", peak.flops_per_s}, {"peak_source", peak.source},
                            {"memory_peak_bytes", mem.total_peak_bytes}};
  const std::string sample = o.sample_tokens > 0 ? sample_text(model, "\n", o.sample_tokens, rng) : "";
  summary["sample"] = sample;
  log.log_summary(summary);
  std::printf("\n== summary ==\nval loss %.4f -> %.4f | %.0f tokens/s | MFU %.1f%% of %.1f GFLOP/s (%s) | peak memory %.1f MiB\n",
              val_loss_start, val_loss, mean_tok_s, 100.0 * mean_mfu, peak.flops_per_s / 1e9, peak.source.c_str(),
              mem.total_peak_bytes / 1048576.0);
  if (!sample.empty()) std::printf("\n== sample ==\n%s\n", sample.c_str());
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 01: train GPT-2 on one device; reports loss, tokens/s and MFU"};
  Options o;
  app.add_option("--device", o.device, "cpu or cuda (a build with the CUDA backend and a GPU)")->capture_default_str();
  app.add_option("--model", o.model, "preset: tiny, demo, d12, d24, d36, d48")->capture_default_str();
  app.add_option("--batch", o.batch, "B: sequences per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seq-len", o.seq_len, "T: tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  driver::add_schedule_options(app, o);  // --steps --lr --min-lr --warmup --grad-clip --weight-decay --optimizer
  app.add_option("--precision", o.precision,
                 "fp32, bf16 (= bf16-mixed: bf16 params, fp32 master and compute) or bf16-compute (bf16-mixed "
                 "with bf16 matmul operands: the GPU's bf16 tensor cores)")
      ->capture_default_str();
  app.add_option("--data", o.data, "directory of token shards (scripts/prepare_corpus.sh)")->capture_default_str();
  app.add_option("--log-dir", o.log_dir, "logs go to <log-dir>/lab01/<run-id>/")->capture_default_str();
  app.add_option("--run-id", o.run_id, "name of this run (default: time + random suffix)");
  app.add_option("--seed", o.seed, "seed of the weights and the data order")->capture_default_str();
  app.add_option("--val-every", o.val_every, "steps between validation passes (0: start and end only)")->capture_default_str();
  app.add_option("--val-batches", o.val_batches, "validation batches per pass")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write checkpoints here (empty: none)");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (and one at the end)")->capture_default_str();
  app.add_option("--resume", o.resume, "a checkpoint file, or 'latest' in --checkpoint-dir");
  app.add_option("--sample-tokens", o.sample_tokens, "bytes of text to generate at the end")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--attention", o.attention,
                 "materialized (saves the (B,NH,T,T) scores), flash (saves (B,NH,T), recomputes the scores in the "
                 "backward) or auto (flash when the scores would take over a quarter of the memory)")
      ->check(CLI::IsMember({"auto", "materialized", "flash"}))
      ->capture_default_str();
  app.add_option("--memory-cap-mb,--mem-cap-mb", o.mem_cap_mb, "simulated device memory cap in MiB (0: none)")
      ->check(CLI::Range(0.0, 1e9))  // MiB; a negative cap is a typo, not "no cap"
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "print only validation and the summary");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const NotImplemented& e) {
    std::fflush(stdout);  // what was printed so far comes before the error
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
