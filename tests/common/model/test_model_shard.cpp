// test_model_shard.cpp — one model, any layout (scalelab/model/gpt2.h ModelShard, tensor_parallel.h;
// docs/design.md "Parallel layouts"): a pipeline of two stages run one after the other equals the whole
// model; the identity tensor-parallel points are the dense model bit for bit; a tp = 2 shard has the local
// shapes and the dense model's slices as its weights; caller-owned activation sets are counted; the
// whole-model gradient norm of a split model is the dense one; bad layouts are refused. One process, CPU.
// The same norm over a real 2-rank group: test_grad_norm_mpi.cpp.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "expect_error.h"                    // defines: error_message, contains
#include "megatron_split.h"                  // defines: test::megatron_split (a tp shard's split rule)
#include "scalelab/core/allocator.h"         // defines: Allocator, MemCategory
#include "scalelab/model/gpt2.h"             // defines: GPT2, ModelShard, GPT2Activations, copy_*_shard
#include "scalelab/model/optim.h"            // defines: grad_sum_squares
#include "scalelab/model/tensor_parallel.h"  // defines: TensorParallel

namespace {

using namespace scalelab;
using scalelab::test::contains;
using scalelab::test::error_message;

// demo-like but small: L = 4 blocks so a pipeline cut has layers on both sides; NH = 4, C = 32, V = 64.
GPTConfig small() { return GPTConfig{32, 64, 4, 4, 32}; }

Tensor random_tokens(int B, int T, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(gen() % V);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The first differing element of two fp32 tensors, for failure messages.
std::string first_difference(const std::string& name, const Tensor& a, const Tensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0)
      return name + "[" + std::to_string(i) + "]: " + std::to_string(a.data<float>()[i]) + " vs " +
             std::to_string(b.data<float>()[i]);
  return "";
}

ModelShard stage(int first, int last, bool embedding, bool head) {
  ModelShard s;
  s.first_layer = first;
  s.last_layer = last;
  s.has_embedding = embedding;
  s.has_head = head;
  return s;
}

ModelShard tp_shard(int rank, int size) {
  ModelShard s;
  s.tp_rank = rank;
  s.tp_size = size;
  s.tp_split = &scalelab::test::megatron_split;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Pipeline stages

// Stage 0 (embedding, blocks 0-1) then stage 1 (blocks 2-3, ln_f, the head with its own wte copy), the
// hidden state and its gradient handed from one to the other, equal the whole model: the loss and every
// gradient bit for bit. wte's gradient is split between the two copies (the head's part on stage 1, the
// embedding's on stage 0); their sum, which lab 06's embedding group forms, equals the dense gradient
// up to fp32 re-association (the dense model adds the embedding's rows onto the head's in one buffer).
TEST(ModelShard, TwoStagesOneAfterTheOtherEqualTheWholeModel) {
  const GPTConfig cfg = small();
  const int B = 2, T = 16;
  const Tensor tokens = random_tokens(B, T, cfg.vocab_size, 1), targets = random_tokens(B, T, cfg.vocab_size, 2);
  GPT2 dense(cfg, PrecisionPolicy::fp32(), Device::CPU, /*seed=*/7);
  GPT2 s0(cfg, stage(0, 1, true, false), PrecisionPolicy::fp32(), Device::CPU, 7);
  GPT2 s1(cfg, stage(2, 3, false, true), PrecisionPolicy::fp32(), Device::CPU, 7);
  EXPECT_TRUE(s1.info("wte").tied_copy);
  EXPECT_EQ(s1.info("wte").unit, cfg.n_layer + 1);
  EXPECT_TRUE(same_bits(s1.param("wte"), dense.param("wte"))) << "the last stage's wte copy starts as wte";

  dense.zero_grad();
  const float want = dense.forward(tokens, &targets);
  dense.backward();

  GPT2Activations a0 = s0.make_activations(B, T), a1 = s1.make_activations(B, T);
  s0.zero_grad();
  s1.zero_grad();
  EXPECT_TRUE(std::isnan(s0.forward(a0, tokens, nullptr)));  // no head: no loss
  const float got = s1.forward(a1, a0.output(), &targets);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << got << " vs " << want;
  Tensor d_hidden = Tensor::empty(a0.output().shape(), DType::F32);  // (B, T, C)
  s1.backward(a1, nullptr, &d_hidden);
  s0.backward(a0, &d_hidden, nullptr);

  int compared = 0;
  for (const GPT2* s : {&s0, &s1}) {
    for (const ParamInfo& p : s->param_table()) {
      if (p.name == "wte") continue;
      EXPECT_TRUE(same_bits(s->grad(p.name), dense.grad(p.name)))
          << first_difference(p.name, s->grad(p.name), dense.grad(p.name));
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(gpt2_param_table(cfg).size()) - 1);
  const Tensor g0 = s0.grad("wte"), g1 = s1.grad("wte"), gd = dense.grad("wte");
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < gd.numel(); ++i) {
    worst = std::max(worst,
                     std::fabs(static_cast<double>(g0.data<float>()[i]) + g1.data<float>()[i] - gd.data<float>()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(gd.data<float>()[i])));
  }
  constexpr double kReassociation = 1e-6;  // fp32: a few ulps of the largest element
  EXPECT_LE(worst, kReassociation * scale) << "wte copies summed vs dense: worst " << worst << " of " << scale;
}

// A pipeline stage owns only its units: the others have no storage, no table entries, no hooks.
TEST(ModelShard, StageHoldsOnlyItsUnits) {
  const GPTConfig cfg = small();
  GPT2 s1(cfg, stage(2, 3, false, true));
  for (int u = 0; u < s1.num_units(); ++u) {
    const bool own = u >= 3;
    EXPECT_EQ(s1.owns_unit(u), own) << "unit " << u;
    EXPECT_EQ(s1.unit_params(u).defined(), own) << "unit " << u;
  }
  for (const ParamInfo& p : s1.param_table()) EXPECT_GE(p.unit, 3) << p.name;
  std::vector<int> fired;
  const HookHandle h = s1.add_hook(HookPoint::BeforeForward, [&](const UnitHookArgs& a) { fired.push_back(a.unit); });
  GPT2Activations a = s1.make_activations(1, 8);
  s1.forward(a, Tensor::zeros({1, 8, cfg.n_embd}, DType::F32), nullptr);
  EXPECT_EQ(fired, (std::vector<int>{3, 4, 5}));
}

// ---------------------------------------------------------------------------------------------
// Tensor-parallel points

// Every point, counted: the dense model calls each where Megatron-LM communicates, and with the identity
// (this base class) the result is the model without points, bit for bit.
struct CountingPoints : TensorParallel {
  std::map<std::string, int> calls;
  void f_forward(Tensor& x) override {
    ++calls["f_forward"];
    TensorParallel::f_forward(x);
  }
  void f_backward(Tensor& dx) override {
    ++calls["f_backward"];
    TensorParallel::f_backward(dx);
  }
  void g_forward(Tensor& y, const Tensor* bias) override {
    ++calls["g_forward"];
    TensorParallel::g_forward(y, bias);
  }
  void g_backward(Tensor& dy) override {
    ++calls["g_backward"];
    TensorParallel::g_backward(dy);
  }
  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) override {
    ++calls["embedding_forward"];
    TensorParallel::embedding_forward(out, tokens, wte, wpe);
  }
  void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) override {
    ++calls["embedding_backward"];
    TensorParallel::embedding_backward(dwte, dwpe, dout, tokens);
  }
  void cross_entropy_forward(Tensor& losses, Tensor& probs, const Tensor& logits, const Tensor& targets) override {
    ++calls["cross_entropy_forward"];
    TensorParallel::cross_entropy_forward(losses, probs, logits, targets);
  }
  void cross_entropy_backward(Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss) override {
    ++calls["cross_entropy_backward"];
    TensorParallel::cross_entropy_backward(dlogits, probs, targets, dloss);
  }
};

TEST(ModelShard, IdentityPointsAreTheDenseModelBitForBit) {
  const GPTConfig cfg = small();
  const Tensor tokens = random_tokens(2, 16, cfg.vocab_size, 3), targets = random_tokens(2, 16, cfg.vocab_size, 4);
  GPT2 plain(cfg, PrecisionPolicy::fp32(), Device::CPU, 11);
  GPT2 pointed(cfg, ModelShard::dense(), PrecisionPolicy::fp32(), Device::CPU, 11);
  CountingPoints points;
  pointed.set_tensor_parallel(&points);
  for (GPT2* m : {&plain, &pointed}) m->zero_grad();
  const float a = plain.forward(tokens, &targets), b = pointed.forward(tokens, &targets);
  plain.backward();
  pointed.backward();
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0);
  for (const ParamInfo& p : plain.param_table())
    EXPECT_TRUE(same_bits(plain.grad(p.name), pointed.grad(p.name))) << p.name;
  const int L = cfg.n_layer;
  // per block: f before c_attn and c_fc, g after the two c_proj; the head is column-parallel too (f)
  EXPECT_EQ(points.calls["f_forward"], 2 * L + 1);
  EXPECT_EQ(points.calls["g_forward"], 2 * L);
  EXPECT_EQ(points.calls["f_backward"], 2 * L + 1);
  EXPECT_EQ(points.calls["g_backward"], 2 * L);
  EXPECT_EQ(points.calls["embedding_forward"], 1);
  EXPECT_EQ(points.calls["embedding_backward"], 1);
  EXPECT_EQ(points.calls["cross_entropy_forward"], 1);
  EXPECT_EQ(points.calls["cross_entropy_backward"], 1);
}

// tp = 2: the table holds the local shapes (c_attn and c_fc split by rows, the c_proj by columns, wte by
// vocabulary rows, the rest whole) and each rank's initial weights are exactly its slices of the dense
// model's: put back together (copy_shard_to_dense) the two ranks give the dense weights, bit for bit.
TEST(ModelShard, TwoWayTensorParallelShardHoldsTheDenseSlices) {
  const GPTConfig cfg = small();
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  GPT2 dense(cfg, PrecisionPolicy::fp32(), Device::CPU, 5);
  GPT2 r0(cfg, tp_shard(0, 2), PrecisionPolicy::fp32(), Device::CPU, 5);
  GPT2 r1(cfg, tp_shard(1, 2), PrecisionPolicy::fp32(), Device::CPU, 5);
  EXPECT_EQ(r0.info("wte").shape, (Shape{V / 2, C}));
  EXPECT_EQ(r0.info("h.1.attn.c_attn.weight").shape, (Shape{3 * C / 2, C}));
  EXPECT_EQ(r0.info("h.1.attn.c_attn.bias").shape, (Shape{3 * C / 2}));
  EXPECT_EQ(r0.info("h.1.attn.c_proj.weight").shape, (Shape{C, C / 2}));
  EXPECT_EQ(r0.info("h.1.attn.c_proj.bias").shape, (Shape{C}));
  EXPECT_EQ(r0.info("h.1.mlp.c_fc.weight").shape, (Shape{4 * C / 2, C}));
  EXPECT_EQ(r0.info("h.1.mlp.c_proj.weight").shape, (Shape{C, 4 * C / 2}));
  EXPECT_EQ(r0.info("wpe").shape, (Shape{cfg.max_seq_len, C}));
  EXPECT_TRUE(r0.info("h.1.ln_1.weight").tp_replicated);
  EXPECT_FALSE(r0.info("h.1.mlp.c_fc.weight").tp_replicated);
  // q | k | v: rank 0's first row is q's row 0, its row C/2 is k's row 0 (dense row C)
  EXPECT_EQ(r0.param("h.0.attn.c_attn.weight").data<float>()[(C / 2) * C],
            dense.param("h.0.attn.c_attn.weight").data<float>()[C * C]);
  EXPECT_EQ(r1.param("h.0.attn.c_attn.weight").data<float>()[0],
            dense.param("h.0.attn.c_attn.weight").data<float>()[(C / 2) * C]);
  for (const ParamInfo& p : dense.param_table()) {
    Tensor rebuilt = Tensor::zeros(p.shape, DType::F32);
    copy_shard_to_dense(r0.info(p.name), r0.shard(), r0.param(p.name), rebuilt);
    copy_shard_to_dense(r1.info(p.name), r1.shard(), r1.param(p.name), rebuilt);
    EXPECT_TRUE(same_bits(rebuilt, dense.param(p.name))) << first_difference(p.name, rebuilt, dense.param(p.name));
    Tensor slice = Tensor::zeros(r1.info(p.name).shape, DType::F32);
    copy_dense_to_shard(r1.info(p.name), r1.shard(), dense.param(p.name), slice);
    EXPECT_TRUE(same_bits(slice, r1.param(p.name))) << p.name;
  }
  int64_t replicated = 0;
  for (const ParamInfo& p : r0.param_table()) replicated += p.tp_replicated ? p.numel : 0;
  EXPECT_EQ(r0.num_params() + r1.num_params() - replicated, dense.num_params()) << "sharded + replicated once";
}

// A tensor-parallel shard without points refuses to run (the identity is only the dense model's).
TEST(ModelShard, TensorParallelShardWithoutPointsRefusesToRun) {
  GPT2 r0(small(), tp_shard(0, 2));
  const std::string msg = error_message([&] { r0.forward(random_tokens(1, 8, 64, 1), nullptr); });
  EXPECT_TRUE(contains(msg, "set_tensor_parallel")) << msg;
}

// ---------------------------------------------------------------------------------------------
// Validation

TEST(ModelShard, BadLayoutsAreRefusedWithTheNumbers) {
  const GPTConfig cfg = small();  // NH = 4, C = 32, V = 64, L = 4
  const std::string heads = error_message([&] { gpt2_param_table(cfg, tp_shard(0, 8)); });
  EXPECT_TRUE(contains(heads, "NH=4 heads not divisible by tp=8")) << heads;
  GPTConfig odd_vocab = cfg;
  odd_vocab.vocab_size = 65;
  const std::string vocab = error_message([&] { gpt2_param_table(odd_vocab, tp_shard(0, 2)); });
  EXPECT_TRUE(contains(vocab, "V=65 not divisible by tp=2") && contains(vocab, "never padded")) << vocab;
  const std::string rank = error_message([&] { gpt2_param_table(cfg, tp_shard(2, 2)); });
  EXPECT_TRUE(contains(rank, "rank 2 of 2")) << rank;
  const std::string layers = error_message([&] { gpt2_param_table(cfg, stage(3, 5, false, true)); });
  EXPECT_TRUE(contains(layers, "layers 3..5 of a model with L=4")) << layers;
  ModelShard sp;
  sp.sequence_parallel = true;
  const std::string seq = error_message([&] { gpt2_param_table(cfg, sp); });
  EXPECT_TRUE(contains(seq, "needs tp > 1")) << seq;
  // the split rule: required for a tp shard holding blocks, and its cut must divide the tensor
  ModelShard no_rule = tp_shard(0, 2);
  no_rule.tp_split = nullptr;
  const std::string rule = error_message([&] { gpt2_param_table(cfg, no_rule); });
  EXPECT_TRUE(contains(rule, "tp=2 shard without a split rule")) << rule;
  ModelShard bad_cut = tp_shard(0, 2);
  bad_cut.tp_split = [](const std::string&) { return TpSplit{1, 1}; };  // a 1-D bias has no dim 1
  const std::string cut = error_message([&] { gpt2_param_table(cfg, bad_cut); });
  EXPECT_TRUE(contains(cut, "ln_1.weight (32,): split dim 1")) << cut;
}

// ---------------------------------------------------------------------------------------------
// Caller-owned activations

// Each set is counted in Activations; a GPipe-like schedule holding m sets holds m times one set's
// bytes (the backward scratch is the model's, once); dropping a set gives its bytes back.
TEST(ModelShard, EachActivationSetIsCountedAndFreedWithTheCaller) {
  const GPTConfig cfg = small();
  GPT2 s0(cfg, stage(0, 1, true, false));
  Allocator& alloc = Allocator::get(Device::CPU);
  auto acts_bytes = [&] { return alloc.stats().current_bytes[static_cast<int>(MemCategory::Activations)]; };
  GPT2Activations first = s0.make_activations(2, 16);  // the set and the model's scratch
  const int64_t with_one = acts_bytes();
  GPT2Activations second = s0.make_activations(2, 16);
  const int64_t one_set = acts_bytes() - with_one;
  EXPECT_GT(one_set, 0);
  std::vector<GPT2Activations> more;
  for (int i = 0; i < 3; ++i) more.push_back(s0.make_activations(2, 16));
  EXPECT_EQ(acts_bytes() - with_one, 4 * one_set);
  more.clear();
  EXPECT_EQ(acts_bytes() - with_one, one_set);
}

// ---------------------------------------------------------------------------------------------
// The whole model's gradient norm

// Gradients of a split model set to the dense model's (the values a correct step would hold): the shards'
// sums of squares add up to the dense sum, each parameter counted once (replicated ones on tp rank 0
// only, the last stage's wte copy never). The tolerance is double-precision re-grouping of the sums.
TEST(ModelShard, SplitModelsSumSquaresToTheDenseGradient) {
  const GPTConfig cfg = small();
  const Tensor tokens = random_tokens(2, 16, cfg.vocab_size, 5), targets = random_tokens(2, 16, cfg.vocab_size, 6);
  GPT2 dense(cfg, PrecisionPolicy::fp32(), Device::CPU, 9);
  dense.zero_grad();
  dense.forward(tokens, &targets);
  dense.backward();
  const double want = grad_sum_squares(dense);
  auto with_dense_grads = [&](GPT2& m) {
    for (const ParamInfo& p : m.param_table()) {
      Tensor g = m.grad(p.name);
      copy_dense_to_shard(p, m.shard(), dense.grad(p.name), g);
    }
  };
  GPT2 t0(cfg, tp_shard(0, 2)), t1(cfg, tp_shard(1, 2));
  GPT2 p0(cfg, stage(0, 1, true, false)), p1(cfg, stage(2, 3, false, true));
  for (GPT2* m : {&t0, &t1, &p0, &p1}) with_dense_grads(*m);
  constexpr double kRegroup = 1e-12;  // relative: the same squares summed in another grouping, in double
  EXPECT_NEAR(grad_sum_squares(t0) + grad_sum_squares(t1), want, kRegroup * want) << "tp = 2";
  EXPECT_NEAR(grad_sum_squares(p0) + grad_sum_squares(p1), want, kRegroup * want) << "pp = 2";
}

}  // namespace

// gpt2_unit_numel is written in closed form (the planner calls it for every stage of every layout): it must
// equal the sums of gpt2_param_table's rows per unit, on every kind of shard, including tp sizes that do not
// divide 3C or 4C evenly (the same integer divisions). gpt2_num_params likewise, with and without wpe.
TEST(ModelShard, UnitNumelEqualsTheParamTablesSums) {
  for (const auto& [C, heads, V, L] : std::vector<std::array<int, 4>>{{8, 2, 12, 3}, {12, 4, 48, 5}, {6, 3, 24, 1}}) {
    GPTConfig cfg;
    cfg.n_embd = C;
    cfg.n_head = heads;
    cfg.vocab_size = V;
    cfg.n_layer = L;
    cfg.max_seq_len = 9;
    int64_t dense_sum = 0, no_wpe = 0;
    for (const ParamInfo& p : gpt2_param_table(cfg)) {
      dense_sum += p.numel;
      if (p.name != "wpe") no_wpe += p.numel;
    }
    EXPECT_EQ(gpt2_num_params(cfg), dense_sum);
    EXPECT_EQ(gpt2_num_params(cfg, /*with_wpe=*/false), no_wpe);
    for (int tp : {1, 2, 3, 4}) {
      if (heads % tp != 0) continue;  // a shard must split the heads (ModelShard::validate)
      for (int first = 0; first < L; ++first) {
        for (int last : {first, L - 1}) {
          for (int ends = 0; ends < 4; ++ends) {
            ModelShard s;
            s.tp_size = tp;
            s.tp_split = &scalelab::test::megatron_split;
            s.first_layer = first;
            s.last_layer = last;
            s.has_embedding = ends & 1;
            s.has_head = ends & 2;
            std::vector<int64_t> want(L + 2, 0);
            for (const ParamInfo& p : gpt2_param_table(cfg, s)) want[p.unit] += p.numel;
            EXPECT_EQ(gpt2_unit_numel(cfg, s), want)
                << "C " << C << " V " << V << " L " << L << " tp " << tp << " blocks " << first << ".." << last
                << " embedding " << s.has_embedding << " head " << s.has_head;
          }
        }
      }
    }
  }
}

// The planner (lab 09) asks for the unit sizes of every stage of every layout it weighs: for a 10,000-layer
// model on 8 GPUs that is about a thousand calls. Built from the parameter table (120,000 named rows a call)
// they took minutes, and the planner printed nothing; in closed form they take milliseconds. The bound,
// 10 s for 1,000 calls, is a thousand times the time they take, so it cannot flake, and the table's way
// takes ten times longer than it.
TEST(ModelShard, UnitNumelOfADeepModelIsCheap) {
  GPTConfig cfg;
  cfg.n_embd = 64;
  cfg.n_head = 4;
  cfg.vocab_size = 256;
  cfg.n_layer = 10000;
  cfg.max_seq_len = 64;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t total = 0;
  for (int call = 0; call < 1000; ++call) {
    ModelShard s;
    s.tp_size = 1 << (call % 3);
    s.tp_split = &scalelab::test::megatron_split;
    s.first_layer = call % 5000;
    total += gpt2_unit_numel(cfg, s)[cfg.n_layer];
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(total, 0);
  EXPECT_LT(s, 10.0) << "1,000 calls of gpt2_unit_numel on 10,000 layers";
  std::printf("[  INFO    ] 1,000 calls of gpt2_unit_numel on 10,000 layers: %.3f s\n", s);
}
