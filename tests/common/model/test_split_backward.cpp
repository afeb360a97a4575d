// test_split_backward.cpp — the backward in two parts (gpt2.h GPT2::backward_input, B, and backward_weight, W,
// as a zero-bubble pipeline runs them: Qi et al. 2024, arXiv:2401.10241, Sec. 2). B then W adds the bits
// backward() adds and returns the same input gradient, on every kind of pipeline stage, fp32 and both bf16
// policies, both attentions, recompute none and selective; several micro-batches' W in another order than
// their B; what B keeps for W and frees, from the allocator (lab 06's ZB-H1 memory check rests on it); the
// hooks; misuse refused with a hint.
#include <gtest/gtest.h>

#include <algorithm>  // defines: std::max
#include <cmath>      // defines: std::fabs
#include <cstdint>
#include <cstdio>  // defines: std::printf
#include <map>     // defines: std::map
#include <random>
#include <string>
#include <vector>

#include "bit_identical.h"            // defines: bit_identical
#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPT2Activations, ModelShard, Recompute, HookPoint

namespace {

using scalelab::Allocator;
using scalelab::AttentionImpl;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPT2Activations;
using scalelab::GPTConfig;
using scalelab::HookPoint;
using scalelab::MemCategory;
using scalelab::ModelShard;
using scalelab::PrecisionPolicy;
using scalelab::Recompute;
using scalelab::Tensor;
using scalelab::test::bit_identical;
using scalelab::test::contains;
using scalelab::test::error_message;

// L = 4 blocks, so a cut leaves layers on both sides; maxT 32, V 64, NH 4, C 32.
GPTConfig small() { return GPTConfig{32, 64, 4, 4, 32}; }
constexpr int kB = 2, kT = 16;

Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

Tensor random_stream(uint32_t seed) {  // (B, T, C) fp32: a hidden state or its gradient
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty({kB, kT, small().n_embd}, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(gen);
  return t;
}

ModelShard stage(int first, int last, bool embedding, bool head) {
  ModelShard s;
  s.first_layer = first;
  s.last_layer = last;
  s.has_embedding = embedding;
  s.has_head = head;
  return s;
}

// The three kinds of pipeline stage and the whole model (the first has the embedding, the last the head).
struct Kind {
  const char* name;
  ModelShard shard;
};
std::vector<Kind> kinds() {
  return {{"whole model", ModelShard::dense()},
          {"first stage", stage(0, 1, true, false)},
          {"middle stage", stage(1, 2, false, false)},
          {"last stage", stage(2, 3, false, true)}};
}

std::vector<float> all_grads(GPT2& model) {
  std::vector<float> out;
  for (int u = 0; u < model.num_units(); ++u) {
    const Tensor& g = model.unit_grads(u);
    if (g.numel() > 0) out.insert(out.end(), g.data<float>(), g.data<float>() + g.numel());
  }
  return out;
}

std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

int64_t activations_now() {
  return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(MemCategory::Activations)];
}

// One stage's model with the case's choices.
struct Case {
  PrecisionPolicy policy;
  AttentionImpl attention;
  Recompute recompute;
};
GPT2 make_model(const ModelShard& shard, const Case& c) {
  GPT2 model(small(), shard, c.policy, Device::CPU, /*seed=*/7);
  model.set_attention(c.attention);
  model.set_recompute(c.recompute);
  model.zero_grad();
  return model;
}

// The forward of micro-batch `i` on `model` into `acts` (inputs drawn from i: tokens or a hidden state).
void forward(GPT2& model, GPT2Activations& acts, int i) {
  const ModelShard& s = model.shard();
  const Tensor tokens = random_tokens(kB, kT, small().vocab_size, 10 + i);
  const Tensor targets = random_tokens(kB, kT, small().vocab_size, 20 + i);
  model.forward(acts, s.has_embedding ? tokens : random_stream(30 + i), s.has_head ? &targets : nullptr);
}
// The gradient entering micro-batch i's backward on a stage without the head (nullptr with it).
const Tensor* d_output_of(const GPT2& model, int i, Tensor& storage) {
  if (model.shard().has_head) return nullptr;
  storage = random_stream(40 + i);
  return &storage;
}

}  // namespace

// B then W on one set gives backward()'s gradients and input gradient bit for bit: every stage kind, every
// policy, both attentions, recompute none and selective (B recomputes the scores; W needs none of them).
TEST(SplitBackward, InputThenWeightIsBackwardBitForBit) {
  int cases = 0;
  for (const PrecisionPolicy& policy :
       {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed(), PrecisionPolicy::bf16_compute()})
    for (AttentionImpl attention : {AttentionImpl::Materialized, AttentionImpl::Flash})
      for (Recompute recompute : {Recompute::None, Recompute::Selective})
        for (const Kind& k : kinds()) {
          const Case c{policy, attention, recompute};
          const std::string what = policy.name() + " " + scalelab::attention_impl_name(attention) + " recompute " +
                                   scalelab::recompute_name(recompute) + ", " + k.name;
          GPT2 whole = make_model(k.shard, c), split = make_model(k.shard, c);
          GPT2Activations a = whole.make_activations(kB, kT), b = split.make_activations(kB, kT);
          forward(whole, a, 0);
          forward(split, b, 0);
          Tensor dy;
          const Tensor* d_output = d_output_of(whole, 0, dy);
          const bool has_input = !k.shard.has_embedding;
          Tensor dx_whole = has_input ? Tensor::zeros({kB, kT, small().n_embd}, DType::F32) : Tensor();
          Tensor dx_split = has_input ? Tensor::zeros({kB, kT, small().n_embd}, DType::F32) : Tensor();
          whole.backward(a, d_output, has_input ? &dx_whole : nullptr);
          split.backward_input(b, d_output, has_input ? &dx_split : nullptr);
          if (has_input) {
            EXPECT_TRUE(bit_identical(what + ": d_input", values(dx_split), values(dx_whole)));
          }
          split.backward_weight(b);
          EXPECT_TRUE(bit_identical(what + ": the gradients", all_grads(split), all_grads(whole)));
          EXPECT_TRUE(b.empty()) << what << ": W frees the set";
          ++cases;
        }
  EXPECT_EQ(cases, 48);
}

// A zero-bubble schedule runs several micro-batches' B before their W. Each gradient element is a sum over
// micro-batches, added in the order its part ran: the layernorms' (and a last stage's LM head's, computed in
// B: gpt2.h backward_input) in B's order, the matmuls', the whole model's head's and the embedding's in W's. So W in B's order gives backward()'s bits for any number of micro-batches (ZB-H1
// runs both in micro-batch order). W in another order gives the same sums re-associated: a matmul's weight
// gradient accumulates into the buffer as it goes, so even two micro-batches differ in the last bits
// (measured here), within a few ulps of the largest entry.
TEST(SplitBackward, SeveralMicroBatchesBeforeTheirWeightGradients) {
  const Case c{PrecisionPolicy::fp32(), AttentionImpl::Materialized, Recompute::None};
  for (const Kind& k : kinds()) {
    for (const std::vector<int>& w_order : {std::vector<int>{0, 1, 2}, std::vector<int>{2, 1, 0}}) {
      const bool in_order = w_order.front() == 0;
      const int n = static_cast<int>(w_order.size());
      GPT2 whole = make_model(k.shard, c), split = make_model(k.shard, c);
      std::vector<GPT2Activations> sets;
      std::vector<Tensor> dy(n), dx(n);
      for (int i = 0; i < n; ++i) {
        GPT2Activations a = whole.make_activations(kB, kT);
        forward(whole, a, i);
        Tensor scratch = k.shard.has_embedding ? Tensor() : Tensor::zeros({kB, kT, small().n_embd}, DType::F32);
        whole.backward(a, d_output_of(whole, i, dy[i]), k.shard.has_embedding ? nullptr : &scratch);
        sets.push_back(split.make_activations(kB, kT));
        forward(split, sets.back(), i);
      }
      for (int i = 0; i < n; ++i) {
        dx[i] = k.shard.has_embedding ? Tensor() : Tensor::zeros({kB, kT, small().n_embd}, DType::F32);
        split.backward_input(sets[i], d_output_of(split, i, dy[i]), k.shard.has_embedding ? nullptr : &dx[i]);
      }
      for (int i : w_order) split.backward_weight(sets[i]);
      const std::vector<float> got = all_grads(split), want = all_grads(whole);
      if (in_order) {
        EXPECT_TRUE(bit_identical(std::string(k.name) + ", W in B's order", got, want));
        continue;
      }
      double worst = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
      }
      constexpr double kReassociation = 1e-6;  // fp32: a few ulps of the largest entry
      EXPECT_LE(worst, kReassociation * scale) << k.name << ", W in reverse order: worst " << worst << " of " << scale;
    }
  }
}

// What B keeps for W, from the allocator: B allocates no activation memory (each matmul's dout goes into the
// memory of a forward-only tensor of its shape), leaves a smaller set behind, and W frees all of it. The
// kept share is what bounds a zero-bubble schedule's memory (lab 06 README "Zero bubble"). A last stage
// keeps nothing of its head (B computed the head's weight gradient): exactly what a middle stage of as many
// blocks keeps, not the logits' gradient (B,T,V).
TEST(SplitBackward, InputGradientFreesWhatOnlyItReadWeightFreesTheRest) {
  const Case c{PrecisionPolicy::fp32(), AttentionImpl::Materialized, Recompute::None};
  std::map<std::string, int64_t> kept_of;
  for (const Kind& k : kinds()) {
    GPT2 model = make_model(k.shard, c);
    GPT2Activations warm = model.make_activations(kB, kT);  // the scratch exists before the measurement
    const int64_t before = activations_now();
    GPT2Activations a = model.make_activations(kB, kT);
    const int64_t set_bytes = activations_now() - before;
    forward(model, a, 0);
    Tensor dy, dx = k.shard.has_embedding ? Tensor() : Tensor::zeros({kB, kT, small().n_embd}, DType::F32);
    Allocator::get(Device::CPU).reset_peak();
    model.backward_input(a, d_output_of(model, 0, dy), k.shard.has_embedding ? nullptr : &dx);
    const auto stats = Allocator::get(Device::CPU).stats();
    const int64_t kept = activations_now() - before;
    EXPECT_EQ(stats.peak_bytes[static_cast<int>(MemCategory::Activations)] - before, set_bytes)
        << k.name << ": B allocates no activation memory";
    EXPECT_GT(kept, 0) << k.name;
    EXPECT_LT(kept, set_bytes) << k.name << ": B frees what only it read";
    model.backward_weight(a);
    EXPECT_EQ(activations_now() - before, 0) << k.name << ": W frees the rest";
    std::printf("[ measured ] %-12s set %lld bytes, kept for W %lld (%.0f %%)\n", k.name,
                static_cast<long long>(set_bytes), static_cast<long long>(kept), 100.0 * kept / set_bytes);
    kept_of[k.name] = kept;
  }
  EXPECT_EQ(kept_of["last stage"], kept_of["middle stage"]) << "a last stage's B keeps nothing of the head for W";
}

// B fires every BeforeBackward hook backward() fires, in its order, and no AfterBackward; W fires every
// AfterBackward hook in backward()'s order: a unit's gradients are complete at its AfterBackward.
TEST(SplitBackward, HooksFireBeforeInBAndAfterInW) {
  for (const Kind& k : kinds()) {
    std::vector<std::string> seen[2], in_b;
    for (int run = 0; run < 2; ++run) {
      GPT2 model = make_model(k.shard, {PrecisionPolicy::fp32(), AttentionImpl::Materialized, Recompute::None});
      GPT2Activations a = model.make_activations(kB, kT);
      forward(model, a, 0);
      std::vector<scalelab::HookHandle> hooks;
      for (const HookPoint p : {HookPoint::BeforeBackward, HookPoint::AfterBackward})
        hooks.push_back(model.add_hook(p, [&, p, run](const scalelab::UnitHookArgs& h) {
          seen[run].push_back(std::string(scalelab::hook_point_name(p)) + " " + std::to_string(h.unit));
        }));
      Tensor dy, dx = k.shard.has_embedding ? Tensor() : Tensor::zeros({kB, kT, small().n_embd}, DType::F32);
      const Tensor* d_output = d_output_of(model, 0, dy);
      if (run == 0) {
        model.backward(a, d_output, k.shard.has_embedding ? nullptr : &dx);
      } else {
        model.backward_input(a, d_output, k.shard.has_embedding ? nullptr : &dx);
        in_b = seen[1];
        model.backward_weight(a);
      }
    }
    std::vector<std::string> before, after;
    for (const std::string& s : seen[0]) (contains(s, "before") ? before : after).push_back(s);
    EXPECT_EQ(in_b, before) << k.name;
    EXPECT_EQ(std::vector<std::string>(seen[1].begin() + static_cast<long>(in_b.size()), seen[1].end()), after)
        << k.name;
  }
}

// Misuse: W without B, a second backward of a set B ran on, a split under Full recompute.
TEST(SplitBackward, MisuseIsRefusedWithAHint) {
  const Case c{PrecisionPolicy::fp32(), AttentionImpl::Materialized, Recompute::None};
  GPT2 model = make_model(ModelShard::dense(), c);
  GPT2Activations a = model.make_activations(kB, kT);
  forward(model, a, 0);
  const std::string no_b = error_message([&] { model.backward_weight(a); });
  EXPECT_TRUE(contains(no_b, "backward_input")) << no_b;
  model.backward_input(a, nullptr, nullptr);
  const std::string twice = error_message([&] { model.backward(a, nullptr, nullptr); });
  EXPECT_TRUE(contains(twice, "backward_weight")) << twice;
  model.backward_weight(a);

  GPT2 full = make_model(ModelShard::dense(), {c.policy, c.attention, Recompute::Full});
  GPT2Activations f = full.make_activations(kB, kT);
  forward(full, f, 0);
  const std::string refused = error_message([&] { full.backward_input(f, nullptr, nullptr); });
  EXPECT_TRUE(contains(refused, "'full'") && contains(refused, "selective")) << refused;
}
