// grad_sync.cpp — lab 03's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): GradSync, the object a training step talks to, and the buckets' buffers
// (make_bucket_state with the check of a layout, pack_bucket, unpack_bucket, bucket_tag). Declared in
// labs/03_ddp/ddp.h. It calls the TODO functions of its own track: yours in labs/03_ddp/ddp.cpp, the
// reference's in solutions/03_ddp/ddp.cpp.
#include "ddp.h"

#include <algorithm>  // defines: std::sort, std::min, std::max (the layout check of make_bucket_state)
#include <cstdint>    // defines: int64_t
#include <string>     // defines: std::string, std::to_string
#include <vector>     // defines: std::vector

#include "scalelab/comm/comm.h"   // defines: Communicator::now_ms (GradSync::last_finish_ms: wall or virtual time)
#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT, SL_FAIL

namespace scalelab::lab03 {
inline namespace SL_TRACK_LAB03 {

namespace {

// Throws scalelab::Error unless the buckets cover every gradient element exactly once and each bucket's
// numel and ready_unit agree with its ranges.
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
                    "bucket %zu: range (unit %d, offset %lld, count %lld) is outside the unit's gradients", k, r.unit,
                    static_cast<long long>(r.offset), static_cast<long long>(r.count));
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

// =============================================================================================
// Buckets: their buffers (the layout itself is TODO lab03-3, make_buckets)
// =============================================================================================
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

// =============================================================================================
// GradSync: the object a training step talks to, whatever the mode
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
  const double t0_ms = Communicator::now_ms();  // the kit's clock: virtual on the simulated GPU
  switch (mode_) {
    case SyncMode::Naive: all_reduce_grads_naive(model_, comm_); break;
    case SyncMode::Bucketed: all_reduce_grads_bucketed(model_, comm_, state_); break;
    case SyncMode::Overlap:
      // Every bucket must have gone out during backward (lab03-5) before lab03-6 waits for them.
      SL_CHECK_HINT(state_.pending.size() == state_.buckets.size(),
                    "README 'Overlap': launch_ready_buckets must have launched every bucket by after_backward(0); "
                    "and the step's last backward needs sync.set_require_sync(true)",
                    "only %zu of %zu buckets were launched during backward", state_.pending.size(),
                    state_.buckets.size());
      wait_for_buckets(model_, state_);
      break;
  }
  last_finish_ms_ = Communicator::now_ms() - t0_ms;
}

}  // namespace SL_TRACK_LAB03
}  // namespace scalelab::lab03
