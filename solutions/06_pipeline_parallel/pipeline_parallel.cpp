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
  const int L = cfg.n_layer;
  SL_CHECK_HINT(p >= 1 && stage >= 0 && stage < p, "run one stage per rank (mpirun -np P)", "stage %d of %d stages",
                stage, p);
  SL_CHECK_HINT(m >= 1, "--micro-batches is at least 1", "--micro-batches %d", m);
  SL_CHECK_HINT(v >= 1, "--chunks is at least 1", "--chunks %d", v);
  SL_CHECK_HINT(p <= L, "every stage needs at least one layer: fewer ranks, or a deeper model",
                "%d stages for a model of %d layers", p, L);
  SL_CHECK_HINT(v == 1 || schedule == ScheduleKind::Interleaved, "--chunks > 1 needs --schedule interleaved",
                "--chunks %d with --schedule %s", v, schedule_name(schedule));
  if (schedule == ScheduleKind::Interleaved) {
    SL_CHECK_HINT(p >= 2, "the interleaved schedule needs at least 2 stages (mpirun -np 2 or more)",
                  "--schedule interleaved with %d stage", p);
    SL_CHECK_HINT(m % p == 0,
                  "the interleaved schedule sends micro-batches round the ranks in groups of p: "
                  "use --micro-batches a multiple of the number of stages",
                  "--micro-batches %d with %d stages", m, p);
    SL_CHECK_HINT(L % (p * v) == 0,
                  "every chunk must hold the same number of layers: L divisible by stages x "
                  "chunks (another --chunks, or another model)",
                  "%d layers over %d stages x %d chunks", L, p, v);
  }
  l.p = p;
  l.v = v;
  l.m = m;
  l.schedule = schedule;
  l.stage = stage;
  // TODO(lab06-1) END
  return l;
}

ModelShard chunk_shard(const GPTConfig& cfg, const PipelineLayout& layout, int chunk) {
  ModelShard s;
  // TODO(lab06-1) BEGIN  the layers of virtual stage chunk * p + stage, and which one has the embedding / head
  const int n = layout.p * layout.v;
  const int vs = chunk * layout.p + layout.stage;
  const int base = cfg.n_layer / n, extra = cfg.n_layer % n;  // the first `extra` virtual stages: one more
  s.first_layer = vs * base + std::min(vs, extra);
  s.last_layer = s.first_layer + base + (vs < extra ? 1 : 0) - 1;
  s.has_embedding = vs == 0;
  s.has_head = vs == n - 1;
  // TODO(lab06-1) END
  return s;
}

// =============================================================================================
// Schedules
// =============================================================================================
std::vector<Action> gpipe_schedule(int p, int m, int stage) {
  std::vector<Action> a;
  // TODO(lab06-3) BEGIN  every forward, then every backward
  (void)p;
  (void)stage;
  for (int i = 0; i < m; ++i) a.push_back({Action::Forward, i, 0});
  for (int i = 0; i < m; ++i) a.push_back({Action::Backward, i, 0});
  // TODO(lab06-3) END
  return a;
}

std::vector<Action> one_f_one_b_schedule(int p, int m, int stage) {
  std::vector<Action> a;
  // TODO(lab06-4) BEGIN  warm-up, steady 1F1B, cool-down
  // The first backward can start only once micro-batch 0 has reached the last stage: stage s runs the
  // forwards that fill the pipeline below it (p - s - 1) before its first backward.
  const int warmup = std::min(p - stage - 1, m);
  for (int i = 0; i < warmup; ++i) a.push_back({Action::Forward, i, 0});
  for (int i = 0; i < m - warmup; ++i) {
    a.push_back({Action::Forward, warmup + i, 0});
    a.push_back({Action::Backward, i, 0});
  }
  for (int i = m - warmup; i < m; ++i) a.push_back({Action::Backward, i, 0});
  // TODO(lab06-4) END
  return a;
}

std::vector<Action> interleaved_schedule(int p, int m, int v, int stage) {
  std::vector<Action> a;
  // TODO(lab06-5) BEGIN  interleaved 1F1B over this rank's m * v (micro-batch, chunk) units of work
  // The k-th forward of a rank: groups of p micro-batches go through chunk 0, then the same group through
  // chunk 1, ...; backwards in the same order with the chunks reversed (Megatron-LM's get_model_chunk_id).
  const int total = m * v;
  auto forward = [&](int k) { return Action{Action::Forward, (k / (p * v)) * p + k % p, (k % (p * v)) / p}; };
  auto backward = [&](int k) { return Action{Action::Backward, (k / (p * v)) * p + k % p, v - 1 - (k % (p * v)) / p}; };
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) a.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    a.push_back(forward(warmup + k));
    a.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) a.push_back(backward(k));
  // TODO(lab06-5) END
  return a;
}

std::vector<Action> zb_h1_schedule(int p, int m, int stage) {
  std::vector<Action> a;
  // TODO(lab06-9) BEGIN  1F1B's forwards and input gradients, each weight gradient held back to fill the bubble
  // Forwards and I in 1F1B's order: I leaves as early as 1F1B's whole backward would have, W later. The
  // last stage's first I reaches stage s after p - 1 - s more I's, and in 1F1B stage s would idle that long
  // in the cool-down; W's held back fill it: stage s runs W k - s after I k (its first s W's wait), and the
  // s held back close the schedule. Activations alive: 1F1B's p - s plus s awaiting W, p on every stage.
  const int warmup = std::min(p - stage - 1, m);
  for (int i = 0; i < warmup; ++i) a.push_back({Action::Forward, i, 0});
  for (int k = 0; k < m; ++k) {
    if (warmup + k < m) a.push_back({Action::Forward, warmup + k, 0});
    a.push_back({Action::BackwardInput, k, 0});
    if (k >= stage) a.push_back({Action::BackwardWeight, k - stage, 0});
  }
  for (int k = std::max(m - stage, 0); k < m; ++k) a.push_back({Action::BackwardWeight, k, 0});
  // TODO(lab06-9) END
  return a;
}

// =============================================================================================
// The exchange between neighbouring stages
// =============================================================================================
bool StageExchange::is_first(int chunk) const {
  // TODO(lab06-2) BEGIN  virtual stage 0?
  return chunk == 0 && layout_.stage == 0;
  // TODO(lab06-2) END
}

bool StageExchange::is_last(int chunk) const {
  // TODO(lab06-2) BEGIN  the last virtual stage?
  return chunk == layout_.v - 1 && layout_.stage == layout_.p - 1;
  // TODO(lab06-2) END
}

// Virtual stage c * p + s: its neighbours are one virtual stage up and down, which wraps round the ranks
// (the last rank's chunk c feeds the first rank's chunk c + 1).
void StageExchange::recv_activation(Tensor& x, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  from the previous virtual stage: which rank, which of its chunks, which channel
  const int prev = (layout_.stage + layout_.p - 1) % layout_.p;
  const int prev_chunk = layout_.stage == 0 ? chunk - 1 : chunk;
  activations_.recv(x, prev, tag("activation", micro_batch, prev_chunk));
  // TODO(lab06-2) END
}

void StageExchange::send_activation(const Tensor& y, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  to the next virtual stage, without waiting for it
  const int next = (layout_.stage + 1) % layout_.p;
  post_send(activations_, y, next, tag("activation", micro_batch, chunk));
  // TODO(lab06-2) END
}

void StageExchange::recv_gradient(Tensor& dy, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  from the next virtual stage, on the gradients' channel
  const int next = (layout_.stage + 1) % layout_.p;
  const int next_chunk = layout_.stage == layout_.p - 1 ? chunk + 1 : chunk;
  gradients_->recv(dy, next, tag("gradient", micro_batch, next_chunk));
  // TODO(lab06-2) END
}

void StageExchange::send_gradient(const Tensor& dx, int micro_batch, int chunk) {
  // TODO(lab06-2) BEGIN  to the previous virtual stage, without waiting for it
  const int prev = (layout_.stage + layout_.p - 1) % layout_.p;
  post_send(*gradients_, dx, prev, tag("gradient", micro_batch, chunk));
  // TODO(lab06-2) END
}

// =============================================================================================
// The executor
// =============================================================================================
float run_schedule(Stage& stage, StageExchange& exchange, const std::vector<Action>& actions,
                   const std::vector<MicroBatch>& micro_batches) {
  float loss_sum = 0.0f;
  // TODO(lab06-6) BEGIN  every action of the schedule: its input, its compute, its output
  SL_CHECK(!micro_batches.empty(), "run_schedule: no micro-batches");
  const int B = static_cast<int>(micro_batches[0].inputs.size(0));
  const int T = static_cast<int>(micro_batches[0].inputs.size(1));
  const int C = stage.chunk(0).config().n_embd;
  const Device device = micro_batches[0].inputs.device();
  auto stream = [&] { return Tensor::empty({B, T, C}, DType::F32, device, MemCategory::Workspace); };  // (B,T,C)
  std::map<std::pair<int, int>, GPT2Activations> in_flight;  // (micro-batch, chunk) -> its activations
  for (const Action& a : actions) {
    const int c = a.chunk, i = a.micro_batch;
    const MicroBatch& mb = micro_batches.at(i);
    if (a.kind == Action::Forward) {
      GPT2Activations& acts = in_flight[{i, c}] = stage.chunk(c).make_activations(B, T);
      Tensor x;
      if (!exchange.is_first(c)) {
        x = stream();
        exchange.recv_activation(x, i, c);
      }
      const bool last = exchange.is_last(c);
      const float loss = stage.forward(c, i, acts, exchange.is_first(c) ? mb.inputs : x, last ? &mb.targets : nullptr);
      if (last) loss_sum += loss;
      else exchange.send_activation(acts.output(), i, c);
    } else if (a.kind == Action::BackwardWeight) {  // a split backward's second half: W, then the set is done
      auto it = in_flight.find({i, c});
      SL_CHECK(it != in_flight.end(), "W of micro-batch %d, chunk %d before its forward", i, c);
      stage.backward_weight(c, i, it->second);
      in_flight.erase(it);
    } else {  // a whole backward (B), or a split one's first half (I): the input gradient goes upstream now
      auto it = in_flight.find({i, c});
      SL_CHECK(it != in_flight.end(), "backward of micro-batch %d, chunk %d before its forward", i, c);
      Tensor dy, dx;
      if (!exchange.is_last(c)) {
        dy = stream();
        exchange.recv_gradient(dy, i, c);
      }
      if (!exchange.is_first(c)) dx = stream();
      const Tensor* d_output = exchange.is_last(c) ? nullptr : &dy;
      Tensor* d_input = exchange.is_first(c) ? nullptr : &dx;
      if (a.kind == Action::BackwardInput) stage.backward_input(c, i, it->second, d_output, d_input);
      else stage.backward(c, i, it->second, d_output, d_input);
      if (a.kind == Action::Backward) in_flight.erase(it);  // this micro-batch's activations are done with
      if (!exchange.is_first(c)) exchange.send_gradient(dx, i, c);
    }
  }
  exchange.wait_sends();
  // TODO(lab06-6) END
  return loss_sum;
}

// =============================================================================================
// The tied embedding
// =============================================================================================
void sync_tied_embedding(Stage& stage, Communicator* embedding) {
  // TODO(lab06-7) BEGIN  the first and the last stage's copies of wte stay one parameter
  if (embedding == nullptr || embedding->size() == 1) return;  // a middle stage, or p = 1: one wte
  const PipelineLayout& l = stage.layout();
  // The first stage's wte is in chunk 0, the last stage's copy in its last chunk.
  GPT2& model = l.stage == 0 ? stage.chunk(0) : stage.chunk(l.v - 1);
  Tensor dwte = model.grad("wte");
  embedding->all_reduce(dwte, ReduceOp::Sum, "tied wte");
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
  const PipelineLayout& l = stage.layout();
  const int m = static_cast<int>(micro_batches.size());
  SL_CHECK_HINT(m == l.m, "give the layout's micro-batches", "%d micro-batches for a layout of m = %d", m, l.m);
  for (int c = 0; c < stage.num_chunks(); ++c) stage.chunk(c).zero_grad();
  const float loss_sum = run_schedule(stage, exchange, schedule_for(l), micro_batches);
  for (int c = 0; c < stage.num_chunks(); ++c) {
    GPT2& model = stage.chunk(c);
    for (int u = 0; u < model.num_units(); ++u)
      if (model.owns_unit(u)) scale_(model.unit_grads(u), 1.0f / static_cast<float>(m));
  }
  sync_tied_embedding(stage, embedding);

  // The norm of the whole model: every chunk here, then every stage (the tied copy counted once).
  // Two host values, (sum of squares, loss), in one all-reduce; the loss is the last stage's (0 elsewhere).
  double sq = 0.0;
  for (int c = 0; c < stage.num_chunks(); ++c) sq += grad_sum_squares(stage.chunk(c));
  const float loss = exchange.is_last(l.v - 1) ? loss_sum / static_cast<float>(m) : 0.0f;
  const std::vector<float> both = all_reduce_values(exchange.group(), std::vector<float>{static_cast<float>(sq), loss},
                                                    ReduceOp::Sum, "grad norm and loss");
  r.grad_norm = std::sqrt(both[0]);
  r.loss = both[1];
  const float scale = grad_clip / (r.grad_norm + 1e-6f);
  SL_CHECK_HINT(std::isfinite(r.grad_norm), "lower the learning rate, or look for a bad batch",
                "gradient norm is %g (not finite)", r.grad_norm);
  for (int c = 0; c < stage.num_chunks(); ++c) {
    GPT2& model = stage.chunk(c);
    if (grad_clip > 0.0f && scale < 1.0f)
      for (int u = 0; u < model.num_units(); ++u)
        if (model.owns_unit(u)) scale_(model.unit_grads(u), scale);
    optimizers.at(c)->step(lr);
  }
  // TODO(lab06-8) END
  return r;
}

}  // namespace SL_TRACK_LAB06
}  // namespace scalelab::lab06
