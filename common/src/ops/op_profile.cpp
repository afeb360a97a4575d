// op_profile.cpp — the per-op time table (op_profile.h).
#include "scalelab/ops/op_profile.h"

#include <algorithm>  // defines: std::stable_sort, std::find
#include <atomic>
#include <map>
#include <mutex>
#include <utility>  // defines: std::pair

namespace scalelab {

namespace {
struct Profile {
  std::mutex mu;
  std::atomic<bool> on{false};
  std::string phase;
  std::vector<std::string> phases;                                // in the order first set
  std::map<std::pair<std::string, std::string>, OpTime> entries;  // (phase, op) -> time
};
Profile& profile() {
  static Profile p;
  return p;
}
}  // namespace

void op_profile_enable(bool on) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  if (on) {
    p.entries.clear();
    p.phases.clear();
    p.phase.clear();
  }
  p.on.store(on, std::memory_order_relaxed);
}

bool op_profile_enabled() { return profile().on.load(std::memory_order_relaxed); }

void op_profile_phase(const std::string& phase) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  p.phase = phase;
  if (std::find(p.phases.begin(), p.phases.end(), phase) == p.phases.end()) p.phases.push_back(phase);
}

void op_profile_add(const char* op, double ms) {
  Profile& p = profile();
  if (!p.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(p.mu);
  OpTime& e = p.entries[{p.phase, op}];
  e.phase = p.phase;
  e.op = op;
  ++e.calls;
  e.ms += ms;
}

std::vector<OpTime> op_profile_table() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<OpTime> out;
  for (const auto& [key, e] : p.entries) out.push_back(e);
  auto rank = [&](const std::string& phase) {  // "" (ops before any phase) after the named phases
    const auto it = std::find(p.phases.begin(), p.phases.end(), phase);
    return it - p.phases.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](const OpTime& a, const OpTime& b) {
    return rank(a.phase) != rank(b.phase) ? rank(a.phase) < rank(b.phase) : a.ms > b.ms;
  });
  return out;
}

}  // namespace scalelab
