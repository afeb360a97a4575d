// hooks.cpp — the hook lists and their handles (hooks.h). The model runs the lists (gpt2.cpp, GPT2::run_hooks).
// Tests: tests/common/model/test_gpt2.cpp (Gpt2Hooks.*), tests/lab04/test_hooks_compose.cpp
#include "scalelab/model/hooks.h"

#include <algorithm>
#include <utility>

#include "scalelab/core/error.h"  // defines: SL_CHECK

namespace scalelab {

const char* hook_point_name(HookPoint point) {
  switch (point) {
    case HookPoint::BeforeForward: return "before_forward";
    case HookPoint::AfterForward: return "after_forward";
    case HookPoint::BeforeBackward: return "before_backward";
    case HookPoint::AfterBackward: return "after_backward";
  }
  return "?";
}

uint64_t HookLists::add(HookPoint point, Hook fn, HookOrder order) {
  SL_CHECK(static_cast<bool>(fn), "add_hook(%s): the hook is empty", hook_point_name(point));
  auto& list = at(point);
  const uint64_t id = next_id_++;
  Entry e{id, std::make_shared<const Hook>(std::move(fn))};
  if (order == HookOrder::First) list.insert(list.begin(), std::move(e));
  else list.push_back(std::move(e));
  return id;
}

void HookLists::remove(HookPoint point, uint64_t id) {
  auto& list = at(point);
  list.erase(std::remove_if(list.begin(), list.end(), [id](const Entry& e) { return e.id == id; }), list.end());
}

bool HookLists::contains(HookPoint point, uint64_t id) const {
  const auto& list = at(point);
  return std::any_of(list.begin(), list.end(), [id](const Entry& e) { return e.id == id; });
}

int HookLists::size(HookPoint point) const { return static_cast<int>(at(point).size()); }

void HookLists::run(HookPoint point, const UnitHookArgs& args) const {
  const auto& list = at(point);
  if (list.empty()) return;
  const std::vector<Entry> snapshot = list;  // see hooks.h: changes made by the hooks wait for the next call
  for (const Entry& e : snapshot) (*e.fn)(args);
}

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    lists_ = std::move(other.lists_);
    point_ = other.point_;
    id_ = other.id_;
    other.lists_.reset();
    other.id_ = 0;
  }
  return *this;
}

void HookHandle::remove() {
  if (const auto lists = lists_.lock()) lists->remove(point_, id_);
  lists_.reset();
  id_ = 0;
}

bool HookHandle::active() const {
  const auto lists = lists_.lock();
  return lists && lists->contains(point_, id_);
}

}  // namespace scalelab
