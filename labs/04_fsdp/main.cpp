// main.cpp — lab 04: GPT-2 trained with ZeRO-1/2/3 (FSDP) on N ranks; tokens/s, MFU, memory per rank
// (measured next to the estimator's prediction) and the communication the step waited for.
// The driver is shared by both tracks: it calls the functions of fsdp.h, which come from your
// labs/04_fsdp/fsdp.cpp (bin/learner/lab04_fsdp) or from the reference solutions/04_fsdp/fsdp.cpp
// (bin/reference/lab04_fsdp). Lesson: labs/04_fsdp/README.md. Log schema: docs/log_schema.md.
//
//   mpirun -np 4 build/bin/reference/lab04_fsdp --model demo --stage 3 --steps 50
//   mpirun -np 4 build/bin/reference/lab04_fsdp --model d12 --estimate      # the memory table, no training
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <algorithm>    // defines: std::max, std::min
#include <chrono>       // defines: std::chrono::steady_clock (step timing)
#include <cstdio>       // defines: std::printf, std::snprintf
#include <memory>       // defines: std::unique_ptr
#include <string>
#include <thread>       // defines: std::this_thread::sleep_for (--loader-delay-ms, --slow-ms)
#include <type_traits>  // defines: std::void_t (does CommEvent record the caller's wait?)
#include <utility>      // defines: std::declval, std::move
#include <vector>

#include "driver.h"                        // defines: driver::DistributedOptions, make_link, evaluate_all_ranks, ... (labs/common)
#include "fsdp.h"                          // defines: lab04::FSDP, train_step, ZeroStage, ... (YOU)
#include "scalelab/core/allocator.h"            // defines: Allocator (the --memory-cap-mb cap, memory per category)
#include "scalelab/measure/calibration.h"          // defines: Peak (peak FLOP/s per device)
#include "scalelab/comm/comm.h"                 // defines: Communicator, CommEvent, LinkModel, run_on_all_ranks
#include "scalelab/core/device.h"               // defines: cuda_device_count, cuda_device_name, device_synchronize
#include "scalelab/core/error.h"                // defines: scalelab::Error, OutOfMemory, SL_CHECK_HINT
#include "scalelab/model/gpt2.h"                 // defines: GPT2, GPTConfig, add_hook
#include "scalelab/measure/memory_estimator.h"     // defines: estimate_memory, format_memory_table, min_devices_to_fit
#include "scalelab/measure/metrics.h"              // defines: RunLogger, TimeSpan (JSONL logs)
#include "scalelab/model/optim.h"                // defines: OptimizerConfig, LRSchedule
#include "scalelab/core/rng.h"                  // defines: Rng (sampling)
#include "scalelab/model/sample.h"               // defines: sample_text
#include "scalelab/core/threads.h"              // defines: set_num_threads
#include "shard_loader.h"                  // defines: scalelab::lab02::ShardLoader (lab 02's reference)
#include "train_step.h"                    // defines: lab01::flops_per_token, tokens_per_second, mfu

using namespace scalelab;
using Clock = std::chrono::steady_clock;

// The options labs 03 and 04 share (labs/common/driver.h: --device ... --timeline-steps) and lab 04's own.
struct Options : driver::DistributedOptions {
  // FSDP
  int stage = 3;                 // ZeRO stage 1, 2 or 3
  int prefetch = 1;              // ZeRO-3 all-gathers in flight beyond the unit in use
  std::string overlap = "on";    // on | off (FsdpOptions::overlap)
  double memory_cap_mb = 0;      // MiB of simulated device memory per rank (0: no cap)
  bool estimate = false;         // print the estimator's table and exit
  // The scaling lab's knobs (README "Why not 2x?")
  double loader_delay_ms = 0;    // ms slept in every batch fetch of this rank (counted as data wait)
  int slow_rank = -1;            // this rank sleeps slow_ms per micro-step inside its compute
  double slow_ms = 0;            // ms
  int loader_alone_batches = 20; // batches timed with the loader alone, before training (0: skip)
};

constexpr double kMiB = 1024.0 * 1024.0;  // bytes

// m = G / (b x N) micro-steps per optimizer step, or an error with the nearest valid global batch.
static int micro_steps_per_step(int global_batch, int micro_batch, int world) {
  const int per_step = micro_batch * world;
  SL_CHECK_HINT(global_batch % per_step == 0 && global_batch >= per_step,
                "--global-batch must be a multiple of --micro-batch x ranks, e.g. " + std::to_string(per_step) +
                    " or " + std::to_string(per_step * std::max(1, global_batch / per_step + 1)),
                "--global-batch %d, --micro-batch %d, %d ranks", global_batch, micro_batch, world);
  return global_batch / per_step;
}

// One batch for this rank, with the --loader-delay-ms sleep inside: the whole fetch is the data wait.
static double fetch_batch(lab02::ShardLoader& loader, Tensor& x, Tensor& y, double delay_ms) {
  const auto t0 = Clock::now();
  const lab02::Batch batch = loader.next();
  if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
  lab02::load_batch(batch, x, y);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The loader alone (cause 1 of "Why not 2x?"): a fresh loader of this rank with the training config and
// --loader-delay-ms, no model, every rank at once as in training. Tokens per second of THIS rank.
static double time_loader_alone(const Options& o, const lab02::LoaderConfig& lc, Communicator& comm) {
  lab02::ShardLoader loader(o.data, "train", lc);
  Tensor x = Tensor::empty({o.micro_batch, o.seq_len}, DType::I32, Device::CPU, MemCategory::Data);  // (B, T)
  Tensor y = Tensor::empty({o.micro_batch, o.seq_len}, DType::I32, Device::CPU, MemCategory::Data);  // (B, T)
  fetch_batch(loader, x, y, 0.0);  // warm-up: the first batch also starts the prefetch thread
  comm.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < o.loader_alone_batches; ++i) fetch_batch(loader, x, y, o.loader_delay_ms);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(o.loader_alone_batches) * o.micro_batch * o.seq_len / seconds;
}

// ------------------------------------------------------------------------------------------------
// Exposed communication: how long the step WAITED for collectives (not how long they were in flight).
// If the communicator records the caller's wait per event (a CommEvent::wait_ms field), that is used.
// This communicator does not (yet), so the driver measures it (README "Reading the numbers"):
//   - time inside FSDP's model hooks (use_params waits for a gather, after_backward finishes the
//     previous unit's reduce-scatter),
//   - the gap after each backward's last hook until the next micro-step starts or the clipping's
//     all-reduce is issued: finish_backward() (ZeRO-2/3) or reduce_scatter_all() (ZeRO-1),
//   - the blocking collectives after backward: the norm's all-reduce, the optimizer's all-gathers of
//     the units kept gathered (end - issue of their events).
// It includes the bookkeeping next to the waits (zeroing a unit's full gradient, copying a shard
// into the gather buffer, adding the reduced shard, the 1/m scaling and the norm's sum of squares):
// a slight overestimate, under 1 ms per step for the demo model.
template <class E, class = void>
struct HasWaitMs : std::false_type {};
template <class E>
struct HasWaitMs<E, std::void_t<decltype(std::declval<E>().wait_ms)>> : std::true_type {};
constexpr bool kEventsRecordWait = HasWaitMs<CommEvent>::value;

template <class E>
static double event_wait_ms(const E& e) {
  if constexpr (HasWaitMs<E>::value) return static_cast<double>(e.wait_ms);
  else return 0.0;
}

struct StepComm {
  double exposed_ms = 0;          // the step waited this long (method above)
  double hooks_ms = 0;            // the hook-timer measurement (the same as exposed_ms without wait_ms)
  driver::CommStats totals;       // the event log's sums: busy_ms, modeled_ms, payload bytes per op
};

// Times the hooks FSDP added (a hook of its own before theirs at each point, HookOrder::First, and one
// after): the --slow-rank sleep, the time inside FSDP's hooks (exposed communication), and the compute
// spans of a `timeline` record:
//   "data"               step start .. train_step called
//   "forward"/"backward" the passes, split where a hook waited >= kWaitSpanMs ("comm wait" between)
//   "comm wait"          a hook that long, and the gap after a backward (finish_backward / reduce_scatter_all)
//   "clip + optimizer"   from the end of that gap to the end of the step (the norm's all-reduce, the
//                        update, the all-gathers of kept units; those show among the events)
// Hooks run in evaluation and sampling too: only calls between begin() and end() are measured.
class StepProbe {
 public:
  StepProbe(GPT2& model, double slow_ms) : slow_ms_(slow_ms) {
    for (const HookPoint p : {HookPoint::BeforeForward, HookPoint::AfterForward, HookPoint::BeforeBackward,
                              HookPoint::AfterBackward}) {
      const Phase phase = p == HookPoint::BeforeForward || p == HookPoint::AfterForward ? Phase::Forward
                                                                                         : Phase::Backward;
      hooks_.push_back(model.add_hook(p, [this, p, phase](const UnitHookArgs& a) {
        if (recording_ && p == HookPoint::BeforeForward && a.unit == 0 && slow_ms_ > 0)
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow_ms_));  // --slow-rank:
        enter(phase);                                       // compute that takes longer, once per micro-step
      }, HookOrder::First));
      // after_backward(0) is the last hook of a backward (gpt2.h)
      hooks_.push_back(model.add_hook(p, [this, p, phase](const UnitHookArgs& a) {
        leave(phase, p == HookPoint::AfterBackward && a.unit == 0);
      }));
    }
  }
  StepProbe(const StepProbe&) = delete;
  StepProbe& operator=(const StepProbe&) = delete;

  void begin(double step_start_ms, double data_end_ms) {
    spans_ = {{"data", step_start_ms, data_end_ms}};
    recording_ = true;
    phase_ = Phase::None;
    hook_ms_ = gap_ms_ = 0;
    gap_start_ms_ = -1;
  }

  // After train_step returned (device synchronized): this step's communication and its spans.
  StepComm end(const std::vector<CommEvent>& events, std::vector<TimeSpan>* spans) {
    const double now = Communicator::now_ms();
    recording_ = false;
    StepComm c;
    c.totals = driver::comm_stats(events, now);
    double blocking_ms = 0, waited_ms = 0, gap_end_ms = now;
    const double after_backward_ms = last_backward_end_ms_;
    bool gap_closed = gap_start_ms_ < 0;
    for (const CommEvent& e : events) {
      const double end_ms = e.end_ms > 0 ? e.end_ms : now;
      waited_ms += event_wait_ms(e);
      if (!e.async && e.issue_ms >= after_backward_ms) {  // blocking, after the last backward
        blocking_ms += end_ms - e.issue_ms;
        if (!gap_closed) {  // the first one ends the finish_backward gap
          gap_ms_ += std::max(0.0, e.issue_ms - gap_start_ms_);
          gap_end_ms = e.issue_ms;
          gap_closed = true;
        }
      }
    }
    if (!gap_closed) {  // no blocking call after the last backward (a learner's variant): up to the end
      gap_ms_ += now - gap_start_ms_;
      gap_end_ms = now;
    }
    c.hooks_ms = hook_ms_ + gap_ms_ + blocking_ms;
    c.exposed_ms = kEventsRecordWait ? waited_ms : c.hooks_ms;
    if (spans) {
      if (phase_ != Phase::None) close_span(after_backward_ms);
      if (gap_start_ms_ >= 0) spans_.push_back({"comm wait", gap_start_ms_, gap_end_ms});
      spans_.push_back({"clip + optimizer", gap_end_ms, now});
      *spans = std::move(spans_);
    }
    spans_.clear();
    return c;
  }

 private:
  enum class Phase { None, Forward, Backward };
  static constexpr double kWaitSpanMs = 0.2;  // ms: shorter hooks stay inside their compute span

  // Before FSDP's hook at a point: the previous backward's gap ends here, a pass begins at its first hook.
  void enter(Phase phase) {
    if (!recording_) return;
    const double t0 = Communicator::now_ms();
    enter_ms_ = t0;
    if (gap_start_ms_ >= 0) {  // the previous backward's gap (finish_backward) ends at this micro-step
      gap_ms_ += t0 - gap_start_ms_;
      spans_.push_back({"comm wait", gap_start_ms_, t0});
      gap_start_ms_ = -1;
    }
    if (phase_ != phase) {  // a pass begins at its first hook; the previous one ends there
      if (phase_ != Phase::None) close_span(t0);
      spans_.push_back({phase == Phase::Forward ? "forward" : "backward", t0, t0});
      phase_ = phase;
    }
  }
  // After FSDP's hook: the time inside it, a "comm wait" span when that was long.
  void leave(Phase phase, bool ends_backward) {
    if (!recording_) return;
    const double t0 = enter_ms_, t1 = Communicator::now_ms();
    hook_ms_ += t1 - t0;
    if (t1 - t0 >= kWaitSpanMs) {  // split the pass: compute, then the wait, then compute again
      close_span(t0);
      spans_.push_back({"comm wait", t0, t1});
      spans_.push_back({phase == Phase::Forward ? "forward" : "backward", t1, t1});
    }
    if (ends_backward) {
      close_span(t1);
      phase_ = Phase::None;
      gap_start_ms_ = t1;
      last_backward_end_ms_ = t1;
    }
  }
  void close_span(double t) {  // an empty compute span (two waits in a row) is dropped
    spans_.back().end_ms = t;
    if (spans_.back().end_ms <= spans_.back().start_ms && spans_.back().name != std::string("data")) spans_.pop_back();
  }

  std::vector<HookHandle> hooks_;
  double slow_ms_ = 0;
  bool recording_ = false;
  Phase phase_ = Phase::None;
  std::vector<TimeSpan> spans_;
  double hook_ms_ = 0, gap_ms_ = 0;  // ms
  double gap_start_ms_ = -1, last_backward_end_ms_ = 0;
  double enter_ms_ = 0;  // when the hook now running at a point was entered
};

// ------------------------------------------------------------------------------------------------
// The estimator's view of this run (common/include/scalelab/measure/memory_estimator.h, docs/memory.md)
static MemoryEstimate estimate_for(const Options& o, const GPTConfig& cfg, int world, const PrecisionPolicy& policy,
                                   int stage) {
  const int prefetch = o.overlap == "on" ? o.prefetch : 0;  // FsdpOptions::overlap off: no prefetch
  return estimate_memory(cfg, world, stage, policy, OptimizerConfig::kind_from_name(o.optimizer), prefetch,
                         o.micro_batch, o.seq_len);
}

// The report an out-of-memory ends the job with, on the rank that ran out.
static std::string oom_report(const OutOfMemory& e, const Options& o, const GPTConfig& cfg, int rank, int world,
                              const PrecisionPolicy& policy, Device device, const std::string& doing) {
  const MemoryEstimate est = estimate_for(o, cfg, world, policy, o.stage);
  const double cap = static_cast<double>(Allocator::get(device).capacity_bytes());
  const MemStats now = Allocator::get(device).stats();  // a failed allocation is not counted: the peaks are
                                                        // the most this rank held before it (the buffers
                                                        // freed while unwinding are gone from current_bytes)
  const OptimizerConfig::Kind kind = OptimizerConfig::kind_from_name(o.optimizer);
  const int prefetch = o.overlap == "on" ? o.prefetch : 0;
  char buf[1024];
  std::string r = e.what();
  if (!r.empty() && r.back() != '\n') r += '\n';
  std::snprintf(buf, sizeof(buf),
                "[scalelab] lab04: rank %d of %d ran out of simulated device memory while %s\n"
                "[scalelab]   cap %.1f MiB per rank (--memory-cap-mb); most in use before it: %.1f MiB (peaks: params "
                "%.1f, grads %.1f, optimizer state %.1f, activations %.1f)\n"
                "[scalelab]   estimator for this run (%s, %d rank%s, ZeRO-%d, %s, %s, B=%d, T=%d): persistent %.1f MiB, "
                "peak %.1f MiB per rank (model state %.1f + activations %.1f)\n",
                rank, world, doing.c_str(), cap / kMiB, now.total_peak_bytes / kMiB,
                now.peak_bytes[static_cast<int>(MemCategory::Params)] / kMiB,
                now.peak_bytes[static_cast<int>(MemCategory::Grads)] / kMiB,
                now.peak_bytes[static_cast<int>(MemCategory::OptimizerState)] / kMiB,
                now.peak_bytes[static_cast<int>(MemCategory::Activations)] / kMiB, o.model.c_str(), world,
                world == 1 ? "" : "s", o.stage, policy.name().c_str(), o.optimizer.c_str(), o.micro_batch, o.seq_len,
                est.persistent.total() / kMiB, est.total_peak_bytes() / kMiB, est.peak.total() / kMiB,
                est.activations_bytes / kMiB);
  r += buf;
  for (int stage = o.stage; stage <= 3; ++stage) {
    const int n = min_devices_to_fit(cfg, stage, policy, kind, prefetch, o.micro_batch, o.seq_len, cap, 1024);
    if (n > 0) std::snprintf(buf, sizeof(buf), "[scalelab]   ZeRO-%d fits in this cap on %d rank%s (estimator)\n",
                             stage, n, n == 1 ? "" : "s");
    else std::snprintf(buf, sizeof(buf), "[scalelab]   ZeRO-%d does not fit in this cap on up to 1024 ranks\n", stage);
    r += buf;
  }
  if (static_cast<double>(est.activations_bytes) >= cap) {
    std::snprintf(buf, sizeof(buf), "[scalelab]   the activations alone need %.1f MiB (B=%d, T=%d): ZeRO does not shard "
                  "them, lower --micro-batch or --seq-len\n", est.activations_bytes / kMiB, o.micro_batch, o.seq_len);
    r += buf;
  }
  r += "[scalelab]   hint: more ranks or a higher --stage (or a smaller --micro-batch / --seq-len, or a higher "
       "--memory-cap-mb); build/bin/sl_memory --model " + o.model + " prints the table\n";
  return r;
}

static int run(const Options& o, Communicator& comm) {
  const int rank = comm.rank(), world = comm.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: threads, link, data (disjoint per rank), the memory cap, the estimate
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  comm.set_link_model(driver::make_link(o.link, o.link_slowdown));
  const lab04::ZeroStage stage = lab04::zero_stage_from_int(o.stage);
  SL_CHECK_HINT(o.overlap == "on" || o.overlap == "off", "use --overlap on or --overlap off", "--overlap '%s'",
                o.overlap.c_str());
  SL_CHECK_HINT(o.slow_rank < world, "--slow-rank is a rank 0 .. ranks-1 (or -1: none)", "--slow-rank %d of %d ranks",
                o.slow_rank, world);
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * world;
  const int micro_steps = micro_steps_per_step(global_batch, o.micro_batch, world);

  GPTConfig cfg = GPTConfig::preset(o.model);
  lab02::LoaderConfig lc;
  lc.B = o.micro_batch;
  lc.T = o.seq_len;
  lc.seed = o.seed;
  lc.dp_rank = rank;  // rank r takes every world-th window of each global batch
  lc.dp_size = world;
  lab02::ShardLoader train_data(o.data, "train", lc);
  cfg.vocab_size = train_data.vocab_size();  // the tokenizer decides V (256 for bytes)
  SL_CHECK_HINT(o.seq_len <= cfg.max_seq_len, "use --seq-len <= the model's max_seq_len",
                "--seq-len %d > max_seq_len %d of model '%s'", o.seq_len, cfg.max_seq_len, o.model.c_str());
  const PrecisionPolicy policy = PrecisionPolicy::from_name(o.precision);
  const OptimizerConfig::Kind opt_kind = OptimizerConfig::kind_from_name(o.optimizer);
  const int prefetch = o.overlap == "on" ? o.prefetch : 0;
  const MemoryEstimate est = estimate_for(o, cfg, world, policy, o.stage);

  if (o.estimate) {  // the table only: this world size, DDP (stage 0) for comparison, and stages 1-3
    if (rank == 0) {
      std::printf("lab04 --estimate | %s | %lld params | %d rank%s | %s | %s | prefetch %d | B=%d T=%d\n",
                  cfg.str().c_str(), static_cast<long long>(gpt2_num_params(cfg)), world, world == 1 ? "" : "s",
                  policy.name().c_str(), o.optimizer.c_str(), prefetch, o.micro_batch, o.seq_len);
      std::printf("%s", format_memory_table(cfg, {world}, {0, 1, 2, 3}, policy, opt_kind, prefetch, o.micro_batch,
                                            o.seq_len).c_str());
      if (o.memory_cap_mb > 0) {
        const double cap = o.memory_cap_mb * kMiB;
        for (int s = 1; s <= 3; ++s) {
          const int64_t peak = estimate_for(o, cfg, world, policy, s).total_peak_bytes();
          std::printf("ZeRO-%d on %d rank%s: peak %.1f MiB %s the cap of %.1f MiB\n", s, world, world == 1 ? "" : "s",
                      peak / kMiB, peak <= cap ? "fits in" : "EXCEEDS", o.memory_cap_mb);
        }
      }
    }
    return 0;
  }

  driver::ValidationSplit val(o.data, lc, static_cast<int64_t>(o.val_batches) * micro_steps);  // as lab 03
  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, comm);  // before the cap: calibration allocates
  const double flops_tok = lab01::flops_per_token(cfg, o.seq_len);

  const double loader_alone_tok_s =
      o.loader_alone_batches > 0 ? time_loader_alone(o, lc, comm) : kNotMeasured;  // tokens/s of this rank

  RunLogger log("lab04", driver::run_id_all_ranks(comm, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);  // memory_*_bytes of the step records: this rank's device
  const LinkModel& link = comm.link_model();

  // The simulated device memory of this rank: from here on an allocation beyond it throws OutOfMemory.
  const int64_t cap_bytes = static_cast<int64_t>(o.memory_cap_mb * kMiB);
  if (cap_bytes > 0) Allocator::get(device).set_capacity_bytes(cap_bytes);

  // ------------------------------------------------------------------------------------------------
  // The sharded model. An out-of-memory anywhere below (building the shards, the first forward's
  // activations, a gather) ends the job with a report on the rank that ran out. `fsdp` lives outside
  // the try so that on an error it is leaked, not destroyed: its destructor waits for collectives in
  // flight, which peers that are not failing might never finish (a hang instead of an error).
  std::unique_ptr<lab04::FSDP> fsdp;
  std::string doing = "building the sharded model (FSDP constructor)";
  try {
    OptimizerConfig oc;
    oc.kind = opt_kind;
    oc.weight_decay = o.weight_decay;
    lab04::FsdpOptions fo;
    fo.stage = stage;
    fo.prefetch = o.prefetch;
    fo.overlap = o.overlap == "on";
    fo.optimizer = oc;
    fsdp = std::make_unique<lab04::FSDP>(cfg, policy, device, o.seed, comm, fo);  // YOUR TODO lab04-1 inside
    GPT2& model = fsdp->model();
    StepProbe probe(model, rank == o.slow_rank ? o.slow_ms : 0.0);  // times the hooks FSDP added
    LRSchedule schedule{o.lr, o.min_lr, o.warmup, o.steps};
    Rng rng(o.seed ^ 0x5eedull);  // the same on every rank: sampling is collective in ZeRO-3

    nlohmann::json config = {
        {"model", o.model},
        {"n_params", model.num_params()},
        {"stage", o.stage},
        {"prefetch", o.prefetch},
        {"overlap", o.overlap},
        {"precision", policy.name()},
        {"micro_batch", o.micro_batch},
        {"global_batch", global_batch},
        {"micro_steps", micro_steps},
        {"world_size", world},
        {"T", o.seq_len},
        {"steps", o.steps},
        {"lr", o.lr},
        {"optimizer", o.optimizer},
        {"seed", o.seed},
        {"flops_per_token", flops_tok},
        {"data", o.data},
        {"device", o.device},
        {"backend", comm.backend()},
        {"link", link.name},
        {"link_slowdown", o.link_slowdown},
        {"loader_delay_ms", o.loader_delay_ms},
        {"slow_rank", o.slow_rank},
        {"slow_ms", o.slow_ms},
        {"loader_alone_batches", o.loader_alone_batches},
        {"memory_cap_bytes", cap_bytes},
        {"memory_estimated_peak_bytes", est.total_peak_bytes()},
        {"exposed_comm_method", kEventsRecordWait ? "CommEvent::wait_ms" : "hook timers"},
        {"timeline_steps", o.timeline_steps}};
    RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, world, threads, policy, device, peak);
    if (link.enabled() || cap_bytes > 0) run_rec.extra["simulated"] = true;
    log.log_run(run_rec);
    if (o.loader_alone_batches > 0)
      log.log("loader_alone", {{"tokens_per_s", loader_alone_tok_s}, {"batches", o.loader_alone_batches}});

    if (rank == 0) {
      std::printf("lab04 | %s | %lld params | %d ranks (%s) x %d threads | %s | prefetch %d | overlap %s | link %s%s\n",
                  cfg.str().c_str(), static_cast<long long>(model.num_params()), world, comm.backend().c_str(),
                  threads, lab04::zero_stage_name(stage), prefetch, o.overlap.c_str(), link.name.c_str(),
                  link.enabled() ? " (simulated)" : "");
      std::printf("global batch %d = micro-batch %d x %d ranks x %d micro-steps | T=%d | %s | %s | peak %.1f GFLOP/s "
                  "per rank (%s)\n", global_batch, o.micro_batch, world, micro_steps, o.seq_len,
                  policy.name().c_str(), o.optimizer.c_str(), peak.flops_per_s / 1e9, peak.source.c_str());
      std::printf("memory per rank (estimator): persistent %.1f MiB, peak %.1f MiB (model state %.1f + activations "
                  "%.1f)%s", est.persistent.total() / kMiB, est.total_peak_bytes() / kMiB, est.peak.total() / kMiB,
                  est.activations_bytes / kMiB, cap_bytes > 0 ? "" : "\n");
      if (cap_bytes > 0) std::printf(" | cap %.1f MiB per rank\n", cap_bytes / kMiB);
      if (o.loader_alone_batches > 0)
        std::printf("loader alone (rank 0, %d batches, no model): %.0f tokens/s\n", o.loader_alone_batches,
                    loader_alone_tok_s);
      if (o.slow_rank >= 0 && o.slow_ms > 0) std::printf("rank %d sleeps %g ms per micro-step (--slow-rank)\n",
                                                         o.slow_rank, o.slow_ms);
      std::printf("logs: %s (one file per rank)\n", log.path().c_str());
      std::fflush(stdout);
    }

    // ----------------------------------------------------------------------------------------------
    // Training
    std::vector<lab04::MicroBatch> micro(micro_steps);
    for (lab04::MicroBatch& mb : micro) {
      mb.inputs = Tensor::empty({o.micro_batch, o.seq_len}, DType::I32, device, MemCategory::Data);   // (B, T)
      mb.targets = Tensor::empty({o.micro_batch, o.seq_len}, DType::I32, device, MemCategory::Data);  // (B, T)
    }
    Tensor& x = micro[0].inputs;  // validation reuses the first micro-batch's tensors
    Tensor& y = micro[0].targets;
    doing = "evaluating before step 0 (the first forward allocates the activations)";
    float val_loss = driver::evaluate_all_ranks(model, comm, val, x, y);
    const float val_loss_start = val_loss;
    if (rank == 0) std::printf("step %5d | val loss %.4f\n", 0, val_loss);
    log.log_eval(0, val_loss);

    double timed_seconds = 0.0, timed_exposed_ms = 0.0, timed_busy_ms = 0.0, timed_modeled_ms = 0.0;  // steps 1..
    double timed_data_ms = 0.0;
    int64_t timed_tokens = 0;
    float loss = 0.0f;
    MemStats between_steps{};  // after the last step: what stays between steps (the persistent state)
    const auto t_run = Clock::now();
    for (int step = 0; step < o.steps; ++step) {
      doing = "step " + std::to_string(step);
      const auto t0 = Clock::now();
      const double t0_ms = Communicator::now_ms();  // the timeline's clock
      double data_wait_ms = 0.0;
      for (lab04::MicroBatch& mb : micro) data_wait_ms += fetch_batch(train_data, mb.inputs, mb.targets,
                                                                      o.loader_delay_ms);
      const float lr = schedule.at(step);
      comm.clear_events();
      const bool log_timeline = step >= 1 && step <= o.timeline_steps;  // step 0 is warm-up
      probe.begin(t0_ms, Communicator::now_ms());

      const lab04::StepResult r = lab04::train_step(*fsdp, micro, lr, o.grad_clip);  // YOUR step (lab04-9)
      device_synchronize(device);  // GPU work is asynchronous: the step ends when the device is done

      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      std::vector<TimeSpan> spans;
      const StepComm sc = probe.end(comm.events(), log_timeline ? &spans : nullptr);
      if (log_timeline) log.log_timeline(step, comm.events(), spans);
      between_steps = Allocator::get(device).stats();
      const int64_t tokens = static_cast<int64_t>(global_batch) * o.seq_len;  // all ranks together
      const double tok_s = lab01::tokens_per_second(tokens, seconds);
      const double step_mfu =
          peak.flops_per_s > 0 ? lab01::mfu(tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/world) : kNotMeasured;
      loss = driver::mean_over_ranks(comm, r.loss, "loss");  // outside the timed step: only for the log
      if (step > 0) {  // the first step allocates and warms caches: not timed
        timed_seconds += seconds;
        timed_tokens += tokens;
        timed_exposed_ms += sc.exposed_ms;
        timed_busy_ms += sc.totals.busy_ms;
        timed_modeled_ms += sc.totals.modeled_ms;
        timed_data_ms += data_wait_ms;
      }

      StepRecord rec;
      rec.step = step;
      rec.loss = loss;
      rec.lr = lr;
      rec.tokens = tokens;
      rec.step_ms = seconds * 1e3;
      rec.data_wait_ms = data_wait_ms;
      rec.comm_ms = sc.exposed_ms;
      rec.tokens_per_s = tok_s;
      rec.mfu = step_mfu;
      rec.grad_norm = r.grad_norm;
      rec.extra = {{"compute_ms", rec.step_ms - data_wait_ms - sc.exposed_ms},
                   {"comm_hooks_ms", sc.hooks_ms},
                   {"comm_busy_ms", sc.totals.busy_ms},
                   {"gather_payload_bytes", sc.totals.all_gather_bytes},
                   {"reduce_scatter_payload_bytes", sc.totals.reduce_scatter_bytes},
                   {"allreduce_payload_bytes", sc.totals.all_reduce_bytes}};
      if (sc.totals.simulated) {
        rec.extra["comm_modeled_ms"] = sc.totals.modeled_ms;
        rec.extra["simulated"] = true;
      }
      log.log_step(rec);

      const bool last = step + 1 == o.steps;
      if (rank == 0 && !o.quiet && (step % 10 == 0 || last)) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - t_run).count();
        const double eta = elapsed / (step + 1) * (o.steps - step - 1);
        std::printf("step %5d | loss %.4f | lr %.2e | %7.0f tok/s | MFU %5.1f%% | comm %6.1f ms exposed of %6.1f busy | "
                    "peak %.1f MiB | ETA %.0f s\n", step, loss, lr, tok_s, 100.0 * step_mfu, sc.exposed_ms, sc.totals.busy_ms,
                    between_steps.total_peak_bytes / kMiB, eta);
        std::fflush(stdout);
      }
      if ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last) {
        doing = "evaluating after step " + std::to_string(step);
        val_loss = driver::evaluate_all_ranks(model, comm, val, x, y);
        if (rank == 0) std::printf("step %5d | val loss %.4f\n", step + 1, val_loss);
        log.log_eval(step + 1, val_loss);
      }
    }

    // ----------------------------------------------------------------------------------------------
    // A sample: every rank runs the same forwards (ZeRO-3 gathers are collective), with the same RNG
    doing = "sampling";
    const std::string sample = o.sample_tokens > 0 ? sample_text(model, "\n", o.sample_tokens, rng) : "";

    // ----------------------------------------------------------------------------------------------
    // Summary (every rank logs its own; rank 0 prints)
    const MemStats mem = Allocator::get(device).stats();
    const int timed_steps = std::max(1, o.steps - 1);
    const double mean_tok_s = timed_seconds > 0 ? static_cast<double>(timed_tokens) / timed_seconds : 0.0;
    const double mean_mfu = peak.flops_per_s > 0 && mean_tok_s > 0
                                ? lab01::mfu(mean_tok_s, flops_tok, peak.flops_per_s, /*num_devices=*/world)
                                : kNotMeasured;
    const double exposed = timed_exposed_ms / timed_steps, busy = timed_busy_ms / timed_steps;
    const double modeled = timed_modeled_ms / timed_steps, data_ms = timed_data_ms / timed_steps;
    const double step_ms = 1e3 * timed_seconds / timed_steps;
    auto cur = [](const MemStats& m, MemCategory c) { return m.current_bytes[static_cast<int>(c)]; };
    auto pk = [](const MemStats& m, MemCategory c) { return m.peak_bytes[static_cast<int>(c)]; };
    nlohmann::json summary = {
        {"final_loss", loss},
        {"val_loss_start", val_loss_start},
        {"val_loss_end", val_loss},
        {"tokens_per_s", mean_tok_s},
        {"mfu", mean_mfu},
        {"peak_flops_per_s", peak.flops_per_s},
        {"peak_source", peak.source},
        {"comm_ms", exposed},
        {"comm_busy_ms", busy},
        {"data_wait_ms", data_ms},
        {"compute_ms", step_ms - data_ms - exposed},
        {"memory_params_persistent_bytes", cur(between_steps, MemCategory::Params)},
        {"memory_grads_persistent_bytes", cur(between_steps, MemCategory::Grads)},
        {"memory_optimizer_state_persistent_bytes", cur(between_steps, MemCategory::OptimizerState)},
        {"memory_params_peak_bytes", pk(mem, MemCategory::Params)},
        {"memory_grads_peak_bytes", pk(mem, MemCategory::Grads)},
        {"memory_optimizer_state_peak_bytes", pk(mem, MemCategory::OptimizerState)},
        {"memory_activations_peak_bytes", pk(mem, MemCategory::Activations)},
        {"memory_estimated_params_persistent_bytes", est.persistent.params},
        {"memory_estimated_grads_persistent_bytes", est.persistent.grads},
        {"memory_estimated_optimizer_state_persistent_bytes", est.persistent.optimizer_state},
        {"memory_estimated_params_peak_bytes", est.peak.params},
        {"memory_estimated_grads_peak_bytes", est.peak.grads},
        {"memory_estimated_optimizer_state_peak_bytes", est.peak.optimizer_state},
        {"memory_estimated_activations_bytes", est.activations_bytes},
        {"memory_estimated_peak_bytes", est.total_peak_bytes()},
        {"memory_cap_bytes", cap_bytes}};
    if (o.loader_alone_batches > 0) summary["loader_alone_tokens_per_s"] = loader_alone_tok_s;
    if (link.enabled()) {
      summary["comm_modeled_ms"] = modeled;
      summary["simulated"] = true;
    }
    if (rank == 0) summary["sample"] = sample;  // printable ASCII (sample_text)
    log.log_summary(summary);
    if (rank == 0) {
      std::printf("\n== summary ==\nval loss %.4f -> %.4f | %.0f tokens/s | MFU %.1f%% of %d x %.1f GFLOP/s (%s)\n",
                  val_loss_start, val_loss, mean_tok_s, 100.0 * mean_mfu, world, peak.flops_per_s / 1e9,
                  peak.source.c_str());
      std::printf("per step %.1f ms = compute %.1f + data wait %.1f + communication %.1f exposed (the step waited; "
                  "%s) | the transport was busy %.1f ms", step_ms, step_ms - data_ms - exposed, data_ms, exposed,
                  kEventsRecordWait ? "CommEvent::wait_ms" : "hook timers", busy);
      if (link.enabled()) std::printf(", of which the simulated link charged %.1f ms", modeled);
      std::printf("\n\nmemory of rank 0, MiB       measured   estimated  |  measured  estimated\n"
                  "                           persistent persistent  |    peak       peak\n");
      const struct { const char* name; MemCategory c; int64_t est_persistent, est_peak; } rows[] = {
          {"params", MemCategory::Params, est.persistent.params, est.peak.params},
          {"grads", MemCategory::Grads, est.persistent.grads, est.peak.grads},
          {"optimizer state", MemCategory::OptimizerState, est.persistent.optimizer_state, est.peak.optimizer_state},
      };
      for (const auto& row : rows)
        std::printf("%-26s %9.2f  %9.2f   | %9.2f  %9.2f\n", row.name, cur(between_steps, row.c) / kMiB,
                    row.est_persistent / kMiB, pk(mem, row.c) / kMiB, row.est_peak / kMiB);
      std::printf("%-26s %9s  %9s   | %9.2f  %9.2f\n", "activations", "-", "-", pk(mem, MemCategory::Activations) / kMiB,
                  est.activations_bytes / kMiB);
      std::printf("%-26s %9s  %9s   | %9.2f  %9s\n", "comm (reduce-scatter out)", "-", "-",
                  pk(mem, MemCategory::Comm) / kMiB, "-");
      std::printf("%-26s %9s  %9s   | %9.2f  %9s\n", "workspace + data + other", "-", "-",
                  (pk(mem, MemCategory::Workspace) + pk(mem, MemCategory::Data) + pk(mem, MemCategory::Other)) / kMiB,
                  "-");
      const int64_t state_now = cur(between_steps, MemCategory::Params) + cur(between_steps, MemCategory::Grads) +
                                cur(between_steps, MemCategory::OptimizerState);
      const int64_t state_peaks = pk(mem, MemCategory::Params) + pk(mem, MemCategory::Grads) +
                                  pk(mem, MemCategory::OptimizerState);
      std::printf("%-26s %9.2f  %9.2f   | %9.2f  %9.2f   (sum of the three peaks)\n", "model state",
                  state_now / kMiB, est.persistent.total() / kMiB, state_peaks / kMiB, est.peak.total() / kMiB);
      std::printf("%-26s %9s  %9s   | %9.2f  %9.2f   (measured: peak of the sum of all; estimated: model state "
                  "+ activations)\n", "total", "", "", mem.total_peak_bytes / kMiB, est.total_peak_bytes() / kMiB);
      if (cap_bytes > 0)
        std::printf("memory per rank: peak %.1f MiB of the %.1f MiB cap (%.0f %%)\n", mem.total_peak_bytes / kMiB,
                    cap_bytes / kMiB, 100.0 * mem.total_peak_bytes / cap_bytes);
      if (!sample.empty()) std::printf("\n== sample ==\n%s\n", sample.c_str());
    }
    return 0;
  } catch (const OutOfMemory& e) {
    const std::string report = oom_report(e, o, cfg, rank, world, policy, device, doing);
    log.log("out_of_memory", {{"doing", doing}, {"memory_cap_bytes", cap_bytes},
                              {"memory_estimated_peak_bytes", est.total_peak_bytes()}});
    fsdp.release();  // on purpose: see above
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
  app.get_option("--precision")->description("fp32 or bf16 (bf16 params, fp32 master shard and gradients; emulated "
                                             "on CPU)");
  app.get_option("--sample-tokens")->description("bytes of text generated at the end (by every rank: ZeRO-3 "
                                                 "forwards are collective; rank 0 prints)");
  driver::add_link_options(app, o);
  app.add_option("--stage", o.stage, "ZeRO stage: 1 (optimizer state), 2 (+ gradients), 3 (+ parameters, FSDP "
                 "FULL_SHARD)")->capture_default_str();
  app.add_option("--prefetch", o.prefetch, "ZeRO-3: all-gathers in flight beyond the unit in use (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--overlap", o.overlap, "on: collectives overlap compute; off: every collective waited for at once, "
                 "no prefetch")->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  app.add_option("--memory-cap-mb", o.memory_cap_mb, "simulated device memory per rank, MiB (0: no cap); beyond it "
                 "an allocation fails with an out-of-memory report")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--estimate", o.estimate, "print the memory estimator's table for this config at this world size "
               "(stages 0-3) and exit without training");
  app.add_option("--loader-delay-ms", o.loader_delay_ms, "sleep this long in every batch fetch (a slow loader; "
                 "counted as data wait)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--slow-rank", o.slow_rank, "this rank computes --slow-ms longer per micro-step (a straggler; "
                 "-1: none)")->capture_default_str();
  app.add_option("--slow-ms", o.slow_ms, "ms the --slow-rank sleeps per micro-step, inside its compute")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--loader-alone-batches", o.loader_alone_batches, "before training, time the loader alone for N "
                 "batches with no model (0: skip)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--quiet", o.quiet, "print only validation and the summary");
  CLI11_PARSE(app, argc, argv);

  return run_on_all_ranks(o.backend, [&](Communicator& comm) { return run(o, comm); });
}
