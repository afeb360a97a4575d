// data_parallel.cpp — the data-parallel labs' shared check helpers (data_parallel.h).
#include "data_parallel.h"

#include <gtest/gtest.h>  // defines: ::testing::Environment

#include <algorithm>  // defines: std::max
#include <cmath>      // defines: std::fabs
#include <cstdio>     // defines: std::snprintf

#include "grading.h"            // defines: grading::rank_reducer, set_rank_reducer
#include "rank_reducer.h"       // defines: test::make_rank_reducer
#include "scalelab/core/rng.h"  // defines: Rng

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

std::string on_rank(const std::string& message) { return "rank " + std::to_string(world().rank()) + ": " + message; }

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

OneProcessStep one_process_train_step(GPT2& model, Optimizer& optimizer, const GlobalBatch& g, float lr,
                                      float grad_clip) {
  OneProcessStep r;
  r.loss = one_process_gradients(model, g);
  r.grad_norm = clip_grad_norm(model, grad_clip);
  optimizer.step(lr);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Comparisons

// max |got - want| <= rtol * max |want| + atol; "" or the first differing index and both values.
std::string compare_tensors(const std::string& name, const Tensor& got, const Tensor& want, double rtol, double atol,
                            double* worst) {
  if (got.numel() != want.numel())
    return name + ": " + std::to_string(got.numel()) + " elements, expected " + std::to_string(want.numel());
  double scale = 0, err = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < want.numel(); ++i)
    scale = std::max(scale, std::fabs(static_cast<double>(want.data<float>()[i])));
  const double bound = rtol * scale + atol;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]);
    err = std::max(err, d);
    if (d > bound && first < 0) first = i;
  }
  if (worst != nullptr) *worst = std::max(*worst, scale > 0 ? err / scale : err);
  if (first < 0) return "";
  char buf[256];
  const double ratio = want.data<float>()[first] != 0 ? got.data<float>()[first] / want.data<float>()[first] : 0;
  std::snprintf(buf, sizeof(buf), "%s[%lld] = %.7g, expected %.7g (%.3gx; max |error| %.3g > bound %.3g)", name.c_str(),
                static_cast<long long>(first), got.data<float>()[first], want.data<float>()[first], ratio, err, bound);
  return buf;
}

std::string compare_with_dense_slices(const GPT2& shard, const GPT2& dense, bool grads, double rtol, double atol,
                                      double* worst) {
  for (const ParamInfo& p : shard.param_table()) {
    const Tensor got = grads ? shard.grad(p.name) : shard.param(p.name);
    const Tensor full = grads ? dense.grad(p.name) : dense.param(p.name);
    Tensor want = Tensor::empty(p.shape, DType::F32);
    copy_dense_to_shard(p, shard.shard(), full, want);
    const std::string bad = compare_tensors((grads ? "d" : "") + p.name, got, want, rtol, atol, worst);
    if (!bad.empty()) return bad;
  }
  return "";
}

}  // namespace scalelab::dp_test
