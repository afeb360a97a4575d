// allocator.cpp — the counting allocator (allocator.h). CPU memory is 64-byte aligned (cache line,
// AVX-512 friendly). CUDA memory goes through cudaMalloc in the CUDA backend (common/src/core/cuda/device.cu).
// The caching of freed blocks is plain C++ here, the same on both devices, so it is tested on CPU
// (tests/common/core/test_allocator_cache.cpp) although only CUDA has it on by default.
// Design: the simplest form of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp):
// exact size classes, one free list per class, no splitting or merging of blocks, one stream.
#include "scalelab/core/allocator.h"

#include <algorithm>  // defines: std::max (host counts)
#include <cstdint>
#include <cstdlib>
#include <new>

#include <sys/mman.h>  // defines: mmap, munmap (--timing-only SIM blocks)

#include "scalelab/core/error.h"
#include "scalelab/core/sim_gpu.h"  // defines: sim_timing_only (--timing-only: SIM blocks are reserved address space)

#include "scalelab/core/cuda_device.h"  // defines: cuda::device_malloc, cuda::device_free (with SL_WITH_CUDA)

namespace scalelab {

namespace {

// Size classes. A cached block serves only requests of exactly its class (no splitting), so the
// classes trade memory lost to rounding against how often a freed block fits the next request:
// - up to 1 MiB, multiples of 512 bytes: at most 511 bytes lost per tensor; 512 is PyTorch's
//   kMinBlockSize and a multiple of cudaMalloc's 256-byte alignment;
// - above 1 MiB, multiples of 2 MiB: the GPU maps device memory in 2 MiB pages and cudaMalloc's large
//   allocations are made of them (PyTorch's kRoundLarge is 2 MiB for the same reason), and a model's big
//   tensors (weights, activations of one layer) recur at the same sizes every layer and step, so a coarse
//   class still matches. At most 2 MiB - 1 byte is lost per tensor: under 7 % from 28 MiB up (GPT-2 d12's
//   per-layer fp32 weights), but up to half of a tensor just over 1 MiB.
constexpr size_t kSmallGranularityBytes = 512;              // bytes
constexpr size_t kSmallLimitBytes = size_t{1} << 20;        // bytes (1 MiB): largest "small" class
constexpr size_t kLargeGranularityBytes = size_t{2} << 20;  // bytes (2 MiB)

// n rounded up to a multiple of g; n itself where that would overflow (the system refuses it anyway).
size_t round_up(size_t n, size_t g) {
  if (n > SIZE_MAX - (g - 1)) return n;
  return (n + g - 1) / g * g;
}

}  // namespace

const char* device_name(Device d) {
  switch (d) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
    case Device::SIM: return "sim";
  }
  return "?";
}

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

const char* mem_place_name(MemPlace p) { return p == MemPlace::Host ? "host" : "device"; }

Allocator::Allocator(Device d) : device_(d) {
  if (d == Device::CUDA) {
    const char* off = std::getenv("SL_NO_MEMORY_CACHING");
    caching_ = !(off && off[0] == '1');
  }
}

Allocator& Allocator::get(Device device) {
  // Created on first use and never destroyed (deliberately leaked). A destructor would run during static
  // destruction, possibly after the CUDA runtime has shut down (cudaFree then fails: a crash at exit),
  // and possibly before a static Tensor that still frees into it. So the cached blocks are not given back
  // at exit: the OS and the CUDA driver reclaim all of a process's memory when it ends.
  static Allocator* const cpu = new Allocator(Device::CPU);
  static Allocator* const gpu = new Allocator(Device::CUDA);
  static Allocator* const sim = new Allocator(Device::SIM);  // host memory, counted apart from the host's
  switch (device) {
    case Device::CPU: return *cpu;
    case Device::CUDA: return *gpu;
    case Device::SIM: return *sim;
  }
  return *cpu;
}

size_t Allocator::size_class(size_t nbytes) {
  return nbytes <= kSmallLimitBytes ? round_up(nbytes, kSmallGranularityBytes)
                                    : round_up(nbytes, kLargeGranularityBytes);
}

void* Allocator::allocate(size_t nbytes, MemCategory category, MemPlace place) {
  if (nbytes == 0) return nullptr;
  const int c = static_cast<int>(category);
  if (place == MemPlace::Host) {  // host memory held for a device: exact size, no cap, no cache
    SL_CHECK_HINT(device_ == Device::CPU, "allocate host memory with Device::CPU (Tensor::empty(..., MemPlace::Host))",
                  "%s memory cannot be in the host place", device_name(device_));
    void* p = raw_allocate(nbytes);
    if (!p)
      detail::fail_oom(__FILE__, __LINE__, __func__,
                       detail::format("the system refused %zu bytes of host memory for %s", nbytes,
                                      mem_category_name(category)),
                       "use a smaller model, or offload less");
    std::lock_guard<std::mutex> lock(mu_);
    MemStats& h = host_stats_;
    h.current_bytes[c] += static_cast<int64_t>(nbytes);
    h.total_current_bytes += static_cast<int64_t>(nbytes);
    h.peak_bytes[c] = std::max(h.peak_bytes[c], h.current_bytes[c]);
    h.total_peak_bytes = std::max(h.total_peak_bytes, h.total_current_bytes);
    h.reserved_bytes = h.total_current_bytes;
    h.reserved_peak_bytes = h.total_peak_bytes;
    h.raw_alloc_count++;
    return p;
  }
  // 1. Under the lock: refuse early what the cap forbids (no real allocation is attempted then); when
  //    caching, take a cached block of the request's size class and count it: no system call.
  // 2. Otherwise ask the system, outside the lock (cudaMalloc is slow). If it refuses and the cache holds
  //    blocks, give them all back to the system and ask once more (PyTorch does the same before it raises
  //    out-of-memory): the cache must never be the reason an allocation fails.
  // 3. Count, re-checking the cap under the lock (another thread may have allocated meanwhile).
  // Counting only after a successful allocation keeps current AND peak bytes exact on every failure.
  auto over_cap = [&](int64_t want) { return cap_bytes_ > 0 && want > cap_bytes_; };
  auto fail_cap = [&](int64_t want) {
    detail::fail_oom(
        __FILE__, __LINE__, __func__,
        detail::format("out of memory on %s: %zu bytes for %s would make %lld bytes in use, "
                       "cap is %lld bytes (simulated device memory)",
                       device_name(device_), nbytes, mem_category_name(category), static_cast<long long>(want),
                       static_cast<long long>(cap_bytes_)),
        "use a smaller batch or model, --recompute selective or full (keep fewer activations), --attention "
        "flash (lab 01: no (B,NH,T,T) scores), more ranks, "
        "or a higher ZeRO stage; or raise --memory-cap-mb");
  };
  bool from_cache_path = false;  // caching was on: the block is a whole size class and may be cached later
  size_t block_bytes = nbytes;   // what the system is asked for
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t want = stats_.total_current_bytes + static_cast<int64_t>(nbytes);
    if (over_cap(want)) fail_cap(want);
    if (caching_) {
      from_cache_path = true;
      block_bytes = size_class(nbytes);
      auto it = free_blocks_.find(block_bytes);
      if (it != free_blocks_.end() && !it->second.empty()) {
        void* p = it->second.back();  // the most recently freed: likeliest still in cache (CPU) or L2 (GPU)
        it->second.pop_back();
        count_locked(nbytes, c);
        return p;
      }
    }
  }
  void* p = system_allocate(block_bytes);
  int64_t given_back_bytes = 0;
  if (!p) {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t reserved_before = stats_.reserved_bytes;
      blocks = take_cache_locked();
      given_back_bytes = reserved_before - stats_.reserved_bytes;
      if (!blocks.empty()) stats_.cache_flush_count++;
    }
    for (void* b : blocks) raw_free(b);
    if (!blocks.empty()) p = system_allocate(block_bytes);
  }
  if (!p) {
    detail::fail_oom(__FILE__, __LINE__, __func__,
                     detail::format("the system refused %zu bytes for %s on %s (a block of %zu bytes; "
                                    "%lld cached bytes were given back to it first)",
                                    nbytes, mem_category_name(category), device_name(device_), block_bytes,
                                    static_cast<long long>(given_back_bytes)),
                     "use a smaller batch or model");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (from_cache_path) class_of_[p] = block_bytes;
  const int64_t want = stats_.total_current_bytes + static_cast<int64_t>(nbytes);
  if (over_cap(want)) {
    if (from_cache_path && caching_) {
      free_blocks_[block_bytes].push_back(p);  // a good block: keep it for the next request of its class
    } else {
      class_of_.erase(p);
      stats_.reserved_bytes -= static_cast<int64_t>(block_bytes);
      stats_.raw_free_count++;
      raw_free(p);  // under the lock, on this rare path only (fail_cap throws with the lock held)
    }
    fail_cap(want);
  }
  count_locked(nbytes, c);
  return p;
}

void Allocator::deallocate(void* ptr, size_t nbytes, MemCategory category, MemPlace place) {
  if (nbytes == 0) return;
  if (place == MemPlace::Host) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      MemStats& h = host_stats_;
      h.current_bytes[static_cast<int>(category)] -= static_cast<int64_t>(nbytes);
      h.total_current_bytes -= static_cast<int64_t>(nbytes);
      h.reserved_bytes = h.total_current_bytes;
      h.raw_free_count++;
    }
    raw_free(ptr);
    return;
  }
  size_t block_bytes = nbytes;  // a block allocated with caching off is exactly the size asked
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes[static_cast<int>(category)] -= static_cast<int64_t>(nbytes);
    stats_.total_current_bytes -= static_cast<int64_t>(nbytes);
    auto it = class_of_.find(ptr);
    if (it != class_of_.end()) {
      if (caching_) {
        free_blocks_[it->second].push_back(ptr);  // cached: still reserved, no system call
        return;
      }
      block_bytes = it->second;
      class_of_.erase(it);
    }
    stats_.reserved_bytes -= static_cast<int64_t>(block_bytes);
    stats_.raw_free_count++;
  }
  raw_free(ptr);  // outside the lock: cudaFree waits for the whole device
}

void Allocator::count_locked(size_t nbytes, int c) {
  stats_.current_bytes[c] += static_cast<int64_t>(nbytes);
  stats_.total_current_bytes += static_cast<int64_t>(nbytes);
  if (stats_.current_bytes[c] > stats_.peak_bytes[c]) stats_.peak_bytes[c] = stats_.current_bytes[c];
  if (stats_.total_current_bytes > stats_.total_peak_bytes) stats_.total_peak_bytes = stats_.total_current_bytes;
}

void* Allocator::system_allocate(size_t nbytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Test only. Checked here and counted below without holding the lock across raw_allocate, so two
    // threads may both pass it; the tests that set a limit allocate from one thread.
    if (system_limit_bytes_ > 0 && stats_.reserved_bytes + static_cast<int64_t>(nbytes) > system_limit_bytes_) {
      return nullptr;
    }
  }
  void* p = raw_allocate(nbytes);
  if (!p) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reserved_bytes += static_cast<int64_t>(nbytes);
  stats_.raw_alloc_count++;
  if (stats_.reserved_bytes > stats_.reserved_peak_bytes) stats_.reserved_peak_bytes = stats_.reserved_bytes;
  return p;
}

std::vector<void*> Allocator::take_cache_locked() {
  std::vector<void*> blocks;
  for (auto& [block_bytes, list] : free_blocks_) {
    for (void* p : list) {
      blocks.push_back(p);
      class_of_.erase(p);
      stats_.reserved_bytes -= static_cast<int64_t>(block_bytes);
    }
  }
  free_blocks_.clear();
  stats_.raw_free_count += static_cast<int64_t>(blocks.size());
  return blocks;
}

void* Allocator::raw_allocate(size_t nbytes) {
  if (device_ == Device::SIM && sim_timing_only()) {
    // --timing-only (docs/simulation.md "Timing-only runs"): address space, not memory. MAP_NORESERVE
    // reserves no swap or commit charge, and the kernel backs a page only when it is first written, which
    // nothing but the few bytes of host values (SimRealDataScope) ever is. So 64 ranks of a 7B model hold
    // their exact SIM counts in a few MB of host memory. Pointers stay valid and distinct: views, shards and
    // offsets work as in a real run.
    void* p = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(mapped_mu_);
    mapped_bytes_[p] = nbytes;
    return p;
  }
  if (device_ != Device::CUDA) {                  // CPU, and the simulated GPU's memory, which is host memory
    const size_t rounded = round_up(nbytes, 64);  // aligned_alloc needs a multiple of the alignment
    if (rounded % 64 != 0) return nullptr;        // only where rounding would overflow: no system grants it
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
  if (device_ == Device::SIM) {  // a timing-only block (raw_allocate): given back with munmap
    size_t mapped = 0;
    {
      std::lock_guard<std::mutex> lock(mapped_mu_);
      auto it = mapped_bytes_.find(ptr);
      if (it != mapped_bytes_.end()) {
        mapped = it->second;
        mapped_bytes_.erase(it);
      }
    }
    if (mapped > 0) {
      munmap(ptr, mapped);
      return;
    }
  }
  if (device_ != Device::CUDA) {
    std::free(ptr);
  } else {
#ifdef SL_WITH_CUDA
    cuda::device_free(ptr);
#endif
  }
}

void Allocator::set_caching(bool on) {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    caching_ = on;
    if (!on) blocks = take_cache_locked();
  }
  for (void* p : blocks) raw_free(p);
}

bool Allocator::caching() const {
  std::lock_guard<std::mutex> lock(mu_);
  return caching_;
}

void Allocator::empty_cache() {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks = take_cache_locked();
  }
  for (void* p : blocks) raw_free(p);  // outside the lock, as in deallocate
}

void Allocator::set_system_limit_bytes_for_testing(int64_t limit_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  system_limit_bytes_ = limit_bytes;
}

void Allocator::set_capacity_bytes(int64_t cap_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  cap_bytes_ = cap_bytes;
}

int64_t Allocator::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cap_bytes_;
}

MemStats Allocator::stats(MemPlace place) const {
  std::lock_guard<std::mutex> lock(mu_);
  return place == MemPlace::Host ? host_stats_ : stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.total_peak_bytes = stats_.total_current_bytes;
  stats_.reserved_peak_bytes = stats_.reserved_bytes;
  host_stats_.peak_bytes = host_stats_.current_bytes;
  host_stats_.total_peak_bytes = host_stats_.total_current_bytes;
  host_stats_.reserved_peak_bytes = host_stats_.reserved_bytes;
}

}  // namespace scalelab
