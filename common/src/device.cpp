// device.cpp — accelerator discovery (device.h). The CUDA query lives in common/src/cuda/device.cu.
#include "scalelab/device.h"

#ifdef SL_WITH_CUDA
#include "scalelab/cuda_ops.h"  // defines: cuda::synchronize
namespace scalelab::cuda {
int device_count();        // common/src/cuda/device.cu
std::string device_name();  // common/src/cuda/device.cu
int64_t device_memory_bytes();  // common/src/cuda/device.cu
}  // namespace scalelab::cuda
#endif

namespace scalelab {

int cuda_device_count() {
#ifdef SL_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool built_with_cuda() {
#ifdef SL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string cuda_device_name() {
#ifdef SL_WITH_CUDA
  return cuda_device_count() > 0 ? cuda::device_name() : std::string();
#else
  return std::string();
#endif
}

int64_t cuda_device_memory_bytes() {
#ifdef SL_WITH_CUDA
  return cuda_device_count() > 0 ? cuda::device_memory_bytes() : 0;
#else
  return 0;
#endif
}

void device_synchronize(Device device) {
#ifdef SL_WITH_CUDA
  if (device == Device::CUDA) cuda::synchronize();
#else
  (void)device;
#endif
}

}  // namespace scalelab
