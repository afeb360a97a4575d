// pipeline_stage.cpp — lab 06's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the Stage (one rank's chunks, timed, with the uniform compute of the bubble
// measurements), the StageExchange's channels, tags and sends, the schedules' names, the schedule a layout
// runs, the bubble formula and the forward-only loss. Declared in labs/06_pipeline_parallel/pipeline_parallel.h.
// It calls the TODO functions of its own track: yours in labs/06_pipeline_parallel/pipeline_parallel.cpp, the
// reference's in solutions/06_pipeline_parallel/pipeline_parallel.cpp.
#include "pipeline_parallel.h"

#include <functional>  // defines: std::function
#include <optional>    // defines: std::optional (the uniform time's scope)
#include <string>      // defines: std::string, std::to_string
#include <utility>     // defines: std::move

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value (the eval loss, any backend)
#include "scalelab/core/clock.h"  // defines: clock_pause_ms (the uniform compute: a sleep, or virtual time), UnchargedDeviceWork
#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT

namespace scalelab::lab06 {
inline namespace SL_TRACK_LAB06 {

// =============================================================================================
// The schedules' names
// =============================================================================================
const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZbH1: return "zb-h1";
  }
  return "?";
}

ScheduleKind schedule_from_name(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved, ScheduleKind::ZbH1})
    if (name == schedule_name(k)) return k;
  SL_CHECK_HINT(false, "--schedule is gpipe, 1f1b, interleaved or zb-h1", "unknown schedule '%s'", name.c_str());
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
// The schedule a layout runs, and its bubble
// =============================================================================================
std::vector<Action> schedule_for(const PipelineLayout& l) {
  switch (l.schedule) {
    case ScheduleKind::GPipe: return gpipe_schedule(l.p, l.m, l.stage);
    case ScheduleKind::OneFOneB: return one_f_one_b_schedule(l.p, l.m, l.stage);
    case ScheduleKind::Interleaved: return interleaved_schedule(l.p, l.m, l.v, l.stage);
    case ScheduleKind::ZbH1: return zb_h1_schedule(l.p, l.m, l.stage);
  }
  return {};
}

double bubble_formula(const PipelineLayout& l) {
  // ZB-H1: (p - 1)(T_F + T_B - T_W) / (m (T_F + T_B + T_W) + (p - 1)(T_F + T_B - T_W)), T_F = T_B = T_W
  if (l.schedule == ScheduleKind::ZbH1) return static_cast<double>(l.p - 1) / static_cast<double>(3 * l.m + l.p - 1);
  return static_cast<double>(l.p - 1) / static_cast<double>(l.v * l.m + l.p - 1);
}

// =============================================================================================
// The stage: one rank's chunks, each action timed
// =============================================================================================
Stage::Stage(std::vector<GPT2*> chunks, const PipelineLayout& layout) : chunks_(std::move(chunks)), layout_(layout) {
  SL_CHECK(static_cast<int>(chunks_.size()) == layout.v, "Stage: %zu models for %d chunks", chunks_.size(), layout.v);
}

GPT2& Stage::chunk(int c) {
  SL_CHECK(c >= 0 && c < num_chunks(), "Stage::chunk(%d): this rank holds chunks 0..%d", c, num_chunks() - 1);
  return *chunks_[c];
}

// Runs `compute` as action `a`: timed, and with a uniform time (uniform_ms > 0) as long as that exactly.
void Stage::run_timed(const Action& a, double uniform_ms, const std::function<void()>& compute) {
  const double t0 = Communicator::now_ms(), w0 = inside_wait_ms();
  {
    std::optional<UnchargedDeviceWork> replaced;  // a uniform time replaces the ops' charges (simulated GPU)
    if (uniform_ms > 0) replaced.emplace();
    compute();
  }
  record(a, t0, uniform_ms > 0 ? uniform_ms + inside_wait_ms() - w0 : 0.0);
}

float Stage::forward(int c, int micro_batch, GPT2Activations& acts, const Tensor& input, const Tensor* targets) {
  float loss = 0.0f;
  run_timed({Action::Forward, micro_batch, c}, forward_ms_, [&] { loss = chunk(c).forward(acts, input, targets); });
  return loss;
}

void Stage::backward(int c, int micro_batch, GPT2Activations& acts, const Tensor* d_output, Tensor* d_input) {
  run_timed({Action::Backward, micro_batch, c}, backward_ms_, [&] { chunk(c).backward(acts, d_output, d_input); });
}

// A split backward's halves take half of the backward's uniform time each (T_B = T_W: bubble_formula).
void Stage::backward_input(int c, int micro_batch, GPT2Activations& acts, const Tensor* d_output, Tensor* d_input) {
  run_timed({Action::BackwardInput, micro_batch, c}, backward_ms_ / 2,
            [&] { chunk(c).backward_input(acts, d_output, d_input); });
}

void Stage::backward_weight(int c, int micro_batch, GPT2Activations& acts) {
  run_timed({Action::BackwardWeight, micro_batch, c}, backward_ms_ / 2, [&] { chunk(c).backward_weight(acts); });
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
  if (left_ms > 0) clock_pause_ms(left_ms);  // real time: a sleep; the simulated GPU: its compute stream waits
  else if (minimum_ms > 0) ++overruns_;      // the compute alone took longer than the uniform time
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
// The exchange between neighbouring stages: its channels, its tags, its sends
// =============================================================================================
StageExchange::StageExchange(Communicator& pp_group, const PipelineLayout& layout)
    : activations_(pp_group),
      gradients_(pp_group.split(0, pp_group.rank(), pp_group.name() + " gradients")),
      layout_(layout) {
  SL_CHECK(pp_group.size() == layout.p, "StageExchange: a pipeline group of %d ranks for %d stages", pp_group.size(),
           layout.p);
}

std::string StageExchange::tag(const char* kind, int micro_batch, int chunk) {
  return std::string(kind) + " mb " + std::to_string(micro_batch) + " chunk " + std::to_string(chunk);
}

void StageExchange::post_send(Communicator& channel, const Tensor& t, int peer, const std::string& tag) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device(), MemCategory::Workspace);
  {
    // The copy lets the caller free t at once; a GPU pipeline sends t itself and keeps it until the send
    // completes (Megatron-LM's p2p_communication), so on the simulated GPU it costs no time: a message
    // costs what the link model says, nothing more.
    UnchargedDeviceWork staging;
    copy.copy_from(t);
  }
  WorkPtr work = channel.send_async(copy, peer, tag);
  sends_.emplace_back(std::move(copy), std::move(work));
}

void StageExchange::wait_sends() {
  for (auto& [copy, work] : sends_) work->wait();
  sends_.clear();
}

// =============================================================================================
// Forward only: the loss of one batch through the whole pipeline
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
