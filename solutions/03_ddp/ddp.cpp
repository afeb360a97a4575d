// ddp.cpp — lab 03: data-parallel training: start identical, average the gradients (naive, bucketed,
// overlapped with backward), accumulate micro-steps. Declared in labs/03_ddp/ddp.h; the lesson is
// labs/03_ddp/README.md. Only the code between TODO(lab03-N) BEGIN/END is yours to write; the rest is
// shared by both tracks (labs/03_ddp/ddp.cpp and solutions/03_ddp/ddp.cpp).
#include "ddp.h"

#include <algorithm>  // defines: std::sort, std::min, std::max (the layout check of make_bucket_state)
#include <chrono>     // defines: std::chrono::steady_clock (GradSync::last_finish_ms)
#include <cstdint>    // defines: int64_t
#include <string>     // defines: std::string, std::to_string
#include <vector>     // defines: std::vector

#include "scalelab/core/error.h"  // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL, scalelab::NotImplemented
#include "scalelab/ops/ops.h"    // defines: scale_ (t *= s)
#include "scalelab/model/optim.h"  // defines: clip_grad_norm

namespace scalelab::lab03 {
inline namespace SL_TRACK_LAB03 {

namespace {
// Given, at the end of this file: throws scalelab::Error unless the buckets cover every gradient
// element exactly once and each bucket's numel and ready_unit agree with its ranges.
void check_bucket_layout(const GPT2& model, const std::vector<Bucket>& buckets);
}  // namespace

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

BucketState make_bucket_state(const GPT2& model, double bucket_mb) {
  BucketState state;
  state.buckets = make_buckets(model.param_table(), bucket_mb);
  check_bucket_layout(model, state.buckets);  // a wrong layout fails here, loudly, not in training
  for (const Bucket& b : state.buckets) {
    state.flat.push_back(Tensor::zeros({b.numel}, DType::F32, model.device(), MemCategory::Comm));
  }
  return state;
}

void pack_bucket(GPT2& model, const Bucket& bucket, Tensor& flat) {
  int64_t pos = 0;  // elements of flat filled so far
  for (const GradRange& r : bucket.ranges) {
    flat.view(pos, {r.count}).copy_from(model.unit_grads(r.unit).view(r.offset, {r.count}));
    pos += r.count;
  }
}

void unpack_bucket(GPT2& model, const Bucket& bucket, const Tensor& flat) {
  int64_t pos = 0;
  for (const GradRange& r : bucket.ranges) {
    model.unit_grads(r.unit).view(r.offset, {r.count}).copy_from(flat.view(pos, {r.count}));
    pos += r.count;
  }
}

std::string bucket_tag(size_t k) { return "bucket " + std::to_string(k); }

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
  SL_CHECK_HINT(state.pending.size() == state.buckets.size(),
                "README 'Overlap': launch_ready_buckets must have launched every bucket by after_backward(0); "
                "and the step's last backward needs sync.set_require_sync(true)",
                "only %zu of %zu buckets were launched during backward", state.pending.size(),
                state.buckets.size());
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
// GradSync (given)
// =============================================================================================
SyncMode sync_mode_from_name(const std::string& name) {
  if (name == "naive") return SyncMode::Naive;
  if (name == "bucketed") return SyncMode::Bucketed;
  if (name == "overlap") return SyncMode::Overlap;
  SL_FAIL("use --mode naive, bucketed or overlap", "unknown data-parallel mode '%s'", name.c_str());
}

const char* sync_mode_name(SyncMode mode) {
  switch (mode) {
    case SyncMode::Naive: return "naive";
    case SyncMode::Bucketed: return "bucketed";
    case SyncMode::Overlap: return "overlap";
  }
  return "?";
}

GradSync::GradSync(GPT2& model, Communicator& comm, SyncMode mode, double bucket_mb)
    : model_(model), comm_(comm), mode_(mode) {
  if (mode == SyncMode::Naive) return;
  state_ = make_bucket_state(model, bucket_mb);
  if (mode == SyncMode::Overlap)  // each bucket goes as soon as backward has made its gradients final
    hook_ = model.add_hook(HookPoint::AfterBackward, [this](const UnitHookArgs& a) {
      if (require_sync_) launch_ready_buckets(model_, comm_, state_, a.unit);
    });
}

GradSync::~GradSync() = default;  // hook_ removes the hook, and only ours: other hooks keep running

void GradSync::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  switch (mode_) {
    case SyncMode::Naive: all_reduce_grads_naive(model_, comm_); break;
    case SyncMode::Bucketed: all_reduce_grads_bucketed(model_, comm_, state_); break;
    case SyncMode::Overlap: wait_for_buckets(model_, state_); break;
  }
  last_finish_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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
  const std::string hint = "the global batch must be a multiple of micro_batch x world_size = " +
                           std::to_string(per_micro_step) + ": use --global-batch " +
                           (below > 0 ? std::to_string(below) + " or " : std::string()) + std::to_string(above) +
                           ", or change --micro-batch";
  SL_CHECK_HINT(global_batch % per_micro_step == 0, hint,
                "global batch %d is not a multiple of micro_batch %d x world_size %d = %d", global_batch,
                micro_batch, world_size, per_micro_step);
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

// =============================================================================================
// Given: the layout check of make_bucket_state
// =============================================================================================
namespace {

void check_bucket_layout(const GPT2& model, const std::vector<Bucket>& buckets) {
  // A layout must cover every gradient element exactly once: per unit, the ranges of all buckets,
  // sorted by offset, must tile [0, unit size) with no gap and no overlap.
  std::vector<int64_t> unit_numel(model.num_units(), 0);  // elements of each unit's gradient buffer
  for (const ParamInfo& p : model.param_table()) unit_numel[p.unit] += p.numel;
  struct Owned {
    int64_t offset, count;
    size_t bucket;
  };
  std::vector<std::vector<Owned>> tiles(model.num_units());
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    int64_t numel = 0;
    int lowest_unit = model.num_units();
    for (const GradRange& r : b.ranges) {
      SL_CHECK_HINT(r.unit >= 0 && r.unit < model.num_units() && r.offset >= 0 && r.count > 0 &&
                        r.offset + r.count <= unit_numel[r.unit],
                    "README 'Buckets': a range is [offset, offset + count) of ONE unit's gradient buffer",
                    "bucket %zu: range (unit %d, offset %lld, count %lld) is outside the unit's gradients", k,
                    r.unit, static_cast<long long>(r.offset), static_cast<long long>(r.count));
      tiles[r.unit].push_back({r.offset, r.count, k});
      numel += r.count;
      lowest_unit = std::min(lowest_unit, r.unit);
    }
    SL_CHECK_HINT(b.numel == numel, "Bucket::numel is the sum of its ranges' counts",
                  "bucket %zu: numel %lld, but its ranges hold %lld elements", k, static_cast<long long>(b.numel),
                  static_cast<long long>(numel));
    SL_CHECK_HINT(b.ready_unit == lowest_unit,
                  "README 'Overlap': a bucket is ready after the backward of its LOWEST unit (that one runs last)",
                  "bucket %zu: ready_unit %d, but its lowest unit is %d", k, b.ready_unit, lowest_unit);
  }
  for (int u = 0; u < model.num_units(); ++u) {
    std::sort(tiles[u].begin(), tiles[u].end(), [](const Owned& a, const Owned& b) { return a.offset < b.offset; });
    int64_t covered = 0;  // elements [0, covered) of unit u are in exactly one bucket so far
    for (const Owned& t : tiles[u]) {
      SL_CHECK_HINT(t.offset == covered, "README 'Buckets': every gradient element travels exactly once",
                    "unit %d: elements [%lld, %lld) are in %s (bucket %zu starts at %lld)", u,
                    static_cast<long long>(std::min(covered, t.offset)),
                    static_cast<long long>(std::max(covered, t.offset)),
                    t.offset > covered ? "no bucket" : "two buckets", t.bucket, static_cast<long long>(t.offset));
      covered += t.count;
    }
    SL_CHECK_HINT(covered == unit_numel[u], "README 'Buckets': every gradient element travels exactly once",
                  "unit %d: elements [%lld, %lld) are in no bucket", u, static_cast<long long>(covered),
                  static_cast<long long>(unit_numel[u]));
  }
}

}  // namespace

}  // namespace SL_TRACK_LAB03
}  // namespace scalelab::lab03
