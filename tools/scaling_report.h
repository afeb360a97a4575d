// scaling_report.h — "why not 2x?" from the logs: reads the rank<k>.jsonl files of a 1-device run, an
// N-device run and a 1-device batch sweep (docs/log_schema.md), fills ScalingEvidence (bottleneck.h)
// and prints the comparison table beside format_verdict. Used by bin/sl_scaling_report
// (tools/sl_scaling_report.cpp), which scripts/why_not_2x.sh calls. Lesson: labs/04_fsdp/WHY_NOT_2X.md.
// Tests: tests/lab04_scaling/test_scaling_report.cpp (synthetic JSONL), tests/lab04_scaling/CMakeLists.txt
// (end to end, one provocation per ctest).
#pragma once

#include <nlohmann/json.hpp>  // defines: nlohmann::json (report_json)

#include <string>
#include <vector>

#include "scalelab/measure/bottleneck.h"  // defines: ScalingEvidence, RankTiming, BatchPoint, kNotMeasured

namespace scalelab::scaling {

// One rank of a run: means over its TIMED step records (step >= 1; step 0 is warm-up and is used only
// when it is the only step). Missing or null values stay kNotMeasured.
struct RankSummary {
  int rank = 0;
  int timed_steps = 0;
  double step_ms = kNotMeasured;                    // ms, mean `step_ms`
  double median_step_ms = kNotMeasured;             // ms, median `step_ms` (the batch sweep: robust to a busy machine)
  double data_wait_ms = kNotMeasured;               // ms, mean `data_wait_ms`
  double comm_ms = kNotMeasured;                    // ms, mean `comm_ms` (exposed communication)
  double compute_ms = kNotMeasured;                 // ms, mean `compute_ms` (else step - data wait - comm)
  double comm_busy_ms = kNotMeasured;               // ms, mean `comm_busy_ms` (collectives in flight)
  double tokens_per_step = kNotMeasured;            // tokens, mean `tokens` (all ranks together)
  double peak_bytes = kNotMeasured;                 // bytes, largest `memory_peak_bytes` of its step/summary records
  double loader_alone_tokens_per_s = kNotMeasured;  // tokens/s of this rank, its `loader_alone` record
};

// One run (one <log-dir>/<lab>/<run-id>/ folder), from its run, loader_alone, step and summary records.
struct RunSummary {
  std::string name;  // the folder (or the name given to parse_run)
  int world_size = 0;
  int micro_batch = 0;                 // B per rank: config.micro_batch (lab 03: config.B)
  int seq_len = 0;                     // T: config.T
  int stage = -1;                      // config.stage (-1: not a ZeRO run)
  std::string model;                   // config.model
  std::string link = "none";           // config.link
  bool overlap = false;                // config.overlap == "on" (lab 04) or config.mode == "overlap" (lab 03)
  int prefetch = -1;                   // config.prefetch
  double tokens_per_s = kNotMeasured;  // all ranks together: rank 0's summary, else its timed steps
  double mfu = kNotMeasured;           // fraction: rank 0's summary `mfu`, else the mean of its steps'
  std::vector<RankSummary> ranks;      // sorted by rank
};

// Parses the JSONL text of every rank of one run (any order). Throws scalelab::Error naming the run,
// the rank and the line when a line is not JSON or a rank has no step record.
RunSummary parse_run(const std::string& name, const std::vector<std::string>& rank_jsonl);
// Reads <dir>/rank*.jsonl. Throws with a hint when the folder has none.
RunSummary read_run(const std::string& dir);

// The evidence for diagnose_scaling: throughput from both runs, loader alone / consumption and the
// shares from the N-device run's ranks, the sweep from `sweep` plus the single run (one device each,
// same T; runs of another T or world size are left out with a note in `notes`). A sweep point's rate is
// tokens per step / MEDIAN step time: a sweep point has few steps, and on a shared machine one
// disturbed step would move a mean by more than the 1.3x the verdict looks for.
ScalingEvidence make_evidence(const RunSummary& single, const RunSummary& multi, const std::vector<RunSummary>& sweep,
                              std::vector<std::string>* notes = nullptr);

// The table: for 1 device and N, tokens/s, tokens/s per device, MFU, peak memory per rank, data-wait
// share, exposed-comm share, per-rank step and compute times with their spread; the sweep; the loader.
// Then scaling efficiency and, with `with_verdict`, format_verdict(v) (without it the reader finds the
// cause alone: why_not_2x.sh --blind). Without `show_options` the header names only the model, the stage
// and N, the sweep line leaves out T, and the notes are left out: a blind run's header must read the same
// whichever cause was provoked (its B, T, overlap and link would name it). Ends with '\n'.
std::string format_report(const RunSummary& single, const RunSummary& multi, const ScalingEvidence& ev,
                          const Verdict& v, const std::vector<std::string>& notes = {}, bool with_verdict = true,
                          bool show_options = true);

// The report's figures and the verdict as one JSON object (scripts/quiz reads it; docs/log_schema.md
// "why_not_2x report.json"): tokens/s and MFU of both runs, the scaling efficiency, world size, and each
// cause's name, culprit flag, measured value and threshold. Values not measured are null.
nlohmann::json report_json(const RunSummary& single, const RunSummary& multi, const Verdict& v);

// "loader", "comm", "batch", "straggler" -> 1..4 (the lesson's order); 0 for anything else.
int cause_order_from_name(const std::string& name);

}  // namespace scalelab::scaling
