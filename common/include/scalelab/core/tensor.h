// tensor.h — a small owning/view tensor: shape, dtype, device, always contiguous.
// Storage comes from the counting Allocator (allocator.h), tagged with a MemCategory.
// A view shares its parent's storage (no bytes counted twice). Host code reads a device tensor only
// through a copy (DeviceCodeScope below). Tests: tests/common/core/test_tensor.cpp, tests/common/core/test_sim_gpu.cpp
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/core/allocator.h"
#include "scalelab/core/bf16.h"

namespace scalelab {

enum class DType { F32, BF16, I32 };
size_t dtype_size(DType dt);       // bytes per element: 4, 2, 4
const char* dtype_name(DType dt);  // "f32", "bf16", "i32"

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(4, 256, 768)"

class Tensor {
 public:
  Tensor() = default;  // empty: numel() == 0, data() == nullptr

  // Allocates (uninitialised) storage of numel(shape) * dtype_size(dtype) bytes.
  // Throws OutOfMemory beyond the allocator's cap. place Host (a CPU tensor only): host memory kept for a
  // device, counted apart (allocator.h MemPlace), e.g. offloaded optimizer state.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                      MemCategory category = MemCategory::Other, MemPlace place = MemPlace::Device);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                      MemCategory category = MemCategory::Other, MemPlace place = MemPlace::Device);

  // A view of elements [offset, offset + numel(shape)) of this tensor's storage, reshaped.
  // Throws when the range falls outside this tensor.
  Tensor view(int64_t offset, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const { return view(0, shape); }

  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;  // negative dim counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  MemPlace place() const;  // where the allocator counts it (Device for an empty tensor)
  bool defined() const { return storage_ != nullptr; }

  // The address, for comparisons (aliasing checks) and for device code; host code must not read a SIM or
  // CUDA tensor through it.
  void* raw() const { return ptr_; }
  // Typed pointer; throws if T does not match dtype (float <-> F32, bf16 <-> BF16, int32_t <-> I32), and for
  // a SIM tensor outside device code (DeviceCodeScope): as on a GPU, the host reads device memory only
  // through a copy (copy_from into a CPU tensor).
  template <typename T>
  T* data() const;

  // Set to 0: memset (CPU), cudaMemset (CUDA); on SIM charged to the virtual clock (core/sim_gpu.h).
  void zero_();
  // Same numel and dtype; any devices. A copy to or from SIM is charged to the virtual clock: over the host
  // link when the other side is the host, at HBM bandwidth SIM to SIM (docs/simulation.md rule 3).
  void copy_from(const Tensor& src);

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  void* ptr_ = nullptr;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

int64_t numel_of(const Shape& shape);

// Device code: the code that runs "on" the simulated GPU and so may read and write SIM tensors' memory
// through data<T>(): the ops' dispatch and their twins (common/src/ops/), the copy and zero code above,
// and the communicator backends, which move device buffers as NCCL does. Such code opens a scope for as
// long as it touches device memory; everything else is host code, which must copy a SIM tensor to a CPU
// tensor first, as it must on a real GPU:
//   { DeviceCodeScope device_code;  float* p = d_buf.data<float>();  ... }
// Per thread, and nested scopes count (a scope inside another changes nothing).
class DeviceCodeScope {
 public:
  DeviceCodeScope();
  ~DeviceCodeScope();
  DeviceCodeScope(const DeviceCodeScope&) = delete;
  DeviceCodeScope& operator=(const DeviceCodeScope&) = delete;
  static bool active();  // this thread is inside at least one scope
};

}  // namespace scalelab
