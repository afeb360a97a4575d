// hooks.h — code that runs at fixed points of every forward and backward, unit by unit: the model's hook
// lists (HookLists) and the handles that remove one hook (HookHandle). DDP launches a bucket's all-reduce
// when its last gradient is final (after_backward), FSDP gathers a unit's parameters before it runs and
// reduce-scatters its gradients after; both are hooks on the same model, as in PyTorch
// (register_full_backward_hook and friends). The model adds and runs them (GPT2::add_hook; the order of a
// step is in gpt2.h). Tests: tests/common/model/test_gpt2.cpp (Gpt2Hooks.*), tests/lab04/test_hooks_compose.cpp
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "scalelab/core/tensor.h"  // defines: Tensor

namespace scalelab {

enum class HookPoint { BeforeForward, AfterForward, BeforeBackward, AfterBackward };
const char* hook_point_name(HookPoint point);  // "before_forward", ...

// What a hook is called with: the unit (0 = embeddings, 1..L = blocks, L+1 = ln_f) and its two buffers,
// the flat parameters (policy.param_dtype) and the fp32 gradients. Assignable: a hook may install a buffer
// (FSDP installs a gathered copy before the unit runs) or release one (assign Tensor()).
struct UnitHookArgs {
  int unit;
  Tensor& params;
  Tensor& grads;
};
using Hook = std::function<void(const UnitHookArgs&)>;

// Where add_hook puts a new hook among those already at its point: Last (the default: hooks run in the
// order they were added) or First (before all of them; a probe that times the others).
enum class HookOrder { Last, First };

// The hook lists of one model, one per HookPoint, in run order. A model holds its lists in a shared_ptr and
// each HookHandle a weak_ptr to them, so a handle may outlive the model.
class HookLists {
 public:
  // Puts fn at `point` (see HookOrder) and returns its id, unique within these lists. Throws for an empty fn.
  uint64_t add(HookPoint point, Hook fn, HookOrder order);
  void remove(HookPoint point, uint64_t id);  // nothing happens for an id that is not there
  bool contains(HookPoint point, uint64_t id) const;
  int size(HookPoint point) const;  // hooks installed at `point`
  // Calls every hook at `point`, in order, with args. It walks a copy of the list (of pointers): a hook that
  // adds or removes hooks while it runs changes the list, not the copy, so the change takes effect from the
  // next call (the next unit).
  void run(HookPoint point, const UnitHookArgs& args) const;

 private:
  struct Entry {
    uint64_t id;
    std::shared_ptr<const Hook> fn;
  };
  const std::vector<Entry>& at(HookPoint point) const { return lists_[static_cast<int>(point)]; }
  std::vector<Entry>& at(HookPoint point) { return lists_[static_cast<int>(point)]; }
  std::array<std::vector<Entry>, 4> lists_;  // indexed by HookPoint
  uint64_t next_id_ = 1;
};

// Returned by GPT2::add_hook; removes its hook when destroyed or on remove(), so an object that adds hooks
// (GradSync, FSDP) removes exactly its own and leaves the others running. Move-only. Safe to outlive the
// model: then it does nothing. An empty (default-constructed or moved-from) handle removes nothing.
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<HookLists> lists, HookPoint point, uint64_t id)
      : lists_(std::move(lists)), point_(point), id_(id) {}
  ~HookHandle() { remove(); }
  HookHandle(HookHandle&& other) noexcept { *this = std::move(other); }
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  void remove();        // idempotent
  bool active() const;  // the hook is still installed
 private:
  std::weak_ptr<HookLists> lists_;
  HookPoint point_ = HookPoint::BeforeForward;
  uint64_t id_ = 0;
};

}  // namespace scalelab
