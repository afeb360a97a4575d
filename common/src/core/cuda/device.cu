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
// Only cudaErrorMemoryAllocation means "no room": nullptr, and the allocator reports OutOfMemory with its
// counts. The first cudaMalloc of a process also creates the CUDA context, so any other error (no driver,
// a device in exclusive mode held by another process, an ECC error, ...) is thrown here under its own name.
void* device_malloc(size_t nbytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, nbytes);
  if (err == cudaSuccess) return p;
  (void)cudaGetLastError();  // clear the error so that the next CUDA call does not report it again
  if (err == cudaErrorMemoryAllocation) return nullptr;
  detail::fail("CUDA", "cudaMalloc(&p, nbytes)", __FILE__, __LINE__, __func__,
               detail::format("cudaMalloc of %zu bytes failed with %s (%s) on dev %d: not an out-of-memory", nbytes,
                              cudaGetErrorName(err), cudaGetErrorString(err), current_device()),
               "the first cudaMalloc creates the CUDA context: check nvidia-smi (driver loaded, compute mode not "
               "exclusive to another process, no ECC errors) and that the driver supports this CUDA runtime");
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

// Number of visible CUDA devices; 0 when there is no GPU or no driver (tests skip visibly then), and then
// *why_none (if given) says why: the runtime's error by name and text, or that the driver lists none.
int device_count(std::string* why_none) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why_none)
      *why_none =
          detail::format("cudaGetDeviceCount failed with %s (%s)", cudaGetErrorName(err), cudaGetErrorString(err));
    return 0;
  }
  if (n == 0 && why_none) *why_none = "cudaGetDeviceCount found 0 devices (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
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
