// host_copy.cpp — asynchronous host <-> device copies (host_copy.h): the source read at launch, the
// destination written at wait, the simulated time on the virtual clock's copy stream.
#include "scalelab/core/host_copy.h"

#include <algorithm>  // defines: std::max
#include <cstring>    // defines: std::memcpy, std::memset
#include <mutex>      // defines: std::mutex, std::lock_guard
#include <utility>    // defines: std::move

#include "scalelab/core/clock.h"    // defines: VirtualClock, UnchargedDeviceWork
#include "scalelab/core/error.h"    // defines: SL_CHECK
#include "scalelab/core/sim_gpu.h"  // defines: sim_gpu, sim_gpu_active, sim_skips_data

namespace scalelab {
namespace {

// The process's CopyWaitStats; a mutex because the loader's thread may copy while the main thread computes.
std::mutex g_stats_mutex;
CopyWaitStats g_stats;

}  // namespace

CopyWaitStats copy_wait_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_stats;
}

void reset_copy_wait_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats = CopyWaitStats{};
}

CopyInFlight::CopyInFlight(Tensor dst, std::vector<char> bytes, double end_s, bool virtual_time,
                           VirtualClock::CopyDir dir)
    : dst_(std::move(dst)), bytes_(std::move(bytes)), end_s_(end_s), virtual_time_(virtual_time), dir_(dir) {}

CopyInFlight::~CopyInFlight() {
  if (!landed_ && virtual_time_) {
    std::lock_guard<std::mutex> lock(g_stats_mutex);
    ++g_stats.unwaited[static_cast<int>(dir_)];
  }
  land();
}

void CopyInFlight::land() {
  if (landed_) return;
  landed_ = true;
  if (bytes_.empty()) return;   // moved at launch (CUDA), or nothing to move (--timing-only into SIM)
  DeviceCodeScope device_code;  // the copy engine writes device memory
  std::memcpy(dst_.raw(), bytes_.data(), bytes_.size());
  bytes_.clear();
  bytes_.shrink_to_fit();
}

void CopyInFlight::wait() {
  const bool first = !landed_;
  land();
  if (!virtual_time_) return;
  VirtualClock& clock = VirtualClock::get();
  if (first) {  // a second wait() exposes nothing more
    std::lock_guard<std::mutex> lock(g_stats_mutex);
    g_stats.exposed_s[static_cast<int>(dir_)] += std::max(0.0, end_s_ - clock.compute_s());
    ++g_stats.waited[static_cast<int>(dir_)];
  }
  clock.wait_compute_until(end_s_);
}

CopyPtr copy_async(Tensor dst, const Tensor& src) {
  SL_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype(),
           "copy_async %s %s into %s %s: numel or dtype differ", shape_str(src.shape()).c_str(),
           dtype_name(src.dtype()), shape_str(dst.shape()).c_str(), dtype_name(dst.dtype()));
  SL_CHECK(dst.device() == Device::CPU || src.device() == Device::CPU,
           "copy_async: one side must be host memory (Device::CPU), got %s <- %s", device_name(dst.device()),
           device_name(src.device()));
  const bool sim = (dst.device() == Device::SIM || src.device() == Device::SIM) && sim_gpu_active();
  double end_s = 0.0;
  const auto dir = dst.device() == Device::CPU ? VirtualClock::CopyDir::ToHost : VirtualClock::CopyDir::ToDevice;
  const bool charged = sim && VirtualClock::get().on() && !UnchargedDeviceWork::open();
  if (charged) {  // its direction's copy stream: after the compute queued so far (it produced src) and the
                  // copies queued before it that way
    VirtualClock& clock = VirtualClock::get();
    const double start_s = std::max(clock.compute_s(), clock.copy_s(dir));
    end_s = start_s + sim_gpu().copy_seconds(static_cast<int64_t>(dst.nbytes()), dst.device(), src.device());
    clock.set_copy_s(dir, end_s);
  }
  std::vector<char> bytes;
  if (dst.device() == Device::CUDA || src.device() == Device::CUDA) {
    dst.copy_from(src);  // cudaMemcpy: lands now
  } else if ((dst.device() == Device::SIM || src.device() == Device::SIM) && sim_skips_data()) {
    if (dst.device() == Device::CPU && dst.nbytes() > 0) std::memset(dst.raw(), 0, dst.nbytes());
  } else if (dst.nbytes() > 0) {
    DeviceCodeScope device_code;  // the copy engine reads device memory
    bytes.resize(dst.nbytes());
    std::memcpy(bytes.data(), src.raw(), bytes.size());
  }
  return std::make_unique<CopyInFlight>(std::move(dst), std::move(bytes), end_s, charged, dir);
}

}  // namespace scalelab
