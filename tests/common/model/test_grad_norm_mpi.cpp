// test_grad_norm_mpi.cpp — the whole model's gradient norm over a real group (scalelab/model/optim.h
// global_grad_norm): a model split into one pipeline stage per rank, each stage's gradients set to the dense
// model's (every rank computes the dense model itself), gives the dense norm on every rank, so every stage
// clips by the same factor. Runs under mpiexec at 2 and 4 ranks (tests/CMakeLists.txt); main():
// tests/support/mpi/mpi_main.cpp. One process: test_model_shard.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "mpi_test.h"              // defines: test::world
#include "scalelab/model/gpt2.h"   // defines: GPT2, ModelShard
#include "scalelab/model/optim.h"  // defines: grad_norm, global_grad_norm, clip_grad_norm

namespace {

using namespace scalelab;

TEST(GradNormMpi, StagesOfASplitModelAgreeOnTheDenseNorm) {
  Communicator& world = test::world();
  const int n = world.size(), rank = world.rank();
  const GPTConfig cfg{32, 64, 4, 4, 32};  // L = 4: one block per rank at 4 ranks, two at 2
  std::mt19937 gen(3);
  Tensor tokens = Tensor::empty({2, 16}, DType::I32), targets = Tensor::empty({2, 16}, DType::I32);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(gen() % 64);
    targets.data<int32_t>()[i] = static_cast<int32_t>(gen() % 64);
  }
  GPT2 dense(cfg, PrecisionPolicy::fp32(), Device::CPU, 21);
  dense.zero_grad();
  dense.forward(tokens, &targets);
  dense.backward();
  const float want = grad_norm(dense);

  ModelShard s;
  const int per = cfg.n_layer / n;
  s.first_layer = rank * per;
  s.last_layer = rank * per + per - 1;
  s.has_embedding = rank == 0;
  s.has_head = rank == n - 1;
  GPT2 stage(cfg, s);
  for (const ParamInfo& p : stage.param_table()) {
    Tensor g = stage.grad(p.name);
    copy_dense_to_shard(p, s, dense.grad(p.name), g);
  }
  constexpr float kFp32Sum = 1e-6f;  // relative: the shards' sums of squares travel as fp32
  const float got = global_grad_norm(stage, {&world});
  EXPECT_NEAR(got, want, kFp32Sum * want) << "rank " << rank << " of " << n;
  EXPECT_LT(grad_norm(stage), want) << "a stage's own norm is only part of it";
  // Clipping to half the norm scales every stage's gradients by the same factor.
  const Tensor before = stage.grad(stage.param_table()[0].name);
  const float first = before.data<float>()[0];
  clip_grad_norm(stage, 0.5f * want, {&world});
  EXPECT_NEAR(stage.grad(stage.param_table()[0].name).data<float>()[0], first * 0.5f * want / (got + 1e-6f),
              1e-6f * std::fabs(first) + 1e-12f);
}

}  // namespace
