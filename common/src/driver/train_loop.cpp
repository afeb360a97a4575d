// train_loop.cpp — the training loop every lab driver runs (scalelab/driver/train_loop.h).
#include "scalelab/driver/train_loop.h"

#include <algorithm>  // defines: std::max
#include <chrono>     // defines: std::chrono::steady_clock (the host's own times: the loader alone, ETA)
#include <cmath>      // defines: std::isnan
#include <cstdio>     // defines: std::printf, std::snprintf

#include "scalelab/core/clock.h"                // defines: clock_now_ms, clock_pause_ms, clock_is_virtual
#include "scalelab/core/device.h"               // defines: device_synchronize
#include "scalelab/core/error.h"                // defines: SL_CHECK_HINT
#include "scalelab/core/sim_gpu.h"              // defines: sim_gpu (the summary's GPU model), sim_timing_only
#include "scalelab/data/batch.h"                // defines: data::Batch, load_batch
#include "scalelab/driver/option_checks.h"      // defines: check_writable_dir
#include "scalelab/measure/memory_estimator.h"  // defines: estimate_memory, min_devices_to_fit
#include "scalelab/model/sample.h"              // defines: sample_text

namespace scalelab::driver {

// Step times, tokens/s, MFU and timelines read the kit's clock (core/clock.h clock_now_ms: the wall clock,
// or on the simulated GPU the virtual compute stream). The host's own times stay on the wall clock: the
// data loader's wait on the simulated GPU (real host time, logged apart as host_data_wait_ms, not part of
// the virtual step), a loader timed alone (lab 02: the host's loader is what is measured) and the ETA.
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// The data of a run

RunData open_data(const TrainOptions& o, const LabParts& parts, int micro_batch, int micro_steps, int dp_rank,
                  int dp_size) {
  SL_CHECK(parts.open_loader && parts.tokens_per_second != nullptr && parts.mfu != nullptr,
           "open_data: give the lab parts (labs/common/lab_parts.h lab_parts()): a loader, tokens_per_second, mfu");
  RunData d;
  d.parts = parts;
  d.cfg = GPTConfig::preset(o.model);
  d.loader.B = micro_batch;
  d.loader.T = o.seq_len;
  d.loader.seed = o.seed;
  d.loader.dp_rank = dp_rank;  // rank r takes every dp_size-th window of each global batch
  d.loader.dp_size = dp_size;
  d.train = parts.open_loader(o.data, "train", d.loader);
  d.val = std::make_unique<ValidationSplit>(parts.open_loader, o.data, d.loader,
                                            static_cast<int64_t>(o.val_batches) * micro_steps);
  if (GPTConfig::has_own_vocabulary(o.model)) {  // the lesson's sizes keep theirs: the token ids are a subset
    SL_CHECK_HINT(d.train->vocab_size() <= d.cfg.vocab_size, "use a corpus whose tokenizer fits the model",
                  "the data's %d-token vocabulary is larger than model '%s''s V=%d", d.train->vocab_size(),
                  o.model.c_str(), d.cfg.vocab_size);
  } else {
    d.cfg.vocab_size = d.train->vocab_size();  // the tokenizer decides V (256 for bytes)
  }
  SL_CHECK_HINT(o.seq_len <= d.cfg.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "--seq-len %d > max_seq_len %d of model '%s'", o.seq_len, d.cfg.max_seq_len, o.model.c_str());
  return d;
}

void check_train_options(const TrainOptions& o) {
  SL_CHECK_HINT(o.steps > 0, "--steps is the number of optimizer steps, e.g. --steps 100", "--steps %d", o.steps);
  SL_CHECK_HINT(o.lr > 0, "--lr is the peak learning rate, > 0 (e.g. --lr 2e-3)", "--lr %g", o.lr);
  SL_CHECK_HINT(o.min_lr >= 0, "--min-lr is where the cosine decay ends, >= 0 (e.g. --min-lr 2e-4)", "--min-lr %g",
                o.min_lr);
  SL_CHECK_HINT(o.warmup >= 0, "--warmup is a number of steps, >= 0 (0: no warm-up)", "--warmup %d", o.warmup);
  SL_CHECK_HINT(o.grad_clip >= 0, "--grad-clip is the largest gradient norm, > 0, or 0 to turn clipping off",
                "--grad-clip %g", o.grad_clip);
  SL_CHECK_HINT(o.weight_decay >= 0, "--weight-decay is >= 0 (0: none)", "--weight-decay %g", o.weight_decay);
  SL_CHECK_HINT(o.optimizer == "adamw" || o.optimizer == "sgd", "use --optimizer adamw or --optimizer sgd",
                "--optimizer '%s'", o.optimizer.c_str());
  SL_CHECK_HINT(o.val_every >= 0, "--val-every is a number of steps, >= 0 (0: validate at the start and the end only)",
                "--val-every %d", o.val_every);
  SL_CHECK_HINT(o.val_batches > 0, "--val-batches is >= 1", "--val-batches %d", o.val_batches);
  SL_CHECK_HINT(o.sample_tokens >= 0, "--sample-tokens is >= 0 (0: no sample)", "--sample-tokens %d", o.sample_tokens);
  recompute_from_name(o.recompute);            // throws, naming none, selective and full, for another name
  check_writable_dir("--log-dir", o.log_dir);  // the real cause now, not at the first record
}

// A fetch's data wait: on the kit's clock (ms), and on the host's wall clock (host_ms). Real runs: the same
// wait. On the simulated GPU: ms is what the fetch put on the compute stream (the copy to the device, a
// delay), host_ms how long the host really waited for the loader (not in virtual time).
struct DataWait {
  double ms = 0;
  double host_ms = 0;
  DataWait& operator+=(const DataWait& w) {
    ms += w.ms;
    host_ms += w.host_ms;
    return *this;
  }
};

// A loss as printed: 4 decimals, or "not computed" (NaN: a timing-only run computes none).
static std::string loss_text(double loss) {
  if (std::isnan(loss)) return "not computed";
  char text[32];
  std::snprintf(text, sizeof(text), "%.4f", loss);
  return text;
}

// An MFU as printed: "MFU 12.3%" (`format` of the percentage), or "MFU not measured" (NaN: no peak to divide
// by, or no step timed), never "nan%".
static std::string mfu_text(double mfu, const char* format = "MFU %5.1f%%") {
  if (!std::isfinite(mfu)) return "MFU not measured";
  char text[32];
  std::snprintf(text, sizeof(text), format, 100.0 * mfu);
  return text;
}

static double wall_ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One micro-batch into mb, with a pause of delay_ms inside (clock_pause_ms: a sleep, or virtual time).
static DataWait fetch(data::BatchSource& loader, MicroBatch& mb, double delay_ms) {
  const double t0_ms = clock_now_ms();
  const auto h0 = Clock::now();
  const data::Batch batch = loader.next();  // blocks only if the prefetch thread is behind
  clock_pause_ms(delay_ms);
  data::load_batch(batch, mb.inputs, mb.targets);
  return {clock_now_ms() - t0_ms, wall_ms_since(h0)};
}

// One micro-batch from a FillBatch: the time of the call (the data wait).
static DataWait fetch(const FillBatch& fill, MicroBatch& mb) {
  const double t0_ms = clock_now_ms();
  const auto h0 = Clock::now();
  fill(mb);
  return {clock_now_ms() - t0_ms, wall_ms_since(h0)};
}

double time_source_alone(const FillBatch& fill, int B, int T, int batches, Communicator* comm) {
  MicroBatch mb{Tensor::empty({B, T}, DType::I32, Device::CPU, MemCategory::Data),   // (B, T)
                Tensor::empty({B, T}, DType::I32, Device::CPU, MemCategory::Data)};  // (B, T)
  fill(mb);  // warm-up: e.g. the first batch of a prefetching loader waits for its thread's first batch
  if (comm != nullptr) comm->barrier();
  // The host's wall time, plus on the simulated GPU what the fills put on the virtual compute stream (a
  // loader delay's pause, a copy to the device), which took no wall time.
  const double v0_ms = clock_is_virtual() ? clock_now_ms() : 0.0;
  const auto t0 = Clock::now();
  for (int i = 0; i < batches; ++i) fill(mb);
  const double virtual_ms = clock_is_virtual() ? clock_now_ms() - v0_ms : 0.0;
  const double seconds = (wall_ms_since(t0) + virtual_ms) / 1e3;
  return static_cast<double>(batches) * B * T / seconds;
}

double time_loader_alone(const data::OpenBatchSource& open, const std::string& data_dir,
                         const data::LoaderConfig& config, int batches, double delay_ms, Communicator* comm) {
  const std::unique_ptr<data::BatchSource> loader = open(data_dir, "train", config);
  bool warm = false;  // the warm-up fetch sleeps no delay
  const FillBatch fill = [&](MicroBatch& mb) {
    fetch(*loader, mb, warm ? delay_ms : 0.0);
    warm = true;
  };
  return time_source_alone(fill, config.B, config.T, batches, comm);
}

// ---------------------------------------------------------------------------------------------
// The loop

// data.train and data.val, checked: a loop without its loaders is a programming error, said plainly.
static RunData& with_loaders(RunData& d) {
  SL_CHECK(d.train != nullptr && d.val != nullptr,
           "TrainLoop: the run's training or validation loader is not open "
           "(driver::open_data opens both)");
  return d;
}

TrainLoop::TrainLoop(const TrainOptions& o, const LoopSpec& spec, Communicator* comm, GPT2& model, RunData& data,
                     RunLogger& log, const Peak& peak, double flops_per_token, Device device)
    : sample_rng(o.seed ^ 0x5eedull),
      tokens_per_second(data.parts.tokens_per_second),
      mfu(data.parts.mfu),
      o_(o),
      spec_(spec),
      comm_(comm),
      model_(model),
      train_(*with_loaders(data).train),
      val_(*data.val),
      log_(log),
      peak_(peak),
      flops_per_token_(flops_per_token),
      device_(device) {
  log_.set_memory_device(device);  // memory_*_bytes of the step and summary records: this run's device
  // HFU counts what the hardware computes: the model's FLOPs plus the backward's re-run (gpt2.h)
  const Recompute recompute = recompute_from_name(o.recompute);
  const int first = model.shard().first_layer;
  SL_CHECK_HINT(model.recompute(first) == recompute,
                "call driver::apply_recompute(o, models) on every model of this rank before the loop",
                "--recompute %s, but the model's block %d recomputes '%s'", o.recompute.c_str(), first,
                recompute_name(model.recompute(first)));
  hardware_flops_per_token_ = flops_per_token + recompute_flops_per_token(model.config(), o.seq_len, recompute);
  if (comm_ != nullptr) {
    rank_ = comm_->rank();
    world_ = comm_->size();
  }
}

float TrainLoop::evaluate_now(Tensor& x, Tensor& y) {
  if (forward_loss) return evaluate(val_, x, y, forward_loss);  // the same on every rank already
  return comm_ != nullptr ? evaluate_all_ranks(model_, *comm_, val_, x, y) : evaluate(model_, val_, x, y);
}

float TrainLoop::mean_loss(float loss) { return comm_ != nullptr ? mean_over_ranks(*comm_, loss, "loss") : loss; }

Summary TrainLoop::run(int64_t start_step) {
  SL_CHECK(static_cast<bool>(step), "TrainLoop::run: no step function was given (loop.step = ...)");
  SL_CHECK(tokens_per_second != nullptr && mfu != nullptr, "TrainLoop::run: no tokens_per_second or mfu (LabParts)");
  // One micro-batch of tensors per micro-step, allocated once; validation reuses the first.
  std::vector<MicroBatch> micro(spec_.micro_steps);
  for (MicroBatch& mb : micro) {
    mb.inputs = Tensor::empty({spec_.micro_batch, o_.seq_len}, DType::I32, device_, MemCategory::Data);   // (B, T)
    mb.targets = Tensor::empty({spec_.micro_batch, o_.seq_len}, DType::I32, device_, MemCategory::Data);  // (B, T)
  }
  Tensor& x = micro[0].inputs;
  Tensor& y = micro[0].targets;

  Summary s;
  doing_ = "evaluating before step " + std::to_string(start_step) + " (the first forward allocates the activations)";
  // --timing-only (core/sim_gpu.h): the forwards run and are charged, but nothing is computed; every loss and
  // norm is reported as not computed (NaN: null in the logs), never as a number.
  const bool timing_only = sim_timing_only();
  const auto computed = [timing_only](float v) { return timing_only ? static_cast<float>(kNotMeasured) : v; };
  float val_loss = computed(evaluate_now(x, y));
  s.val_loss_start = val_loss;
  if (rank_ == 0)
    std::printf("step %5lld | val loss %s\n", static_cast<long long>(start_step), loss_text(val_loss).c_str());
  log_.log_eval(start_step, val_loss);

  const LRSchedule schedule{o_.lr, o_.min_lr, o_.warmup, o_.steps};
  // The first step of a run allocates activations and warms caches: it is not timed. A run of one step has
  // nothing else to time: that step is timed, warm-up included, and the summary says so (warm_up_timed).
  const bool only_step_timed = o_.steps - start_step == 1;
  double timed_seconds = 0, timed_data_ms = 0, timed_exposed_ms = 0, timed_busy_ms = 0, timed_modeled_ms = 0;
  int64_t timed_tokens = 0;
  const bool simulated = clock_is_virtual();  // --device sim: every time below is virtual
  double timed_host_data_ms = 0;
  const auto t_run = Clock::now();
  for (int64_t step_i = start_step; step_i < o_.steps; ++step_i) {
    doing_ = "step " + std::to_string(step_i);
    const double t0_ms = Communicator::now_ms();  // the kit's clock: the step's start, the timeline's origin
    DataWait wait;
    for (MicroBatch& mb : micro)  // this rank's share
      wait += next_batch ? fetch(next_batch, mb) : fetch(train_, mb, loader_delay_ms);
    const double data_wait_ms = wait.ms;
    const float lr = schedule.at(static_cast<int>(step_i));
    if (comm_ != nullptr) comm_->clear_events();
    const bool want_timeline = step_i >= 1 && step_i <= o_.timeline_steps;  // step 0 is warm-up
    if (before_step) before_step(t0_ms, Communicator::now_ms(), want_timeline);

    const StepResult r = step(micro, lr);  // the lab's step
    device_synchronize(device_);           // GPU work is asynchronous: the step ends when the device is done

    const double seconds = (Communicator::now_ms() - t0_ms) / 1e3;
    StepMeasure m = after_step ? after_step(seconds * 1e3, data_wait_ms, want_timeline) : StepMeasure{};
    Communicator* shown = timeline_comm != nullptr ? timeline_comm : comm_;
    if (want_timeline && shown != nullptr) log_.log_timeline(step_i, shown->events(), m.spans);
    const int64_t tokens = static_cast<int64_t>(spec_.global_batch) * o_.seq_len;  // all ranks together
    const double tok_s = tokens_per_second(tokens, seconds);
    const double step_mfu = peak_.flops_per_s > 0 ? mfu(tok_s, flops_per_token_, peak_.flops_per_s, world_)
                                                  : kNotMeasured;
    const float loss = computed(mean_loss(r.loss));  // outside the timed step: only for the log
    if (step_i > start_step || only_step_timed) {
      timed_seconds += seconds;
      timed_tokens += tokens;
      timed_data_ms += data_wait_ms;
      timed_host_data_ms += wait.host_ms;
      timed_exposed_ms += m.comm_ms;
      timed_busy_ms += m.comm_busy_ms;
      timed_modeled_ms += m.comm_modeled_ms;
    }
    s.final_loss = loss;

    StepRecord rec;
    rec.step = step_i;
    rec.loss = loss;
    rec.lr = lr;
    rec.tokens = tokens;
    rec.step_ms = seconds * 1e3;
    rec.data_wait_ms = data_wait_ms;
    rec.comm_ms = m.comm_ms;
    rec.tokens_per_s = tok_s;
    rec.mfu = step_mfu;
    rec.grad_norm = timing_only ? kNotMeasured : r.grad_norm;
    rec.extra = m.extra;
    rec.extra["hfu"] =  // NaN is logged as null
        peak_.flops_per_s > 0 ? mfu(tok_s, hardware_flops_per_token_, peak_.flops_per_s, world_) : kNotMeasured;
    if (m.simulated) {
      rec.extra["comm_modeled_ms"] = m.comm_modeled_ms;
      rec.extra["simulated"] = true;
    }
    if (simulated) {  // a simulated GPU: virtual times; the loader's real wait apart
      rec.extra["simulated"] = true;
      rec.extra["clock"] = "virtual";
      rec.extra["host_data_wait_ms"] = wait.host_ms;
    }
    log_.log_step(rec);

    const bool last = step_i + 1 == o_.steps;
    if (rank_ == 0 && !o_.quiet && (step_i % 10 == 0 || last)) {
      const double elapsed = wall_ms_since(t_run) / 1e3;  // the ETA is this machine's real time
      const double eta = elapsed / static_cast<double>(step_i + 1 - start_step) *
                         static_cast<double>(o_.steps - step_i - 1);
      char waited[64];
      std::snprintf(waited, sizeof(waited), "data wait %.2f ms", data_wait_ms);
      const std::string middle = progress ? progress(m, data_wait_ms) : std::string(waited);
      std::printf("step %5lld | loss %s | lr %.2e | %7.0f tok/s%s | %s | %s | ETA %.0f s\n",
                  static_cast<long long>(step_i), loss_text(loss).c_str(), lr, tok_s, simulated ? " (virtual)" : "",
                  mfu_text(step_mfu).c_str(), middle.c_str(), eta);
      std::fflush(stdout);
    }
    if ((o_.val_every > 0 && (step_i + 1) % o_.val_every == 0) || last) {
      doing_ = "evaluating after step " + std::to_string(step_i);
      val_loss = computed(evaluate_now(x, y));
      if (rank_ == 0)
        std::printf("step %5lld | val loss %s\n", static_cast<long long>(step_i + 1), loss_text(val_loss).c_str());
      log_.log_eval(step_i + 1, val_loss);
    }
    if (save_checkpoint && ((checkpoint_every > 0 && (step_i + 1) % checkpoint_every == 0) || last)) {
      doing_ = "saving a checkpoint after step " + std::to_string(step_i);
      save_checkpoint(step_i + 1);
    }
  }
  s.val_loss_end = val_loss;
  s.steps = o_.steps - start_step;
  s.timed_steps = static_cast<int>(std::max<int64_t>(1, s.steps - 1));
  s.warm_up_timed = only_step_timed;
  s.tokens_per_s = timed_seconds > 0 ? static_cast<double>(timed_tokens) / timed_seconds : kNotMeasured;
  s.mfu = peak_.flops_per_s > 0 && timed_seconds > 0
              ? mfu(s.tokens_per_s, flops_per_token_, peak_.flops_per_s, world_)  // token-weighted
              : kNotMeasured;
  s.hfu = peak_.flops_per_s > 0 && timed_seconds > 0
              ? mfu(s.tokens_per_s, hardware_flops_per_token_, peak_.flops_per_s, world_)
              : kNotMeasured;
  s.step_ms = 1e3 * timed_seconds / s.timed_steps;
  s.data_wait_ms = timed_data_ms / s.timed_steps;
  s.host_data_wait_ms = timed_host_data_ms / s.timed_steps;
  s.simulated = simulated ? simulated_label() : "";
  s.comm_ms = timed_exposed_ms / s.timed_steps;  // NaN (not measured) when the lab measured none
  s.comm_busy_ms = timed_busy_ms / s.timed_steps;
  s.comm_modeled_ms = timed_modeled_ms / s.timed_steps;
  s.memory = Allocator::get(device_).stats();

  // A sample from rank 0 (with sample_on_every_rank, every rank runs the same forwards: ZeRO-3 gathers
  // are collective), from the same random stream on every rank.
  doing_ = "sampling";
  if (o_.sample_tokens > 0 && !timing_only && (rank_ == 0 || spec_.sample_on_every_rank)) {  // no logits to sample
    const std::string text = sample_text(model_, "\n", o_.sample_tokens, sample_rng);
    if (rank_ == 0) s.sample = text;
  }
  doing_ = "done";
  return s;
}

nlohmann::json summary_record(const Summary& s, const Peak& peak, bool comm, bool simulated) {
  nlohmann::json r = {{"final_loss", s.final_loss},
                      {"val_loss_start", s.val_loss_start},
                      {"val_loss_end", s.val_loss_end},
                      {"tokens_per_s", s.tokens_per_s},
                      {"mfu", s.mfu},
                      {"hfu", s.hfu},
                      {"peak_flops_per_s", peak.flops_per_s},
                      {"peak_source", peak.source}};
  if (s.warm_up_timed) {  // one step: its times are a cold step's (docs/log_schema.md, summary)
    r["warm_up_timed"] = true;
    r["timing_note"] = "one step: the warm-up step is the one timed; run --steps 2 or more to leave it out";
  }
  if (comm) {
    r["comm_ms"] = s.comm_ms;
    r["comm_busy_ms"] = s.comm_busy_ms;
  }
  if (simulated) {
    r["comm_modeled_ms"] = s.comm_modeled_ms;
    r["simulated"] = true;
  }
  if (!s.simulated.empty()) {  // a simulated GPU (docs/log_schema.md)
    r["simulated"] = true;
    r["clock"] = "virtual";
    r["sim_gpu_name"] = sim_gpu().display_name;  // "simulated H100 SXM", as the run record says
    r["data_wait_ms"] = s.data_wait_ms;
    r["host_data_wait_ms"] = s.host_data_wait_ms;
    if (sim_timing_only()) r["timing_only"] = true;  // its losses are null: not computed
  }
  return r;
}

void print_summary_headline(const Summary& s, const Peak& peak, int num_devices) {
  char devices[32] = "";
  if (num_devices > 0) std::snprintf(devices, sizeof(devices), "%d x ", num_devices);
  const std::string on = s.simulated.empty() ? "" : " (" + s.simulated + ")";  // simulated H100 SXM, virtual time
  char speed[48] = "tokens/s not measured (no step ran)";
  if (std::isfinite(s.tokens_per_s)) std::snprintf(speed, sizeof(speed), "%.0f tokens/s", s.tokens_per_s);
  const std::string mfu = mfu_text(s.mfu, "MFU %.1f%%");
  std::printf("\n== summary%s ==\nval loss %s -> %s | %s | %s of %s%.1f GFLOP/s (%s)", on.c_str(),
              loss_text(s.val_loss_start).c_str(), loss_text(s.val_loss_end).c_str(), speed, mfu.c_str(), devices,
              peak.flops_per_s / 1e9, peak.source.c_str());
  if (std::isfinite(s.hfu) && s.hfu != s.mfu) std::printf(" | HFU %.1f%% (with the recompute)", 100.0 * s.hfu);
  if (s.warm_up_timed)
    std::printf("\n(one step: its figures include the warm-up, allocations and cold caches; run --steps 2 or more "
                "to time the steps after it)");
}

// ---------------------------------------------------------------------------------------------
// Out of memory

std::string out_of_memory_report(const OutOfMemory& e, const OomContext& c) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const MemoryEstimate est =
      estimate_memory(c.cfg, c.world, c.zero_stage, c.policy, c.optimizer, c.prefetch, c.micro_batch, c.seq_len);
  const double cap = static_cast<double>(Allocator::get(c.device).capacity_bytes());
  const MemStats now = Allocator::get(c.device).stats();  // a failed allocation is not counted: the peaks are
                                                          // the most this rank held before it (the buffers
                                                          // freed while unwinding are gone from current_bytes)
  auto peak = [&](MemCategory k) { return now.peak_bytes[static_cast<int>(k)] / kMiB; };
  char buf[1024];
  std::string r = e.what();
  if (!r.empty() && r.back() != '\n') r += '\n';
  std::snprintf(
      buf, sizeof(buf),
      "[scalelab] %s: rank %d of %d ran out of simulated device memory while %s\n"
      "[scalelab]   cap %.1f MiB per rank (--memory-cap-mb); most in use before it: %.1f MiB (peaks: params "
      "%.1f, grads %.1f, optimizer state %.1f, activations %.1f)\n"
      "[scalelab]   estimator for this run (%s, %d rank%s, ZeRO-%d, %s, %s, B=%d, T=%d): persistent %.1f MiB, "
      "peak %.1f MiB per rank (model state %.1f + activations %.1f)\n",
      c.lab.c_str(), c.rank, c.world, c.doing.c_str(), cap / kMiB, now.total_peak_bytes / kMiB,
      peak(MemCategory::Params), peak(MemCategory::Grads), peak(MemCategory::OptimizerState),
      peak(MemCategory::Activations), c.model.c_str(), c.world, c.world == 1 ? "" : "s", c.zero_stage,
      c.policy.name().c_str(), OptimizerConfig::kind_name(c.optimizer), c.micro_batch, c.seq_len,
      est.persistent.total() / kMiB, est.total_peak_bytes() / kMiB, est.peak.total() / kMiB,
      est.activations_bytes / kMiB);
  r += buf;
  for (int stage = std::max(1, c.zero_stage); stage <= 3; ++stage) {
    const int n =
        min_devices_to_fit(c.cfg, stage, c.policy, c.optimizer, c.prefetch, c.micro_batch, c.seq_len, cap, 1024);
    if (n > 0)
      std::snprintf(buf, sizeof(buf), "[scalelab]   ZeRO-%d fits in this cap on %d rank%s (estimator)\n", stage, n,
                    n == 1 ? "" : "s");
    else std::snprintf(buf, sizeof(buf), "[scalelab]   ZeRO-%d does not fit in this cap on up to 1024 ranks\n", stage);
    r += buf;
  }
  if (static_cast<double>(est.activations_bytes) >= cap) {
    std::snprintf(buf, sizeof(buf),
                  "[scalelab]   the activations alone need %.1f MiB (B=%d, T=%d): ZeRO does not shard "
                  "them, lower --micro-batch or --seq-len\n",
                  est.activations_bytes / kMiB, c.micro_batch, c.seq_len);
    r += buf;
  }
  r += "[scalelab]   hint: more ranks or a higher --stage (or a smaller --micro-batch / --seq-len, or a higher "
       "--memory-cap-mb); build/bin/sl_memory --model " +
       c.model + " prints the table\n";
  return r;
}

}  // namespace scalelab::driver
