// pipeline_parallel.h — what the learner writes in lab 06 (pipeline parallel), declared once for both tracks.
//   labs/06_pipeline_parallel/pipeline_parallel.cpp       the learner's file (TODO blocks)   -> lab06_learner
//   solutions/06_pipeline_parallel/pipeline_parallel.cpp  the reference (same file, filled)  -> lab06_ref
//   labs/06_pipeline_parallel/pipeline_stage.cpp          the given code (Stage, the exchange's sends, the
//                                                         schedules' names): compiled into both libraries
// The two tracks live in distinct inline namespaces (scalelab::lab06::learner / ::ref) chosen by
// SL_TRACK_LAB06, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/06_pipeline_parallel/README.md   Graded tests: tests/lab06/ (test_lab06*.cpp)
//
// The model (common/include/scalelab/model/gpt2.h) already knows how to be cut across layers: built for a
// ModelShard with first_layer..last_layer, has_embedding and has_head, it holds only those units (the last
// stage keeps its own copy of wte for the tied head), its forward(acts, input, targets) takes tokens or the
// hidden state (B, T, C) entering the stage and leaves the hidden state leaving it in acts.output(), its
// backward(acts, d_output, d_input) takes the gradient of that output and returns the gradient of the input,
// and the activation sets belong to the caller. This lab puts the stages on ranks and runs them:
//   partition          which layers each stage (and each of its chunks) owns                    TODO lab06-1
//   exchange           activations to the next stage, gradients to the previous one              TODO lab06-2
//   GPipe              all m forwards, then all m backwards (Huang et al. 2019)                  TODO lab06-3
//   1F1B               warm-up forwards, one forward one backward, cool-down backwards           TODO lab06-4
//   interleaved 1F1B   v model chunks per rank (Narayanan et al. 2021, Sec. 2.2.2)               TODO lab06-5
//   the executor       one rank's schedule, run: each action's input, compute and output        TODO lab06-6
//   tied embedding     the first and the last stage's copies of wte kept equal                   TODO lab06-7
//   the training step  one optimizer step of a pipeline                                          TODO lab06-8
//   ZB-H1              1F1B with each backward split into B and W, W filling the bubble
//                      (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1)          TODO lab06-9
// (README.md#the-picture draws each schedule as a stage x time grid.)
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"        // defines: Communicator, WorkPtr
#include "scalelab/measure/metrics.h"  // defines: TimeSpan
#include "scalelab/model/batch.h"      // defines: MicroBatch, StepResult
#include "scalelab/model/gpt2.h"       // defines: GPT2, GPT2Activations, GPTConfig, ModelShard
#include "scalelab/model/optim.h"      // defines: Optimizer

#ifndef SL_TRACK_LAB06
#define SL_TRACK_LAB06 ref
#endif

namespace scalelab::lab06 {
inline namespace SL_TRACK_LAB06 {

// ---------------------------------------------------------------------------------------------
// The layout

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZbH1 };
const char* schedule_name(ScheduleKind kind);  // "gpipe", "1f1b", "interleaved", "zb-h1"
// "gpipe", "1f1b", "interleaved" or "zb-h1"; throws scalelab::Error naming the accepted values otherwise.
ScheduleKind schedule_from_name(const std::string& name);

// A pipeline of p stages, one per rank of the pipeline group. Each rank holds v model chunks (v = 1 except
// for the interleaved schedule): chunk c of stage s is VIRTUAL stage c * p + s of the p * v, so the layers
// go round the ranks v times (Narayanan et al. 2021, Fig. 4). One optimizer step runs m micro-batches.
struct PipelineLayout {
  int p = 1;  // stages: ranks of the pipeline group
  int v = 1;  // model chunks per rank
  int m = 1;  // micro-batches per optimizer step
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int stage = 0;  // this rank's stage, 0 .. p-1 (its rank in the pipeline group)
};

// TODO(lab06-1): the layout of a lab 06 run on p ranks, or a clear error (scalelab::Error with the numbers
// and what to change) thrown alike on every rank before any communication for every layout that cannot
// run: a stage without layers, a schedule given chunks it cannot use, an interleaved pipeline whose
// micro-batches or layers do not divide evenly (README.md#the-partition names the rules).
PipelineLayout make_layout(const GPTConfig& cfg, int p, int stage, ScheduleKind schedule, int m, int v);
// TODO(lab06-1): the shard of chunk `chunk` of this rank (layout.stage): virtual stage c * p + s of n = p * v.
// Contract: the n virtual stages, in order, hold every layer exactly once, each a contiguous run, their
// sizes as equal as L allows (as README.md#the-partition deals out the remainder); virtual stage 0 has
// the embedding, virtual stage n - 1 the final layernorm and the LM head.
ModelShard chunk_shard(const GPTConfig& cfg, const PipelineLayout& layout, int chunk);

// ---------------------------------------------------------------------------------------------
// Schedules: what one stage runs in one optimizer step, in order

// One forward or backward of one micro-batch (0 .. m-1) on one of this rank's chunks (0 .. v-1). A backward
// is whole (B: GPipe, 1F1B, interleaved) or split in two (ZB-H1): I, the input gradient, which the previous
// stage waits for, then later W, the weight gradients, which only the optimizer needs (PyTorch's
// torch.distributed.pipelining names them F, I, W and B alike).
struct Action {
  enum Kind : char { Forward = 'F', Backward = 'B', BackwardInput = 'I', BackwardWeight = 'W' };
  Kind kind = Forward;
  int micro_batch = 0;
  int chunk = 0;
  bool operator==(const Action& o) const { return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk; }
};
// "F3" (chunk 0) or "F3.1" (chunk 1); a list: "F0 F1 B0 F2 B1 B2", or split: "F0 F1 I0 W0 F2 I1 W1".
std::string to_string(const Action& a);
std::string to_string(const std::vector<Action>& actions);

// TODO(lab06-3): GPipe (Huang et al. 2019, arXiv:1811.06965): the forwards of micro-batches 0 .. m-1, then
// their backwards, on stage `stage` of p. README.md#gpipe
std::vector<Action> gpipe_schedule(int p, int m, int stage);
// TODO(lab06-4): 1F1B (PipeDream-Flush, Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2): a warm-up of
// forwards, a steady phase alternating one forward and one backward, a cool-down of backwards. The same
// work as GPipe, in an order that holds fewer micro-batches' activations at once. README.md#1f1b
std::vector<Action> one_f_one_b_schedule(int p, int m, int stage);
// TODO(lab06-5): interleaved 1F1B (same paper, Sec. 2.2.2) with v chunks per rank; m a multiple of p.
// README.md#interleaved-1f1b
std::vector<Action> interleaved_schedule(int p, int m, int v, int stage);
// TODO(lab06-9): ZB-H1 (Qi et al. 2024, arXiv:2401.10241, Sec. 3.1, Fig. 3): 1F1B's forwards and input
// gradients (I) in 1F1B's order, each micro-batch's weight gradient (W) run later to fill the bubble: stage s
// holds back s of them, so every stage keeps at most p micro-batches' activations, what 1F1B's first stage
// keeps. m >= p. README.md#zero-bubble
std::vector<Action> zb_h1_schedule(int p, int m, int stage);
// Given: the schedule of this rank for a layout (one of the four above).
std::vector<Action> schedule_for(const PipelineLayout& layout);
// Given: the bubble's share of the step when every micro-batch takes the same time on every stage
// (Narayanan et al. 2021, Sec. 2.2; docs/references.md "Pipelines"): the bubble is (p - 1) / v of one
// micro-batch's time per stage against m micro-batches of work, so (p - 1) / (v * m + p - 1) of the step
// (GPipe and 1F1B: v = 1). ZB-H1 (Qi et al. 2024, Sec. 3.1): the bubble is (p - 1)(T_F + T_B - T_W) against
// m (T_F + T_B + T_W) of work, T_B the input gradient's time and T_W the weight gradient's; the uniform
// compute of Stage runs the backward's two halves as T_B = T_W = backward_ms / 2 = T_F (backward twice the
// forward), so (p - 1) / (3 m + p - 1) of the step: a third of 1F1B's bubble time. For m >= p.
double bubble_formula(const PipelineLayout& layout);

// ---------------------------------------------------------------------------------------------
// Given: one rank's part of the pipeline as the executor sees it

// The chunks this rank holds (v models, chunk 0 first), and a record of what ran. forward and backward run
// the chunk's model (GPT2::forward / backward with caller-owned activations) and record the Action and its
// time span, so the tests and the timeline see the order a stage really ran. With a uniform compute time
// (set_uniform_compute), each one then waits until its start plus that time (a sleep). On the simulated GPU
// the uniform time REPLACES the ops' modelled time: they charge nothing (core/clock.h UnchargedDeviceWork)
// and the compute stream advances by exactly the uniform time, nothing sleeps. Every micro-batch takes the
// same time on every stage, whatever the model, the cores or the other ranks on them do, which is what
// the bubble formula assumes (README.md#measuring-the-bubble).
class Stage {
 public:
  // chunks: this rank's models, one per chunk (not owned; they outlive the stage).
  Stage(std::vector<GPT2*> chunks, const PipelineLayout& layout);
  const PipelineLayout& layout() const { return layout_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  GPT2& chunk(int c);  // throws for c outside 0 .. v-1

  // model(c).forward(acts, input, targets), recorded as Action{Forward, micro_batch, c}. Returns its loss
  // (NaN unless the chunk has the head and targets were given).
  float forward(int c, int micro_batch, GPT2Activations& acts, const Tensor& input, const Tensor* targets);
  // model(c).backward(acts, d_output, d_input), recorded as Action{Backward, micro_batch, c}.
  void backward(int c, int micro_batch, GPT2Activations& acts, const Tensor* d_output, Tensor* d_input);
  // The backward in two parts (gpt2.h): model(c).backward_input(acts, d_output, d_input), recorded as
  // Action{BackwardInput, ...}; later model(c).backward_weight(acts), recorded as Action{BackwardWeight, ...},
  // which frees the set. With a uniform compute time each part takes half of backward_ms.
  void backward_input(int c, int micro_batch, GPT2Activations& acts, const Tensor* d_output, Tensor* d_input);
  void backward_weight(int c, int micro_batch, GPT2Activations& acts);

  // Every forward of a chunk takes at least forward_ms, every backward backward_ms (ms; 0: as long as the
  // compute takes); on the simulated GPU exactly that long. Throws for negative values. `inside` (optional; lab 07 passes its tensor-parallel
  // group): a communicator whose collectives run INSIDE a chunk's forward and backward; the time they kept
  // the chunk waiting (their events' wait_ms) is communication, so it is added to the uniform time instead
  // of being absorbed by it. It must outlive the stage; its events are read, never cleared, here.
  void set_uniform_compute(double forward_ms, double backward_ms, Communicator* inside = nullptr);
  // Since the last clear() (the caller's: the driver and the checks clear before each step): the actions
  // in the order they ran, their spans (names "F3.1", on Communicator::now_ms's clock), the total time
  // inside them (ms), and how many took longer than the uniform time (their compute alone did: raise it).
  const std::vector<Action>& ran() const { return ran_; }
  const std::vector<TimeSpan>& spans() const { return spans_; }
  double compute_ms() const { return compute_ms_; }
  int overruns() const { return overruns_; }
  void clear();

 private:
  void run_timed(const Action& a, double uniform_ms, const std::function<void()>& compute);
  void record(const Action& a, double start_ms, double minimum_ms);
  double inside_wait_ms() const;  // the wait_ms of inside_'s events so far (0 without it)
  std::vector<GPT2*> chunks_;
  PipelineLayout layout_;
  double forward_ms_ = 0, backward_ms_ = 0;
  Communicator* inside_ = nullptr;
  std::vector<Action> ran_;
  std::vector<TimeSpan> spans_;
  double compute_ms_ = 0;
  int overruns_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The exchange between neighbouring stages

// Activations travel to the next virtual stage, gradients to the previous one, over the pipeline group.
// They use two channels: the group itself for activations and a duplicate of it (made here: collective
// over the group) for gradients, so a rank that both sends activations to and receives gradients from a
// neighbour (every rank with p = 2, interleaved) never matches one kind of message with the other (both
// are (B, T, C) fp32). A recv blocks; a send is asynchronous (the sender goes on computing) and completes
// at wait_sends() at the latest. Every message carries a tag naming it ("activation mb 3 chunk 0"), which
// the event log shows and a timed-out wait reports.
class StageExchange {
 public:
  // pp_group: the pipeline group (rank = stage, size = p); the layout says v. Collective over pp_group.
  StageExchange(Communicator& pp_group, const PipelineLayout& layout);
  Communicator& group() { return activations_; }            // the activations' channel (the pipeline group)
  Communicator& gradient_channel() { return *gradients_; }  // the gradients' one
  const PipelineLayout& layout() const { return layout_; }

  // TODO(lab06-2): where chunk `chunk` of this rank sits in the pipeline. README.md#the-exchange
  bool is_first(int chunk) const;  // virtual stage 0: its input is the tokens
  bool is_last(int chunk) const;   // the last virtual stage: it computes the loss
  // TODO(lab06-2): the four messages of micro-batch `micro_batch` at chunk `chunk` of this rank, each with its
  // neighbour in the virtual pipeline (a rank and a chunk). x, dy: (B, T, C) fp32, filled (blocking);
  // y, dx: (B, T, C) fp32, sent (asynchronous: post_send). README.md#the-exchange
  void recv_activation(Tensor& x, int micro_batch, int chunk);        // from the previous virtual stage
  void send_activation(const Tensor& y, int micro_batch, int chunk);  // to the next
  void recv_gradient(Tensor& dy, int micro_batch, int chunk);         // from the next
  void send_gradient(const Tensor& dx, int micro_batch, int chunk);   // to the previous

  // Given. The tag of a message: "activation mb 3 chunk 0" (kind, micro-batch, the SENDER's chunk).
  static std::string tag(const char* kind, int micro_batch, int chunk);
  // Given. Sends a copy of t (category Workspace, so the activation set t belongs to may be freed at once)
  // to rank `peer` of `channel`, asynchronously; the copy and the pending send are kept until wait_sends().
  // The copy costs no time on the simulated GPU (a GPU pipeline sends t itself).
  void post_send(Communicator& channel, const Tensor& t, int peer, const std::string& tag);
  // Given. Waits for every send posted since the last call and frees their copies.
  void wait_sends();

 private:
  Communicator& activations_;
  std::unique_ptr<Communicator> gradients_;
  PipelineLayout layout_;
  std::vector<std::pair<Tensor, WorkPtr>> sends_;
};

// ---------------------------------------------------------------------------------------------
// Running a schedule, and the training step

// TODO(lab06-6): runs `actions` (this rank's schedule) over the micro-batches (m of them, each (B, T) i32
// inputs and targets; every stage sees the same ones, only the first and the last use them) through
// `stage` and `exchange`, every action through `stage` (which records it). Contract: each micro-batch
// flows forward through every virtual stage and its gradient back; the gradients of the m micro-batches'
// mean losses ADD up (the caller zeroes them and divides by m); an activation set lives from its
// forward to its backward (B), or to its weight gradient (W) when the backward is split, and no longer; a
// split backward's input gradient (I) goes upstream as soon as I has run. Returns the sum of the m losses on a rank whose last chunk is
// the last virtual stage, 0 elsewhere. All sends have completed when it returns. README.md#the-executor
float run_schedule(Stage& stage, StageExchange& exchange, const std::vector<Action>& actions,
                   const std::vector<MicroBatch>& micro_batches);

// TODO(lab06-7): the tied embedding. The first virtual stage's wte (unit 0, "wte") and the last one's copy
// for the LM head (unit L+1, "wte") are one parameter of the dense model. Contract: on return both copies'
// gradients are that dense parameter's gradient, so their optimizer steps keep them equal. `embedding`:
// the group of the first and the last stage (nullptr on a rank that is neither; with p = 1 the one model
// owns wte once and there is nothing to do). README.md#the-tied-embedding
void sync_tied_embedding(Stage& stage, Communicator* embedding);

// TODO(lab06-8): one optimizer step of the pipeline, this rank's schedule (schedule_for) over the m
// micro-batches. Contract: every chunk takes one step of its optimizer (optimizers[c] for chunk c) at lr on
// the gradient of the global batch's mean loss (the dense model's), the tied wte's copies kept equal,
// clipped on the WHOLE model's norm (every chunk of every stage, wte counted once; grad_clip <= 0: none;
// the clipping of scalelab/model/optim.h clip_grad_norm). Returns the loss (the mean over the
// micro-batches) and the norm before clipping, the same on every rank of the pipeline.
// README.md#one-training-step
StepResult train_step(Stage& stage, StageExchange& exchange, Communicator* embedding,
                      std::vector<std::unique_ptr<Optimizer>>& optimizers, const std::vector<MicroBatch>& micro_batches,
                      float lr, float grad_clip);

// Given. The loss of one batch (tokens, targets: (B, T) i32) through the whole pipeline, forward only (no
// activation kept, nothing recorded), the same on every rank: validation and evaluation.
float forward_loss(Stage& stage, StageExchange& exchange, const Tensor& tokens, const Tensor& targets);

}  // namespace SL_TRACK_LAB06
}  // namespace scalelab::lab06
