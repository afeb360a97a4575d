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
#include "scalelab/calibration.h"   // defines: load_or_calibrate (peak FLOP/s of this CPU)
#include "scalelab/comm.h"          // defines: Communicator, make_communicator, LinkModel
#include "scalelab/device.h"        // defines: cuda_device_count, cuda_device_name, device_synchronize
#include "scalelab/error.h"         // defines: scalelab::Error, NotImplemented
#include "scalelab/gpt2.h"          // defines: GPT2, GPTConfig
#include "scalelab/metrics.h"       // defines: RunLogger (JSONL logs)
#include "scalelab/sample.h"            // defines: sample_text
#include "scalelab/optim.h"         // defines: Optimizer, LRSchedule
#include "scalelab/rng.h"           // defines: Rng (sampling)
#include "scalelab/threads.h"       // defines: set_num_threads
#include "shard_loader.h"           // defines: scalelab::lab02::ShardLoader (lab 02's reference)
#include "train_step.h"             // defines: lab01::flops_per_token, tokens_per_second, mfu (lab 01's reference)

using namespace scalelab;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string device = "cpu";
  std::string model = "demo";
  int micro_batch = 8;      // sequences per rank per micro-step
  int global_batch = 0;     // sequences per optimizer step, all ranks together (0: micro_batch x ranks)
  int seq_len = 128;        // T: tokens per sequence
  int steps = 100;          // optimizer steps
  float lr = 2e-3f;         // peak learning rate
  float min_lr = 2e-4f;     // end of the cosine decay
  int warmup = 20;          // steps of linear warmup
  float grad_clip = 1.0f;
  float weight_decay = 0.1f;
  std::string optimizer = "adamw";
  std::string precision = "fp32";
  std::string data = "data/kjv";
  std::string log_dir = "runs";
  std::string run_id;
  uint64_t seed = 1337;
  int val_every = 50;       // steps between validation passes (0: only at start and end)
  int val_batches = 8;      // validation batches of global_batch sequences
  int sample_tokens = 200;
  int threads = 0;          // 0: cores / ranks on this node
  std::string backend = "auto";
  std::string mode = "overlap";  // naive | bucketed | overlap
  double bucket_mb = 1.0;        // MiB of fp32 gradients per bucket
  std::string link = "none";     // simulated link preset
  double link_slowdown = 1.0;    // the simulated link made this many times slower
  int timeline_steps = 3;        // steps 1..N log a `timeline` record (0: none)
  bool quiet = false;
};

// The simulated link (comm.h LinkModel): a preset, optionally `slowdown` times slower (latencies x F,
// bandwidth / F). A CPU computes roughly 10^3-10^4 times slower than the GPUs the presets belong to;
// slowing the link down too puts a CPU run in the regime a GPU cluster is in, where the all-reduce
// takes about as long as the backward pass (README "Measured").
static LinkModel make_link(const std::string& name, double slowdown) {
  LinkModel link = LinkModel::preset(name);
  SL_CHECK_HINT(slowdown > 0, "--link-slowdown is a factor > 0 (1: the preset as it is)", "--link-slowdown %g",
                slowdown);
  if (link.enabled() && slowdown != 1.0) {
    link.alpha_s *= slowdown;
    link.base_s *= slowdown;
    link.bandwidth_bytes_per_s /= slowdown;
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "/%g", slowdown);
    link.name += suffix;
  }
  return link;
}

// The denominator of MFU, per device (scalelab::device_peak, calibration.h): the datasheet figure
// for a GPU, the sgemm calibration for the CPU. The CPU calibration is measured by rank 0 first
// (several ranks calibrating at once would measure each other) and read from the cache by the others.
// Run bin/sl_calibrate --threads N beforehand to skip the measurement.
static Peak device_peak_all_ranks(Device device, const PrecisionPolicy& policy, int threads, Communicator& comm) {
  if (device == Device::CPU && comm.rank() == 0) load_or_calibrate(threads);
  comm.barrier();
  return device_peak(device, policy, threads);
}

// Rank 0's string on every rank (the run id: the random suffix differs per call). Strings travel as
// one i32 per character, padded to a fixed length.
static std::string broadcast_string(Communicator& comm, const std::string& s) {
  constexpr int kMaxChars = 128;
  Tensor buf = Tensor::zeros({kMaxChars}, DType::I32);
  for (int i = 0; i < kMaxChars && i < static_cast<int>(s.size()); ++i) buf.data<int32_t>()[i] = s[i];
  comm.broadcast(buf, /*root=*/0, "run id");
  std::string out;
  for (int i = 0; i < kMaxChars && buf.data<int32_t>()[i] != 0; ++i) out += static_cast<char>(buf.data<int32_t>()[i]);
  return out;
}

// The average of one float over all ranks (a loss).
static float mean_over_ranks(Communicator& comm, float x, const std::string& tag) {
  Tensor t = Tensor::empty({1}, DType::F32);
  t.data<float>()[0] = x;
  comm.all_reduce(t, ReduceOp::Avg, tag);
  return t.data<float>()[0];
}

// Mean loss over this rank's share of the validation batches (the loader is rewound to `start`, so
// the same windows every time), averaged over the ranks: together they cover the same windows as one
// rank evaluating all of them. Gradients are not touched.
static float evaluate(GPT2& model, Communicator& comm, lab02::ShardLoader& val, const lab02::LoaderState& start,
                      int n_batches, Tensor& x, Tensor& y) {
  val.restore(start);
  double sum = 0.0;
  for (int i = 0; i < n_batches; ++i) {
    lab02::load_batch(val.next(), x, y);
    sum += model.forward(x, &y);
  }
  return mean_over_ranks(comm, static_cast<float>(sum / n_batches), "val loss");
}

// What the event log says about one step's gradient all-reduces.
struct CommStats {
  double busy_ms = 0;           // time the transport had one in progress: sum of end - start (they run one at
                                // a time), including any wait for a slower rank to join
  double modeled_ms = 0;        // what the simulated link alone charges for them (0 without a link model)
  int64_t payload_bytes = 0;    // bytes this rank contributed
  int calls = 0;
  bool simulated = false;       // a link model decided (part of) their duration
};

static CommStats gradient_comm_stats(const std::vector<CommEvent>& events) {
  CommStats s;
  for (const CommEvent& e : events) {
    if (e.op != "all_reduce") continue;
    s.busy_ms += e.end_ms - e.start_ms;
    s.modeled_ms += e.modeled_ms;
    s.payload_bytes += e.payload_bytes;
    s.calls += 1;
    s.simulated = s.simulated || e.simulated;
  }
  return s;
}

// The compute spans of one step for its `timeline` record, stamped by the model's hooks on the
// communication clock (Communicator::now_ms()) so they line up with the step's CommEvents:
//   "data"             step start .. train_step called (loading this rank's micro-batches)
//   "forward"          first before_forward .. the first before_backward after it (the LM head and the
//                      loss run after the last unit's hook, so the next backward is the honest end)
//   "backward"         first before_backward .. last after_backward, whichever units fire them
//   "sync + optimizer" last after_backward .. train_step returned and the device is done: waiting for
//                      the last all-reduces, clipping, the optimizer update
// Gradient accumulation gives one forward and one backward span per micro-step. Hooks already
// installed (GradSync's after_backward in overlap mode) are kept and called first. On a GPU the
// forward/backward stamps are host times of asynchronous launches: only the step's end is synchronized.
class StepTimeline {
 public:
  explicit StepTimeline(GPT2& model) : model_(model), saved_(model.hooks) {
    ModelHooks& h = model.hooks;
    h.before_forward = [this, prev = saved_.before_forward](int unit) {
      if (prev) prev(unit);
      if (recording_ && phase_ != Phase::Forward) open("forward", Phase::Forward);
    };
    h.before_backward = [this, prev = saved_.before_backward](int unit) {
      if (prev) prev(unit);
      if (recording_ && phase_ != Phase::Backward) open("backward", Phase::Backward);
    };
    h.after_backward = [this, prev = saved_.after_backward](int unit) {
      if (prev) prev(unit);
      last_backward_ms_ = Communicator::now_ms();
    };
  }
  ~StepTimeline() { model_.hooks = saved_; }  // before GradSync's destructor removes its own hook
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
  GPT2& model_;
  ModelHooks saved_;
  std::vector<TimeSpan> spans_;
  bool recording_ = false;
  Phase phase_ = Phase::None;
  double last_backward_ms_ = 0;
};

static int run(const Options& o, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, link, model (identical on every rank), optimizer, data (disjoint per rank), peak
  SL_CHECK_HINT(o.device == "cpu" || o.device == "cuda", "use --device cpu or --device cuda", "unknown device '%s'",
                o.device.c_str());
  const Device device = o.device == "cuda" ? Device::CUDA : Device::CPU;
  if (device == Device::CUDA)
    SL_CHECK_HINT(cuda_device_count() > 0,
                  built_with_cuda() ? "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu"
                                    : "rebuild where nvcc is found (cmake -DSL_WITH_CUDA=ON), or use --device cpu",
                  "--device cuda: no CUDA device is available to this program");
  const int threads = set_num_threads(o.threads);  // cores / ranks on this node, unless --threads
  comm.set_link_model(make_link(o.link, o.link_slowdown));
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
  lab02::LoaderConfig vc = lc;
  vc.shuffle = false;
  vc.prefetch = false;
  lab02::ShardLoader val_data(o.data, "val", vc);
  const lab02::LoaderState val_start = val_data.state();
  // val_batches global batches: micro_steps loader batches per rank each, so every run with the same
  // global batch evaluates the same windows, however many ranks share them.
  const int val_batches_per_rank = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(o.val_batches) * micro_steps, val_data.batches_per_epoch())));
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
  StepTimeline timeline(model);  // after GradSync: chains its hook (and is destroyed first)

  const Peak peak = device_peak_all_ranks(device, policy, threads, comm);
  const double flops_tok = lab01::flops_per_token(cfg, o.seq_len);
  Rng rng(o.seed ^ 0x5eedull);

  const std::string run_id = broadcast_string(comm, rank == 0 ? (o.run_id.empty() ? make_run_id() : o.run_id) : "");
  RunLogger log("lab03", run_id, rank, o.log_dir);
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
  RunRecord run_rec;
  run_rec.config = config;
  run_rec.world_size = world;
  run_rec.track = SL_TRACK_NAME;
  run_rec.threads = threads;
  run_rec.precision = policy.name();
  run_rec.device = device == Device::CUDA ? cuda_device_name() : "cpu";
  run_rec.peak_flops_per_s = peak.flops_per_s > 0 ? peak.flops_per_s : kNotMeasured;
  run_rec.peak_source = peak.source;
  run_rec.calibration_id = peak.calibration_id;
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
  float val_loss = evaluate(model, comm, val_data, val_start, val_batches_per_rank, x, y);
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
    const CommStats cs = gradient_comm_stats(comm.events());
    const double exposed_ms = sync.last_finish_ms();  // the part of the step spent waiting for gradients
    const int64_t tokens = static_cast<int64_t>(global_batch) * o.seq_len;  // all ranks together
    const double tok_s = lab01::tokens_per_second(tokens, seconds);
    const double step_mfu =
        peak.flops_per_s > 0 ? lab01::mfu(tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/world) : kNotMeasured;
    loss = mean_over_ranks(comm, r.loss, "loss");  // outside the timed step: only for the log
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
    rec.extra = {{"comm_busy_ms", cs.busy_ms}, {"allreduce_payload_bytes", cs.payload_bytes}};
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
      val_loss = evaluate(model, comm, val_data, val_start, val_batches_per_rank, x, y);
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
  app.add_option("--device", o.device, "cpu or cuda (a build with the CUDA backend and a GPU; one GPU per rank "
                 "with --backend nccl, or ranks sharing one through --backend mpi)")->capture_default_str();
  app.add_option("--model", o.model, "preset: tiny, demo, d12, d24, d36, d48")->capture_default_str();
  app.add_option("--micro-batch", o.micro_batch, "sequences per rank per micro-step")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--global-batch", o.global_batch, "sequences per optimizer step, all ranks (0: micro-batch x ranks)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seq-len", o.seq_len, "T: tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay")->capture_default_str();
  app.add_option("--warmup", o.warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "clip the global gradient norm (0: off)")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay on matrices")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw or sgd")->capture_default_str();
  app.add_option("--precision", o.precision, "fp32 or bf16 (bf16 params, fp32 master; emulated on CPU)")->capture_default_str();
  app.add_option("--data", o.data, "directory of token shards (scripts/prepare_corpus.sh)")->capture_default_str();
  app.add_option("--log-dir", o.log_dir, "logs go to <log-dir>/lab03/<run-id>/rank<k>.jsonl")->capture_default_str();
  app.add_option("--run-id", o.run_id, "name of this run (default: time + random suffix)");
  app.add_option("--seed", o.seed, "seed of the weights (rank 0's) and the data order")->capture_default_str();
  app.add_option("--val-every", o.val_every, "steps between validation passes (0: start and end only)")->capture_default_str();
  app.add_option("--val-batches", o.val_batches, "validation batches of --global-batch sequences")
      ->capture_default_str();
  app.add_option("--sample-tokens", o.sample_tokens, "bytes of text rank 0 generates at the end")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank (0: cores / ranks on this node)")->capture_default_str();
  app.add_option("--backend", o.backend, "communicator: auto (mpi under mpirun, else local), local, mpi")
      ->capture_default_str();
  app.add_option("--mode", o.mode, "gradient all-reduce: naive (per tensor), bucketed, overlap (buckets during "
                 "backward)")->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "MiB of fp32 gradients per bucket (0: one bucket per tensor)")
      ->capture_default_str();
  app.add_option("--link", o.link, "simulated link: none, nvlink, pcie, ethernet100, infiniband")->capture_default_str();
  app.add_option("--link-slowdown", o.link_slowdown, "make the simulated link this many times slower (README "
                 "'Measured')")->capture_default_str();
  app.add_option("--timeline-steps", o.timeline_steps, "steps 1..N log a timeline record of their compute and "
                 "communication (0: none)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--quiet", o.quiet, "print only validation and the summary");
  CLI11_PARSE(app, argc, argv);

  return run_on_all_ranks(o.backend, [&](Communicator& comm) { return run(o, comm); });
}
