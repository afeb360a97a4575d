// test_ops_cpu.cpp — the CPU twins of the GPT-2 ops (scalelab/ops/ops.h, common/src/ops/cpu/*.cpp) and their
// Tensor-level dispatch (common/src/ops/dispatch.cpp).
// Every forward is compared with a plain double-precision loop written below (the "reference"); every
// backward with central finite differences of that reference. Small odd shapes (B=2, T=5, C=12, NH=3,
// V=13) catch off-by-one strides that powers of two hide. Also checked: the += rule of backward ops, the
// matmul's input and weight gradients computed apart (the bits of one call), the causal mask, AdamW/SGD
// against hand-computed steps, and bf16 round-to-nearest-even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bit_identical.h"          // defines: bit_identical
#include "scalelab/core/bf16.h"     // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/core/error.h"    // defines: scalelab::Error
#include "scalelab/ops/ops.h"       // defines: the ops under test, scalelab:: (Tensor) and scalelab::cpu:: (pointers)
#include "scalelab/core/tensor.h"   // defines: Tensor, Shape
#include "scalelab/core/threads.h"  // defines: num_threads, set_num_threads

namespace {

using scalelab::DType;
using scalelab::Shape;
using scalelab::Tensor;
using scalelab::test::bit_identical;
using Vec = std::vector<double>;  // reference values and finite differences are computed in double

// ---------------------------------------------------------------------------------------------
// Tolerances (docs/style.md 28). An element passes when |got - want| <= atol + rtol * |want|.

// fp32 forward vs the double reference on O(1) inputs: each output is a sum of at most ~40 fp32
// products/exps, so the error is a few fp32 ulps (6e-8 relative each) times that length. Measured:
// at most 4e-7 (matmul); the bound leaves 10x for other BLAS kernels and compilers.
constexpr double kFwdAtol = 5e-6;
constexpr double kFwdRtol = 1e-5;
// fp32 backward vs central differences of the double forward. The differences themselves are
// accurate to ~1e-9 (truncation O(h^2) with h = kFdStep, rounding O(1e-16 / h)), so what we see is
// the fp32 rounding of the backward, plus fp32-saved intermediates (mean, rstd, att, probs).
// Measured: at most 7e-7 absolute (the low-variance LayerNorm row aside, which rtol covers).
constexpr double kGradAtol = 1e-5;
constexpr double kGradRtol = 1e-4;
constexpr double kFdStep = 1e-4;  // h of the central difference (f(x+h) - f(x-h)) / 2h
// A backward called twice adds the same values twice, so the result is 2x the first call, up to
// rounding where a sum over rows accumulates directly into the gradient (dwte, dwpe, dweight, dbias,
// attention's dk and dv over row blocks): starting from g instead of 0 rounds each of the ~10 adds
// differently, one fp32 ulp (6e-8) of O(1) terms each. Measured: at most 5e-7 absolute.
constexpr double kAccumAtol = 2e-6;
constexpr double kAccumRtol = 1e-6;
// Optimizer steps: a handful of fp32 operations on O(1) values.
constexpr double kOptimRtol = 1e-6;

// ---------------------------------------------------------------------------------------------
// Helpers: inputs, comparison with a useful failure report, finite differences.

// n values uniform in [lo, hi), from a fixed seed. mt19937's output sequence is fixed by the C++
// standard (unlike std::uniform_real_distribution's), so the inputs are the same on every platform.
std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = lo + (hi - lo) * static_cast<float>(gen() / 4294967296.0);
  return x;
}

Vec to_double(const std::vector<float>& x) { return Vec(x.begin(), x.end()); }

// Compares got (n fp32 values from the op) with want (n double reference values).
// On failure: the first 5 differing indices with both values, then the max abs and rel error (docs/style.md 29).
::testing::AssertionResult all_close(const char* what, const float* got, const double* want, size_t n, double atol,
                                     double rtol) {
  size_t num_bad = 0;
  double max_abs = 0.0, max_rel = 0.0;
  std::string first_bad;
  for (size_t i = 0; i < n; i++) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double rel = err / std::max(std::fabs(want[i]), 1e-30);
    max_abs = std::max(max_abs, err);
    if (std::fabs(want[i]) > atol) max_rel = std::max(max_rel, rel);  // rel error of tiny values means little
    if (!(err <= atol + rtol * std::fabs(want[i]))) {                 // written so that NaN fails
      if (num_bad < 5)
        first_bad += "\n    [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                     std::to_string(want[i]) + " (abs err " + std::to_string(err) + ")";
      num_bad++;
    }
  }
  if (num_bad == 0) return ::testing::AssertionSuccess();
  char summary[256];
  std::snprintf(summary, sizeof summary,
                "%s: %zu of %zu elements differ (atol %.1e, rtol %.1e); max abs err %.3e, "
                "max rel err %.3e; first ones:",
                what, num_bad, n, atol, rtol, max_abs, max_rel);
  return ::testing::AssertionFailure() << summary << first_bad;
}
::testing::AssertionResult all_close(const char* what, const std::vector<float>& got, const Vec& want, double atol,
                                     double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  return all_close(what, got.data(), want.data(), got.size(), atol, rtol);
}

// Central differences of f at x along each coordinate: g[i] = (f(x + h e_i) - f(x - h e_i)) / 2h.
// coords: the coordinates to differentiate (empty: all of them).
Vec numerical_grad(const std::function<double(const Vec&)>& f, Vec x, std::vector<size_t> coords = {}) {
  if (coords.empty())
    for (size_t i = 0; i < x.size(); i++) coords.push_back(i);
  Vec g(coords.size());
  for (size_t j = 0; j < coords.size(); j++) {
    const size_t i = coords[j];
    const double x0 = x[i];
    x[i] = x0 + kFdStep;
    const double f_plus = f(x);
    x[i] = x0 - kFdStep;
    const double f_minus = f(x);
    x[i] = x0;
    g[j] = (f_plus - f_minus) / (2 * kFdStep);
  }
  return g;
}

// The scalar every backward test differentiates: L = sum_i out[i] * w[i], so dL/dout = w (the "dout").
double dot(const Vec& out, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); i++) s += out[i] * w[i];
  return s;
}

std::vector<float> gather(const std::vector<float>& x, const std::vector<size_t>& idx) {
  std::vector<float> r;
  for (size_t i : idx) r.push_back(x[i]);
  return r;
}

std::vector<float> twice(const std::vector<float>& x) {
  std::vector<float> r(x);
  for (auto& v : r) v *= 2.0f;
  return r;
}

// A Tensor holding a copy of values (f32, CPU).
Tensor tensor_of(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::memcpy(t.data<float>(), values.data(), values.size() * sizeof(float));
  return t;
}
std::vector<float> values_of(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

// ---------------------------------------------------------------------------------------------
// Double-precision references: the textbook formulas as plain loops, nothing shared with the ops.

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]
Vec ref_encoder(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int B, int T, int C) {
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

// LayerNorm rows of inp (N,C): (x - mean) / sqrt(var + 1e-5) * w + b; mean, rstd (N) returned if asked.
Vec ref_layernorm(const Vec& inp, const Vec& w, const Vec& b, int N, int C, Vec* mean = nullptr, Vec* rstd = nullptr) {
  Vec out(inp.size());
  for (int i = 0; i < N; i++) {
    double m = 0.0, var = 0.0;
    for (int c = 0; c < C; c++) m += inp[i * C + c];
    m /= C;
    for (int c = 0; c < C; c++) var += (inp[i * C + c] - m) * (inp[i * C + c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; c++) out[i * C + c] = (inp[i * C + c] - m) * s * w[c] + b[c];
    if (mean) (*mean)[i] = m;
    if (rstd) (*rstd)[i] = s;
  }
  return out;
}

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC, or empty for none)
Vec ref_matmul(const Vec& inp, const Vec& weight, const Vec& bias, int N, int C, int OC) {
  Vec out(static_cast<size_t>(N) * OC);
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int c = 0; c < C; c++) s += inp[i * C + c] * weight[o * C + c];
      out[i * OC + o] = s;
    }
  return out;
}

// Causal attention: qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) returned if asked.
Vec ref_attention(const Vec& qkv, int B, int T, int C, int NH, Vec* att_out = nullptr) {
  const int HS = C / NH;
  Vec out(static_cast<size_t>(B) * T * C, 0.0);
  if (att_out) att_out->assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  Vec att(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * HS];
        double maxval = -1e300;
        for (int s = 0; s <= t; s++) {
          const double* k = &qkv[(b * T + s) * 3 * C + C + h * HS];
          double dot_qk = 0.0;
          for (int i = 0; i < HS; i++) dot_qk += q[i] * k[i];
          att[s] = dot_qk / std::sqrt(static_cast<double>(HS));
          maxval = std::max(maxval, att[s]);
        }
        double sum = 0.0;
        for (int s = 0; s <= t; s++) sum += (att[s] = std::exp(att[s] - maxval));
        for (int s = 0; s <= t; s++) {
          att[s] /= sum;
          const double* v = &qkv[(b * T + s) * 3 * C + 2 * C + h * HS];
          for (int i = 0; i < HS; i++) out[(b * T + t) * C + h * HS + i] += att[s] * v[i];
          if (att_out) (*att_out)[((static_cast<size_t>(b) * NH + h) * T + t) * T + s] = att[s];
        }
      }
  return out;
}

double ref_gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// Cross-entropy rows of logits (N,V): losses (N) = -log softmax(logits)[target]; probs (N,V) if asked.
Vec ref_crossentropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V, Vec* probs = nullptr) {
  Vec losses(N);
  for (int i = 0; i < N; i++) {
    double maxval = -1e300, sum = 0.0;
    for (int v = 0; v < V; v++) maxval = std::max(maxval, logits[i * V + v]);
    for (int v = 0; v < V; v++) sum += std::exp(logits[i * V + v] - maxval);
    losses[i] = -(logits[i * V + targets[i]] - maxval - std::log(sum));
    if (probs)
      for (int v = 0; v < V; v++) (*probs)[i * V + v] = std::exp(logits[i * V + v] - maxval) / sum;
  }
  return losses;
}

// LayerNorm input (N,C): O(1) rows, except row 0 whose variance (~3e-6) is below eps = 1e-5, so
// there the result depends visibly on eps: an op with another eps fails the forward test.
std::vector<float> layernorm_input(int n_rows, int n_cols) {
  auto x = uniform(static_cast<size_t>(n_rows) * n_cols, 4, -2.0f, 3.0f);
  auto small = uniform(n_cols, 44, -0.003f, 0.003f);
  for (int c = 0; c < n_cols; c++) x[c] = 0.5f + small[c];
  return x;
}

// The shapes used throughout: odd, small, and with C/NH = HS = 4.
constexpr int B = 2, T = 5, C = 12, NH = 3, V = 13, OC = 7, maxT = 6;
constexpr int N = B * T;
// Tokens with repeats (token 3 appears three times), so the encoder's scatter-add is exercised.
const std::vector<int32_t> kTokens = {3, 0, 12, 3, 7, 1, 3, 5, 0, 11};  // (B,T), values < V

}  // namespace

// =============================================================================================
// Encoder

TEST(OpsCpu, EncoderForwardMatchesReference) {
  auto wte = uniform(V * C, 1), wpe = uniform(maxT * C, 2);
  std::vector<float> out(N * C);
  scalelab::cpu::encoder_forward(out.data(), kTokens.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(all_close("out", out, ref_encoder(kTokens, to_double(wte), to_double(wpe), B, T, C), kFwdAtol, kFwdRtol));
}

TEST(OpsCpu, EncoderBackwardMatchesFiniteDifferences) {
  auto wte = uniform(V * C, 1), wpe = uniform(maxT * C, 2), dout = uniform(N * C, 3);
  std::vector<float> dwte(V * C, 0.0f), dwpe(maxT * C, 0.0f);
  scalelab::cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), kTokens.data(), B, T, C);
  auto loss_of_wte = [&](const Vec& x) { return dot(ref_encoder(kTokens, x, to_double(wpe), B, T, C), dout); };
  auto loss_of_wpe = [&](const Vec& x) { return dot(ref_encoder(kTokens, to_double(wte), x, B, T, C), dout); };
  EXPECT_TRUE(all_close("dwte", dwte, numerical_grad(loss_of_wte, to_double(wte)), kGradAtol, kGradRtol));
  EXPECT_TRUE(all_close("dwpe", dwpe, numerical_grad(loss_of_wpe, to_double(wpe)), kGradAtol, kGradRtol));
  // Rows [T, maxT) of dwpe belong to positions this batch never used: untouched, exactly 0.
  for (int c = 0; c < C; c++) EXPECT_EQ(dwpe[T * C + c], 0.0f) << "dwpe[t=" << T << ", c=" << c << "]";
}

// =============================================================================================
// LayerNorm

TEST(OpsCpu, LayerNormForwardMatchesReference) {
  auto inp = layernorm_input(N, C), w = uniform(C, 5), b = uniform(C, 6);
  std::vector<float> out(N * C), mean(N), rstd(N);
  scalelab::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  Vec ref_mean(N), ref_rstd(N);
  Vec ref_out = ref_layernorm(to_double(inp), to_double(w), to_double(b), N, C, &ref_mean, &ref_rstd);
  EXPECT_TRUE(all_close("out", out, ref_out, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(all_close("mean", mean, ref_mean, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(all_close("rstd", rstd, ref_rstd, kFwdAtol, kFwdRtol));
}

TEST(OpsCpu, LayerNormBackwardMatchesFiniteDifferences) {
  auto inp = layernorm_input(N, C), w = uniform(C, 5), b = uniform(C, 6), dout = uniform(N * C, 7);
  std::vector<float> out(N * C), mean(N), rstd(N);
  scalelab::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  std::vector<float> dinp(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  scalelab::cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                    rstd.data(), N, C);
  const Vec x = to_double(inp), wd = to_double(w), bd = to_double(b);
  auto loss_of_inp = [&](const Vec& v) { return dot(ref_layernorm(v, wd, bd, N, C), dout); };
  auto loss_of_w = [&](const Vec& v) { return dot(ref_layernorm(x, v, bd, N, C), dout); };
  auto loss_of_b = [&](const Vec& v) { return dot(ref_layernorm(x, wd, v, N, C), dout); };
  EXPECT_TRUE(all_close("dinp", dinp, numerical_grad(loss_of_inp, x), kGradAtol, kGradRtol));
  EXPECT_TRUE(all_close("dweight", dw, numerical_grad(loss_of_w, wd), kGradAtol, kGradRtol));
  EXPECT_TRUE(all_close("dbias", db, numerical_grad(loss_of_b, bd), kGradAtol, kGradRtol));
}

// The backward's dweight and dbias are sums over rows, taken in fixed row chunks (layernorm.cpp): with many
// rows (62 chunks, the last one short), they must equal the formula's sums in double, be ADDED to what the
// outputs held, and come out bit for bit the same on 1 and 2 threads.
TEST(OpsCpu, LayerNormBackwardOverManyRowsAddsTheFormulasSumsOnAnyThreadCount) {
  constexpr int kN = 1041, kC = 24;  // 1041 rows: chunks of 17 rows, the 62nd one of 4
  auto inp = uniform(kN * kC, 70, -2.0f, 3.0f), w = uniform(kC, 71), b = uniform(kC, 72), dout = uniform(kN * kC, 73);
  std::vector<float> out(kN * kC), mean(kN), rstd(kN);
  scalelab::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), kN, kC);
  // The reference: dinp from the formula, dweight = sum_rows dout * xhat, dbias = sum_rows dout, in double,
  // from the op's own mean and rstd (those are checked by the forward's test).
  Vec ref_dinp(kN * kC), ref_dw(kC, 0.0), ref_db(kC, 0.0);
  for (int i = 0; i < kN; i++) {
    double g_mean = 0.0, g_xhat_mean = 0.0;
    for (int c = 0; c < kC; c++) {
      const double xhat = (inp[i * kC + c] - static_cast<double>(mean[i])) * rstd[i];
      g_mean += static_cast<double>(w[c]) * dout[i * kC + c] / kC;
      g_xhat_mean += static_cast<double>(w[c]) * dout[i * kC + c] * xhat / kC;
    }
    for (int c = 0; c < kC; c++) {
      const double xhat = (inp[i * kC + c] - static_cast<double>(mean[i])) * rstd[i];
      ref_dinp[i * kC + c] = rstd[i] * (static_cast<double>(w[c]) * dout[i * kC + c] - g_mean - xhat * g_xhat_mean);
      ref_dw[c] += dout[i * kC + c] * xhat;
      ref_db[c] += dout[i * kC + c];
    }
  }
  auto run = [&](int threads, std::vector<float>& dinp, std::vector<float>& dw, std::vector<float>& db) {
    const int before = scalelab::num_threads();
    scalelab::set_num_threads(threads);
    dinp.assign(kN * kC, 0.0f);
    dw.assign(kC, 0.5f);  // the op adds to what is there
    db.assign(kC, -0.25f);
    scalelab::cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                      rstd.data(), kN, kC);
    scalelab::set_num_threads(before);
  };
  std::vector<float> dinp1, dw1, db1, dinp2, dw2, db2;
  run(1, dinp1, dw1, db1);
  run(2, dinp2, dw2, db2);
  for (int c = 0; c < kC; c++) {
    ref_dw[c] += 0.5;
    ref_db[c] += -0.25;
  }
  // sums of ~1000 O(1) fp32 terms: a few 1e-5 of rounding at most
  EXPECT_TRUE(all_close("dinp", dinp1, ref_dinp, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(all_close("dweight", dw1, ref_dw, 1e-4, 1e-5));
  EXPECT_TRUE(all_close("dbias", db1, ref_db, 1e-4, 1e-5));
  EXPECT_EQ(std::memcmp(dw1.data(), dw2.data(), kC * sizeof(float)), 0) << "dweight differs between 1 and 2 threads";
  EXPECT_EQ(std::memcmp(db1.data(), db2.data(), kC * sizeof(float)), 0) << "dbias differs between 1 and 2 threads";
  EXPECT_EQ(std::memcmp(dinp1.data(), dinp2.data(), dinp1.size() * sizeof(float)), 0) << "dinp differs";
}

// =============================================================================================
// Matmul

TEST(OpsCpu, MatmulForwardMatchesReferenceWithAndWithoutBias) {
  auto inp = uniform(N * C, 8), w = uniform(OC * C, 9), bias = uniform(OC, 10);
  std::vector<float> out(N * OC, -99.0f);  // garbage: the forward must overwrite, not add
  scalelab::cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  EXPECT_TRUE(all_close("out (bias)", out, ref_matmul(to_double(inp), to_double(w), to_double(bias), N, C, OC),
                        kFwdAtol, kFwdRtol));
  std::fill(out.begin(), out.end(), -99.0f);
  scalelab::cpu::matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  EXPECT_TRUE(all_close("out (no bias)", out, ref_matmul(to_double(inp), to_double(w), {}, N, C, OC), kFwdAtol,
                        kFwdRtol));
}

TEST(OpsCpu, MatmulForwardMatchesReferenceAtLargerOddShape) {
  // Large enough for OpenBLAS's blocked kernels and edge handling (no dimension a multiple of 4 or 8).
  constexpr int kN = 67, kC = 97, kOC = 131;
  auto inp = uniform(kN * kC, 11), w = uniform(kOC * kC, 12), bias = uniform(kOC, 13);
  std::vector<float> out(kN * kOC);
  scalelab::cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), kN, kC, kOC);
  // kC = 97 terms per output: the fp32 error grows to ~1e-5 of values of size ~5.
  constexpr double kLongSumAtol = 1e-4;
  EXPECT_TRUE(all_close("out", out, ref_matmul(to_double(inp), to_double(w), to_double(bias), kN, kC, kOC),
                        kLongSumAtol, kFwdRtol));
}

TEST(OpsCpu, MatmulBackwardMatchesFiniteDifferences) {
  auto inp = uniform(N * C, 8), w = uniform(OC * C, 9), bias = uniform(OC, 10), dout = uniform(N * OC, 14);
  std::vector<float> dinp(N * C, 0.0f), dw(OC * C, 0.0f), db(OC, 0.0f);
  scalelab::cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  const Vec x = to_double(inp), wd = to_double(w), bd = to_double(bias);
  auto loss_of_inp = [&](const Vec& v) { return dot(ref_matmul(v, wd, bd, N, C, OC), dout); };
  auto loss_of_w = [&](const Vec& v) { return dot(ref_matmul(x, v, bd, N, C, OC), dout); };
  auto loss_of_b = [&](const Vec& v) { return dot(ref_matmul(x, wd, v, N, C, OC), dout); };
  EXPECT_TRUE(all_close("dinp", dinp, numerical_grad(loss_of_inp, x), kGradAtol, kGradRtol));
  EXPECT_TRUE(all_close("dweight", dw, numerical_grad(loss_of_w, wd), kGradAtol, kGradRtol));
  EXPECT_TRUE(all_close("dbias", db, numerical_grad(loss_of_b, bd), kGradAtol, kGradRtol));

  // dinp and dbias are optional (nullptr): dweight must come out the same without them.
  std::vector<float> dw_only(OC * C, 0.0f);
  scalelab::cpu::matmul_backward(nullptr, dw_only.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_TRUE(all_close("dweight (no dinp, no dbias)", dw_only, to_double(dw), 0.0, 0.0));
}

// =============================================================================================
// Attention

TEST(OpsCpu, AttentionForwardMatchesReference) {
  auto qkv = uniform(N * 3 * C, 15, -2.0f, 2.0f);
  std::vector<float> out(N * C), att(B * NH * T * T, -99.0f);
  scalelab::cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vec ref_att;
  Vec ref_out = ref_attention(to_double(qkv), B, T, C, NH, &ref_att);
  EXPECT_TRUE(all_close("out", out, ref_out, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(all_close("att", att, ref_att, kFwdAtol, kFwdRtol));
}

TEST(OpsCpu, AttentionIsCausalAndRowsSumToOne) {
  auto qkv = uniform(N * 3 * C, 16, -3.0f, 3.0f);
  std::vector<float> out(N * C), att(B * NH * T * T, -99.0f);  // garbage: masked entries must be written
  scalelab::cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  constexpr double kRowSumAtol = 1e-6;  // T=5 fp32 probabilities summed: a few ulps of 1
  for (int bh = 0; bh < B * NH; bh++)
    for (int t = 0; t < T; t++) {
      double row_sum = 0.0;
      for (int s = 0; s < T; s++) {
        const float a = att[(bh * T + t) * T + s];
        if (s > t) {
          EXPECT_EQ(a, 0.0f) << "att[bh=" << bh << ", t=" << t << ", s=" << s << "]: a future position has weight";
        } else {
          EXPECT_GT(a, 0.0f) << "att[bh=" << bh << ", t=" << t << ", s=" << s << "]";
        }
        row_sum += a;
      }
      EXPECT_NEAR(row_sum, 1.0, kRowSumAtol) << "row bh=" << bh << ", t=" << t;
    }
  // Position 0 sees only itself, so out[b, 0] is exactly v[b, 0] (att = 1).
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      EXPECT_NEAR(out[b * T * C + c], qkv[b * T * 3 * C + 2 * C + c], kFwdAtol) << "b=" << b << " c=" << c;
}

TEST(OpsCpu, AttentionBackwardMatchesFiniteDifferences) {
  auto qkv = uniform(N * 3 * C, 15, -2.0f, 2.0f), dout = uniform(N * C, 17);
  std::vector<float> out(N * C), att(B * NH * T * T), datt(B * NH * T * T), dqkv(N * 3 * C, 0.0f);
  scalelab::cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  scalelab::cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  auto loss = [&](const Vec& x) { return dot(ref_attention(x, B, T, C, NH), dout); };
  EXPECT_TRUE(all_close("dqkv", dqkv, numerical_grad(loss, to_double(qkv)), kGradAtol, kGradRtol));
}

TEST(OpsCpu, AttentionMatchesReferenceWhenTSpansSeveralRowBlocks) {
  // T = 133 > the CPU twin's row block (128): the blocked causal GEMMs must join up at the block edge.
  constexpr int kB = 1, kT = 133, kC = 8, kNH = 2;
  auto qkv = uniform(kT * 3 * kC, 18, -2.0f, 2.0f), dout = uniform(kT * kC, 19);
  std::vector<float> out(kT * kC), att(kNH * kT * kT), datt(kNH * kT * kT), dqkv(kT * 3 * kC, 0.0f);
  scalelab::cpu::attention_forward(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  Vec ref_att;
  Vec ref_out = ref_attention(to_double(qkv), kB, kT, kC, kNH, &ref_att);
  EXPECT_TRUE(all_close("out", out, ref_out, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(all_close("att", att, ref_att, kFwdAtol, kFwdRtol));
  scalelab::cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), kB, kT, kC, kNH);
  // Finite differences on a sample of coordinates (all of them would take ~1e10 flops): q, k and v of the
  // first, last and block-edge positions, plus a stride through the rest.
  std::vector<size_t> coords;
  for (int t : {0, 1, 127, 128, 129, 132})
    for (int c = 0; c < 3 * kC; c += 5) coords.push_back(static_cast<size_t>(t) * 3 * kC + c);
  for (size_t i = 7; i < qkv.size(); i += 97) coords.push_back(i);
  auto loss = [&](const Vec& x) { return dot(ref_attention(x, kB, kT, kC, kNH), dout); };
  EXPECT_TRUE(all_close("dqkv (sampled)", gather(dqkv, coords), numerical_grad(loss, to_double(qkv), coords), kGradAtol,
                        kGradRtol));
}

// =============================================================================================
// GELU and residual

TEST(OpsCpu, GeluForwardMatchesReference) {
  auto x = uniform(N * C, 20, -4.0f, 4.0f);
  x.push_back(-30.0f);  // tanh saturates: gelu -> 0
  x.push_back(30.0f);   // gelu -> x
  std::vector<float> y(x.size());
  scalelab::cpu::gelu_forward(y.data(), x.data(), static_cast<int64_t>(x.size()));
  Vec ref(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = ref_gelu(x[i]);
  EXPECT_TRUE(all_close("out", y, ref, kFwdAtol, kFwdRtol));
}

TEST(OpsCpu, GeluBackwardMatchesFiniteDifferences) {
  auto x = uniform(N * C, 20, -4.0f, 4.0f), dout = uniform(N * C + 2, 21);
  x.push_back(-30.0f);  // saturated: gelu' = 0, and no inf/NaN from the exp inside
  x.push_back(30.0f);   // gelu' = 1
  std::vector<float> dx(x.size(), 0.0f);
  scalelab::cpu::gelu_backward(dx.data(), x.data(), dout.data(), static_cast<int64_t>(x.size()));
  auto loss = [&](const Vec& v) {
    Vec y(v.size());
    for (size_t i = 0; i < v.size(); i++) y[i] = ref_gelu(v[i]);
    return dot(y, dout);
  };
  EXPECT_TRUE(all_close("dinp", dx, numerical_grad(loss, to_double(x)), kGradAtol, kGradRtol));
}

TEST(OpsCpu, ResidualForwardAddsAndBackwardPassesGradientToBoth) {
  constexpr int kN = 37;
  auto a = uniform(kN, 22), b = uniform(kN, 23), dout = uniform(kN, 24);
  std::vector<float> out(kN), da(kN, 0.5f), db(kN, -0.25f);  // non-zero start: backward must add
  scalelab::cpu::residual_forward(out.data(), a.data(), b.data(), kN);
  scalelab::cpu::residual_backward(da.data(), db.data(), dout.data(), kN);
  for (int i = 0; i < kN; i++) {
    EXPECT_EQ(out[i], a[i] + b[i]) << "i=" << i;
    EXPECT_EQ(da[i], 0.5f + dout[i]) << "i=" << i;
    EXPECT_EQ(db[i], -0.25f + dout[i]) << "i=" << i;
  }
}

// =============================================================================================
// Softmax + cross-entropy

TEST(OpsCpu, CrossEntropyForwardMatchesReference) {
  auto logits = uniform(N * V, 25, -5.0f, 5.0f);
  logits[V + 2] = 80.0f;  // a dominant logit: without max subtraction exp(80) would still fit, exp(100) not
  logits[V + 3] = 100.0f;
  const std::vector<int32_t> targets = {0, 2, 12, 5, 5, 1, 7, 11, 3, 9};  // row 1's target has prob ~e^-20
  std::vector<float> losses(N), probs(N * V);
  scalelab::cpu::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  Vec ref_probs(N * V);
  Vec ref_losses = ref_crossentropy(to_double(logits), targets, N, V, &ref_probs);
  EXPECT_TRUE(all_close("losses", losses, ref_losses, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(all_close("probs", probs, ref_probs, kFwdAtol, kFwdRtol));
}

TEST(OpsCpu, CrossEntropyBackwardMatchesFiniteDifferencesAndOverwrites) {
  auto logits = uniform(N * V, 26, -3.0f, 3.0f);
  const std::vector<int32_t> targets = {0, 2, 12, 5, 5, 1, 7, 11, 3, 9};
  const float dloss = 1.0f / N;                                        // mean loss
  std::vector<float> losses(N), probs(N * V), dlogits(N * V, 123.0f);  // garbage: must be overwritten
  scalelab::cpu::softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  scalelab::cpu::softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  auto mean_loss = [&](const Vec& x) {
    Vec l = ref_crossentropy(x, targets, N, V);
    double s = 0.0;
    for (double v : l) s += v;
    return s * dloss;
  };
  EXPECT_TRUE(all_close("dlogits", dlogits, numerical_grad(mean_loss, to_double(logits)), kGradAtol, kGradRtol));

  // ops.h allows dlogits to alias probs (in place): same bits as the separate buffer.
  scalelab::cpu::softmax_crossentropy_backward(probs.data(), probs.data(), targets.data(), dloss, N, V);
  EXPECT_TRUE(all_close("dlogits (in place over probs)", probs, to_double(dlogits), 0.0, 0.0));
}

// =============================================================================================
// The accumulation rule: every backward ADDS into its gradients (ops.h), so two calls give 2x one call.

TEST(OpsCpu, BackwardOpsAccumulateSoTwoCallsDoubleTheGradients) {
  using namespace scalelab;
  auto dout_c = uniform(N * C, 30);
  {  // encoder
    std::vector<float> dwte1(V * C, 0.0f), dwpe1(maxT * C, 0.0f), dwte2(V * C, 0.0f), dwpe2(maxT * C, 0.0f);
    cpu::encoder_backward(dwte1.data(), dwpe1.data(), dout_c.data(), kTokens.data(), B, T, C);
    for (int rep = 0; rep < 2; rep++)
      cpu::encoder_backward(dwte2.data(), dwpe2.data(), dout_c.data(), kTokens.data(), B, T, C);
    EXPECT_TRUE(all_close("encoder dwte", dwte2, to_double(twice(dwte1)), kAccumAtol, kAccumRtol));
    EXPECT_TRUE(all_close("encoder dwpe", dwpe2, to_double(twice(dwpe1)), kAccumAtol, kAccumRtol));
  }
  {  // layernorm
    auto inp = layernorm_input(N, C), w = uniform(C, 5), b = uniform(C, 6);
    std::vector<float> out(N * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    std::vector<float> g1[3] = {std::vector<float>(N * C), std::vector<float>(C), std::vector<float>(C)};
    std::vector<float> g2[3] = {g1[0], g1[1], g1[2]};
    cpu::layernorm_backward(g1[0].data(), g1[1].data(), g1[2].data(), dout_c.data(), inp.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    for (int rep = 0; rep < 2; rep++)
      cpu::layernorm_backward(g2[0].data(), g2[1].data(), g2[2].data(), dout_c.data(), inp.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
    const char* names[3] = {"layernorm dinp", "layernorm dweight", "layernorm dbias"};
    for (int k = 0; k < 3; k++)
      EXPECT_TRUE(all_close(names[k], g2[k], to_double(twice(g1[k])), kAccumAtol, kAccumRtol));
  }
  {  // matmul
    auto inp = uniform(N * C, 8), w = uniform(OC * C, 9), dout = uniform(N * OC, 14);
    std::vector<float> g1[3] = {std::vector<float>(N * C), std::vector<float>(OC * C), std::vector<float>(OC)};
    std::vector<float> g2[3] = {g1[0], g1[1], g1[2]};
    cpu::matmul_backward(g1[0].data(), g1[1].data(), g1[2].data(), dout.data(), inp.data(), w.data(), N, C, OC);
    for (int rep = 0; rep < 2; rep++)
      cpu::matmul_backward(g2[0].data(), g2[1].data(), g2[2].data(), dout.data(), inp.data(), w.data(), N, C, OC);
    const char* names[3] = {"matmul dinp", "matmul dweight", "matmul dbias"};
    for (int k = 0; k < 3; k++)
      EXPECT_TRUE(all_close(names[k], g2[k], to_double(twice(g1[k])), kAccumAtol, kAccumRtol));
  }
  {  // attention
    auto qkv = uniform(N * 3 * C, 15);
    std::vector<float> out(N * C), att(B * NH * T * T), datt(B * NH * T * T);
    std::vector<float> dqkv1(N * 3 * C, 0.0f), dqkv2(N * 3 * C, 0.0f);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv1.data(), datt.data(), dout_c.data(), qkv.data(), att.data(), B, T, C, NH);
    for (int rep = 0; rep < 2; rep++)
      cpu::attention_backward(dqkv2.data(), datt.data(), dout_c.data(), qkv.data(), att.data(), B, T, C, NH);
    EXPECT_TRUE(all_close("attention dqkv", dqkv2, to_double(twice(dqkv1)), kAccumAtol, kAccumRtol));
  }
  {  // gelu
    auto x = uniform(N * C, 20);
    std::vector<float> dx1(N * C, 0.0f), dx2(N * C, 0.0f);
    cpu::gelu_backward(dx1.data(), x.data(), dout_c.data(), N * C);
    for (int rep = 0; rep < 2; rep++) cpu::gelu_backward(dx2.data(), x.data(), dout_c.data(), N * C);
    EXPECT_TRUE(all_close("gelu dinp", dx2, to_double(twice(dx1)), kAccumAtol, kAccumRtol));
  }
}

// =============================================================================================
// Optimizer updates

TEST(OpsCpu, AdamWFirstStepMatchesHandComputedValues) {
  // Step t=1 from m = v = 0 with p = 1, g = 0.5, lr = 0.1, wd = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8:
  //   m = 0.1 * 0.5 = 0.05;  v = 0.001 * 0.25 = 2.5e-4;  mhat = 0.05 / 0.1 = 0.5;  vhat = 2.5e-4 / 0.001 = 0.25
  //   p = 1 - 0.1 * (0.5 / (sqrt(0.25) + 1e-8) + 0.01 * 1) = 1 - 0.1 * (0.99999998 + 0.01) = 0.899000002
  // The second element has g = -2 and p = -3: mhat/sqrt(vhat) = -1 again (Adam's first step is +-lr),
  //   p = -3 - 0.1 * (-0.999999995 + 0.01 * -3) = -2.897.
  std::vector<float> p = {1.0f, -3.0f}, g = {0.5f, -2.0f}, m = {0.0f, 0.0f}, v = {0.0f, 0.0f};
  scalelab::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), 2, /*lr=*/0.1f, /*beta1=*/0.9f,
                              /*beta2=*/0.999f, /*eps=*/1e-8f, /*weight_decay=*/0.01f, /*t=*/1);
  EXPECT_TRUE(all_close("param", p, Vec{0.899000002, -2.8970000005}, 0.0, kOptimRtol));
  EXPECT_TRUE(all_close("m", m, Vec{0.05, -0.2}, 0.0, kOptimRtol));
  // beta2 arrives as the fp32 0.999f = 0.99900001287, so 1 - beta2 = 0.00099998713 is 1.3e-5 (relative)
  // below the decimal 0.001 of the hand computation. (p is unaffected: at t=1 the bias correction
  // 1 - beta2^1 divides the same factor out again.)
  constexpr double kFp32BetaRtol = 2e-5;
  EXPECT_TRUE(all_close("v", v, Vec{2.5e-4, 4e-3}, 0.0, kFp32BetaRtol));
}

TEST(OpsCpu, AdamWLaterStepMatchesTheFormulaInOpsH) {
  // Step t=3 from non-zero state; expected values from the ops.h formula evaluated in double.
  constexpr int kN = 9;
  constexpr float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  constexpr int64_t t = 3;
  auto p = uniform(kN, 40), g = uniform(kN, 41), m = uniform(kN, 42, -0.1f, 0.1f), v = uniform(kN, 43, 0.0f, 0.01f);
  Vec want_p(kN), want_m(kN), want_v(kN);
  for (int i = 0; i < kN; i++) {
    want_m[i] = static_cast<double>(beta1) * m[i] + (1.0 - beta1) * g[i];
    want_v[i] = static_cast<double>(beta2) * v[i] + (1.0 - beta2) * static_cast<double>(g[i]) * g[i];
    const double mhat = want_m[i] / (1.0 - std::pow(static_cast<double>(beta1), t));
    const double vhat = want_v[i] / (1.0 - std::pow(static_cast<double>(beta2), t));
    want_p[i] = p[i] - static_cast<double>(lr) * (mhat / (std::sqrt(vhat) + eps) + static_cast<double>(wd) * p[i]);
  }
  scalelab::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), kN, lr, beta1, beta2, eps, wd, t);
  EXPECT_TRUE(all_close("param", p, want_p, 0.0, kOptimRtol));
  EXPECT_TRUE(all_close("m", m, want_m, 0.0, kOptimRtol));
  EXPECT_TRUE(all_close("v", v, want_v, 0.0, kOptimRtol));
}

TEST(OpsCpu, SgdStepMatchesHandComputedValues) {
  // p -= lr * (g + wd * p):  1 - 0.1 * (0.5 + 0.01 * 1) = 0.949;  -3 - 0.1 * (-2 + 0.01 * -3) = -2.797
  std::vector<float> p = {1.0f, -3.0f}, g = {0.5f, -2.0f};
  scalelab::cpu::sgd_update(p.data(), g.data(), 2, /*lr=*/0.1f, /*weight_decay=*/0.01f);
  EXPECT_TRUE(all_close("param", p, Vec{0.949, -2.797}, 0.0, kOptimRtol));
}

// =============================================================================================
// Reductions and casts

TEST(OpsCpu, SumSquaresAndScaleMatchReference) {
  constexpr int kN = 10007;  // prime: not a multiple of the chunk size or a vector width
  auto x = uniform(kN, 50);
  double want = 0.0;
  for (float v : x) want += static_cast<double>(v) * v;
  constexpr double kSumRtol = 1e-12;  // both sum fp32 squares (exact in double) in double, in different orders
  EXPECT_NEAR(scalelab::cpu::sum_squares(x.data(), kN), want, kSumRtol * want);
  auto y = x;
  scalelab::cpu::scale(y.data(), kN, 0.25f);
  for (int i = 0; i < kN; i++) ASSERT_EQ(y[i], x[i] * 0.25f) << "i=" << i;
}

// add_ (t += x) is what lab 04 accumulates gradient shards with; a view added in place must leave
// the rest of its parent alone.
TEST(OpsCpu, AddInPlaceAddsElementwiseAndOnlyInsideTheView) {
  constexpr int kN = 1001;
  Tensor parent = Tensor::zeros({kN + 2});
  Tensor t = parent.view(1, {kN}), x = Tensor::empty({kN});
  for (int i = 0; i < kN; i++) {
    t.data<float>()[i] = 0.5f * i;
    x.data<float>()[i] = 1.0f - i;
  }
  scalelab::add_(t, x);
  for (int i = 0; i < kN; i++) ASSERT_EQ(t.data<float>()[i], 0.5f * i + (1.0f - i)) << "i=" << i;
  EXPECT_EQ(parent.data<float>()[0], 0.0f);
  EXPECT_EQ(parent.data<float>()[kN + 1], 0.0f);
}

TEST(OpsCpu, Bf16CastRoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: between 1 and 2 its spacing is 2^-7. Cases and their bf16 results:
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // ulp: bf16 spacing in [1, 2)
  const std::vector<float> src = {
      one + ulp / 2,                          // exact tie, 1.0 has an even mantissa: down to 1
      one + 3 * ulp / 2,                      // exact tie, 1 + ulp is odd: up to 1 + 2 ulp
      one + ulp / 2 + std::ldexp(1.0f, -20),  // just above the tie: up to 1 + ulp
      one + ulp / 2 - std::ldexp(1.0f, -20),  // just below the tie: down to 1
      -(one + 3 * ulp / 2),                   // ties to even for negatives too
      std::numeric_limits<float>::max(),      // rounds up past the largest bf16: +inf
      std::numeric_limits<float>::infinity(),
      0.0f,
  };
  const std::vector<float> want = {one,
                                   one + 2 * ulp,
                                   one + ulp,
                                   one,
                                   -(one + 2 * ulp),
                                   std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::infinity(),
                                   0.0f};
  const int n = static_cast<int>(src.size());
  std::vector<scalelab::bf16> h(n);
  std::vector<float> back(n);
  scalelab::cpu::cast_f32_to_bf16(h.data(), src.data(), n);
  scalelab::cpu::cast_bf16_to_f32(back.data(), h.data(), n);
  for (int i = 0; i < n; i++) EXPECT_EQ(back[i], want[i]) << "case " << i << ": src " << src[i];

  const float nan = std::numeric_limits<float>::quiet_NaN();
  scalelab::cpu::cast_f32_to_bf16(h.data(), &nan, 1);
  scalelab::cpu::cast_bf16_to_f32(back.data(), h.data(), 1);
  EXPECT_TRUE(std::isnan(back[0])) << "NaN must stay NaN";
}

// =============================================================================================
// Tensor-level dispatch (common/src/ops/dispatch.cpp): it calls the same twins, and rejects bad arguments loudly.

TEST(OpsDispatch, TensorOpsGiveTheSameBitsAsTheCpuTwins) {
  auto inp = uniform(N * C, 8), w = uniform(OC * C, 9), bias = uniform(OC, 10);
  Tensor t_inp = tensor_of({B, T, C}, inp), t_w = tensor_of({OC, C}, w), t_bias = tensor_of({OC}, bias);
  Tensor t_out = Tensor::empty({B, T, OC});
  scalelab::matmul_forward(t_out, t_inp, t_w, &t_bias);
  std::vector<float> out(N * OC);
  scalelab::cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  EXPECT_TRUE(all_close("matmul out", values_of(t_out), to_double(out), 0.0, 0.0));

  // cast: f32 -> bf16 -> f32 equals round_to_bf16 elementwise; same dtype copies.
  Tensor t_bf = Tensor::empty({B, T, C}, DType::BF16), t_back = Tensor::empty({B, T, C});
  scalelab::cast(t_bf, t_inp);
  scalelab::cast(t_back, t_bf);
  Vec rounded(inp.size());
  for (size_t i = 0; i < inp.size(); i++) rounded[i] = scalelab::round_to_bf16(inp[i]);
  EXPECT_TRUE(all_close("cast round trip", values_of(t_back), rounded, 0.0, 0.0));
  Tensor t_copy = Tensor::empty({N, C});
  scalelab::cast(t_copy, t_inp);
  EXPECT_TRUE(all_close("same-dtype cast", values_of(t_copy), to_double(inp), 0.0, 0.0));
}

// Runs f, expects scalelab::Error, and checks the report contains each of needles.
template <typename F>
void expect_error_mentioning(F f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected scalelab::Error";
  } catch (const scalelab::Error& e) {
    const std::string what = e.what();
    for (const auto& s : needles) EXPECT_NE(what.find(s), std::string::npos) << "missing '" << s << "' in:\n" << what;
  }
}

TEST(OpsDispatch, BadShapesDtypesAndTokensThrowNamingTheTensor) {
  Tensor inp = Tensor::zeros({B, T, C}), w = Tensor::zeros({OC, C + 1}), out = Tensor::zeros({B, T, OC});
  // weight (7, 13) does not match inp's C = 12: the report names inp and prints both shapes.
  expect_error_mentioning([&] { scalelab::matmul_forward(out, inp, w, nullptr); },
                          {"matmul_forward", "inp", "(2, 5, 12)", "(7, 13)"});
  // layernorm weight of the wrong length.
  Tensor ln_out = Tensor::zeros({B, T, C}), mean = Tensor::zeros({B, T}), rstd = Tensor::zeros({B, T});
  Tensor ln_w = Tensor::zeros({C - 1}), ln_b = Tensor::zeros({C});
  expect_error_mentioning([&] { scalelab::layernorm_forward(ln_out, mean, rstd, inp, ln_w, ln_b); },
                          {"layernorm_forward", "weight", "(11,)", "(12,)"});
  // bf16 where fp32 is required.
  Tensor g_bf = Tensor::zeros({B, T, C}, DType::BF16);
  expect_error_mentioning([&] { scalelab::gelu_forward(ln_out, g_bf); }, {"gelu_forward", "inp", "bf16"});
  // NH must divide C.
  Tensor qkv = Tensor::zeros({B, T, 3 * C}), att = Tensor::zeros({B, 5, T, T});
  expect_error_mentioning([&] { scalelab::attention_forward(ln_out, att, qkv, 5); }, {"NH=5", "C=12"});
  // A target id outside the vocabulary.
  Tensor logits = Tensor::zeros({B, T, V}), probs = Tensor::zeros({B, T, V}), losses = Tensor::zeros({B, T});
  Tensor targets = Tensor::zeros({B, T}, DType::I32);
  targets.data<int32_t>()[3] = V;
  expect_error_mentioning([&] { scalelab::softmax_crossentropy_forward(losses, probs, logits, targets); },
                          {"targets[3] = 13", "[0, 13)"});
  // i32 cannot be cast to f32.
  Tensor f = Tensor::zeros({B, T});
  expect_error_mentioning([&] { scalelab::cast(f, targets); }, {"i32", "f32"});
}

// The linear layer's two gradients computed apart, as a zero-bubble pipeline schedule runs them (B: dinp now;
// W: dweight and dbias later; ops.h), give exactly the bits of one call computing all three, from nonzero
// gradients (the += rule) and in either order; a call leaves the gradients it is not asked for untouched.
// Shapes: the small odd one, and one where the dbias column sums run threaded (N*OC > 32768,
// common/src/ops/cpu/matmul.cpp) and OpenBLAS uses its blocked kernels.
TEST(OpsDispatch, MatmulBackwardApartGivesTheBitsOfOneCall) {
  struct Case {
    int N, C, OC;
  };
  for (const Case& k : {Case{N, C, OC}, Case{300, 97, 131}}) {
    SCOPED_TRACE("N=" + std::to_string(k.N) + " C=" + std::to_string(k.C) + " OC=" + std::to_string(k.OC));
    const Tensor inp = tensor_of({k.N, k.C}, uniform(size_t(k.N) * k.C, 60));
    const Tensor w = tensor_of({k.OC, k.C}, uniform(size_t(k.OC) * k.C, 61));
    const Tensor dout = tensor_of({k.N, k.OC}, uniform(size_t(k.N) * k.OC, 62));
    const auto dinp0 = uniform(size_t(k.N) * k.C, 63), dw0 = uniform(size_t(k.OC) * k.C, 64), db0 = uniform(k.OC, 65);
    Tensor dinp = tensor_of({k.N, k.C}, dinp0), dw = tensor_of({k.OC, k.C}, dw0), db = tensor_of({k.OC}, db0);
    scalelab::matmul_backward(&dinp, &dw, &db, dout, inp, w);  // one call: all three

    for (const bool b_first : {true, false}) {
      SCOPED_TRACE(b_first ? "dinp first" : "dweight, dbias first");
      Tensor dinp2 = tensor_of({k.N, k.C}, dinp0), dw2 = tensor_of({k.OC, k.C}, dw0), db2 = tensor_of({k.OC}, db0);
      auto b_pass = [&] { scalelab::matmul_backward(&dinp2, nullptr, nullptr, dout, inp, w); };
      auto w_pass = [&] { scalelab::matmul_backward(nullptr, &dw2, &db2, dout, inp, w); };
      if (b_first) {
        b_pass();
        EXPECT_TRUE(bit_identical("dweight after dinp alone (untouched)", values_of(dw2), dw0));
        EXPECT_TRUE(bit_identical("dbias after dinp alone (untouched)", values_of(db2), db0));
        w_pass();
      } else {
        w_pass();
        EXPECT_TRUE(bit_identical("dinp after dweight alone (untouched)", values_of(dinp2), dinp0));
        b_pass();
      }
      EXPECT_TRUE(bit_identical("dinp", values_of(dinp2), values_of(dinp)));
      EXPECT_TRUE(bit_identical("dweight", values_of(dw2), values_of(dw)));
      EXPECT_TRUE(bit_identical("dbias", values_of(db2), values_of(db)));
    }
  }
}

// The bias gradient belongs to the weight pass, and a backward must compute something: both refused loudly.
TEST(OpsDispatch, MatmulBackwardRefusesDbiasWithoutDweightAndNoGradientAtAll) {
  const Tensor inp = Tensor::zeros({N, C}), w = Tensor::zeros({OC, C}), dout = Tensor::zeros({N, OC});
  Tensor dinp = Tensor::zeros({N, C}), db = Tensor::zeros({OC});
  expect_error_mentioning([&] { scalelab::matmul_backward(&dinp, nullptr, &db, dout, inp, w); },
                          {"matmul_backward", "dbias without dweight", "hint:"});
  expect_error_mentioning([&] { scalelab::matmul_backward(nullptr, nullptr, nullptr, dout, inp, w); },
                          {"matmul_backward", "no gradient asked for"});
}
