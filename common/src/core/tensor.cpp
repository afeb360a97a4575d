// tensor.cpp — Tensor storage and views (tensor.h). CUDA copies go through the CUDA backend; the simulated
// GPU's memory (Device::SIM) is host memory, its copies and zeroing timed by the active GPU model.
#include "scalelab/core/tensor.h"

#include <omp.h>  // defines: omp_get_thread_num (zero_ of a large buffer)
#if defined(__SSE2__)
#include <emmintrin.h>  // defines: _mm_stream_si128, _mm_sfence (streaming stores)
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "scalelab/core/clock.h"  // defines: VirtualClock (SIM copies are charged to its compute stream)
#include "scalelab/core/error.h"
#include "scalelab/core/sim_gpu.h"  // defines: sim_gpu, sim_gpu_active, GpuModel::copy_seconds, sim_skips_data

#include "scalelab/core/cuda_device.h"  // defines: cuda::memcpy_any, cuda::memset_zero (with SL_WITH_CUDA)

namespace scalelab {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
  }
  return "?";
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    SL_CHECK(d >= 0, "negative dimension in shape %s", shape_str(shape).c_str());
    n *= d;
  }
  return n;
}

// Owns one allocation; returns it to the allocator (with its category) when the last view dies.
struct Tensor::Storage {
  void* ptr = nullptr;
  size_t nbytes = 0;
  Device device = Device::CPU;
  MemCategory category = MemCategory::Other;
  MemPlace place = MemPlace::Device;
  ~Storage() { Allocator::get(device).deallocate(ptr, nbytes, category, place); }
};

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemCategory category, MemPlace place) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = numel_of(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  auto st = std::make_shared<Storage>();
  st->device = device;
  st->category = category;
  st->place = place;
  // Record the size only once allocate() has returned: when it throws (over the cap, no CUDA backend)
  // the Storage destructor runs and must not give back bytes that were never counted.
  st->ptr = Allocator::get(device).allocate(t.nbytes(), category, place);
  st->nbytes = t.nbytes();
  t.ptr_ = st->ptr;
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, MemCategory category, MemPlace place) {
  Tensor t = empty(shape, dtype, device, category, place);
  t.zero_();
  return t;
}

MemPlace Tensor::place() const { return storage_ ? storage_->place : MemPlace::Device; }

Tensor Tensor::view(int64_t offset, const Shape& shape) const {
  const int64_t n = numel_of(shape);
  SL_CHECK(offset >= 0 && offset + n <= numel_,
           "view of %lld elements at offset %lld, shape %s, is outside a tensor of %lld elements %s",
           static_cast<long long>(n), static_cast<long long>(offset), shape_str(shape).c_str(),
           static_cast<long long>(numel_), shape_str(shape_).c_str());
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = n;
  t.ptr_ = static_cast<char*>(ptr_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

int64_t Tensor::size(int dim) const {
  const int nd = ndim();
  const int d = dim < 0 ? dim + nd : dim;
  SL_CHECK(d >= 0 && d < nd, "dim %d out of range for shape %s", dim, shape_str(shape_).c_str());
  return shape_[d];
}

template <typename T>
static constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}

namespace {
thread_local int device_code_depth = 0;  // open DeviceCodeScopes of this thread
}  // namespace

DeviceCodeScope::DeviceCodeScope() { ++device_code_depth; }
DeviceCodeScope::~DeviceCodeScope() { --device_code_depth; }
bool DeviceCodeScope::active() { return device_code_depth > 0; }

template <typename T>
T* Tensor::data() const {
  SL_CHECK(dtype_ == dtype_of<T>(), "tensor %s has dtype %s, asked for %s", shape_str(shape_).c_str(),
           dtype_name(dtype_), dtype_name(dtype_of<T>()));
  SL_CHECK_HINT(device_ != Device::SIM || DeviceCodeScope::active(),
                "copy it to a CPU tensor first (h.copy_from(d), with h = Tensor::empty(d.shape(), d.dtype())), as "
                "host code must for GPU memory",
                "host code read the simulated GPU's memory: data<%s>() of a SIM tensor %s", dtype_name(dtype_),
                shape_str(shape_).c_str());
  return static_cast<T*>(ptr_);
}
template float* Tensor::data<float>() const;
template bf16* Tensor::data<bf16>() const;
template int32_t* Tensor::data<int32_t>() const;

namespace {

// From this size up a CPU buffer is zeroed with streaming stores (zero_bytes_streaming): far more than a core's
// L2 (1-2 MiB), so the zeros would not stay in cache until they are read again anyway.
constexpr int64_t kStreamingZeroBytes = int64_t{16} << 20;  // bytes (16 MiB)

// bytes [p, p + n) = 0 with non-temporal ("streaming") stores, where the compiler offers them: they write whole
// cache lines to memory without first reading each line into the cache, as an ordinary store (and memset,
// below glibc's own threshold) does. Half the memory traffic: GPT-2 d12's zero_grad (344 MB, the forward's
// "other" in bench_lab01 --breakdown) took 11.2 ms instead of 23.0 on this kit's 2-core development machine.
void zero_bytes_streaming(char* p, size_t n) {
#if defined(__SSE2__)
  const size_t head = std::min(n, static_cast<size_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16));
  std::memset(p, 0, head);  // up to the first 16-byte boundary: streaming stores need aligned addresses
  const __m128i zeros = _mm_setzero_si128();
  size_t i = head;
  for (; i + 16 <= n; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), zeros);
  std::memset(p + i, 0, n - i);  // the last bytes, less than 16
  _mm_sfence();                  // streaming stores are weakly ordered: make them visible before anything that follows
#else
  std::memset(p, 0, n);
#endif
}

}  // namespace

namespace {
// docs/simulation.md rule 3: a copy or a memset that touches SIM memory queues its modelled time on the
// compute stream, by the active model (returned here). Without one (a test of a communicator backend that
// moves SIM buffers and times nothing) it is not charged: nullptr. The ops refuse to run without one.
const GpuModel* sim_model_for(Device dst, Device src) {
  return (dst == Device::SIM || src == Device::SIM) && sim_gpu_active() ? &sim_gpu() : nullptr;
}
}  // namespace

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (const GpuModel* m = sim_model_for(device_, device_))
    VirtualClock::get().charge_device(m->zero_seconds(static_cast<int64_t>(nbytes())));
  if (device_ == Device::SIM && sim_skips_data()) return;  // --timing-only: charged, nothing written
  if (device_ != Device::CUDA) {                           // the CPU's memory, or the simulated GPU's (host memory too)
    // A large buffer is cleared by every thread, a slice each: one core's stores do not reach the memory
    // bandwidth of the machine (bench_lab01 --breakdown: the gradients' and the backward's zeroing).
    const int64_t n = static_cast<int64_t>(nbytes());
    char* bytes = static_cast<char*>(ptr_);
    const bool streaming = n >= kStreamingZeroBytes;
#pragma omp parallel if (n > (int64_t{1} << 20))
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
      if (streaming) zero_bytes_streaming(bytes + begin, static_cast<size_t>(end - begin));
      else std::memset(bytes + begin, 0, static_cast<size_t>(end - begin));
    }
  } else {
#ifdef SL_WITH_CUDA
    cuda::memset_zero(ptr_, nbytes());
#endif
  }
}

void Tensor::copy_from(const Tensor& src) {
  SL_CHECK(src.numel() == numel_ && src.dtype() == dtype_, "copy %s %s into %s %s: numel or dtype differ",
           shape_str(src.shape()).c_str(), dtype_name(src.dtype()), shape_str(shape_).c_str(), dtype_name(dtype_));
  if (nbytes() == 0) return;
  if (const GpuModel* m = sim_model_for(device_, src.device()))
    VirtualClock::get().charge_device(m->copy_seconds(static_cast<int64_t>(nbytes()), device_, src.device()));
  if ((device_ == Device::SIM || src.device() == Device::SIM) && sim_skips_data()) {
    // --timing-only: charged, no bytes moved. What the host reads back is zeros, so a decision taken on it
    // sees finite values (docs/simulation.md "Timing-only runs"); SIM memory itself is never written.
    if (device_ == Device::CPU) std::memset(ptr_, 0, nbytes());
    return;
  }
  if (device_ != Device::CUDA && src.device() != Device::CUDA) {  // CPU and simulated GPU: host memory
    std::memcpy(ptr_, src.raw(), nbytes());
  } else {
#ifdef SL_WITH_CUDA
    cuda::memcpy_any(ptr_, src.raw(), nbytes());
#else
    SL_FAIL("rebuild with CUDA or use --device cpu", "CUDA tensor in a build without CUDA");
#endif
  }
}

}  // namespace scalelab
