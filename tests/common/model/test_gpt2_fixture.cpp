// test_gpt2_fixture.cpp — the GPT-2 CPU backend (common/src/model/gpt2.cpp, optim.cpp, cpu/*.cpp) against an
// independent PyTorch float64 implementation: logits, loss, every parameter gradient, 10 AdamW steps,
// 10 SGD steps, and the bf16-mixed forward. The reference is tests/fixtures/gpt2_tiny.json, written by
// tests/fixtures/gen_gpt2_fixture.py (PyTorch is needed only to regenerate it). Reader and comparison:
// tests/support/fixture.h. This CPU backend is in turn the oracle for the CUDA one (docs/style.md 24).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fixture.h"                  // defines: Fixture, tensors_close
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig, ParamInfo
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace {

using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPTConfig;
using scalelab::Optimizer;
using scalelab::OptimizerConfig;
using scalelab::ParamInfo;
using scalelab::PrecisionPolicy;
using scalelab::Tensor;
using scalelab::test::Fixture;
using scalelab::test::tensors_close;

// ---------------------------------------------------------------------------------------------
// Tolerances (docs/style.md 28). Criterion per tensor: ||a-b||_2 <= rtol*||b||_2 + atol*sqrt(n).
// Our model computes in fp32, the fixture in float64, so the difference is fp32 rounding: unit
// roundoff u = 2^-24 = 6e-8 per operation, grown by the length of the sums (C=16 to 4C=64 terms in
// the matmuls, V=64 in the softmax, B*T=16 rows in the weight gradients) and by two layers of
// depth. Our CPU backend, like a PyTorch float32 run of the same fixture, lands at ||a-b||/||b|| of
// 1e-7 .. 5e-7 on every tensor below, so kRtol leaves a margin of 20x or more; a real bug (a wrong
// index, a missing term, a transposed weight) gives relative errors of 1e-3 and up.
constexpr double kRtol = 1e-5;
// atol: the floor for values that are nearly zero, as an RMS error per element. Logits are of order 1
// (RMS 0.4), each the end of a chain of fp32 dot products: a few u * 1 * sqrt(64) ~ 5e-7 -> 1e-6.
constexpr double kLogitsAtol = 1e-6;
// The loss (about 4.3 nats) is a log-sum-exp over V = 64 logits and a mean over B*T = 16 rows;
// the fp32 spacing at 4.3 is 4.8e-7, and the kRtol term (4e-5) dominates anyway.
constexpr double kLossAtol = 1e-6;
// Gradient entries are of order 0.01 - 0.3 (mean loss: each of the B*T = 16 rows contributes 1/16 of
// an O(1) term); a sum of K <= 64 such products carries about u * 0.1 * sqrt(64) = 5e-8 of rounding.
constexpr double kGradAtol = 1e-7;
// Parameters after 10 AdamW steps are of order 0.1-1; each step moves them by at most about lr = 1e-2
// and fp32 carries about u * 1 of error per step: 10 steps * 6e-8 ~ 6e-7 -> 1e-6.
constexpr double kParamAtol = 1e-6;

const Fixture& fixture() { return Fixture::load("gpt2_tiny.json"); }

// A model with the fixture's config and parameters.
GPT2 make_model(const PrecisionPolicy& policy = PrecisionPolicy::fp32()) {
  GPT2 model(fixture().config(), policy);
  fixture().load_params(model);
  return model;
}

// Runs `steps` steps on the fixture's single batch, recording the loss BEFORE each update
// (losses[k] = loss after k updates), as the generator does.
std::vector<float> train_on_fixture_batch(GPT2& model, Optimizer& opt, float lr, int steps) {
  const Tensor tokens = fixture().int_tensor("tokens"), targets = fixture().int_tensor("targets");
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    losses.push_back(model.forward(tokens, &targets));
    model.backward();
    opt.step(lr);
  }
  return losses;
}

}  // namespace

// The fixture's config is the "tiny" preset, so other tests may use the preset with this fixture.
TEST(Gpt2Fixture, TinyPresetMatchesFixtureConfig) {
  const GPTConfig fx = fixture().config(), tiny = GPTConfig::preset("tiny");
  EXPECT_EQ(tiny.max_seq_len, fx.max_seq_len);
  EXPECT_EQ(tiny.vocab_size, fx.vocab_size);
  EXPECT_EQ(tiny.n_layer, fx.n_layer);
  EXPECT_EQ(tiny.n_head, fx.n_head);
  EXPECT_EQ(tiny.n_embd, fx.n_embd);
}

// Names and shapes of our parameter table are the fixture's (PyTorch's) names and shapes, and weight
// decay is on exactly the tensors with 2+ dims (the generator's AdamW param groups).
TEST(Gpt2Fixture, ParameterTableMatchesPyTorchNamesShapesAndDecay) {
  GPT2 model(fixture().config());
  int n_fixture_params = 0;
  for (const auto& item : fixture().json()["tensors"].items()) {
    const std::string& key = item.key();
    if (key.rfind("grad.", 0) != 0 && key.rfind("adamw_final.", 0) != 0 && key != "logits") ++n_fixture_params;
  }
  EXPECT_EQ(static_cast<int>(model.param_table().size()), n_fixture_params);
  for (const ParamInfo& info : model.param_table()) {
    ASSERT_TRUE(fixture().has(info.name)) << "our parameter " << info.name << " is not in the fixture";
    EXPECT_EQ(fixture().shape(info.name), info.shape) << info.name;
    EXPECT_EQ(info.decay, info.shape.size() >= 2) << info.name;
  }
}

TEST(Gpt2Fixture, LogitsMatchPyTorch) {
  GPT2 model = make_model();
  const Tensor tokens = fixture().int_tensor("tokens");  // (B,T) i32
  const float no_loss = model.forward(tokens, /*targets=*/nullptr);
  EXPECT_TRUE(std::isnan(no_loss)) << "forward without targets returns NaN (gpt2.h)";
  const Tensor& logits = model.logits();  // (B,T,V) fp32
  EXPECT_EQ(logits.shape(), fixture().shape("logits"));
  EXPECT_TRUE(tensors_close("logits", logits, fixture().array("logits"), kRtol, kLogitsAtol));
}

TEST(Gpt2Fixture, LossMatchesPyTorch) {
  GPT2 model = make_model();
  const Tensor tokens = fixture().int_tensor("tokens"), targets = fixture().int_tensor("targets");
  const float loss = model.forward(tokens, &targets);
  EXPECT_TRUE(tensors_close("loss", &loss, {fixture().number("loss")}, kRtol, kLossAtol));
}

// Every gradient, per tensor. Note "h.<l>.attn.c_attn.bias": its middle third (the key bias) has an
// exact gradient of ZERO, because adding b_k to every key adds q.b_k to every score of a row and
// softmax ignores a constant shift. fp32 leaves about 1e-9 of noise there; kGradAtol covers it.
TEST(Gpt2Fixture, EveryParameterGradientMatchesPyTorch) {
  GPT2 model = make_model();
  const Tensor tokens = fixture().int_tensor("tokens"), targets = fixture().int_tensor("targets");
  model.zero_grad();
  model.forward(tokens, &targets);
  model.backward();
  for (const ParamInfo& info : model.param_table()) {
    const std::string key = "grad." + info.name;
    EXPECT_TRUE(tensors_close(key, model.grad(info.name), fixture().array(key), kRtol, kGradAtol));
  }
}

// 10 steps of torch.optim.AdamW (decay 0.1 on matrices and embeddings only) on the same batch.
// The key third of c_attn.bias is compared separately: its true gradient is zero (see above), so in
// float64 AdamW leaves it at its initial value (its update is ~1e-17 / (1e-17 + eps)), while in fp32
// the ~1e-9 gradient noise is comparable to eps = 1e-8 and AdamW, which normalises the gradient,
// turns noise into steps of up to about lr. (A PyTorch float32 run moves it by up to 2.5e-3.) That
// slice is held to the bound of pure noise: whatever the gradients, |mhat| / sqrt(vhat) <= 1.012 for
// t <= 10 with betas (0.9, 0.95) (Cauchy-Schwarz on the two weighted sums), so each step moves a
// parameter by at most 1.012 lr (biases have no decay) and 10 steps by at most 1.02 * steps * lr.
TEST(Gpt2Fixture, TenAdamWStepsMatchPyTorchLossesAndParams) {
  const auto& a = fixture().json()["adamw"];
  const int steps = a["steps"].get<int>();
  const float lr = a["lr"].get<float>();
  OptimizerConfig cfg;
  cfg.kind = OptimizerConfig::Kind::AdamW;
  cfg.beta1 = a["beta1"].get<float>();                // 0.9
  cfg.beta2 = a["beta2"].get<float>();                // 0.95
  cfg.eps = a["eps"].get<float>();                    // 1e-8
  cfg.weight_decay = a["weight_decay"].get<float>();  // 0.1, where ParamInfo::decay

  GPT2 model = make_model();  // parameters loaded BEFORE the optimizer copies any state from them
  Optimizer opt(model, cfg);
  const std::vector<float> losses = train_on_fixture_batch(model, opt, lr, steps);
  EXPECT_EQ(opt.step_count(), steps);
  EXPECT_TRUE(tensors_close("adamw losses", losses.data(), fixture().values({"adamw", "losses"}), kRtol, kLossAtol));

  const double key_bias_bound = 1.02 * steps * lr;  // the most AdamW moves an undecayed parameter (above)
  const int C = model.config().n_embd;
  for (const ParamInfo& info : model.param_table()) {
    const std::string key = "adamw_final." + info.name;
    const Tensor p = model.param(info.name);  // fp32 (policy fp32)
    const std::vector<double> expected = fixture().array(key);
    if (info.name.find("attn.c_attn.bias") == std::string::npos) {
      EXPECT_TRUE(tensors_close(key, p, expected, kRtol, kParamAtol));
      continue;
    }
    // c_attn.bias (3C) = q | k | v: q and v to the usual tolerance, k to the noise bound.
    const float* h_p = p.data<float>();
    const auto slice = [&](int i) {  // third i of the (3C) bias: 0 = q, 1 = k, 2 = v
      return std::vector<double>(expected.begin() + i * C, expected.begin() + (i + 1) * C);
    };
    const std::vector<double> q = slice(0), k = slice(1), v = slice(2);
    EXPECT_TRUE(tensors_close(key + "[q]", h_p, q, kRtol, kParamAtol));
    EXPECT_TRUE(tensors_close(key + "[v]", h_p + 2 * C, v, kRtol, kParamAtol));
    double max_drift = 0;
    for (int i = 0; i < C; ++i) {
      const double drift = std::fabs(h_p[C + i] - k[i]);
      max_drift = std::max(max_drift, drift);
      EXPECT_LE(drift, key_bias_bound) << key << "[k] index " << i << ": actual " << h_p[C + i] << " expected " << k[i];
    }
    std::printf("  [fixture] %s[k]: max|a-b| = %.2e (noise bound 1.02*steps*lr = %.2e)\n", key.c_str(), max_drift,
                key_bias_bound);
  }
}

// Plain SGD, because AdamW normalises away a wrongly SCALED gradient (docs/design.md): with SGD the
// losses move by lr * |g|^2 per step and a gradient off by a factor shows at once.
TEST(Gpt2Fixture, TenSgdStepsMatchPyTorchLosses) {
  const auto& s = fixture().json()["sgd"];
  OptimizerConfig cfg;
  cfg.kind = OptimizerConfig::Kind::SGD;
  cfg.weight_decay = s["weight_decay"].get<float>();  // 0
  GPT2 model = make_model();
  Optimizer opt(model, cfg);
  const std::vector<float> losses = train_on_fixture_batch(model, opt, s["lr"].get<float>(), s["steps"].get<int>());
  EXPECT_TRUE(tensors_close("sgd losses", losses.data(), fixture().values({"sgd", "losses"}), kRtol, kLossAtol));
}

// PrecisionPolicy::bf16_mixed(): parameters stored in bf16, computed in fp32 (emulated on the CPU).
// Two checks:
// 1. Against the fp32 loss, a bound from first principles: bf16 keeps 8 significant bits, so rounding
//    to nearest moves each weight by at most 2^-8 of its value, |dw_i| <= 2^-8 |w_i|. To first order
//    the loss moves by sum_i g_i dw_i, so |loss_bf16 - loss_fp32| <= 2^-8 * sum_i |w_i g_i| with the
//    fixture's weights and gradients (about 0.02 here; the actual change is about 6e-4, since the
//    rounding errors have random signs; a bf16 path that reads the wrong bytes misses by far more).
//    Second-order terms are of relative size 2^-18 and the fp32 compute adds kRtol * loss at most.
// 2. Against PyTorch with the same rounded weights ("loss_bf16_params"): once the weights are rounded,
//    the rest is fp32 compute, held to the fp32 tolerance.
TEST(Gpt2Fixture, Bf16MixedLossWithinRoundingBoundOfFp32) {
  // Rounding to bf16 (8 significant bits) moves a value by at most half an ulp: 2^-8 of it at worst
  // (a value just above a power of two, where the ulp is 2^-7 of the value).
  constexpr double kBf16MaxRelRounding = 1.0 / 256;
  GPT2 model = make_model(PrecisionPolicy::bf16_mixed());
  ASSERT_EQ(model.param("wte").dtype(), DType::BF16) << "bf16_mixed() stores parameters in bf16";
  const Tensor tokens = fixture().int_tensor("tokens"), targets = fixture().int_tensor("targets");
  const double loss_bf16 = model.forward(tokens, &targets);

  double sum_abs_wg = 0;  // sum_i |w_i * dloss/dw_i| over all parameters (float64, from the fixture)
  for (const ParamInfo& info : model.param_table()) {
    const std::vector<double> w = fixture().array(info.name), g = fixture().array("grad." + info.name);
    for (size_t i = 0; i < w.size(); ++i) sum_abs_wg += std::fabs(w[i] * g[i]);
  }
  const double loss_fp32 = fixture().number("loss");
  const double bound = kBf16MaxRelRounding * sum_abs_wg + kRtol * loss_fp32;  // + the fp32 compute tolerance
  std::printf("  [fixture] bf16 loss %.7f, fp32 loss %.7f, |diff| %.2e, first-order bound %.2e\n", loss_bf16, loss_fp32,
              std::fabs(loss_bf16 - loss_fp32), bound);
  EXPECT_LE(std::fabs(loss_bf16 - loss_fp32), bound);

  const float h_loss = static_cast<float>(loss_bf16);
  EXPECT_TRUE(tensors_close("loss_bf16_params", &h_loss, {fixture().number("loss_bf16_params")}, kRtol, kLossAtol));
}
