// test_bf16_compute.cpp — the bf16-compute precision policy (PrecisionPolicy::bf16_compute, precision.h):
// the Tensor-level bf16 matmuls on the CPU (scalelab::matmul_forward_bf16 / matmul_backward_bf16, ops.h;
// twin common/src/ops/cpu/matmul.cpp), their errors, and GPT-2 "tiny" under the policy (common/src/model/gpt2.cpp)
// against fp32 and bf16-mixed: loss, gradients, training, memory. The GPU twin is checked against this
// CPU one in tests/common/ops/test_ops_cuda.cpp; fp32 and bf16-mixed stay pinned to PyTorch by
// tests/common/model/test_gpt2_fixture.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"                       // defines: error_message, contains
#include "bit_identical.h"                      // defines: bit_identical
#include "scalelab/core/allocator.h"            // defines: Allocator, MemCategory
#include "scalelab/core/bf16.h"                 // defines: round_to_bf16
#include "scalelab/core/error.h"                // defines: Error
#include "scalelab/model/gpt2.h"                // defines: GPT2, GPTConfig, ParamInfo, gpt2_unit_numel
#include "scalelab/measure/memory_estimator.h"  // defines: estimate_memory
#include "scalelab/ops/ops.h"                   // defines: matmul_forward(_bf16), matmul_backward(_bf16), cast
#include "scalelab/model/optim.h"               // defines: Optimizer, OptimizerConfig
#include "scalelab/core/precision.h"            // defines: PrecisionPolicy
#include "scalelab/core/threads.h"              // defines: num_threads, set_num_threads

namespace {

using scalelab::test::contains;
using scalelab::test::error_message;
using scalelab::test::bit_identical;

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPTConfig;
using scalelab::MemCategory;
using scalelab::Optimizer;
using scalelab::OptimizerConfig;
using scalelab::ParamInfo;
using scalelab::PrecisionPolicy;
using scalelab::Shape;
using scalelab::Tensor;

// bf16 keeps 8 significant bits: rounding to nearest moves a value by at most half an ulp, 2^-8 of it
// at worst (just above a power of two, where the ulp is 2^-7 of the value). Unit roundoff u = 2^-8.
constexpr double kBf16U = 1.0 / 256;
// fp32 sums in another order (CPU twin vs a double reference): docs/cuda_backend.md's fp32 rule,
// |got_i - want_i| <= kFp32Rel * (max_j |want_j| + |want_i|), 20x above sqrt(K) * 2^-24 for K <= 64.
constexpr double kFp32Rel = 2e-5;

// (n,) fp32 CPU tensor, N(0, 1) from a fixed seed, optionally pre-rounded to bf16 values.
Tensor randn(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(gen);
  return t;
}

Tensor to_dtype(const Tensor& src, DType dt) {
  Tensor dst = Tensor::empty(src.shape(), dt);
  scalelab::cast(dst, src);
  return dst;
}

// (B,T) i32 tokens uniform in [0, V) from a fixed seed.
Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

// got (fp32) against want (double) with the fp32 rule above; prints the first 5 misses and the max error.
::testing::AssertionResult close_fp32(const std::string& what, const float* got, const std::vector<double>& want) {
  double max_want = 0, max_err = 0;
  for (double w : want) max_want = std::max(max_want, std::fabs(w));
  int misses = 0;
  std::string report;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], err = std::fabs(g - want[i]);
    max_err = std::max(max_err, err);
    if (err > kFp32Rel * (max_want + std::fabs(want[i])) && misses++ < 5)
      report += "  [" + std::to_string(i) + "] got " + std::to_string(g) + " want " + std::to_string(want[i]) + "\n";
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << misses << " of " << want.size()
                                       << " outside the fp32 tolerance, max abs error " << max_err << "\n"
                                       << report;
}
::testing::AssertionResult close_fp32(const std::string& what, const Tensor& got, const std::vector<double>& want) {
  return close_fp32(what, got.data<float>(), want);
}

int64_t current_bytes(MemCategory c) { return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(c)]; }
int64_t peak_bytes(MemCategory c) { return Allocator::get(Device::CPU).stats().peak_bytes[static_cast<int>(c)]; }

GPTConfig tiny() { return GPTConfig::preset("tiny"); }  // maxT=16, V=64, L=2, NH=2, C=16

// One forward + backward of the model from zeroed gradients on (tokens, targets); returns the loss.
float loss_and_grads(GPT2& model, const Tensor& tokens, const Tensor& targets) {
  model.zero_grad();
  const float loss = model.forward(tokens, &targets);
  model.backward();
  return loss;
}

// ||a - b||_2 / ||b||_2 over one gradient tensor.
double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = static_cast<double>(a.data<float>()[i]) - b.data<float>()[i];
    num += d * d;
    den += static_cast<double>(b.data<float>()[i]) * b.data<float>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The ops

// (B,T,C) = (2,5,24) -> OC = 40 with bias: out = the matmul of the ROUNDED operands, summed in fp32. The
// reference is computed in double from the bf16 values; bf16 products are exact in fp32, so only the fp32
// sum order separates them (kFp32Rel).
TEST(Bf16Compute, CpuForwardIsTheFp32MatmulOfTheRoundedOperands) {
  const int B = 2, T = 5, C = 24, OC = 40;
  const Tensor inp = to_dtype(randn({B, T, C}, 1), DType::BF16), weight = to_dtype(randn({OC, C}, 2), DType::BF16);
  const Tensor bias = randn({OC}, 3);
  Tensor out = Tensor::empty({B, T, OC});
  scalelab::matmul_forward_bf16(out, inp, weight, &bias);

  const Tensor x = to_dtype(inp, DType::F32), w = to_dtype(weight, DType::F32);  // the rounded values
  std::vector<double> want(static_cast<size_t>(B * T * OC));
  for (int n = 0; n < B * T; ++n)
    for (int o = 0; o < OC; ++o) {
      double acc = bias.data<float>()[o];
      for (int c = 0; c < C; ++c) acc += static_cast<double>(x.data<float>()[n * C + c]) * w.data<float>()[o * C + c];
      want[n * OC + o] = acc;
    }
  EXPECT_TRUE(close_fp32("out", out, want));

  // The cast + sgemm path (the op without oneDNN, and the oracle of the oneDNN path below) is bit-identical
  // to the fp32 op on the rounded operands: it is exactly that.
  Tensor out_ref = Tensor::empty({B, T, OC}), out_f32 = Tensor::empty({B, T, OC});
  scalelab::cpu::matmul_forward_bf16_reference(out_ref.data<float>(), inp.data<scalelab::bf16>(),
                                               weight.data<scalelab::bf16>(), bias.data<float>(), B * T, C, OC);
  scalelab::matmul_forward(out_f32, x, w, &bias);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out_ref.data<float>()[i], out_f32.data<float>()[i]) << i;
}

// Backward from nonzero gradients (the `+=` rule): dinp += dout @ W, dweight += dout^T @ inp, dbias +=
// column sums of the ROUNDED dout.
TEST(Bf16Compute, CpuBackwardAddsTheFp32GradientsOfTheRoundedOperands) {
  const int N = 9, C = 20, OC = 12;
  const Tensor dout = to_dtype(randn({N, OC}, 4), DType::BF16), inp = to_dtype(randn({N, C}, 5), DType::BF16);
  const Tensor weight = to_dtype(randn({OC, C}, 6), DType::BF16);
  Tensor dinp = randn({N, C}, 7), dweight = randn({OC, C}, 8), dbias = randn({OC}, 9);
  const Tensor dinp0 = to_dtype(dinp, DType::F32), dweight0 = to_dtype(dweight, DType::F32),
               dbias0 = to_dtype(dbias, DType::F32);  // copies of the starting values
  scalelab::matmul_backward_bf16(&dinp, &dweight, &dbias, dout, inp, weight);

  const Tensor g = to_dtype(dout, DType::F32), x = to_dtype(inp, DType::F32), w = to_dtype(weight, DType::F32);
  auto at = [](const Tensor& t, int64_t i) { return static_cast<double>(t.data<float>()[i]); };
  std::vector<double> want_dinp(N * C), want_dweight(OC * C), want_dbias(OC);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      double acc = at(dinp0, n * C + c);
      for (int o = 0; o < OC; ++o) acc += at(g, n * OC + o) * at(w, o * C + c);
      want_dinp[n * C + c] = acc;
    }
  for (int o = 0; o < OC; ++o) {
    for (int c = 0; c < C; ++c) {
      double acc = at(dweight0, o * C + c);
      for (int n = 0; n < N; ++n) acc += at(g, n * OC + o) * at(x, n * C + c);
      want_dweight[o * C + c] = acc;
    }
    double acc = at(dbias0, o);
    for (int n = 0; n < N; ++n) acc += at(g, n * OC + o);
    want_dbias[o] = acc;
  }
  EXPECT_TRUE(close_fp32("dinp", dinp, want_dinp));
  EXPECT_TRUE(close_fp32("dweight", dweight, want_dweight));
  EXPECT_TRUE(close_fp32("dbias", dbias, want_dbias));

  // Optional outputs: without dinp and dbias only dweight changes (the same values as above).
  Tensor dweight2 = to_dtype(dweight0, DType::F32);
  scalelab::matmul_backward_bf16(nullptr, &dweight2, nullptr, dout, inp, weight);
  EXPECT_TRUE(close_fp32("dweight (no dinp, no dbias)", dweight2, want_dweight));
}

// The op the model calls (cpu::matmul_*_bf16: oneDNN's bf16 GEMM in a build with oneDNN on a CPU with
// AVX512_BF16) against the cast + sgemm oracle (cpu::matmul_*_bf16_reference), within the fp32 rule: both
// compute the exact bf16 x bf16 products and sum them in fp32, in different orders. Odd shapes (no multiple
// of 16: the kernels' tails), operands at odd element offsets into their buffers (bf16 views 2 bytes off a
// 4-byte boundary, as a slice of a larger tensor would be), forward with and without bias, backward from
// nonzero gradients (the `+=` rule) with and without dinp/dbias. Without oneDNN both sides are the same
// code and the test is trivially exact; the backend in use is printed.
TEST(Bf16Compute, CpuOpMatchesTheCastSgemmOracleOnOddShapesAndOffsets) {
  using scalelab::bf16;
  std::printf("  [bf16-compute] CPU bf16 matmul backend: %s\n", scalelab::cpu::bf16_matmul_backend().c_str());
  struct Case {
    int N, C, OC;
  };
  // the last one spans several kernel blocks in every dimension
  const Case cases[] = {{1, 1, 1}, {7, 13, 29}, {33, 51, 17}, {131, 97, 211}};
  uint32_t seed = 100;
  for (const Case& k : cases) {
    const int64_t N = k.N, C = k.C, OC = k.OC;
    const std::string shape = "(N,C,OC)=(" + std::to_string(N) + "," + std::to_string(C) + "," + std::to_string(OC) +
                              ")";
    // Buffers one or three elements longer than the view; each view starts at that offset.
    auto bf16_buffer = [&](int64_t n, int64_t offset) { return to_dtype(randn({n + offset}, seed++), DType::BF16); };
    const Tensor inp_buf = bf16_buffer(N * C, 1), weight_buf = bf16_buffer(OC * C, 3),
                 dout_buf = bf16_buffer(N * OC, 1);
    const Tensor bias_buf = randn({OC + 1}, seed++);
    const bf16* inp = inp_buf.data<bf16>() + 1;        // (N,C)
    const bf16* weight = weight_buf.data<bf16>() + 3;  // (OC,C)
    const bf16* dout = dout_buf.data<bf16>() + 1;      // (N,OC)
    const float* bias = bias_buf.data<float>() + 1;    // (OC)
    auto as_double = [](const Tensor& t, int64_t offset, int64_t n) {
      return std::vector<double>(t.data<float>() + offset, t.data<float>() + offset + n);
    };

    for (const float* b : {bias, static_cast<const float*>(nullptr)}) {
      Tensor out = Tensor::empty({N * OC + 1}), out_ref = Tensor::empty({N * OC});
      scalelab::cpu::matmul_forward_bf16(out.data<float>() + 1, inp, weight, b, N, static_cast<int>(C),
                                         static_cast<int>(OC));
      scalelab::cpu::matmul_forward_bf16_reference(out_ref.data<float>(), inp, weight, b, N, static_cast<int>(C),
                                                   static_cast<int>(OC));
      EXPECT_TRUE(close_fp32("out " + shape + (b ? " with bias" : " no bias"), out.data<float>() + 1,
                             as_double(out_ref, 0, N * OC)));
    }

    // Backward from nonzero gradients: the same starting values on both sides, outputs at offset 1.
    const Tensor dinp0 = randn({N * C + 1}, seed++), dweight0 = randn({OC * C + 1}, seed++),
                 dbias0 = randn({OC + 1}, seed++);
    for (const bool all_outputs : {true, false}) {
      Tensor dinp = to_dtype(dinp0, DType::F32), dweight = to_dtype(dweight0, DType::F32),
             dbias = to_dtype(dbias0, DType::F32);
      Tensor dinp_ref = to_dtype(dinp0, DType::F32), dweight_ref = to_dtype(dweight0, DType::F32),
             dbias_ref = to_dtype(dbias0, DType::F32);
      auto at1 = [&](Tensor& t) { return all_outputs ? t.data<float>() + 1 : nullptr; };
      scalelab::cpu::matmul_backward_bf16(at1(dinp), dweight.data<float>() + 1, at1(dbias), dout, inp, weight, N,
                                          static_cast<int>(C), static_cast<int>(OC));
      scalelab::cpu::matmul_backward_bf16_reference(at1(dinp_ref), dweight_ref.data<float>() + 1, at1(dbias_ref), dout,
                                                    inp, weight, N, static_cast<int>(C), static_cast<int>(OC));
      const std::string which = shape + (all_outputs ? "" : " (no dinp, no dbias)");
      EXPECT_TRUE(close_fp32("dweight " + which, dweight.data<float>() + 1, as_double(dweight_ref, 1, OC * C)));
      if (all_outputs) {
        EXPECT_TRUE(close_fp32("dinp " + which, dinp.data<float>() + 1, as_double(dinp_ref, 1, N * C)));
        EXPECT_TRUE(close_fp32("dbias " + which, dbias.data<float>() + 1, as_double(dbias_ref, 1, OC)));
      } else {  // untouched
        for (int64_t i = 0; i < dinp.numel(); ++i) ASSERT_EQ(dinp.data<float>()[i], dinp0.data<float>()[i]) << which;
        for (int64_t i = 0; i < dbias.numel(); ++i) ASSERT_EQ(dbias.data<float>()[i], dbias0.data<float>()[i]) << which;
      }
      // the element before each view is untouched (no write outside the view)
      EXPECT_EQ(dweight.data<float>()[0], dweight0.data<float>()[0]) << which;
      EXPECT_EQ(dinp.data<float>()[0], dinp0.data<float>()[0]) << which;
    }
  }
}

// The bf16 matmul's two gradients computed apart, as a zero-bubble pipeline schedule runs them (B: dinp now;
// W: dweight and dbias later; ops.h), give exactly the bits of one call computing all three, from nonzero
// gradients and in either order; a call leaves the gradients it is not asked for untouched. Both CPU paths:
// the op the model calls (scalelab::matmul_backward_bf16: oneDNN where the build and the CPU have it, the
// backend printed above) and the cast + sgemm twin (cpu::matmul_backward_bf16_reference). Shape: several
// kernel blocks in every dimension, N*OC > 32768 (the dbias column sums threaded).
TEST(Bf16Compute, CpuBackwardApartGivesTheBitsOfOneCall) {
  const int N = 131, C = 97, OC = 211;
  const Tensor dout = to_dtype(randn({N, OC}, 70), DType::BF16), inp = to_dtype(randn({N, C}, 71), DType::BF16);
  const Tensor weight = to_dtype(randn({OC, C}, 72), DType::BF16);
  const Tensor dinp0 = randn({N, C}, 73), dweight0 = randn({OC, C}, 74), dbias0 = randn({OC}, 75);
  auto ptr = [](Tensor* t) { return t != nullptr ? t->data<float>() : nullptr; };
  using Backward = std::function<void(Tensor * dinp, Tensor * dweight, Tensor * dbias)>;
  const std::pair<std::string, Backward> paths[] = {
      {"matmul_backward_bf16",
       [&](Tensor* dx, Tensor* dw, Tensor* db) { scalelab::matmul_backward_bf16(dx, dw, db, dout, inp, weight); }},
      {"cpu::matmul_backward_bf16_reference", [&](Tensor* dx, Tensor* dw, Tensor* db) {
         scalelab::cpu::matmul_backward_bf16_reference(ptr(dx), ptr(dw), ptr(db), dout.data<scalelab::bf16>(),
                                                       inp.data<scalelab::bf16>(), weight.data<scalelab::bf16>(), N, C,
                                                       OC);
       }}};
  auto bits = [](const std::string& what, const Tensor& got, const Tensor& want) {
    auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); };
    return bit_identical(what, values(got), values(want));
  };
  for (const auto& [name, backward] : paths) {
    // copies of the starting gradients (to_dtype to the same dtype copies)
    Tensor dinp = to_dtype(dinp0, DType::F32), dweight = to_dtype(dweight0, DType::F32),
           dbias = to_dtype(dbias0, DType::F32);
    backward(&dinp, &dweight, &dbias);  // one call: all three
    for (const bool b_first : {true, false}) {
      const std::string which = name + (b_first ? ", dinp first" : ", dweight and dbias first");
      Tensor dinp2 = to_dtype(dinp0, DType::F32), dweight2 = to_dtype(dweight0, DType::F32),
             dbias2 = to_dtype(dbias0, DType::F32);
      if (b_first) {
        backward(&dinp2, nullptr, nullptr);
        EXPECT_TRUE(bits("dweight after dinp alone (untouched), " + which, dweight2, dweight0));
        EXPECT_TRUE(bits("dbias after dinp alone (untouched), " + which, dbias2, dbias0));
        backward(nullptr, &dweight2, &dbias2);
      } else {
        backward(nullptr, &dweight2, &dbias2);
        EXPECT_TRUE(bits("dinp after dweight alone (untouched), " + which, dinp2, dinp0));
        backward(&dinp2, nullptr, nullptr);
      }
      EXPECT_TRUE(bits("dinp, " + which, dinp2, dinp));
      EXPECT_TRUE(bits("dweight, " + which, dweight2, dweight));
      EXPECT_TRUE(bits("dbias, " + which, dbias2, dbias));
    }
  }
}

TEST(Bf16Compute, OpsNameTheWrongDtypeOrShape) {
  const Tensor inp_bf16 = Tensor::zeros({4, 8}, DType::BF16), w_bf16 = Tensor::zeros({6, 8}, DType::BF16);
  const Tensor inp_f32 = Tensor::zeros({4, 8}), bias_bf16 = Tensor::zeros({6}, DType::BF16);
  Tensor out = Tensor::empty({4, 6}), dw = Tensor::zeros({6, 8});
  std::string msg = error_message([&] { scalelab::matmul_forward_bf16(out, inp_f32, w_bf16, nullptr); });
  EXPECT_TRUE(contains(msg, "inp must be bf16, got f32")) << msg;
  msg = error_message([&] { scalelab::matmul_forward_bf16(out, inp_bf16, w_bf16, &bias_bf16); });
  EXPECT_TRUE(contains(msg, "must be f32, got bf16")) << msg;
  const Tensor w_wrong = Tensor::zeros({6, 7}, DType::BF16);
  msg = error_message([&] { scalelab::matmul_forward_bf16(out, inp_bf16, w_wrong, nullptr); });
  EXPECT_TRUE(contains(msg, "inp has shape (4, 8), expected (..., C=7)")) << msg;
  Tensor out_wrong = Tensor::empty({4, 5});
  msg = error_message([&] { scalelab::matmul_forward_bf16(out_wrong, inp_bf16, w_bf16, nullptr); });
  EXPECT_TRUE(contains(msg, "out has shape (4, 5)")) << msg;
  const Tensor dout_f32 = Tensor::zeros({4, 6});
  msg = error_message([&] { scalelab::matmul_backward_bf16(nullptr, &dw, nullptr, dout_f32, inp_bf16, w_bf16); });
  EXPECT_TRUE(contains(msg, "dout must be bf16, got f32")) << msg;
  // and the fp32 op still refuses bf16 operands
  msg = error_message([&] { scalelab::matmul_forward(out, inp_bf16, w_bf16, nullptr); });
  EXPECT_TRUE(contains(msg, "inp must be f32, got bf16")) << msg;
}

// ---------------------------------------------------------------------------------------------
// The policy

TEST(Bf16Compute, PolicyNamesAndWhereItIsRefused) {
  const PrecisionPolicy p = PrecisionPolicy::from_name("bf16-compute");
  EXPECT_EQ(p.name(), "bf16-compute");
  EXPECT_EQ(p.param_dtype, DType::BF16);
  EXPECT_EQ(p.grad_dtype, DType::F32);
  EXPECT_EQ(p.master_dtype, DType::F32);
  EXPECT_EQ(p.reduce_dtype, DType::F32);
  EXPECT_EQ(p.matmul_dtype, DType::BF16);
  EXPECT_EQ(PrecisionPolicy::from_name("bf16").matmul_dtype, DType::F32) << "bf16 = bf16-mixed: fp32 matmuls";
  EXPECT_EQ(PrecisionPolicy::from_name("fp32").matmul_dtype, DType::F32);
  EXPECT_TRUE(contains(error_message([] { PrecisionPolicy::from_name("bf16-autocast"); }), "bf16-compute"));

  // bf16 matmuls read the bf16 parameters in place: fp32 parameters with bf16 matmuls are refused
  PrecisionPolicy odd = PrecisionPolicy::fp32();
  odd.matmul_dtype = DType::BF16;
  EXPECT_EQ(odd.name(), "param=f32,master=f32,grad=f32,reduce=f32,matmul=bf16");
  EXPECT_TRUE(contains(error_message([&] { GPT2 m(tiny(), odd); }), "need bf16 parameters"));

  // the memory estimator (lab 04, sl_memory) models fp32 and bf16-mixed only: a clear refusal, not numbers
  const std::string msg =
      error_message([&] { scalelab::estimate_memory(tiny(), 1, 0, p, OptimizerConfig::Kind::AdamW, 0, 2, 16); });
  EXPECT_TRUE(contains(msg, "bf16-compute is not modelled")) << msg;
  EXPECT_TRUE(contains(msg, "--precision fp32 and bf16")) << msg;
}

// ---------------------------------------------------------------------------------------------
// The model. Same seed, so bf16-mixed and bf16-compute hold the same bf16 weights; fp32 holds them
// unrounded. B=4, T=16 random tokens.

// Loss bound, first order. Write each matmul as y = x W^T with x the fp32 activation and W the weight.
//  - bf16-mixed rounds every weight: |dW| <= u |W|, so |L_mixed - L_fp32| <= u * S_w, S_w = sum_i |w_i g_i|
//    over all parameters with the fp32 model's gradients g (the fixture test's bound).
//  - bf16-compute also rounds each matmul's input: |dx| <= u |x|. A product x_c W_oc moves by at most u of
//    itself whichever operand is rounded, so the input rounding changes each product by the same relative
//    amount, in the same sums, as the weight rounding did; we bound its effect by the same u * S_w. That
//    step is an argument by symmetry, not a proof (S_w sums |W dW| per weight, the input term sums |x dx| per
//    activation); the margin it leaves (measured: 80x against bf16-mixed, 300x against fp32) is the check.
//  - dout is rounded only in the backward: it does not change the loss.
//  So |L_compute - L_mixed| <= u * S_w and |L_compute - L_fp32| <= 2 u * S_w, plus fp32 rounding of the
//  loss (1e-5 relative, test_gpt2_fixture.cpp's kRtol), second-order terms u^2 smaller.
TEST(Bf16Compute, TinyLossWithinRoundingBoundOfFp32AndBf16Mixed) {
  const Tensor tokens = random_tokens(4, 16, 64, 11), targets = random_tokens(4, 16, 64, 12);
  GPT2 fp32(tiny(), PrecisionPolicy::fp32(), Device::CPU, 5),
      mixed(tiny(), PrecisionPolicy::bf16_mixed(), Device::CPU, 5),
      compute(tiny(), PrecisionPolicy::bf16_compute(), Device::CPU, 5);
  const double l_fp32 = loss_and_grads(fp32, tokens, targets), l_mixed = loss_and_grads(mixed, tokens, targets),
               l_compute = loss_and_grads(compute, tokens, targets);
  double s_w = 0;  // sum_i |w_i * dL/dw_i| of the fp32 model
  for (const ParamInfo& p : fp32.param_table()) {
    const Tensor w = fp32.param(p.name), g = fp32.grad(p.name);
    for (int64_t i = 0; i < p.numel; ++i)
      s_w += std::fabs(static_cast<double>(w.data<float>()[i]) * g.data<float>()[i]);
  }
  const double fp32_tol = 1e-5 * l_fp32;
  std::printf("  [bf16-compute] loss fp32 %.7f, bf16-mixed %.7f, bf16-compute %.7f; u*S_w = %.2e\n", l_fp32, l_mixed,
              l_compute, kBf16U * s_w);
  std::printf("  [bf16-compute] |compute - mixed| %.2e (bound %.2e), |compute - fp32| %.2e (bound %.2e)\n",
              std::fabs(l_compute - l_mixed), kBf16U * s_w + fp32_tol, std::fabs(l_compute - l_fp32),
              2 * kBf16U * s_w + fp32_tol);
  EXPECT_LE(std::fabs(l_compute - l_mixed), kBf16U * s_w + fp32_tol);
  EXPECT_LE(std::fabs(l_compute - l_fp32), 2 * kBf16U * s_w + fp32_tol);
  EXPECT_NE(l_compute, l_mixed) << "bf16-compute rounds the activations: the loss must differ from bf16-mixed's";
}

// Gradients. Each gradient is a chain of matmuls backward through L = 2 blocks; under bf16-compute every
// matmul on the way rounds its two operands (dout and the weight or the input), each by <= u, so a
// gradient entry carries at most about 2u per matmul it passes: the deepest (wte, h.0) pass the LM head,
// 4 matmuls per block and layernorms that do not amplify much, about 10 matmuls: 20u = 8%. Relative to
// the sum of |terms| that is a worst case; summed with random signs the errors come out near
// sqrt(10) * u ~ 1%. We require ||g_compute - g_mixed|| <= 20u ||g_mixed|| per tensor (against bf16-mixed:
// the same weights, so only the activation and dout rounding differ).
TEST(Bf16Compute, TinyGradientsCloseToBf16Mixed) {
  constexpr double kGradRel = 20 * kBf16U;
  const Tensor tokens = random_tokens(4, 16, 64, 21), targets = random_tokens(4, 16, 64, 22);
  GPT2 mixed(tiny(), PrecisionPolicy::bf16_mixed(), Device::CPU, 6);
  GPT2 compute(tiny(), PrecisionPolicy::bf16_compute(), Device::CPU, 6);
  loss_and_grads(mixed, tokens, targets);
  loss_and_grads(compute, tokens, targets);
  double worst = 0;
  std::string worst_name;
  for (const ParamInfo& p : mixed.param_table()) {
    const double r = rel_l2(compute.grad(p.name), mixed.grad(p.name));
    EXPECT_LE(r, kGradRel) << p.name;
    if (r > worst) worst = r, worst_name = p.name;
  }
  std::printf("  [bf16-compute] worst gradient ||diff||/||g|| vs bf16-mixed: %.2e (%s), bound %.2e\n", worst,
              worst_name.c_str(), kGradRel);
}

// Training: 10 AdamW steps on one batch lower the loss, and the losses follow fp32's within 2 u S_w
// per step (the loss bound above) plus the drift of 10 steps of different rounding: we allow 2% of the
// loss, well above the measured difference (printed) and well below the loss drop it checks (> 10%).
TEST(Bf16Compute, TinyTrainingLowersTheLossLikeFp32) {
  const Tensor tokens = random_tokens(4, 16, 64, 31), targets = random_tokens(4, 16, 64, 32);
  OptimizerConfig oc;
  oc.weight_decay = 0.0f;
  std::vector<float> losses[2];
  const PrecisionPolicy policies[2] = {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_compute()};
  for (int k = 0; k < 2; ++k) {
    GPT2 model(tiny(), policies[k], Device::CPU, 7);
    Optimizer opt(model, oc);
    for (int step = 0; step < 10; ++step) {
      losses[k].push_back(loss_and_grads(model, tokens, targets));
      opt.step(1e-2f);
    }
  }
  std::printf("  [bf16-compute] 10 AdamW steps: fp32 %.4f -> %.4f, bf16-compute %.4f -> %.4f\n", losses[0][0],
              losses[0][9], losses[1][0], losses[1][9]);
  EXPECT_LT(losses[1][9], 0.9f * losses[1][0]) << "bf16-compute training does not lower the loss";
  for (int step = 0; step < 10; ++step)
    EXPECT_NEAR(losses[1][step], losses[0][step], 0.02 * losses[0][step]) << "step " << step;
}

// Memory: bf16-compute makes no per-pass fp32 copy of a whole unit. Its fp32 scratch for the small
// (non-matmul) parameters is allocated with the activations and persists; what a pass adds on top
// (Workspace) is only one matmul's scratch at a time (ops.h): the cast + sgemm path's fp32 copies of its
// operands, or oneDNN's scratchpad (packed operand blocks; counted as Workspace by matmul_dnnl.cpp).
// bf16-mixed, for contrast, allocates an fp32 copy of each whole unit per pass (lab 04's estimator counts it).
TEST(Bf16Compute, NoPerPassFp32CopyOfAWholeUnit) {
  using scalelab::bf16;
  const GPTConfig cfg = tiny();
  const int B = 1, T = 2;  // small activations, so a whole unit dwarfs the matmul operands
  // One thread, as ctest runs it (OMP_NUM_THREADS=1): oneDNN's scratchpad grows with the thread count, and
  // at 2 threads it alone exceeds this tiny model's fp32 block (17664 > 13120 B), which the last check assumes.
  const int threads_before = scalelab::num_threads();
  scalelab::set_num_threads(1);
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  const Tensor tokens = random_tokens(B, T, static_cast<int>(V), 41),
               targets = random_tokens(B, T, static_cast<int>(V), 42);
  const std::vector<int64_t> unit_numel = scalelab::gpt2_unit_numel(cfg);
  const int64_t block_bytes = unit_numel[1] * 4;  // an fp32 copy of one block (3280 floats here)
  // Largest scratch of one CPU bf16 matmul (forward or backward) over the model's shapes (C -> OC): qkv
  // (C -> 3C), attention and mlp projections (C -> C, 4C -> C), c_fc (C -> 4C), the LM head (C -> V),
  // measured on the op itself. For the cast + sgemm path it is the fp32 copies of dout (N,OC), inp (N,C) and
  // weight (OC,C) of the largest backward.
  const int64_t N = B * T;
  int64_t one_matmul_bytes = 0;
  for (const auto& [c_in, c_out] :
       std::vector<std::pair<int64_t, int64_t>>{{C, 3 * C}, {C, C}, {4 * C, C}, {C, 4 * C}, {C, V}}) {
    const Tensor x = Tensor::zeros({N, c_in}, DType::BF16), w = Tensor::zeros({c_out, c_in}, DType::BF16),
                 dy = Tensor::zeros({N, c_out}, DType::BF16), b = Tensor::zeros({c_out});
    Tensor y = Tensor::zeros({N, c_out}), dx = Tensor::zeros({N, c_in}), dw = Tensor::zeros({c_out, c_in}),
           db = Tensor::zeros({c_out});
    const int64_t resting = current_bytes(MemCategory::Workspace);
    Allocator::get(Device::CPU).reset_peak();
    scalelab::matmul_forward_bf16(y, x, w, &b);
    scalelab::matmul_backward_bf16(&dx, &dw, &db, dy, x, w);
    one_matmul_bytes = std::max(one_matmul_bytes, peak_bytes(MemCategory::Workspace) - resting);
  }
  const int64_t twin_bytes = 4 * std::max({N * 4 * C + N * C + 4 * C * C, N * V + N * C + V * C});
  if (scalelab::cpu::bf16_matmul_backend().rfind("fp32 sgemm", 0) == 0) {
    EXPECT_EQ(one_matmul_bytes, twin_bytes) << "the cast + sgemm path's scratch is its three fp32 operand copies";
  }

  const PrecisionPolicy policies[2] = {PrecisionPolicy::bf16_mixed(), PrecisionPolicy::bf16_compute()};
  int64_t extra[2] = {0, 0};  // Workspace peak during a step above what was held before it
  for (int k = 0; k < 2; ++k) {
    GPT2 model(cfg, policies[k], Device::CPU, 8);
    loss_and_grads(model, tokens, targets);  // allocates activations (and bf16-compute's scratch)
    const int64_t before = current_bytes(MemCategory::Workspace);
    Allocator::get(Device::CPU).reset_peak();
    loss_and_grads(model, tokens, targets);
    extra[k] = peak_bytes(MemCategory::Workspace) - before;
    EXPECT_EQ(current_bytes(MemCategory::Workspace), before) << policies[k].name() << ": a pass leaks Workspace";
  }
  std::printf(
      "  [bf16-compute] Workspace peak above resting during a step: bf16-mixed %lld B, bf16-compute %lld B "
      "(an fp32 block copy is %lld B; one bf16 matmul's scratch at most %lld B, backend %s)\n",
      static_cast<long long>(extra[0]), static_cast<long long>(extra[1]), static_cast<long long>(block_bytes),
      static_cast<long long>(one_matmul_bytes), scalelab::cpu::bf16_matmul_backend().c_str());
  EXPECT_GE(extra[0], block_bytes) << "bf16-mixed copies a whole unit per pass (so the check below can see one)";
  EXPECT_LE(extra[1], one_matmul_bytes) << "bf16-compute should add only one matmul's scratch at a time (CPU twin)";
  EXPECT_LT(extra[1], block_bytes);
  scalelab::set_num_threads(threads_before);
}
