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
  if (s.offload != Offload::None) finish_params_upload(s, unit);  // part 3: the shard's new values first
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
  if (s.offload != Offload::None) return offload_optimizer_step(s, lr);  // part 3: the update on the host
  // TODO(lab04-8) BEGIN  update this rank's shard of every unit, then share the new parameters
  //   Done when: every real element of this rank's shards took one AdamW (or SGD) step with its own
  //   parameter's weight decay, and every unit kept gathered holds the new parameters on every rank.
  //   The idea: README "The update". Hints, one tier at a time: scripts/hint 04-8
  throw scalelab::NotImplemented("lab04-8 optimizer_step");
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
  throw scalelab::NotImplemented("lab04-10 offload_optimizer_state");
  // TODO(lab04-10) END
}

void offload_optimizer_step(FsdpState& s, float lr) {
  // TODO(lab04-11) BEGIN  gradients down, AdamW on the host, parameters up
  //   Done when: the update equals optimizer_step's bit for bit, made on the host's master with the
  //   gradients copied down, and the new parameters are on their way up: waited for at once for the units
  //   kept gathered (then all-gathered) and without overlap, left in flight for ZeRO-3's blocks.
  //   The idea: README "Part 3: offload". Hints, one tier at a time: scripts/hint 04-11
  throw scalelab::NotImplemented("lab04-11 offload_optimizer_step");
  // TODO(lab04-11) END
}

void finish_params_upload(FsdpState& s, int unit) {
  // TODO(lab04-12) BEGIN  before a unit is used: its new parameters have arrived
  //   Done when: the unit's param_shard holds the values the last update sent up (nothing in flight).
  //   The idea: README "Part 3: offload". Hints, one tier at a time: scripts/hint 04-12
  throw scalelab::NotImplemented("lab04-12 finish_params_upload");
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
  throw scalelab::NotImplemented("lab04-9 train_step");
  // TODO(lab04-9) END
  return r;
}

}  // namespace SL_TRACK_LAB04
}  // namespace scalelab::lab04
