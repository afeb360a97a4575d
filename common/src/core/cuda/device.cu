// device.cu — the CUDA runtime calls of the core layer (scalelab/core/cuda_device.h): device memory for the
// counting allocator and tensor copies, device discovery, synchronisation. The CUDA ops live in the ops
// layer (common/src/ops/cuda/, declared in scalelab/ops/twins.h).
// Tests: tests/common/core/test_tensor.cpp, tests/common/core/test_memory_cuda.cpp
#include <cstdint>
#include <cstdlib>
#include <string>

#include "scalelab/core/cuda_check.h"   // defines: SL_CUDA_CHECK
#include "scalelab/core/cuda_device.h"  // defines: the declarations implemented here

namespace scalelab::cuda {

bool sync_launch_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SL_SYNC_LAUNCH");
    return v && v[0] == '1';
  }();
  return on;
}

// The counting allocator's system calls (common/src/core/allocator.cpp): it caches freed blocks, so these
// run only when the cache has no block of the size class (device_malloc) and for empty_cache, a retry
// after a refusal, or caching turned off (device_free; cudaFree synchronises the whole device).
void* device_malloc(size_t nbytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, nbytes) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error; the allocator reports out-of-memory
    return nullptr;
  }
  return p;
}

void device_free(void* ptr) {
  const cudaError_t err = cudaFree(ptr);
  // A tensor destroyed during static destruction can free after the CUDA runtime has shut down. The
  // memory went back with the context then; throwing from a destructor at exit would only crash.
  if (err == cudaErrorCudartUnloading) {
    (void)cudaGetLastError();
    return;
  }
  SL_CUDA_CHECK(err);
}

void memcpy_any(void* dst, const void* src, size_t nbytes) {
  SL_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

void memset_zero(void* dst, size_t nbytes) { SL_CUDA_CHECK(cudaMemset(dst, 0, nbytes)); }

// Number of visible CUDA devices; 0 when there is no GPU or no driver (tests skip visibly then).
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// Name of the current device, e.g. "NVIDIA H200" (cudaDeviceProp::name).
std::string device_name() {
  int dev = 0;
  SL_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  SL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}

// Total memory of the current device in bytes (cudaDeviceProp::totalGlobalMem), e.g. 141 GB on an H200.
int64_t device_memory_bytes() {
  int dev = 0;
  SL_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  SL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return static_cast<int64_t>(prop.totalGlobalMem);
}

void synchronize() { SL_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace scalelab::cuda
