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
  throw scalelab::NotImplemented("lab03-1 broadcast_parameters");
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
  throw scalelab::NotImplemented("lab03-2 all_reduce_grads_naive");
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
  throw scalelab::NotImplemented("lab03-3 make_buckets");
  // TODO(lab03-3) END
  return buckets;
}

void all_reduce_grads_bucketed(GPT2& model, Communicator& comm, BucketState& state) {
  // TODO(lab03-4) BEGIN  bucketed: every gradient averaged, one all-reduce per bucket
  //   Done when: every gradient holds its average over the ranks, with one blocking all-reduce per
  //   bucket, in bucket order, tagged bucket_tag(k).
  //   The idea: README "Buckets: fewer, bigger messages". Hints, one tier at a time: scripts/hint 03-4
  throw scalelab::NotImplemented("lab03-4 all_reduce_grads_bucketed");
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
  throw scalelab::NotImplemented("lab03-5 launch_ready_buckets");
  // TODO(lab03-5) END
}

void wait_for_buckets(GPT2& model, BucketState& state) {
  // TODO(lab03-6) BEGIN  overlap: wait for every launched bucket, put the averages back
  //   Done when: every gradient holds its average over the ranks (the optimizer reads it next).
  //   The idea: README "Overlap: all-reduce while backward is still running".
  //   Hints, one tier at a time: scripts/hint 03-6
  throw scalelab::NotImplemented("lab03-6 wait_for_buckets");
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
  throw scalelab::NotImplemented("lab03-7 micro_steps_per_step");
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
  throw scalelab::NotImplemented("lab03-8 train_step");
  // TODO(lab03-8) END
  return r;
}

}  // namespace SL_TRACK_LAB03
}  // namespace scalelab::lab03
