// test_gpt2.cpp — the GPT-2 model's contracts (scalelab/model/gpt2.h, common/src/model/gpt2.cpp) that the labs
// build on: the parameter table (units, offsets, counts), the hook order, memory by category, errors
// of misuse, seeded initialisation, the loss at init, a finite-difference check of the whole model's
// gradient, and run-to-run determinism with 2 threads. The numbers themselves are checked against
// PyTorch in tests/common/model/test_gpt2_fixture.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/bf16.h"       // defines: bf16, round_to_bf16, bf16_to_float
#include "scalelab/core/error.h"      // defines: Error
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig, ParamInfo, gpt2_param_table, gpt2_num_params
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/model/sample.h"    // defines: sample_text
#include "scalelab/core/threads.h"    // defines: set_num_threads, num_threads

namespace {

using scalelab::test::contains;
using scalelab::test::error_message;

using scalelab::Allocator;
using scalelab::Device;
using scalelab::DType;
using scalelab::GPT2;
using scalelab::HookHandle;
using scalelab::HookOrder;
using scalelab::HookPoint;
using scalelab::UnitHookArgs;
using scalelab::hook_point_name;
using scalelab::GPTConfig;
using scalelab::MemCategory;
using scalelab::ParamInfo;
using scalelab::PrecisionPolicy;
using scalelab::Tensor;

GPTConfig tiny() { return GPTConfig::preset("tiny"); }  // maxT=16, V=64, L=2, NH=2, C=16: 7872 params

// (B,T) i32 tokens uniform in [0, V) from a fixed seed (mt19937's sequence is fixed by the standard).
Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

int64_t current_bytes(MemCategory c) { return Allocator::get(Device::CPU).stats().current_bytes[static_cast<int>(c)]; }

// All values of one tensor as double (fp32 or bf16 storage).
std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[i] = t.dtype() == DType::F32 ? t.data<float>()[i] : scalelab::bf16_to_float(t.data<scalelab::bf16>()[i]);
  return v;
}

double mean_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0.0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

// Mean cross-entropy (nats) of the model on (tokens, targets), computed HERE in double from the fp32
// logits of a forward without targets. The model's own loss is a float; in double the only noise
// left is the fp32 rounding inside the network (see the finite-difference test).
double loss_in_double(GPT2& model, const Tensor& tokens, const Tensor& targets) {
  model.forward(tokens, nullptr);
  const Tensor& logits = model.logits();  // (B,T,V)
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  const float* z = logits.data<float>();
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    double zmax = z[n * V];
    for (int64_t v = 1; v < V; ++v) zmax = std::max(zmax, static_cast<double>(z[n * V + v]));
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[n * V + v] - zmax);
    total += zmax + std::log(sum) - z[n * V + targets.data<int32_t>()[n]];
  }
  return total / static_cast<double>(N);
}

// All gradients, flattened unit after unit.
std::vector<float> all_grads(GPT2& model) {
  std::vector<float> out;
  for (int u = 0; u < model.num_units(); ++u) {
    const float* p = model.unit_grads(u).data<float>();
    out.insert(out.end(), p, p + model.unit_grads(u).numel());
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parameter table

TEST(Gpt2ParamTable, NamesAreUniqueAndEachUnitIsCoveredContiguously) {
  for (const char* preset : {"tiny", "d12"}) {
    const GPTConfig cfg = GPTConfig::preset(preset);
    const std::vector<ParamInfo> table = scalelab::gpt2_param_table(cfg);
    std::set<std::string> names;
    for (const ParamInfo& p : table) EXPECT_TRUE(names.insert(p.name).second) << preset << ": duplicate " << p.name;
    // Units appear in order 0..L+1; inside a unit each parameter starts where the previous one ended.
    std::vector<int64_t> unit_end(cfg.n_layer + 2, 0);
    int last_unit = 0;
    for (const ParamInfo& p : table) {
      ASSERT_GE(p.unit, last_unit) << preset << ": " << p.name;
      ASSERT_LT(p.unit, cfg.n_layer + 2) << p.name;
      last_unit = p.unit;
      EXPECT_EQ(p.offset, unit_end[p.unit]) << preset << ": " << p.name << " leaves a gap or overlaps";
      EXPECT_EQ(p.numel, scalelab::numel_of(p.shape)) << p.name;
      unit_end[p.unit] = p.offset + p.numel;
    }
    EXPECT_EQ(last_unit, cfg.n_layer + 1) << preset;
    if (std::string(preset) == "tiny") {  // the model's unit buffers are exactly as long as the table says
      GPT2 model(cfg);
      for (int u = 0; u < model.num_units(); ++u) EXPECT_EQ(model.unit_params(u).numel(), unit_end[u]) << u;
    }
  }
}

// GPT-2 124M shapes with the byte vocabulary. Per block: ln_1 2C, c_attn 3C^2 + 3C, attn.c_proj C^2 + C,
// ln_2 2C, c_fc 4C^2 + 4C, mlp.c_proj 4C^2 + C: 12C^2 + 13C. Plus wte V*C, wpe maxT*C and ln_f 2C.
TEST(Gpt2ParamTable, D12CountMatchesTheHandCount) {
  GPTConfig cfg = GPTConfig::preset("d12");
  ASSERT_EQ(cfg.vocab_size, 256);
  const int64_t C = 768, V = 256, maxT = 1024, L = 12;
  const int64_t want = L * (12 * C * C + 13 * C) + V * C + maxT * C + 2 * C;
  EXPECT_EQ(want, 86039040);  // 85.05M in the blocks, 0.98M in the embeddings
  EXPECT_EQ(scalelab::gpt2_num_params(cfg), want);
  EXPECT_EQ(scalelab::gpt2_num_params(cfg, /*with_wpe=*/false), want - maxT * C);
}

// The parameter counts the presets' comments state (gpt2_layout.h GPTConfig::preset): with the byte
// vocabulary, and with GPT-2's 50,257-token vocabulary the sizes GPT-2 is known by, to the million.
TEST(Gpt2ParamTable, PresetCountsAreTheDocumentedOnes) {
  struct Want {
    const char* preset;
    int64_t params;       // V = 256
    int64_t gpt2_params;  // the same shapes with V = 50257, in millions (rounded); 0: no GPT-2 size claimed
  };
  const Want wants[] = {{"tiny", 7872, 0},       {"demo", 1878144, 0},    {"d12", 86039040, 124},
                        {"d24", 303622144, 355}, {"d36", 710028800, 774}, {"d48", 1477609600, 1558}};
  for (const Want& w : wants) {
    GPTConfig cfg = GPTConfig::preset(w.preset);
    EXPECT_EQ(scalelab::gpt2_num_params(cfg), w.params) << w.preset;
    if (w.gpt2_params == 0) continue;
    cfg.vocab_size = 50257;
    EXPECT_EQ(std::llround(static_cast<double>(scalelab::gpt2_num_params(cfg)) / 1e6), w.gpt2_params) << w.preset;
  }
}

// The lesson's sizes (gpt2_layout.h): GPT-2's 124M, 355M and 1558M with its own vocabulary, and the GPT-2-shaped
// 7B and 70B with Llama 2's C, L, NH and V. They keep their V in a lab program (has_own_vocabulary); the others
// take the tokenizer's.
TEST(Gpt2ParamTable, LessonSizePresetsHoldTheirKnownCounts) {
  const std::pair<const char*, int64_t> wants[] = {{"gpt2-124m", 124439808},
                                                   {"gpt2-350m", 354823168},
                                                   {"gpt2-1.5b", 1557611200},
                                                   {"gpt-7b", 6592012288},
                                                   {"gpt-70b", 64728743936}};
  for (const auto& [name, params] : wants) {
    EXPECT_TRUE(GPTConfig::is_preset(name)) << name;
    EXPECT_TRUE(GPTConfig::has_own_vocabulary(name)) << name;
    EXPECT_EQ(scalelab::gpt2_num_params(GPTConfig::preset(name)), params) << name;
  }
  EXPECT_FALSE(GPTConfig::has_own_vocabulary("d12"));
  EXPECT_FALSE(GPTConfig::is_preset("d13"));
  EXPECT_EQ(GPTConfig::preset_names().size(), 11u);
}

// ---------------------------------------------------------------------------------------------
// Hooks

// gpt2.h: forward runs units 0..L+1, backward L+1..0, each before_X just before after_X of the same
// unit, except that unit 0's backward encloses the others (the tied LM head runs first). A lab that
// overlaps communication with backward, or gathers and frees units (lab 04), relies on this sequence.
TEST(Gpt2Hooks, FireInTheDocumentedOrder) {
  GPT2 model(tiny());
  std::vector<std::string> seen;
  std::vector<HookHandle> hooks;
  for (const HookPoint p :
       {HookPoint::BeforeForward, HookPoint::AfterForward, HookPoint::BeforeBackward, HookPoint::AfterBackward})
    hooks.push_back(model.add_hook(p, [&, p](const UnitHookArgs& a) {
      seen.push_back(std::string(hook_point_name(p)) + " " + std::to_string(a.unit));
    }));
  const Tensor tokens = random_tokens(2, 8, 64, 1), targets = random_tokens(2, 8, 64, 2);
  model.zero_grad();
  model.forward(tokens, &targets);
  model.backward();
  std::vector<std::string> want;
  const int last = model.num_units() - 1;  // L+1 = 3
  for (int u = 0; u <= last; ++u) {
    want.push_back("before_forward " + std::to_string(u));
    want.push_back("after_forward " + std::to_string(u));
  }
  want.push_back("before_backward 0");  // the LM head, tied to wte, is unit 0's
  for (int u = last; u >= 1; --u) {
    want.push_back("before_backward " + std::to_string(u));
    want.push_back("after_backward " + std::to_string(u));
  }
  want.push_back("after_backward 0");
  EXPECT_EQ(seen, want);
}

// Hooks are lists: several at one point run in the order added (HookOrder::First in front); a handle
// removes exactly its own hook (others keep running), also when it is destroyed, and does nothing once
// the model is gone. What a lab composes (DDP over FSDP, a probe around both) relies on this.
TEST(Gpt2Hooks, ListsRunInOrderAndHandlesRemoveOnlyTheirOwn) {
  GPT2 model(tiny());
  std::vector<std::string> seen;
  auto record = [&](const char* who) {
    return [&seen, who](const UnitHookArgs& a) {
      if (a.unit == 0) seen.push_back(who);
    };
  };
  HookHandle a = model.add_hook(HookPoint::BeforeForward, record("a"));
  HookHandle b = model.add_hook(HookPoint::BeforeForward, record("b"));
  HookHandle first = model.add_hook(HookPoint::BeforeForward, record("first"), HookOrder::First);
  const Tensor tokens = random_tokens(2, 8, 64, 1);
  model.forward(tokens, nullptr);
  EXPECT_EQ(seen, (std::vector<std::string>{"first", "a", "b"}));
  EXPECT_EQ(model.num_hooks(HookPoint::BeforeForward), 3);

  seen.clear();
  a.remove();
  EXPECT_FALSE(a.active());
  EXPECT_TRUE(b.active());
  model.forward(tokens, nullptr);
  EXPECT_EQ(seen, (std::vector<std::string>{"first", "b"}));

  seen.clear();
  { HookHandle gone = std::move(first); }  // destroyed: removed
  HookHandle moved = std::move(b);         // moved: still installed, now owned by `moved`
  EXPECT_FALSE(b.active());
  model.forward(tokens, nullptr);
  EXPECT_EQ(seen, (std::vector<std::string>{"b"}));
  EXPECT_EQ(model.num_hooks(HookPoint::BeforeForward), 1);
  EXPECT_EQ(model.num_hooks(HookPoint::AfterBackward), 0);

  HookHandle outlives;
  {
    GPT2 other(tiny());
    outlives = other.add_hook(HookPoint::AfterForward, record("other"));
    EXPECT_TRUE(outlives.active());
  }
  EXPECT_FALSE(outlives.active());  // the model is gone: removing it now does nothing
  outlives.remove();
}

// A hook is called with the unit's own buffers and may install a new one (FSDP installs a gathered copy).
TEST(Gpt2Hooks, SeeTheUnitsBuffersAndMayInstallThem) {
  GPT2 model(tiny());
  int checked = 0;
  const HookHandle h = model.add_hook(HookPoint::BeforeForward, [&](const UnitHookArgs& a) {
    EXPECT_EQ(&a.params, &model.unit_params(a.unit));
    EXPECT_EQ(&a.grads, &model.unit_grads(a.unit));
    ++checked;
  });
  model.forward(random_tokens(2, 8, 64, 1), nullptr);
  EXPECT_EQ(checked, model.num_units());
}

// The LM head writes dwte before ln_f's backward, but dwpe and the token rows of dwte come from the
// embedding backward, last of all: at after_backward(L+1) unit 0's gradient is NOT complete yet.
TEST(Gpt2Hooks, UnitZeroGradientIsCompleteOnlyAtAfterBackwardZero) {
  GPT2 model(tiny());
  const int last = model.num_units() - 1;
  std::vector<float> dwte_early, dwpe_early;
  const HookHandle hook = model.add_hook(HookPoint::AfterBackward, [&](const UnitHookArgs& a) {
    if (a.unit != last) return;
    const Tensor dwte = model.grad("wte"), dwpe = model.grad("wpe");
    dwte_early.assign(dwte.data<float>(), dwte.data<float>() + dwte.numel());
    dwpe_early.assign(dwpe.data<float>(), dwpe.data<float>() + dwpe.numel());
  });
  const Tensor tokens = random_tokens(2, 8, 64, 3), targets = random_tokens(2, 8, 64, 4);
  model.zero_grad();
  model.forward(tokens, &targets);
  model.backward();
  ASSERT_FALSE(dwpe_early.empty()) << "after_backward(L+1) never fired";
  for (size_t i = 0; i < dwpe_early.size(); ++i) ASSERT_EQ(dwpe_early[i], 0.0f) << "dwpe[" << i << "] early";
  const Tensor dwte = model.grad("wte"), dwpe = model.grad("wpe");
  int64_t dwpe_nonzero = 0, dwte_changed = 0;
  for (int64_t i = 0; i < dwpe.numel(); ++i) dwpe_nonzero += dwpe.data<float>()[i] != 0.0f;
  for (int64_t i = 0; i < dwte.numel(); ++i) dwte_changed += dwte.data<float>()[i] != dwte_early[i];
  EXPECT_EQ(dwpe_nonzero, 8 * 16) << "rows t < T=8 of dwpe, all C=16 columns, are set by the end";
  EXPECT_GT(dwte_changed, 0) << "the embedding backward adds the token rows of dwte after ln_f's hook";
}

// ---------------------------------------------------------------------------------------------
// Memory

// P parameters: params are 4P bytes in fp32 and 2P in bf16 (the mixed policy's point), gradients 4P
// (always fp32). Initialisation's staging buffers are gone when the constructor returns.
TEST(Gpt2Memory, ParamsAndGradsBytesFollowThePrecisionPolicy) {
  struct Case {
    PrecisionPolicy policy;
    int64_t param_bytes_per_param;
  };
  for (const Case& c : {Case{PrecisionPolicy::fp32(), 4}, Case{PrecisionPolicy::bf16_mixed(), 2}}) {
    const int64_t params0 = current_bytes(MemCategory::Params), grads0 = current_bytes(MemCategory::Grads);
    const int64_t work0 = current_bytes(MemCategory::Workspace);
    {
      GPT2 model(tiny(), c.policy);
      const int64_t P = model.num_params();
      EXPECT_EQ(P, 7872);
      EXPECT_EQ(current_bytes(MemCategory::Params) - params0, c.param_bytes_per_param * P) << c.policy.name();
      EXPECT_EQ(current_bytes(MemCategory::Grads) - grads0, 4 * P) << c.policy.name();
      EXPECT_EQ(current_bytes(MemCategory::Workspace), work0) << c.policy.name();
    }
    EXPECT_EQ(current_bytes(MemCategory::Params), params0) << "freed with the model";
    EXPECT_EQ(current_bytes(MemCategory::Grads), grads0) << "freed with the model";
  }
}

// ---------------------------------------------------------------------------------------------
// Misuse errors

TEST(Gpt2Errors, BackwardWithoutTargetsThrowsWithHint) {
  GPT2 model(tiny());
  const Tensor tokens = random_tokens(1, 4, 64, 5), targets = random_tokens(1, 4, 64, 6);
  EXPECT_TRUE(std::isnan(model.forward(tokens, nullptr))) << "no targets: no loss";
  EXPECT_EQ(model.logits().shape(), (scalelab::Shape{1, 4, 64}));
  std::string msg = error_message([&] { model.backward(); });
  EXPECT_TRUE(contains(msg, "hint: call forward(tokens, &targets) before backward()")) << msg;
  // A forward with targets followed by one without: the last forward counts.
  model.forward(tokens, &targets);
  model.forward(tokens, nullptr);
  EXPECT_THROW(model.backward(), scalelab::Error);
}

TEST(Gpt2Errors, SequenceLongerThanMaxSeqLenThrows) {
  GPT2 model(tiny());
  const Tensor tokens = random_tokens(1, 17, 64, 7);  // maxT = 16
  const std::string msg = error_message([&] { model.forward(tokens, nullptr); });
  EXPECT_TRUE(contains(msg, "T=17") && contains(msg, "max_seq_len=16")) << msg;
  EXPECT_TRUE(contains(msg, "hint:")) << msg;
  EXPECT_NO_THROW(model.forward(random_tokens(1, 16, 64, 7), nullptr));  // T = maxT is fine
}

// ---------------------------------------------------------------------------------------------
// Initialisation

TEST(Gpt2Init, SameSeedGivesIdenticalWeightsAndAnotherSeedDifferentOnes) {
  GPT2 a(tiny(), PrecisionPolicy::fp32(), Device::CPU, 42), b(tiny(), PrecisionPolicy::fp32(), Device::CPU, 42);
  GPT2 c(tiny(), PrecisionPolicy::fp32(), Device::CPU, 43);
  int64_t differ = 0, random_entries = 0;
  for (int u = 0; u < a.num_units(); ++u) {
    const Tensor &pa = a.unit_params(u), &pb = b.unit_params(u), &pc = c.unit_params(u);
    EXPECT_EQ(std::memcmp(pa.raw(), pb.raw(), pa.nbytes()), 0) << "unit " << u;
    for (int64_t i = 0; i < pa.numel(); ++i) {
      const float x = pa.data<float>()[i];
      if (x == 0.0f || x == 1.0f) continue;  // biases and layernorm weights are the same for every seed
      ++random_entries;
      differ += x != pc.data<float>()[i];
    }
  }
  EXPECT_EQ(differ, random_entries) << "seed 43 must draw new values for every random entry";
  // init_weights(seed) on an existing model gives the constructor's weights for that seed.
  c.init_weights(42);
  for (int u = 0; u < a.num_units(); ++u)
    EXPECT_EQ(std::memcmp(a.unit_params(u).raw(), c.unit_params(u).raw(), a.unit_params(u).nbytes()), 0) << u;
}

// gpt2_initial_weights streams the constructor's weights one unit at a time (lab 04 keeps only a
// shard of each), and a model without storage holds no bytes until buffers are installed.
TEST(Gpt2Init, InitialWeightsStreamEqualsTheConstructorsWeights) {
  GPT2 a(tiny(), PrecisionPolicy::fp32(), Device::CPU, 42);
  int next_unit = 0;
  scalelab::gpt2_initial_weights(tiny(), 42, [&](int u, const Tensor& w) {
    EXPECT_EQ(u, next_unit++) << "units arrive in order";
    ASSERT_EQ(w.numel(), a.unit_params(u).numel());
    EXPECT_EQ(std::memcmp(w.raw(), a.unit_params(u).raw(), w.nbytes()), 0) << "unit " << u;
  });
  EXPECT_EQ(next_unit, a.num_units());
}

TEST(Gpt2Storage, WithoutStorageHoldsNothingAndRefusesAForwardUntilBuffersAreInstalled) {
  Allocator& alloc = Allocator::get(Device::CPU);
  const int64_t params_before = alloc.stats().current_bytes[static_cast<int>(MemCategory::Params)];
  const int64_t grads_before = alloc.stats().current_bytes[static_cast<int>(MemCategory::Grads)];
  GPT2 model = GPT2::without_storage(tiny());
  EXPECT_EQ(alloc.stats().current_bytes[static_cast<int>(MemCategory::Params)], params_before);
  EXPECT_EQ(alloc.stats().current_bytes[static_cast<int>(MemCategory::Grads)], grads_before);
  EXPECT_EQ(model.num_params(), scalelab::gpt2_num_params(tiny()));
  const Tensor tokens = random_tokens(2, 8, 64, 1), targets = random_tokens(2, 8, 64, 2);
  try {
    model.forward(tokens, &targets);
    FAIL() << "forward without parameter buffers must throw";
  } catch (const scalelab::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unit 0's parameters are not in memory"), std::string::npos) << e.what();
  }
  // Installed buffers (here: padded by 3 elements, as a sharded model's are) give the dense model's loss.
  GPT2 dense(tiny(), PrecisionPolicy::fp32(), Device::CPU, 7);
  const std::vector<int64_t> n = scalelab::gpt2_unit_numel(tiny());
  for (int u = 0; u < model.num_units(); ++u) {
    Tensor padded = Tensor::zeros({n[u] + 3});
    model.unit_params(u) = padded.view(0, {n[u]});
    model.unit_grads(u) = Tensor::zeros({n[u]});
  }
  model.init_weights(7);
  EXPECT_EQ(model.forward(tokens, &targets), dense.forward(tokens, &targets));
}

// GPT-2 init (gpt2.h): N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), layernorm weights 1,
// biases 0. On the "demo" preset (C=192, L=4, V=256) wte has 49152 entries and the c_proj weights
// 737280, so the sample std of a correct init is within 1/sqrt(2N) = 0.3% (wte) and 0.08% (c_proj)
// of its target: the 10% bound only catches a wrong std (a forgotten 1/sqrt(2L) is a factor 2.8).
// The sample mean of N draws has std 0.02/sqrt(N) = 9e-5 (wte); 5e-4 is over 5 of those.
TEST(Gpt2Init, WeightStatisticsFollowGpt2) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  GPT2 model(cfg, PrecisionPolicy::fp32(), Device::CPU, 1);
  constexpr double kStdRtol = 0.10;
  constexpr double kMeanAtol = 5e-4;
  const std::vector<double> wte = values(model.param("wte"));
  EXPECT_NEAR(std_of(wte), 0.02, kStdRtol * 0.02);
  EXPECT_NEAR(mean_of(wte), 0.0, kMeanAtol);
  std::vector<double> proj, fc;
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    for (const char* n : {"attn.c_proj.weight", "mlp.c_proj.weight"}) {
      const std::vector<double> v = values(model.param(p + n));
      proj.insert(proj.end(), v.begin(), v.end());
    }
    const std::vector<double> v = values(model.param(p + "mlp.c_fc.weight"));
    fc.insert(fc.end(), v.begin(), v.end());
  }
  const double proj_std = 0.02 / std::sqrt(2.0 * cfg.n_layer);  // 0.00707 for L=4
  EXPECT_NEAR(std_of(proj), proj_std, kStdRtol * proj_std);
  EXPECT_NEAR(std_of(fc), 0.02, kStdRtol * 0.02);
  for (const ParamInfo& p : model.param_table()) {
    if (p.shape.size() != 1) continue;
    const bool ln_weight = contains(p.name, "ln_") && contains(p.name, ".weight");
    for (double x : values(model.param(p.name))) ASSERT_EQ(x, ln_weight ? 1.0 : 0.0) << p.name;
  }
}

// bf16 parameters are the fp32 init rounded to nearest even: the two policies start from one model.
TEST(Gpt2Init, Bf16PolicyStoresTheRoundedFp32Init) {
  GPT2 f(tiny(), PrecisionPolicy::fp32(), Device::CPU, 7), h(tiny(), PrecisionPolicy::bf16_mixed(), Device::CPU, 7);
  for (int u = 0; u < f.num_units(); ++u) {
    ASSERT_EQ(h.unit_params(u).dtype(), DType::BF16);
    const float* pf = f.unit_params(u).data<float>();
    const scalelab::bf16* ph = h.unit_params(u).data<scalelab::bf16>();
    for (int64_t i = 0; i < f.unit_params(u).numel(); ++i)
      ASSERT_EQ(scalelab::bf16_to_float(ph[i]), scalelab::round_to_bf16(pf[i])) << "unit " << u << " [" << i << "]";
  }
}

// At init the logits are small (std ~ sqrt(C) * 0.02 = 0.08 for C=16: ln_f output has unit variance
// per channel, wte rows std 0.02), so the predicted distribution is nearly uniform and the loss is
// ln(V) + Var(logits)/2 ~ ln(64) + 0.003. Measured for these seeds: 4.15987 nats = ln(64) + 0.001. The bound 0.1
// catches what matters here: a wrong mean (sum instead of mean over B*T: x64), a missing log-sum-exp
// term, or an init 5x too large (logit variance 0.16 -> +0.08 is still inside, 10x is not).
TEST(Gpt2Loss, LossAtInitOnRandomTokensIsCloseToLnV) {
  GPT2 model(tiny(), PrecisionPolicy::fp32(), Device::CPU, 0);
  const Tensor tokens = random_tokens(4, 16, 64, 11), targets = random_tokens(4, 16, 64, 12);
  const float loss = model.forward(tokens, &targets);
  std::printf("loss at init %.6f, ln(V) = %.6f\n", loss, std::log(64.0));
  EXPECT_NEAR(loss, std::log(64.0), 0.1);
  // The float loss and the double loss from the logits agree: both are the mean cross-entropy.
  EXPECT_NEAR(loss, loss_in_double(model, tokens, targets), 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Gradient of the whole model, by finite differences

// d(mean loss)/dw for 3 parameters drawn at random (fixed seed) against the central difference
// (L(w+h) - L(w-h)) / 2h, the loss evaluated in double from the fp32 logits (loss_in_double).
// Step and tolerances, measured on 30 draws at h = 1e-2, 3e-3, 1e-3, 3e-4, 1e-4:
//  - truncation error grows as h^2 (up to 5% relative at h = 1e-2: weights are ~0.02, so that is a
//    50% change of the weight); fp32 rounding inside the network makes the loss noisy by ~5e-9,
//    which the difference divides by 2h (3% at h = 1e-4). h = 1e-3 sits between: the largest
//    absolute error seen is 2.3e-6, and at most 3e-4 relative where |grad| > 5e-3.
//  - kFdAtol = 5e-6 covers that noise twice; kFdRtol = 1e-3 covers the truncation 3x.
//  - Only parameters with |grad| >= 1e-3 are checked, where the bound is at most 0.6% of the value: a
//    1% error (a missing term, a wrong scale) fails. Below it the noise would hide such errors.
TEST(Gpt2Gradient, BackwardMatchesCentralDifferencesOfTheLoss) {
  GPT2 model(tiny(), PrecisionPolicy::fp32(), Device::CPU, 3);
  const Tensor tokens = random_tokens(2, 16, 64, 21), targets = random_tokens(2, 16, 64, 22);
  model.zero_grad();
  model.forward(tokens, &targets);
  model.backward();

  constexpr float kFdStep = 1e-3f;  // h
  constexpr double kFdAtol = 5e-6;
  constexpr double kFdRtol = 1e-3;
  constexpr double kMinGrad = 1e-3;
  std::mt19937 gen(23);
  const int64_t P = model.num_params();
  int checked = 0, drawn = 0;
  while (checked < 3) {
    ASSERT_LT(++drawn, 1000) << "no parameters with |grad| >= kMinGrad";
    int64_t flat = static_cast<int64_t>(gen() % static_cast<uint32_t>(P));
    int unit = 0;
    while (flat >= model.unit_params(unit).numel()) flat -= model.unit_params(unit).numel(), ++unit;
    const double g = model.unit_grads(unit).data<float>()[flat];
    if (std::fabs(g) < kMinGrad) continue;
    float* w = model.unit_params(unit).data<float>() + flat;
    const float w0 = *w;
    // The perturbed values as stored (w0 +- h rounded to fp32); divide by their true distance.
    const float w_plus = w0 + kFdStep, w_minus = w0 - kFdStep;
    *w = w_plus;
    const double loss_plus = loss_in_double(model, tokens, targets);
    *w = w_minus;
    const double loss_minus = loss_in_double(model, tokens, targets);
    *w = w0;
    const double fd = (loss_plus - loss_minus) / (static_cast<double>(w_plus) - static_cast<double>(w_minus));
    std::string name = "?";
    for (const ParamInfo& p : model.param_table())
      if (p.unit == unit && flat >= p.offset && flat < p.offset + p.numel) name = p.name;
    std::printf("unit %d [%lld] %s: backward %.9g, central difference %.9g, rel err %.2e\n", unit,
                static_cast<long long>(flat), name.c_str(), g, fd, std::fabs(fd - g) / std::fabs(g));
    EXPECT_NEAR(fd, g, kFdAtol + kFdRtol * std::fabs(g)) << name << " [" << flat << "]";
    ++checked;
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism

// Two identical steps with 2 threads give bit-identical gradients: every parallel loop splits work
// statically and no sum depends on which thread finishes first. The "demo" shapes with B=4, T=64 put
// every OpenMP loop above its parallel threshold (N*C = 49152, N*V = 65536, N*4C = 196608 elements).
TEST(Gpt2Determinism, TwoRunsGiveBitIdenticalGradientsWithTwoThreads) {
  const int threads_before = scalelab::num_threads();
  scalelab::set_num_threads(2);
  EXPECT_EQ(scalelab::num_threads(), 2);
  GPT2 model(GPTConfig::preset("demo"), PrecisionPolicy::fp32(), Device::CPU, 5);
  const Tensor tokens = random_tokens(4, 64, 256, 31), targets = random_tokens(4, 64, 256, 32);
  std::vector<float> grads[2];
  float losses[2];
  for (int run = 0; run < 2; ++run) {
    model.zero_grad();
    losses[run] = model.forward(tokens, &targets);
    model.backward();
    grads[run] = all_grads(model);
  }
  scalelab::set_num_threads(threads_before);
  EXPECT_EQ(losses[0], losses[1]);
  size_t differ = 0, first = grads[0].size();
  for (size_t i = 0; i < grads[0].size(); ++i)
    if (std::memcmp(&grads[0][i], &grads[1][i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << "first at " << first << ": " << grads[0][first] << " vs " << grads[1][first];
}

// sample_text (scalelab/model/sample.h): n bytes, always printable ASCII or newline (an untrained model samples
// any byte; the log is UTF-8 JSON), and the same RNG state gives the same text.
TEST(Gpt2Sample, SampleIsNBytesOfPrintableAsciiAndDeterministicPerRngState) {
  GPTConfig cfg = GPTConfig::preset("tiny");
  cfg.vocab_size = 256;  // the byte tokenizer
  GPT2 model(cfg);
  scalelab::Rng a(5), b(5);
  const std::string s1 = scalelab::sample_text(model, "In the", 40, a);
  const std::string s2 = scalelab::sample_text(model, "In the", 40, b);
  ASSERT_EQ(s1.size(), 40u);
  EXPECT_EQ(s1, s2);
  for (char ch : s1) {
    const unsigned char c = static_cast<unsigned char>(ch);
    EXPECT_TRUE(c == '\n' || (c >= 32 && c <= 126)) << "byte " << int(c) << " in the sample";
  }
  GPT2 small(GPTConfig::preset("tiny"));  // vocab 64: not a byte model
  scalelab::Rng r(1);
  EXPECT_THROW(scalelab::sample_text(small, "x", 1, r), scalelab::Error);
}

// Sampling allocates its buffers and the model's activations once per call, for the longest context, not per
// generated byte: a call making 20 bytes allocates exactly as often as one making 1 (the old loop made a new
// input, logits copy and, while the context grew, every activation, for each byte). CPU allocations are not
// cached, so raw_alloc_count counts every Tensor::empty.
TEST(Gpt2Sample, AllocatesOncePerCallNotPerGeneratedByte) {
  GPTConfig cfg = GPTConfig::preset("tiny");  // max_seq_len 16: 20 bytes after "In the" slide the window
  cfg.vocab_size = 256;
  GPT2 model(cfg);
  Allocator& cpu = Allocator::get(Device::CPU);
  ASSERT_FALSE(cpu.caching());
  auto allocations_of = [&](int n) {
    scalelab::Rng rng(7);
    const int64_t before = cpu.stats().raw_alloc_count;
    EXPECT_EQ(scalelab::sample_text(model, "In the", n, rng).size(), static_cast<size_t>(n));
    return cpu.stats().raw_alloc_count - before;
  };
  const int64_t one = allocations_of(1), twenty = allocations_of(20);
  EXPECT_GT(one, 0);
  EXPECT_EQ(twenty, one) << "sampling 20 bytes allocated " << twenty << " times, 1 byte " << one << " times";
}

// The padding sample_text runs its forwards with (positions past the real context hold byte 0) does not
// change the logits it reads: position T-1's logits of a forward on T tokens equal, bit for bit, those of
// a forward on the same T tokens followed by padding (causal attention), for every T up to max_seq_len.
TEST(Gpt2Sample, PaddingAfterTheContextLeavesTheLastLogitsBitIdentical) {
  GPTConfig cfg = GPTConfig::preset("tiny");
  cfg.vocab_size = 256;
  GPT2 model(cfg);
  const int maxT = cfg.max_seq_len, V = cfg.vocab_size;
  auto last_logits = [&](int T, int Tpad) {
    Tensor x = Tensor::empty({1, Tpad}, DType::I32);
    for (int t = 0; t < Tpad; ++t) x.data<int32_t>()[t] = t < T ? (37 * t + 11) % 256 : 0;
    model.forward(x, nullptr);
    const float* l = model.logits().data<float>() + static_cast<int64_t>(T - 1) * V;
    return std::vector<float>(l, l + V);
  };
  for (int T = 1; T <= maxT; ++T) {
    const std::vector<float> exact = last_logits(T, T), padded = last_logits(T, maxT);
    EXPECT_EQ(std::memcmp(exact.data(), padded.data(), sizeof(float) * V), 0) << "T=" << T;
  }
}

// ---------------------------------------------------------------------------------------------
// Attention implementations (gpt2.h AttentionImpl): the flash ops inside the model

// The whole model with Flash attention gives Materialized's loss and gradients. Only the order of the fp32
// sums inside attention differs (online softmax over key tiles against one pass over the row), so the
// difference is fp32 rounding carried through the network: the ops themselves agree to ~5e-7 relative
// (tests/common/ops/test_attention_flash.cpp), and the bound below allows 20x that at every gradient, relative
// to the largest gradient of the same tensor set. "demo" with T=100 puts several key tiles (32 wide) and a
// ragged last one in every row.
TEST(Gpt2Attention, FlashGivesMaterializedLossAndGradients) {
  const GPTConfig cfg = GPTConfig::preset("demo");
  const Tensor tokens = random_tokens(2, 100, cfg.vocab_size, 41), targets = random_tokens(2, 100, cfg.vocab_size, 42);
  float loss[2];
  std::vector<float> grads[2];
  for (int run = 0; run < 2; ++run) {
    GPT2 model(cfg, PrecisionPolicy::fp32(), Device::CPU, 7);
    model.set_attention(run == 0 ? scalelab::AttentionImpl::Materialized : scalelab::AttentionImpl::Flash);
    loss[run] = model.forward(tokens, &targets);
    model.backward();
    grads[run] = all_grads(model);
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0]));
  double gmax = 0.0, worst = 0.0;
  for (float g : grads[0]) gmax = std::max(gmax, static_cast<double>(std::fabs(g)));
  for (size_t i = 0; i < grads[0].size(); ++i) worst = std::max(worst, std::fabs(double(grads[1][i]) - grads[0][i]));
  std::printf("  [attention] loss %.7f vs %.7f, worst gradient difference %.2e of max |g| %.2e\n", loss[1], loss[0],
              worst, gmax);
  EXPECT_LE(worst, 1e-5 * gmax);
}

// Flash keeps lse (B,NH,T) per layer instead of att (B,NH,T,T) per layer plus one datt: the allocator's
// Activations count drops by exactly that difference (memory counted by the allocator is exact).
TEST(Gpt2Attention, FlashSavesExactlyTheScoresInActivationMemory) {
  const GPTConfig cfg = GPTConfig::preset("tiny");  // L=2, NH=2, maxT=16
  const int B = 3, T = 16;
  const Tensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  int64_t acts[2];
  for (int run = 0; run < 2; ++run) {
    const int64_t before = current_bytes(MemCategory::Activations);
    GPT2 model(cfg, PrecisionPolicy::fp32(), Device::CPU, 3);
    model.set_attention(run == 0 ? scalelab::AttentionImpl::Materialized : scalelab::AttentionImpl::Flash);
    model.forward(tokens, &targets);
    acts[run] = current_bytes(MemCategory::Activations) - before;
  }
  const int64_t f = sizeof(float), L = cfg.n_layer, NH = cfg.n_head;
  const int64_t scores = (L + 1) * B * NH * T * T * f, lse = L * B * NH * T * f;
  EXPECT_EQ(scalelab::attention_scores_bytes(cfg, B, T), scores);
  EXPECT_EQ(acts[0] - acts[1], scores - lse);
}

// Changing the implementation frees the activations, so a model switched between steps keeps training
// (nothing stale is read), and the names round-trip with a clear error for an unknown one.
TEST(Gpt2Attention, SwitchingImplementationsAndNames) {
  GPT2 model(tiny(), PrecisionPolicy::fp32(), Device::CPU, 3);
  const Tensor tokens = random_tokens(2, 8, 64, 5), targets = random_tokens(2, 8, 64, 6);
  const float materialized = model.forward(tokens, &targets);
  model.set_attention(scalelab::AttentionImpl::Flash);
  EXPECT_EQ(model.attention(), scalelab::AttentionImpl::Flash);
  EXPECT_NEAR(model.forward(tokens, &targets), materialized, 1e-5);
  model.backward();  // reads lse, not the freed att
  EXPECT_EQ(scalelab::attention_impl_from_name("flash"), scalelab::AttentionImpl::Flash);
  EXPECT_EQ(scalelab::attention_impl_from_name("materialized"), scalelab::AttentionImpl::Materialized);
  EXPECT_STREQ(scalelab::attention_impl_name(scalelab::AttentionImpl::Flash), "flash");
  const std::string msg = error_message([] { scalelab::attention_impl_from_name("sdpa"); });
  EXPECT_TRUE(contains(msg, "'sdpa'") && contains(msg, "materialized") && contains(msg, "flash")) << msg;
}

// choose_attention ("auto"): the scores of d24 at B=16, T=1024 are 25 x 1.07 GB = 26.8 GB, more than a
// quarter of an 80 GB GPU, so Flash; at B=2 (3.4 GB) Materialized; no budget known: Materialized.
TEST(Gpt2Attention, AutoChoosesFlashWhenTheScoresWouldTakeOverAQuarterOfMemory) {
  const GPTConfig d24 = GPTConfig::preset("d24");
  const int64_t gpu80 = 80'000'000'000LL;
  EXPECT_EQ(scalelab::attention_scores_bytes(d24, 16, 1024), 25LL * 16 * 16 * 1024 * 1024 * 4);
  EXPECT_EQ(scalelab::choose_attention(d24, 16, 1024, gpu80), scalelab::AttentionImpl::Flash);
  EXPECT_EQ(scalelab::choose_attention(d24, 2, 1024, gpu80), scalelab::AttentionImpl::Materialized);
  EXPECT_EQ(scalelab::choose_attention(d24, 16, 1024, 0), scalelab::AttentionImpl::Materialized);
  // the edge: exactly a quarter still materializes
  const int64_t scores = scalelab::attention_scores_bytes(d24, 4, 1024);
  EXPECT_EQ(scalelab::choose_attention(d24, 4, 1024, 4 * scores), scalelab::AttentionImpl::Materialized);
  EXPECT_EQ(scalelab::choose_attention(d24, 4, 1024, 4 * scores - 4), scalelab::AttentionImpl::Flash);
}
