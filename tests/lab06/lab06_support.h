// lab06_support.h — what lab 06's graded checks share (tests/lab06/test_lab06_np*.cpp): the model they cut
// into stages, a pipeline of the track under test over all ranks, the schedules' definitions written out
// independently of the learner's functions, the dense reference (ONE process, the whole model, computed on
// every rank), and the check bodies run at 2 and at 4 ranks. Implementation: lab06_support.cpp.
// Tolerances and what each check means: labs/06_pipeline_parallel/README.md ("What the tests check").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data_parallel.h"            // defines: dp_test::world, fresh_comm, random_global_batch, ... (tests/support)
#include "grading.h"                  // defines: grading::Record
#include "pipeline_parallel.h"        // defines: lab06::* (the track under test)
#include "scalelab/comm/comm.h"       // defines: Communicator
#include "scalelab/comm/rank_grid.h"  // defines: RankGrid
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig

namespace scalelab::lab06_test {

using namespace dp_test;
using lab06::Action;
using lab06::ScheduleKind;

// maxT 16, V 64, L 8, NH 2, C 16: 8 layers cut into 2 or 4 stages, and 2 chunks of each.
GPTConfig pp_config();
constexpr int kT = 8;  // tokens per sequence; kMicroBatch (2) sequences per micro-batch

// A pipeline of the track under test over every rank of a fresh communicator (stage = rank): its layout
// (make_layout), this rank's chunks (chunk_shard; the dense model's initial weights), the stage, the
// exchange, the embedding group (RankGrid) and one optimizer per chunk.
struct Pipeline {
  std::unique_ptr<Communicator> world;  // fresh: an empty event log
  std::unique_ptr<RankGrid> grid;
  lab06::PipelineLayout layout;
  std::vector<std::unique_ptr<GPT2>> models;
  std::unique_ptr<lab06::Stage> stage;
  std::unique_ptr<lab06::StageExchange> exchange;
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  // One optimizer step (lab06::train_step) on these micro-batches.
  StepResult step(const std::vector<MicroBatch>& micro, float lr, float grad_clip);
};
// world: the communicator of all ranks it runs on (nullptr: fresh_comm(), the mpi backend on the CPU); its
// device() is the models' (a sim world: Device::SIM).
Pipeline make_pipeline(const GPTConfig& cfg, ScheduleKind schedule, int m, int v,
                       OptimizerConfig::Kind optimizer = OptimizerConfig::Kind::SGD,
                       std::unique_ptr<Communicator> world = nullptr);

// m micro-batches of kMicroBatch rows of a global batch of m * kMicroBatch rows (micro-batch i: rows
// [i * B, (i + 1) * B)).
std::vector<MicroBatch> micro_batches_of(const GlobalBatch& g, int m);

// The schedules as the papers define them (README "GPipe", "1F1B", "Interleaved 1F1B" and "Zero bubble"), for
// stage s of p: written here, not taken from the learner's functions.
std::vector<Action> expected_schedule(ScheduleKind kind, int p, int m, int v, int s);

// The sums of m micro-batches' gradients in another order than one forward of the global batch: rounding.
// Measured relative to each tensor's largest entry on pp_config (p 2 and 4, every schedule): at most
// 8.3e-7, so the bound leaves a factor above 10. A wrong factor (a missing 1/m, a gradient lost at a stage
// boundary, the tied embedding's other half missing) is order 1.
constexpr double kGradRtol = 1e-5;

// ---------------------------------------------------------------------------------------------
// Check bodies shared by the 2- and 4-rank programs; they assert through grading::all_ranks and return
// what they measured.

// For each case: one train_step (SGD, lr 0: the gradients alone) of a pipeline against the dense model's
// gradients of the same global batch, per tensor of every chunk (first differing index), the loss, and the
// order the stage ran against expected_schedule.
struct ScheduleCase {
  ScheduleKind kind;
  int m;
  int v;
};
std::string expect_gradients_match_dense(const std::vector<ScheduleCase>& cases);
// The allocator's peak of category Activations during one step minus before it equals the bytes of the
// activation sets the schedule's definition holds at once (each set measured on its chunk).
std::string expect_activation_memory(const std::vector<ScheduleCase>& cases);
// The bubble on the simulated cluster (docs/simulation.md): an H100 per rank, the sim backend over the free
// link (every message costs 0 s) and a uniform compute time that replaces the ops' modelled time (forward
// forward_ms, backward twice that, per stage and micro-batch; core/clock.h UnchargedDeviceWork): the
// formula's assumptions, exactly. The step's window is the formula's: from the first forward's start to the
// last backward's end over all stages (README "Measuring the bubble"); each stage's bubble is
// 1 - its compute / the window, against (p - 1) / (v m + p - 1) within kBubbleTol. Virtual time: the same on
// any machine, however busy, so never skipped.
struct BubbleCase {
  ScheduleCase schedule;
  double forward_ms;
};
// Sums of a few dozen virtual times of 1e2-1e3 ms, each rounded to a double: at most 2.2e-16 measured (p 2
// and 4, every schedule). A schedule that waits where it need not misses by far more (one micro-batch at a
// time: 0.5 against 0.2).
constexpr double kBubbleTol = 1e-9;
// One step of the case on the simulated cluster: every stage's bubble (stage s in slot s, the same on every
// rank) and the window (ms). Collective over all ranks.
std::vector<double> simulated_bubbles(const BubbleCase& bc, double* window_ms);
std::string expect_bubble_matches_formula(const std::vector<BubbleCase>& cases);
// This rank's allocator peak of category Activations during one step of the case (the second: the first
// allocates what persists), minus before it; *leaked: what the step left behind. On the CPU.
int64_t step_activation_peak(const ScheduleCase& sc, int64_t* leaked = nullptr);
// make_layout refuses the bad layouts of this rank count on every rank (and accepts a good one).
std::string expect_bad_layouts_refused();

}  // namespace scalelab::lab06_test
