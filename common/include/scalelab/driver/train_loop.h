// train_loop.h — the training loop every training driver runs (labs 01 to 08; docs/design.md "The training
// loop"): data for every micro-step, the learning-rate schedule, the warm-up step that is not timed,
// validation before, during and after, the step and eval records of the log, the progress line, the
// periodic checkpoint, the mean throughput and MFU, a text sample at the end, and what an out-of-memory
// says. What a lab teaches is the one call the loop makes per step (TrainLoop::step): lab 01's
// train_step, lab 03's data-parallel step, lab 04's sharded one, up to lab 07's 3D-parallel one.
// Everything around it is here, once. It links no lab: the loader (lab 02's) and the throughput and MFU
// formulas (lab 01's) come in as LabParts (labs/common/lab_parts.h gives a program its tracks' parts).
//
//   driver::RunData data = driver::open_data(o, lab_parts(), micro_batch, micro_steps, dp_rank, dp_size);
//   driver::TrainLoop loop(o, spec, &comm, model, data, log, peak, flops_per_token, device);
//   loop.step = [&](std::vector<MicroBatch>& micro, float lr) { return lab03::train_step(...); };
//   const driver::Summary s = loop.run();
//
// Implementation: common/src/driver/train_loop.cpp (library scalelab_driver, with driver.h). Tested through
// the drivers: scripts/compare_runs.py (fixed runs, bit for bit), the perf checks, scripts/scale_demo.sh.
#pragma once

#include <nlohmann/json.hpp>  // defines: nlohmann::json (extra keys of the step records)

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"            // defines: Communicator
#include "scalelab/core/allocator.h"       // defines: MemStats
#include "scalelab/core/error.h"           // defines: OutOfMemory
#include "scalelab/core/rng.h"             // defines: Rng
#include "scalelab/data/batch_source.h"    // defines: data::BatchSource, OpenBatchSource, LoaderConfig
#include "scalelab/driver/driver.h"        // defines: TrainOptions, ValidationSplit
#include "scalelab/measure/calibration.h"  // defines: Peak
#include "scalelab/measure/metrics.h"      // defines: RunLogger, TimeSpan, kNotMeasured
#include "scalelab/model/batch.h"          // defines: MicroBatch, StepResult
#include "scalelab/model/gpt2.h"           // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"          // defines: LRSchedule

namespace scalelab::driver {

// ---------------------------------------------------------------------------------------------
// What a lab program plugs in

// What the loop needs from the labs and cannot know itself: how to open a split's loader (lab 02's
// open_shard_loader) and the throughput and MFU formulas (lab 01's tokens_per_second and mfu). Every
// program passes the references; lab 01's and lab 02's own programs pass their track's, so a learner's
// program runs the learner's code end to end (labs/common/lab_parts.h builds it).
struct LabParts {
  data::OpenBatchSource open_loader;
  double (*tokens_per_second)(int64_t tokens, double seconds) = nullptr;
  double (*mfu)(double tokens_per_s, double flops_per_token, double peak_flops_per_s, int num_devices) = nullptr;
};

// ---------------------------------------------------------------------------------------------
// The data of a run

// What the drivers open the same way: the model's config (the preset, its vocabulary taken from the
// data's tokenizer, --seq-len checked against it), this rank's training loader (B = the micro-batch,
// every dp_size-th window of each global batch from dp_rank on: disjoint across data-parallel ranks) and
// the validation split (val_batches global batches: micro_steps loader batches per rank each, so every
// run with the same global batch evaluates the same windows, however many ranks share them).
// The parts it was opened with travel along (the loop reads its throughput and MFU from them).
struct RunData {
  GPTConfig cfg;
  data::LoaderConfig loader;
  std::unique_ptr<data::BatchSource> train;
  std::unique_ptr<ValidationSplit> val;
  LabParts parts;
};
// Throws with a hint for an unknown preset, a missing corpus, or --seq-len above the model's max_seq_len.
RunData open_data(const TrainOptions& o, const LabParts& parts, int micro_batch, int micro_steps, int dp_rank,
                  int dp_size);

// One micro-batch from a source of batches: fills mb.inputs and mb.targets, (B, T) i32 each, on their device.
using FillBatch = std::function<void(MicroBatch& mb)>;

// A source of batches alone, no model (the lesson: "time the data loader in isolation first"): one
// warm-up fill (it may start a prefetch thread), then `batches` timed fills of (B, T) CPU tensors. With
// comm, every rank starts together, as in training. Returns tokens per second of THIS rank (B x T per fill),
// timed on the wall clock: the host's loader is what is measured (on the simulated GPU plus the virtual
// time the fills paused for: a loader delay).
double time_source_alone(const FillBatch& fill, int B, int T, int batches, Communicator* comm);
// The same for a fresh loader of this rank (opened by `open` with `config`), each fetch with a pause of
// delay_ms inside (a slow loader, TrainLoop::loader_delay_ms; clock_pause_ms).
double time_loader_alone(const data::OpenBatchSource& open, const std::string& data_dir,
                         const data::LoaderConfig& config, int batches, double delay_ms, Communicator* comm);

// --steps > 0, --lr > 0, 0 <= --min-lr <= --lr, 0 <= --warmup < --steps, --grad-clip >= 0, --weight-decay >= 0,
// --optimizer adamw|sgd, --val-every >= 0, --val-batches > 0, --sample-tokens >= 0, a --log-dir this program
// can write (check_writable_dir, option_checks.h): otherwise a clear error (scalelab::Error) naming the option
// and the value, before anything is allocated.
void check_train_options(const TrainOptions& o);

// ---------------------------------------------------------------------------------------------
// The loop

// The shape of a run's steps.
struct LoopSpec {
  std::string lab;                    // "lab01", "lab03", ...: the progress line's and the report's name
  int micro_batch = 0;                // B: sequences per rank per micro-step
  int micro_steps = 1;                // micro-steps per optimizer step (gradient accumulation)
  int global_batch = 0;               // sequences per optimizer step, all ranks together
  bool sample_on_every_rank = false;  // lab 04: a ZeRO-3 forward is collective, so every rank samples
};

// What a lab measured about one step besides its loss and time (labs 03 and 04: communication).
struct StepMeasure {
  double comm_ms = kNotMeasured;  // exposed communication: how long the step waited for it (null: none)
  double comm_busy_ms = 0;        // how long the transport had a call in flight
  double comm_modeled_ms = 0;     // what the simulated link charged for them
  bool simulated = false;         // a link model decided (part of) their duration
  nlohmann::json extra = nlohmann::json::object();  // more keys for the step record (units in their names)
  std::vector<TimeSpan> spans;                      // the step's compute spans, for its `timeline` record (when asked)
};

// What the loop measured over the whole run.
struct Summary {
  int64_t steps = 0;        // optimizer steps this run made (from start_step)
  int timed_steps = 1;      // steps after the warm-up one (at least 1, the divisor of the means below)
  bool warm_up_timed = false;  // a one-step run: its only step, warm-up included, is the one timed (there is
                               // no later step to time; the figures below say how fast a cold step was)
  float final_loss = 0.0f;  // the last step's loss, averaged over the ranks
  float val_loss_start = 0.0f, val_loss_end = 0.0f;
  double tokens_per_s = kNotMeasured;  // all ranks together, over the timed steps (token-weighted; NaN: no step)
  double mfu = kNotMeasured;  // of tokens_per_s, against num_devices x the peak
  double hfu = kNotMeasured;  // the same with the recompute's FLOPs added (= mfu without --recompute)
  double step_ms = 0;         // per timed step, on the kit's clock (wall, or virtual): time, data wait, exposed and
                              // busy communication
  double data_wait_ms = 0, comm_ms = kNotMeasured, comm_busy_ms = 0, comm_modeled_ms = 0;
  double host_data_wait_ms = 0;  // per timed step: the host's real wait for the loader (= data_wait_ms in real time)
  std::string simulated;         // "simulated H100 SXM, virtual time" on the simulated GPU, else ""
  MemStats memory{};             // the allocator's statistics right after the last step (before the sample)
  std::string sample;            // sample_tokens bytes generated from "\n" (rank 0; "" elsewhere or when 0)
};

class TrainLoop {
 public:
  // comm: the data-parallel group's communicator, or nullptr for one device (lab 01: no collective is
  // made). data: the run's loaders (data.train, data.val: both open) and the parts' throughput and MFU.
  // The loop keeps references to everything given; they must outlive run(). It points the log's memory
  // counts at `device` (RunLogger::set_memory_device).
  TrainLoop(const TrainOptions& o, const LoopSpec& spec, Communicator* comm, GPT2& model, RunData& data, RunLogger& log,
            const Peak& peak, double flops_per_token, Device device);

  // ---- what the lab plugs in
  // Required: one optimizer step over this rank's micro-batches (micro.size() == spec.micro_steps) at
  // learning rate lr. The lab's concept; the loop times it (device synchronised) on the kit's clock
  // (core/clock.h: wall time, or virtual time on the simulated GPU) and logs it.
  std::function<StepResult(std::vector<MicroBatch>& micro, float lr)> step;
  // Pause this long inside every micro-batch's fetch: a slow loader, counted as data wait (lab 04's
  // --loader-delay-ms, README "Why not 2x?"): a sleep, or on the simulated GPU virtual time (clock_pause_ms).
  // The data wait of a step is the whole fetch of its batches.
  double loader_delay_ms = 0;
  // The communicator whose events a step's `timeline` record shows (default: the loop's own, `comm`).
  // Lab 05 points it at the tensor-parallel group, where its collectives are.
  Communicator* timeline_comm = nullptr;
  // Optional: where the training batches come from instead of data.train (lab 02 compares its loader with a
  // naive one). The loop times each call as data wait, like a fetch from data.train; loader_delay_ms is not
  // added. Validation still reads data.val.
  FillBatch next_batch;
  // Optional: the loss of one validation batch (tokens, targets: (B, T) i32), the same on every rank, instead
  // of model.forward(tokens, &targets): lab 06's pipeline runs it through every stage.
  std::function<float(const Tensor& tokens, const Tensor& targets)> forward_loss;
  // Optional: just before step(): step_start_ms and data_end_ms on Communicator::now_ms's clock;
  // want_timeline: this step logs a `timeline` record (steps 1..--timeline-steps).
  std::function<void(double step_start_ms, double data_end_ms, bool want_timeline)> before_step;
  // Optional: right after step() returned and the device is done (step_ms and data_wait_ms measured):
  // what the step communicated, and more keys for its record.
  std::function<StepMeasure(double step_ms, double data_wait_ms, bool want_timeline)> after_step;
  // Optional: the progress line's lab-specific part ("all-reduce 3.1 ms exposed of 4.0 busy"); the
  // default shows the data wait.
  std::function<std::string(const StepMeasure& m, double data_wait_ms)> progress;
  // Optional: save a checkpoint of the state after `next_step` steps (lab 01's --checkpoint-dir), called
  // every checkpoint_every steps and after the last.
  std::function<void(int64_t next_step)> save_checkpoint;
  int checkpoint_every = 0;
  // The random stream of the sample at the end: Rng(--seed ^ 0x5eed) unless a resumed run restores it.
  Rng sample_rng;
  // Throughput and MFU of each step and of the run: lab 01's functions (train_step.h), from data.parts: the
  // reference's in every program but lab 01's own, which passes its track's (a learner's program shows the
  // learner's MFU).
  double (*tokens_per_second)(int64_t tokens, double seconds);
  double (*mfu)(double tokens_per_s, double flops_per_token, double peak_flops_per_s, int num_devices);

  // Trains from start_step (0, or where a resumed checkpoint left off) to o.steps: validation first,
  // then every step, validation every --val-every steps and after the last, then the sample.
  Summary run(int64_t start_step = 0);

  // What the loop is doing now ("step 12", "evaluating after step 49", "sampling"), for the report of an
  // out-of-memory it lets through (out_of_memory_report).
  const std::string& doing() const { return doing_; }

 private:
  float evaluate_now(Tensor& x, Tensor& y);
  float mean_loss(float loss);

  const TrainOptions& o_;
  LoopSpec spec_;
  Communicator* comm_;
  GPT2& model_;
  data::BatchSource& train_;
  ValidationSplit& val_;
  RunLogger& log_;
  Peak peak_;
  double flops_per_token_;
  double hardware_flops_per_token_;  // flops_per_token_ + what --recompute adds (HFU's numerator)
  Device device_;
  int rank_ = 0, world_ = 1;
  std::string doing_ = "setting up";
};

// The `summary` record's keys every lab writes: final_loss, val_loss_start, val_loss_end, tokens_per_s,
// mfu, hfu, peak_flops_per_s, peak_source; with `comm` also comm_ms and comm_busy_ms, and with `simulated` (a
// link model was on) comm_modeled_ms and simulated. A run on the simulated GPU (Summary::simulated) adds
// simulated, clock "virtual", sim_gpu_name, data_wait_ms and host_data_wait_ms. The sample is rank 0's to add.
nlohmann::json summary_record(const Summary& s, const Peak& peak, bool comm, bool simulated);
// Rank 0's first summary lines: "== summary ==" ("== summary (simulated H100 SXM, virtual time) ==" on the
// simulated GPU), then "val loss a -> b | N tokens/s | MFU x% of
// [W x ]P GFLOP/s (source)" (W: the number of devices; 0 for one device, which prints no "W x"). A figure
// that was not measured says so in words ("MFU not measured (...)"), never "nan" or 0; a one-step run
// (Summary::warm_up_timed) adds that its figures include the warm-up. No newline at the end: the lab goes
// on with its own figures.
void print_summary_headline(const Summary& s, const Peak& peak, int num_devices);

// ---------------------------------------------------------------------------------------------
// Out of memory

// What a run that ran out of (simulated) device memory was, for its report.
struct OomContext {
  std::string lab;    // "lab04"
  std::string doing;  // TrainLoop::doing(), or what the driver was doing before the loop
  int rank = 0, world = 1;
  std::string model;  // the preset's name
  GPTConfig cfg;
  int zero_stage = 0;  // 0: every rank holds the whole model state (one device, DDP)
  PrecisionPolicy policy;
  OptimizerConfig::Kind optimizer = OptimizerConfig::Kind::AdamW;
  int prefetch = 0;  // ZeRO-3 gathers in flight beyond the unit in use
  int micro_batch = 0, seq_len = 0;
  Device device = Device::CPU;
};
// The report an out-of-memory ends the job with, on the rank that ran out: the cap, what was in use
// before it by category, the memory estimator's figures for this run (measure/memory_estimator.h), how
// many ranks each ZeRO stage from this one up would need, whether the activations alone exceed the cap,
// and what to change. e.what() first.
std::string out_of_memory_report(const OutOfMemory& e, const OomContext& c);

}  // namespace scalelab::driver
