// test_device_errors.cpp — a machine without a usable GPU is told apart from one that is out of memory, and
// both say why (scalelab/core/device.h cuda_unavailable_reason, scalelab/core/cuda_device.h device_malloc).
// These run on every machine: in a CUDA build on a machine without a GPU or driver (cudaGetDeviceCount
// fails, e.g. cudaErrorInsufficientDriver), the skip message, `--device cuda` and the first cudaMalloc
// must name the runtime's error, never "0 devices" alone or "out of memory". On a GPU machine the cases
// that need a failing runtime skip, saying so; test_memory_cuda.cpp checks the real out-of-memory there.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/device.h"     // defines: cuda_device_count, cuda_unavailable_reason, built_with_cuda
#include "scalelab/core/error.h"      // defines: scalelab::Error, scalelab::OutOfMemory
#include "scalelab/driver/driver.h"   // defines: driver::device_from_option

namespace {

using scalelab::test::contains;

// The CUDA runtime itself failed (no driver, driver too old, ...): what this machine gives in a CUDA build.
bool runtime_fails() {
  return scalelab::built_with_cuda() && contains(scalelab::cuda_unavailable_reason(), "cudaGetDeviceCount failed");
}

}  // namespace

TEST(DeviceErrors, TheReasonIsEmptyExactlyWhenADeviceIsUsable) {
  const std::string why = scalelab::cuda_unavailable_reason();
  if (scalelab::cuda_device_count() > 0) {
    EXPECT_EQ(why, "") << "a device is usable, yet a reason was given";
  } else if (!scalelab::built_with_cuda()) {
    EXPECT_EQ(why, "this build has no CUDA backend (nvcc not found)");
  } else {
    // Either the runtime's error by name and text, or the driver's empty list: never an empty reason.
    EXPECT_TRUE(contains(why, "cudaGetDeviceCount")) << why;
    EXPECT_TRUE(contains(why, "cudaError") || contains(why, "found 0 devices")) << why;
  }
}

TEST(DeviceErrors, DeviceCudaSaysWhyNoDeviceIsUsable) {
  if (scalelab::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is usable here: --device cuda succeeds";
  const std::string why = scalelab::cuda_unavailable_reason();
  ASSERT_FALSE(why.empty());
  const std::string msg = scalelab::test::error_message([] { (void)scalelab::driver::device_from_option("cuda"); });
  EXPECT_TRUE(contains(msg, "no CUDA device is available to this program: " + why)) << msg;
}

TEST(DeviceErrors, AFailingRuntimeIsNotReportedAsOutOfMemory) {
  if (!runtime_fails())
    GTEST_SKIP() << "needs a CUDA build where the CUDA runtime fails (no driver); here: "
                 << (scalelab::built_with_cuda() ? "cudaGetDeviceCount succeeds" : "no CUDA backend");
  scalelab::Allocator& gpu = scalelab::Allocator::get(scalelab::Device::CUDA);
  bool out_of_memory = false;
  std::string msg;
  try {
    void* p = gpu.allocate(4096, scalelab::MemCategory::Workspace);
    gpu.deallocate(p, 4096, scalelab::MemCategory::Workspace);
    ADD_FAILURE() << "cudaMalloc succeeded on a machine whose CUDA runtime fails";
  } catch (const scalelab::OutOfMemory& e) {
    out_of_memory = true;
    msg = e.what();
  } catch (const scalelab::Error& e) {
    msg = e.what();
  }
  EXPECT_FALSE(out_of_memory) << "the runtime's error was turned into an out-of-memory:\n" << msg;
  // The runtime's error by name (the same one cudaGetDeviceCount met) and the words that rule out a full GPU.
  const std::string why = scalelab::cuda_unavailable_reason();
  const std::string name =
      why.substr(why.find("cudaError"), why.find(' ', why.find("cudaError")) - why.find("cudaError"));
  EXPECT_TRUE(contains(msg, "cudaMalloc of 4096 bytes failed with " + name)) << msg;
  EXPECT_TRUE(contains(msg, "not an out-of-memory")) << msg;
}
