// clock.cpp — the kit's clock and the virtual clock of a simulated GPU (core/clock.h).
#include "scalelab/core/clock.h"

#include <algorithm>  // defines: std::max
#include <atomic>     // defines: std::atomic (VirtualState::on)
#include <chrono>     // defines: std::chrono::steady_clock
#include <mutex>      // defines: std::mutex, std::lock_guard
#include <thread>     // defines: std::this_thread::sleep_for (clock_pause_ms in real time)

#include "scalelab/core/error.h"  // defines: SL_CHECK

namespace scalelab {

namespace {
using SteadyClock = std::chrono::steady_clock;

SteadyClock::time_point wall_origin() {
  static const SteadyClock::time_point origin = SteadyClock::now();
  return origin;
}

// The virtual clock's state: one per process.
struct VirtualState {
  std::mutex mu;
  // Written under mu; read without it by clock_now_ms and VirtualClock::on, so that a real-time clock read
  // (every communicator call reads it a few times) takes no lock: 10-40 ns, not a contended mutex.
  std::atomic<bool> on{false};
  double compute_s = 0.0;         // when the compute stream's queued work ends
  double comm_s = 0.0;            // when the communication stream's queued calls end
  double copy_s[2] = {0.0, 0.0};  // when each copy stream's queued copies end: [ToHost], [ToDevice]
};
VirtualState& state() {
  static VirtualState s;
  return s;
}
// UnchargedDeviceWork scopes open on this thread (the loader's prefetch thread keeps its own: 0).
thread_local int t_uncharged_depth = 0;
}  // namespace

double clock_now_ms() {
  VirtualState& s = state();
  if (s.on.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.on.load(std::memory_order_relaxed)) return 1e3 * s.compute_s;
  }
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - wall_origin()).count();
}

bool clock_is_virtual() { return VirtualClock::get().on(); }

double clock_wall_origin_steady_ms() {
  return std::chrono::duration<double, std::milli>(wall_origin().time_since_epoch()).count();
}

void clock_pause_ms(double ms) {
  if (!(ms > 0)) return;
  if (clock_is_virtual()) VirtualClock::get().advance_compute(ms / 1e3);
  else std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

VirtualClock& VirtualClock::get() {
  static VirtualClock clock;
  return clock;
}

void VirtualClock::start() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().on = true;
  state().compute_s = 0.0;
  state().comm_s = 0.0;
  state().copy_s[0] = state().copy_s[1] = 0.0;
}

void VirtualClock::stop() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().on = false;
}

bool VirtualClock::on() const { return state().on.load(std::memory_order_acquire); }

double VirtualClock::compute_s() const {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().compute_s;
}

void VirtualClock::advance_compute(double seconds) {
  SL_CHECK(seconds >= 0.0, "VirtualClock::advance_compute(%g): a duration cannot be negative", seconds);
  std::lock_guard<std::mutex> lock(state().mu);
  state().compute_s += seconds;
}

void VirtualClock::charge_device(double seconds) {
  if (t_uncharged_depth == 0) advance_compute(seconds);
}

UnchargedDeviceWork::UnchargedDeviceWork() { ++t_uncharged_depth; }
UnchargedDeviceWork::~UnchargedDeviceWork() { --t_uncharged_depth; }
bool UnchargedDeviceWork::open() { return t_uncharged_depth > 0; }

void VirtualClock::wait_compute_until(double t_s) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().compute_s = std::max(state().compute_s, t_s);
}

double VirtualClock::comm_s() const {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().comm_s;
}

void VirtualClock::set_comm_s(double t_s) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().comm_s = t_s;
}

double VirtualClock::copy_s(CopyDir dir) const {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().copy_s[static_cast<int>(dir)];
}

void VirtualClock::set_copy_s(CopyDir dir, double t_s) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().copy_s[static_cast<int>(dir)] = t_s;
}

}  // namespace scalelab
