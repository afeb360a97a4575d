// tensor.h — a small owning/view tensor: shape, dtype, device, always contiguous.
// Storage comes from the counting Allocator (allocator.h), tagged with a MemCategory.
// A view shares its parent's storage (no bytes counted twice). Tests: tests/common/core/test_tensor.cpp
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
size_t dtype_size(DType dt);     // bytes per element: 4, 2, 4
const char* dtype_name(DType dt);  // "f32", "bf16", "i32"

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(4, 256, 768)"

class Tensor {
 public:
  Tensor() = default;  // empty: numel() == 0, data() == nullptr

  // Allocates (uninitialised) storage of numel(shape) * dtype_size(dtype) bytes.
  // Throws OutOfMemory beyond the allocator's cap.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                      MemCategory category = MemCategory::Other);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU,
                      MemCategory category = MemCategory::Other);

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
  bool defined() const { return storage_ != nullptr; }

  void* raw() const { return ptr_; }
  // Typed pointer; throws if T does not match dtype (float <-> F32, bf16 <-> BF16, int32_t <-> I32).
  template <typename T>
  T* data() const;

  void zero_();            // memset to 0 (CPU) or cudaMemset (CUDA)
  void copy_from(const Tensor& src);  // same numel and dtype; any devices

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

}  // namespace scalelab
