// allocator.h — the counting allocator: every tensor's bytes go through one Allocator per device,
// which keeps current and peak bytes per category and can refuse allocations beyond a cap
// ("simulated device memory", docs/design.md). Memory targets in the labs are checked from these counts,
// so on CPU they are exact. On CUDA it also caches freed blocks, so a free does not synchronise the GPU
// (docs/cuda_backend.md "Memory"). Tests: tests/common/core/test_tensor.cpp, tests/common/core/test_allocator_cache.cpp
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace scalelab {

// CPU: host memory, CPU kernels, real time. CUDA: a real GPU. SIM: a simulated GPU (docs/simulation.md):
// its memory is host memory the CPU kernels compute on, but it is counted apart from the host's (its own
// Allocator, whose cap is the simulated GPU's capacity) and timed by the virtual clock (core/clock.h).
enum class Device { CPU, CUDA, SIM };
const char* device_name(Device d);  // "cpu", "cuda", "sim"

// What an allocation is for. Labs report memory by these categories (log key memory_<name>_bytes).
enum class MemCategory : int {
  Params = 0,      // model parameters in compute dtype
  Grads,           // parameter gradients
  OptimizerState,  // AdamW m and v, fp32 master weights
  Activations,     // forward activations kept for backward, and their gradients
  Workspace,       // scratch that lives for one op or one step
  Comm,            // communication buffers (buckets, gathered shards)
  Data,            // loader batches
  Other,
  kCount
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
const char* mem_category_name(MemCategory c);  // "params", "grads", "optimizer_state", ...

// Where an allocation lives, counted apart (ZeRO-Offload, Ren et al. 2021: the optimizer state in host
// memory). Device: the allocator's own device memory (the GPU's, the simulated GPU's, or on the CPU backend
// the ordinary memory every tensor takes). Host: memory a program keeps in host RAM on purpose for a device
// (offloaded optimizer state, its staging buffers): only Allocator::get(Device::CPU) holds it, never capped
// or cached, and it is counted in its own MemStats even on the CPU backend, where both are the same RAM, so
// "device memory" means the same thing on every backend.
enum class MemPlace : int { Device = 0, Host };
const char* mem_place_name(MemPlace p);  // "device", "host"

// Two views of memory, as in PyTorch (torch.cuda.memory_allocated vs memory_reserved):
//   allocated  the bytes the tensors asked for (current_bytes, peak_bytes, total_*): exact, what the labs
//              and the graders assert, and what the simulated cap applies to;
//   reserved   the bytes held from the system (malloc / cudaMalloc): the blocks in use, each rounded up to
//              its size class, plus the freed blocks kept in the cache. Without caching it equals the
//              allocated total. reserved_bytes >= total_current_bytes always.
struct MemStats {
  std::array<int64_t, kNumMemCategories> current_bytes{};  // bytes held now, per category
  std::array<int64_t, kNumMemCategories> peak_bytes{};     // max of current_bytes[c] over time
  int64_t total_current_bytes = 0;                         // sum over categories
  int64_t total_peak_bytes = 0;                            // max of the total over time (not sum of peaks)
  int64_t reserved_bytes = 0;       // bytes held from the system now: in use (size classes) + cached
  int64_t reserved_peak_bytes = 0;  // max of reserved_bytes over time
  int64_t raw_alloc_count = 0;      // successful system allocations (malloc / cudaMalloc) since the start
  int64_t raw_free_count = 0;       // system frees (free / cudaFree) since the start
  int64_t cache_flush_count = 0;    // times a refused system allocation emptied the cache and retried
};

// Thread-safe. One instance per device: Allocator::get(Device::CPU).
//
// Caching (on by default for CUDA, off for CPU; set_caching switches it): a freed block is kept in a
// free list of its size class and handed to the next request of the same class without a system call.
// cudaFree synchronises the whole device, so without the cache every temporary freed inside a step
// stalls the GPU. Reusing a block at once is safe because every kernel runs on the one default stream:
// whatever the next owner queues runs after what the previous owner queued (docs/cuda_backend.md).
class Allocator {
 public:
  static Allocator& get(Device device);

  // Returns 64-byte-aligned memory of nbytes (nbytes may be 0: returns nullptr).
  // Throws OutOfMemory when current total + nbytes would exceed the cap, naming the category and the
  // counts, with a hint (smaller batch, more ranks, a higher ZeRO stage); and when the system refuses
  // the block even after the cache was given back to it and the allocation retried once.
  // place Host: only on the CPU allocator (throws otherwise); no cap, no cache, counted in stats(Host).
  void* allocate(size_t nbytes, MemCategory category, MemPlace place = MemPlace::Device);
  // nbytes, category and place must be those given to allocate().
  void deallocate(void* ptr, size_t nbytes, MemCategory category, MemPlace place = MemPlace::Device);

  // Simulated device memory: 0 = no cap. A cap below current usage makes the next allocation fail.
  // The cap applies to allocated bytes (what the tensors asked for), not to reserved bytes.
  void set_capacity_bytes(int64_t cap_bytes);
  int64_t capacity_bytes() const;

  // Caching of freed blocks. Turning it off first empties the cache; blocks in use that came from the
  // cache go back to the system when they are freed. SL_NO_MEMORY_CACHING=1 in the environment turns it
  // off for CUDA at start (so compute-sanitizer can see a use after free).
  void set_caching(bool on);
  bool caching() const;
  // Gives every cached block back to the system (like torch.cuda.empty_cache); reserved bytes drop to
  // the blocks in use. On CUDA, cudaFree synchronises the device: call it between steps, not inside one.
  void empty_cache();

  // The size class of a request when caching: multiples of 512 bytes up to 1 MiB, of 2 MiB above
  // (allocator.cpp says why). A cached block serves only requests of exactly its class.
  static size_t size_class(size_t nbytes);

  // TEST ONLY: the system refuses (as if out of memory) any allocation that would take reserved bytes
  // beyond limit_bytes; 0 = no limit. Lets tests on CPU drive the empty-cache-and-retry path.
  void set_system_limit_bytes_for_testing(int64_t limit_bytes);

  // The counts of one place (Device: everything above; Host: the host place's own, reserved = allocated).
  MemStats stats(MemPlace place = MemPlace::Device) const;
  void reset_peak();  // peak := current, for every category, the total and reserved, in both places

 private:
  explicit Allocator(Device d);
  void* raw_allocate(size_t nbytes);  // malloc/cudaMalloc; nullptr when the system refuses
  void raw_free(void* ptr);
  void* system_allocate(size_t nbytes);            // raw_allocate, the test limit, the reserved counts
  std::vector<void*> take_cache_locked();          // empties the free lists and uncounts them (mu_ held)
  void count_locked(size_t nbytes, int category);  // allocated counts and peaks (mu_ held)

  Device device_;
  mutable std::mutex mu_;
  MemStats stats_;       // place Device
  MemStats host_stats_;  // place Host (CPU allocator only)
  int64_t cap_bytes_ = 0;
  int64_t system_limit_bytes_ = 0;  // test only (set_system_limit_bytes_for_testing)
  bool caching_ = false;
  // Blocks obtained while caching was on: pointer -> size class in bytes, in use or cached. A block not
  // listed here was allocated with caching off, at exactly the size asked, and is never cached.
  std::unordered_map<void*, size_t> class_of_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // size class (bytes) -> cached blocks
  // --timing-only SIM blocks (mmap'ed, never touched; raw_allocate): pointer -> mapped bytes, for munmap.
  std::mutex mapped_mu_;
  std::unordered_map<void*, size_t> mapped_bytes_;
};

}  // namespace scalelab
