// faults.cpp — lab 08's provocations and the heartbeat (faults.h).
#include "faults.h"

#include <signal.h>  // defines: raise, SIGKILL
#include <unistd.h>  // defines: sleep

#include <algorithm>   // defines: std::fill
#include <cmath>       // defines: std::log
#include <cstdio>      // defines: std::printf
#include <cstdlib>     // defines: std::getenv, std::atoi
#include <filesystem>  // defines: std::filesystem::create_directories

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "scalelab/core/error.h"            // defines: SL_CHECK_HINT
#include "scalelab/driver/option_checks.h"  // defines: driver::non_negative_int, ... (every numeric option checked)

namespace scalelab::lab08 {

int attempt() {
  const char* a = std::getenv("SL_RESTART");
  return a == nullptr ? 0 : std::atoi(a);
}

void add_fault_options(CLI::App& app, FaultOptions& o) {
  if (const char* hb = std::getenv("SL_HEARTBEAT_DIR")) o.heartbeat_dir = hb;  // scripts/supervise sets it
  app.add_option("--fail-at-step", o.fail_at_step,
                 "inject a fault when this step is about to run (-1: none; "
                 "only on the first attempt, SL_RESTART unset or 0)")
      ->capture_default_str()
      ->check(driver::int_in_range(-1, INT32_MAX));
  app.add_option("--fail-rank", o.fail_rank, "the rank that fails")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--fail-mode", o.fail_mode, "kill (SIGKILL) or hang (alive, silent)")->capture_default_str();
  app.add_flag("--fail-in-checkpoint", o.fail_in_checkpoint,
               "the fault strikes while the checkpoint of step "
               "--fail-at-step is written: after this rank's shard, before the manifest and the marker");
  app.add_option("--fail-mtbf-s", o.fail_mtbf_s,
                 "every attempt is killed after an exponential time of this mean "
                 "(seconds; a Poisson process of failures, for bench/resilience_interval.py; 0: none)")
      ->capture_default_str()
      ->check(driver::finite_non_negative());
  app.add_option("--poison-at-step", o.poison_at_step,
                 "the windows --poison-rank reads for this step have every "
                 "target byte 0 (a corrupted shard; -1: none; once: the rolled-back run does not see them)")
      ->capture_default_str()
      ->check(driver::int_in_range(-1, INT32_MAX));
  app.add_option("--poison-rank", o.poison_rank, "the rank that reads the poisoned windows")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--slow-rank", o.slow_rank,
                 "this rank computes --slow-factor times longer (a straggler; needs "
                 "--uniform-compute-ms)")
      ->capture_default_str()
      ->check(driver::int_in_range(-1, INT32_MAX));
  app.add_option("--slow-factor", o.slow_factor, "how much slower --slow-rank is")
      ->capture_default_str()
      ->check(driver::finite_positive());
  app.add_option("--heartbeat-dir", o.heartbeat_dir,
                 "one line per step and rank here (default: $SL_HEARTBEAT_DIR, "
                 "which scripts/supervise sets)");
}

Faults::Faults(const FaultOptions& o, int rank, uint64_t seed) : o_(o), rank_(rank), first_attempt_(attempt() == 0) {
  SL_CHECK_HINT(o.fail_mode == "kill" || o.fail_mode == "hang", "--fail-mode kill or hang", "--fail-mode %s",
                o.fail_mode.c_str());
  // Failures as a Poisson process in wall time: the time to failure of an attempt is exponential with mean
  // MTBF, the same draw for the same seed and attempt.
  Rng rng(seed ^ (0xfa11ull + static_cast<uint64_t>(attempt())));
  if (o.fail_mtbf_s > 0) fail_after_ms_ = -1e3 * o.fail_mtbf_s * std::log(1.0 - rng.uniform());
  attempt_start_ms_ = wall_ms();
}

void Faults::before_step(int64_t step) {
  if (rank_ != o_.fail_rank) return;
  if (first_attempt_ && !o_.fail_in_checkpoint && step == o_.fail_at_step) strike("at step", step);
  if (o_.fail_mtbf_s > 0 && wall_ms() - attempt_start_ms_ > fail_after_ms_) {
    std::printf("rank %d: injected fault after %.1f s (MTBF %g s)\n", rank_, fail_after_ms_ / 1e3, o_.fail_mtbf_s);
    std::fflush(stdout);
    raise(SIGKILL);
  }
}

bool Faults::in_checkpoint(int64_t next_step) const {
  return first_attempt_ && rank_ == o_.fail_rank && o_.fail_in_checkpoint && next_step == o_.fail_at_step;
}

void Faults::strike(const char* where, int64_t step) {
  std::printf("rank %d: injected fault (%s) %s %lld\n", rank_, o_.fail_mode.c_str(), where,
              static_cast<long long>(step));
  std::fflush(stdout);
  if (o_.fail_mode == "kill") raise(SIGKILL);
  for (;;) sleep(60);  // hang: alive but silent; the others wait in their next collective
}

void Faults::poison(data::Batch& b, int64_t step, int micro_batches) {
  if (step != o_.poison_at_step || rank_ != o_.poison_rank || poisoned_ >= micro_batches) return;
  std::fill(b.targets.begin(), b.targets.end(), 0);  // garbage: NUL bytes, as from a corrupted shard
  ++poisoned_;
}

Heartbeat::Heartbeat(const std::string& dir, int rank) {
  if (dir.empty()) return;
  std::filesystem::create_directories(dir);
  out_.open(dir + "/rank_" + std::to_string(rank) + ".beats", std::ios::app);
}

void Heartbeat::beat(int64_t step, double step_ms) {
  if (!out_.is_open()) return;
  out_ << nlohmann::json{{"attempt", attempt()}, {"step", step}, {"step_ms", step_ms}, {"wall_ms", wall_ms()}}.dump()
       << std::endl;  // flushed: the supervisor reads the file's modification time
}

}  // namespace scalelab::lab08
