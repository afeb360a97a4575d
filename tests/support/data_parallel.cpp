// data_parallel.cpp — the data-parallel labs' shared check helpers (data_parallel.h).
#include "data_parallel.h"

#include <gtest/gtest.h>  // defines: ::testing::Environment

#include "grading.h"        // defines: grading::rank_reducer, set_rank_reducer
#include "rank_reducer.h"   // defines: test::make_rank_reducer
#include "scalelab/core/rng.h"   // defines: Rng

namespace scalelab::dp_test {

GPTConfig tiny_config() { return GPTConfig::preset("tiny"); }

// ---------------------------------------------------------------------------------------------
// Communicators

namespace {

std::unique_ptr<Communicator> g_world;  // made by the first world() call
bool g_set_reducer = false;             // whether world() plugged in the grading reducer

// Communicators must end before MPI does (MPI_Finalize runs at exit): after the last TEST.
class WorldTearDown : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_set_reducer) grading::set_rank_reducer({});
    g_world.reset();
  }
};
::testing::Environment* const kWorldTearDown = ::testing::AddGlobalTestEnvironment(new WorldTearDown);

}  // namespace

Communicator& world() {
  if (!g_world) {
    g_world = make_communicator("auto");
    if (g_world->size() > 1 && grading::rank_reducer().size <= 1) {
      // The grading helpers get a communicator of their own: their calls never show in a check's log.
      grading::set_rank_reducer(
          test::make_rank_reducer(std::shared_ptr<Communicator>(g_world->split(0, g_world->rank()))));
      g_set_reducer = true;
    }
  }
  return *g_world;
}

std::unique_ptr<Communicator> fresh_comm() { return world().split(/*color=*/0, /*key=*/world().rank()); }

std::string on_rank(const std::string& message) {
  return "rank " + std::to_string(world().rank()) + ": " + message;
}

// ---------------------------------------------------------------------------------------------
// Data

GlobalBatch random_global_batch(uint64_t seed, int B_global, int T, int V) {
  GlobalBatch g;
  g.inputs = Tensor::empty({B_global, T}, DType::I32);
  g.targets = Tensor::empty({B_global, T}, DType::I32);
  Rng rng(seed);
  for (int64_t i = 0; i < int64_t{B_global} * T; ++i) {
    g.inputs.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % V);
    g.targets.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  return g;
}

GlobalBatch batch_rows(const GlobalBatch& g, int64_t first_row, int B) {
  const int T = static_cast<int>(g.inputs.size(1));
  GlobalBatch rows;
  rows.inputs = Tensor::empty({B, T}, DType::I32);
  rows.targets = Tensor::empty({B, T}, DType::I32);
  rows.inputs.copy_from(g.inputs.view(first_row * T, {B, T}));
  rows.targets.copy_from(g.targets.view(first_row * T, {B, T}));
  return rows;
}

// ---------------------------------------------------------------------------------------------
// The reference

std::unique_ptr<GPT2> make_model(const GPTConfig& cfg, const PrecisionPolicy& policy) {
  return std::make_unique<GPT2>(cfg, policy, Device::CPU, kModelSeed);
}

float one_process_gradients(GPT2& model, const GlobalBatch& g) {
  model.zero_grad();
  const float loss = model.forward(g.inputs, &g.targets);
  model.backward();
  return loss;
}

OneProcessStep one_process_train_step(GPT2& model, Optimizer& optimizer, const GlobalBatch& g, float lr, float grad_clip) {
  OneProcessStep r;
  r.loss = one_process_gradients(model, g);
  r.grad_norm = clip_grad_norm(model, grad_clip);
  optimizer.step(lr);
  return r;
}

}  // namespace scalelab::dp_test
