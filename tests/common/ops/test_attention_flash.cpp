// test_attention_flash.cpp — the flash-style causal attention's CPU twin (common/src/ops/cpu/attention_flash.cpp)
// and its Tensor-level dispatch (common/src/ops/dispatch.cpp) against the materialized CPU op
// (common/src/ops/cpu/attention.cpp, itself checked against a double reference in test_ops_cpu.cpp):
// out, dqkv (from a nonzero start: the += rule) and lse (against a double-precision log-sum-exp), on
// shapes whose T and HS are not multiples of the tiles (8 rows, 32 keys); that it allocates no O(T^2)
// memory (the counting allocator's peak); that its shape errors name the tensor. The CUDA twin is checked
// against this one in tests/common/ops/test_attention_flash_cuda.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "close_to_scale.h"           // defines: close_to_scale (the kTol criterion)
#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemStats, MemCategory
#include "scalelab/ops/ops.h"         // defines: the Tensor-level ops and the scalelab::cpu:: twins under test
#include "scalelab/core/tensor.h"     // defines: Tensor, DType, Shape
#include "scalelab/core/threads.h"    // defines: num_threads, set_num_threads

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

// ---------------------------------------------------------------------------------------------
// Tolerance (docs/style.md 28)

// Flash against materialized, both fp32 on the CPU: the same sums in another order. The materialized op
// normalises each row once with its global max; the flash op sums per tile of 32 keys against a running
// max and rescales by alpha = exp(m - m_new) once per tile (<= 9 tiles here), so each P or output differs
// by a few fp32 roundings (u = 2^-24 = 6e-8) per tile plus sqrt(K) roundings of sums of K <= 257 terms:
// around 1e-6 of the tensor's largest entry. Criterion, per element, relative to the whole tensor (so
// entries near zero by cancellation are judged on the tensor's scale):
//   |got_i - want_i| <= kTol * (max_j |want_j| + |want_i|)
// kTol leaves 10-20x over that estimate and is the CUDA tests' kF32Tol. Measured (the "[ measured ]" lines):
// at most 1.7e-7 of max|want| for out and lse, 5.7e-7 for dqkv (T = 257). A wrong mask, stride, rescale or
// missing tile errs by O(1) of max|want|.
constexpr double kTol = 2e-5;

// ---------------------------------------------------------------------------------------------
// Shapes: T and HS off the tile sizes, T = 1 (one visible key), T past several key tiles.

struct AttShape {
  int B, T, C, NH;
  int HS() const { return C / NH; }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH);
  }
};
const AttShape kShapes[] = {
    {3, 17, 36, 3},    // HS = 12, T = 17: a partial row block and one partial key tile
    {2, 64, 64, 4},    // powers of two: whole blocks and tiles
    {1, 130, 100, 4},  // HS = 25, T = 130: five key tiles, the last with 2 keys
    {2, 1, 8, 2},      // T = 1: one row, one key
    {1, 257, 48, 2},   // HS = 24, T = 257 = 8 * 32 + 1: a tile of one key at the end
};

// n values uniform in [lo, hi) from a fixed seed (mt19937's sequence is fixed by the C++ standard).
std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = lo + (hi - lo) * static_cast<float>(gen() / 4294967296.0);
  return x;
}

// lse (B,NH,T) in double, straight from the definition: log sum_{s<=t} exp(q_t . k_s / sqrt(HS)),
// with the max subtracted so that exp cannot overflow.
std::vector<double> reference_lse(const std::vector<float>& qkv, const AttShape& s) {
  const int C3 = 3 * s.C, HS = s.HS();
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  std::vector<double> lse(size_t(s.B) * s.NH * s.T), scores(s.T);
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.NH; h++)
      for (int t = 0; t < s.T; t++) {
        double maxval = -INFINITY;
        for (int u = 0; u <= t; u++) {
          double d = 0.0;
          for (int c = 0; c < HS; c++)
            d += double(qkv[(size_t(b) * s.T + t) * C3 + h * HS + c]) *
                 qkv[(size_t(b) * s.T + u) * C3 + s.C + h * HS + c];
          scores[u] = scale * d;
          maxval = std::max(maxval, scores[u]);
        }
        double sum = 0.0;
        for (int u = 0; u <= t; u++) sum += std::exp(scores[u] - maxval);
        lse[(size_t(b) * s.NH + h) * s.T + t] = maxval + std::log(sum);
      }
  return lse;
}

Tensor cpu_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

// ---------------------------------------------------------------------------------------------
// Against the materialized op

TEST(AttentionFlashCpu, ForwardMatchesMaterializedAttentionAndLseMatchesDoubleReference) {
  for (const AttShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const std::vector<float> qkv = uniform(n_qkv, 1);
    std::vector<float> want_out(n_out), att(size_t(s.B) * s.NH * s.T * s.T);
    cpu::attention_forward(want_out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    std::vector<float> out(n_out, NAN), lse(size_t(s.B) * s.NH * s.T, NAN);  // NaN: every entry must be written
    cpu::attention_forward_flash(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(close_to_scale("flash out " + s.str(), out, want_out, kTol));
    EXPECT_TRUE(close_to_scale("flash lse " + s.str(), lse, reference_lse(qkv, s), kTol));
  }
}

TEST(AttentionFlashCpu, BackwardMatchesMaterializedAttentionFromNonzeroGradients) {
  for (const AttShape& s : kShapes) {
    SCOPED_TRACE(s.str());
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const std::vector<float> qkv = uniform(n_qkv, 1), dout = uniform(n_out, 2);
    const std::vector<float> dqkv0 = uniform(n_qkv, 3);  // earlier gradients: backward must add to them
    std::vector<float> out(n_out), att(size_t(s.B) * s.NH * s.T * s.T), datt(att.size());
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    std::vector<float> want = dqkv0;
    cpu::attention_backward(want.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);

    std::vector<float> f_out(n_out), lse(size_t(s.B) * s.NH * s.T);
    cpu::attention_forward_flash(f_out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    std::vector<float> got = dqkv0;
    cpu::attention_backward_flash(got.data(), dout.data(), qkv.data(), f_out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(close_to_scale("flash dqkv " + s.str(), got, want, kTol));
    // The increment alone (got - dqkv0 vs want - dqkv0): dqkv0 is O(1) and would hide a small wrong term.
    std::vector<float> d_got(n_qkv), d_want(n_qkv);
    for (size_t i = 0; i < n_qkv; i++) {
      d_got[i] = got[i] - dqkv0[i];
      d_want[i] = want[i] - dqkv0[i];
    }
    // Subtracting dqkv0 (O(1)) from each adds up to one ulp of 1 (1.2e-7) of rounding to both sides.
    EXPECT_TRUE(close_to_scale("flash dqkv increment " + s.str(), d_got, d_want, kTol + 2.4e-7));
  }
}

// The CPU twin owns disjoint rows per (b, h, block) and sums in a fixed order: the thread count and the
// OpenMP schedule cannot change a bit. Run 0 uses 1 thread, run 1 uses 2.
TEST(AttentionFlashCpu, IsBitIdenticalForAnyThreadCount) {
  const int threads_before = scalelab::num_threads();
  const AttShape s{2, 130, 100, 4};
  const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
  const std::vector<float> qkv = uniform(n_qkv, 4), dout = uniform(n_out, 5);
  std::vector<float> out[2], lse[2], dqkv[2];
  for (int run = 0; run < 2; run++) {
    scalelab::set_num_threads(run + 1);
    out[run].assign(n_out, 0.0f);
    lse[run].assign(size_t(s.B) * s.NH * s.T, 0.0f);
    dqkv[run].assign(n_qkv, 0.0f);
    cpu::attention_forward_flash(out[run].data(), lse[run].data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward_flash(dqkv[run].data(), dout.data(), qkv.data(), out[run].data(), lse[run].data(), s.B, s.T,
                                  s.C, s.NH);
  }
  scalelab::set_num_threads(threads_before);
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(lse[0], lse[1]);
  EXPECT_EQ(dqkv[0], dqkv[1]);
}

// ---------------------------------------------------------------------------------------------
// Memory: the point of the op. The counting allocator sees every byte (the op's scratch is a Workspace
// tensor), so the peak during the op, above what was held before, is exact.

TEST(AttentionFlashCpu, AllocatesNoScoreSizedMemory) {
  const AttShape s{2, 512, 64, 2};  // HS = 32
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH;
  const int64_t att_bytes = B * NH * T * T * 4;  // bytes the materialized op's att would take (4 MiB)
  // What the flash op may use: D (B,NH,T) fp32 in the backward, plus a few (8, HS) tiles per thread.
  const int64_t linear_bytes = B * NH * T * 4 + int64_t{scalelab::num_threads()} * 16 * 1024;
  Tensor qkv = cpu_tensor({B, T, 3 * C}, uniform(size_t(B * T * 3 * C), 6));
  Tensor dout = cpu_tensor({B, T, C}, uniform(size_t(B * T * C), 7));
  Tensor out = Tensor::empty({B, T, C}), lse = Tensor::empty({B, NH, T}), dqkv = Tensor::zeros({B, T, 3 * C});
  Allocator& alloc = Allocator::get(Device::CPU);
  for (int pass = 0; pass < 2; pass++) {
    SCOPED_TRACE(pass == 0 ? "forward" : "backward");
    alloc.reset_peak();
    const MemStats before = alloc.stats();
    if (pass == 0) {
      scalelab::attention_forward_flash(out, lse, qkv, s.NH);
    } else {
      scalelab::attention_backward_flash(dqkv, dout, qkv, out, lse, s.NH);
    }
    const MemStats after = alloc.stats();
    const int64_t extra = after.total_peak_bytes - before.total_current_bytes;  // bytes above the inputs, at peak
    std::printf("[ measured ] %s: peak extra %lld bytes (att would be %lld bytes)\n",
                pass == 0 ? "forward" : "backward", static_cast<long long>(extra), static_cast<long long>(att_bytes));
    EXPECT_LE(extra, linear_bytes);
    EXPECT_LT(extra * 64, att_bytes) << "the op must not allocate anything near B*NH*T*T";
    const int64_t ws = static_cast<int>(MemCategory::Workspace), act = static_cast<int>(MemCategory::Activations);
    EXPECT_LT(after.peak_bytes[ws] - before.current_bytes[ws] + after.peak_bytes[act] - before.current_bytes[act],
              att_bytes);
    EXPECT_EQ(after.total_current_bytes, before.total_current_bytes) << "scratch must be freed on return";
  }
}

// ---------------------------------------------------------------------------------------------
// The Tensor-level ops: same results as the raw twins, and shape errors that name the tensor.

TEST(AttentionFlashCpu, TensorOpsMatchRawTwins) {
  const AttShape s{3, 17, 36, 3};
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH;
  const std::vector<float> h_qkv = uniform(size_t(B * T * 3 * C), 8), h_dout = uniform(size_t(B * T * C), 9);
  std::vector<float> want_out(size_t(B * T * C)), want_lse(size_t(B * NH * T)), want_dqkv(h_qkv.size(), 0.5f);
  cpu::attention_forward_flash(want_out.data(), want_lse.data(), h_qkv.data(), s.B, s.T, s.C, s.NH);
  cpu::attention_backward_flash(want_dqkv.data(), h_dout.data(), h_qkv.data(), want_out.data(), want_lse.data(), s.B,
                                s.T, s.C, s.NH);
  Tensor qkv = cpu_tensor({B, T, 3 * C}, h_qkv), dout = cpu_tensor({B, T, C}, h_dout);
  Tensor out = Tensor::empty({B, T, C}), lse = Tensor::empty({B, NH, T});
  Tensor dqkv = cpu_tensor({B, T, 3 * C}, std::vector<float>(h_qkv.size(), 0.5f));
  scalelab::attention_forward_flash(out, lse, qkv, s.NH);
  scalelab::attention_backward_flash(dqkv, dout, qkv, out, lse, s.NH);
  EXPECT_EQ(std::vector<float>(out.data<float>(), out.data<float>() + out.numel()), want_out);
  EXPECT_EQ(std::vector<float>(lse.data<float>(), lse.data<float>() + lse.numel()), want_lse);
  EXPECT_EQ(std::vector<float>(dqkv.data<float>(), dqkv.data<float>() + dqkv.numel()), want_dqkv);
}

TEST(AttentionFlashCpu, ShapeErrorsNameTheTensor) {
  const int64_t B = 2, T = 5, C = 12, NH = 3;
  Tensor qkv = Tensor::zeros({B, T, 3 * C}), out = Tensor::zeros({B, T, C}), lse = Tensor::zeros({B, NH, T});
  Tensor dout = Tensor::zeros({B, T, C}), dqkv = Tensor::zeros({B, T, 3 * C});
  Tensor bad_lse = Tensor::zeros({B, NH, T + 1}), att_like = Tensor::zeros({B, NH, T, T});
  Tensor bad_out = Tensor::zeros({B, T, C + 1}), bad_qkv = Tensor::zeros({B, T, 3 * C + 1});
  Tensor i32_lse = Tensor::zeros({B, NH, T}, DType::I32);

  std::string msg = error_message([&] { scalelab::attention_forward_flash(out, bad_lse, qkv, NH); });
  EXPECT_TRUE(contains(msg, "lse has shape (2, 3, 6), expected (2, 3, 5)")) << msg;
  msg = error_message([&] { scalelab::attention_forward_flash(out, att_like, qkv, NH); });  // an att, not an lse
  EXPECT_TRUE(contains(msg, "lse has shape (2, 3, 5, 5), expected (2, 3, 5)")) << msg;
  msg = error_message([&] { scalelab::attention_forward_flash(bad_out, lse, qkv, NH); });
  EXPECT_TRUE(contains(msg, "out has shape (2, 5, 13), expected (2, 5, 12)")) << msg;
  msg = error_message([&] { scalelab::attention_forward_flash(out, lse, bad_qkv, NH); });
  EXPECT_TRUE(contains(msg, "the last dimension must be 3*C")) << msg;
  msg = error_message([&] { scalelab::attention_forward_flash(out, lse, qkv, 5); });
  EXPECT_TRUE(contains(msg, "C=12 not divisible by NH=5")) << msg;
  msg = error_message([&] { scalelab::attention_forward_flash(out, i32_lse, qkv, NH); });
  EXPECT_TRUE(contains(msg, "lse must be f32")) << msg;

  msg = error_message([&] { scalelab::attention_backward_flash(dqkv, dout, qkv, out, bad_lse, NH); });
  EXPECT_TRUE(contains(msg, "lse has shape (2, 3, 6), expected (2, 3, 5)")) << msg;
  msg = error_message([&] { scalelab::attention_backward_flash(dqkv, dout, qkv, bad_out, lse, NH); });
  EXPECT_TRUE(contains(msg, "out has shape (2, 5, 13), expected (2, 5, 12)")) << msg;
  msg = error_message([&] { scalelab::attention_backward_flash(dqkv, bad_out, qkv, out, lse, NH); });
  EXPECT_TRUE(contains(msg, "dout has shape (2, 5, 13), expected (2, 5, 12)")) << msg;
  msg = error_message([&] { scalelab::attention_backward_flash(out, dout, qkv, out, lse, NH); });
  EXPECT_TRUE(contains(msg, "dqkv has shape (2, 5, 12), expected (2, 5, 36)")) << msg;
}

}  // namespace
