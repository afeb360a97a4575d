// test_recompute.cpp — activation recompute in the model (gpt2.h Recompute, GPT2::set_recompute): every mode
// gives the same loss and gradients bit for bit (the forward is deterministic and has no dropout), with the
// materialized and the flash attention, fp32 and bf16; caller-owned sets of several micro-batches in flight
// share the one working set correctly; the allocator's Activations bytes equal the estimator's formula for
// each mode (memory_estimator.h gpt2_activation_bytes); the hooks fire as without recompute; misuse is
// refused with a hint.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect_error.h"                       // defines: error_message, contains
#include "scalelab/core/allocator.h"            // defines: Allocator, MemCategory
#include "scalelab/core/error.h"                // defines: Error
#include "scalelab/core/precision.h"            // defines: PrecisionPolicy
#include "scalelab/measure/memory_estimator.h"  // defines: gpt2_activation_bytes
#include "scalelab/model/gpt2.h"                // defines: GPT2, Recompute, GPT2Activations

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
using scalelab::PrecisionPolicy;
using scalelab::Recompute;
using scalelab::Tensor;

constexpr Recompute kModes[] = {Recompute::None, Recompute::Selective, Recompute::Full};

Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

int64_t activations_now() {
  return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(MemCategory::Activations)];
}

std::vector<float> all_grads(GPT2& model) {
  std::vector<float> out;
  for (int u = 0; u < model.num_units(); ++u) {
    const float* p = model.unit_grads(u).data<float>();
    out.insert(out.end(), p, p + model.unit_grads(u).numel());
  }
  return out;
}

// Index of the first float that differs bit for bit, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

struct Result {
  float loss;
  std::vector<float> grads;
};

// One forward + backward of the model's own set with `modes` per block (one entry: every block).
Result step(const GPTConfig& cfg, const PrecisionPolicy& policy, AttentionImpl attention,
            const std::vector<Recompute>& modes, const Tensor& tokens, const Tensor& targets) {
  GPT2 model(cfg, policy, Device::CPU, /*seed=*/11);
  model.set_attention(attention);
  if (modes.size() == 1) model.set_recompute(modes[0]);
  else
    for (int l = 0; l < cfg.n_layer; ++l) model.set_recompute(l, modes[l]);
  model.zero_grad();
  Result r{model.forward(tokens, &targets), {}};
  model.backward();
  r.grads = all_grads(model);
  return r;
}

}  // namespace

// Recomputing is computing the same thing again: the loss and every gradient are bit-identical to keeping
// the activations, for each mode, with either attention and with bf16 parameters (whose fp32 unit copy the
// re-run reads again) or bf16 matmuls (whose operands it rounds again), and with a different mode per block.
TEST(Recompute, GradientsAreBitIdenticalInEveryMode) {
  const GPTConfig cfg = GPTConfig::preset("demo");  // L=4: enough blocks to mix modes
  const int B = 2, T = 48;
  const Tensor tokens = random_tokens(B, T, cfg.vocab_size, 3), targets = random_tokens(B, T, cfg.vocab_size, 4);
  for (const PrecisionPolicy& policy :
       {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed(), PrecisionPolicy::bf16_compute()}) {
    for (AttentionImpl attention : {AttentionImpl::Materialized, AttentionImpl::Flash}) {
      const Result base = step(cfg, policy, attention, {Recompute::None}, tokens, targets);
      const std::vector<std::vector<Recompute>> cases = {
          {Recompute::Selective},
          {Recompute::Full},
          {Recompute::Full, Recompute::None, Recompute::Selective, Recompute::Full}};
      for (const auto& modes : cases) {
        const Result r = step(cfg, policy, attention, modes, tokens, targets);
        std::string what = policy.name() + " " + scalelab::attention_impl_name(attention) + " recompute";
        for (Recompute m : modes) what += std::string(" ") + scalelab::recompute_name(m);
        EXPECT_EQ(std::memcmp(&r.loss, &base.loss, sizeof(float)), 0) << what << ": " << r.loss << " vs " << base.loss;
        EXPECT_EQ(first_difference(r.grads, base.grads), -1) << what << ": first differing gradient element";
      }
    }
  }
}

// A pipeline keeps several sets in flight and runs their backwards later, in any order; with Full
// recompute they all share the model's one working set. Two sets forwarded one after the other, then
// backwarded in reverse order, give the gradients that keeping everything gives.
TEST(Recompute, SeveralSetsInFlightShareTheWorkingSet) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  const int B = 2, T = 16;
  std::vector<float> grads[2];
  for (int run = 0; run < 2; ++run) {
    GPT2 model(cfg, PrecisionPolicy::fp32(), Device::CPU, 5);
    model.set_recompute(run == 0 ? Recompute::None : Recompute::Full);
    model.zero_grad();
    GPT2Activations a = model.make_activations(B, T), b = model.make_activations(B, T);
    const Tensor ta = random_tokens(B, T, cfg.vocab_size, 1), ya = random_tokens(B, T, cfg.vocab_size, 2);
    const Tensor tb = random_tokens(B, T, cfg.vocab_size, 3), yb = random_tokens(B, T, cfg.vocab_size, 4);
    model.forward(a, ta, &ya);
    model.forward(b, tb, &yb);
    model.backward(b, nullptr, nullptr);
    model.backward(a, nullptr, nullptr);
    grads[run] = all_grads(model);
  }
  EXPECT_EQ(first_difference(grads[1], grads[0]), -1);
}

// What each mode keeps, counted by the allocator, is exactly the estimator's formula (docs/memory.md
// "Activation recompute"), after the forward and after the backward; and the ordering the lesson
// promises holds: full < selective < none once T is large enough that the scores dominate.
TEST(Recompute, ActivationBytesEqualTheFormulaInEveryMode) {
  struct Case {
    const char* preset;
    int B, T;
  };
  for (const Case& c : {Case{"tiny", 3, 16}, Case{"demo", 2, 64}}) {
    const GPTConfig cfg = GPTConfig::preset(c.preset);
    const Tensor tokens = random_tokens(c.B, c.T, cfg.vocab_size, 8),
                 targets = random_tokens(c.B, c.T, cfg.vocab_size, 9);
    int64_t bytes[3];
    for (int m = 0; m < 3; ++m) {
      const int64_t before = activations_now();
      {
        GPT2 model(cfg, PrecisionPolicy::fp32(), Device::CPU, 1);
        model.set_recompute(kModes[m]);
        model.forward(tokens, &targets);
        bytes[m] = activations_now() - before;
        const int64_t want = scalelab::gpt2_activation_bytes(cfg, c.B, c.T, kModes[m]);
        EXPECT_EQ(bytes[m], want) << c.preset << " recompute " << scalelab::recompute_name(kModes[m]);
        model.zero_grad();
        model.backward();
        EXPECT_EQ(activations_now() - before, want) << c.preset << " after backward";
      }
      EXPECT_EQ(activations_now(), before);
    }
    std::printf("  [recompute] %s B=%d T=%d activations: none %lld, selective %lld, full %lld bytes\n", c.preset, c.B,
                c.T, static_cast<long long>(bytes[0]), static_cast<long long>(bytes[1]),
                static_cast<long long>(bytes[2]));
    EXPECT_LT(bytes[1], bytes[0]);
    EXPECT_LT(bytes[2], bytes[1]);
  }
  // Korthikanti et al. 2022 Table 2 at d12, s = 1024, b = 4: 34 sbh per layer selective, 2 sbh full
  const GPTConfig d12 = GPTConfig::preset("d12");
  const int64_t sbh = 1024LL * 4 * 768;
  EXPECT_EQ(scalelab::korthikanti_activation_bytes(d12, 4, 1024, Recompute::Selective), 12 * 34 * sbh);
  EXPECT_EQ(scalelab::korthikanti_activation_bytes(d12, 4, 1024, Recompute::Full), 12 * 2 * sbh);
}

// The re-run inside the backward calls no hooks: DDP, FSDP and probes see exactly the sequence they see
// without recompute (an FSDP hook gathering a unit twice, or a DDP hook firing in the wrong phase, would
// break them).
TEST(Recompute, HooksFireAsWithoutRecompute) {
  std::vector<std::string> seen[2];
  for (int run = 0; run < 2; ++run) {
    GPT2 model(GPTConfig::preset("tiny"));
    model.set_recompute(run == 0 ? Recompute::None : Recompute::Full);
    std::vector<scalelab::HookHandle> hooks;
    for (const scalelab::HookPoint p : {scalelab::HookPoint::BeforeForward, scalelab::HookPoint::AfterForward,
                                        scalelab::HookPoint::BeforeBackward, scalelab::HookPoint::AfterBackward})
      hooks.push_back(model.add_hook(p, [&, p, run](const scalelab::UnitHookArgs& a) {
        seen[run].push_back(std::string(scalelab::hook_point_name(p)) + " " + std::to_string(a.unit));
      }));
    const Tensor tokens = random_tokens(2, 8, 64, 1), targets = random_tokens(2, 8, 64, 2);
    model.forward(tokens, &targets);
    model.backward();
  }
  EXPECT_EQ(seen[1], seen[0]);
}

// A set made before set_recompute keeps what the old mode kept: forward refuses it with a hint; the names
// round-trip and an unknown one says which are accepted; a block outside the shard is refused.
TEST(Recompute, MisuseIsRefusedWithAHint) {
  GPT2 model(GPTConfig::preset("tiny"));
  GPT2Activations old = model.make_activations(2, 8);
  model.set_recompute(Recompute::Full);
  const Tensor tokens = random_tokens(2, 8, 64, 1);
  const std::string stale = error_message([&] { model.forward(old, tokens, nullptr); });
  EXPECT_TRUE(contains(stale, "make_activations") && contains(stale, "'none'") && contains(stale, "'full'")) << stale;
  for (Recompute m : kModes) EXPECT_EQ(scalelab::recompute_from_name(scalelab::recompute_name(m)), m);
  const std::string unknown = error_message([] { scalelab::recompute_from_name("some"); });
  EXPECT_TRUE(contains(unknown, "'some'") && contains(unknown, "selective") && contains(unknown, "full")) << unknown;
  scalelab::ModelShard second_half;
  second_half.first_layer = 1;
  second_half.has_embedding = false;
  GPT2 stage(GPTConfig::preset("tiny"), second_half);
  const std::string outside = error_message([&] { stage.set_recompute(0, Recompute::Full); });
  EXPECT_TRUE(contains(outside, "layer 0")) << outside;
  EXPECT_EQ(stage.recompute(1), Recompute::None);
}
