// test_memory_cuda.cpp — device memory on the GPU: tensors copied to the device and back, counted by the
// allocator (scalelab/core/allocator.h), and the caching of freed device blocks (a free must not reach cudaFree,
// which synchronises the device; the next request of the same size class reuses the block). The caching
// logic itself is tested on the CPU in tests/common/core/test_allocator_cache.cpp. Each test skips visibly
// without a GPU (docs/style.md 30); on a GPU machine: ctest -L gpu (docs/cuda_backend.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory, MemStats
#include "scalelab/core/device.h"     // defines: SL_REQUIRE_GPU
#include "scalelab/core/error.h"      // defines: scalelab::OutOfMemory
#include "scalelab/core/tensor.h"     // defines: Tensor, DType

namespace {

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::MemCategory;
using scalelab::MemStats;
using scalelab::Tensor;

constexpr size_t kMiB = size_t{1} << 20;  // bytes

int64_t current(const MemStats& s, MemCategory c) { return s.current_bytes[static_cast<int>(c)]; }

}  // namespace

TEST(TensorCuda, CopyToTheDeviceAndBackIsExactAndCounted) {
  SL_REQUIRE_GPU();
  Allocator& gpu = Allocator::get(Device::CUDA);
  const MemStats s0 = gpu.stats();
  Tensor h_x = Tensor::empty({1000});
  for (int k = 0; k < 1000; ++k) h_x.data<float>()[k] = 0.001f * static_cast<float>(k * k % 997) - 0.5f;
  Tensor d_x = Tensor::empty({1000}, DType::F32, Device::CUDA, MemCategory::Workspace);
  EXPECT_EQ(current(gpu.stats(), MemCategory::Workspace) - current(s0, MemCategory::Workspace), 4000);
  d_x.copy_from(h_x);
  Tensor d_y = Tensor::empty({1000}, DType::F32, Device::CUDA);  // device to device too
  d_y.copy_from(d_x);
  Tensor h_y = Tensor::zeros({1000});
  h_y.copy_from(d_y);
  EXPECT_EQ(std::memcmp(h_x.data<float>(), h_y.data<float>(), h_x.nbytes()), 0);
  d_y.zero_();
  h_y.copy_from(d_y);
  for (int k = 0; k < 1000; ++k) ASSERT_EQ(h_y.data<float>()[k], 0.0f) << k;
}

TEST(AllocatorCache, CudaFreeIsCachedAndTheNextSameClassRequestReusesIt) {
  SL_REQUIRE_GPU();
  Allocator& alloc = Allocator::get(Device::CUDA);
  if (!alloc.caching()) GTEST_SKIP() << "SL_NO_MEMORY_CACHING=1 turned caching off";
  void* block = nullptr;
  {
    Tensor d_a = Tensor::empty({3 * kMiB}, DType::F32, Device::CUDA, MemCategory::Activations);
    block = d_a.raw();
  }
  const MemStats s0 = alloc.stats();
  Tensor d_b = Tensor::empty({3 * kMiB - 100}, DType::F32, Device::CUDA, MemCategory::Activations);  // same class
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(d_b.raw(), block);
  EXPECT_EQ(s1.raw_alloc_count, s0.raw_alloc_count) << "no cudaMalloc";
  EXPECT_EQ(s1.raw_free_count, s0.raw_free_count) << "and no cudaFree before it";
  EXPECT_EQ(s1.total_current_bytes - s0.total_current_bytes, static_cast<int64_t>((3 * kMiB - 100) * 4));
  d_b = Tensor();
  alloc.empty_cache();
  const MemStats s2 = alloc.stats();
  EXPECT_GE(s2.raw_free_count - s1.raw_free_count, 1) << "empty_cache gave the cached block back (cudaFree)";
  EXPECT_LE(s2.reserved_bytes, s0.reserved_bytes - static_cast<int64_t>(12 * kMiB));
}

// Only cudaErrorMemoryAllocation becomes OutOfMemory (device.cu device_malloc): a request larger than any
// GPU (1 PiB) is refused as out-of-memory, with the allocator's counts, and leaves nothing counted or
// sticky (the next allocation succeeds). tests/common/core/test_device_errors.cpp checks the other side:
// a failing runtime is not reported as out-of-memory.
TEST(AllocatorCache, AnImpossibleCudaRequestIsOutOfMemory) {
  SL_REQUIRE_GPU();
  Allocator& gpu = Allocator::get(Device::CUDA);
  const MemStats s0 = gpu.stats();
  EXPECT_THROW((void)gpu.allocate(size_t{1} << 50, MemCategory::Workspace), scalelab::OutOfMemory);
  EXPECT_EQ(gpu.stats().total_current_bytes, s0.total_current_bytes);
  Tensor d_x = Tensor::zeros({1000}, DType::F32, Device::CUDA);  // no sticky error left behind
  EXPECT_EQ(d_x.numel(), 1000);
}
