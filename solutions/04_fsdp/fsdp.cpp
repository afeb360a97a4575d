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
