// allocator.cpp — the counting allocator (allocator.h). CPU memory is 64-byte aligned (cache line,
// AVX-512 friendly). CUDA memory goes through cudaMalloc in the CUDA backend (common/src/cuda/).
#include "scalelab/allocator.h"

#include <cstdlib>
#include <new>

#include "scalelab/error.h"

#ifdef SL_WITH_CUDA
namespace scalelab::cuda {
void* device_malloc(size_t nbytes);  // common/src/cuda/device.cu
void device_free(void* ptr);
}  // namespace scalelab::cuda
#endif

namespace scalelab {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Params: return "params";
    case MemCategory::Grads: return "grads";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::Activations: return "activations";
    case MemCategory::Workspace: return "workspace";
    case MemCategory::Comm: return "comm";
    case MemCategory::Data: return "data";
    case MemCategory::Other: return "other";
    case MemCategory::kCount: break;
  }
  return "?";
}

Allocator& Allocator::get(Device device) {
  static Allocator cpu(Device::CPU);
  static Allocator gpu(Device::CUDA);
  return device == Device::CPU ? cpu : gpu;
}

void* Allocator::allocate(size_t nbytes, MemCategory category) {
  if (nbytes == 0) return nullptr;
  const int c = static_cast<int>(category);
  // 1. Refuse early what the cap forbids (no real allocation is attempted then).
  // 2. Allocate. 3. Count, re-checking the cap under the lock (another thread may have allocated).
  // Counting only after a successful allocation keeps current AND peak bytes exact on every failure.
  auto over_cap = [&](int64_t want) { return cap_bytes_ > 0 && want > cap_bytes_; };
  auto fail_cap = [&](int64_t want) {
    detail::fail_oom(__FILE__, __LINE__, __func__,
                     detail::format("out of memory on %s: %zu bytes for %s would make %lld bytes in use, "
                                    "cap is %lld bytes (simulated device memory)",
                                    device_name(device_), nbytes, mem_category_name(category),
                                    static_cast<long long>(want), static_cast<long long>(cap_bytes_)),
                     "use a smaller batch or model, more ranks, or a higher ZeRO stage; or raise --memory-cap-mb");
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t want = stats_.total_current_bytes + static_cast<int64_t>(nbytes);
    if (over_cap(want)) fail_cap(want);
  }
  void* p = raw_allocate(nbytes);
  if (!p) {
    detail::fail_oom(__FILE__, __LINE__, __func__,
                     detail::format("the system refused %zu bytes for %s on %s", nbytes, mem_category_name(category),
                                    device_name(device_)),
                     "use a smaller batch or model");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t want = stats_.total_current_bytes + static_cast<int64_t>(nbytes);
  if (over_cap(want)) {
    raw_free(p);
    fail_cap(want);
  }
  stats_.current_bytes[c] += static_cast<int64_t>(nbytes);
  stats_.total_current_bytes = want;
  if (stats_.current_bytes[c] > stats_.peak_bytes[c]) stats_.peak_bytes[c] = stats_.current_bytes[c];
  if (want > stats_.total_peak_bytes) stats_.total_peak_bytes = want;
  return p;
}

void* Allocator::raw_allocate(size_t nbytes) {
  if (device_ == Device::CPU) {
    const size_t rounded = (nbytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    return std::aligned_alloc(64, rounded);
  }
#ifdef SL_WITH_CUDA
  return cuda::device_malloc(nbytes);
#else
  SL_FAIL("rebuild where nvcc is found (CMake option SL_WITH_CUDA=ON), or run with --device cpu",
          "this build has no CUDA backend");
#endif
}

void Allocator::raw_free(void* ptr) {
  if (!ptr) return;
  if (device_ == Device::CPU) {
    std::free(ptr);
  } else {
#ifdef SL_WITH_CUDA
    cuda::device_free(ptr);
#endif
  }
}

void Allocator::deallocate(void* ptr, size_t nbytes, MemCategory category) {
  if (nbytes == 0) return;
  raw_free(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.current_bytes[static_cast<int>(category)] -= static_cast<int64_t>(nbytes);
  stats_.total_current_bytes -= static_cast<int64_t>(nbytes);
}

void Allocator::set_capacity_bytes(int64_t cap_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  cap_bytes_ = cap_bytes;
}

int64_t Allocator::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cap_bytes_;
}

MemStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.total_peak_bytes = stats_.total_current_bytes;
}

}  // namespace scalelab
