// device.cpp — accelerator discovery (device.h). The CUDA query lives in common/src/cuda/device.cu.
#include "scalelab/device.h"

#ifdef SL_WITH_CUDA
namespace scalelab::cuda {
int device_count();  // common/src/cuda/device.cu
}
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

}  // namespace scalelab
