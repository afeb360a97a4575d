// fsdp.cpp — lab 04: ZeRO-1, 2 and 3 (FSDP): shard the optimizer state, the gradients and the
// parameters of data-parallel training over N ranks. Declared in labs/04_fsdp/fsdp.h; the lesson is
// labs/04_fsdp/README.md. Only the code between TODO(lab04-N) BEGIN/END is yours to write; the rest is
// shared by both tracks (labs/04_fsdp/fsdp.cpp and solutions/04_fsdp/fsdp.cpp).
#include "fsdp.h"

#include <algorithm>  // defines: std::min, std::max, std::find
#include <cmath>      // defines: std::sqrt
#include <cstdint>    // defines: int64_t
#include <string>     // defines: std::string, std::to_string
#include <vector>     // defines: std::vector

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL, scalelab::NotImplemented
#include "scalelab/ops/ops.h"    // defines: adamw_update, sgd_update, sum_squares, scale_, add_, cast

namespace scalelab::lab04 {
inline namespace SL_TRACK_LAB04 {

ZeroStage zero_stage_from_int(int stage) {
  SL_CHECK_HINT(stage >= 1 && stage <= 3,
                "use --stage 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters, FSDP FULL_SHARD)",
                "unknown ZeRO stage %d", stage);
  return static_cast<ZeroStage>(stage);
}

const char* zero_stage_name(ZeroStage stage) {
  switch (stage) {
    case ZeroStage::Zero1: return "ZeRO-1 (optimizer state)";
    case ZeroStage::Zero2: return "ZeRO-2 (optimizer state + gradients)";
    case ZeroStage::Zero3: return "ZeRO-3 (optimizer state + gradients + parameters)";
  }
  return "?";
}

int FsdpState::gathered_count() const {
  int n = 0;
  for (const UnitShard& u : units) n += !u.keep_gathered && u.full_params.defined();
  return n;
}

std::vector<int> unit_order(int num_units, Pass pass) {
  std::vector<int> order;
  if (pass == Pass::Forward) {
    for (int u = 0; u < num_units; ++u) order.push_back(u);
  } else {
    order.push_back(0);  // the tied LM head: unit 0's backward starts first (gpt2.h)
    for (int u = num_units - 1; u >= 1; --u) order.push_back(u);
  }
  return order;
}

std::string gather_tag(int unit) { return "gather unit " + std::to_string(unit); }
std::string reduce_scatter_tag(int unit) { return "reduce_scatter unit " + std::to_string(unit); }

// =============================================================================================
// Shards and padding
// =============================================================================================
ShardLayout shard_layout(int64_t numel, int rank, int world_size) {
  SL_CHECK(numel >= 1 && world_size >= 1 && rank >= 0 && rank < world_size,
           "shard_layout(numel=%lld, rank=%d, world_size=%d): need numel >= 1 and 0 <= rank < world_size",
           static_cast<long long>(numel), rank, world_size);
  ShardLayout l;
  // TODO(lab04-1) BEGIN  this rank's chunk of a unit padded to equal chunks
  //   Done when: every field of ShardLayout (fsdp.h) is set as README "Shards and padding" defines it,
  //   for any numel >= 1 and any world size (also when this rank owns only padding).
  //   Hints, one tier at a time: scripts/hint 04-1
  throw scalelab::NotImplemented("lab04-1 shard_layout");
  // TODO(lab04-1) END
  return l;
}

// =============================================================================================
// ZeRO-3: gather a unit's parameters before use, free them after
// =============================================================================================
void gather_params_async(FsdpState& s, int unit) {
  UnitShard& us = s.units.at(unit);
  SL_CHECK(!us.full_params.defined(), "gather_params_async: unit %d is already gathered", unit);
  // TODO(lab04-2) BEGIN  ZeRO-3: start gathering one unit's parameters, asynchronously
  //   Done when: once us.gather completes, us.full_params (the padded unit, in the parameter dtype,
  //   category Params) holds every rank's shard in its place; nothing was waited for.
  //   The idea: README "ZeRO-3". Hints, one tier at a time: scripts/hint 04-2
  throw scalelab::NotImplemented("lab04-2 gather_params_async");
  // TODO(lab04-2) END
}

void use_params(FsdpState& s, int unit, const std::vector<int>& order) {
  // TODO(lab04-3) BEGIN  before a block computes: its parameters installed, the next ones on the way
  //   Done when: the model's parameters of `unit` are the gathered ones (never the padding), and the
  //   gathers of the next s.prefetch blocks of `order` are in flight: never more, never one twice.
  //   The idea: README "ZeRO-3" and "Prefetch". Hints, one tier at a time: scripts/hint 04-3
  throw scalelab::NotImplemented("lab04-3 use_params");
  // TODO(lab04-3) END
}

void release_params(FsdpState& s, int unit) {
  // TODO(lab04-4) BEGIN  after a block computed: only the shard stays
  //   Done when: no Tensor refers to the gathered copy any more, so its bytes are freed.
  //   The idea: README "ZeRO-3". Hints, one tier at a time: scripts/hint 04-4
  throw scalelab::NotImplemented("lab04-4 release_params");
  // TODO(lab04-4) END
}

// =============================================================================================
// Gradients: each rank receives the averaged shard it owns
// =============================================================================================
void reduce_scatter_grads_async(FsdpState& s, int unit) {
  UnitShard& us = s.units.at(unit);
  SL_CHECK(us.full_grads.defined(), "reduce_scatter_grads_async: unit %d has no full gradient", unit);
  // TODO(lab04-5) BEGIN  launch the averaged reduce-scatter of a unit's gradient
  //   Done when: a reduce-scatter is in flight that leaves in this rank's us.rs_out (fp32, category
  //   Comm) the average over the ranks of this rank's chunk, and the state knows it is in flight.
  //   The idea: README "Reduce-scatter". Hints, one tier at a time: scripts/hint 04-5
  throw scalelab::NotImplemented("lab04-5 reduce_scatter_grads_async");
  // TODO(lab04-5) END
}

void finish_reduce_scatter(FsdpState& s, int unit) {
  UnitShard& us = s.units.at(unit);
  SL_CHECK(us.reduce_scatter != nullptr, "finish_reduce_scatter: unit %d has no reduce-scatter in flight", unit);
  // TODO(lab04-6) BEGIN  finish a reduce-scatter: the shard holds its share, the full gradient goes
  //   Done when: grad_shard holds the step's averaged gradient so far (ZeRO-1: reduced once per step;
  //   ZeRO-2/3: once per micro-step), and every buffer this stage no longer needs is freed.
  //   The idea: README "Reduce-scatter". Hints, one tier at a time: scripts/hint 04-6
  throw scalelab::NotImplemented("lab04-6 finish_reduce_scatter");
  // TODO(lab04-6) END
}

// =============================================================================================
// The update, on this rank's shard only
// =============================================================================================
float clip_grad_norm_sharded(FsdpState& s, float max_norm) {
  float norm = 0.0f;
  // TODO(lab04-7) BEGIN  the global gradient norm from the shards; clip
  //   Done when: `norm` is the L2 norm of the WHOLE model's gradient, the same on every rank, and every
  //   shard was scaled as torch.nn.utils.clip_grad_norm_ scales a gradient when max_norm > 0.
  //   The idea: README "The update". Hints, one tier at a time: scripts/hint 04-7
  throw scalelab::NotImplemented("lab04-7 clip_grad_norm_sharded");
  // TODO(lab04-7) END
  SL_CHECK_HINT(std::isfinite(norm), "lower the learning rate, or look for a bad batch",
                "gradient norm is %g (not finite)", norm);
  return norm;
}

void optimizer_step(FsdpState& s, float lr) {
  // TODO(lab04-8) BEGIN  update this rank's shard of every unit, then share the new parameters
  //   Done when: every real element of this rank's shards took one AdamW (or SGD) step with its own
  //   parameter's weight decay, and every unit kept gathered holds the new parameters on every rank.
  //   The idea: README "The update". Hints, one tier at a time: scripts/hint 04-8
  throw scalelab::NotImplemented("lab04-8 optimizer_step");
  // TODO(lab04-8) END
}

// =============================================================================================
// The training step
// =============================================================================================
StepResult train_step(FSDP& fsdp, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  SL_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  StepResult r;
  // TODO(lab04-9) BEGIN  m micro-steps, the gradients reduce-scattered, one sharded update
  //   Done when: the update is the one a single process makes on the whole global batch, r.loss is the
  //   mean of this rank's micro-batch losses and r.grad_norm the global norm before clipping.
  //   The idea: README "The training step". Hints, one tier at a time: scripts/hint 04-9
  throw scalelab::NotImplemented("lab04-9 train_step");
  // TODO(lab04-9) END
  return r;
}

// =============================================================================================
// FSDP (given)
// =============================================================================================
// dst (any dtype, any device) = src (fp32, CPU), converted; staged through the CPU for a GPU dst.
static void copy_cast(Tensor dst, const Tensor& src) {
  if (dst.device() == Device::CPU) {
    cast(dst, src);
    return;
  }
  Tensor staged = Tensor::empty({src.numel()}, dst.dtype(), Device::CPU, MemCategory::Workspace);
  cast(staged, src);
  dst.copy_from(staged);
}

FSDP::FSDP(const GPTConfig& cfg, const PrecisionPolicy& policy, Device device, uint64_t seed, Communicator& comm,
           const FsdpOptions& options)
    : model_(GPT2::without_storage(cfg, policy, device)),
      state_{model_, comm, options.stage, options.optimizer, options.overlap ? options.prefetch : 0, 0, {}, {}} {
  SL_CHECK_HINT(options.prefetch >= 0, "use --prefetch 0 (no prefetch) or more", "prefetch %d < 0",
                options.prefetch);
  const int U = model_.num_units(), N = comm.size(), rank = comm.rank();
  const DType pdt = policy.param_dtype;
  const bool adamw = options.optimizer.kind == OptimizerConfig::Kind::AdamW;
  const std::vector<int64_t> unit_numel = gpt2_unit_numel(cfg);
  state_.units.resize(U);
  for (int u = 0; u < U; ++u) {
    UnitShard& us = state_.units[u];
    us.layout = shard_layout(unit_numel[u], rank, N);  // YOUR TODO lab04-1
    const ShardLayout& l = us.layout;
    SL_CHECK_HINT(l.numel == unit_numel[u] && l.padded == l.shard * N && l.padded >= l.numel &&
                      l.begin == static_cast<int64_t>(rank) * l.shard,
                  "README 'Shards and padding'",
                  "shard_layout(%lld, rank %d, %d ranks) gave shard %lld, padded %lld, begin %lld",
                  static_cast<long long>(unit_numel[u]), rank, N, static_cast<long long>(l.shard),
                  static_cast<long long>(l.padded), static_cast<long long>(l.begin));
    const bool root = u == 0 || u == U - 1;  // embeddings (+ tied LM head) and ln_f, like FSDP's root unit
    us.keep_gathered = options.stage != ZeroStage::Zero3 || root;
    if (us.keep_gathered) {
      us.full_params = Tensor::zeros({l.padded}, pdt, device, MemCategory::Params);  // padding stays 0
      us.param_shard = us.full_params.view(l.begin, {l.shard});
      model_.unit_params(u) = us.full_params.view(0, {l.numel});
    } else {
      us.param_shard = Tensor::zeros({l.shard}, pdt, device, MemCategory::Params);
    }
    if (options.stage == ZeroStage::Zero1) {
      us.full_grads = Tensor::zeros({l.padded}, DType::F32, device, MemCategory::Grads);
      us.grad_shard = us.full_grads.view(l.begin, {l.shard});
      model_.unit_grads(u) = us.full_grads.view(0, {l.numel});
    } else {
      us.grad_shard = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::Grads);
    }
    if (adamw) {
      us.m = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
      us.v = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
    }
    if (policy.has_master_copy()) us.master = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
  }
  // The 1-rank model's initial weights, one unit at a time: keep our shard (and, for kept units, the
  // whole unit). The master copy starts from the ROUNDED parameters, as Optimizer's does.
  gpt2_initial_weights(cfg, seed, [&](int u, const Tensor& w) {  // w: (numel,) fp32 on the CPU
    UnitShard& us = state_.units[u];
    const ShardLayout& l = us.layout;
    if (us.keep_gathered) {
      copy_cast(model_.unit_params(u), w);
    } else if (l.owned > 0) {
      copy_cast(us.param_shard.view(0, {l.owned}), w.view(l.begin, {l.owned}));
    }
    if (us.master.defined()) cast(us.master, us.param_shard);
  });

  // Hooks: they run inside model.forward / model.backward (gpt2.h gives the order).
  const std::vector<int> forward_order = unit_order(U, Pass::Forward);
  const std::vector<int> backward_order = unit_order(U, Pass::Backward);
  FsdpState& s = state_;
  hooks_.push_back(model_.add_hook(HookPoint::BeforeForward, [&s, forward_order](const UnitHookArgs& a) {
    if (!s.units[a.unit].keep_gathered) use_params(s, a.unit, forward_order);  // YOUR TODO lab04-3
  }));
  hooks_.push_back(model_.add_hook(HookPoint::AfterForward, [&s](const UnitHookArgs& a) {
    if (!s.units[a.unit].keep_gathered) release_params(s, a.unit);  // YOUR TODO lab04-4
  }));
  hooks_.push_back(model_.add_hook(HookPoint::BeforeBackward, [&s, backward_order](const UnitHookArgs& a) {
    UnitShard& us = s.units[a.unit];
    if (s.stage != ZeroStage::Zero1) {  // the full gradient exists only during the unit's backward
      us.full_grads = Tensor::zeros({us.layout.padded}, DType::F32, s.model.device(), MemCategory::Grads);
      a.grads = us.full_grads.view(0, {us.layout.numel});
    }
    if (!us.keep_gathered) use_params(s, a.unit, backward_order);
  }));
  const bool overlap = options.overlap;
  hooks_.push_back(model_.add_hook(HookPoint::AfterBackward, [&s, overlap](const UnitHookArgs& a) {
    const int u = a.unit;
    if (!s.units[u].keep_gathered) release_params(s, u);
    if (s.stage == ZeroStage::Zero1) return;  // ZeRO-1 reduces once per step, after the last micro-step
    reduce_scatter_grads_async(s, u);  // YOUR TODO lab04-5
    // At most one reduce-scatter in flight besides this unit's: the previous unit's full gradient is
    // freed now, so gradient memory stays at 1/N plus about two units (README "Reduce-scatter").
    // Without overlap, wait for this one too: backward stops until it is done.
    const size_t in_flight = overlap ? 1 : 0;
    while (s.reduce_scatters_in_flight.size() > in_flight)
      finish_reduce_scatter(s, s.reduce_scatters_in_flight.front());  // YOUR TODO lab04-6
  }));
}

FSDP::~FSDP() {
  for (UnitShard& us : state_.units) {  // no collective may still write into buffers about to go
    if (us.gather) us.gather->wait();
    if (us.reduce_scatter) us.reduce_scatter->wait();
  }
  hooks_.clear();  // before the state the hooks refer to goes
}

void FSDP::zero_grad() {
  for (UnitShard& us : state_.units) {
    if (state_.stage == ZeroStage::Zero1) us.full_grads.zero_();
    else us.grad_shard.zero_();
  }
}

void FSDP::finish_backward() {
  while (!state_.reduce_scatters_in_flight.empty()) finish_reduce_scatter(state_, state_.reduce_scatters_in_flight.front());
}

void FSDP::reduce_scatter_all() {
  for (int u = 0; u < state_.num_units(); ++u) reduce_scatter_grads_async(state_, u);
  finish_backward();
}

Tensor FSDP::gather_unit_f32(int unit) {
  const UnitShard& us = state_.units.at(unit);
  const ShardLayout& l = us.layout;
  Tensor padded = Tensor::empty({l.padded}, us.param_shard.dtype(), model_.device(), MemCategory::Other);
  Tensor mine = padded.view(l.begin, {l.shard});
  mine.copy_from(us.param_shard);
  state_.comm.all_gather(mine, padded, "check gather unit " + std::to_string(unit));
  Tensor out = Tensor::empty({l.numel}, DType::F32, model_.device(), MemCategory::Other);
  cast(out, padded.view(0, {l.numel}));
  return out;
}

Tensor FSDP::grad_shard_owned(int unit) const {
  const UnitShard& us = state_.units.at(unit);
  return us.grad_shard.view(0, {us.layout.owned});
}

}  // namespace SL_TRACK_LAB04
}  // namespace scalelab::lab04
