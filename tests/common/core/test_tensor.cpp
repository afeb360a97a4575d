// test_tensor.cpp — the counting allocator (common/src/core/allocator.cpp), Tensor storage and views
// (common/src/core/tensor.cpp) and bf16 storage (scalelab/core/bf16.h).
// The allocator is a process-wide singleton that other tests in this program also use, so every
// allocator test measures DELTAS against stats() taken at its start, and the cap tests restore the
// cap with a guard even when an assertion fails. The CUDA case skips visibly without a GPU (docs/style.md 30).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory, MemStats, mem_category_name
#include "scalelab/core/bf16.h"       // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/core/device.h"     // defines: built_with_cuda
#include "scalelab/core/error.h"      // defines: Error, OutOfMemory
#include "scalelab/ops/ops.h"         // defines: cast (fp32 <-> bf16 tensors)
#include "scalelab/core/tensor.h"     // defines: Tensor, DType, Shape, shape_str

namespace {

using scalelab::Allocator;
using scalelab::bf16;
using scalelab::Device;
using scalelab::DType;
using scalelab::MemCategory;
using scalelab::MemStats;
using scalelab::Tensor;

constexpr int kNumCat = scalelab::kNumMemCategories;

Allocator& cpu_allocator() { return Allocator::get(Device::CPU); }

int64_t current(const MemStats& s, MemCategory c) { return s.current_bytes[static_cast<int>(c)]; }
int64_t peak(const MemStats& s, MemCategory c) { return s.peak_bytes[static_cast<int>(c)]; }
MemCategory category(int c) { return static_cast<MemCategory>(c); }

// Sets the CPU allocator's cap for one test and restores the previous cap (0 = none) when the test
// ends, also when an assertion fails half-way: the allocator is shared by every test in the program.
class CapGuard {
 public:
  explicit CapGuard(int64_t cap_bytes) : previous_(cpu_allocator().capacity_bytes()) {
    cpu_allocator().set_capacity_bytes(cap_bytes);
  }
  ~CapGuard() { cpu_allocator().set_capacity_bytes(previous_); }
  CapGuard(const CapGuard&) = delete;
  CapGuard& operator=(const CapGuard&) = delete;

 private:
  int64_t previous_;
};

using scalelab::test::contains;
using scalelab::test::error_message;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Allocator counts

// Sizes deliberately not multiples of 64: the CPU allocator rounds the block up to its 64-byte
// alignment, but the counts must be the bytes asked for, or memory targets in the labs drift.
TEST(Allocator, CountsCurrentAndPeakBytesPerCategoryExactly) {
  Allocator& alloc = cpu_allocator();
  alloc.reset_peak();  // peak := current, so below peak delta == current delta while nothing is freed
  const MemStats s0 = alloc.stats();
  std::vector<int64_t> want(kNumCat, 0);
  want[static_cast<int>(MemCategory::Params)] = 1001 * 4;    // (1001,) f32
  want[static_cast<int>(MemCategory::Grads)] = 3 * 7 * 2;    // (3, 7) bf16
  want[static_cast<int>(MemCategory::Activations)] = 5 * 4;  // (5,) i32
  {
    Tensor params = Tensor::empty({1001}, DType::F32, Device::CPU, MemCategory::Params);
    Tensor grads = Tensor::zeros({3, 7}, DType::BF16, Device::CPU, MemCategory::Grads);
    Tensor acts = Tensor::empty({5}, DType::I32, Device::CPU, MemCategory::Activations);
    const MemStats s1 = alloc.stats();
    for (int c = 0; c < kNumCat; ++c) {
      EXPECT_EQ(current(s1, category(c)) - current(s0, category(c)), want[c]) << mem_category_name(category(c));
      EXPECT_EQ(peak(s1, category(c)) - peak(s0, category(c)), want[c]) << mem_category_name(category(c));
    }
    EXPECT_EQ(s1.total_current_bytes - s0.total_current_bytes, 4004 + 42 + 20);
    EXPECT_EQ(s1.total_peak_bytes - s0.total_peak_bytes, 4004 + 42 + 20);

    params = Tensor();  // the only reference: its 4004 bytes go back now
    const MemStats s2 = alloc.stats();
    EXPECT_EQ(current(s2, MemCategory::Params), current(s0, MemCategory::Params));
    EXPECT_EQ(peak(s2, MemCategory::Params) - peak(s0, MemCategory::Params), 4004);  // the peak stays
    EXPECT_EQ(s2.total_current_bytes - s0.total_current_bytes, 42 + 20);
    EXPECT_EQ(s2.total_peak_bytes - s0.total_peak_bytes, 4004 + 42 + 20);
  }
  const MemStats s3 = alloc.stats();
  EXPECT_EQ(s3.current_bytes, s0.current_bytes);
  EXPECT_EQ(s3.total_current_bytes, s0.total_current_bytes);
}

// Regression: a request the system refuses used to leave its bytes in the peak counts forever.
TEST(Allocator, RequestTheSystemRefusesThrowsAndLeavesCurrentAndPeakUnchanged) {
  Allocator& alloc = cpu_allocator();
  const MemStats s0 = alloc.stats();
  const size_t absurd = size_t{1} << 62;  // bytes (4 EiB): no machine grants it
  const std::string msg =
      error_message<scalelab::OutOfMemory>([&] { alloc.allocate(absurd, MemCategory::Activations); });
  EXPECT_TRUE(contains(msg, "refused")) << msg;
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(s1.total_current_bytes, s0.total_current_bytes);
  EXPECT_EQ(s1.total_peak_bytes, s0.total_peak_bytes);
  EXPECT_EQ(s1.peak_bytes[static_cast<int>(MemCategory::Activations)],
            s0.peak_bytes[static_cast<int>(MemCategory::Activations)]);
}

TEST(Allocator, ZeroElementTensorCountsNothing) {
  const MemStats s0 = cpu_allocator().stats();
  Tensor t = Tensor::empty({0, 5}, DType::F32, Device::CPU, MemCategory::Data);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(cpu_allocator().stats().current_bytes, s0.current_bytes);
}

TEST(Allocator, ViewsCountNothingAndTheLastViewFreesTheStorage) {
  Allocator& alloc = cpu_allocator();
  const MemStats s0 = alloc.stats();
  auto workspace_delta = [&] {
    return current(alloc.stats(), MemCategory::Workspace) - current(s0, MemCategory::Workspace);
  };
  Tensor t = Tensor::empty({8, 4}, DType::F32, Device::CPU, MemCategory::Workspace);  // 128 bytes
  Tensor row = t.view(4, {4});
  Tensor reshaped = t.reshape({4, 8});
  EXPECT_EQ(workspace_delta(), 128) << "views must not count their parent's bytes again";
  EXPECT_EQ(alloc.stats().total_current_bytes - s0.total_current_bytes, 128);

  t = Tensor();
  EXPECT_EQ(workspace_delta(), 128) << "the storage must live while a view of it does";
  row = Tensor();
  EXPECT_EQ(workspace_delta(), 128);
  reshaped = Tensor();  // the last view: now the storage goes back
  EXPECT_EQ(workspace_delta(), 0);
}

// Two tensors that never coexist: per-category peaks are 4000 and 8000 bytes, but memory in use
// never exceeded 8000 bytes, so the total peak is 8000, not 12000 (what an OOM would be judged by).
TEST(Allocator, TotalPeakIsMaxOfTotalNotSumOfCategoryPeaks) {
  Allocator& alloc = cpu_allocator();
  alloc.reset_peak();
  const MemStats s0 = alloc.stats();
  { Tensor a = Tensor::empty({1000}, DType::F32, Device::CPU, MemCategory::Comm); }  // 4000 bytes
  { Tensor b = Tensor::empty({2000}, DType::F32, Device::CPU, MemCategory::Data); }  // 8000 bytes
  const MemStats s1 = alloc.stats();
  EXPECT_EQ(peak(s1, MemCategory::Comm) - peak(s0, MemCategory::Comm), 4000);
  EXPECT_EQ(peak(s1, MemCategory::Data) - peak(s0, MemCategory::Data), 8000);
  EXPECT_EQ(s1.total_peak_bytes - s0.total_peak_bytes, 8000);
  EXPECT_EQ(s1.total_current_bytes, s0.total_current_bytes);
}

TEST(Allocator, ResetPeakSetsEveryPeakToCurrent) {
  Allocator& alloc = cpu_allocator();
  Tensor kept = Tensor::empty({10}, DType::F32, Device::CPU, MemCategory::Other);
  { Tensor big = Tensor::empty({1 << 16}, DType::F32, Device::CPU, MemCategory::Activations); }  // 256 KiB, gone
  const MemStats before = alloc.stats();
  ASSERT_GE(peak(before, MemCategory::Activations) - current(before, MemCategory::Activations), 1 << 18);
  ASSERT_GE(before.total_peak_bytes - before.total_current_bytes, 1 << 18);
  alloc.reset_peak();
  const MemStats after = alloc.stats();
  EXPECT_EQ(after.peak_bytes, after.current_bytes);
  EXPECT_EQ(after.total_peak_bytes, after.total_current_bytes);
  EXPECT_EQ(after.current_bytes, before.current_bytes) << "reset_peak must not touch current counts";
}

// The allocator is documented thread-safe (one mutex): 4 threads x 2000 allocations must leave the
// counts exactly where they started. A lost update would leave a nonzero remainder.
TEST(Allocator, ConcurrentAllocationsKeepCountsExact) {
  const MemStats s0 = cpu_allocator().stats();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([i] {
      for (int k = 0; k < 2000; ++k) {
        Tensor t = Tensor::empty({1 + (k + i) % 17}, DType::F32, Device::CPU, MemCategory::Comm);
      }
    });
  for (std::thread& t : threads) t.join();
  const MemStats s1 = cpu_allocator().stats();
  EXPECT_EQ(s1.current_bytes, s0.current_bytes);
  EXPECT_EQ(s1.total_current_bytes, s0.total_current_bytes);
}

// ---------------------------------------------------------------------------------------------
// Capacity cap ("simulated device memory")

TEST(Allocator, AllocationBeyondCapThrowsOutOfMemoryNamingCategoryCountsAndHint) {
  Allocator& alloc = cpu_allocator();
  const int64_t cap = alloc.stats().total_current_bytes + 1000;  // room for 1000 more bytes
  CapGuard guard(cap);
  EXPECT_EQ(alloc.capacity_bytes(), cap);
  Tensor fits = Tensor::empty({150}, DType::F32, Device::CPU, MemCategory::Comm);  // 600 of the 1000

  const MemStats before = alloc.stats();
  const int64_t would_be = before.total_current_bytes + 404;
  const std::string msg = error_message<scalelab::OutOfMemory>([] {
    Tensor::empty({101}, DType::F32, Device::CPU, MemCategory::Grads);
  });  // 404 > the 400 left
  EXPECT_TRUE(contains(msg, "out of memory")) << msg;
  EXPECT_TRUE(contains(msg, "404 bytes for grads")) << msg;  // the request and its category
  EXPECT_TRUE(contains(msg, std::to_string(would_be) + " bytes in use")) << msg;
  EXPECT_TRUE(contains(msg, "cap is " + std::to_string(cap) + " bytes")) << msg;
  EXPECT_TRUE(contains(msg, "hint:")) << msg;

  // A refused allocation leaves every count as it was (current, peak, per category and total).
  const MemStats after = alloc.stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.peak_bytes, before.peak_bytes);
  EXPECT_EQ(after.total_current_bytes, before.total_current_bytes);
  EXPECT_EQ(after.total_peak_bytes, before.total_peak_bytes);

  // Exactly up to the cap is allowed; one byte more is not (the cap is inclusive).
  Tensor rest = Tensor::empty({200}, DType::BF16, Device::CPU, MemCategory::Comm);  // the last 400 bytes
  EXPECT_EQ(alloc.stats().total_current_bytes, cap);
  EXPECT_THROW(Tensor::empty({1}, DType::BF16, Device::CPU, MemCategory::Comm), scalelab::OutOfMemory);
  EXPECT_EQ(alloc.stats().total_current_bytes, cap);
}

TEST(Allocator, OutOfMemoryIsAScalelabError) {
  static_assert(std::is_base_of_v<scalelab::Error, scalelab::OutOfMemory>, "drivers catch scalelab::Error");
  CapGuard guard(cpu_allocator().stats().total_current_bytes + 16);
  EXPECT_THROW(Tensor::empty({5}, DType::F32), scalelab::Error);
}

TEST(Allocator, CapBelowCurrentUsageRefusesTheNextAllocationButFreesStillWork) {
  Allocator& alloc = cpu_allocator();
  Tensor held = Tensor::empty({256}, DType::F32, Device::CPU, MemCategory::Other);  // 1 KiB
  const MemStats s0 = alloc.stats();
  CapGuard guard(s0.total_current_bytes - 1);
  EXPECT_THROW(Tensor::empty({1}, DType::BF16), scalelab::OutOfMemory);
  held = Tensor();  // freeing is never refused
  EXPECT_EQ(alloc.stats().total_current_bytes, s0.total_current_bytes - 1024);
}

TEST(Allocator, CapZeroMeansNoCap) {
  Allocator& alloc = cpu_allocator();
  CapGuard guard(alloc.stats().total_current_bytes + 64);
  EXPECT_THROW(Tensor::empty({1 << 18}, DType::F32), scalelab::OutOfMemory);  // 1 MiB > 64 bytes
  alloc.set_capacity_bytes(0);
  EXPECT_EQ(alloc.capacity_bytes(), 0);
  EXPECT_NO_THROW(Tensor::empty({1 << 18}, DType::F32));  // the guard still restores the old cap
}

// ---------------------------------------------------------------------------------------------
// Tensor

TEST(Tensor, ShapeStrIsPyTorchStyle) {
  EXPECT_EQ(scalelab::shape_str({4, 256, 768}), "(4, 256, 768)");
  EXPECT_EQ(scalelab::shape_str({5}), "(5,)");  // a 1-tuple, as Python prints it
  EXPECT_EQ(scalelab::shape_str({}), "()");
}

TEST(Tensor, ViewSharesStorageAtTheElementOffset) {
  Tensor t = Tensor::zeros({4, 6});
  Tensor v = t.view(7, {2, 3});
  EXPECT_EQ(v.data<float>(), t.data<float>() + 7);
  EXPECT_EQ(v.shape(), (scalelab::Shape{2, 3}));
  EXPECT_EQ(v.numel(), 6);
  v.data<float>()[5] = 3.5f;  // element (1, 2) of the view = element 7 + 5 = 12 of t = t[2, 0]
  EXPECT_EQ(t.data<float>()[12], 3.5f);
  EXPECT_EQ(t.size(-1), 6);
  EXPECT_EQ(t.size(0), 4);
  EXPECT_NO_THROW(t.view(18, {2, 3}));  // ends exactly at the last element
}

TEST(Tensor, ViewOutsideTheTensorThrowsPrintingBothShapes) {
  const Tensor t = Tensor::empty({4, 6});
  std::string msg = error_message([&] { t.view(20, {2, 3}); });  // elements 20..25 of 24
  EXPECT_TRUE(contains(msg, "(2, 3)")) << msg;
  EXPECT_TRUE(contains(msg, "(4, 6)")) << msg;
  EXPECT_TRUE(contains(msg, "offset 20")) << msg;
  msg = error_message([&] { t.view(-1, {2}); });
  EXPECT_TRUE(contains(msg, "offset -1")) << msg;
  msg = error_message([&] { t.reshape({5, 5}); });
  EXPECT_TRUE(contains(msg, "(5, 5)") && contains(msg, "(4, 6)")) << msg;
  msg = error_message([&] { t.size(2); });
  EXPECT_TRUE(contains(msg, "dim 2") && contains(msg, "(4, 6)")) << msg;
}

TEST(Tensor, DataWithTheWrongTypeThrowsNamingBothDtypes) {
  const Tensor f = Tensor::empty({3}, DType::F32);
  const Tensor h = Tensor::empty({3}, DType::BF16);
  const Tensor i = Tensor::empty({3}, DType::I32);
  EXPECT_NO_THROW(f.data<float>());
  EXPECT_NO_THROW(h.data<bf16>());
  EXPECT_NO_THROW(i.data<int32_t>());
  const std::string msg = error_message([&] { f.data<int32_t>(); });
  EXPECT_TRUE(contains(msg, "f32") && contains(msg, "i32")) << msg;
  EXPECT_THROW(h.data<float>(), scalelab::Error);
  EXPECT_THROW(i.data<float>(), scalelab::Error);
}

TEST(Tensor, ZeroSetsEveryByteAndCopyFromCopiesExactly) {
  Tensor a = Tensor::empty({3, 5});
  for (int k = 0; k < 15; ++k) a.data<float>()[k] = 0.1f * static_cast<float>(k) - 0.7f;
  Tensor b = Tensor::empty({15});  // same numel and dtype, another shape: allowed
  b.copy_from(a);
  EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()), 0);

  a.zero_();
  for (int k = 0; k < 15; ++k) EXPECT_EQ(a.data<float>()[k], 0.0f) << k;
  EXPECT_NE(b.data<float>()[1], 0.0f) << "a copy, not an alias";

  Tensor row = a.view(5, {5});  // zero_ on a view clears only the view
  b.view(5, {5}).zero_();
  EXPECT_NE(b.data<float>()[4], 0.0f);
  EXPECT_EQ(b.data<float>()[5], 0.0f);
  EXPECT_NE(b.data<float>()[10], 0.0f);
  row.copy_from(b.view(10, {5}));  // copy into a view writes the parent's storage
  EXPECT_EQ(a.data<float>()[7], b.data<float>()[12]);

  const std::string msg = error_message([&] { a.copy_from(Tensor::empty({14})); });
  EXPECT_TRUE(contains(msg, "(14,)") && contains(msg, "(3, 5)")) << msg;
  EXPECT_THROW(a.copy_from(Tensor::empty({15}, DType::I32)), scalelab::Error);
}

// zero_ of a buffer of 16 MiB or more takes another path (streaming stores, 16-byte aligned, tensor.cpp):
// a view that starts and ends off that alignment must still clear exactly its own elements.
TEST(Tensor, ZeroOfALargeUnalignedViewClearsExactlyTheView) {
  constexpr int64_t kN = (int64_t{20} << 20) / 4 + 7;  // 20 MiB + 28 bytes of floats: the streaming path
  Tensor a = Tensor::empty({kN});
  float* p = a.data<float>();
  for (int64_t k = 0; k < kN; ++k) p[k] = 1.0f;
  const int64_t offset = 3, n = kN - 5;  // starts 12 bytes in (not 16-byte aligned), leaves 2 at the end
  a.view(offset, {n}).zero_();
  for (int64_t k = 0; k < offset; ++k) ASSERT_EQ(p[k], 1.0f) << "before the view: " << k;
  int64_t nonzero = 0;
  for (int64_t k = offset; k < offset + n; ++k) nonzero += p[k] != 0.0f;
  EXPECT_EQ(nonzero, 0) << "elements of the view left non-zero";
  for (int64_t k = offset + n; k < kN; ++k) ASSERT_EQ(p[k], 1.0f) << "after the view: " << k;
}

// ---------------------------------------------------------------------------------------------
// bf16

// Every bf16 value (all 65536 bit patterns but NaNs: both zeros, subnormals, infinities) is an fp32
// value whose low 16 bits are zero, so fp32 -> bf16 must give back the same bits: no rounding happens.
TEST(Bf16, RoundTripOfEveryRepresentableValueIsExact) {
  int checked = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const bf16 b{static_cast<uint16_t>(bits)};
    const float f = scalelab::bf16_to_float(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(scalelab::bf16_to_float(scalelab::float_to_bf16(f)))) << "NaN must stay NaN";
      continue;
    }
    ASSERT_EQ(scalelab::float_to_bf16(f).bits, b.bits) << "bits 0x" << std::hex << bits << " (" << f << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 127);  // NaNs: 2 signs x 127 nonzero 7-bit mantissas, exponent 0xff
}

// The same through tensors and scalelab::cast, the path the model's bf16 parameters take.
TEST(Bf16, TensorCastRoundTripOfRepresentableValuesIsExact) {
  // bf16 keeps 8 significant bits: 1 + 1/128 is representable, and so is the smallest subnormal 2^-133.
  const std::vector<float> values = {
      0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, std::ldexp(1.0f, -133), 65280.0f, -0.01953125f, 1.0f + 1.0f / 128.0f};
  Tensor f = Tensor::empty({static_cast<int64_t>(values.size())});
  Tensor h = Tensor::empty(f.shape(), DType::BF16);
  Tensor back = Tensor::empty(f.shape());
  for (size_t k = 0; k < values.size(); ++k) {
    ASSERT_EQ(scalelab::round_to_bf16(values[k]), values[k]) << "test input " << k << " is not a bf16 value";
    f.data<float>()[k] = values[k];
  }
  scalelab::cast(h, f);
  scalelab::cast(back, h);
  EXPECT_EQ(std::memcmp(f.data<float>(), back.data<float>(), f.nbytes()), 0);
  EXPECT_EQ(back.data<float>()[8], 1.0f + 1.0f / 128.0f) << "8 significant bits must survive";
}

// ---------------------------------------------------------------------------------------------
// CUDA in a build without it (the GPU cases are in tests/common/core/test_memory_cuda.cpp)

// Without the CUDA backend a CUDA tensor is refused with a hint, and the refusal leaves the counts
// of the CUDA allocator as they were (it must not count bytes it never handed out).
TEST(TensorCuda, CudaTensorInACpuOnlyBuildThrowsWithHintAndCountsNothing) {
  if (scalelab::built_with_cuda()) GTEST_SKIP() << "this build has the CUDA backend";
  Allocator& gpu = Allocator::get(Device::CUDA);
  const MemStats s0 = gpu.stats();
  const std::string msg = error_message([] { Tensor::empty({10}, DType::F32, Device::CUDA); });
  EXPECT_TRUE(contains(msg, "hint:")) << msg;
  const MemStats s1 = gpu.stats();
  EXPECT_EQ(s1.current_bytes, s0.current_bytes);
  EXPECT_EQ(s1.total_current_bytes, s0.total_current_bytes);
}
