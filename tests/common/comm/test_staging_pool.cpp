// test_staging_pool.cpp — the mpi backend's pinned staging pool (scalelab/comm/staging_pool.h) on plain host
// memory: the backend gives it cudaMallocHost/cudaFreeHost, which need a GPU; the bookkeeping is the same.
// Before the pool, every staged call made one cudaMallocHost and one cudaFreeHost (each synchronises the GPU).
#include <gtest/gtest.h>

#include <cstdlib>  // defines: std::malloc, std::free
#include <memory>
#include <set>
#include <vector>

#include "scalelab/comm/staging_pool.h"  // defines: StagingPool
#include "scalelab/core/error.h"         // defines: Error

using scalelab::StagingPool;

namespace {

// A pool over malloc/free that counts the frees and remembers the live buffers.
struct Counted {
  int64_t allocs = 0, frees = 0;
  std::set<void*> live;
  std::shared_ptr<StagingPool> make() {
    return StagingPool::make(
        [this](size_t n) {
          void* p = std::malloc(n);
          ++allocs;
          live.insert(p);
          return p;
        },
        [this](void* p) {
          ++frees;
          live.erase(p);
          std::free(p);
        });
  }
};

}  // namespace

TEST(StagingPool, SizeClassesArePowersOfTwoFromTheMinimum) {
  EXPECT_EQ(StagingPool::size_class(1), StagingPool::kMinClassBytes);
  EXPECT_EQ(StagingPool::size_class(StagingPool::kMinClassBytes), StagingPool::kMinClassBytes);
  EXPECT_EQ(StagingPool::size_class(StagingPool::kMinClassBytes + 1), 2 * StagingPool::kMinClassBytes);
  EXPECT_EQ(StagingPool::size_class(3u << 20), 4u << 20);
}

// The steady state of a training loop: the same calls every step allocate nothing after the first.
TEST(StagingPool, ABufferGivenBackIsReusedWithoutAllocating) {
  Counted c;
  auto pool = c.make();
  void* first = nullptr;
  for (int step = 0; step < 10; ++step) {
    StagingPool::Lease a = pool->acquire(1000);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_GE(a.capacity(), 1000u);
    if (step == 0) first = a.data();
    EXPECT_EQ(a.data(), first) << "step " << step;
  }
  EXPECT_EQ(c.allocs, 1);
  EXPECT_EQ(pool->stats().system_allocations, 1);
  EXPECT_EQ(pool->stats().leased, 0);
}

// Two ops in flight at once (a send posted while a collective stages) never share a buffer, even of one class.
TEST(StagingPool, BuffersInFlightAtOnceAreDistinct) {
  Counted c;
  auto pool = c.make();
  std::vector<StagingPool::Lease> held;
  std::set<void*> seen;
  for (int i = 0; i < 4; ++i) {
    held.push_back(pool->acquire(4096));
    EXPECT_TRUE(seen.insert(held.back().data()).second) << "lease " << i << " got a buffer already leased";
  }
  EXPECT_EQ(pool->stats().leased, 4);
  void* second = held[1].data();
  held[1].reset();                                // one op completes
  StagingPool::Lease again = pool->acquire(100);  // the next takes its buffer, not one still leased
  EXPECT_EQ(again.data(), second);
  EXPECT_EQ(c.allocs, 4);
}

// A bigger request than any buffer grows the pool by a buffer of its class; small buffers stay for small calls.
TEST(StagingPool, GrowsByClassAndFreesEverythingWhenDestroyed) {
  Counted c;
  auto pool = c.make();
  { StagingPool::Lease small = pool->acquire(10); }
  { StagingPool::Lease big = pool->acquire(1u << 20); }
  { StagingPool::Lease big2 = pool->acquire((1u << 20) - 5); }  // same class as big: reused
  { StagingPool::Lease small2 = pool->acquire(20); }
  EXPECT_EQ(c.allocs, 2);
  EXPECT_EQ(pool->stats().buffers, 2);
  EXPECT_EQ(pool->stats().bytes, static_cast<int64_t>(StagingPool::kMinClassBytes + (1u << 20)));
  StagingPool::Lease outlives = pool->acquire(10);
  pool.reset();  // the communicator goes; the lease keeps the pool alive
  EXPECT_EQ(c.frees, 0);
  outlives.reset();
  EXPECT_EQ(c.frees, 2);
  EXPECT_TRUE(c.live.empty());
}

TEST(StagingPool, ARefusedAllocationThrows) {
  auto pool = StagingPool::make([](size_t) -> void* { return nullptr; }, [](void*) {});
  EXPECT_THROW(pool->acquire(10), scalelab::Error);
  EXPECT_EQ(pool->stats().buffers, 0);
}
