// faults.h — lab 08's provocations and the heartbeat, given (library lab08_given, one copy for both tracks):
// the options that kill, hang, slow down or poison a rank, what they do at each step and checkpoint, and the
// one line per step every rank leaves for scripts/supervise. Lesson: labs/08_resilience/README.md
// ("Automatic restart", "Loss spikes: roll back and skip", "Stragglers").
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>  // defines: CLI::App

#include "scalelab/core/rng.h"    // defines: Rng
#include "scalelab/data/batch.h"  // defines: data::Batch
#include "shard_state.h"          // defines: wall_ms

namespace scalelab::lab08 {

// The restart count scripts/supervise exports as SL_RESTART (0 for the first attempt or without a supervisor).
int attempt();

struct FaultOptions {
  int fail_at_step = -1;  // rank fail_rank fails when step fail_at_step is about to run (-1: never)
  int fail_rank = 0;
  std::string fail_mode = "kill";   // kill (SIGKILL, a lost node) | hang (sleeps forever: alive and silent)
  bool fail_in_checkpoint = false;  // instead: in the checkpoint of step fail_at_step, after its own shard
  double fail_mtbf_s = 0;           // > 0: every attempt is killed after an exponential time of this mean (s)
  int poison_at_step = -1;          // rank poison_rank's windows of this step: every target byte 0
  int poison_rank = 0;
  int slow_rank = -1;  // this rank's uniform compute time is slow_factor times the others'
  double slow_factor = 1.0;
  std::string heartbeat_dir;  // one line per step and rank here (default: $SL_HEARTBEAT_DIR)
};
// --fail-at-step --fail-rank --fail-mode --fail-in-checkpoint --fail-mtbf-s --poison-at-step --poison-rank
// --slow-rank --slow-factor --heartbeat-dir.
void add_fault_options(CLI::App& app, FaultOptions& o);

// What the options do on one rank. A fault at a step or in a checkpoint fires on the first attempt only
// (attempt() == 0), so the restarted job gets past it; the MTBF fault fires on every attempt.
class Faults {
 public:
  // Throws scalelab::Error for a bad --fail-mode.
  Faults(const FaultOptions& o, int rank, uint64_t seed);
  // Before step `step` runs: the fault at that step, or the MTBF fault when its time has come.
  void before_step(int64_t step);
  // True when this rank must fail inside the checkpoint of `next_step`: write its shard, then call strike().
  bool in_checkpoint(int64_t next_step) const;
  [[noreturn]] void strike(const char* where, int64_t step);
  // Poisons a batch this rank reads for step `step` (each of its micro_batches windows), once per process:
  // after a rollback the same step reads clean windows.
  void poison(data::Batch& b, int64_t step, int micro_batches);
  // This rank's factor on the uniform compute time (slow_factor on slow_rank, 1 elsewhere).
  double compute_factor() const { return rank_ == o_.slow_rank ? o_.slow_factor : 1.0; }

 private:
  FaultOptions o_;
  int rank_;
  bool first_attempt_;
  double fail_after_ms_ = 0, attempt_start_ms_ = 0;  // the MTBF fault
  int poisoned_ = 0;                                 // windows poisoned so far
};

// One JSON line per step ({"attempt", "step", "step_ms", "wall_ms"}) appended to <dir>/rank_<r>.beats and
// flushed: the file's modification time is what scripts/supervise watches. An empty dir: no heartbeat.
class Heartbeat {
 public:
  Heartbeat(const std::string& dir, int rank);
  void beat(int64_t step, double step_ms);

 private:
  std::ofstream out_;
};

}  // namespace scalelab::lab08
