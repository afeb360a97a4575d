// pipeline_parallel.cpp — lab 06: pipeline parallelism. The model cut across layers into stages on ranks,
// micro-batches flowing through them under three schedules: GPipe (Huang et al. 2019), 1F1B and interleaved
// 1F1B (Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2). Declared in labs/06_pipeline_parallel/
// pipeline_parallel.h; the lesson is labs/06_pipeline_parallel/README.md. Only the code between
// TODO(lab06-N) BEGIN/END is yours to write; the rest is shared by both tracks
// (labs/06_pipeline_parallel/pipeline_parallel.cpp and solutions/06_pipeline_parallel/pipeline_parallel.cpp).
#include "pipeline_parallel.h"

#include <chrono>   // defines: std::chrono::duration
#include <cmath>    // defines: std::sqrt, NAN
#include <map>      // defines: std::map
#include <string>   // defines: std::to_string
#include <thread>   // defines: std::this_thread::sleep_for
#include <utility>  // defines: std::pair

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value (the eval loss, any backend)
#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/ops/ops.h"     // defines: scale_

namespace scalelab::lab06 {
inline namespace SL_TRACK_LAB06 {

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
  }
  return "?";
}

ScheduleKind schedule_from_name(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved})
    if (name == schedule_name(k)) return k;
  SL_CHECK_HINT(false, "--schedule is gpipe, 1f1b or interleaved", "unknown schedule '%s'", name.c_str());
  return ScheduleKind::OneFOneB;
}

std::string to_string(const Action& a) {
  std::string s = std::string(1, static_cast<char>(a.kind)) + std::to_string(a.micro_batch);
  return a.chunk == 0 ? s : s + "." + std::to_string(a.chunk);
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) s += (s.empty() ? "" : " ") + to_string(a);
  return s;
}

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
  // TODO(lab06-5) BEGIN  1F1B over m * v (micro-batch, chunk) pairs, in groups of p micro-batches per chunk
  //   1F1B over the m * v (micro-batch, chunk) pairs of this rank: which pair is the k-th forward and
  //   the k-th backward, and how long the warm-up must be. README.md#interleaved-1f1b
  throw scalelab::NotImplemented("lab06-5 interleaved_schedule");
  // TODO(lab06-5) END
  return a;
}

std::vector<Action> schedule_for(const PipelineLayout& l) {
  switch (l.schedule) {
    case ScheduleKind::GPipe: return gpipe_schedule(l.p, l.m, l.stage);
    case ScheduleKind::OneFOneB: return one_f_one_b_schedule(l.p, l.m, l.stage);
    case ScheduleKind::Interleaved: return interleaved_schedule(l.p, l.m, l.v, l.stage);
  }
  return {};
}

double bubble_formula(const PipelineLayout& l) {
  return static_cast<double>(l.p - 1) / static_cast<double>(l.v * l.m + l.p - 1);
}

// =============================================================================================
// The stage (given)
// =============================================================================================
Stage::Stage(std::vector<GPT2*> chunks, const PipelineLayout& layout) : chunks_(std::move(chunks)), layout_(layout) {
  SL_CHECK(static_cast<int>(chunks_.size()) == layout.v, "Stage: %zu models for %d chunks", chunks_.size(), layout.v);
}

GPT2& Stage::chunk(int c) {
  SL_CHECK(c >= 0 && c < num_chunks(), "Stage::chunk(%d): this rank holds chunks 0..%d", c, num_chunks() - 1);
  return *chunks_[c];
}

float Stage::forward(int c, int micro_batch, GPT2Activations& acts, const Tensor& input, const Tensor* targets) {
  const double t0 = Communicator::now_ms(), w0 = inside_wait_ms();
  const float loss = chunk(c).forward(acts, input, targets);
  record({Action::Forward, micro_batch, c}, t0, forward_ms_ > 0 ? forward_ms_ + inside_wait_ms() - w0 : 0.0);
  return loss;
}

void Stage::backward(int c, int micro_batch, GPT2Activations& acts, const Tensor* d_output, Tensor* d_input) {
  const double t0 = Communicator::now_ms(), w0 = inside_wait_ms();
  chunk(c).backward(acts, d_output, d_input);
  record({Action::Backward, micro_batch, c}, t0, backward_ms_ > 0 ? backward_ms_ + inside_wait_ms() - w0 : 0.0);
}

void Stage::set_uniform_compute(double forward_ms, double backward_ms, Communicator* inside) {
  SL_CHECK_HINT(forward_ms >= 0 && backward_ms >= 0, "give times >= 0 ms (0: as long as the compute takes)",
                "uniform compute %.3f ms forward, %.3f ms backward", forward_ms, backward_ms);
  forward_ms_ = forward_ms;
  backward_ms_ = backward_ms;
  inside_ = inside;
}

double Stage::inside_wait_ms() const {
  if (inside_ == nullptr || (forward_ms_ <= 0 && backward_ms_ <= 0)) return 0.0;
  double ms = 0.0;
  for (const CommEvent& e : inside_->events()) ms += e.wait_ms;
  return ms;
}

void Stage::record(const Action& a, double start_ms, double minimum_ms) {
  const double left_ms = start_ms + minimum_ms - Communicator::now_ms();
  if (left_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(left_ms));
  else if (minimum_ms > 0) ++overruns_;  // the compute alone took longer than the uniform time
  const double end_ms = Communicator::now_ms();
  ran_.push_back(a);
  spans_.push_back({to_string(a), start_ms, end_ms});
  compute_ms_ += end_ms - start_ms;
}

void Stage::clear() {
  ran_.clear();
  spans_.clear();
  compute_ms_ = 0;
  overruns_ = 0;
}

// =============================================================================================
// The exchange between neighbouring stages
// =============================================================================================
StageExchange::StageExchange(Communicator& pp_group, const PipelineLayout& layout)
    : activations_(pp_group), gradients_(pp_group.split(0, pp_group.rank(), pp_group.name() + " gradients")),
      layout_(layout) {
  SL_CHECK(pp_group.size() == layout.p, "StageExchange: a pipeline group of %d ranks for %d stages",
           pp_group.size(), layout.p);
}

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

std::string StageExchange::tag(const char* kind, int micro_batch, int chunk) {
  return std::string(kind) + " mb " + std::to_string(micro_batch) + " chunk " + std::to_string(chunk);
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

void StageExchange::post_send(Communicator& channel, const Tensor& t, int peer, const std::string& tag) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device(), MemCategory::Workspace);
  copy.copy_from(t);
  WorkPtr work = channel.send_async(copy, peer, tag);
  sends_.emplace_back(std::move(copy), std::move(work));
}

void StageExchange::wait_sends() {
  for (auto& [copy, work] : sends_) work->wait();
  sends_.clear();
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
  //   loss), frees its set and sends the gradient of its input back. Nothing left in flight at the end.
  //   README.md#the-executor
  throw scalelab::NotImplemented("lab06-6 run_schedule");
  // TODO(lab06-6) END
  return loss_sum;
}

// =============================================================================================
// The tied embedding
// =============================================================================================
void sync_tied_embedding(Stage& stage, Communicator* embedding) {
  // TODO(lab06-7) BEGIN  both copies of wte's gradient hold their sum
  //   Which rank holds which copy of wte, and what must both copies' gradients become?
  //   README.md#the-tied-embedding
  throw scalelab::NotImplemented("lab06-7 sync_tied_embedding");
  // TODO(lab06-7) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(Stage& stage, StageExchange& exchange, Communicator* embedding,
                      std::vector<std::unique_ptr<Optimizer>>& optimizers,
                      const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  StepResult r;
  // TODO(lab06-8) BEGIN  zero, the schedule, mean over m, tied embedding, clip on the whole model, step
  //   Zero, run the schedule, the mean over m, the tied embedding, the whole model's norm and its clip,
  //   every chunk's step; the loss and the norm the same on every stage. README.md#one-training-step
  throw scalelab::NotImplemented("lab06-8 train_step");
  // TODO(lab06-8) END
  return r;
}

// =============================================================================================
// Forward only (given)
// =============================================================================================
float forward_loss(Stage& stage, StageExchange& exchange, const Tensor& tokens, const Tensor& targets) {
  const PipelineLayout& l = stage.layout();
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  const int C = stage.chunk(0).config().n_embd;
  Tensor x = Tensor::empty({B, T, C}, DType::F32, tokens.device(), MemCategory::Workspace);
  float loss = 0.0f;
  for (int c = 0; c < l.v; ++c) {
    GPT2& model = stage.chunk(c);
    GPT2Activations acts = model.make_activations(B, T);
    if (!exchange.is_first(c)) exchange.recv_activation(x, 0, c);
    const float part = model.forward(acts, exchange.is_first(c) ? tokens : x, exchange.is_last(c) ? &targets : nullptr);
    if (exchange.is_last(c)) loss = part;
    else exchange.send_activation(acts.output(), 0, c);
  }
  exchange.wait_sends();
  return all_reduce_value(exchange.group(), loss, ReduceOp::Sum, "eval loss");  // only the last stage's is not 0
}

}  // namespace SL_TRACK_LAB06
}  // namespace scalelab::lab06
