// test_attention_flash_cuda.cpp — the flash-style attention's CUDA twin (common/src/ops/cuda/attention_flash.cu)
// against its oracle, the CPU twin (common/src/ops/cpu/attention_flash.cpp, itself checked against the
// materialized op in tests/common/ops/test_attention_flash.cpp): out, lse and dqkv (from a nonzero start: the
// += rule) on shapes off the tile sizes, up to HS = 128 and GPT-2 d12's head shape at T = 1024; the same bits
// on every run (no atomics); the Tensor-level dispatch on GPU tensors and its memory (no O(T^2) bytes);
// the head-size refusal. Every GPU test starts with SL_REQUIRE_GPU(): without a GPU ctest says "Skipped".
// Run on a GPU machine: ctest -L gpu (docs/cuda_backend.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "close_to_scale.h"           // defines: close_to_scale (the kTol criterion)
#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemStats, MemCategory
#include "scalelab/ops/twins.h"       // defines: the scalelab::cuda:: twins under test
#include "scalelab/core/device.h"     // defines: SL_REQUIRE_GPU
#include "scalelab/core/error.h"      // defines: scalelab::Error
#include "scalelab/ops/ops.h"         // defines: the Tensor-level ops and the scalelab::cpu:: twins (the oracle)
#include "scalelab/core/tensor.h"     // defines: Tensor, DType, Shape

namespace {

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::MemCategory;
using scalelab::MemStats;
using scalelab::Shape;
using scalelab::Tensor;
using scalelab::test::close_to_scale;
using scalelab::test::contains;
using scalelab::test::error_message;
namespace cpu = scalelab::cpu;
namespace cuda = scalelab::cuda;

// ---------------------------------------------------------------------------------------------
// Tolerance (docs/style.md 28)

// CUDA against CPU flash: the same tiles and the same order of the per-lane sums (dot products over d,
// weighted sums over the keys of a tile), but the tile's max and sum are warp butterflies, nvcc fuses
// a*b+c into FMAs, and expf/logf differ from glibc's in the last bit. Each value is then a few fp32
// roundings (u = 2^-24 = 6e-8) away per tile, plus sqrt(K) roundings of sums over K <= 1024 keys: a few
// 1e-6 of the tensor's scale. Criterion as tests/common/ops/test_ops_cuda.cpp's kF32Tol, per element:
//   |got_i - want_i| <= kTol * (max_j |want_j| + |want_i|)
// A wrong index, mask, tile bound or rescale errs by O(1) of max|want|.
constexpr double kTol = 2e-5;

struct AttShape {
  int B, T, C, NH;
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH) + " HS=" + std::to_string(C / NH);
  }
};
const AttShape kShapes[] = {
    {3, 17, 36, 3},      // HS = 12: a partial row block and one partial key tile
    {2, 64, 64, 4},      // powers of two: whole blocks and tiles
    {1, 130, 100, 4},    // HS = 25: not a multiple of the warp; five key tiles, the last with 2 keys
    {2, 1, 8, 2},        // T = 1: one row, one key; HS = 4 < the warp
    {1, 257, 48, 2},     // T = 257 = 8 * 32 + 1: a last tile of one key
    {2, 70, 256, 2},     // HS = 128: the limit, every lane's 4 channels in use
    {1, 1024, 768, 12},  // GPT-2 d12's attention (HS = 64) at its context length, one sequence
};

std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = lo + (hi - lo) * static_cast<float>(gen() / 4294967296.0);
  return x;
}

// A 1-D CUDA tensor holding h; the raw twins get its data<float>() device pointer.
Tensor to_gpu(const std::vector<float>& h, const Shape& shape = {}) {
  const Shape s = shape.empty() ? Shape{static_cast<int64_t>(h.size())} : shape;
  Tensor h_t = Tensor::empty(s, DType::F32, Device::CPU, MemCategory::Workspace);
  if (!h.empty()) std::memcpy(h_t.raw(), h.data(), h.size() * sizeof(float));
  Tensor d_t = Tensor::empty(s, DType::F32, Device::CUDA, MemCategory::Workspace);
  d_t.copy_from(h_t);
  return d_t;
}
std::vector<float> to_host(const Tensor& t) {
  Tensor h_t = Tensor::empty(t.shape(), t.dtype(), Device::CPU, MemCategory::Workspace);
  h_t.copy_from(t);
  return std::vector<float>(h_t.data<float>(), h_t.data<float>() + h_t.numel());
}

// ---------------------------------------------------------------------------------------------
// The raw twins against the CPU twin

TEST(CudaAttentionFlash, ForwardMatchesCpuTwin) {
  SL_REQUIRE_GPU();
  for (const AttShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const size_t n_out = size_t(s.B) * s.T * s.C, n_lse = size_t(s.B) * s.NH * s.T;
    const std::vector<float> qkv = uniform(n_out * 3, 51);
    std::vector<float> out(n_out), lse(n_lse);
    cpu::attention_forward_flash(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    // NaN-filled outputs: every entry must be written.
    Tensor d_out = to_gpu(std::vector<float>(n_out, NAN)), d_lse = to_gpu(std::vector<float>(n_lse, NAN));
    Tensor d_qkv = to_gpu(qkv);
    cuda::attention_forward_flash(d_out.data<float>(), d_lse.data<float>(), d_qkv.data<float>(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(close_to_scale("cuda flash out " + s.str(), to_host(d_out), out, kTol));
    EXPECT_TRUE(close_to_scale("cuda flash lse " + s.str(), to_host(d_lse), lse, kTol));
  }
}

TEST(CudaAttentionFlash, BackwardAccumulatesAndMatchesCpuTwin) {
  SL_REQUIRE_GPU();
  for (const AttShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const size_t n_out = size_t(s.B) * s.T * s.C, n_lse = size_t(s.B) * s.NH * s.T;
    const std::vector<float> qkv = uniform(n_out * 3, 52), dout = uniform(n_out, 53);
    std::vector<float> out(n_out), lse(n_lse);
    cpu::attention_forward_flash(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);  // saved by the forward
    std::vector<float> dqkv = uniform(qkv.size(), 54);  // earlier gradients: the += rule
    Tensor d_dqkv = to_gpu(dqkv), d_dout = to_gpu(dout), d_qkv = to_gpu(qkv), d_out = to_gpu(out), d_lse = to_gpu(lse);
    cpu::attention_backward_flash(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    cuda::attention_backward_flash(d_dqkv.data<float>(), d_dout.data<float>(), d_qkv.data<float>(), d_out.data<float>(),
                                   d_lse.data<float>(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(close_to_scale("cuda flash dqkv " + s.str(), to_host(d_dqkv), dqkv, kTol));
  }
}

// No atomics: two runs give the same bits.
TEST(CudaAttentionFlash, BackwardIsBitIdenticalAcrossRuns) {
  SL_REQUIRE_GPU();
  const AttShape s{2, 130, 100, 4};
  const size_t n_out = size_t(s.B) * s.T * s.C, n_lse = size_t(s.B) * s.NH * s.T;
  Tensor d_qkv = to_gpu(uniform(n_out * 3, 55)), d_dout = to_gpu(uniform(n_out, 56));
  Tensor d_out = to_gpu(std::vector<float>(n_out)), d_lse = to_gpu(std::vector<float>(n_lse));
  cuda::attention_forward_flash(d_out.data<float>(), d_lse.data<float>(), d_qkv.data<float>(), s.B, s.T, s.C, s.NH);
  std::vector<float> runs[2];
  for (auto& r : runs) {
    Tensor d_dqkv = to_gpu(std::vector<float>(n_out * 3, 0.0f));
    cuda::attention_backward_flash(d_dqkv.data<float>(), d_dout.data<float>(), d_qkv.data<float>(), d_out.data<float>(),
                                   d_lse.data<float>(), s.B, s.T, s.C, s.NH);
    r = to_host(d_dqkv);
  }
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)));
}

// ---------------------------------------------------------------------------------------------
// The Tensor-level ops on GPU tensors: the CUDA twin runs, and the only memory it adds is the backward's
// D (B,NH,T) fp32 scratch (rounded up to a power of two, at least 4 KiB), never O(B*NH*T^2).

TEST(CudaAttentionFlash, DispatchRunsCudaTwinWithoutScoreSizedMemory) {
  SL_REQUIRE_GPU();
  const int64_t B = 2, T = 512, C = 128, NH = 2;  // HS = 64
  const std::vector<float> h_qkv = uniform(size_t(B * T * 3 * C), 57), h_dout = uniform(size_t(B * T * C), 58);
  std::vector<float> want_out(size_t(B * T * C)), want_lse(size_t(B * NH * T)), want_dqkv(h_qkv.size(), 0.0f);
  cpu::attention_forward_flash(want_out.data(), want_lse.data(), h_qkv.data(), B, T, C, NH);
  cpu::attention_backward_flash(want_dqkv.data(), h_dout.data(), h_qkv.data(), want_out.data(), want_lse.data(), B, T,
                                C, NH);
  Tensor qkv = to_gpu(h_qkv, {B, T, 3 * C}), dout = to_gpu(h_dout, {B, T, C});
  Tensor out = Tensor::empty({B, T, C}, DType::F32, Device::CUDA);
  Tensor lse = Tensor::empty({B, NH, T}, DType::F32, Device::CUDA);
  Tensor dqkv = Tensor::zeros({B, T, 3 * C}, DType::F32, Device::CUDA);
  (void)cuda::sum_squares(dout.data<float>(), dout.numel());  // creates the device context (cuBLAS workspace) first

  Allocator& alloc = Allocator::get(Device::CUDA);
  alloc.reset_peak();
  const MemStats before = alloc.stats();
  scalelab::attention_forward_flash(out, lse, qkv, static_cast<int>(NH));
  scalelab::attention_backward_flash(dqkv, dout, qkv, out, lse, static_cast<int>(NH));
  const MemStats after = alloc.stats();
  const int64_t extra = after.total_peak_bytes - before.total_current_bytes;
  const int64_t att_bytes = B * NH * T * T * 4;  // 4 MiB: what the materialized op's att would take
  std::printf("[ measured ] GPU flash forward + backward: peak extra %lld bytes (att would be %lld bytes)\n",
              static_cast<long long>(extra), static_cast<long long>(att_bytes));
  EXPECT_LE(extra, std::max<int64_t>(4096, 2 * B * NH * T * 4));
  EXPECT_LT(extra * 64, att_bytes);

  EXPECT_TRUE(close_to_scale("dispatch out", to_host(out), want_out, kTol));
  EXPECT_TRUE(close_to_scale("dispatch lse", to_host(lse), want_lse, kTol));
  EXPECT_TRUE(close_to_scale("dispatch dqkv", to_host(dqkv), want_dqkv, kTol));
}

// ---------------------------------------------------------------------------------------------
// The head-size limit: checked on the host before any launch, so this runs (and passes) without a GPU too.

TEST(CudaAttentionFlash, RefusesHeadSizeAbove128WithAHint) {
  // C = 258, NH = 1: HS = 258 > 128. The pointers are never touched: the check comes first.
  std::string msg = error_message([] { cuda::attention_forward_flash(nullptr, nullptr, nullptr, 1, 4, 258, 1); });
  EXPECT_TRUE(contains(msg, "HS = C/NH = 258/1 = 258")) << msg;
  EXPECT_TRUE(contains(msg, "1 <= HS <= 128")) << msg;
  EXPECT_TRUE(contains(msg, "materialized")) << msg;
  msg = error_message([] {
    cuda::attention_backward_flash(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2 * 129, 2);
  });
  EXPECT_TRUE(contains(msg, "HS = C/NH = 258/2 = 129")) << msg;
}

}  // namespace
