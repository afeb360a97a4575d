// cuda_check.h — SL_CUDA_CHECK / SL_CUDA_CHECK_LAST / SL_CUBLAS_CHECK for CUDA sources (docs/style.md 17-19).
// Included by common/src/ops/cuda/*.cu and by host code that calls the CUDA runtime (the MPI backend's
// staging); lab code stays device-agnostic. Needs only cuda_runtime.h: cuBLAS statuses are passed as
// int, so a file that includes this header needs no cuBLAS headers. Every failure throws
// scalelab::Error with one report block: statement, file:line, function, rank, device, message, hint.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "scalelab/core/error.h"

namespace scalelab::cuda {
bool sync_launch_enabled();                     // SL_SYNC_LAUNCH=1 (common/src/core/cuda/device.cu)
int current_device();                           // cudaGetDevice, -1 if that fails (common/src/ops/cuda/context.cu)
std::string cublas_status_message(int status);  // "cuBLAS error CUBLAS_STATUS_... (<text>) on dev N"
const char* cublas_status_hint(int status);     // what to do about it
}  // namespace scalelab::cuda

#define SL_CUDA_CHECK(call)                                                                                          \
  do {                                                                                                               \
    cudaError_t sl_err_ = (call);                                                                                    \
    if (sl_err_ != cudaSuccess)                                                                                      \
      ::scalelab::detail::fail("CUDA", #call, __FILE__, __LINE__, __func__,                                          \
                               ::scalelab::detail::format("CUDA error %s '%s' on dev %d", cudaGetErrorName(sl_err_), \
                                                          cudaGetErrorString(sl_err_),                               \
                                                          ::scalelab::cuda::current_device()),                       \
                               "rebuild with -DCMAKE_CUDA_ARCHITECTURES=<your sm> (e.g. 90 for H100/H200) "          \
                               "if no kernel image is available; run with SL_SYNC_LAUNCH=1 to find the "             \
                               "kernel behind an asynchronous error; check nvidia-smi otherwise");                   \
  } while (0)

// After each kernel launch. With SL_SYNC_LAUNCH=1 in the environment it also synchronises, so an
// asynchronous error names the kernel that caused it.
#define SL_CUDA_CHECK_LAST()                                                             \
  do {                                                                                   \
    SL_CUDA_CHECK(cudaGetLastError());                                                   \
    if (::scalelab::cuda::sync_launch_enabled()) SL_CUDA_CHECK(cudaDeviceSynchronize()); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// cuBLAS and cuBLASLt: wrap every call that returns a cublasStatus_t (0 is CUBLAS_STATUS_SUCCESS).
//   SL_CUBLAS_CHECK(cublasGemmEx(handle, ...));   SL_CUBLAS_CHECK(cublasLtMatmul(lt, ...));
#define SL_CUBLAS_CHECK(call)                                                              \
  do {                                                                                     \
    const int sl_cublas_status_ = static_cast<int>(call);                                  \
    if (sl_cublas_status_ != 0 /* CUBLAS_STATUS_SUCCESS */)                                \
      ::scalelab::detail::fail("cuBLAS", #call, __FILE__, __LINE__, __func__,              \
                               ::scalelab::cuda::cublas_status_message(sl_cublas_status_), \
                               ::scalelab::cuda::cublas_status_hint(sl_cublas_status_));   \
  } while (0)
