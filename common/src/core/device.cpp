// device.cpp — accelerator discovery (device.h). The CUDA query lives in common/src/core/cuda/device.cu.
#include "scalelab/core/device.h"

#include "scalelab/core/cuda_device.h"  // defines: cuda::device_count, device_name, synchronize (with SL_WITH_CUDA)

namespace scalelab {

int cuda_device_count() {
#ifdef SL_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef SL_WITH_CUDA
  std::string why;
  return cuda::device_count(&why) > 0 ? std::string() : why;
#else
  return "this build has no CUDA backend (nvcc not found)";
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
