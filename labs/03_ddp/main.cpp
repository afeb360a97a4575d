// main.cpp — lab 03: data-parallel training of GPT-2 on N ranks; tokens/s, MFU and what the gradient
// all-reduce costs (exposed and hidden behind backward).
// The driver is shared by both tracks: it calls the functions of ddp.h, which come from your
// labs/03_ddp/ddp.cpp (bin/learner/lab03_ddp) or from the reference solutions/03_ddp/ddp.cpp
// (bin/reference/lab03_ddp). Lesson: labs/03_ddp/README.md. Log schema: docs/log_schema.md.
//
//   mpirun -np 2 build/bin/reference/lab03_ddp --data data/kjv --model demo --mode overlap --steps 100
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <algorithm>  // defines: std::max, std::min
#include <chrono>     // defines: std::chrono::steady_clock (step timing)
#include <cmath>      // defines: std::exp
#include <cstdio>     // defines: std::printf
#include <memory>     // defines: std::unique_ptr
#include <string>
#include <vector>

#include "ddp.h"                    // defines: lab03::broadcast_parameters, GradSync, train_step, ... (YOU)
#include "driver.h"                 // defines: driver::DistributedOptions, make_link, evaluate_all_ranks, ... (labs/common)
#include "scalelab/measure/calibration.h"   // defines: Peak (peak FLOP/s per device)
#include "scalelab/comm/comm.h"          // defines: Communicator, run_on_all_ranks, LinkModel
#include "scalelab/core/device.h"        // defines: cuda_device_count, cuda_device_name, device_synchronize
#include "scalelab/core/error.h"         // defines: scalelab::Error, NotImplemented
#include "scalelab/model/gpt2.h"          // defines: GPT2, GPTConfig
#include "scalelab/measure/metrics.h"       // defines: RunLogger (JSONL logs)
#include "scalelab/model/sample.h"            // defines: sample_text
#include "scalelab/model/optim.h"         // defines: Optimizer, LRSchedule
#include "scalelab/core/rng.h"           // defines: Rng (sampling)
#include "scalelab/core/threads.h"       // defines: set_num_threads
#include "shard_loader.h"           // defines: scalelab::lab02::ShardLoader (lab 02's reference)
#include "train_step.h"             // defines: lab01::flops_per_token, tokens_per_second, mfu (lab 01's reference)

using namespace scalelab;
using Clock = std::chrono::steady_clock;

// The options labs 03 and 04 share (labs/common/driver.h: --device ... --timeline-steps) and lab 03's own.
struct Options : driver::DistributedOptions {
  std::string mode = "overlap";  // naive | bucketed | overlap
  double bucket_mb = 1.0;        // MiB of fp32 gradients per bucket
};

// The compute spans of one step for its `timeline` record, stamped by the model's hooks on the
// communication clock (Communicator::now_ms()) so they line up with the step's CommEvents:
//   "data"             step start .. train_step called (loading this rank's micro-batches)
//   "forward"          first before_forward .. the first before_backward after it (the LM head and the
//                      loss run after the last unit's hook, so the next backward is the honest end)
//   "backward"         first before_backward .. last after_backward, whichever units fire them
//   "sync + optimizer" last after_backward .. train_step returned and the device is done: waiting for
//                      the last all-reduces, clipping, the optimizer update
// Gradient accumulation gives one forward and one backward span per micro-step. Its hooks are added
// after GradSync's (overlap mode), so they run after it at each point. On a GPU the forward/backward
// stamps are host times of asynchronous launches: only the step's end is synchronized.
class StepTimeline {
 public:
  explicit StepTimeline(GPT2& model) {
    hooks_.push_back(model.add_hook(HookPoint::BeforeForward, [this](const UnitHookArgs&) {
      if (recording_ && phase_ != Phase::Forward) open("forward", Phase::Forward);
    }));
    hooks_.push_back(model.add_hook(HookPoint::BeforeBackward, [this](const UnitHookArgs&) {
      if (recording_ && phase_ != Phase::Backward) open("backward", Phase::Backward);
    }));
    hooks_.push_back(model.add_hook(HookPoint::AfterBackward, [this](const UnitHookArgs&) {
      last_backward_ms_ = Communicator::now_ms();
    }));
  }
  StepTimeline(const StepTimeline&) = delete;
  StepTimeline& operator=(const StepTimeline&) = delete;

  void begin(double step_start_ms) {  // call just before train_step
    spans_ = {{"data", step_start_ms, Communicator::now_ms()}};
    recording_ = true;
    phase_ = Phase::None;
  }
  std::vector<TimeSpan> end() {  // call once the step is done (device synchronized)
    close();
    const double now = Communicator::now_ms();
    if (!spans_.empty() && spans_.back().name == "backward") spans_.push_back({"sync + optimizer", spans_.back().end_ms, now});
    recording_ = false;
    return std::move(spans_);
  }

 private:
  enum class Phase { None, Forward, Backward };
  void close() {  // a backward ends at its last after_backward hook, a forward when the next span opens
    if (phase_ == Phase::None) return;
    spans_.back().end_ms = phase_ == Phase::Backward ? last_backward_ms_ : Communicator::now_ms();
    phase_ = Phase::None;
  }
  void open(const char* name, Phase phase) {
    close();
    const double now = Communicator::now_ms();
    spans_.push_back({name, now, now});
    last_backward_ms_ = now;
    phase_ = phase;
  }
  std::vector<HookHandle> hooks_;
  std::vector<TimeSpan> spans_;
  bool recording_ = false;
  Phase phase_ = Phase::None;
  double last_backward_ms_ = 0;
};

static int run(const Options& o, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, link, model (identical on every rank), optimizer, data (disjoint per rank), peak
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);  // cores / ranks on this node, unless --threads
  comm.set_link_model(driver::make_link(o.link, o.link_slowdown));
  const lab03::SyncMode mode = lab03::sync_mode_from_name(o.mode);
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * world;
  const int micro_steps = lab03::micro_steps_per_step(global_batch, o.micro_batch, world);  // YOUR TODO lab03-7

  GPTConfig cfg = GPTConfig::preset(o.model);
  lab02::LoaderConfig lc;
  lc.B = o.micro_batch;
  lc.T = o.seq_len;
  lc.seed = o.seed;
  lc.dp_rank = rank;  // rank r takes every world-th window of each global batch: disjoint across ranks
  lc.dp_size = world;
  lab02::ShardLoader train_data(o.data, "train", lc);
  // val_batches global batches: micro_steps loader batches per rank each, so every run with the same
  // global batch evaluates the same windows, however many ranks share them.
  driver::ValidationSplit val(o.data, lc, static_cast<int64_t>(o.val_batches) * micro_steps);
  cfg.vocab_size = train_data.vocab_size();  // the tokenizer decides V (256 for bytes)
  SL_CHECK_HINT(o.seq_len <= cfg.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "--seq-len %d > max_seq_len %d of model '%s'", o.seq_len, cfg.max_seq_len, o.model.c_str());

  const PrecisionPolicy policy = PrecisionPolicy::from_name(o.precision);
  // A different seed on every rank, on purpose: broadcast_parameters must make the replicas identical
  // (rank 0's weights, the same as a 1-rank run with this --seed).
  GPT2 model(cfg, policy, device, o.seed + static_cast<uint64_t>(rank));
  lab03::broadcast_parameters(model, comm);  // YOUR TODO lab03-1; before the optimizer copies the weights
  OptimizerConfig oc;
  oc.kind = OptimizerConfig::kind_from_name(o.optimizer);
  oc.weight_decay = o.weight_decay;
  Optimizer optimizer(model, oc);
  LRSchedule schedule{o.lr, o.min_lr, o.warmup, o.steps};
  lab03::GradSync sync(model, comm, mode, o.bucket_mb);  // buckets (YOUR TODO lab03-3) and, for overlap, the hook
  StepTimeline timeline(model);  // after GradSync: its hooks run after GradSync's

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, comm);
  const double flops_tok = lab01::flops_per_token(cfg, o.seq_len);
  Rng rng(o.seed ^ 0x5eedull);

  RunLogger log("lab03", driver::run_id_all_ranks(comm, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);  // memory_*_bytes of the step records: this rank's device
  const LinkModel& link = comm.link_model();
  nlohmann::json config = {{"model", o.model},           {"n_params", model.num_params()},
                           {"micro_batch", o.micro_batch}, {"global_batch", global_batch},
                           {"micro_steps", micro_steps}, {"T", o.seq_len},
                           {"steps", o.steps},           {"lr", o.lr},
                           {"optimizer", o.optimizer},   {"precision", policy.name()},
                           {"seed", o.seed},             {"flops_per_token", flops_tok},
                           {"data", o.data},             {"device", o.device},
                           {"backend", comm.backend()},  {"mode", o.mode},
                           {"bucket_mb", o.bucket_mb},   {"num_buckets", sync.buckets().size()},
                           {"link", link.name},          {"link_slowdown", o.link_slowdown},
                           {"timeline_steps", o.timeline_steps}};
  RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, world, threads, policy, device, peak);
  if (link.enabled()) run_rec.extra["simulated"] = true;
  log.log_run(run_rec);

  if (rank == 0) {
    std::printf("lab03 | %s | %lld params | %d ranks (%s) x %d threads | mode %s", cfg.str().c_str(),
                static_cast<long long>(model.num_params()), world, comm.backend().c_str(), threads, o.mode.c_str());
    if (mode != lab03::SyncMode::Naive) std::printf(", %zu buckets of %g MiB", sync.buckets().size(), o.bucket_mb);
    std::printf(" | link %s%s\n", link.name.c_str(), link.enabled() ? " (simulated)" : "");
    std::printf("global batch %d = micro-batch %d x %d ranks x %d micro-steps | T=%d | %s | peak %.1f GFLOP/s per "
                "rank (%s)\n", global_batch, o.micro_batch, world, micro_steps, o.seq_len, policy.name().c_str(),
                peak.flops_per_s / 1e9, peak.source.c_str());
    std::printf("logs: %s (one file per rank)\n", log.path().c_str());
  }

  // ------------------------------------------------------------------------------------------------
  // Training
  std::vector<lab03::MicroBatch> micro(micro_steps);
  for (lab03::MicroBatch& mb : micro) {
    mb.inputs = Tensor::empty({o.micro_batch, o.seq_len}, DType::I32, device, MemCategory::Data);   // (B, T)
    mb.targets = Tensor::empty({o.micro_batch, o.seq_len}, DType::I32, device, MemCategory::Data);  // (B, T)
  }
  Tensor& x = micro[0].inputs;  // validation reuses the first micro-batch's tensors
  Tensor& y = micro[0].targets;
  float val_loss = driver::evaluate_all_ranks(model, comm, val, x, y);
  const float val_loss_start = val_loss;
  if (rank == 0) std::printf("step %5d | val loss %.4f\n", 0, val_loss);
  log.log_eval(0, val_loss);

  double timed_seconds = 0.0, timed_exposed_ms = 0.0, timed_busy_ms = 0.0, timed_modeled_ms = 0.0;  // steps 2..
  int64_t timed_tokens = 0;
  float loss = 0.0f;
  const auto t_run = Clock::now();
  for (int step = 0; step < o.steps; ++step) {
    const auto t0 = Clock::now();
    const double t0_ms = Communicator::now_ms();  // the timeline's clock
    double data_wait_ms = 0.0;
    for (lab03::MicroBatch& mb : micro) {
      const lab02::Batch batch = train_data.next();  // this rank's share of the global batch
      lab02::load_batch(batch, mb.inputs, mb.targets);
      data_wait_ms += batch.wait_ms;
    }
    const float lr = schedule.at(step);
    comm.clear_events();
    const bool log_timeline = step >= 1 && step <= o.timeline_steps;  // step 0 is warm-up
    if (log_timeline) timeline.begin(t0_ms);

    const lab03::StepResult r = lab03::train_step(model, optimizer, sync, micro, lr, o.grad_clip);  // YOUR step
    device_synchronize(device);  // GPU work is asynchronous: the step ends when the device is done

    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (log_timeline) log.log_timeline(step, comm.events(), timeline.end());
    const driver::CommStats cs = driver::comm_stats(comm.events(), Communicator::now_ms(), "all_reduce");
    const double exposed_ms = sync.last_finish_ms();  // the part of the step spent waiting for gradients
    const int64_t tokens = static_cast<int64_t>(global_batch) * o.seq_len;  // all ranks together
    const double tok_s = lab01::tokens_per_second(tokens, seconds);
    const double step_mfu =
        peak.flops_per_s > 0 ? lab01::mfu(tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/world) : kNotMeasured;
    loss = driver::mean_over_ranks(comm, r.loss, "loss");  // outside the timed step: only for the log
    if (step > 0) {  // the first step allocates activations and warms caches: not timed
      timed_seconds += seconds;
      timed_tokens += tokens;
      timed_exposed_ms += exposed_ms;
      timed_busy_ms += cs.busy_ms;
      timed_modeled_ms += cs.modeled_ms;
    }

    StepRecord rec;
    rec.step = step;
    rec.loss = loss;
    rec.lr = lr;
    rec.tokens = tokens;
    rec.step_ms = seconds * 1e3;
    rec.data_wait_ms = data_wait_ms;
    rec.comm_ms = exposed_ms;
    rec.tokens_per_s = tok_s;
    rec.mfu = step_mfu;
    rec.grad_norm = r.grad_norm;
    rec.extra = {{"comm_busy_ms", cs.busy_ms}, {"allreduce_payload_bytes", cs.all_reduce_bytes}};
    if (cs.simulated) {
      rec.extra["comm_modeled_ms"] = cs.modeled_ms;
      rec.extra["simulated"] = true;
    }
    log.log_step(rec);

    const bool last = step + 1 == o.steps;
    if (rank == 0 && !o.quiet && (step % 10 == 0 || last)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_run).count();
      const double eta = elapsed / (step + 1) * (o.steps - step - 1);
      std::printf("step %5d | loss %.4f | lr %.2e | %7.0f tok/s | MFU %5.1f%% | all-reduce %6.1f ms exposed of "
                  "%6.1f busy | ETA %.0f s\n", step, loss, lr, tok_s, 100.0 * step_mfu, exposed_ms, cs.busy_ms, eta);
      std::fflush(stdout);
    }
    if ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last) {
      val_loss = driver::evaluate_all_ranks(model, comm, val, x, y);
      if (rank == 0) std::printf("step %5d | val loss %.4f\n", step + 1, val_loss);
      log.log_eval(step + 1, val_loss);
    }
  }

  // ------------------------------------------------------------------------------------------------
  // Summary (every rank logs its own; rank 0 prints) and a sample from rank 0
  const int timed_steps = std::max(1, o.steps - 1);
  const double mean_tok_s = timed_seconds > 0 ? static_cast<double>(timed_tokens) / timed_seconds : 0.0;
  const double mean_mfu = peak.flops_per_s > 0 && mean_tok_s > 0
                              ? lab01::mfu(mean_tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/world)
                              : kNotMeasured;
  const double exposed = timed_exposed_ms / timed_steps, busy = timed_busy_ms / timed_steps;
  const double modeled = timed_modeled_ms / timed_steps;
  nlohmann::json summary = {{"final_loss", loss},         {"val_loss_start", val_loss_start},
                            {"val_loss_end", val_loss},   {"tokens_per_s", mean_tok_s},
                            {"mfu", mean_mfu},            {"peak_flops_per_s", peak.flops_per_s},
                            {"peak_source", peak.source}, {"comm_ms", exposed},
                            {"comm_busy_ms", busy}};
  if (link.enabled()) {
    summary["comm_modeled_ms"] = modeled;
    summary["simulated"] = true;
  }
  const std::string sample = rank == 0 && o.sample_tokens > 0 ? sample_text(model, "\n", o.sample_tokens, rng) : "";
  if (rank == 0) summary["sample"] = sample;  // printable ASCII (sample_text)
  log.log_summary(summary);
  if (rank == 0) {
    std::printf("\n== summary ==\nval loss %.4f -> %.4f | %.0f tokens/s | MFU %.1f%% of %d x %.1f GFLOP/s (%s)\n"
                "gradient all-reduce per step: the step waited %.1f ms for it (exposed); the transport was busy "
                "%.1f ms", val_loss_start, val_loss, mean_tok_s, 100.0 * mean_mfu, world, peak.flops_per_s / 1e9,
                peak.source.c_str(), exposed, busy);
    if (link.enabled()) std::printf(", of which the simulated link charged %.1f ms", modeled);
    std::printf("\n");
    if (!sample.empty()) std::printf("\n== sample ==\n%s\n", sample.c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 03: data-parallel GPT-2 on N ranks (mpirun -np N); reports loss, tokens/s, MFU, communication"};
  Options o;
  driver::add_distributed_options(app, o, "lab03");
  app.get_option("--device")->description("cpu or cuda (a build with the CUDA backend and a GPU; one GPU per rank "
                                          "with --backend nccl, or ranks sharing one through --backend mpi)");
  app.get_option("--seed")->description("seed of the weights (rank 0's) and the data order");
  app.add_option("--mode", o.mode, "gradient all-reduce: naive (per tensor), bucketed, overlap (buckets during "
                 "backward)")->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "MiB of fp32 gradients per bucket (0: one bucket per tensor)")
      ->capture_default_str();
  driver::add_link_options(app, o);
  app.get_option("--link-slowdown")->description("make the simulated link this many times slower (README "
                                                 "'Measured')");
  app.get_option("--timeline-steps")->description("steps 1..N log a timeline record of their compute and "
                                                  "communication (0: none)");
  app.add_flag("--quiet", o.quiet, "print only validation and the summary");
  CLI11_PARSE(app, argc, argv);

  return run_on_all_ranks(o.backend, [&](Communicator& comm) { return run(o, comm); });
}
