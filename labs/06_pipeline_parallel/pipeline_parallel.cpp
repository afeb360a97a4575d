// pipeline_parallel.cpp — lab 06: pipeline parallelism. The model cut across layers into stages on ranks,
// micro-batches flowing through them under four schedules: GPipe (Huang et al. 2019), 1F1B and interleaved
// 1F1B (Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2), ZB-H1 (Qi et al. 2024, arXiv:2401.10241). Declared in labs/06_pipeline_parallel/
// pipeline_parallel.h; the lesson is labs/06_pipeline_parallel/README.md. Only the code between
// TODO(lab06-N) BEGIN/END is yours to write. The Stage, the exchange's channels and sends, and the names of
// the schedules are given once, in labs/06_pipeline_parallel/pipeline_stage.cpp, compiled into both tracks.
#include "pipeline_parallel.h"

#include <algorithm>  // defines: std::min, std::max
#include <cmath>      // defines: std::sqrt, std::isfinite
#include <map>        // defines: std::map
#include <utility>    // defines: std::pair
#include <vector>     // defines: std::vector

#include "scalelab/comm/host_values.h"  // defines: all_reduce_values
#include "scalelab/core/error.h"        // defines: SL_CHECK, SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/ops/ops.h"           // defines: scale_

namespace scalelab::lab06 {
inline namespace SL_TRACK_LAB06 {

// =============================================================================================
// The partition
// =============================================================================================
PipelineLayout make_layout(const GPTConfig& cfg, int p, int stage, ScheduleKind schedule, int m, int v) {
  PipelineLayout l;
  // TODO(lab06-1) BEGIN  the layout, or a clear error on every rank
  //   Every layout that cannot run, refused with the numbers and what to change, before any message:
  //   a stage without layers, a schedule given chunks it cannot use, an interleaved pipeline whose micro-batches
  //   or layers do not divide. README.md#the-partition
  throw scalelab::NotImplemented("lab06-1 make_layout");
  // TODO(lab06-1) END
  return l;
}

ModelShard chunk_shard(const GPTConfig& cfg, const PipelineLayout& layout, int chunk) {
  ModelShard s;
  // TODO(lab06-1) BEGIN  the layers of virtual stage chunk * p + stage, and which one has the embedding / head
  //   Virtual stage chunk * p + stage of p * v: its contiguous, balanced run of layers, and whether it is the
  //   one with the embedding or the one with the head. README.md#the-partition
  throw scalelab::NotImplemented("lab06-1 chunk_shard");
  // TODO(lab06-1) END
  return s;
}

// =============================================================================================
// Schedules
// =============================================================================================
std::vector<Action> gpipe_schedule(int p, int m, int stage) {
  std::vector<Action> a;
  // TODO(lab06-3) BEGIN  every forward, then every backward
  //   Stage `stage` of p, m micro-batches: the order GPipe runs them in. README.md#gpipe
  throw scalelab::NotImplemented("lab06-3 gpipe_schedule");
  // TODO(lab06-3) END
  return a;
}

std::vector<Action> one_f_one_b_schedule(int p, int m, int stage) {
  std::vector<Action> a;
  // TODO(lab06-4) BEGIN  warm-up, steady 1F1B, cool-down
  //   How many forwards must stage `stage` run before its first backward can arrive? Then alternate,
  //   then drain. README.md#1f1b
  throw scalelab::NotImplemented("lab06-4 one_f_one_b_schedule");
  // TODO(lab06-4) END
  return a;
}

std::vector<Action> interleaved_schedule(int p, int m, int v, int stage) {
  std::vector<Action> a;
  // TODO(lab06-5) BEGIN  interleaved 1F1B over this rank's m * v (micro-batch, chunk) units of work
  //   1F1B over the m * v (micro-batch, chunk) pairs of this rank: which pair is the k-th forward and
  //   the k-th backward, and how long the warm-up must be. README.md#interleaved-1f1b
  throw scalelab::NotImplemented("lab06-5 interleaved_schedule");
  // TODO(lab06-5) END
  return a;
}

std::vector<Action> zb_h1_schedule(int p, int m, int stage) {
  std::vector<Action> a;
  // TODO(lab06-9) BEGIN  1F1B's forwards and input gradients, each weight gradient held back to fill the bubble
  //   Start from your 1F1B with every backward split into I and W. Which W's can wait, how long, and what
  //   bounds the activations stage `stage` then holds? README.md#zero-bubble
  throw scalelab::NotImplemented("lab06-9 zb_h1_schedule");
  // TODO(lab06-9) END
  return a;
}

// =============================================================================================
// The exchange between neighbouring stages
// =============================================================================================
bool StageExchange::is_first(int chunk) const {
  // TODO(lab06-2) BEGIN  virtual stage 0?
  //   Is chunk `chunk` of this rank virtual stage 0? README.md#the-exchange
  throw scalelab::NotImplemented("lab06-2 is_first");
  // TODO(lab06-2) END
}

bool StageExchange::is_last(int chunk) const {
  // TODO(lab06-2) BEGIN  the last virtual stage?
  //   Is chunk `chunk` of this rank the last virtual stage? README.md#the-exchange
  throw scalelab::NotImplemented("lab06-2 is_last");
  // TODO(lab06-2) END
}

// Virtual stage c * p + s: its neighbours are one virtual stage up and down, which wraps round the ranks
// (the last rank's chunk c feeds the first rank's chunk c + 1).
void StageExchange::recv_activation(Tensor& x, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  from the previous virtual stage: which rank, which of its chunks, which channel
  //   Which rank, and which of its chunks, sent this input? Which channel carries activations?
  //   README.md#the-exchange
  throw scalelab::NotImplemented("lab06-2 recv_activation");
  // TODO(lab06-2) END
}

void StageExchange::send_activation(const Tensor& y, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  to the next virtual stage, without waiting for it
  //   To the next virtual stage, without waiting for it to arrive (post_send). README.md#the-exchange
  throw scalelab::NotImplemented("lab06-2 send_activation");
  // TODO(lab06-2) END
}

void StageExchange::recv_gradient(Tensor& dy, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  from the next virtual stage, on the gradients' channel
  //   Which rank, and which of its chunks, computed the gradient of this output? On which channel?
  //   README.md#the-exchange
  throw scalelab::NotImplemented("lab06-2 recv_gradient");
  // TODO(lab06-2) END
}

void StageExchange::send_gradient(const Tensor& dx, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  to the previous virtual stage, without waiting for it
  //   To the previous virtual stage, without waiting (post_send). README.md#the-exchange
  throw scalelab::NotImplemented("lab06-2 send_gradient");
  // TODO(lab06-2) END
}

// =============================================================================================
// The executor
// =============================================================================================
float run_schedule(Stage& stage, StageExchange& exchange, const std::vector<Action>& actions,
                   const std::vector<MicroBatch>& micro_batches) {
  float loss_sum = 0.0f;
  // TODO(lab06-6) BEGIN  every action of the schedule: its input, its compute, its output
  //   For each action in order: a forward needs its input (tokens or a message), an activation set that
  //   lives until its backward, and sends its output on; a backward needs the gradient of its output (or the
  //   loss), frees its set and sends the gradient of its input back. A split backward (ZB-H1): I is that
  //   backward without freeing the set, W (stage.backward_weight) frees it. Nothing left in flight at the end.
  //   README.md#the-executor
  throw scalelab::NotImplemented("lab06-6 run_schedule");
  // TODO(lab06-6) END
  return loss_sum;
}

// =============================================================================================
// The tied embedding
// =============================================================================================
void sync_tied_embedding(Stage& stage, Communicator* embedding) {
  // TODO(lab06-7) BEGIN  the first and the last stage's copies of wte stay one parameter
  //   Which rank holds which copy of wte, and what must both copies' gradients become?
  //   README.md#the-tied-embedding
  throw scalelab::NotImplemented("lab06-7 sync_tied_embedding");
  // TODO(lab06-7) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(Stage& stage, StageExchange& exchange, Communicator* embedding,
                      std::vector<std::unique_ptr<Optimizer>>& optimizers, const std::vector<MicroBatch>& micro_batches,
                      float lr, float grad_clip) {
  StepResult r;
  // TODO(lab06-8) BEGIN  one optimizer step of the whole pipeline
  //   Done when: every chunk took one step of its optimizer on the gradient of the global batch's mean loss,
  //   clipped on the norm of the WHOLE model (every stage's part), and r holds that loss and the norm before
  //   clipping, the same on every stage. README.md#one-training-step
  throw scalelab::NotImplemented("lab06-8 train_step");
  // TODO(lab06-8) END
  return r;
}

}  // namespace SL_TRACK_LAB06
}  // namespace scalelab::lab06
