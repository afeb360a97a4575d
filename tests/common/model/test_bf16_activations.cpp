// test_bf16_activations.cpp — 16-bit activations (PrecisionPolicy::activation_dtype BF16, lab drivers'
// --activations bf16; gpt2_activations.h "The tensors"): the kept tensors are bf16 and the allocator's
// Activations bytes equal the estimator's formula (memory_estimator.h gpt2_activation_bytes) for every shard
// kind, attention and recompute mode; the loss is the fp32 activations' exactly (the forward computes in fp32)
// and the gradients are within bf16 rounding of theirs; training still learns; misuse is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "expect_error.h"                       // defines: error_message, contains
#include "megatron_split.h"                     // defines: scalelab::test::megatron_split
#include "scalelab/core/allocator.h"            // defines: Allocator, MemCategory
#include "scalelab/core/precision.h"            // defines: PrecisionPolicy
#include "scalelab/measure/memory_estimator.h"  // defines: gpt2_activation_bytes
#include "scalelab/model/gpt2.h"                // defines: GPT2, Recompute, GPT2Activations
#include "scalelab/model/optim.h"               // defines: Optimizer, OptimizerConfig

namespace {

using scalelab::test::contains;
using scalelab::test::error_message;

using scalelab::Allocator;
using scalelab::AttentionImpl;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPT2Activations;
using scalelab::GPTConfig;
using scalelab::MemCategory;
using scalelab::ModelShard;
using scalelab::PrecisionPolicy;
using scalelab::Recompute;
using scalelab::Tensor;

int64_t activations_now() {
  return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(MemCategory::Activations)];
}

// `base` with 16-bit activations.
PrecisionPolicy bf16_activations(PrecisionPolicy base) {
  base.activation_dtype = DType::BF16;
  return base;
}

// Random tokens and targets (B, T) for cfg, the same for a seed.
void fill_batch(const GPTConfig& cfg, Tensor& tokens, Tensor& targets, unsigned seed) {
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(gen() % cfg.vocab_size);
    targets.data<int32_t>()[i] = static_cast<int32_t>(gen() % cfg.vocab_size);
  }
}

TEST(Bf16Activations, NamesAndBadNames) {
  EXPECT_EQ(PrecisionPolicy::activation_dtype_from_name("fp32"), DType::F32);
  EXPECT_EQ(PrecisionPolicy::activation_dtype_from_name("bf16"), DType::BF16);
  EXPECT_TRUE(contains(error_message([] { PrecisionPolicy::activation_dtype_from_name("fp16"); }),
                       "use --activations fp32"));
  EXPECT_EQ(bf16_activations(PrecisionPolicy::bf16_mixed()).name(), "bf16-mixed+bf16-activations");
  EXPECT_EQ(PrecisionPolicy::fp32().name(), "fp32");  // the default is unchanged
}

// Every shard kind, attention and recompute mode, one and several sets in flight: the allocator's count after
// make_activations equals the formula, and is below the fp32 activations' (Full: equal, only the fp32 stream
// is kept and the working block is there anyway).
TEST(Bf16Activations, TheAllocatorCountsWhatTheEstimatorSays) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // L=4, NH=4, C=192, V=256
  const auto shard = &scalelab::test::megatron_shard;
  const std::vector<ModelShard> shards = {ModelShard::dense(), shard(0, 4, true, 0, -1, true, true),
                                          shard(0, 1, false, 1, 2, false, false)};
  const int B = 2, T = 32;
  for (const ModelShard& sh : shards)
    for (AttentionImpl attention : {AttentionImpl::Materialized, AttentionImpl::Flash})
      for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full})
        for (int sets : {1, 2}) {
          const int64_t before = activations_now();
          const int64_t want = scalelab::gpt2_activation_bytes(cfg, sh, B, T, sets, r, attention, DType::BF16);
          {
            GPT2 model(cfg, sh, bf16_activations(PrecisionPolicy::bf16_mixed()), Device::CPU, 1);
            model.set_attention(attention);
            model.set_recompute(r);
            std::vector<GPT2Activations> in_flight;
            for (int i = 0; i < sets; ++i) in_flight.push_back(model.make_activations(B, T));
            EXPECT_EQ(activations_now() - before, want)
                << sh.str() << ", " << scalelab::attention_impl_name(attention) << ", recompute "
                << scalelab::recompute_name(r) << ", " << sets << " sets";
          }
          const int64_t f32 = scalelab::gpt2_activation_bytes(cfg, sh, B, T, sets, r, attention, DType::F32);
          if (r == Recompute::Full) {
            EXPECT_EQ(want, f32) << sh.str();  // the fp32 stream only, and the working block full recompute has
          } else {
            EXPECT_LT(want, f32) << sh.str();
          }
          EXPECT_EQ(activations_now(), before);
        }
}

// The forward computes in fp32 and rounds only what it keeps: the loss is fp32's bit for bit. The backward
// reads the rounded tensors: each gradient is within a few bf16 roundings (2^-8 relative) of fp32's; the
// allocator's Activations bytes are the formula's after forward and backward (nothing else is kept).
TEST(Bf16Activations, SameLossAndGradientsWithinBf16Rounding) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const int B = 2, T = 32;
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  fill_batch(cfg, tokens, targets, 11);
  for (Recompute r : {Recompute::None, Recompute::Selective}) {
    GPT2 f32(cfg, PrecisionPolicy::fp32(), Device::CPU, /*seed=*/5);
    GPT2 bf16(cfg, bf16_activations(PrecisionPolicy::fp32()), Device::CPU, /*seed=*/5);
    f32.set_recompute(r);
    bf16.set_recompute(r);
    const float loss32 = f32.forward(tokens, &targets);
    f32.zero_grad();
    f32.backward();
    f32.free_activations();  // its gradients stay
    const int64_t before = activations_now();
    const float loss16 = bf16.forward(tokens, &targets);
    EXPECT_EQ(loss32, loss16) << scalelab::recompute_name(r);
    bf16.zero_grad();
    bf16.backward();
    EXPECT_EQ(activations_now() - before, scalelab::gpt2_activation_bytes(cfg, B, T, r, DType::BF16));
    double diff2 = 0, ref2 = 0;
    bool any_differs = false;
    for (const auto& p : f32.param_table()) {
      const Tensor a = f32.grad(p.name), b = bf16.grad(p.name);
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double x = a.data<float>()[i], y = b.data<float>()[i];
        diff2 += (x - y) * (x - y);
        ref2 += x * x;
        any_differs |= x != y;
      }
    }
    const double rel = std::sqrt(diff2 / ref2);
    EXPECT_TRUE(any_differs) << "the backward must read the rounded activations";
    EXPECT_LT(rel, 4.0 / 256) << "relative L2 error of all gradients, " << scalelab::recompute_name(r);
    std::printf("recompute %s: gradients' relative L2 difference %.2e\n", scalelab::recompute_name(r), rel);
  }
}

// 60 AdamW steps on one fixed batch of the tiny model (a second on one core; the demo model's run through lab
// 01's program: docs/memory.md "16-bit activations"): both runs learn it (the loss falls by more than half) and
// the final losses agree within 2% of fp32's.
TEST(Bf16Activations, TrainingStillLearns) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  const int B = 4, T = 16;
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  fill_batch(cfg, tokens, targets, 3);
  auto train = [&](const PrecisionPolicy& policy, float* first) {
    GPT2 model(cfg, policy, Device::CPU, /*seed=*/7);
    scalelab::Optimizer opt(model, scalelab::OptimizerConfig{});
    float loss = 0;
    for (int step = 0; step < 60; ++step) {
      loss = model.forward(tokens, &targets);
      if (step == 0) *first = loss;
      model.zero_grad();
      model.backward();
      opt.step(3e-3f);
    }
    return model.forward(tokens, &targets);
  };
  float first32 = 0, first16 = 0;
  const float last32 = train(PrecisionPolicy::fp32(), &first32);
  const float last16 = train(bf16_activations(PrecisionPolicy::fp32()), &first16);
  EXPECT_EQ(first32, first16);
  EXPECT_LT(last32, 0.5f * first32);
  EXPECT_LT(last16, 0.5f * first16);
  EXPECT_NEAR(last16, last32, 0.02f * last32) << "fp32 " << last32 << ", bf16 activations " << last16;
  std::printf("loss %.5f -> %.5f (fp32 activations), %.5f -> %.5f (bf16)\n", first32, last32, first16, last16);
}

// The split backward (zero-bubble pipelines) keeps douts in the set for backward_weight: refused with a hint.
TEST(Bf16Activations, TheSplitBackwardIsRefused) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  GPT2 model(cfg, bf16_activations(PrecisionPolicy::fp32()), Device::CPU, 1);
  Tensor tokens = Tensor::empty({1, 8}, DType::I32), targets = Tensor::empty({1, 8}, DType::I32);
  fill_batch(cfg, tokens, targets, 1);
  GPT2Activations a = model.make_activations(1, 8);
  model.forward(a, tokens, &targets);
  EXPECT_TRUE(contains(error_message([&] { model.backward_input(a, nullptr, nullptr); }), "--activations fp32"));
}

}  // namespace
