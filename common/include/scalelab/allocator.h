// allocator.h — the counting allocator: every tensor's bytes go through one Allocator per device,
// which keeps current and peak bytes per category and can refuse allocations beyond a cap
// ("simulated device memory", docs/design.md). Memory targets in the labs are checked from these counts,
// so on CPU they are exact. Tests: tests/common/test_tensor.cpp
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace scalelab {

enum class Device { CPU, CUDA };
const char* device_name(Device d);

// What an allocation is for. Labs report memory by these categories (log key memory_<name>_bytes).
enum class MemCategory : int {
  Params = 0,       // model parameters in compute dtype
  Grads,            // parameter gradients
  OptimizerState,   // AdamW m and v, fp32 master weights
  Activations,      // forward activations kept for backward, and their gradients
  Workspace,        // scratch that lives for one op or one step
  Comm,             // communication buffers (buckets, gathered shards)
  Data,             // loader batches
  Other,
  kCount
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
const char* mem_category_name(MemCategory c);  // "params", "grads", "optimizer_state", ...

struct MemStats {
  std::array<int64_t, kNumMemCategories> current_bytes{};  // bytes held now, per category
  std::array<int64_t, kNumMemCategories> peak_bytes{};     // max of current_bytes[c] over time
  int64_t total_current_bytes = 0;                         // sum over categories
  int64_t total_peak_bytes = 0;                            // max of the total over time (not sum of peaks)
};

// Thread-safe. One instance per device: Allocator::get(Device::CPU).
class Allocator {
 public:
  static Allocator& get(Device device);

  // Returns 64-byte-aligned memory of nbytes (nbytes may be 0: returns nullptr).
  // Throws OutOfMemory when current total + nbytes would exceed the cap, naming the category and the
  // counts, with a hint (smaller batch, more ranks, a higher ZeRO stage).
  void* allocate(size_t nbytes, MemCategory category);
  void deallocate(void* ptr, size_t nbytes, MemCategory category);

  // Simulated device memory: 0 = no cap. A cap below current usage makes the next allocation fail.
  void set_capacity_bytes(int64_t cap_bytes);
  int64_t capacity_bytes() const;

  MemStats stats() const;
  void reset_peak();  // peak := current, for every category and the total

 private:
  explicit Allocator(Device d) : device_(d) {}
  void* raw_allocate(size_t nbytes);  // malloc/cudaMalloc; nullptr when the system refuses
  void raw_free(void* ptr);
  Device device_;
  mutable std::mutex mu_;
  MemStats stats_;
  int64_t cap_bytes_ = 0;
};

}  // namespace scalelab
