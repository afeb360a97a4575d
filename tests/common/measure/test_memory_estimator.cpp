// test_memory_estimator.cpp — the memory estimator (scalelab/measure/memory_estimator.h,
// common/src/measure/memory_estimator.cpp): the ZeRO paper's formulas and its Psi = 7.5e9, N = 64 example, the
// exact lab 04 layout (padding, root units, gathers and reduce-scatters in flight) against hand counts
// and against the paper formula where they must agree, the activation bytes against the counting
// allocator after a real forward, and the 7B FAQ.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "megatron_split.h"                     // defines: test::megatron_split (a tp shard's split rule)
#include "scalelab/core/allocator.h"            // defines: Allocator, MemCategory
#include "scalelab/core/error.h"                // defines: Error
#include "scalelab/model/gpt2.h"                // defines: GPT2, GPTConfig, gpt2_unit_numel, gpt2_num_params
#include "scalelab/measure/memory_estimator.h"  // defines: zero_model_state_bytes, estimate_memory, ...
#include "scalelab/core/precision.h"            // defines: PrecisionPolicy

namespace {

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::GPTConfig;
using scalelab::MemCategory;
using scalelab::MemoryEstimate;
using scalelab::ModelStateBytes;
using scalelab::PrecisionPolicy;
using scalelab::Tensor;
using Kind = scalelab::OptimizerConfig::Kind;

constexpr Kind kAdamW = Kind::AdamW;

// The paper prints GB (1e9 bytes) with one decimal.
double gb_rounded(int64_t bytes) { return std::round(static_cast<double>(bytes) / 1e8) / 10.0; }

int64_t activations_now() {
  return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(MemCategory::Activations)];
}

TEST(MemoryEstimator, OptimizerBytesPerParamK) {
  EXPECT_EQ(scalelab::optimizer_bytes_per_param(scalelab::zero_paper_policy(), kAdamW), 12);
  EXPECT_EQ(scalelab::optimizer_bytes_per_param(PrecisionPolicy::bf16_mixed(), kAdamW), 12);
  EXPECT_EQ(scalelab::optimizer_bytes_per_param(PrecisionPolicy::fp32(), kAdamW), 8);
  EXPECT_EQ(scalelab::optimizer_bytes_per_param(PrecisionPolicy::fp32(), Kind::SGD), 0);
  EXPECT_EQ(scalelab::optimizer_bytes_per_param(PrecisionPolicy::bf16_mixed(), Kind::SGD), 4);
}

// ZeRO Fig. 1: 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N, 16 Psi/N (bytes), checked exactly where
// Psi is a multiple of N.
TEST(MemoryEstimator, PaperFormulasMixedPrecisionAdam) {
  const PrecisionPolicy p = scalelab::zero_paper_policy();
  for (int N : {1, 2, 8, 64}) {
    const double psi = 1e6 * 64;
    const int64_t P = static_cast<int64_t>(psi);
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 0, p, kAdamW).total(), 16 * P) << "N=" << N;
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 1, p, kAdamW).total(), 4 * P + 12 * P / N) << "N=" << N;
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 2, p, kAdamW).total(), 2 * P + 14 * P / N) << "N=" << N;
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 3, p, kAdamW).total(), 16 * P / N) << "N=" << N;
    const ModelStateBytes s1 = scalelab::zero_model_state_bytes(psi, N, 1, p, kAdamW);
    EXPECT_EQ(s1.params, 2 * P);
    EXPECT_EQ(s1.grads, 2 * P);
    EXPECT_EQ(s1.optimizer_state, 12 * P / N);
  }
}

// The paper's example (Sec. 5 / Fig. 1): Psi = 7.5e9, N = 64 -> 120, 31.4, 16.6, 1.9 GB.
TEST(MemoryEstimator, PaperExample7p5BOn64Devices) {
  const PrecisionPolicy p = scalelab::zero_paper_policy();
  const double want[4] = {120.0, 31.4, 16.6, 1.9};
  const int64_t exact[4] = {120000000000LL, 31406250000LL, 16640625000LL, 1875000000LL};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t b = scalelab::zero_model_state_bytes(7.5e9, 64, stage, p, kAdamW).total();
    EXPECT_EQ(b, exact[stage]) << "stage " << stage;
    EXPECT_DOUBLE_EQ(gb_rounded(b), want[stage]) << "stage " << stage;
  }
  const std::string table = scalelab::format_zero_table(7.5e9, {64}, {0, 1, 2, 3}, p, kAdamW);
  for (const char* s : {"120.0", "31.4", "16.6", "1.9", "16 Psi/N", "4 Psi + 12 Psi/N"})
    EXPECT_NE(table.find(s), std::string::npos) << s << " not in\n" << table;
}

// All fp32 with AdamW: K = 8 (m, v), no master copy: 16 Psi, 8 Psi + 8 Psi/N, 4 Psi + 12 Psi/N, 16 Psi/N.
TEST(MemoryEstimator, PaperFormulasFp32Adam) {
  const PrecisionPolicy p = PrecisionPolicy::fp32();
  const double psi = 1e6 * 64;
  const int64_t P = static_cast<int64_t>(psi);
  for (int N : {1, 4, 64}) {
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 0, p, kAdamW).total(), 16 * P);
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 1, p, kAdamW).total(), 8 * P + 8 * P / N);
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 2, p, kAdamW).total(), 4 * P + 12 * P / N);
    EXPECT_EQ(scalelab::zero_model_state_bytes(psi, N, 3, p, kAdamW).total(), 16 * P / N);
  }
}

// tiny's units (1280, 3280, 3280, 32 elements) divide by N = 1..16 (powers of two): no padding, so the
// persistent state of stages 0..2 is exactly the paper's, and stage 3 differs only by the root units
// (embeddings and ln_f) kept whole.
TEST(MemoryEstimator, ExactEqualsPaperWhenUnitsDivideN) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  const std::vector<int64_t> n = scalelab::gpt2_unit_numel(cfg);
  const double psi = static_cast<double>(scalelab::gpt2_num_params(cfg));
  const int L = cfg.n_layer;
  for (const PrecisionPolicy& p : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed()}) {
    for (int N : {1, 2, 4, 8, 16}) {
      for (int64_t nu : n) ASSERT_EQ(nu % N, 0) << "unit of " << nu << " elements, N=" << N;
      for (int stage = 0; stage <= 2; ++stage) {
        const MemoryEstimate e = scalelab::estimate_memory(cfg, N, stage, p, kAdamW, 1, 0, 0);
        const ModelStateBytes z = scalelab::zero_model_state_bytes(psi, N, stage, p, kAdamW);
        EXPECT_EQ(e.persistent.params, z.params) << p.name() << " N=" << N << " stage " << stage;
        EXPECT_EQ(e.persistent.grads, z.grads) << p.name() << " N=" << N << " stage " << stage;
        EXPECT_EQ(e.persistent.optimizer_state, z.optimizer_state) << p.name() << " N=" << N << " stage " << stage;
      }
      const MemoryEstimate e3 = scalelab::estimate_memory(cfg, N, 3, p, kAdamW, 1, 0, 0);
      const ModelStateBytes z3 = scalelab::zero_model_state_bytes(psi, N, 3, p, kAdamW);
      const int64_t Bp = static_cast<int64_t>(scalelab::dtype_size(p.param_dtype));
      const int64_t root = n[0] + n[L + 1];
      EXPECT_EQ(e3.persistent.params, z3.params + root * Bp - root * Bp / N) << p.name() << " N=" << N;
      EXPECT_EQ(e3.persistent.grads, z3.grads);
      EXPECT_EQ(e3.persistent.optimizer_state, z3.optimizer_state);
    }
  }
}

// A config with units of 60, 365 and 10 elements (C=5, V=8, maxT=4, L=1) on 4 ranks: shards 15, 92, 3,
// padded 60, 368, 12. Every number counted by hand.
TEST(MemoryEstimator, PaddingAndPeaksCountedByHand) {
  GPTConfig cfg;
  cfg.max_seq_len = 4;
  cfg.vocab_size = 8;
  cfg.n_layer = 1;
  cfg.n_head = 1;
  cfg.n_embd = 5;
  ASSERT_EQ(scalelab::gpt2_unit_numel(cfg), (std::vector<int64_t>{60, 365, 10}));
  const PrecisionPolicy p = PrecisionPolicy::fp32();  // Bp = Bg = 4, K = 8
  // stage 2: params whole (padded), grads and optimizer sharded
  const MemoryEstimate e2 = scalelab::estimate_memory(cfg, 4, 2, p, kAdamW, 1, 0, 0);
  EXPECT_EQ(e2.persistent.params, 4 * (60 + 368 + 12));
  EXPECT_EQ(e2.persistent.grads, 4 * (15 + 92 + 3));
  EXPECT_EQ(e2.persistent.optimizer_state, 8 * (15 + 92 + 3));
  EXPECT_EQ(e2.peak.params, e2.persistent.params);
  // full grads alive: unit 0 (60) + max(P_ln_f = 12, P_1 + P_ln_f = 380)
  EXPECT_EQ(e2.peak.grads, 4 * (15 + 92 + 3) + 4 * (60 + 380));
  EXPECT_EQ(e2.peak.optimizer_state, e2.persistent.optimizer_state);
  // stage 3: units 0 and ln_f whole, the block sharded; one block gathered (min(1 + prefetch, L) = 1)
  const MemoryEstimate e3 = scalelab::estimate_memory(cfg, 4, 3, p, kAdamW, 1, 0, 0);
  EXPECT_EQ(e3.persistent.params, 4 * (60 + 92 + 12));
  EXPECT_EQ(e3.peak.params, 4 * (60 + 92 + 12) + 4 * 368);
  EXPECT_EQ(e3.peak.grads, e2.peak.grads);
  // stage 1: grads whole (padded); stage 0: nothing sharded, no padding
  const MemoryEstimate e1 = scalelab::estimate_memory(cfg, 4, 1, p, kAdamW, 1, 0, 0);
  EXPECT_EQ(e1.persistent.grads, 4 * (60 + 368 + 12));
  EXPECT_EQ(e1.peak.grads, e1.persistent.grads);
  EXPECT_EQ(e1.persistent.optimizer_state, 8 * (15 + 92 + 3));
  const MemoryEstimate e0 = scalelab::estimate_memory(cfg, 4, 0, p, kAdamW, 1, 0, 0);
  EXPECT_EQ(e0.persistent.params, 4 * 435);
  EXPECT_EQ(e0.persistent.grads, 4 * 435);
  EXPECT_EQ(e0.persistent.optimizer_state, 8 * 435);
  EXPECT_EQ(e0.peak.total(), e0.persistent.total());
}

// ZeRO-3 gathers: min(1 + prefetch, L) copies of the largest block; grads in flight W.
TEST(MemoryEstimator, Stage3PrefetchAddsGatheredBlocksUpToL) {
  const GPTConfig cfg = GPTConfig::preset("tiny");  // L = 2, blocks 3280 elements, divide N = 4
  const PrecisionPolicy p = PrecisionPolicy::bf16_mixed();
  const MemoryEstimate base = scalelab::estimate_memory(cfg, 4, 3, p, kAdamW, 0, 0, 0);
  EXPECT_EQ(base.peak.params - base.persistent.params, 1 * 3280 * 2);
  EXPECT_EQ(scalelab::estimate_memory(cfg, 4, 3, p, kAdamW, 1, 0, 0).peak.params - base.persistent.params,
            2 * 3280 * 2);
  EXPECT_EQ(scalelab::estimate_memory(cfg, 4, 3, p, kAdamW, 5, 0, 0).peak.params - base.persistent.params,
            2 * 3280 * 2);
  // grads: unit 0 (1280) + two blocks (3280 + 3280), fp32
  EXPECT_EQ(base.peak.grads - base.persistent.grads, 4 * (1280 + 2 * 3280));
}

// More ranks never cost more memory per rank at any stage (powers of two while the padding, at most
// N-1 elements per unit, stays small next to the sharded savings), and stage s+1 never costs more than
// stage s.
TEST(MemoryEstimator, MonotoneInWorldSizeAndStage) {
  struct Case {
    const char* preset;
    int max_N;
  };
  for (const Case& c : {Case{"demo", 512}, Case{"d12", 1024}, Case{"d24", 1024}}) {
    const char* name = c.preset;
    const GPTConfig cfg = GPTConfig::preset(name);
    for (const PrecisionPolicy& p : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed()}) {
      for (int stage = 0; stage <= 3; ++stage) {
        MemoryEstimate prev = scalelab::estimate_memory(cfg, 1, stage, p, kAdamW, 1, 2, 64);
        for (int N = 2; N <= c.max_N; N *= 2) {
          const MemoryEstimate e = scalelab::estimate_memory(cfg, N, stage, p, kAdamW, 1, 2, 64);
          EXPECT_LE(e.persistent.total(), prev.persistent.total()) << name << " stage " << stage << " N=" << N;
          EXPECT_LE(e.total_peak_bytes(), prev.total_peak_bytes()) << name << " stage " << stage << " N=" << N;
          if (stage > 0) {
            EXPECT_LT(e.persistent.total(), prev.persistent.total()) << name << " N=" << N;
          }
          prev = e;
        }
      }
      for (int N : {2, 8, 64}) {
        for (int stage = 1; stage <= 3; ++stage) {
          const MemoryEstimate lo = scalelab::estimate_memory(cfg, N, stage - 1, p, kAdamW, 1, 2, 64);
          const MemoryEstimate hi = scalelab::estimate_memory(cfg, N, stage, p, kAdamW, 1, 2, 64);
          EXPECT_LE(hi.persistent.total(), lo.persistent.total()) << name << " N=" << N << " stage " << stage;
        }
      }
    }
  }
}

// Padding is real memory: demo's blocks (444,864 elements = 2^6 * 6951) pad to a multiple of N, and at
// N = 1024 stage 1's padded params and grads grow by more than the sharded optimizer state saves.
TEST(MemoryEstimator, PaddingOutgrowsSavingsForASmallModelOnManyRanks) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const PrecisionPolicy p = PrecisionPolicy::fp32();
  const MemoryEstimate at512 = scalelab::estimate_memory(cfg, 512, 1, p, kAdamW, 1, 0, 0);
  const MemoryEstimate at1024 = scalelab::estimate_memory(cfg, 1024, 1, p, kAdamW, 1, 0, 0);
  EXPECT_GT(at1024.persistent.total(), at512.persistent.total());
}

// The activation count equals what the counting allocator holds after a real forward (and backward,
// which reuses logits as dlogits and allocates no more activations): exact bytes.
TEST(MemoryEstimator, ActivationsEqualAllocatorAfterForwardBackward) {
  struct Case {
    const char* preset;
    int B, T;
    PrecisionPolicy policy;
  };
  for (const Case& c :
       {Case{"tiny", 2, 16, PrecisionPolicy::fp32()}, Case{"tiny", 3, 7, PrecisionPolicy::bf16_mixed()},
        Case{"demo", 2, 32, PrecisionPolicy::fp32()}, Case{"demo", 1, 64, PrecisionPolicy::bf16_mixed()}}) {
    const GPTConfig cfg = GPTConfig::preset(c.preset);
    const int64_t before = activations_now();
    {
      GPT2 model(cfg, c.policy, Device::CPU, /*seed=*/1);
      Tensor tokens = Tensor::empty({c.B, c.T}, DType::I32), targets = Tensor::empty({c.B, c.T}, DType::I32);
      std::mt19937 gen(7);
      for (int64_t i = 0; i < tokens.numel(); ++i) {
        tokens.data<int32_t>()[i] = static_cast<int32_t>(gen() % cfg.vocab_size);
        targets.data<int32_t>()[i] = static_cast<int32_t>(gen() % cfg.vocab_size);
      }
      model.forward(tokens, &targets);
      const int64_t want = scalelab::gpt2_activation_bytes(cfg, c.B, c.T);
      EXPECT_EQ(activations_now() - before, want) << c.preset << " B=" << c.B << " T=" << c.T;
      model.zero_grad();
      model.backward();
      EXPECT_EQ(activations_now() - before, want) << c.preset << " after backward";
      EXPECT_EQ(scalelab::estimate_memory(cfg, 2, 1, c.policy, kAdamW, 1, c.B, c.T).activations_bytes, want);
    }
    EXPECT_EQ(activations_now(), before);
  }
}

// One model of a parallel layout (a tensor-parallel slice, sequence parallel, a pipeline stage) holding several
// activation sets at once, with recompute and either attention: the formula equals the allocator's count after
// that many make_activations, to the byte (no forward is needed: a set is allocated whole when it is made).
TEST(MemoryEstimator, ShardActivationsWithSetsInFlightEqualTheAllocator) {
  using scalelab::AttentionImpl;
  using scalelab::ModelShard;
  using scalelab::Recompute;
  const GPTConfig cfg = GPTConfig::preset("demo");  // L=4, NH=4, C=192, V=256
  const auto shard = &scalelab::test::megatron_shard;
  const std::vector<ModelShard> shards = {
      ModelShard::dense(),
      shard(1, 2, false, 0, -1, true, true),   // tp 2
      shard(0, 4, true, 0, -1, true, true),    // tp 4, sequence parallel
      shard(0, 1, false, 0, 1, true, false),   // pp: the first of two stages
      shard(0, 1, false, 1, 2, false, false),  // a middle stage
      shard(1, 2, true, 2, 3, false, true),    // the last stage of tp 2 x pp 2, sequence parallel
  };
  const int B = 2, T = 32;
  for (const ModelShard& sh : shards) {
    for (AttentionImpl attention : {AttentionImpl::Materialized, AttentionImpl::Flash}) {
      for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        for (int sets : {1, 3}) {
          const int64_t before = activations_now();
          {
            GPT2 model(cfg, sh, PrecisionPolicy::fp32(), Device::CPU, 1);
            model.set_attention(attention);
            model.set_recompute(r);
            std::vector<scalelab::GPT2Activations> in_flight;
            for (int i = 0; i < sets; ++i) in_flight.push_back(model.make_activations(B, T));
            EXPECT_EQ(activations_now() - before, scalelab::gpt2_activation_bytes(cfg, sh, B, T, sets, r, attention))
                << sh.str() << ", " << scalelab::attention_impl_name(attention) << ", recompute "
                << scalelab::recompute_name(r) << ", " << sets << " sets";
          }
          EXPECT_EQ(activations_now(), before);
        }
      }
    }
  }
  EXPECT_THROW(scalelab::gpt2_activation_bytes(cfg, ModelShard::dense(), B, T, 0, Recompute::None,
                                               AttentionImpl::Materialized),
               scalelab::Error);
}

// Korthikanti et al. 2022 Sec. 4.1: s*b*h*(34 + 5*a*s/h) bytes per layer, L layers.
TEST(MemoryEstimator, KorthikantiFormula) {
  const GPTConfig cfg = GPTConfig::preset("d12");  // h = 768, a = 12, L = 12
  const double s = 1024, b = 4, h = 768, a = 12;
  const double want = 12 * s * b * h * (34 + 5 * a * s / h);
  EXPECT_EQ(scalelab::korthikanti_activation_bytes(cfg, 4, 1024), static_cast<int64_t>(want));
  // this kit stores more: fp32 and the logits/probs and scratch
  EXPECT_GT(scalelab::gpt2_activation_bytes(cfg, 4, 1024), scalelab::korthikanti_activation_bytes(cfg, 4, 1024));
}

// The FAQ: a 7B model (Psi = 7e9) with AdamW on 80 GB devices.
TEST(MemoryEstimator, MinDevicesFor7BOn80GB) {
  const double psi = 7e9, dev = 80e9;
  // this kit's mixed precision: bf16 params 2 + fp32 grads 4 + K 12 = 18 bytes/param (126 GB unsharded)
  const PrecisionPolicy kit = PrecisionPolicy::bf16_mixed();
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 0, kit, kAdamW, dev), -1);  // 126 GB
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 1, kit, kAdamW, dev), 4);   // 42 + 84/N: N=2 is 84 GB
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 2, kit, kAdamW, dev), 2);   // 14 + 112/2 = 70 GB
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 3, kit, kAdamW, dev), 2);   // 126/2 = 63 GB
  // the paper's 16-bit grads (16 bytes/param, 112 GB unsharded)
  const PrecisionPolicy paper = scalelab::zero_paper_policy();
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 0, paper, kAdamW, dev), -1);
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 1, paper, kAdamW, dev), 2);  // 28 + 42 = 70 GB
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 2, paper, kAdamW, dev), 2);
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 3, paper, kAdamW, dev), 2);
  // with 20 GB of activations per rank ZeRO-3 needs 126/N + 20 <= 80: N = 4
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 3, kit, kAdamW, dev, int64_t{20000000000}), 4);
  EXPECT_EQ(scalelab::min_devices_to_fit(psi, 3, kit, kAdamW, 1e9, 0, 64), -1);  // 126/64 > 1 GB
}

// The exact variant returns the first power of two that fits: it fits there and not at half of it.
TEST(MemoryEstimator, MinDevicesExactIsFirstFit) {
  const GPTConfig cfg = GPTConfig::preset("d24");
  const PrecisionPolicy p = PrecisionPolicy::bf16_mixed();
  const double dev = 3e9;  // bytes, a small simulated device (d24 in bf16 mixed holds 5.4 GB of state)
  for (int stage = 0; stage <= 3; ++stage) {
    const int N = scalelab::min_devices_to_fit(cfg, stage, p, kAdamW, 1, 1, 128, dev);
    if (stage == 0) {
      EXPECT_EQ(N, -1);  // 5.4 GB of state unsharded
      continue;
    }
    ASSERT_GT(N, 1) << "stage " << stage;
    EXPECT_LE(scalelab::estimate_memory(cfg, N, stage, p, kAdamW, 1, 1, 128).total_peak_bytes(), dev);
    EXPECT_GT(scalelab::estimate_memory(cfg, N / 2, stage, p, kAdamW, 1, 1, 128).total_peak_bytes(), dev);
  }
}

TEST(MemoryEstimator, BadArgumentsThrow) {
  const GPTConfig cfg = GPTConfig::preset("tiny");
  const PrecisionPolicy p = PrecisionPolicy::fp32();
  EXPECT_THROW(scalelab::zero_model_state_bytes(1e6, 4, 4, p, kAdamW), scalelab::Error);
  EXPECT_THROW(scalelab::zero_model_state_bytes(1e6, 4, -1, p, kAdamW), scalelab::Error);
  EXPECT_THROW(scalelab::zero_model_state_bytes(1e6, 0, 1, p, kAdamW), scalelab::Error);
  EXPECT_THROW(scalelab::estimate_memory(cfg, 0, 1, p, kAdamW, 1, 1, 8), scalelab::Error);
  EXPECT_THROW(scalelab::estimate_memory(cfg, 2, 1, p, kAdamW, -1, 1, 8), scalelab::Error);
  try {
    scalelab::estimate_memory(cfg, 2, 7, p, kAdamW, 1, 1, 8);
    ADD_FAILURE() << "stage 7 accepted";
  } catch (const scalelab::Error& e) {
    EXPECT_NE(std::string(e.what()).find("P_os"), std::string::npos) << e.what();  // the hint names the stages
  }
}

TEST(MemoryEstimator, TablesPrintEveryRow) {
  const GPTConfig cfg = GPTConfig::preset("d24");
  const std::string t =
      scalelab::format_memory_table(cfg, {1, 2, 4, 8}, {0, 1, 2, 3}, PrecisionPolicy::bf16_mixed(), kAdamW, 1, 4, 1024);
  for (const char* s : {"0 DDP", "1 P_os", "2 P_os+g", "3 P_os+g+p", "GiB", "Korthikanti"})
    EXPECT_NE(t.find(s), std::string::npos) << s << " not in\n" << t;
  const std::string f = scalelab::format_fit_table(7e9, {0, 1, 2, 3}, PrecisionPolicy::bf16_mixed(), kAdamW, 80e9);
  EXPECT_NE(f.find("never"), std::string::npos) << f;
}

// Lab 04 part 3 (--offload optimizer): the device keeps no optimizer state, everything else unchanged; the
// host keeps, per element of this rank's shards, the fp32 master and AdamW's m and v (12 bytes), the fp32
// gradient copied down (4) and, under bf16, the rounded parameters going up (2).
TEST(MemoryEstimator, OffloadMovesTheOptimizerStateToTheHost) {
  const GPTConfig cfg{32, 256, 8, 4, 64};  // maxT, V, L, NH, C
  for (const int stage : {1, 2, 3}) {
    for (const PrecisionPolicy& p : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed()}) {
      const MemoryEstimate on = scalelab::estimate_memory(cfg, 2, stage, p, kAdamW, 1, 0, 0);
      const MemoryEstimate off =
          scalelab::estimate_memory(cfg, 2, stage, p, kAdamW, 1, 0, 0, scalelab::Recompute::None, true);
      int64_t shard_elems = 0;  // sum over units of ceil(n_u / 2)
      for (const int64_t n : scalelab::gpt2_unit_numel(cfg)) shard_elems += (n + 1) / 2;
      EXPECT_EQ(on.host.total(), 0);
      EXPECT_EQ(off.persistent.optimizer_state, 0);
      EXPECT_EQ(off.peak.optimizer_state, 0);
      EXPECT_EQ(off.peak.params, on.peak.params);
      EXPECT_EQ(off.peak.grads, on.peak.grads);
      EXPECT_EQ(on.peak.total() - off.peak.total(), shard_elems * scalelab::optimizer_bytes_per_param(p, kAdamW));
      EXPECT_EQ(off.host.optimizer_state, shard_elems * 12);
      EXPECT_EQ(off.host.grads, shard_elems * 4);
      EXPECT_EQ(off.host.params, p.param_dtype == DType::F32 ? 0 : shard_elems * 2);
      const ModelStateBytes sgd = scalelab::offload_host_bytes(cfg, 2, stage, p, Kind::SGD);
      EXPECT_EQ(sgd.optimizer_state, shard_elems * 4);  // the master only
    }
  }
}

}  // namespace
