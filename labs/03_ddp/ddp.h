// ddp.h — what the learner writes in lab 03 (data parallel), declared once for both tracks.
//   labs/03_ddp/ddp.cpp       the learner's file (TODO blocks)   -> library lab03_learner
//   solutions/03_ddp/ddp.cpp  the reference (same file, filled)  -> library lab03_ref
//   labs/03_ddp/grad_sync.cpp the given code around them (GradSync, the buckets' buffers): compiled
//                             into both libraries, each calling its own track's functions
// The two tracks live in distinct inline namespaces (scalelab::lab03::learner / ::ref) chosen by
// SL_TRACK_LAB03, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/03_ddp/README.md   Graded tests: tests/lab03/ (test_lab03*.cpp)
//
// The pieces, in the order a step uses them (README.md#the-picture):
//   broadcast_parameters                every rank starts from rank 0's weights         TODO lab03-1
//   all_reduce_grads_naive              one all-reduce per parameter tensor              TODO lab03-2
//   make_buckets                        the bucket layout: which gradients travel together TODO lab03-3
//   all_reduce_grads_bucketed           one all-reduce per bucket, after backward        TODO lab03-4
//   launch_ready_buckets, wait_for_buckets   the same buckets, overlapped with backward  TODO lab03-5, -6
//   micro_steps_per_step, train_step    gradient accumulation: one sync per update       TODO lab03-7, -8
//   GradSync (given)                    picks naive / bucketed / overlap for train_step
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"
#include "scalelab/model/batch.h"
#include "scalelab/model/gpt2.h"
#include "scalelab/model/optim.h"
#include "scalelab/core/tensor.h"

#ifndef SL_TRACK_LAB03
#define SL_TRACK_LAB03 ref
#endif

namespace scalelab::lab03 {
inline namespace SL_TRACK_LAB03 {

// =============================================================================================
// Start identical
// =============================================================================================
// TODO(lab03-1): on return every rank's parameters equal rank 0's, bit for bit (every rank calls it, in
// the same order of messages; a unit buffer's message is tagged "params unit <u>"). Call it before
// constructing the Optimizer (which copies the parameters into its fp32 master weights).
// README.md#start-identical.
void broadcast_parameters(GPT2& model, Communicator& comm);

// =============================================================================================
// Naive: one all-reduce per parameter tensor
// =============================================================================================
// TODO(lab03-2): on return every gradient is its average over the ranks, element for element, moved as
// one blocking message per parameter tensor of model.param_table(), in table order, tagged with the
// parameter's name. README.md#naive-data-parallel-one-all-reduce-per-tensor.
void all_reduce_grads_naive(GPT2& model, Communicator& comm);

// =============================================================================================
// Buckets: fewer, bigger messages
// =============================================================================================
// A contiguous piece of one unit's gradient buffer: elements [offset, offset + count) of
// model.unit_grads(unit).
struct GradRange {
  int unit = 0;
  int64_t offset = 0;  // elements
  int64_t count = 0;   // elements
};

// Whole parameter tensors that travel together in ONE all-reduce of a flat fp32 buffer.
struct Bucket {
  std::vector<GradRange> ranges;  // in backward order (units descending); adjacent tensors of one
                                  // unit are merged into one range
  int64_t numel = 0;              // elements: the sum of the ranges' counts
  int ready_unit = 0;             // every gradient in the bucket is final once hooks.after_backward(
                                  // ready_unit) has run: the lowest unit among its ranges
};

// TODO(lab03-3): the bucket layout, a pure function of the parameter table: the README's rule exactly
// (README.md#buckets-fewer-bigger-messages: the order of the buckets, and when a bucket of bucket_mb MiB of
// fp32 gradients is full). Every tensor lies, whole, in exactly one bucket; the first bucket is the first
// whose gradients backward completes; only the last bucket may hold less than bucket_mb MiB.
// bucket_mb == 0 gives one bucket per tensor; bucket_mb < 0 is refused (scalelab::Error).
std::vector<Bucket> make_buckets(const std::vector<ParamInfo>& table, double bucket_mb);

// The buckets of one model and what reducing them needs.
struct BucketState {
  std::vector<Bucket> buckets;   // make_buckets(model.param_table(), bucket_mb)
  std::vector<Tensor> flat;      // flat[k]: (buckets[k].numel,) fp32, allocated once, reused every step
  std::vector<WorkPtr> pending;  // overlap: the all-reduces of buckets 0 .. pending.size()-1, launched
                                 // during this step's backward and not yet waited for
};

// Given. Buckets for the model's table (make_buckets), checked to cover every gradient element
// exactly once (a wrong layout fails here, loudly), with their flat buffers (category Comm).
BucketState make_bucket_state(const GPT2& model, double bucket_mb);
// Given. Copy a bucket's gradient ranges into its flat buffer (in range order), and back.
void pack_bucket(GPT2& model, const Bucket& bucket, Tensor& flat);
void unpack_bucket(GPT2& model, const Bucket& bucket, const Tensor& flat);
// Given. "bucket 3": the tag of bucket k's all-reduce; the overlap check finds buckets by it.
std::string bucket_tag(size_t k);

// TODO(lab03-4): the same result as all_reduce_grads_naive (every gradient its average over the ranks),
// moved as one blocking message per bucket of `state`, in bucket order, bucket k's tagged bucket_tag(k).
// README.md#buckets-fewer-bigger-messages.
void all_reduce_grads_bucketed(GPT2& model, Communicator& comm, BucketState& state);

// =============================================================================================
// Overlap: all-reduce while backward is still running
// =============================================================================================
// TODO(lab03-5): the after_backward hook (GradSync installs it). Backward has just finished unit `unit`
// (the order in which backward finishes the units: README.md#overlap-all-reduce-while-backward-is-still-running).
// Contract: on return every bucket whose gradients are all final has its average over the ranks in flight
// (tag bucket_tag(k), launched once per step, in bucket order, its handle in state.pending); no bucket
// whose gradients backward may still change has left; the hook never blocks on the network.
void launch_ready_buckets(GPT2& model, Communicator& comm, BucketState& state, int unit);
// TODO(lab03-6): before the optimizer step: on return every all-reduce launched this step is complete and
// its result is in the gradients. README.md#overlap-all-reduce-while-backward-is-still-running.
void wait_for_buckets(GPT2& model, BucketState& state);

// =============================================================================================
// GradSync (given): the object a training step talks to, whatever the mode
// =============================================================================================
enum class SyncMode { Naive, Bucketed, Overlap };
SyncMode sync_mode_from_name(const std::string& name);  // "naive" | "bucketed" | "overlap"
const char* sync_mode_name(SyncMode mode);

// PyTorch's DistributedDataParallel in miniature: it owns the buckets and, in overlap mode, adds an
// after_backward hook to the model (removed again by the destructor; other hooks on the model, FSDP's or
// a probe's, keep running).
class GradSync {
 public:
  GradSync(GPT2& model, Communicator& comm, SyncMode mode, double bucket_mb);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // false: the next backward passes only accumulate, the overlap hook launches nothing (PyTorch's
  // no_sync()). true (the default): the next backward is the last of the step; its gradients are
  // synchronised. Naive and bucketed modes communicate only in finish() and ignore it.
  void set_require_sync(bool require_sync) { require_sync_ = require_sync; }
  bool require_sync() const { return require_sync_; }

  // After the step's last backward: every gradient becomes its average over the ranks.
  //   naive: all_reduce_grads_naive   bucketed: all_reduce_grads_bucketed   overlap: wait_for_buckets
  void finish();
  // How long the last finish() blocked the caller (ms, on the kit's clock: virtual time on the simulated GPU):
  // the communication backward did NOT hide.
  double last_finish_ms() const { return last_finish_ms_; }

  SyncMode mode() const { return mode_; }
  Communicator& comm() { return comm_; }
  const std::vector<Bucket>& buckets() const { return state_.buckets; }  // empty in naive mode

 private:
  GPT2& model_;
  Communicator& comm_;
  SyncMode mode_;
  BucketState state_;
  HookHandle hook_;  // overlap: the after_backward hook that launches ready buckets
  bool require_sync_ = true;
  double last_finish_ms_ = 0.0;
};

// =============================================================================================
// Gradient accumulation: the data-parallel training step
// =============================================================================================
// TODO(lab03-7): how many micro-steps one optimizer step takes when every rank processes micro_batch
// sequences per micro-step, so that the ranks together process exactly global_batch sequences per step.
// A global batch that no whole number of micro-steps makes is refused (scalelab::Error) with a hint that
// names the nearest valid global batches. README.md#gradient-accumulation-one-all-reduce-per-optimizer-step.
int micro_steps_per_step(int global_batch, int micro_batch, int world_size);

using scalelab::MicroBatch;  // (B, T) inputs and targets (scalelab/model/batch.h)
using scalelab::StepResult;  // loss of THIS rank's micro-batches; norm of the synchronised gradient

// TODO(lab03-8): one optimizer step of data-parallel training over this rank's micro-batches (one
// per micro-step): the update one process makes with the mean loss of the whole global batch, with
// ONE gradient synchronisation per step (through `sync`), clipped to grad_clip (<= 0: no clipping) by
// the norm every rank agrees on. README.md#gradient-accumulation-one-all-reduce-per-optimizer-step.
StepResult train_step(GPT2& model, Optimizer& optimizer, GradSync& sync, const std::vector<MicroBatch>& micro_batches,
                      float lr, float grad_clip);

}  // namespace SL_TRACK_LAB03
}  // namespace scalelab::lab03
