// test_ops_cuda.cpp — the CUDA backend (scalelab/ops/twins.h, common/src/ops/cuda/*.cu) against its oracle, the
// CPU twins of scalelab/ops/ops.h (docs/style.md 24): every op forward and backward on shapes that are not
// multiples of 4 or of the warp, the += rule of every backward, the bf16 matmuls against a bound from
// first principles, the Tensor-level dispatch (common/src/ops/dispatch.cpp) on GPU tensors, and the whole
// GPT-2 model on the GPU against the same model on the CPU and against the PyTorch fixture.
// Every test starts with SL_REQUIRE_GPU(): on a machine without a GPU ctest reports each one "Skipped".
// Run them on a GPU machine with `ctest -L gpu` (docs/cuda_backend.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bit_identical.h"            // defines: bit_identical
#include "expect_error.h"             // defines: error_message, contains
#include "fixture.h"                  // defines: Fixture (PyTorch reference), tensors_close
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/bf16.h"       // defines: bf16, float_to_bf16, round_to_bf16
#include "scalelab/ops/twins.h"       // defines: the scalelab::cuda:: twins under test
#include "scalelab/core/device.h"     // defines: SL_REQUIRE_GPU
#include "scalelab/core/error.h"      // defines: scalelab::Error
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig, ParamInfo
#include "scalelab/ops/ops.h"         // defines: the Tensor-level ops and the scalelab::cpu:: twins (the oracle)
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig, grad_norm
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/core/tensor.h"     // defines: Tensor, DType, Shape

namespace {

using scalelab::bf16;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPTConfig;
using scalelab::MemCategory;
using scalelab::ParamInfo;
using scalelab::PrecisionPolicy;
using scalelab::Shape;
using scalelab::Tensor;
using scalelab::test::bit_identical;
using scalelab::test::contains;
using scalelab::test::error_message;
namespace cpu = scalelab::cpu;
namespace cuda = scalelab::cuda;

// ---------------------------------------------------------------------------------------------
// Tolerances (docs/style.md 28)

// fp32 CUDA against fp32 CPU: the same formulas with sums in another order (cuBLAS tiles, warp
// butterflies, chunked column sums instead of sequential loops). A sum of K terms then differs by about
// sqrt(K) fp32 roundings (u = 2^-24 = 6e-8) of its larger partial sums: around 1e-6 of the tensor's
// largest entry for the K <= 400 here. Criterion, per element and relative to the whole tensor:
//   |got_i - want_i| <= kF32Tol * (max_j |want_j| + |want_i|)
// so entries near zero by cancellation are judged on the tensor's scale. kF32Tol leaves 20x over the
// estimate; a wrong index, stride, mask or missing term errs by O(1) of max|want|.
constexpr double kF32Tol = 2e-5;
// Optimizer updates: the same fp32 operations in the same order, but the CPU build may fuse a*b+c into
// one FMA (GCC -O3 -march=native does in cpu/optimizer_ops.cpp), a rounding fewer: an ulp or two of the
// tensor's scale (2^-23 = 1.2e-7 at 1.0). A wrong formula (bias correction, decay) errs by ~lr = 1e-3.
constexpr double kOptimTol = 5e-7;
// bf16 operands. Rounding to bf16 (8 significant bits) moves a value by at most u = 2^-8 of itself, so
// a product a*w of two rounded operands moves by at most (2u + u^2)|a w|, and a dot product of K terms
// by a sum of K such errors with independent signs. Rounding errors are spread evenly within half an
// ulp, so each product's error has a standard deviation of about 0.6 u |a w| and the sum one of about
// 0.6 u sqrt(sum_k (a_k w_k)^2): "2^-8 per rounding, times sqrt(K)" with the terms' actual sizes.
// We allow kBf16Sigmas * u * sqrt(sum_k (a_k w_k)^2) per element, 13 standard deviations (not reached by
// chance), plus the fp32 criterion above for the accumulation. A layout bug errs by O(|out|), which is
// about sqrt(K) / (8u) ~ 200x more for K = 36.
constexpr double kBf16Unit = 1.0 / 256;  // u = 2^-8
constexpr double kBf16Sigmas = 8.0;
// The whole tiny model, fp32 on both devices: ~25 ops in series, each adding fp32 reordering noise; the
// CPU model itself sits 1e-7..5e-7 (relative L2) from PyTorch float64 (test_gpt2_fixture.cpp), so CPU
// and GPU should agree to a few 1e-6 of each tensor's scale. Criterion as kF32Tol's.
constexpr double kModelTol = 1e-5;

// The fixture tolerances of tests/common/model/test_gpt2_fixture.cpp (derived there), for the GPU model
// against PyTorch float64: the GPU must meet the CPU's bound.
constexpr double kFixtureRtol = 1e-5;
constexpr double kFixtureLossAtol = 1e-6;
constexpr double kFixtureGradAtol = 1e-7;

// ---------------------------------------------------------------------------------------------
// Shapes. None of the odd ones is a multiple of 4 or of 32, so every bounds check and remainder loop runs.

struct OpShape {
  int B, T, C, NH, V;
  int N() const { return B * T; }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH) + " V=" + std::to_string(V);
  }
};
const OpShape kShapes[] = {
    {3, 17, 36, 3, 257},     // N = 51, HS = 12, V = 257 > 256 threads: the odd one
    {2, 64, 64, 4, 64},      // powers of two: whole warps and blocks
    {1, 130, 100, 4, 1000},  // T = 130 > 4 warps of keys, C = 100, HS = 25, V ~ 4 blocks of threads
    {2, 1, 8, 2, 5},         // T = 1: one visible key per row; C = 8 < a warp
};

// ---------------------------------------------------------------------------------------------
// Helpers: inputs, host <-> device copies, comparisons that report the first differing indices.

// n values uniform in [lo, hi) from a fixed seed (mt19937's sequence is fixed by the C++ standard).
std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = lo + (hi - lo) * static_cast<float>(gen() / 4294967296.0);
  return x;
}

// n token ids in [0, V), with repeats (dwte rows collect several rows), from a fixed seed.
std::vector<int32_t> token_ids(size_t n, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> x(n);
  for (auto& v : x) v = static_cast<int32_t>(gen() % static_cast<uint32_t>(V));
  return x;
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}

// A CUDA tensor (1-D) holding h (host). The test calls the raw twins with its data<T>() device pointer.
template <typename T>
Tensor to_gpu(const std::vector<T>& h) {
  Tensor h_t = Tensor::empty({static_cast<int64_t>(h.size())}, dtype_of<T>(), Device::CPU, MemCategory::Workspace);
  if (!h.empty()) std::memcpy(h_t.raw(), h.data(), h.size() * sizeof(T));
  Tensor d_t = Tensor::empty(h_t.shape(), dtype_of<T>(), Device::CUDA, MemCategory::Workspace);
  d_t.copy_from(h_t);
  return d_t;
}

// The elements of a tensor on any device, as a host vector.
template <typename T>
std::vector<T> to_host(const Tensor& t) {
  Tensor h_t = Tensor::empty(t.shape(), t.dtype(), Device::CPU, MemCategory::Workspace);
  h_t.copy_from(t);
  const T* p = h_t.data<T>();
  return std::vector<T>(p, p + h_t.numel());
}

std::vector<float> bf16_round(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); i++) r[i] = scalelab::round_to_bf16(x[i]);
  return r;
}
std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> r(x.size());
  for (size_t i = 0; i < x.size(); i++) r[i] = scalelab::float_to_bf16(x[i]);
  return r;
}

// Elementwise check against a per-element bound: |got_i - want_i| <= bound[i] (NaN fails).
// On failure: how many, the first 5 with both values (docs/style.md 29), the max abs and the max rel error.
::testing::AssertionResult within(const std::string& what, const std::vector<float>& got,
                                  const std::vector<float>& want, const std::vector<double>& bound) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected " << want.size();
  size_t num_bad = 0;
  double max_abs = 0.0, max_rel = 0.0;
  std::string first_bad;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    max_abs = std::max(max_abs, err);
    if (want[i] != 0.0f) max_rel = std::max(max_rel, err / std::fabs(static_cast<double>(want[i])));
    if (!(err <= bound[i])) {
      if (num_bad < 5) {
        char line[160];
        std::snprintf(line, sizeof line, "\n    [%zu] got %.9g want %.9g (err %.3e, bound %.3e)", i, got[i], want[i],
                      err, bound[i]);
        first_bad += line;
      }
      num_bad++;
    }
  }
  if (num_bad == 0) return ::testing::AssertionSuccess();
  char summary[200];
  std::snprintf(summary, sizeof summary, "%s: %zu of %zu elements out of bound; max abs err %.3e, max rel err %.3e",
                what.c_str(), num_bad, got.size(), max_abs, max_rel);
  return ::testing::AssertionFailure() << summary << first_bad;
}

// The criterion of kF32Tol: |got_i - want_i| <= tol * (max_j |want_j| + |want_i|).
::testing::AssertionResult close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                                 double tol) {
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  std::vector<double> bound(want.size());
  for (size_t i = 0; i < want.size(); i++) bound[i] = tol * (scale + std::fabs(static_cast<double>(want[i])));
  return within(what, got, want, bound);
}

// Skips (visibly) where the GPU has no bf16 tensor cores: the bf16 paths refuse with an Error there,
// which the test checks before skipping.
#define SL_REQUIRE_BF16_GPU()                                                         \
  do {                                                                                \
    try {                                                                             \
      cuda::require_bf16_support();                                                   \
    } catch (const scalelab::Error& e) {                                              \
      EXPECT_TRUE(contains(e.what(), "compute capability 8.0")) << e.what();          \
      GTEST_SKIP() << "this GPU has no bf16 tensor cores (compute capability < 8.0)"; \
    }                                                                                 \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Encoder

TEST(CudaOps, EncoderForwardIsBitIdenticalToCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const int maxT = s.T + 3;  // wpe has rows the forward must not read
    const std::vector<int32_t> tokens = token_ids(s.N(), s.V, 1);
    const std::vector<float> wte = uniform(size_t(s.V) * s.C, 2), wpe = uniform(size_t(maxT) * s.C, 3);
    std::vector<float> want(size_t(s.N()) * s.C);
    cpu::encoder_forward(want.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    Tensor d_out = Tensor::empty({static_cast<int64_t>(want.size())}, DType::F32, Device::CUDA);
    Tensor d_tokens = to_gpu(tokens), d_wte = to_gpu(wte), d_wpe = to_gpu(wpe);
    cuda::encoder_forward(d_out.data<float>(), d_tokens.data<int32_t>(), d_wte.data<float>(), d_wpe.data<float>(), s.B,
                          s.T, s.C);
    EXPECT_TRUE(bit_identical("encoder out", to_host<float>(d_out), want));
  }
}

// Starting from nonzero gradients checks the += rule: an op that overwrote would lose the initial values.
// Same adds in the same order as the CPU (rows of one token in increasing order): bit-identical. The
// rows of wpe beyond T stay exactly as they were.
TEST(CudaOps, EncoderBackwardAccumulatesBitIdenticalToCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const int maxT = s.T + 3;
    const std::vector<int32_t> tokens = token_ids(s.N(), s.V, 4);
    const std::vector<float> dout = uniform(size_t(s.N()) * s.C, 5);
    std::vector<float> dwte = uniform(size_t(s.V) * s.C, 6), dwpe = uniform(size_t(maxT) * s.C, 7);
    Tensor d_dwte = to_gpu(dwte), d_dwpe = to_gpu(dwpe), d_dout = to_gpu(dout), d_tokens = to_gpu(tokens);
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    cuda::encoder_backward(d_dwte.data<float>(), d_dwpe.data<float>(), d_dout.data<float>(), d_tokens.data<int32_t>(),
                           s.B, s.T, s.C);
    EXPECT_TRUE(bit_identical("dwte", to_host<float>(d_dwte), dwte));
    EXPECT_TRUE(bit_identical("dwpe", to_host<float>(d_dwpe), dwpe));
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST(CudaOps, LayernormForwardMatchesCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const int64_t N = s.N();
    std::vector<float> inp = uniform(size_t(N) * s.C, 8);
    for (int64_t i = 0; i < N; i++)  // rows with different means and spreads
      for (int c = 0; c < s.C; c++)
        inp[i * s.C + c] = 0.3f * static_cast<float>(i % 7) + (1.0f + i % 3) * inp[i * s.C + c];
    const auto weight = uniform(s.C, 9, 0.5f, 1.5f), bias = uniform(s.C, 10, -0.5f, 0.5f);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, s.C);
    Tensor d_out = to_gpu(std::vector<float>(inp.size())), d_mean = to_gpu(std::vector<float>(N)),
           d_rstd = to_gpu(std::vector<float>(N));
    Tensor d_inp = to_gpu(inp), d_weight = to_gpu(weight), d_bias = to_gpu(bias);
    cuda::layernorm_forward(d_out.data<float>(), d_mean.data<float>(), d_rstd.data<float>(), d_inp.data<float>(),
                            d_weight.data<float>(), d_bias.data<float>(), N, s.C);
    EXPECT_TRUE(close("layernorm out", to_host<float>(d_out), out, kF32Tol));
    EXPECT_TRUE(close("layernorm mean", to_host<float>(d_mean), mean, kF32Tol));
    EXPECT_TRUE(close("layernorm rstd", to_host<float>(d_rstd), rstd, kF32Tol));
  }
}

TEST(CudaOps, LayernormBackwardAccumulatesAndMatchesCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const int64_t N = s.N();
    const auto inp = uniform(size_t(N) * s.C, 11), weight = uniform(s.C, 12, 0.5f, 1.5f), bias = uniform(s.C, 13),
               dout = uniform(size_t(N) * s.C, 14);
    std::vector<float> out(inp.size()), mean(N), rstd(N);  // the forward's saved statistics, from the CPU
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, s.C);
    std::vector<float> dinp = uniform(inp.size(), 15), dweight = uniform(s.C, 16), dbias = uniform(s.C, 17);
    Tensor d_dinp = to_gpu(dinp), d_dweight = to_gpu(dweight), d_dbias = to_gpu(dbias);
    Tensor d_dout = to_gpu(dout), d_inp = to_gpu(inp), d_weight = to_gpu(weight), d_mean = to_gpu(mean),
           d_rstd = to_gpu(rstd);
    cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                            mean.data(), rstd.data(), N, s.C);
    cuda::layernorm_backward(d_dinp.data<float>(), d_dweight.data<float>(), d_dbias.data<float>(), d_dout.data<float>(),
                             d_inp.data<float>(), d_weight.data<float>(), d_mean.data<float>(), d_rstd.data<float>(), N,
                             s.C);
    EXPECT_TRUE(close("layernorm dinp", to_host<float>(d_dinp), dinp, kF32Tol));
    EXPECT_TRUE(close("layernorm dweight", to_host<float>(d_dweight), dweight, kF32Tol));
    EXPECT_TRUE(close("layernorm dbias", to_host<float>(d_dbias), dbias, kF32Tol));
  }
}

// ---------------------------------------------------------------------------------------------
// Matmul, fp32. OC = 3C, 4C or C as in the model; also with every pointer 4 bytes off a 16-byte boundary
// (weights are views at arbitrary offsets of a unit's buffer): cuBLASLt must be told, or fall back.

struct MatmulCase {
  int64_t N;
  int C, OC;
  int misalign;  // elements (floats) by which every buffer is offset from its allocation
};
const MatmulCase kMatmulCases[] = {{51, 36, 108, 0},   {51, 36, 108, 1},   {128, 64, 256, 0},
                                   {130, 100, 400, 3}, {130, 400, 100, 1}, {2, 8, 5, 0}};

// A device copy of h starting `misalign` floats into its allocation; the returned pointer is valid while
// `owner` lives.
float* gpu_at_offset(const std::vector<float>& h, int misalign, Tensor& owner) {
  std::vector<float> padded(misalign, 0.0f);
  padded.insert(padded.end(), h.begin(), h.end());
  owner = to_gpu(padded);
  return owner.data<float>() + misalign;
}
std::vector<float> host_from_offset(const Tensor& owner, int misalign) {
  const std::vector<float> all = to_host<float>(owner);
  return std::vector<float>(all.begin() + misalign, all.end());
}

TEST(CudaOps, MatmulForwardMatchesCpuWithAndWithoutBias) {
  SL_REQUIRE_GPU();
  for (const MatmulCase& m : kMatmulCases) {
    SCOPED_TRACE("N=" + std::to_string(m.N) + " C=" + std::to_string(m.C) + " OC=" + std::to_string(m.OC) +
                 " misalign=" + std::to_string(m.misalign));
    const auto inp = uniform(size_t(m.N) * m.C, 18), weight = uniform(size_t(m.OC) * m.C, 19), bias = uniform(m.OC, 20);
    for (const bool with_bias : {true, false}) {
      std::vector<float> want(size_t(m.N) * m.OC);
      cpu::matmul_forward(want.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, m.N, m.C, m.OC);
      Tensor o_out, o_inp, o_weight, o_bias;
      float* d_out = gpu_at_offset(std::vector<float>(want.size(), NAN), m.misalign, o_out);  // NaN: all overwritten
      const float* d_inp = gpu_at_offset(inp, m.misalign, o_inp);
      const float* d_weight = gpu_at_offset(weight, m.misalign, o_weight);
      const float* d_bias = gpu_at_offset(bias, m.misalign, o_bias);
      cuda::matmul_forward(d_out, d_inp, d_weight, with_bias ? d_bias : nullptr, m.N, m.C, m.OC);
      EXPECT_TRUE(close(with_bias ? "matmul out (bias)" : "matmul out (no bias)", host_from_offset(o_out, m.misalign),
                        want, kF32Tol));
    }
  }
}

TEST(CudaOps, MatmulBackwardAccumulatesAndMatchesCpu) {
  SL_REQUIRE_GPU();
  for (const MatmulCase& m : kMatmulCases) {
    SCOPED_TRACE("N=" + std::to_string(m.N) + " C=" + std::to_string(m.C) + " OC=" + std::to_string(m.OC) +
                 " misalign=" + std::to_string(m.misalign));
    const auto inp = uniform(size_t(m.N) * m.C, 21), weight = uniform(size_t(m.OC) * m.C, 22),
               dout = uniform(size_t(m.N) * m.OC, 23);
    for (const bool optional_outputs : {true, false}) {  // dinp and dbias given, or nullptr
      std::vector<float> dinp = uniform(inp.size(), 24), dweight = uniform(weight.size(), 25),
                         dbias = uniform(m.OC, 26);
      Tensor o_dinp, o_dweight, o_dbias, o_dout, o_inp, o_weight;
      float* d_dinp = gpu_at_offset(dinp, m.misalign, o_dinp);
      float* d_dweight = gpu_at_offset(dweight, m.misalign, o_dweight);
      float* d_dbias = gpu_at_offset(dbias, m.misalign, o_dbias);
      const float* d_dout = gpu_at_offset(dout, m.misalign, o_dout);
      const float* d_inp = gpu_at_offset(inp, m.misalign, o_inp);
      const float* d_weight = gpu_at_offset(weight, m.misalign, o_weight);
      cpu::matmul_backward(optional_outputs ? dinp.data() : nullptr, dweight.data(),
                           optional_outputs ? dbias.data() : nullptr, dout.data(), inp.data(), weight.data(), m.N, m.C,
                           m.OC);
      cuda::matmul_backward(optional_outputs ? d_dinp : nullptr, d_dweight, optional_outputs ? d_dbias : nullptr,
                            d_dout, d_inp, d_weight, m.N, m.C, m.OC);
      // Without the optional outputs, dinp and dbias keep their initial values on both sides.
      EXPECT_TRUE(close("matmul dinp", host_from_offset(o_dinp, m.misalign), dinp, kF32Tol));
      EXPECT_TRUE(close("matmul dweight", host_from_offset(o_dweight, m.misalign), dweight, kF32Tol));
      EXPECT_TRUE(close("matmul dbias", host_from_offset(o_dbias, m.misalign), dbias, kF32Tol));
    }
  }
}

// The two gradients computed apart, as a zero-bubble pipeline schedule runs them (B: dinp now; W: dweight and
// dbias later; ops.h), give exactly the bits of one call on the GPU too: the twin launches the same GEMMs and
// column-sum kernels on the same operands either way (common/src/ops/cuda/matmul.cu). Through the Tensor-level
// ops (the dispatch on GPU tensors), from nonzero gradients and in either order, with fp32 operands and, where
// the GPU has bf16 tensor cores, bf16 ones. The CPU twins' test: tests/common/ops/test_ops_cpu.cpp.
TEST(CudaOps, MatmulBackwardApartGivesTheBitsOfOneCall) {
  SL_REQUIRE_GPU();
  bool bf16_gpu = true;
  try {
    cuda::require_bf16_support();
  } catch (const scalelab::Error&) {
    bf16_gpu = false;  // the fp32 half still runs; MatmulBf16* report the skip
  }
  for (const MatmulCase& m : kMatmulCases) {
    if (m.misalign != 0) continue;  // whole tensors: the Tensor-level ops take views, not raw offsets
    SCOPED_TRACE("N=" + std::to_string(m.N) + " C=" + std::to_string(m.C) + " OC=" + std::to_string(m.OC));
    const Shape x_shape{m.N, m.C}, w_shape{m.OC, m.C}, y_shape{m.N, m.OC};
    const auto inp = uniform(size_t(m.N) * m.C, 90), weight = uniform(size_t(m.OC) * m.C, 91),
               dout = uniform(size_t(m.N) * m.OC, 92);
    const auto dinp0 = uniform(inp.size(), 93), dweight0 = uniform(weight.size(), 94), dbias0 = uniform(m.OC, 95);
    for (const bool bf16_operands : {false, true}) {
      if (bf16_operands && !bf16_gpu) continue;
      SCOPED_TRACE(bf16_operands ? "bf16 operands" : "fp32 operands");
      auto operand = [&](const std::vector<float>& h, const Shape& shape) {
        return (bf16_operands ? to_gpu(to_bf16(h)) : to_gpu(h)).reshape(shape);
      };
      const Tensor d_inp = operand(inp, x_shape), d_weight = operand(weight, w_shape), d_dout = operand(dout, y_shape);
      auto backward = [&](Tensor* dinp, Tensor* dweight, Tensor* dbias) {
        if (bf16_operands) scalelab::matmul_backward_bf16(dinp, dweight, dbias, d_dout, d_inp, d_weight);
        else scalelab::matmul_backward(dinp, dweight, dbias, d_dout, d_inp, d_weight);
      };
      Tensor dinp = to_gpu(dinp0).reshape(x_shape), dweight = to_gpu(dweight0).reshape(w_shape), dbias = to_gpu(dbias0);
      backward(&dinp, &dweight, &dbias);  // one call: all three
      for (const bool b_first : {true, false}) {
        SCOPED_TRACE(b_first ? "dinp first" : "dweight and dbias first");
        Tensor dinp2 = to_gpu(dinp0).reshape(x_shape), dweight2 = to_gpu(dweight0).reshape(w_shape),
               dbias2 = to_gpu(dbias0);
        if (b_first) {
          backward(&dinp2, nullptr, nullptr);
          EXPECT_TRUE(bit_identical("dweight after dinp alone (untouched)", to_host<float>(dweight2), dweight0));
          EXPECT_TRUE(bit_identical("dbias after dinp alone (untouched)", to_host<float>(dbias2), dbias0));
          backward(nullptr, &dweight2, &dbias2);
        } else {
          backward(nullptr, &dweight2, &dbias2);
          EXPECT_TRUE(bit_identical("dinp after dweight alone (untouched)", to_host<float>(dinp2), dinp0));
          backward(&dinp2, nullptr, nullptr);
        }
        EXPECT_TRUE(bit_identical("dinp", to_host<float>(dinp2), to_host<float>(dinp)));
        EXPECT_TRUE(bit_identical("dweight", to_host<float>(dweight2), to_host<float>(dweight)));
        EXPECT_TRUE(bit_identical("dbias", to_host<float>(dbias2), to_host<float>(dbias)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Matmul, bf16 operands (fp32 accumulate, fp32 outputs)

// bound_i for out = a (N,K) @ w (M,K)^T: kBf16Sigmas * u * sqrt(sum_k (a_ik w_jk)^2) plus the fp32
// criterion; see kBf16Sigmas. a and w are the UNROUNDED fp32 operands; want the fp32 product.
std::vector<double> bf16_dot_bound(const std::vector<float>& a, const std::vector<float>& w, int64_t N, int M, int K,
                                   const std::vector<float>& want) {
  double scale = 0.0;
  for (float x : want) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  std::vector<double> bound(size_t(N) * M);
  for (int64_t i = 0; i < N; i++) {
    for (int j = 0; j < M; j++) {
      double sum_sq = 0.0;
      for (int k = 0; k < K; k++) {
        const double t = static_cast<double>(a[i * K + k]) * w[int64_t(j) * K + k];
        sum_sq += t * t;
      }
      bound[i * M + j] = kBf16Sigmas * kBf16Unit * std::sqrt(sum_sq) +
                         kF32Tol * (scale + std::fabs(static_cast<double>(want[i * M + j])));
    }
  }
  return bound;
}

// Row-major transpose of x (R, K) -> (K, R): lets bf16_dot_bound express dinp and dweight as a @ w^T.
std::vector<float> transpose(const std::vector<float>& x, int64_t R, int K) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < R; r++)
    for (int k = 0; k < K; k++) t[int64_t(k) * R + r] = x[r * K + k];
  return t;
}

// Two checks per output: (1) against the CPU fp32 matmul of the bf16-ROUNDED operands: the products of
// bf16 values are exact in fp32, so only the order of the fp32 sums differs (kF32Tol): this pins the
// layout. (2) against the fp32 matmul of the unrounded operands, within the bf16 bound: this is the
// precision a user of the mixed policy gets.
TEST(CudaOps, MatmulBf16ForwardWithinBf16BoundOfFp32) {
  SL_REQUIRE_GPU();
  SL_REQUIRE_BF16_GPU();
  for (const MatmulCase& m : kMatmulCases) {
    if (m.misalign != 0) continue;  // bf16 pointers come from whole tensors (cast outputs)
    SCOPED_TRACE("N=" + std::to_string(m.N) + " C=" + std::to_string(m.C) + " OC=" + std::to_string(m.OC));
    const auto inp = uniform(size_t(m.N) * m.C, 27), weight = uniform(size_t(m.OC) * m.C, 28), bias = uniform(m.OC, 29);
    std::vector<float> want_rounded(size_t(m.N) * m.OC), want_fp32(want_rounded.size());
    const auto inp_r = bf16_round(inp), weight_r = bf16_round(weight);
    cpu::matmul_forward(want_rounded.data(), inp_r.data(), weight_r.data(), bias.data(), m.N, m.C, m.OC);
    cpu::matmul_forward(want_fp32.data(), inp.data(), weight.data(), bias.data(), m.N, m.C, m.OC);
    Tensor d_out = to_gpu(std::vector<float>(want_fp32.size(), NAN));
    Tensor d_inp = to_gpu(to_bf16(inp)), d_weight = to_gpu(to_bf16(weight)), d_bias = to_gpu(bias);
    cuda::matmul_forward_bf16(d_out.data<float>(), d_inp.data<bf16>(), d_weight.data<bf16>(), d_bias.data<float>(), m.N,
                              m.C, m.OC);
    const std::vector<float> got = to_host<float>(d_out);
    EXPECT_TRUE(close("bf16 matmul out vs rounded operands", got, want_rounded, kF32Tol));
    EXPECT_TRUE(within("bf16 matmul out vs fp32", got, want_fp32,
                       bf16_dot_bound(inp, weight, m.N, m.OC, m.C, want_fp32)));
  }
}

TEST(CudaOps, MatmulBf16BackwardAccumulatesWithinBf16BoundOfFp32) {
  SL_REQUIRE_GPU();
  SL_REQUIRE_BF16_GPU();
  for (const MatmulCase& m : kMatmulCases) {
    if (m.misalign != 0) continue;
    SCOPED_TRACE("N=" + std::to_string(m.N) + " C=" + std::to_string(m.C) + " OC=" + std::to_string(m.OC));
    const auto inp = uniform(size_t(m.N) * m.C, 30), weight = uniform(size_t(m.OC) * m.C, 31),
               dout = uniform(size_t(m.N) * m.OC, 32);
    const auto init_dinp = uniform(inp.size(), 33), init_dweight = uniform(weight.size(), 34),
               init_dbias = uniform(m.OC, 35);
    // References: the CPU backward on rounded operands, and on fp32 operands (both from the same init).
    std::vector<float> r_dinp = init_dinp, r_dweight = init_dweight, r_dbias = init_dbias;
    const auto inp_r = bf16_round(inp), weight_r = bf16_round(weight), dout_r = bf16_round(dout);
    cpu::matmul_backward(r_dinp.data(), r_dweight.data(), r_dbias.data(), dout_r.data(), inp_r.data(), weight_r.data(),
                         m.N, m.C, m.OC);
    std::vector<float> f_dinp = init_dinp, f_dweight = init_dweight, f_dbias = init_dbias;
    cpu::matmul_backward(f_dinp.data(), f_dweight.data(), f_dbias.data(), dout.data(), inp.data(), weight.data(), m.N,
                         m.C, m.OC);
    Tensor d_dinp = to_gpu(init_dinp), d_dweight = to_gpu(init_dweight), d_dbias = to_gpu(init_dbias);
    Tensor d_dout = to_gpu(to_bf16(dout)), d_inp = to_gpu(to_bf16(inp)), d_weight = to_gpu(to_bf16(weight));
    cuda::matmul_backward_bf16(d_dinp.data<float>(), d_dweight.data<float>(), d_dbias.data<float>(),
                               d_dout.data<bf16>(), d_inp.data<bf16>(), d_weight.data<bf16>(), m.N, m.C, m.OC);
    const auto g_dinp = to_host<float>(d_dinp), g_dweight = to_host<float>(d_dweight),
               g_dbias = to_host<float>(d_dbias);
    EXPECT_TRUE(close("bf16 dinp vs rounded", g_dinp, r_dinp, kF32Tol));
    EXPECT_TRUE(close("bf16 dweight vs rounded", g_dweight, r_dweight, kF32Tol));
    EXPECT_TRUE(close("bf16 dbias vs rounded", g_dbias, r_dbias, kF32Tol));
    // dinp (N,C) = dout (N,OC) @ weight (OC,C) = dout @ (weight^T)^T: a = dout, w = weight^T (C,OC), K = OC.
    EXPECT_TRUE(within("bf16 dinp vs fp32", g_dinp, f_dinp,
                       bf16_dot_bound(dout, transpose(weight, m.OC, m.C), m.N, m.C, m.OC, f_dinp)));
    // dweight (OC,C) = dout^T (OC,N) @ inp (N,C): a = dout^T, w = inp^T (C,N), K = N.
    EXPECT_TRUE(within("bf16 dweight vs fp32", g_dweight, f_dweight,
                       bf16_dot_bound(transpose(dout, m.N, m.OC), transpose(inp, m.N, m.C), m.OC, m.C,
                                      static_cast<int>(m.N), f_dweight)));
    // dbias (OC) = dout^T (OC,N) @ ones (N): a = dout^T, w = ones (1,N), K = N (one rounding per term).
    EXPECT_TRUE(within("bf16 dbias vs fp32", g_dbias, f_dbias,
                       bf16_dot_bound(transpose(dout, m.N, m.OC), std::vector<float>(m.N, 1.0f), m.OC, 1,
                                      static_cast<int>(m.N), f_dbias)));
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

TEST(CudaOps, AttentionForwardMatchesCpuIncludingTheMask) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const auto qkv = uniform(size_t(s.N()) * 3 * s.C, 36);
    std::vector<float> out(size_t(s.N()) * s.C), att(size_t(s.B) * s.NH * s.T * s.T);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    Tensor d_out = to_gpu(std::vector<float>(out.size(), NAN)), d_att = to_gpu(std::vector<float>(att.size(), NAN));
    Tensor d_qkv = to_gpu(qkv);
    cuda::attention_forward(d_out.data<float>(), d_att.data<float>(), d_qkv.data<float>(), s.B, s.T, s.C, s.NH);
    const std::vector<float> g_att = to_host<float>(d_att);
    EXPECT_TRUE(close("attention out", to_host<float>(d_out), out, kF32Tol));
    EXPECT_TRUE(close("attention att", g_att, att, kF32Tol));
    // The mask is exact: att[.., t, s] == 0 for s > t (both twins write zeros there).
    for (size_t r = 0; r < g_att.size() / s.T; r++) {
      const int t = static_cast<int>(r % s.T);
      for (int k = t + 1; k < s.T; k++) ASSERT_EQ(g_att[r * s.T + k], 0.0f) << "row " << r << " key " << k;
    }
  }
}

TEST(CudaOps, AttentionBackwardAccumulatesAndMatchesCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const auto qkv = uniform(size_t(s.N()) * 3 * s.C, 37), dout = uniform(size_t(s.N()) * s.C, 38);
    std::vector<float> out(size_t(s.N()) * s.C), att(size_t(s.B) * s.NH * s.T * s.T);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);  // att saved by the forward
    std::vector<float> dqkv = uniform(qkv.size(), 39), datt(att.size());
    Tensor d_dqkv = to_gpu(dqkv), d_datt = to_gpu(std::vector<float>(att.size(), NAN));  // datt is scratch
    Tensor d_dout = to_gpu(dout), d_qkv = to_gpu(qkv), d_att = to_gpu(att);
    cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
    cuda::attention_backward(d_dqkv.data<float>(), d_datt.data<float>(), d_dout.data<float>(), d_qkv.data<float>(),
                             d_att.data<float>(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(close("attention dqkv", to_host<float>(d_dqkv), dqkv, kF32Tol));
    EXPECT_TRUE(close("attention datt (dS)", to_host<float>(d_datt), datt, kF32Tol));
  }
}

// The block ops of context parallelism (q (B,Tq,C) against kv (B,Tk,2C) at absolute offsets; CPU oracle
// checked against the dense op in test_attention_block.cpp): blocks wholly visible, straddling the diagonal,
// with fully masked rows, wholly masked, and sizes off the tiles (8 rows, 32 keys).
struct BlockCase {
  int B, Tq, Tk, C, NH, q_offset, kv_offset;
  std::string str() const {
    return "B=" + std::to_string(B) + " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) +
           " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + " q_offset=" + std::to_string(q_offset) +
           " kv_offset=" + std::to_string(kv_offset);
  }
};
const BlockCase kBlockCases[] = {
    {2, 17, 40, 36, 3, 40, 0},   // keys wholly in the past: every pair visible
    {1, 37, 37, 64, 2, 37, 37},  // the diagonal block: the dense causal mask
    {2, 20, 45, 32, 4, 30, 10},  // straddling: rows 0..9 see part of the block, 10.. see all of it
    {1, 24, 16, 48, 2, 4, 12},   // rows 0..7 (positions 4..11) fully masked, the rest partly
    {1, 9, 33, 24, 2, 0, 9},     // wholly masked: out 0, lse -inf
};

// lse with -inf where a row sees no key: the -inf entries must match exactly; the finite ones are compared
// by close() after both sides' -inf are set to 0.
::testing::AssertionResult lse_close(const std::string& what, std::vector<float> got, std::vector<float> want) {
  for (size_t i = 0; i < want.size() && i < got.size(); i++) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i])
        return ::testing::AssertionFailure() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      got[i] = want[i] = 0.0f;
    }
  }
  return close(what, got, want, kF32Tol);
}

TEST(CudaOps, AttentionBlockForwardAndBackwardMatchCpuAtOffsets) {
  SL_REQUIRE_GPU();
  for (const BlockCase& s : kBlockCases) {
    SCOPED_TRACE(s.str());
    const auto q = uniform(size_t(s.B) * s.Tq * s.C, 61), kv = uniform(size_t(s.B) * s.Tk * 2 * s.C, 62);
    const auto dout = uniform(q.size(), 63);
    std::vector<float> out(q.size()), lse(size_t(s.B) * s.NH * s.Tq);
    cpu::attention_forward_block(out.data(), lse.data(), q.data(), kv.data(), s.B, s.Tq, s.Tk, s.C, s.NH, s.q_offset,
                                 s.kv_offset);
    Tensor d_q = to_gpu(q), d_kv = to_gpu(kv), d_dout = to_gpu(dout);
    Tensor d_out = to_gpu(std::vector<float>(out.size(), NAN)), d_lse = to_gpu(std::vector<float>(lse.size(), NAN));
    cuda::attention_forward_block(d_out.data<float>(), d_lse.data<float>(), d_q.data<float>(), d_kv.data<float>(), s.B,
                                  s.Tq, s.Tk, s.C, s.NH, s.q_offset, s.kv_offset);
    EXPECT_TRUE(close("block out", to_host<float>(d_out), out, kF32Tol));
    EXPECT_TRUE(lse_close("block lse", to_host<float>(d_lse), lse));
    // The backward with this block as the whole attention (its out and lse are then the final ones), from
    // nonzero gradients: the += rule.
    std::vector<float> dq = uniform(q.size(), 64), dkv = uniform(kv.size(), 65);
    Tensor d_dq = to_gpu(dq), d_dkv = to_gpu(dkv), d_out_cpu = to_gpu(out), d_lse_cpu = to_gpu(lse);
    cpu::attention_backward_block(dq.data(), dkv.data(), dout.data(), q.data(), kv.data(), out.data(), lse.data(), s.B,
                                  s.Tq, s.Tk, s.C, s.NH, s.q_offset, s.kv_offset);
    cuda::attention_backward_block(d_dq.data<float>(), d_dkv.data<float>(), d_dout.data<float>(), d_q.data<float>(),
                                   d_kv.data<float>(), d_out_cpu.data<float>(), d_lse_cpu.data<float>(), s.B, s.Tq,
                                   s.Tk, s.C, s.NH, s.q_offset, s.kv_offset);
    EXPECT_TRUE(close("block dq", to_host<float>(d_dq), dq, kF32Tol));
    EXPECT_TRUE(close("block dkv", to_host<float>(d_dkv), dkv, kF32Tol));
  }
}

TEST(CudaOps, AttentionMergeMatchesCpuIncludingEmptyRows) {
  SL_REQUIRE_GPU();
  const int B = 2, T = 19, C = 40, NH = 4;
  const size_t n = size_t(B) * T * C, r = size_t(B) * NH * T;
  std::vector<float> out = uniform(n, 71), part = uniform(n, 72);
  std::vector<float> lse = uniform(r, 73, -3.0f, 3.0f), lse_part = uniform(r, 74, -3.0f, 3.0f);
  for (size_t i = 0; i < r; i += 5) lse[i] = -INFINITY;       // an accumulator at its start
  for (size_t i = 0; i < r; i += 7) lse_part[i] = -INFINITY;  // an empty part (0, 35, ...: both -inf)
  Tensor d_out = to_gpu(out), d_lse = to_gpu(lse), d_part = to_gpu(part), d_lse_part = to_gpu(lse_part);
  cpu::attention_merge(out.data(), lse.data(), part.data(), lse_part.data(), B, T, C, NH);
  cuda::attention_merge(d_out.data<float>(), d_lse.data<float>(), d_part.data<float>(), d_lse_part.data<float>(), B, T,
                        C, NH);
  EXPECT_TRUE(close("merged out", to_host<float>(d_out), out, kF32Tol));
  EXPECT_TRUE(lse_close("merged lse", to_host<float>(d_lse), lse));
}

// ---------------------------------------------------------------------------------------------
// Elementwise: GELU, residual

TEST(CudaOps, GeluForwardAndBackwardMatchCpu) {
  SL_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{4 * 51 * 36}, int64_t{1000003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto inp = uniform(n, 40, -6.0f, 6.0f), dout = uniform(n, 41);  // tails where tanh saturates
    std::vector<float> out(n), dinp = uniform(n, 42);
    cpu::gelu_forward(out.data(), inp.data(), n);
    Tensor d_out = to_gpu(std::vector<float>(n, NAN)), d_inp = to_gpu(inp), d_dout = to_gpu(dout),
           d_dinp = to_gpu(dinp);
    cuda::gelu_forward(d_out.data<float>(), d_inp.data<float>(), n);
    cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), n);
    cuda::gelu_backward(d_dinp.data<float>(), d_inp.data<float>(), d_dout.data<float>(), n);
    EXPECT_TRUE(close("gelu out", to_host<float>(d_out), out, kF32Tol));
    EXPECT_TRUE(close("gelu dinp (+=)", to_host<float>(d_dinp), dinp, kF32Tol));
  }
}

TEST(CudaOps, ResidualForwardAndBackwardAreBitIdenticalToCpu) {
  SL_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{1000003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto a = uniform(n, 43), b = uniform(n, 44), dout = uniform(n, 45);
    std::vector<float> out(n), da = uniform(n, 46), db = uniform(n, 47);
    Tensor d_out = to_gpu(std::vector<float>(n)), d_a = to_gpu(a), d_b = to_gpu(b), d_dout = to_gpu(dout),
           d_da = to_gpu(da), d_db = to_gpu(db);
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    cpu::residual_backward(da.data(), db.data(), dout.data(), n);
    cuda::residual_forward(d_out.data<float>(), d_a.data<float>(), d_b.data<float>(), n);
    cuda::residual_backward(d_da.data<float>(), d_db.data<float>(), d_dout.data<float>(), n);
    EXPECT_TRUE(bit_identical("residual out", to_host<float>(d_out), out));
    EXPECT_TRUE(bit_identical("residual da (+=)", to_host<float>(d_da), da));
    EXPECT_TRUE(bit_identical("residual db (+=)", to_host<float>(d_db), db));
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy

TEST(CudaOps, SoftmaxCrossentropyForwardMatchesCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const int64_t N = s.N();
    const auto logits = uniform(size_t(N) * s.V, 48, -4.0f, 4.0f);
    const auto targets = token_ids(N, s.V, 49);
    std::vector<float> losses(N), probs(logits.size());
    cpu::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, s.V);
    Tensor d_losses = to_gpu(std::vector<float>(N, NAN)), d_probs = to_gpu(std::vector<float>(probs.size(), NAN));
    Tensor d_logits = to_gpu(logits), d_targets = to_gpu(targets);
    cuda::softmax_crossentropy_forward(d_losses.data<float>(), d_probs.data<float>(), d_logits.data<float>(),
                                       d_targets.data<int32_t>(), N, s.V);
    EXPECT_TRUE(close("losses", to_host<float>(d_losses), losses, kF32Tol));
    EXPECT_TRUE(close("probs", to_host<float>(d_probs), probs, kF32Tol));
  }
}

// The backward OVERWRITES dlogits (the one exception to +=) and may run in place on probs. One multiply
// per element, as on the CPU: bit-identical, both out of place and in place.
TEST(CudaOps, SoftmaxCrossentropyBackwardOverwritesBitIdenticalToCpuAlsoInPlace) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const int64_t N = s.N();
    std::vector<float> probs = uniform(size_t(N) * s.V, 50, 0.0f, 1.0f);
    const auto targets = token_ids(N, s.V, 51);
    const float dloss = 1.0f / static_cast<float>(N);
    std::vector<float> dlogits(probs.size());
    cpu::softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, s.V);
    Tensor d_dlogits = to_gpu(uniform(probs.size(), 52)), d_probs = to_gpu(probs), d_targets = to_gpu(targets);
    cuda::softmax_crossentropy_backward(d_dlogits.data<float>(), d_probs.data<float>(), d_targets.data<int32_t>(),
                                        dloss, N, s.V);
    EXPECT_TRUE(bit_identical("dlogits", to_host<float>(d_dlogits), dlogits));
    cuda::softmax_crossentropy_backward(d_probs.data<float>(), d_probs.data<float>(), d_targets.data<int32_t>(), dloss,
                                        N, s.V);  // in place: dlogits aliases probs
    EXPECT_TRUE(bit_identical("dlogits in place", to_host<float>(d_probs), dlogits));
  }
}

// ---------------------------------------------------------------------------------------------
// The vocabulary split across a tensor-parallel group (common/src/ops/cuda/vocab_parallel.cu; lab 05): each
// piece on one rank's shard of the vocabulary, rows/columns [begin, begin + Vl) of V. Tokens and targets
// fall in and out of the shard. fp32 only: these pieces have no bf16 form.

struct VocabShard {
  int64_t begin;
  int Vl;
};
// The first and the last third of the vocabulary (V = 5: rows 0-1 and 3-4).
std::vector<VocabShard> vocab_shards(int V) {
  const int Vl = (V + 2) / 3;
  return {{0, Vl}, {V - Vl, Vl}};
}

// The same adds in the same order as the CPU twin (rows of one token in increasing order, positions over b):
// bit-identical; the backward from nonzero gradients (the += rule), with and without wpe.
TEST(CudaOps, VocabShardEncoderForwardAndBackwardAreBitIdenticalToCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    for (const VocabShard& v : vocab_shards(s.V)) {
      for (const bool with_wpe : {true, false}) {
        SCOPED_TRACE(s.str() + " shard " + std::to_string(v.begin) + "+" + std::to_string(v.Vl) +
                     (with_wpe ? " with wpe" : " without wpe"));
        const int maxT = s.T + 3;  // wpe has rows the ops must not touch
        const std::vector<int32_t> tokens = token_ids(s.N(), s.V, 60);
        const std::vector<float> wte = uniform(size_t(v.Vl) * s.C, 61), wpe = uniform(size_t(maxT) * s.C, 62);
        std::vector<float> out(size_t(s.N()) * s.C);
        cpu::encoder_forward_vocab_shard(out.data(), tokens.data(), wte.data(), with_wpe ? wpe.data() : nullptr,
                                         v.begin, v.Vl, s.B, s.T, s.C);
        Tensor d_out = to_gpu(std::vector<float>(out.size(), NAN));
        Tensor d_tokens = to_gpu(tokens), d_wte = to_gpu(wte), d_wpe = to_gpu(wpe);
        cuda::encoder_forward_vocab_shard(d_out.data<float>(), d_tokens.data<int32_t>(), d_wte.data<float>(),
                                          with_wpe ? d_wpe.data<float>() : nullptr, v.begin, v.Vl, s.B, s.T, s.C);
        EXPECT_TRUE(bit_identical("vocab-shard encoder out", to_host<float>(d_out), out));

        const std::vector<float> dout = uniform(out.size(), 63);
        std::vector<float> dwte = uniform(wte.size(), 64), dwpe = uniform(wpe.size(), 65);
        Tensor d_dwte = to_gpu(dwte), d_dwpe = to_gpu(dwpe), d_dout = to_gpu(dout);
        cpu::encoder_backward_vocab_shard(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(), tokens.data(),
                                          v.begin, v.Vl, s.B, s.T, s.C);
        cuda::encoder_backward_vocab_shard(d_dwte.data<float>(), with_wpe ? d_dwpe.data<float>() : nullptr,
                                           d_dout.data<float>(), d_tokens.data<int32_t>(), v.begin, v.Vl, s.B, s.T,
                                           s.C);
        EXPECT_TRUE(bit_identical("vocab-shard dwte", to_host<float>(d_dwte), dwte));
        EXPECT_TRUE(bit_identical("vocab-shard dwpe", to_host<float>(d_dwpe), dwpe));  // untouched without wpe
      }
    }
  }
}

// Row max is exact; the partial sums and the finish use expf against std::exp (and a divide against a
// multiply by the inverse): kF32Tol. The backward is one multiply per element, as on the CPU: bit-identical,
// out of place and in place (dlogits aliases probs).
TEST(CudaOps, VocabShardCrossentropyPiecesMatchCpu) {
  SL_REQUIRE_GPU();
  for (const OpShape& s : kShapes) {
    for (const VocabShard& v : vocab_shards(s.V)) {
      SCOPED_TRACE(s.str() + " shard " + std::to_string(v.begin) + "+" + std::to_string(v.Vl));
      const int64_t N = s.N();
      const auto logits = uniform(size_t(N) * v.Vl, 66, -4.0f, 4.0f);
      const auto targets = token_ids(N, s.V, 67);
      std::vector<float> maxes(N), sumexp(N), target_logit(N), losses(N), probs(logits.size());
      cpu::logits_row_max(maxes.data(), logits.data(), N, v.Vl);
      cpu::crossentropy_vocab_shard_partials(sumexp.data(), target_logit.data(), logits.data(), maxes.data(),
                                             targets.data(), v.begin, N, v.Vl);
      cpu::crossentropy_vocab_shard_finish(losses.data(), probs.data(), logits.data(), maxes.data(), sumexp.data(),
                                           target_logit.data(), N, v.Vl);
      Tensor d_logits = to_gpu(logits), d_targets = to_gpu(targets);
      Tensor d_maxes = to_gpu(std::vector<float>(N, NAN));
      cuda::logits_row_max(d_maxes.data<float>(), d_logits.data<float>(), N, v.Vl);
      EXPECT_TRUE(bit_identical("row max", to_host<float>(d_maxes), maxes));

      // Each later piece from the CPU's inputs, so that it is judged alone.
      Tensor d_sumexp = to_gpu(std::vector<float>(N, NAN)), d_target_logit = to_gpu(std::vector<float>(N, NAN));
      Tensor d_cpu_maxes = to_gpu(maxes);
      cuda::crossentropy_vocab_shard_partials(d_sumexp.data<float>(), d_target_logit.data<float>(),
                                              d_logits.data<float>(), d_cpu_maxes.data<float>(),
                                              d_targets.data<int32_t>(), v.begin, N, v.Vl);
      EXPECT_TRUE(close("sumexp", to_host<float>(d_sumexp), sumexp, kF32Tol));
      EXPECT_TRUE(bit_identical("target logit", to_host<float>(d_target_logit), target_logit));

      Tensor d_losses = to_gpu(std::vector<float>(N, NAN)), d_probs = to_gpu(std::vector<float>(probs.size(), NAN));
      Tensor d_cpu_sumexp = to_gpu(sumexp), d_cpu_target_logit = to_gpu(target_logit);
      cuda::crossentropy_vocab_shard_finish(d_losses.data<float>(), d_probs.data<float>(), d_logits.data<float>(),
                                            d_cpu_maxes.data<float>(), d_cpu_sumexp.data<float>(),
                                            d_cpu_target_logit.data<float>(), N, v.Vl);
      EXPECT_TRUE(close("losses", to_host<float>(d_losses), losses, kF32Tol));
      EXPECT_TRUE(close("probs", to_host<float>(d_probs), probs, kF32Tol));

      const float dloss = 1.0f / static_cast<float>(N);
      std::vector<float> dlogits(probs.size());
      cpu::crossentropy_vocab_shard_backward(dlogits.data(), probs.data(), targets.data(), v.begin, dloss, N, v.Vl);
      Tensor d_dlogits = to_gpu(uniform(probs.size(), 68)), d_cpu_probs = to_gpu(probs);
      cuda::crossentropy_vocab_shard_backward(d_dlogits.data<float>(), d_cpu_probs.data<float>(),
                                              d_targets.data<int32_t>(), v.begin, dloss, N, v.Vl);
      EXPECT_TRUE(bit_identical("vocab-shard dlogits", to_host<float>(d_dlogits), dlogits));
      cuda::crossentropy_vocab_shard_backward(d_cpu_probs.data<float>(), d_cpu_probs.data<float>(),
                                              d_targets.data<int32_t>(), v.begin, dloss, N, v.Vl);
      EXPECT_TRUE(bit_identical("vocab-shard dlogits in place", to_host<float>(d_cpu_probs), dlogits));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizer updates, reductions, casts

TEST(CudaOps, AdamWStepIsBitCloseToCpu) {
  SL_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{1001}, int64_t{1000003}}) {
    for (const int64_t t : {int64_t{1}, int64_t{7}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " t=" + std::to_string(t));
      // A state in the middle of training: m of either sign, v >= 0 (t = 1 from zero state is easier).
      std::vector<float> param = uniform(n, 53), m = uniform(n, 55, -0.1f, 0.1f), v = uniform(n, 56, 0.0f, 0.01f);
      const auto grad = uniform(n, 54);
      Tensor d_param = to_gpu(param), d_grad = to_gpu(grad), d_m = to_gpu(m), d_v = to_gpu(v);
      const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
      cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, weight_decay, t);
      cuda::adamw_update(d_param.data<float>(), d_grad.data<float>(), d_m.data<float>(), d_v.data<float>(), n, lr,
                         beta1, beta2, eps, weight_decay, t);
      EXPECT_TRUE(close("adamw param", to_host<float>(d_param), param, kOptimTol));
      EXPECT_TRUE(close("adamw m", to_host<float>(d_m), m, kOptimTol));
      EXPECT_TRUE(close("adamw v", to_host<float>(d_v), v, kOptimTol));
    }
  }
}

TEST(CudaOps, SgdStepIsBitCloseToCpu) {
  SL_REQUIRE_GPU();
  const int64_t n = 1001;
  std::vector<float> param = uniform(n, 57);
  const auto grad = uniform(n, 58);
  Tensor d_param = to_gpu(param), d_grad = to_gpu(grad);
  cpu::sgd_update(param.data(), grad.data(), n, 0.1f, 0.01f);
  cuda::sgd_update(d_param.data<float>(), d_grad.data<float>(), n, 0.1f, 0.01f);
  EXPECT_TRUE(close("sgd param", to_host<float>(d_param), param, kOptimTol));
}

// Double accumulation on both sides, in different orders: relative 1e-12 is ~10^4 double roundings.
// Deterministic: the same call twice gives the same bits (the reduction tree depends only on n).
TEST(CudaOps, SumSquaresMatchesCpuAndIsDeterministic) {
  SL_REQUIRE_GPU();
  constexpr double kSumSquaresRtol = 1e-12;
  for (const int64_t n : {int64_t{1}, int64_t{255}, int64_t{4097}, int64_t{262145}, int64_t{3000001}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = uniform(n, 59);
    Tensor d_x = to_gpu(x);
    const double want = cpu::sum_squares(x.data(), n);
    const double got = cuda::sum_squares(d_x.data<float>(), n);
    EXPECT_NEAR(got, want, kSumSquaresRtol * want);
    const double again = cuda::sum_squares(d_x.data<float>(), n);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0) << got << " then " << again;
  }
}

TEST(CudaOps, ScaleAndCastsAreBitIdenticalToCpuIncludingSpecialValues) {
  SL_REQUIRE_GPU();
  std::vector<float> x = uniform(1001, 60, -3.0f, 3.0f);
  // Ties to even, the largest finite values (round up to inf), subnormals, signed zeros, inf, NaN.
  const float kSpecial[] = {1.0f + 1.0f / 256,
                            1.0f + 3.0f / 256,
                            -(1.0f + 1.0f / 256),
                            3.3895313e38f,
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            1e-40f,
                            -1e-45f,
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  x.insert(x.end(), std::begin(kSpecial), std::end(kSpecial));
  // scale, on everything but the NaN: arithmetic on a NaN returns the canonical NaN on NVIDIA GPUs and
  // the operand's payload on x86, so its bits legitimately differ (both are NaN).
  std::vector<float> scaled(x.begin(), x.end() - 1);
  Tensor d_x = to_gpu(scaled);
  cpu::scale(scaled.data(), static_cast<int64_t>(scaled.size()), 0.37f);
  cuda::scale(d_x.data<float>(), static_cast<int64_t>(scaled.size()), 0.37f);
  EXPECT_TRUE(bit_identical("scale", to_host<float>(d_x), scaled));
  // f32 -> bf16 -> f32 (integer bit arithmetic on both sides, NaN included)
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<bf16> b(n);
  std::vector<float> back(n);
  cpu::cast_f32_to_bf16(b.data(), x.data(), n);
  cpu::cast_bf16_to_f32(back.data(), b.data(), n);
  Tensor d_src = to_gpu(x), d_b = to_gpu(std::vector<bf16>(n)), d_back = to_gpu(std::vector<float>(n));
  cuda::cast_f32_to_bf16(d_b.data<bf16>(), d_src.data<float>(), n);
  cuda::cast_bf16_to_f32(d_back.data<float>(), d_b.data<bf16>(), n);
  EXPECT_TRUE(bit_identical("cast f32->bf16", to_host<bf16>(d_b), b));
  EXPECT_TRUE(bit_identical("cast bf16->f32", to_host<float>(d_back), back));
}

// ---------------------------------------------------------------------------------------------
// The Tensor-level dispatch on GPU tensors (common/src/ops/dispatch.cpp)

TEST(CudaDispatch, TensorOpsOnGpuTensorsRunTheCudaTwins) {
  SL_REQUIRE_GPU();
  const auto x = uniform(51 * 36, 61), y = uniform(51 * 36, 62);
  Tensor d_a = to_gpu(x).reshape({3, 17, 36}), d_b = to_gpu(y).reshape({3, 17, 36});
  Tensor d_out = Tensor::empty({3, 17, 36}, DType::F32, Device::CUDA);
  scalelab::residual_forward(d_out, d_a, d_b);
  std::vector<float> want(x.size());
  cpu::residual_forward(want.data(), x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_TRUE(bit_identical("residual via dispatch", to_host<float>(d_out), want));
  // cast through the dispatch, both directions, and a same-dtype copy on the device
  Tensor d_b16 = Tensor::empty({3, 17, 36}, DType::BF16, Device::CUDA);
  Tensor d_f32 = Tensor::empty({3, 17, 36}, DType::F32, Device::CUDA);
  scalelab::cast(d_b16, d_a);
  scalelab::cast(d_f32, d_b16);
  const std::vector<float> rounded = to_host<float>(d_f32);
  for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(rounded[i], scalelab::round_to_bf16(x[i])) << "index " << i;
  Tensor d_copy = Tensor::empty({3, 17, 36}, DType::F32, Device::CUDA);
  scalelab::cast(d_copy, d_a);
  EXPECT_TRUE(bit_identical("same-dtype cast", to_host<float>(d_copy), x));
  // sum_squares returns a host double
  EXPECT_NEAR(scalelab::sum_squares(d_a), cpu::sum_squares(x.data(), static_cast<int64_t>(x.size())),
              1e-12 * cpu::sum_squares(x.data(), static_cast<int64_t>(x.size())));
}

// A token id outside the vocabulary is found on the GPU and reported exactly as on the CPU (the first
// bad entry, its value, the range), before any kernel reads out of bounds.
TEST(CudaDispatch, OutOfRangeTokenOnGpuThrowsNamingTheFirstBadEntry) {
  SL_REQUIRE_GPU();
  const int B = 2, T = 5, C = 8, V = 64;
  std::vector<int32_t> tokens = token_ids(B * T, V, 63);
  tokens[7] = 99;
  tokens[8] = -1;  // a later bad entry: the report names index 7
  Tensor d_tokens = to_gpu(tokens).reshape({B, T});
  Tensor d_wte = to_gpu(uniform(V * C, 64)).reshape({V, C}), d_wpe = to_gpu(uniform(T * C, 65)).reshape({T, C});
  Tensor d_out = Tensor::empty({B, T, C}, DType::F32, Device::CUDA);
  const std::string msg = error_message([&] { scalelab::encoder_forward(d_out, d_tokens, d_wte, d_wpe); });
  EXPECT_TRUE(contains(msg, "tokens[7] = 99 is outside [0, 64)")) << msg;
  EXPECT_TRUE(contains(msg, "hint:")) << msg;
}

TEST(CudaDispatch, MixingCpuAndGpuTensorsThrowsNamingTheDevices) {
  SL_REQUIRE_GPU();
  Tensor d_a = Tensor::zeros({10}, DType::F32, Device::CUDA), h_b = Tensor::zeros({10});
  Tensor d_out = Tensor::empty({10}, DType::F32, Device::CUDA);
  const std::string msg = error_message([&] { scalelab::residual_forward(d_out, d_a, h_b); });
  EXPECT_TRUE(contains(msg, "cpu") && contains(msg, "cuda")) << msg;
}

// The cuBLAS workspace (32 MiB) is allocated by the counting allocator on first use (category
// Workspace), so it shows in the memory statistics and the simulated cap applies to it.
TEST(CudaDispatch, CublasWorkspaceIsCountedByTheAllocator) {
  SL_REQUIRE_GPU();
  Tensor d_inp = to_gpu(uniform(4 * 8, 66)), d_w = to_gpu(uniform(8 * 8, 67));
  Tensor d_out = to_gpu(std::vector<float>(4 * 8));
  cuda::matmul_forward(d_out.data<float>(), d_inp.data<float>(), d_w.data<float>(), nullptr, 4, 8, 8);
  const scalelab::MemStats s = scalelab::Allocator::get(Device::CUDA).stats();
  EXPECT_GE(s.current_bytes[static_cast<int>(MemCategory::Workspace)], int64_t{32} << 20);
}

// ---------------------------------------------------------------------------------------------
// The whole model: GPT-2 "tiny" on the GPU against the same model on the CPU (docs/style.md 24)

// A GPU model holding exactly the CPU model's parameters (copied unit by unit, not re-initialised).
GPT2 gpu_copy_of(GPT2& cpu_model, const PrecisionPolicy& policy) {
  GPT2 gpu_model(cpu_model.config(), policy, Device::CUDA, /*seed=*/12345);  // a different init, overwritten
  for (int u = 0; u < gpu_model.num_units(); u++) gpu_model.unit_params(u).copy_from(cpu_model.unit_params(u));
  return gpu_model;
}

// Forward, backward, clip, one SGD step, forward again: the losses, every gradient, the gradient norm
// and every parameter after the step agree within kModelTol. (SGD, not AdamW: AdamW normalises the
// ~1e-9 noise of the key bias gradient, whose true value is exactly zero, into steps of up to lr on both
// devices independently; see tests/common/model/test_gpt2_fixture.cpp. AdamW is checked per op above.)
void expect_gpu_model_matches_cpu(const PrecisionPolicy& policy) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  const int B = 3, T = 13;  // odd, T < maxT = 16
  GPT2 cpu_model(cfg, policy, Device::CPU, /*seed=*/7);
  GPT2 gpu_model = gpu_copy_of(cpu_model, policy);
  std::vector<int32_t> h_tokens = token_ids(size_t(B) * (T + 1), cfg.vocab_size, 68);
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      tokens.data<int32_t>()[b * T + t] = h_tokens[b * (T + 1) + t];
      targets.data<int32_t>()[b * T + t] = h_tokens[b * (T + 1) + t + 1];
    }
  Tensor d_tokens = Tensor::empty({B, T}, DType::I32, Device::CUDA);
  Tensor d_targets = Tensor::empty({B, T}, DType::I32, Device::CUDA);
  d_tokens.copy_from(tokens);
  d_targets.copy_from(targets);

  scalelab::OptimizerConfig oc;
  oc.kind = scalelab::OptimizerConfig::Kind::SGD;
  oc.weight_decay = 0.01f;
  scalelab::Optimizer cpu_opt(cpu_model, oc), gpu_opt(gpu_model, oc);

  cpu_model.zero_grad();
  gpu_model.zero_grad();
  const float cpu_loss = cpu_model.forward(tokens, &targets);
  const float gpu_loss = gpu_model.forward(d_tokens, &d_targets);
  EXPECT_TRUE(close("loss", {gpu_loss}, {cpu_loss}, kModelTol));
  cpu_model.backward();
  gpu_model.backward();
  for (const ParamInfo& info : cpu_model.param_table()) {
    EXPECT_TRUE(close("grad " + info.name, to_host<float>(gpu_model.grad(info.name)),
                      to_host<float>(cpu_model.grad(info.name)), kModelTol));
  }
  const float cpu_norm = scalelab::clip_grad_norm(cpu_model, 1.0f);
  const float gpu_norm = scalelab::clip_grad_norm(gpu_model, 1.0f);
  EXPECT_TRUE(close("grad norm", {gpu_norm}, {cpu_norm}, kModelTol));
  cpu_opt.step(0.1f);
  gpu_opt.step(0.1f);
  // The weights the optimizer updated: the fp32 master copy under bf16-mixed, else the parameters. (Not
  // the bf16 parameters: a master value within 1e-9 of a bf16 rounding boundary may round to neighbouring
  // bf16 values on the two devices, 2^-8 apart, which says nothing about the backend.)
  for (const ParamInfo& info : cpu_model.param_table()) {
    const auto updated = [&](GPT2& model, scalelab::Optimizer& opt) {
      return policy.has_master_copy() ? opt.master()[info.unit].view(info.offset, info.shape) : model.param(info.name);
    };
    EXPECT_TRUE(close("weights after step " + info.name, to_host<float>(updated(gpu_model, gpu_opt)),
                      to_host<float>(updated(cpu_model, cpu_opt)), kModelTol));
  }
  const float cpu_loss2 = cpu_model.forward(tokens, &targets);
  const float gpu_loss2 = gpu_model.forward(d_tokens, &d_targets);
  EXPECT_TRUE(close("loss after step", {gpu_loss2}, {cpu_loss2}, kModelTol));
  EXPECT_LT(gpu_loss2, gpu_loss) << "one SGD step on the same batch lowers the loss";
}

TEST(CudaGpt2, Fp32ModelOnGpuMatchesCpuLossGradientsAndStep) {
  SL_REQUIRE_GPU();
  expect_gpu_model_matches_cpu(PrecisionPolicy::fp32());
}

// bf16-mixed: the bf16 parameters are rounded by bit-identical casts on both devices, then the compute
// is fp32 on both (the model's emulated path), so the fp32 tolerance applies.
TEST(CudaGpt2, Bf16MixedModelOnGpuMatchesCpuLossGradientsAndStep) {
  SL_REQUIRE_GPU();
  expect_gpu_model_matches_cpu(PrecisionPolicy::bf16_mixed());
}

// The GPU model against PyTorch float64 (tests/fixtures/gpt2_tiny.json) with the CPU's own tolerances:
// the GPU backend must be as close to PyTorch as the CPU backend is.
TEST(CudaGpt2, LossAndEveryGradientMatchPyTorchFixtureOnGpu) {
  SL_REQUIRE_GPU();
  const scalelab::test::Fixture& fx = scalelab::test::Fixture::load("gpt2_tiny.json");
  GPT2 model(fx.config(), PrecisionPolicy::fp32(), Device::CUDA);
  fx.load_params(model);  // copies to the model's device
  Tensor tokens = Tensor::empty({fx.B(), fx.T()}, DType::I32, Device::CUDA),
         targets = Tensor::empty({fx.B(), fx.T()}, DType::I32, Device::CUDA);
  tokens.copy_from(fx.int_tensor("tokens"));
  targets.copy_from(fx.int_tensor("targets"));
  model.zero_grad();
  const float loss = model.forward(tokens, &targets);
  EXPECT_TRUE(scalelab::test::tensors_close("loss", &loss, {fx.number("loss")}, kFixtureRtol, kFixtureLossAtol));
  model.backward();
  for (const ParamInfo& info : model.param_table()) {
    const std::string key = "grad." + info.name;
    const std::vector<float> h_grad = to_host<float>(model.grad(info.name));
    EXPECT_TRUE(scalelab::test::tensors_close(key, h_grad.data(), fx.array(key), kFixtureRtol, kFixtureGradAtol));
  }
}

// The loss trajectory on the GPU (issue: "the fixture test and the loss trajectory test run on the GPU"):
// 10 optimizer steps on the fixture's batch reproduce PyTorch's 10 losses, with AdamW and with plain SGD
// (SGD shows a wrongly scaled gradient that AdamW would normalise away). Same tolerances as the CPU
// fixture test (tests/common/model/test_gpt2_fixture.cpp): fp32 on both devices.
std::vector<float> gpu_trajectory(const scalelab::test::Fixture& fx, const scalelab::OptimizerConfig& cfg, float lr,
                                  int steps) {
  GPT2 model(fx.config(), PrecisionPolicy::fp32(), Device::CUDA);
  fx.load_params(model);  // before the optimizer copies any state from the parameters
  scalelab::Optimizer opt(model, cfg);
  Tensor tokens = Tensor::empty({fx.B(), fx.T()}, DType::I32, Device::CUDA),
         targets = Tensor::empty({fx.B(), fx.T()}, DType::I32, Device::CUDA);
  tokens.copy_from(fx.int_tensor("tokens"));
  targets.copy_from(fx.int_tensor("targets"));
  std::vector<float> losses;
  for (int k = 0; k < steps; ++k) {  // losses[k]: the loss after k updates, as the fixture records it
    model.zero_grad();
    losses.push_back(model.forward(tokens, &targets));
    model.backward();
    opt.step(lr);
  }
  return losses;
}

TEST(CudaGpt2, TenAdamWStepsOnGpuMatchPyTorchLosses) {
  SL_REQUIRE_GPU();
  const scalelab::test::Fixture& fx = scalelab::test::Fixture::load("gpt2_tiny.json");
  const auto& a = fx.json()["adamw"];
  scalelab::OptimizerConfig cfg;
  cfg.kind = scalelab::OptimizerConfig::Kind::AdamW;
  cfg.beta1 = a["beta1"].get<float>();
  cfg.beta2 = a["beta2"].get<float>();
  cfg.eps = a["eps"].get<float>();
  cfg.weight_decay = a["weight_decay"].get<float>();
  const std::vector<float> losses = gpu_trajectory(fx, cfg, a["lr"].get<float>(), a["steps"].get<int>());
  EXPECT_TRUE(scalelab::test::tensors_close("adamw losses (GPU)", losses.data(), fx.values({"adamw", "losses"}),
                                            kFixtureRtol, kFixtureLossAtol));
}

TEST(CudaGpt2, TenSgdStepsOnGpuMatchPyTorchLosses) {
  SL_REQUIRE_GPU();
  const scalelab::test::Fixture& fx = scalelab::test::Fixture::load("gpt2_tiny.json");
  const auto& sgd = fx.json()["sgd"];
  scalelab::OptimizerConfig cfg;
  cfg.kind = scalelab::OptimizerConfig::Kind::SGD;
  cfg.weight_decay = sgd["weight_decay"].get<float>();
  const std::vector<float> losses = gpu_trajectory(fx, cfg, sgd["lr"].get<float>(), sgd["steps"].get<int>());
  EXPECT_TRUE(scalelab::test::tensors_close("sgd losses (GPU)", losses.data(), fx.values({"sgd", "losses"}),
                                            kFixtureRtol, kFixtureLossAtol));
}

// ---------------------------------------------------------------------------------------------
// bf16-compute (PrecisionPolicy::bf16_compute): GPT-2 "tiny" on the GPU's bf16 tensor cores against the
// CPU twin (which rounds the same operands and multiplies in fp32), from the same bf16 weights.
// Tolerance: both devices round each matmul operand to bf16 deterministically, but the fp32 values they
// round differ by fp32 sum-order noise (about 1e-6 relative after a few layers). An element within that
// distance of a bf16 rounding boundary rounds to neighbouring bf16 values on the two devices, one bf16
// ulp (<= 2^-7 relative) apart; that happens to a fraction of about 1e-6 / 2^-7 ~ 1e-4 of the elements,
// so the operands differ by about sqrt(1e-4) * 2^-7 ~ 1e-4 in relative norm, carried with O(1) gain
// through the ~10 matmuls of a gradient: ~1e-3. We allow 1e-2 relative in norm per gradient tensor and
// 1e-4 of the loss (a flipped element moves the loss by about 2^-8 |x g|, far below that).
TEST(CudaGpt2, Bf16ComputeModelOnGpuMatchesCpuTwin) {
  SL_REQUIRE_GPU();
  constexpr double kBf16ModelRel = 1e-2, kBf16LossRel = 1e-4;
  const GPTConfig cfg = GPTConfig::preset("tiny");
  const int B = 3, T = 13;
  GPT2 cpu_model(cfg, PrecisionPolicy::bf16_compute(), Device::CPU, /*seed=*/9);
  GPT2 gpu_model = gpu_copy_of(cpu_model, PrecisionPolicy::bf16_compute());
  const std::vector<int32_t> h_tokens = token_ids(size_t(B) * T, cfg.vocab_size, 70);
  const std::vector<int32_t> h_targets = token_ids(size_t(B) * T, cfg.vocab_size, 71);
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  std::copy(h_tokens.begin(), h_tokens.end(), tokens.data<int32_t>());
  std::copy(h_targets.begin(), h_targets.end(), targets.data<int32_t>());
  Tensor d_tokens = Tensor::empty({B, T}, DType::I32, Device::CUDA);
  Tensor d_targets = Tensor::empty({B, T}, DType::I32, Device::CUDA);
  d_tokens.copy_from(tokens);
  d_targets.copy_from(targets);

  cpu_model.zero_grad();
  gpu_model.zero_grad();
  const float cpu_loss = cpu_model.forward(tokens, &targets);
  const float gpu_loss = gpu_model.forward(d_tokens, &d_targets);
  std::printf("  [bf16-compute] loss CPU %.7f GPU %.7f\n", cpu_loss, gpu_loss);
  EXPECT_NEAR(gpu_loss, cpu_loss, kBf16LossRel * std::fabs(cpu_loss));
  cpu_model.backward();
  gpu_model.backward();
  double worst = 0;
  for (const ParamInfo& info : cpu_model.param_table()) {
    const std::vector<float> g = to_host<float>(gpu_model.grad(info.name)),
                             c = to_host<float>(cpu_model.grad(info.name));
    double num = 0, den = 0;
    for (size_t i = 0; i < c.size(); i++) {
      num += (double(g[i]) - c[i]) * (double(g[i]) - c[i]);
      den += double(c[i]) * c[i];
    }
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kBf16ModelRel) << "grad " << info.name << ": ||gpu - cpu|| / ||cpu||";
  }
  std::printf("  [bf16-compute] worst gradient ||gpu - cpu|| / ||cpu||: %.2e (allowed %.0e)\n", worst, kBf16ModelRel);
}

// The bf16-compute model on the GPU keeps no per-pass fp32 copy of a unit and allocates nothing per pass:
// after the first step (activations, scratch, cuBLAS workspace), a second step leaves every category's
// current bytes unchanged and its Workspace peak below one fp32 block copy.
TEST(CudaGpt2, Bf16ComputeModelOnGpuAllocatesNothingPerPass) {
  SL_REQUIRE_GPU();
  const GPTConfig cfg = GPTConfig::preset("tiny");
  GPT2 model(cfg, PrecisionPolicy::bf16_compute(), Device::CUDA, /*seed=*/10);
  const std::vector<int32_t> h_tokens = token_ids(2 * 16, cfg.vocab_size, 72);
  Tensor tokens = Tensor::empty({2, 16}, DType::I32);
  std::copy(h_tokens.begin(), h_tokens.end(), tokens.data<int32_t>());
  Tensor d_tokens = Tensor::empty({2, 16}, DType::I32, Device::CUDA);
  d_tokens.copy_from(tokens);
  scalelab::Allocator& alloc = scalelab::Allocator::get(Device::CUDA);
  model.zero_grad();
  model.forward(d_tokens, &d_tokens);
  model.backward();
  const scalelab::MemStats before = alloc.stats();
  alloc.reset_peak();
  model.zero_grad();
  model.forward(d_tokens, &d_tokens);
  model.backward();
  const scalelab::MemStats after = alloc.stats();
  const int w = static_cast<int>(scalelab::MemCategory::Workspace);
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_LT(after.peak_bytes[w] - before.current_bytes[w], scalelab::gpt2_unit_numel(cfg)[1] * 4)
      << "a per-pass fp32 copy of a block";
}

}  // namespace
