// ddp.cpp — lab 03: data-parallel training: start identical, average the gradients (naive, bucketed,
// overlapped with backward), accumulate micro-steps. Declared in labs/03_ddp/ddp.h; the lesson is
// labs/03_ddp/README.md. Only the code between TODO(lab03-N) BEGIN/END is yours to write. The code around
// these functions (GradSync, the bucket buffers, the check of your layout) is given once, in
// labs/03_ddp/grad_sync.cpp, and compiled into both tracks.
#include "ddp.h"

#include <cstdint>  // defines: int64_t
#include <string>   // defines: std::string, std::to_string
#include <vector>   // defines: std::vector

#include "scalelab/core/error.h"   // defines: SL_CHECK, SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/ops/ops.h"      // defines: scale_ (t *= s)
#include "scalelab/model/optim.h"  // defines: clip_grad_norm

namespace scalelab::lab03 {
inline namespace SL_TRACK_LAB03 {

// =============================================================================================
// Start identical
// =============================================================================================
void broadcast_parameters(GPT2& model, Communicator& comm) {
  // TODO(lab03-1) BEGIN  every rank starts from rank 0's parameters
  //   Done when: on every rank every parameter equals rank 0's, bit for bit, with one broadcast per
  //   unit buffer (root 0, tag "params unit <u>"), issued by every rank in the same order.
  //   The idea: README "Start identical". Hints, one tier at a time: scripts/hint 03-1
  for (int u = 0; u < model.num_units(); ++u) {
    comm.broadcast(model.unit_params(u), /*root=*/0, "params unit " + std::to_string(u));
  }
  // TODO(lab03-1) END
}

// =============================================================================================
// Naive: one all-reduce per parameter tensor
// =============================================================================================
void all_reduce_grads_naive(GPT2& model, Communicator& comm) {
  // TODO(lab03-2) BEGIN  naive: every gradient becomes its average over the ranks
  //   Done when: every gradient tensor holds its average over the ranks, with one blocking all-reduce
  //   per parameter tensor, in table order, tagged with the tensor's name.
  //   The idea: README "Naive data parallel: one all-reduce per tensor". Hints, one tier at a time: scripts/hint 03-2
  for (const ParamInfo& p : model.param_table()) {
    Tensor g = model.grad(p.name);
    comm.all_reduce(g, ReduceOp::Avg, /*tag=*/p.name);
  }
  // TODO(lab03-2) END
}

// =============================================================================================
// Buckets: fewer, bigger messages
// =============================================================================================
std::vector<Bucket> make_buckets(const std::vector<ParamInfo>& table, double bucket_mb) {
  SL_CHECK_HINT(bucket_mb >= 0.0, "use --bucket-mb 0 for one bucket per tensor (PyTorch's default is 25)",
                "bucket_mb = %g must be >= 0", bucket_mb);
  std::vector<Bucket> buckets;
  // TODO(lab03-3) BEGIN  the bucket layout: which gradients travel together
  //   Done when: `buckets` follows the rule of README "Buckets: fewer, bigger messages" exactly: walk
  //   order, whole tensors, when a bucket closes, one range per unit, ready_unit (a pure function).
  //   Hints, one tier at a time: scripts/hint 03-3
  const int64_t cap = static_cast<int64_t>(bucket_mb * 1048576.0 / sizeof(float));  // elements
  Bucket current;
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const ParamInfo& p = *it;
    if (!current.ranges.empty() && current.ranges.back().unit == p.unit) {
      GradRange& range = current.ranges.back();
      range.offset = p.offset;  // p lies just below the range: [p.offset, p.offset + p.numel) + [range)
      range.count += p.numel;
    } else {
      current.ranges.push_back(GradRange{p.unit, p.offset, p.numel});
    }
    current.numel += p.numel;
    current.ready_unit = p.unit;
    if (current.numel >= cap) {
      buckets.push_back(current);
      current = Bucket{};
    }
  }
  if (!current.ranges.empty()) buckets.push_back(current);
  // TODO(lab03-3) END
  return buckets;
}

void all_reduce_grads_bucketed(GPT2& model, Communicator& comm, BucketState& state) {
  // TODO(lab03-4) BEGIN  bucketed: every gradient averaged, one all-reduce per bucket
  //   Done when: every gradient holds its average over the ranks, with one blocking all-reduce per
  //   bucket, in bucket order, tagged bucket_tag(k).
  //   The idea: README "Buckets: fewer, bigger messages". Hints, one tier at a time: scripts/hint 03-4
  for (size_t k = 0; k < state.buckets.size(); ++k) {
    pack_bucket(model, state.buckets[k], state.flat[k]);
    comm.all_reduce(state.flat[k], ReduceOp::Avg, bucket_tag(k));
    unpack_bucket(model, state.buckets[k], state.flat[k]);
  }
  // TODO(lab03-4) END
}

// =============================================================================================
// Overlap: all-reduce while backward is still running
// =============================================================================================
void launch_ready_buckets(GPT2& model, Communicator& comm, BucketState& state, int unit) {
  // TODO(lab03-5) BEGIN  overlap: launch every bucket whose gradients are final, without waiting
  //   Done when: after the hook for `unit` returns, every bucket whose gradients are all final has been
  //   launched (in bucket order, asynchronously, tag bucket_tag(k)) and its handle kept; none waited for.
  //   The idea: README "Overlap: all-reduce while backward is still running".
  //   Hints, one tier at a time: scripts/hint 03-5
  for (size_t k = state.pending.size(); k < state.buckets.size() && state.buckets[k].ready_unit >= unit; ++k) {
    pack_bucket(model, state.buckets[k], state.flat[k]);
    state.pending.push_back(comm.all_reduce_async(state.flat[k], ReduceOp::Avg, bucket_tag(k)));
  }
  // TODO(lab03-5) END
}

void wait_for_buckets(GPT2& model, BucketState& state) {
  // TODO(lab03-6) BEGIN  overlap: wait for every launched bucket, put the averages back
  //   Done when: every gradient holds its average over the ranks (the optimizer reads it next).
  //   The idea: README "Overlap: all-reduce while backward is still running".
  //   Hints, one tier at a time: scripts/hint 03-6
  for (size_t k = 0; k < state.pending.size(); ++k) {
    state.pending[k]->wait();
    unpack_bucket(model, state.buckets[k], state.flat[k]);
  }
  // TODO(lab03-6) END
  state.pending.clear();  // the next step launches from bucket 0 again
}

// =============================================================================================
// Gradient accumulation: the data-parallel training step
// =============================================================================================
int micro_steps_per_step(int global_batch, int micro_batch, int world_size) {
  SL_CHECK(global_batch > 0 && micro_batch > 0 && world_size > 0,
           "global_batch=%d micro_batch=%d world_size=%d must all be > 0", global_batch, micro_batch, world_size);
  // TODO(lab03-7) BEGIN  micro-steps per optimizer step, or a clear refusal
  //   Done when: it returns the number of micro-steps for a global batch that splits evenly, and
  //   otherwise throws scalelab::Error with a hint naming the valid global batches next to it.
  //   The idea: README "Gradient accumulation: one all-reduce per optimizer step".
  //   Hints, one tier at a time: scripts/hint 03-7
  const int per_micro_step = micro_batch * world_size;  // sequences, all ranks together
  const int below = global_batch / per_micro_step * per_micro_step, above = below + per_micro_step;
  const std::string hint =
      "the global batch must be a multiple of micro_batch x world_size = " + std::to_string(per_micro_step) +
      ": use --global-batch " + (below > 0 ? std::to_string(below) + " or " : std::string()) + std::to_string(above) +
      ", or change --micro-batch";
  SL_CHECK_HINT(global_batch % per_micro_step == 0, hint,
                "global batch %d is not a multiple of micro_batch %d x world_size %d = %d", global_batch, micro_batch,
                world_size, per_micro_step);
  return global_batch / per_micro_step;
  // TODO(lab03-7) END
}

StepResult train_step(GPT2& model, Optimizer& optimizer, GradSync& sync, const std::vector<MicroBatch>& micro_batches,
                      float lr, float grad_clip) {
  SL_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  StepResult r;
  // TODO(lab03-8) BEGIN  one optimizer step over m micro-batches, ONE gradient synchronisation
  //   Done when: the update is the one a single process makes on the whole global batch, the ranks
  //   communicate once per step, r.loss is the mean of this rank's micro-batch losses and r.grad_norm
  //   the norm of the synchronised gradient before clipping.
  //   The idea: README "Gradient accumulation: one all-reduce per optimizer step".
  //   Hints, one tier at a time: scripts/hint 03-8
  const int m = static_cast<int>(micro_batches.size());
  model.zero_grad();
  double loss_sum = 0.0;
  for (int i = 0; i < m; ++i) {
    sync.set_require_sync(i == m - 1);
    loss_sum += model.forward(micro_batches[i].inputs, &micro_batches[i].targets);
    model.backward();
  }
  sync.finish();
  if (m > 1) {
    for (int u = 0; u < model.num_units(); ++u) scale_(model.unit_grads(u), 1.0f / static_cast<float>(m));
  }
  r.loss = static_cast<float>(loss_sum / m);
  r.grad_norm = clip_grad_norm(model, grad_clip);
  optimizer.step(lr);
  // TODO(lab03-8) END
  return r;
}

}  // namespace SL_TRACK_LAB03
}  // namespace scalelab::lab03
