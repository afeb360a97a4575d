// staging_pool.h — the pinned host buffers the mpi backend stages CUDA tensors through (common/src/comm/mpi.cpp
// HostStage), kept and reused across calls instead of one cudaMallocHost + cudaFreeHost per call (each of
// which synchronises the device). The pool is given its alloc/free functions, so its bookkeeping is the same
// on any machine: mpi.cpp gives it cudaMallocHost/cudaFreeHost, the tests plain counters.
// Tests: tests/common/comm/test_staging_pool.cpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace scalelab {

// Grow-only, by size class: a request of n bytes takes an idle buffer of its class (the next power of two,
// at least kMinClassBytes) or, when none is idle, a new one from alloc. A buffer goes back to the idle list
// of its class when its Lease ends, never to the system: the pool holds at most what the most calls in flight
// at once needed, each rounded up to its class (under 2x). Every buffer is freed when the pool is destroyed,
// which is when the communicator that made it and the last Lease are gone (a Lease keeps its pool alive).
// Thread-safe: a call may stage on the caller's thread while the communication thread stages another.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  using AllocFn = std::function<void*(size_t nbytes)>;  // nullptr or throw when the system refuses
  using FreeFn = std::function<void(void* ptr)>;
  static constexpr size_t kMinClassBytes = 64 * 1024;

  // One buffer, held by one in-flight op until the Lease is destroyed or reset. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { reset(); }
    void reset();                        // gives the buffer back to the pool now
    void* data() const { return ptr_; }  // capacity() bytes, at least the bytes asked for
    size_t capacity() const { return bytes_; }

   private:
    friend class StagingPool;
    std::shared_ptr<StagingPool> pool_;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
  };

  struct Stats {
    int64_t system_allocations = 0;  // alloc calls made (new buffers) since the pool was made
    int64_t buffers = 0;             // buffers held, idle or leased
    int64_t leased = 0;              // buffers held by a Lease now
    int64_t bytes = 0;               // bytes held from the system (sum of the buffers' classes)
  };

  static std::shared_ptr<StagingPool> make(AllocFn alloc, FreeFn free);
  ~StagingPool();  // frees every buffer (none can be leased: a Lease keeps the pool alive)
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least nbytes (> 0) that no other Lease holds. Throws scalelab::Error when alloc refuses.
  Lease acquire(size_t nbytes);
  Stats stats() const;
  static size_t size_class(size_t nbytes);  // the next power of two >= nbytes, at least kMinClassBytes

 private:
  StagingPool(AllocFn alloc, FreeFn free) : alloc_(std::move(alloc)), free_(std::move(free)) {}
  void give_back(void* ptr, size_t bytes);

  AllocFn alloc_;
  FreeFn free_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> idle_;  // size class (bytes) -> buffers no Lease holds
  std::vector<void*> all_;                     // every buffer held, for the destructor
  Stats stats_;
};

}  // namespace scalelab
