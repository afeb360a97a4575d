// planner.cpp — lab 09: the planner. Memory per device and predicted step time of a tp x pp x dp layout,
// and the layouts of a cluster ranked by them. Declared in labs/09_planner/planner.h; the lesson is
// labs/09_planner/README.md. Only the code between TODO(lab09-N) BEGIN/END is yours to write. What these
// functions call besides (the layout's checks, shards and links, the words of a plan) is given once, in
// labs/09_planner/layouts.cpp, and compiled into both tracks.
#include "planner.h"

#include <algorithm>  // defines: std::max, std::min, std::stable_sort
#include <cstdint>    // defines: int64_t
#include <vector>     // defines: std::vector

#include "scalelab/core/error.h"   // defines: SL_CHECK_HINT, scalelab::Error, scalelab::NotImplemented
#include "scalelab/core/tensor.h"  // defines: dtype_size
#include "train_step.h"            // defines: lab01::flops_per_token, lab01::mfu (lab 01's reference)

namespace scalelab::lab09 {

inline namespace SL_TRACK_LAB09 {

// =============================================================================================
// Memory
// =============================================================================================
int activation_sets(const Layout& x, int stage) {
  // TODO(lab09-1) BEGIN  the sets a stage holds at its peak, for each schedule
  //   How many micro-batches' activations the stage keeps alive at its fullest moment, under each
  //   schedule lab 06 runs. README.md#activation-sets-in-flight
  throw scalelab::NotImplemented("lab09-1 activation_sets");
  // TODO(lab09-1) END
  return 0;
}

DeviceMemory stage_memory(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w) {
  DeviceMemory d;
  d.stage = stage;
  // TODO(lab09-2) BEGIN  this stage's model state and activations, chunk by chunk
  //   The stage's bytes at its peak: each chunk's model state as lab 04 shards it over dp (or, for a
  //   LoRA fine-tune, the frozen base and the adapters' state) and the activation sets it holds, with
  //   their scratch, in the policy's activation dtype. README.md#memory-per-device
  throw scalelab::NotImplemented("lab09-2 stage_memory");
  // TODO(lab09-2) END
  return d;
}

// =============================================================================================
// Time
// =============================================================================================
StageFlops stage_flops(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w) {
  StageFlops f;
  // TODO(lab09-3) BEGIN  one micro-batch's forward, backward and recompute FLOPs on one device of the stage
  //   What one micro-batch costs the stage in FLOPs, in lab 01's convention, split by tp: forward,
  //   backward and the recompute. README.md#compute
  throw scalelab::NotImplemented("lab09-3 stage_flops");
  // TODO(lab09-3) END
  return f;
}

StageComm stage_comm(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  StageComm c;
  [[maybe_unused]] const int n = x.tp;
  // BT: the token rows of a micro-batch; act: the bytes of one (B, T, C) activation
  [[maybe_unused]] const int64_t BT = int64_t{x.micro_batch} * w.seq_len, act = BT * cfg.n_embd * w.activation_bytes;
  // TODO(lab09-4) BEGIN  tp and pp per micro-batch on one device of the stage
  //   The seconds one micro-batch spends in the tensor-parallel collectives of this stage and in its
  //   pipeline sends, each call priced by its group's link. README.md#communication
  throw scalelab::NotImplemented("lab09-4 stage_comm");
  // TODO(lab09-4) END
  return c;
}

double dp_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  double t = 0;
  [[maybe_unused]] const int n = x.dp;
  // bytes an element on the wire: Br of the gradients, Bp of the parameters
  [[maybe_unused]] const int64_t Br = dtype_size(w.policy.reduce_dtype), Bp = dtype_size(w.policy.param_dtype);
  // TODO(lab09-4) BEGIN  after the last backward: dp's sync per the ZeRO stage, wte's, sp's layernorms'
  //   The seconds the step spends after its last backward synchronising this stage's gradients: over dp
  //   as its ZeRO stage does, the tied embedding's between the first and last stage, and the layernorms'
  //   over tp when the rows were split (sequence parallel).
  //   README.md#communication
  throw scalelab::NotImplemented("lab09-4 dp_seconds");
  // TODO(lab09-4) END
  return t;
}

StepTime step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  StepTime t;
  [[maybe_unused]] const GroupLinks links = group_links(c, x);
  [[maybe_unused]] const double F = c.flops_per_s();  // FLOP/s sustained
  // TODO(lab09-5) BEGIN  the slowest slot, the schedule and its bubble, dp, the optimizer; tokens/s, MFU, HFU
  //   The step as the schedule runs it: the slowest stage's slot sets the pace, the bubble, dp, the
  //   optimizer's pass over memory; then tokens/s, MFU and HFU. README.md#the-step
  throw scalelab::NotImplemented("lab09-5 step_time");
  // TODO(lab09-5) END
  return t;
}

// =============================================================================================
// The plan
// =============================================================================================
std::vector<Candidate> plan(const GPTConfig& cfg, const Workload& w, const Cluster& c) {
  check_plan_inputs(cfg, w, c);  // given (layouts.cpp): a model, a cluster with compute, a batch
  std::vector<Candidate> rows;
  // TODO(lab09-6) BEGIN  every layout, refused with its reason or predicted; the fitting ones first, fastest first
  //   Every layout of the cluster for this workload, each predicted or refused with its reason, the
  //   fitting ones ranked. README.md#the-plan
  throw scalelab::NotImplemented("lab09-6 plan");
  // TODO(lab09-6) END
  return rows;
}

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
