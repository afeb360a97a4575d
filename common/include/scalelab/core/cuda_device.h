// cuda_device.h — the CUDA runtime calls the core layer needs: device memory for the counting allocator
// and tensor copies, device discovery, and synchronisation. Defined in common/src/core/cuda/device.cu,
// only in builds with the CUDA backend (SL_WITH_CUDA); callers guard their calls with #ifdef SL_WITH_CUDA.
// No CUDA headers needed. Drivers and tests use the public wrappers of device.h (cuda_device_count, ...),
// which work in every build. The ops' CUDA twins are declared in scalelab/ops/twins.h.
// Tests: tests/common/core/test_tensor.cpp, tests/common/core/test_memory_cuda.cpp
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace scalelab::cuda {

// cudaMalloc of nbytes on the current device; nullptr when the device has no room (cudaErrorMemoryAllocation:
// the allocator reports the out-of-memory with its counts); any other error throws scalelab::Error naming
// it (e.g. cudaErrorInsufficientDriver when the context cannot be created). cudaFree; ignores a free after the CUDA runtime has shut down (exit).
void* device_malloc(size_t nbytes);
void device_free(void* ptr);
// cudaMemcpy with cudaMemcpyDefault (host or device on either side: unified addressing); cudaMemset 0.
void memcpy_any(void* dst, const void* src, size_t nbytes);
void memset_zero(void* dst, size_t nbytes);
// Visible CUDA devices (0 without a GPU or driver; never throws; then *why_none, if given, says why, e.g.
// "cudaGetDeviceCount failed with cudaErrorNoDevice (no CUDA-capable device is detected)"); the current
// device's name and total memory in bytes.
int device_count(std::string* why_none = nullptr);
std::string device_name();
int64_t device_memory_bytes();
// Waits for every operation issued so far (cudaDeviceSynchronize): for timing a step on the host.
void synchronize();
// SL_SYNC_LAUNCH=1 in the environment: SL_CUDA_CHECK_LAST synchronises after each launch (cuda_check.h).
bool sync_launch_enabled();

}  // namespace scalelab::cuda
