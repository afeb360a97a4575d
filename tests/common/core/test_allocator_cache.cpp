// test_allocator_cache.cpp — the caching of freed blocks in the counting allocator
// (common/src/core/allocator.cpp): size classes, reuse without a system call, exact allocated counts beside
// reserved bytes, empty_cache, the cap, the empty-cache-and-retry path after a refusal, threads.
// Caching is on by default only for CUDA, but its code is device-independent: these tests switch it on
// for the CPU allocator (CachingGuard). The allocator is a process-wide singleton, so every test measures
// DELTAS against stats() taken at its start. The counts without caching: tests/common/core/test_tensor.cpp;
// the cache on a GPU: tests/common/core/test_memory_cuda.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory, MemStats
#include "scalelab/core/error.h"      // defines: OutOfMemory
#include "scalelab/core/tensor.h"     // defines: Tensor, DType

namespace {

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::MemCategory;
using scalelab::MemStats;
using scalelab::Tensor;
using scalelab::test::contains;
using scalelab::test::error_message;

constexpr size_t kKiB = size_t{1} << 10;  // bytes
constexpr size_t kMiB = size_t{1} << 20;  // bytes

Allocator& cpu_allocator() { return Allocator::get(Device::CPU); }

int64_t current(const MemStats& s, MemCategory c) { return s.current_bytes[static_cast<int>(c)]; }
int64_t peak(const MemStats& s, MemCategory c) { return s.peak_bytes[static_cast<int>(c)]; }
int64_t cached_and_rounding(const MemStats& s) { return s.reserved_bytes - s.total_current_bytes; }

// Turns caching on for the CPU allocator for one test, and off again when the test ends (also when an
// assertion fails half-way), which gives the cached blocks back: the next test starts with none.
class CachingGuard {
 public:
  CachingGuard() { cpu_allocator().set_caching(true); }
  ~CachingGuard() { cpu_allocator().set_caching(false); }
  CachingGuard(const CachingGuard&) = delete;
  CachingGuard& operator=(const CachingGuard&) = delete;
};

// Sets the CPU allocator's cap (0 = none) or its test-only system limit for one test, restoring none.
class CapGuard {
 public:
  explicit CapGuard(int64_t cap_bytes) { cpu_allocator().set_capacity_bytes(cap_bytes); }
  ~CapGuard() { cpu_allocator().set_capacity_bytes(0); }
  CapGuard(const CapGuard&) = delete;
  CapGuard& operator=(const CapGuard&) = delete;
};
class SystemLimitGuard {
 public:
  explicit SystemLimitGuard(int64_t limit_bytes) { cpu_allocator().set_system_limit_bytes_for_testing(limit_bytes); }
  ~SystemLimitGuard() { cpu_allocator().set_system_limit_bytes_for_testing(0); }
  SystemLimitGuard(const SystemLimitGuard&) = delete;
  SystemLimitGuard& operator=(const SystemLimitGuard&) = delete;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Defaults and size classes

TEST(AllocatorCache, IsOffForCpuAndOnForCudaByDefault) {
  EXPECT_FALSE(cpu_allocator().caching()) << "CPU malloc/free synchronise nothing: the CPU counts stay as they were";
  const char* off = std::getenv("SL_NO_MEMORY_CACHING");
  if (off && off[0] == '1') {
    EXPECT_FALSE(Allocator::get(Device::CUDA).caching()) << "SL_NO_MEMORY_CACHING=1 turns it off";
  } else {
    EXPECT_TRUE(Allocator::get(Device::CUDA).caching()) << "cudaFree synchronises the device: CUDA caches";
  }
}

TEST(AllocatorCache, SizeClassesAre512BytesUpTo1MiBAnd2MiBAbove) {
  EXPECT_EQ(Allocator::size_class(1), 512u);
  EXPECT_EQ(Allocator::size_class(512), 512u);
  EXPECT_EQ(Allocator::size_class(513), 1024u);
  EXPECT_EQ(Allocator::size_class(4004), 4096u);
  EXPECT_EQ(Allocator::size_class(kMiB), kMiB);          // the largest small class
  EXPECT_EQ(Allocator::size_class(kMiB + 1), 2 * kMiB);  // the smallest large class
  EXPECT_EQ(Allocator::size_class(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(Allocator::size_class(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(Allocator::size_class(28 * kMiB + 5), 30 * kMiB);  // ~GPT-2 d12 fp32 weights of one layer
  EXPECT_EQ(Allocator::size_class(SIZE_MAX), SIZE_MAX) << "rounding that would overflow leaves the size alone";
}

// ---------------------------------------------------------------------------------------------
// Reuse and counts

TEST(AllocatorCache, FreedBlockIsReusedForTheSameSizeClassWithoutASystemCall) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  Tensor a = Tensor::empty({250}, DType::F32, Device::CPU, MemCategory::Workspace);  // 1000 bytes: class 1024
  void* const block = a.raw();
  a = Tensor();  // cached, not freed
  const MemStats s0 = alloc.stats();

  Tensor b = Tensor::empty({200}, DType::F32, Device::CPU, MemCategory::Workspace);  // 800 bytes: class 1024
  EXPECT_EQ(b.raw(), block) << "the same size class must get the cached block back";
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.raw_alloc_count, s0.raw_alloc_count) << "a cache hit must not call the system";
  EXPECT_EQ(s1.raw_free_count, s0.raw_free_count);
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes) << "reuse holds no more memory";
  EXPECT_EQ(s1.total_current_bytes - s0.total_current_bytes, 800) << "allocated counts the bytes asked for";

  Tensor c = Tensor::empty({600}, DType::F32, Device::CPU, MemCategory::Workspace);  // 2400 bytes: class 2560
  EXPECT_NE(c.raw(), block);
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.raw_alloc_count, s1.raw_alloc_count + 1) << "another size class needs a new block";
  EXPECT_EQ(s2.reserved_bytes - s1.reserved_bytes, 2560);
}

// As Allocator.CountsCurrentAndPeakBytesPerCategoryExactly (test_tensor.cpp), with caching on: the
// counts the labs and graders assert must not see the size classes or the cache.
TEST(AllocatorCache, AllocatedCountsStayTheBytesAskedForAndReservedHoldsTheClasses) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  alloc.reset_peak();
  const MemStats s0 = alloc.stats();
  {
    Tensor params = Tensor::empty({1001}, DType::F32, Device::CPU, MemCategory::Params);  // 4004 -> 4096
    Tensor grads = Tensor::zeros({3, 7}, DType::BF16, Device::CPU, MemCategory::Grads);   // 42 -> 512
    Tensor acts = Tensor::empty({5}, DType::I32, Device::CPU, MemCategory::Activations);  // 20 -> 512
    const MemStats s1 = alloc.stats();
    EXPECT_EQ(current(s1, MemCategory::Params) - current(s0, MemCategory::Params), 4004);
    EXPECT_EQ(current(s1, MemCategory::Grads) - current(s0, MemCategory::Grads), 42);
    EXPECT_EQ(current(s1, MemCategory::Activations) - current(s0, MemCategory::Activations), 20);
    EXPECT_EQ(peak(s1, MemCategory::Params) - peak(s0, MemCategory::Params), 4004);
    EXPECT_EQ(s1.total_current_bytes - s0.total_current_bytes, 4004 + 42 + 20);
    EXPECT_EQ(s1.total_peak_bytes - s0.total_peak_bytes, 4004 + 42 + 20);
    EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 4096 + 512 + 512);
    EXPECT_GE(s1.reserved_bytes, s1.total_current_bytes);
    EXPECT_EQ(s1.reserved_peak_bytes - s0.reserved_peak_bytes, 4096 + 512 + 512);
  }
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.current_bytes, s0.current_bytes) << "freed tensors leave the allocated counts";
  EXPECT_EQ(s2.total_current_bytes, s0.total_current_bytes);
  EXPECT_EQ(s2.reserved_bytes - s0.reserved_bytes, 4096 + 512 + 512) << "but their blocks stay reserved (cached)";
  EXPECT_EQ(s2.raw_free_count, s0.raw_free_count) << "no system free while caching";
}

TEST(AllocatorCache, EmptyCacheReturnsReservedToTheBlocksInUse) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  const MemStats s0 = alloc.stats();
  Tensor kept = Tensor::empty({300}, DType::F32, Device::CPU, MemCategory::Activations);              // 1200 -> 1536
  { Tensor freed = Tensor::empty({3 * kMiB / 4}, DType::F32, Device::CPU, MemCategory::Workspace); }  // 3 MiB -> 4 MiB
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 1536 + 4 * static_cast<int64_t>(kMiB));

  alloc.empty_cache();
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.reserved_bytes - s0.reserved_bytes, 1536) << "only the block in use stays reserved";
  EXPECT_EQ(s2.raw_free_count - s1.raw_free_count, 1);
  EXPECT_EQ(s2.total_current_bytes - s0.total_current_bytes, 1200);

  kept = Tensor();
  alloc.empty_cache();
  EXPECT_EQ(cached_and_rounding(alloc.stats()), cached_and_rounding(s0)) << "reserved is back to allocated";
}

TEST(AllocatorCache, TurningCachingOffEmptiesTheCacheAndBlocksInUseGoBackWhenFreed) {
  Allocator& alloc = cpu_allocator();
  const MemStats s0 = alloc.stats();
  Tensor in_use;
  {
    CachingGuard caching;
    in_use = Tensor::empty({250}, DType::F32, Device::CPU, MemCategory::Other);           // 1000 -> 1024
    { Tensor freed = Tensor::empty({10}, DType::F32, Device::CPU, MemCategory::Other); }  // 40 -> 512, cached
    EXPECT_EQ(alloc.stats().reserved_bytes - s0.reserved_bytes, 1024 + 512);
  }  // caching off: the cached 512 go back
  EXPECT_FALSE(alloc.caching());
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 1024);
  in_use = Tensor();  // allocated while caching: a whole size class, now freed to the system
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(s2.raw_free_count - s1.raw_free_count, 1);
  EXPECT_EQ(s2.total_current_bytes, s0.total_current_bytes);
}

// Without caching (the CPU default) nothing changes: every free is a system free, reserved == allocated.
TEST(AllocatorCache, WithoutCachingEveryFreeGoesToTheSystemAndReservedEqualsAllocated) {
  Allocator& alloc = cpu_allocator();
  ASSERT_FALSE(alloc.caching());
  const MemStats s0 = alloc.stats();
  Tensor t = Tensor::empty({1001}, DType::F32, Device::CPU, MemCategory::Params);  // 4004 bytes
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 4004) << "no size class without caching";
  EXPECT_EQ(s1.raw_alloc_count - s0.raw_alloc_count, 1);
  t = Tensor();
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.raw_free_count - s0.raw_free_count, 1);
  EXPECT_EQ(s2.reserved_bytes, s0.reserved_bytes);
}

TEST(AllocatorCache, ResetPeakAlsoResetsTheReservedPeak) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  { Tensor t = Tensor::empty({kMiB}, DType::F32, Device::CPU, MemCategory::Workspace); }  // 4 MiB, cached
  alloc.empty_cache();
  alloc.reset_peak();
  const MemStats s = alloc.stats();
  EXPECT_EQ(s.reserved_peak_bytes, s.reserved_bytes);
  EXPECT_EQ(s.total_peak_bytes, s.total_current_bytes);
}

// ---------------------------------------------------------------------------------------------
// The cap and refusals

// The simulated cap applies to allocated bytes as without caching: a 9000-byte tensor fits under a
// 10000-byte headroom although its block (9216 bytes) does not, and a refused request takes nothing.
TEST(AllocatorCache, CapAppliesToAllocatedBytesAndARefusalCountsNothing) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  alloc.reset_peak();
  const MemStats s0 = alloc.stats();
  CapGuard cap(s0.total_current_bytes + 10000);                                              // bytes: 10000 of headroom
  { Tensor t = Tensor::empty({4500}, DType::BF16, Device::CPU, MemCategory::Activations); }  // 9000 -> 9216, cached
  Tensor again = Tensor::empty({4500}, DType::BF16, Device::CPU, MemCategory::Activations);  // from the cache
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.raw_alloc_count - s0.raw_alloc_count, 1);

  const std::string msg = error_message<scalelab::OutOfMemory>([&] {
    alloc.allocate(2000, MemCategory::Activations);
  });  // 11000 in use would pass the cap
  EXPECT_TRUE(contains(msg, "cap")) << msg;
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.total_current_bytes, s1.total_current_bytes);
  EXPECT_EQ(s2.total_peak_bytes, s1.total_peak_bytes);
  EXPECT_EQ(peak(s2, MemCategory::Activations), peak(s1, MemCategory::Activations));
  EXPECT_EQ(s2.reserved_bytes, s1.reserved_bytes) << "a cap refusal asks the system for nothing";
  EXPECT_EQ(s2.raw_alloc_count, s1.raw_alloc_count);
}

// A refused system allocation gives the cache back and retries once: here the system (the test-only
// limit) holds 4 KiB more than at the start; a cached 2 KiB block keeps a 3 KiB request from fitting
// until the cache is emptied. A request that does not fit even then throws, counting nothing.
TEST(AllocatorCache, RefusedSystemAllocationEmptiesTheCacheAndRetriesOnce) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  const MemStats s0 = alloc.stats();
  SystemLimitGuard limit(s0.reserved_bytes + static_cast<int64_t>(4 * kKiB));
  { Tensor t = Tensor::empty({1024}, DType::BF16, Device::CPU, MemCategory::Comm); }  // 2048 bytes, cached
  ASSERT_EQ(alloc.stats().reserved_bytes - s0.reserved_bytes, 2048);

  Tensor t3 = Tensor::empty({1500}, DType::BF16, Device::CPU, MemCategory::Comm);  // 3000 -> 3072: 5120 > 4096
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.cache_flush_count - s0.cache_flush_count, 1);
  EXPECT_EQ(s1.raw_free_count - s0.raw_free_count, 1) << "the cached 2 KiB block went back";
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, 3072);
  EXPECT_EQ(s1.total_current_bytes - s0.total_current_bytes, 3000);

  t3 = Tensor();  // cached: 3072 reserved
  const std::string msg = error_message<scalelab::OutOfMemory>([&] {
    alloc.allocate(8 * kKiB, MemCategory::Comm);
  });  // 8 KiB > 4 KiB even with the cache empty
  EXPECT_TRUE(contains(msg, "refused")) << msg;
  EXPECT_TRUE(contains(msg, "3072 cached bytes")) << msg;
  const MemStats s2 = alloc.stats();
  EXPECT_EQ(s2.cache_flush_count - s1.cache_flush_count, 1);
  EXPECT_EQ(s2.reserved_bytes, s0.reserved_bytes) << "the cache was given back before the second refusal";
  EXPECT_EQ(s2.total_current_bytes, s0.total_current_bytes);
  EXPECT_EQ(s2.total_peak_bytes, s1.total_peak_bytes) << "a refused request leaves the peak alone";
}

// ---------------------------------------------------------------------------------------------
// Threads

// Four threads allocate and free blocks of three size classes, each keeping up to kLive at once and
// filling every byte with its own id: a block handed to two owners at once would show as a wrong byte.
// At the end the allocated counts are back where they started and the system was asked for at most
// kThreads * kLive blocks per class, however many allocations there were.
TEST(AllocatorCache, ThreadsShareTheCacheWithoutHandingABlockToTwoOwners) {
  CachingGuard caching;
  Allocator& alloc = cpu_allocator();
  const MemStats s0 = alloc.stats();
  constexpr int kThreads = 4, kIters = 2000, kLive = 3;
  constexpr size_t kSizes[] = {100, 3000, 70000};  // bytes: classes 512, 3072, 70144
  std::vector<int> bad_bytes(kThreads, 0);
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; id++) {
    threads.emplace_back([&, id] {
      struct Held {
        unsigned char* p;
        size_t nbytes;
      };
      std::vector<Held> held;
      for (int i = 0; i < kIters; i++) {
        const size_t nbytes = kSizes[(i + id) % 3];
        auto* p = static_cast<unsigned char*>(alloc.allocate(nbytes, MemCategory::Workspace));
        std::memset(p, id + 1, nbytes);
        held.push_back({p, nbytes});
        if (static_cast<int>(held.size()) == kLive) {
          for (const Held& h : held) {
            for (size_t k = 0; k < h.nbytes; k++) bad_bytes[id] += h.p[k] != id + 1;
            alloc.deallocate(h.p, h.nbytes, MemCategory::Workspace);
          }
          held.clear();
        }
      }
      for (const Held& h : held) alloc.deallocate(h.p, h.nbytes, MemCategory::Workspace);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int id = 0; id < kThreads; id++) EXPECT_EQ(bad_bytes[id], 0) << "thread " << id;
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.current_bytes, s0.current_bytes);
  EXPECT_EQ(s1.total_current_bytes, s0.total_current_bytes);
  EXPECT_LE(s1.raw_alloc_count - s0.raw_alloc_count, kThreads * kLive * 3)
      << "of " << kThreads * kIters << " allocations";
  EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, cached_and_rounding(s1) - cached_and_rounding(s0))
      << "everything reserved since the start is in the cache";
}
