// test_optim.cpp — the learning-rate schedule, gradient clipping and the Optimizer's bookkeeping
// (common/src/model/optim.cpp): which parameters decay, how much optimizer state it holds, and the fp32
// master copy of the bf16-mixed policy. The update arithmetic itself is checked against PyTorch in
// tests/common/model/test_gpt2_fixture.cpp and against hand-computed steps in tests/common/ops/test_ops_cpu.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/bf16.h"       // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/core/error.h"      // defines: Error
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig, ParamInfo
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig, LRSchedule, clip_grad_norm, grad_norm,
                                      //   scale_grads, clip_factor
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace {

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPTConfig;
using scalelab::LRSchedule;
using scalelab::MemCategory;
using scalelab::Optimizer;
using scalelab::OptimizerConfig;
using scalelab::ParamInfo;
using scalelab::PrecisionPolicy;
using scalelab::Tensor;

// Tolerances (docs/style.md 28).
// The schedule computes in float (warmup) or in double rounded to float (cosine), so its values are
// the formula's within a few fp32 roundings of 2^-24 = 6e-8 relative each: 4 of them = 2.4e-7.
constexpr float kLrRtol = 2.4e-7f;
// clip_grad_norm scales by max_norm / (norm + 1e-6) as torch does: for norms of order 10 the 1e-6 is
// a relative 1e-7, and scaling 7872 fp32 values and summing their squares in double adds ~1e-7 more.
constexpr double kClipRtol = 1e-6;

GPTConfig tiny() { return GPTConfig::preset("tiny"); }  // maxT=16, V=64, L=2, NH=2, C=16: 7872 params

int64_t current_bytes(MemCategory c) { return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(c)]; }

// Fills every gradient of the model with values uniform in [-scale, scale) from a fixed seed, and
// returns their L2 norm computed here in double (the reference for grad_norm / clip_grad_norm).
double fill_grads(GPT2& model, uint32_t seed, float scale) {
  std::mt19937 gen(seed);  // mt19937's sequence is fixed by the standard: same values everywhere
  double sq = 0.0;
  for (int u = 0; u < model.num_units(); ++u) {
    Tensor& g = model.unit_grads(u);
    float* p = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) {
      p[i] = scale * (2.0f * static_cast<float>(gen() / 4294967296.0) - 1.0f);
      sq += static_cast<double>(p[i]) * p[i];
    }
  }
  return std::sqrt(sq);
}

// All gradients of the model, flattened unit after unit.
std::vector<float> all_grads(GPT2& model) {
  std::vector<float> out;
  for (int u = 0; u < model.num_units(); ++u) {
    const float* p = model.unit_grads(u).data<float>();
    out.insert(out.end(), p, p + model.unit_grads(u).numel());
  }
  return out;
}

// The fp32 value of every parameter (bf16 parameters converted), flattened unit after unit.
std::vector<float> all_params(GPT2& model) {
  std::vector<float> out;
  for (int u = 0; u < model.num_units(); ++u) {
    const Tensor& t = model.unit_params(u);
    for (int64_t i = 0; i < t.numel(); ++i)
      out.push_back(t.dtype() == DType::F32 ? t.data<float>()[i]
                                            : scalelab::bf16_to_float(t.data<scalelab::bf16>()[i]));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// LRSchedule

TEST(LRSchedule, WarmupIsLinearFromMaxOverWarmupToMax) {
  const LRSchedule s{/*max_lr=*/1e-3f, /*min_lr=*/1e-4f, /*warmup_steps=*/10, /*total_steps=*/110};
  EXPECT_NEAR(s.at(0), 1e-3f / 10, kLrRtol * 1e-4f);  // step 0 already trains: lr = max_lr / warmup
  EXPECT_NEAR(s.at(9), 1e-3f, kLrRtol * 1e-3f);
  for (int step = 0; step < 10; ++step)  // linear: equal increments of max_lr / warmup
    EXPECT_NEAR(s.at(step), 1e-3f * static_cast<float>(step + 1) / 10.0f, kLrRtol * 1e-3f) << step;
}

TEST(LRSchedule, CosineStartsAtMaxHalvesAtTheMidpointAndReachesMinAtTotalSteps) {
  const LRSchedule s{1e-3f, 1e-4f, 10, 110};
  EXPECT_NEAR(s.at(10), 1e-3f, kLrRtol * 1e-3f);                // the first decay step: cosine(0) = 1
  EXPECT_NEAR(s.at(60), (1e-3f + 1e-4f) / 2, kLrRtol * 1e-3f);  // progress 1/2: cos(pi/2) = 0
  EXPECT_EQ(s.at(110), 1e-4f);
  EXPECT_EQ(s.at(1000), 1e-4f);  // stays at min_lr after total_steps
  EXPECT_GT(s.at(109), 1e-4f);   // ... and not before
}

// Strictly: the smallest step (at the ends of the cosine) is (max-min) * (1 - cos(pi/100)) / 2 = 2.2e-7,
// over 1900 fp32 ulps even at 1e-3 (ulp 1.2e-10), so rounding cannot make two neighbours equal.
TEST(LRSchedule, StrictlyDecreasingAfterWarmup) {
  const LRSchedule s{1e-3f, 1e-4f, 10, 110};
  for (int step = 10; step < 110; ++step) EXPECT_LT(s.at(step + 1), s.at(step)) << "step " << step;
}

TEST(LRSchedule, WithoutWarmupStartsAtMax) {
  const LRSchedule s{6e-4f, 6e-5f, 0, 50};
  EXPECT_NEAR(s.at(0), 6e-4f, kLrRtol * 6e-4f);
  EXPECT_EQ(s.at(50), 6e-5f);
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping

TEST(ClipGradNorm, ReturnsTheNormBeforeClipping) {
  GPT2 model(tiny());
  const double norm = fill_grads(model, 1, 0.2f);  // about 0.2 * sqrt(7872 / 3) = 10
  EXPECT_NEAR(scalelab::grad_norm(model), norm, kClipRtol * norm);
  EXPECT_NEAR(scalelab::clip_grad_norm(model, 1.0f), norm, kClipRtol * norm);
}

TEST(ClipGradNorm, ScalesEveryGradientByOneFactorToExactlyMaxNorm) {
  GPT2 model(tiny());
  const double norm = fill_grads(model, 2, 0.2f);
  const std::vector<float> before = all_grads(model);
  const float max_norm = 1.0f;
  scalelab::clip_grad_norm(model, max_norm);
  EXPECT_NEAR(scalelab::grad_norm(model), max_norm, kClipRtol * max_norm);
  // One factor for all: every gradient keeps its direction. after = fl(before * s) is one fp32
  // product, within 2^-24 = 6e-8 relative of before * s, so any two ratios after/before differ by at
  // most 1.2e-7 relative. A per-unit or per-tensor scale would not pass.
  const std::vector<float> after = all_grads(model);
  const double s = after[0] / static_cast<double>(before[0]);
  EXPECT_NEAR(s, max_norm / norm, kClipRtol * s);
  int checked = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    if (before[i] == 0.0f) continue;
    ASSERT_NEAR(after[i] / static_cast<double>(before[i]), s, 1.2e-7 * s) << "gradient " << i;
    ++checked;
  }
  EXPECT_GT(checked, 7000);
}

TEST(ClipGradNorm, LeavesGradientsBitIdenticalBelowMaxNorm) {
  GPT2 model(tiny());
  const double norm = fill_grads(model, 3, 0.2f);
  const std::vector<float> before = all_grads(model);
  scalelab::clip_grad_norm(model, static_cast<float>(2 * norm));
  const std::vector<float> after = all_grads(model);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
}

TEST(ClipGradNorm, NonPositiveMaxNormDisablesClippingButReturnsTheNorm) {
  GPT2 model(tiny());
  const double norm = fill_grads(model, 4, 0.2f);
  const std::vector<float> before = all_grads(model);
  for (float max_norm : {0.0f, -1.0f}) {
    EXPECT_NEAR(scalelab::clip_grad_norm(model, max_norm), norm, kClipRtol * norm);
    const std::vector<float> after = all_grads(model);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << max_norm;
  }
}

TEST(ClipGradNorm, NonFiniteGradientNormThrowsWithHint) {
  GPT2 model(tiny());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    fill_grads(model, 5, 0.2f);
    model.grad("h.1.mlp.c_fc.weight").data<float>()[7] = bad;
    try {
      scalelab::clip_grad_norm(model, 1.0f);
      ADD_FAILURE() << "no error for a gradient of " << bad;
    } catch (const scalelab::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("not finite"), std::string::npos) << msg;
      EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
    }
  }
}

TEST(ScaleGrads, OneOverMTurnsTheSumOfMMicroBatchesIntoTheirMean) {
  GPT2 model(tiny());
  fill_grads(model, 6, 0.2f);
  const std::vector<float> before = all_grads(model);
  scalelab::scale_grads(model, 1.0f / 4.0f);
  const std::vector<float> after = all_grads(model);
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[i] / 4.0f) << "gradient " << i;
}

TEST(ClipFactor, IsTorchsFactorBelowOneElseOne) {
  EXPECT_FLOAT_EQ(scalelab::clip_factor(10.0f, 1.0f), 1.0f / (10.0f + 1e-6f));
  EXPECT_EQ(scalelab::clip_factor(0.5f, 1.0f), 1.0f) << "a norm below max_norm is not scaled";
  EXPECT_EQ(scalelab::clip_factor(10.0f, 0.0f), 1.0f) << "max_norm 0: no clipping";
  EXPECT_THROW(scalelab::clip_factor(std::numeric_limits<float>::infinity(), 1.0f), scalelab::Error);
}

TEST(ClipGradNorm, OverSeveralModelsUsesTheirOneNorm) {
  // Two chunks holding the same gradients: one norm sqrt(2) x each one's, and one factor for both.
  GPT2 a(tiny()), b(tiny());
  const double norm_a = fill_grads(a, 7, 0.2f);
  fill_grads(b, 7, 0.2f);
  const float norm = scalelab::clip_grad_norm({&a, &b}, 1.0f, {});
  EXPECT_NEAR(norm, std::sqrt(2.0) * norm_a, kClipRtol * norm);
  EXPECT_NEAR(std::hypot(scalelab::grad_norm(a), scalelab::grad_norm(b)), 1.0, kClipRtol);
  EXPECT_EQ(all_grads(a), all_grads(b));
}

// ---------------------------------------------------------------------------------------------
// Optimizer

TEST(Optimizer, KindFromNameListsTheAcceptedNames) {
  EXPECT_EQ(OptimizerConfig::kind_from_name("adamw"), OptimizerConfig::Kind::AdamW);
  EXPECT_EQ(OptimizerConfig::kind_from_name("sgd"), OptimizerConfig::Kind::SGD);
  try {
    OptimizerConfig::kind_from_name("adam");
    ADD_FAILURE() << "no error for 'adam'";
  } catch (const scalelab::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("adamw"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sgd"), std::string::npos) << msg;
  }
}

// Decay goes to matrices and embeddings (2-D), never to biases or layernorm parameters (1-D), as in
// GPT-2/nanoGPT's optimizer groups.
TEST(Optimizer, DecayFlagsMarkExactlyTheMatricesAndEmbeddings) {
  for (const ParamInfo& p : scalelab::gpt2_param_table(tiny())) EXPECT_EQ(p.decay, p.shape.size() == 2) << p.name;
}

// With zero gradients AdamW's m and v stay 0 and its update m / (sqrt(v) + eps) is exactly 0, so one
// step does nothing but the decoupled weight decay p *= (1 - lr * wd). Every parameter is set to a
// nonzero value first (biases start at 0, where any factor would go unnoticed).
TEST(Optimizer, AdamWWeightDecayScalesOnlyDecayParamsByOneMinusLrTimesWd) {
  GPT2 model(tiny());
  std::mt19937 gen(6);
  for (int u = 0; u < model.num_units(); ++u) {
    Tensor& w = model.unit_params(u);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = 0.5f + static_cast<float>(gen() / 4294967296.0);
  }
  model.zero_grad();
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1f;
  const float lr = 0.01f;
  Optimizer opt(model, cfg);
  std::vector<std::vector<float>> before;
  for (const ParamInfo& p : model.param_table()) {
    const float* w = model.param(p.name).data<float>();
    before.emplace_back(w, w + p.numel);
  }
  opt.step(lr);
  // the factor as the update computes it: 1 - lr * wd in double, rounded to float; p * factor is then
  // one fp32 multiplication, so the comparison is exact.
  const float factor = static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay);
  ASSERT_NE(factor, 1.0f);
  for (size_t k = 0; k < model.param_table().size(); ++k) {
    const ParamInfo& p = model.param_table()[k];
    const float* w = model.param(p.name).data<float>();
    int wrong = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      const float want = p.decay ? before[k][i] * factor : before[k][i];
      if (w[i] != want && wrong++ < 3)
        ADD_FAILURE() << p.name << "[" << i << "] = " << w[i] << ", want " << want << " (decay " << p.decay << ")";
    }
    EXPECT_EQ(wrong, 0) << p.name;
  }
  EXPECT_EQ(opt.step_count(), 1);
}

// P parameters: AdamW keeps m and v (2 x 4P bytes), plus a 4P fp32 master when params are bf16;
// SGD keeps only the master. This is the "optimizer state" line of every memory table in the labs.
TEST(Optimizer, StateBytesAreTwoOrThreeFp32CopiesForAdamW) {
  struct Case {
    PrecisionPolicy policy;
    OptimizerConfig::Kind kind;
    int64_t fp32_copies;
  };
  const Case cases[] = {{PrecisionPolicy::fp32(), OptimizerConfig::Kind::AdamW, 2},
                        {PrecisionPolicy::bf16_mixed(), OptimizerConfig::Kind::AdamW, 3},
                        {PrecisionPolicy::fp32(), OptimizerConfig::Kind::SGD, 0},
                        {PrecisionPolicy::bf16_mixed(), OptimizerConfig::Kind::SGD, 1}};
  for (const Case& c : cases) {
    GPT2 model(tiny(), c.policy);
    const int64_t P = model.num_params();
    const int64_t before = current_bytes(MemCategory::OptimizerState);
    OptimizerConfig cfg;
    cfg.kind = c.kind;
    {
      Optimizer opt(model, cfg);
      EXPECT_EQ(current_bytes(MemCategory::OptimizerState) - before, c.fp32_copies * 4 * P)
          << c.policy.name() << (c.kind == OptimizerConfig::Kind::AdamW ? " adamw" : " sgd");
    }
    EXPECT_EQ(current_bytes(MemCategory::OptimizerState), before) << "the optimizer's state is freed with it";
  }
}

// bf16-mixed: the optimizer updates the fp32 master, and the bf16 parameters the model computes with
// are the master rounded to nearest even, bit for bit, after every step.
TEST(Optimizer, Bf16ParamsAreRoundedCopiesOfTheFp32Master) {
  GPT2 model(tiny(), PrecisionPolicy::bf16_mixed());
  Optimizer opt(model, OptimizerConfig{});
  ASSERT_EQ(static_cast<int>(opt.master().size()), model.num_units());
  // Before any step the master is the bf16 initialisation, exactly.
  for (int u = 0; u < model.num_units(); ++u) {
    const scalelab::bf16* p = model.unit_params(u).data<scalelab::bf16>();
    const float* m = opt.master()[u].data<float>();
    for (int64_t i = 0; i < model.unit_params(u).numel(); ++i)
      ASSERT_EQ(m[i], scalelab::bf16_to_float(p[i])) << "unit " << u << " [" << i << "]";
  }
  for (int step = 0; step < 3; ++step) {
    fill_grads(model, 10 + step, 0.1f);
    opt.step(1e-3f);
    int64_t finer_than_bf16 = 0;  // master values that bf16 cannot hold: the master is really fp32
    for (int u = 0; u < model.num_units(); ++u) {
      const scalelab::bf16* p = model.unit_params(u).data<scalelab::bf16>();
      const float* m = opt.master()[u].data<float>();
      for (int64_t i = 0; i < model.unit_params(u).numel(); ++i) {
        ASSERT_EQ(p[i].bits, scalelab::float_to_bf16(m[i]).bits)
            << "step " << step << " unit " << u << " [" << i << "]: master " << m[i];
        finer_than_bf16 += scalelab::round_to_bf16(m[i]) != m[i];
      }
    }
    EXPECT_GT(finer_than_bf16, model.num_params() / 2) << "step " << step;
  }
  // And the parameters did move: the steps were not lost to bf16 rounding.
  GPT2 untouched(tiny(), PrecisionPolicy::bf16_mixed());
  const std::vector<float> a = all_params(model), b = all_params(untouched);
  int64_t moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved += a[i] != b[i];
  EXPECT_GT(moved, model.num_params() / 2);
}
