// cuda_check.h — SL_CUDA_CHECK / SL_CUBLAS_CHECK / SL_CUDA_CHECK_LAST for .cu files (STYLE.md 17-19).
// Only included by CUDA sources (common/src/cuda/); lab code stays device-agnostic.
#pragma once

#include <cuda_runtime.h>

#include "scalelab/error.h"

#define SL_CUDA_CHECK(call)                                                                          \
  do {                                                                                               \
    cudaError_t sl_err_ = (call);                                                                    \
    if (sl_err_ != cudaSuccess)                                                                      \
      ::scalelab::detail::fail("CUDA", #call, __FILE__, __LINE__, __func__,                         \
                               ::scalelab::detail::format("CUDA error '%s'", cudaGetErrorString(sl_err_)), \
                               "rebuild with -DCMAKE_CUDA_ARCHITECTURES=<your sm> (e.g. 90 for H100/H200) "  \
                               "if no kernel image is available; check nvidia-smi otherwise");      \
  } while (0)

// After each kernel launch. With SL_SYNC_LAUNCH=1 in the environment it also synchronises, so an
// asynchronous error names the kernel that caused it.
#define SL_CUDA_CHECK_LAST()                                                                         \
  do {                                                                                               \
    SL_CUDA_CHECK(cudaGetLastError());                                                               \
    if (::scalelab::cuda::sync_launch_enabled()) SL_CUDA_CHECK(cudaDeviceSynchronize());             \
  } while (0)

namespace scalelab::cuda {
bool sync_launch_enabled();  // SL_SYNC_LAUNCH=1
}
