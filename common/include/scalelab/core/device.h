// device.h — what accelerators this process can use, for drivers and for tests that must skip
// visibly without a GPU (docs/style.md 30: SL_REQUIRE_GPU()). Works in builds with and without CUDA.
#pragma once

#include <cstdint>
#include <string>

#include "scalelab/core/allocator.h"  // defines: Device

namespace scalelab {

// Number of CUDA devices this process can use: 0 in a build without CUDA, without a driver, or
// without a GPU. Never throws.
int cuda_device_count();
// Why this process can use no CUDA device: "" when cuda_device_count() > 0; otherwise the CUDA runtime's
// own reason, e.g. "cudaGetDeviceCount failed with cudaErrorInsufficientDriver (CUDA driver version is
// insufficient for CUDA runtime version)", or "this build has no CUDA backend (nvcc not found)".
// What a GPU test's skip and `--device cuda` print. Never throws.
std::string cuda_unavailable_reason();
// True when this build contains the CUDA backend (compiled where nvcc was found).
bool built_with_cuda();
// The current CUDA device's name, e.g. "NVIDIA H200"; "" without one.
std::string cuda_device_name();
// The current CUDA device's total memory in bytes (what the driver reports, e.g. about 141e9 on an H200);
// 0 without one. For sizing decisions such as choose_attention (gpt2.h).
int64_t cuda_device_memory_bytes();
// Waits until all work queued on `device` has finished (no-op on the CPU). GPU work is asynchronous:
// call it before reading a clock that times GPU work.
void device_synchronize(Device device);

}  // namespace scalelab

// In a GoogleTest body: skip (reported as "Skipped" by ctest, never a silent pass) without a GPU, saying why.
#define SL_REQUIRE_GPU()                                                                  \
  do {                                                                                    \
    if (::scalelab::cuda_device_count() == 0)                                             \
      GTEST_SKIP() << "no usable CUDA device: " << ::scalelab::cuda_unavailable_reason(); \
  } while (0)
