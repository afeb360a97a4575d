// metrics.h — run logs: one JSON object per line (JSONL), one file per rank, flushed per record.
// Notebooks, the grader and the benchmarks read only these files; every key, type and unit is in
// docs/log_schema.md. Tests: tests/common/measure/test_metrics.cpp
//
//   RunLogger log("lab01", run_id, rank);            // -> runs/lab01/<run_id>/rank<k>.jsonl
//   log.log_run(run_record);                         // once, first: config, device, peak FLOP/s source
//   log.log_step(step_record);                       // every step; memory counters filled in here
//   log.log_eval(step, val_loss);
//   log.log_timeline(step, comm.events(), spans);     // a few steps: per-rank compute/communication timeline
//   log.log_summary();                               // last: means over the timed steps
//
// Every rank writes its own rank<k>.jsonl (rank 0 included; there is no merged file): ranks never
// share a file handle, and a crashed rank's log ends where it crashed. A run that ended normally
// ends with a `summary` record; a log without one is from a run that died.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "scalelab/core/allocator.h"        // defines: Device, the memory categories logged per step
#include "scalelab/comm/comm.h"             // defines: CommEvent (the communication part of a timeline record)
#include "scalelab/measure/not_measured.h"  // defines: kNotMeasured

namespace scalelab {

// What this machine is (for the run record; calibration keys its cache on cpu_model).
struct SystemInfo {
  std::string cpu_model;  // /proc/cpuinfo "model name" (or "Hardware"/"cpu model" on ARM), "unknown" otherwise
  int cores = 0;          // logical CPUs, std::thread::hardware_concurrency()
  std::string hostname;
};
SystemInfo system_info();

// A run id all ranks agree on: "<UTC yyyymmddThhmmssZ>-<4 hex>", e.g. "20261129T072340Z-3fa9".
// The environment variable SL_RUN_ID, when set, wins (scripts and the grader pin run ids with it).
// With several ranks, rank 0 calls this and broadcasts the string: the random suffix differs per call.
std::string make_run_id();

// "2026-11-29T07:23:40Z" (ISO-8601, UTC, seconds).
std::string utc_now_iso8601();

// The `run` record, written once at the start. Fields the logger knows itself (rank, git sha, CPU
// model, hostname, BLAS build, start time) are filled in by log_run.
struct RunRecord {
  nlohmann::json config = nlohmann::json::object();  // the program's full configuration (CLI flags)
  int world_size = 1;
  std::string track;                       // "learner" or "reference"
  std::string device = "cpu";              // "cpu" or the GPU name, e.g. "NVIDIA H200"
  int threads = 0;                         // CPU threads per rank (OpenMP + BLAS); 0: filled from num_threads()
  std::string precision;                   // PrecisionPolicy::name(): "fp32", "bf16-mixed"
  double peak_flops_per_s = kNotMeasured;  // per device: the denominator of mfu
  std::string peak_source;                 // "datasheet: NVIDIA H200 SXM dense bf16 ..." or a calibration's source
  std::string calibration_id;              // Calibration::id when the peak was measured, "" for a datasheet peak
  nlohmann::json extra = nlohmann::json::object();  // more keys, merged into the record
};

// One `step` record. Times in milliseconds on the kit's clock (core/clock.h: wall, or virtual on the simulated
// GPU), as the rank measured them.
// Fields left at kNotMeasured are written as null (for example comm_ms in a single-rank lab).
struct StepRecord {
  int64_t step = 0;                    // 0-based optimizer step
  double loss = kNotMeasured;          // mean training loss of this step, nats per token
  double lr = kNotMeasured;            // learning rate used by this step's update
  int64_t tokens = 0;                  // tokens processed by this step, all ranks together (B*T*grad_accum*dp)
  double step_ms = kNotMeasured;       // wall time of the whole step on this rank
  double data_wait_ms = kNotMeasured;  // part of step_ms spent waiting for the data loader
  double comm_ms = kNotMeasured;       // part of step_ms spent in communication calls (blocking or waited on)
  double tokens_per_s = kNotMeasured;  // tokens / (step_ms / 1000)
  double mfu = kNotMeasured;           // model FLOPs utilization, a fraction in [0, 1] (not percent)
  double grad_norm = kNotMeasured;     // global L2 norm of the gradient before clipping
  nlohmann::json extra = nlohmann::json::object();  // more keys (units in their names), merged in
};

// A named stretch of compute on one rank ("forward", "backward", ...), in milliseconds on the
// communication clock (Communicator::now_ms()), so it lines up with the CommEvents of the same step.
struct TimeSpan {
  std::string name;
  double start_ms = 0, end_ms = 0;
};

class RunLogger {
 public:
  // Opens <dir>/<lab>/<run_id>/rank<rank>.jsonl for appending (directories created). Throws
  // scalelab::Error with a hint when it cannot. The clock for `elapsed_s` starts here.
  RunLogger(const std::string& lab, const std::string& run_id, int rank, const std::string& dir = "runs");
  ~RunLogger();
  RunLogger(const RunLogger&) = delete;
  RunLogger& operator=(const RunLogger&) = delete;

  // Memory counters of log_step and log_summary come from Allocator::get(device). Default Device::CPU;
  // driver::TrainLoop sets its run's device, so a lab on the GPU never logs the CPU allocator's counts.
  void set_memory_device(Device device) { memory_device_ = device; }
  Device memory_device() const { return memory_device_; }

  void log_run(const RunRecord& r);
  // Adds the memory_*_bytes keys from the allocator and writes the record. Warns once on stderr when
  // mfu is outside [0, 1] (a percentage, or a wrong FLOP count or peak).
  void log_step(const StepRecord& s);
  void log_eval(int64_t step, double val_loss, const nlohmann::json& extra = nlohmann::json::object());
  // The `summary` record: means over the step records except the first (warm-up, docs/style.md 32), the
  // final loss, the best val_loss, peak memory, plus `extra`. Write it once, at the end of a run. With a
  // single step record the means are that step's, and the record says "warm_up_timed": true.
  void log_summary(const nlohmann::json& extra = nlohmann::json::object());
  // The `timeline` record of one step: its communication calls (every field of CommEvent that a plot
  // needs) and its compute spans, all on the Communicator::now_ms() clock. For a few steps only: a
  // step with hundreds of calls makes a long line.
  void log_timeline(int64_t step, const std::vector<CommEvent>& events, const std::vector<TimeSpan>& compute);
  // Any other record (checkpoint saved, loss spike, ...): adds type, rank, elapsed_s and writes it.
  void log(const std::string& type, const nlohmann::json& record);

  const std::string& path() const { return path_; }
  const std::string& run_id() const { return run_id_; }

 private:
  // Writes {"type", "rank", "elapsed_s", fields...} as one line and flushes. Thread-safe.
  void emit(const std::string& type, const nlohmann::ordered_json& fields);
  std::string lab_, run_id_, path_;
  int rank_ = 0;
  Device memory_device_ = Device::CPU;
  std::FILE* file_ = nullptr;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  bool warned_mfu_ = false;
  // Running sums for the summary (steps after the first).
  int64_t num_steps_ = 0, timed_steps_ = 0, tokens_total_ = 0, timed_tokens_ = 0;
  double sum_step_ms_ = 0, sum_mfu_ = 0;
  StepRecord first_step_;  // the warm-up step: the summary's only timed step when it is the only step
  double peak_flops_per_s_ = kNotMeasured;  // from the run record, repeated in the summary
  std::string peak_source_;
  int64_t mfu_steps_ = 0;
  double last_loss_ = kNotMeasured, best_val_loss_ = kNotMeasured;
  int64_t last_step_ = -1;
};

// The memory keys of a step record for these stats: memory_<category>_bytes (current, per category),
// memory_<category>_peak_bytes, memory_current_bytes and memory_peak_bytes (total). Exposed for tests.
nlohmann::json memory_fields(const MemStats& stats);

}  // namespace scalelab
