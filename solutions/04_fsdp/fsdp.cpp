// fsdp.cpp — lab 04: ZeRO-1, 2 and 3 (FSDP): shard the optimizer state, the gradients and the
// parameters of data-parallel training over N ranks. Declared in labs/04_fsdp/fsdp.h; the lesson is
// labs/04_fsdp/README.md. Only the code between TODO(lab04-N) BEGIN/END is yours to write. The FSDP class
// that builds the shards and installs the hooks calling these functions is given once, in
// labs/04_fsdp/fsdp_wrapper.cpp, and compiled into both tracks.
#include "fsdp.h"

#include <algorithm>  // defines: std::min, std::max, std::find
#include <cmath>      // defines: std::sqrt, std::isfinite
#include <cstdint>    // defines: int64_t
#include <vector>     // defines: std::vector

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value
#include "scalelab/core/error.h"        // defines: SL_CHECK, SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/core/host_copy.h"    // defines: copy_async (part 3)
#include "scalelab/ops/ops.h"           // defines: adamw_update, sgd_update, sum_squares, scale_, add_, cast

namespace scalelab::lab04 {
inline namespace SL_TRACK_LAB04 {

// =============================================================================================
// Shards and padding
// =============================================================================================
ShardLayout shard_layout(int64_t numel, int rank, int world_size) {
  check_shard_args(numel, rank, world_size);  // given (fsdp_wrapper.cpp): numel >= 1, 0 <= rank < world_size
  ShardLayout l;
  // TODO(lab04-1) BEGIN  this rank's chunk of a unit padded to equal chunks
  //   Done when: every field of ShardLayout (fsdp.h) is set as README "Shards and padding" defines it,
  //   for any numel >= 1 and any world size (also when this rank owns only padding).
  //   Hints, one tier at a time: scripts/hint 04-1
  l.numel = numel;
  l.shard = (numel + world_size - 1) / world_size;
  l.padded = l.shard * world_size;
  l.begin = static_cast<int64_t>(rank) * l.shard;
  l.owned = std::max<int64_t>(0, std::min(l.shard, numel - l.begin));
  // TODO(lab04-1) END
  return l;
}

// =============================================================================================
// ZeRO-3: gather a unit's parameters before use, free them after
// =============================================================================================
void gather_params_async(FsdpState& s, int unit) {
  UnitShard& us = s.units.at(unit);
  SL_CHECK(!us.full_params.defined(), "gather_params_async: unit %d is already gathered", unit);
  if (s.offload != Offload::None) finish_params_upload(s, unit);  // part 3: the shard's new values first
  // TODO(lab04-2) BEGIN  ZeRO-3: start gathering one unit's parameters, asynchronously
  //   Done when: once us.gather completes, us.full_params (the padded unit, in the parameter dtype,
  //   category Params) holds every rank's shard in its place; nothing was waited for.
  //   The idea: README "ZeRO-3". Hints, one tier at a time: scripts/hint 04-2
  const ShardLayout& l = us.layout;
  us.full_params = Tensor::empty({l.padded}, s.model.policy().param_dtype, s.model.device(), MemCategory::Params);
  Tensor mine = us.full_params.view(l.begin, {l.shard});
  mine.copy_from(us.param_shard);
  us.gather = s.comm.all_gather_async(mine, us.full_params, gather_tag(unit));
  // TODO(lab04-2) END
}

void use_params(FsdpState& s, int unit, const std::vector<int>& order) {
  // TODO(lab04-3) BEGIN  before a block computes: its parameters installed, the next ones on the way
  //   Done when: the model's parameters of `unit` are the gathered ones (never the padding), and the
  //   gathers of the next s.prefetch blocks of `order` are in flight: never more, never one twice.
  //   The idea: README "ZeRO-3" and "Prefetch". Hints, one tier at a time: scripts/hint 04-3
  UnitShard& us = s.units.at(unit);
  if (!us.full_params.defined()) gather_params_async(s, unit);
  if (us.gather) {
    us.gather->wait();
    us.gather = nullptr;
  }
  s.model.unit_params(unit) = us.full_params.view(0, {us.layout.numel});
  auto it = std::find(order.begin(), order.end(), unit);
  int ahead = 0;  // sharded units after this one, gathered or being gathered
  for (++it; it != order.end() && ahead < s.prefetch; ++it) {
    UnitShard& next = s.units.at(*it);
    if (next.keep_gathered) continue;
    if (!next.full_params.defined()) gather_params_async(s, *it);
    ++ahead;
  }
  // TODO(lab04-3) END
}

void release_params(FsdpState& s, int unit) {
  // TODO(lab04-4) BEGIN  after a block computed: only the shard stays
  //   Done when: no Tensor refers to the gathered copy any more, so its bytes are freed.
  //   The idea: README "ZeRO-3". Hints, one tier at a time: scripts/hint 04-4
  s.model.unit_params(unit) = Tensor();
  s.units.at(unit).full_params = Tensor();
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
  us.rs_out = Tensor::empty({us.layout.shard}, DType::F32, s.model.device(), MemCategory::Comm);
  us.reduce_scatter = s.comm.reduce_scatter_async(us.full_grads, us.rs_out, ReduceOp::Avg, reduce_scatter_tag(unit));
  s.reduce_scatters_in_flight.push_back(unit);
  // TODO(lab04-5) END
}

void finish_reduce_scatter(FsdpState& s, int unit) {
  UnitShard& us = s.units.at(unit);
  SL_CHECK(us.reduce_scatter != nullptr, "finish_reduce_scatter: unit %d has no reduce-scatter in flight", unit);
  // TODO(lab04-6) BEGIN  finish a reduce-scatter: the shard holds its share, the full gradient goes
  //   Done when: grad_shard holds the step's averaged gradient so far (ZeRO-1: reduced once per step;
  //   ZeRO-2/3: once per micro-step), and every buffer this stage no longer needs is freed.
  //   The idea: README "Reduce-scatter". Hints, one tier at a time: scripts/hint 04-6
  us.reduce_scatter->wait();
  us.reduce_scatter = nullptr;
  if (s.stage == ZeroStage::Zero1) {
    us.grad_shard.copy_from(us.rs_out);
  } else {
    add_(us.grad_shard, us.rs_out);
  }
  us.rs_out = Tensor();
  if (s.stage != ZeroStage::Zero1) {
    us.full_grads = Tensor();
    s.model.unit_grads(unit) = Tensor();
  }
  auto& q = s.reduce_scatters_in_flight;
  q.erase(std::find(q.begin(), q.end(), unit));
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
  double local = 0.0;
  for (const UnitShard& us : s.units) local += sum_squares(us.grad_shard);
  // One number from every rank, summed: a host value, staged through the communicator's device.
  norm = std::sqrt(all_reduce_value(s.comm, static_cast<float>(local), ReduceOp::Sum, "grad norm"));
  if (max_norm > 0.0f) {
    const float scale = max_norm / (norm + 1e-6f);
    if (scale < 1.0f)
      for (UnitShard& us : s.units) scale_(us.grad_shard, scale);
  }
  // TODO(lab04-7) END
  SL_CHECK_HINT(std::isfinite(norm), "lower the learning rate, or look for a bad batch",
                "gradient norm is %g (not finite)", norm);
  return norm;
}

void optimizer_step(FsdpState& s, float lr) {
  if (s.offload != Offload::None) return offload_optimizer_step(s, lr);  // part 3: the update on the host
  // TODO(lab04-8) BEGIN  update this rank's shard of every unit, then share the new parameters
  //   Done when: every real element of this rank's shards took one AdamW (or SGD) step with its own
  //   parameter's weight decay, and every unit kept gathered holds the new parameters on every rank.
  //   The idea: README "The update". Hints, one tier at a time: scripts/hint 04-8
  const OptimizerConfig& o = s.optimizer;
  const std::vector<ParamInfo>& table = s.model.param_table();
  const int64_t t = ++s.optimizer_steps;
  for (int u = 0; u < s.num_units(); ++u) {
    UnitShard& us = s.units[u];
    const ShardLayout& l = us.layout;
    Tensor weights = us.master.defined() ? us.master : us.param_shard;  // fp32 (shard,)
    for (const ParamInfo& p : table) {
      if (p.unit != u) continue;
      const int64_t lo = std::max(p.offset, l.begin), hi = std::min(p.offset + p.numel, l.begin + l.owned);
      if (lo >= hi) continue;  // this parameter lies outside our shard
      Tensor w = weights.view(lo - l.begin, {hi - lo});
      const Tensor g = us.grad_shard.view(lo - l.begin, {hi - lo});
      const float wd = p.decay ? o.weight_decay : 0.0f;
      if (o.kind == OptimizerConfig::Kind::AdamW) {
        Tensor m = us.m.view(lo - l.begin, {hi - lo}), v = us.v.view(lo - l.begin, {hi - lo});
        adamw_update(w, g, m, v, lr, o.beta1, o.beta2, o.eps, wd, t);
      } else {
        sgd_update(w, g, lr, wd);
      }
    }
    if (us.master.defined()) cast(us.param_shard, us.master);
    if (us.keep_gathered) s.comm.all_gather(us.param_shard, us.full_params, gather_tag(u));
  }
  // TODO(lab04-8) END
}

// =============================================================================================
// Part 3: offload the optimizer state and its update to the host
// =============================================================================================
void offload_optimizer_state(FsdpState& s) {
  // TODO(lab04-10) BEGIN  the fp32 master shard and AdamW's moments in host memory
  //   Done when: every unit's master (fp32, the device's parameter values), m and v (AdamW, zeros),
  //   host_grads and (bf16) host_params are (shard,) host tensors (Device::CPU, MemPlace::Host), and the
  //   device holds no optimizer state.
  //   The idea: README "Part 3: offload". Hints, one tier at a time: scripts/hint 04-10
  const DType pdt = s.model.policy().param_dtype;
  const bool adamw = s.optimizer.kind == OptimizerConfig::Kind::AdamW;
  for (UnitShard& us : s.units) {
    const int64_t n = us.layout.shard;
    const auto host = [n](DType dtype, MemCategory category) {  // (shard,) zeros in host memory
      return Tensor::zeros({n}, dtype, Device::CPU, category, MemPlace::Host);
    };
    us.master = host(DType::F32, MemCategory::OptimizerState);
    if (adamw) {
      us.m = host(DType::F32, MemCategory::OptimizerState);
      us.v = host(DType::F32, MemCategory::OptimizerState);
    }
    us.host_grads = host(DType::F32, MemCategory::Grads);
    if (pdt != DType::F32) us.host_params = host(pdt, MemCategory::Params);
    // master := the device's (rounded) parameters: down in their own dtype, widened to fp32 on the host
    Tensor down = us.host_params.defined() ? us.host_params : us.master;
    down.copy_from(us.param_shard);
    if (us.host_params.defined()) cast(us.master, us.host_params);
  }
  // TODO(lab04-10) END
}

void offload_optimizer_step(FsdpState& s, float lr) {
  // TODO(lab04-11) BEGIN  gradients down, AdamW on the host, parameters up
  //   Done when: the update equals optimizer_step's bit for bit, made on the host's master with the
  //   gradients copied down, and the new parameters are on their way up: waited for at once for the units
  //   kept gathered (then all-gathered) and without overlap, left in flight for ZeRO-3's blocks.
  //   The idea: README "Part 3: offload". Hints, one tier at a time: scripts/hint 04-11
  const OptimizerConfig& o = s.optimizer;
  const std::vector<ParamInfo>& table = s.model.param_table();
  const int64_t t = ++s.optimizer_steps;
  // The units kept gathered first: their parameters are needed in this call (the all-gather below), the
  // blocks' only at their next use. Each copy stream runs its copies in the order they were launched.
  std::vector<int> order;
  for (int u = 0; u < s.num_units(); ++u)
    if (s.units[u].keep_gathered) order.push_back(u);
  for (int u = 0; u < s.num_units(); ++u)
    if (!s.units[u].keep_gathered) order.push_back(u);
  // Every gradient shard down at once: the copies queue on the copy stream behind the backward's compute.
  for (int u : order) s.units[u].grads_down = copy_async(s.units[u].host_grads, s.units[u].grad_shard);
  for (int u : order) {
    UnitShard& us = s.units[u];
    const ShardLayout& l = us.layout;
    us.grads_down->wait();  // this unit's gradient is on the host
    us.grads_down = nullptr;
    for (const ParamInfo& p : table) {  // the host's update, on the fp32 master
      if (p.unit != u) continue;
      const int64_t lo = std::max(p.offset, l.begin), hi = std::min(p.offset + p.numel, l.begin + l.owned);
      if (lo >= hi) continue;  // this parameter lies outside our shard
      Tensor w = us.master.view(lo - l.begin, {hi - lo});
      const Tensor g = us.host_grads.view(lo - l.begin, {hi - lo});
      const float wd = p.decay ? o.weight_decay : 0.0f;
      if (o.kind == OptimizerConfig::Kind::AdamW) {
        Tensor m = us.m.view(lo - l.begin, {hi - lo}), v = us.v.view(lo - l.begin, {hi - lo});
        adamw_update(w, g, m, v, lr, o.beta1, o.beta2, o.eps, wd, t);
      } else {
        sgd_update(w, g, lr, wd);
      }
    }
    Tensor up = us.master;  // fp32 parameters go up as they are; bf16 ones rounded on the host first
    if (us.host_params.defined()) {
      cast(us.host_params, us.master);
      up = us.host_params;
    }
    us.params_up = copy_async(us.param_shard, up);
    if (us.keep_gathered || !s.overlap) {  // needed now (the all-gather below), or no overlap asked for
      us.params_up->wait();
      us.params_up = nullptr;
    }
    if (us.keep_gathered) s.comm.all_gather(us.param_shard, us.full_params, gather_tag(u));
  }
  // TODO(lab04-11) END
}

void finish_params_upload(FsdpState& s, int unit) {
  // TODO(lab04-12) BEGIN  before a unit is used: its new parameters have arrived
  //   Done when: the unit's param_shard holds the values the last update sent up (nothing in flight).
  //   The idea: README "Part 3: offload". Hints, one tier at a time: scripts/hint 04-12
  UnitShard& us = s.units.at(unit);
  if (us.params_up) {
    us.params_up->wait();
    us.params_up = nullptr;
  }
  // TODO(lab04-12) END
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
  FsdpState& s = fsdp.state();
  GPT2& model = fsdp.model();
  const int m = static_cast<int>(micro_batches.size());
  fsdp.zero_grad();
  double loss_sum = 0.0;
  for (const MicroBatch& mb : micro_batches) {
    loss_sum += model.forward(mb.inputs, &mb.targets);
    model.backward();
    if (s.stage != ZeroStage::Zero1) fsdp.finish_backward();
  }
  if (s.stage == ZeroStage::Zero1) fsdp.reduce_scatter_all();
  if (m > 1)
    for (UnitShard& us : s.units) scale_(us.grad_shard, 1.0f / static_cast<float>(m));
  r.loss = static_cast<float>(loss_sum / m);
  r.grad_norm = clip_grad_norm_sharded(s, grad_clip);
  optimizer_step(s, lr);
  // TODO(lab04-9) END
  return r;
}

}  // namespace SL_TRACK_LAB04
}  // namespace scalelab::lab04
