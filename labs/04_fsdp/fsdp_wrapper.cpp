// fsdp_wrapper.cpp — lab 04's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the FSDP class (the sharded model built one unit at a time, the four hooks that call
// your functions, zero_grad and the ZeRO-1 reduce-scatter), the stages' and offload's names, the units'
// order and the collectives' tags. Declared in labs/04_fsdp/fsdp.h. It calls the TODO functions of its own track: yours
// in labs/04_fsdp/fsdp.cpp, the reference's in solutions/04_fsdp/fsdp.cpp.
#include "fsdp.h"

#include <cstdint>  // defines: int64_t
#include <string>   // defines: std::string, std::to_string
#include <vector>   // defines: std::vector

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT, SL_FAIL
#include "scalelab/ops/ops.h"     // defines: cast

namespace scalelab::lab04 {
inline namespace SL_TRACK_LAB04 {

// =============================================================================================
// The stages' names, the units' order, shard_layout's arguments, the collectives' tags
// =============================================================================================
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

Offload offload_from_name(const std::string& name) {
  if (name == "none") return Offload::None;
  if (name == "optimizer") return Offload::Optimizer;
  SL_FAIL("use --offload none or optimizer (the fp32 master shard, AdamW's moments and the update on the host)",
          "unknown offload '%s'", name.c_str());
}

const char* offload_name(Offload offload) { return offload == Offload::Optimizer ? "optimizer" : "none"; }

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

void check_shard_args(int64_t numel, int rank, int world_size) {
  SL_CHECK(numel >= 1 && world_size >= 1 && rank >= 0 && rank < world_size,
           "shard_layout(numel=%lld, rank=%d, world_size=%d): need numel >= 1 and 0 <= rank < world_size",
           static_cast<long long>(numel), rank, world_size);
}

std::string gather_tag(int unit) { return "gather unit " + std::to_string(unit); }
std::string reduce_scatter_tag(int unit) { return "reduce_scatter unit " + std::to_string(unit); }

// =============================================================================================
// FSDP: builds the sharded model and installs the hooks
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
      state_{model_, comm, options.stage,   options.optimizer, options.overlap ? options.prefetch : 0, 0,
             {},     {},   options.offload, options.overlap} {
  SL_CHECK_HINT(options.prefetch >= 0, "use --prefetch 0 (no prefetch) or more", "prefetch %d < 0", options.prefetch);
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
    if (options.offload != Offload::None) continue;  // the optimizer state goes to the host below (lab04-10)
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
  if (options.offload == Offload::Optimizer) offload_optimizer_state(state_);  // YOUR TODO lab04-10

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
    reduce_scatter_grads_async(s, u);         // YOUR TODO lab04-5
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
  while (!state_.reduce_scatters_in_flight.empty())
    finish_reduce_scatter(state_, state_.reduce_scatters_in_flight.front());
}

void FSDP::reduce_scatter_all() {
  for (int u = 0; u < state_.num_units(); ++u) reduce_scatter_grads_async(state_, u);
  finish_backward();
}

Tensor FSDP::gather_unit_f32(int unit) {
  if (state_.offload != Offload::None) finish_params_upload(state_, unit);  // the shard's new values first
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
