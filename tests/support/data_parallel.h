// data_parallel.h — what the checks of the data-parallel labs share (tests/lab03 DDP, tests/lab04 FSDP):
// the program's world communicator, random global batches and each rank's micro-batches of them, and
// the reference every distributed result is compared with: ONE process, a plain GPT2 on the whole
// global batch. Implementation: data_parallel.cpp (in sl_test_support). Each lab's support header
// (tests/lab03/lab03_support.h, tests/lab04/lab04_support.h) brings these names into its namespace.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"       // defines: Communicator
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"     // defines: Optimizer
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace scalelab::dp_test {

constexpr uint64_t kModelSeed = 1337;  // parameter init of every model in a comparison
constexpr uint64_t kDataSeed = 42;     // the random global batches
constexpr int kMicroBatch = 2;         // sequences per rank per micro-step

// The tiny model (tests; GPTConfig::preset("tiny")): maxT 16, V 64, L 2, NH 2, C 16; 7,872 parameters
// in 4 units of 1280, 3280, 3280, 32 elements.
GPTConfig tiny_config();

// ---------------------------------------------------------------------------------------------
// Communicators

// The program's world: make_communicator("auto") once (mpi under mpiexec, local when run directly).
// The first call also plugs a rank reducer on a communicator of its own into the grading helpers
// (unless the program's main() already did), so grading::all_ranks and grading::run see every rank.
Communicator& world();
// A fresh communicator of all ranks with an empty event log, for one check to use. Collective.
std::unique_ptr<Communicator> fresh_comm();
// A short "rank r: " prefix for messages.
std::string on_rank(const std::string& message);

// ---------------------------------------------------------------------------------------------
// Data

// A global batch of random tokens and next-token targets, the same on every rank (seeded).
struct GlobalBatch {
  Tensor inputs;   // (B_global, T) i32, each in [0, V)
  Tensor targets;  // (B_global, T) i32, each in [0, V)
};
GlobalBatch random_global_batch(uint64_t seed, int B_global, int T, int V);

// Rows [first_row, first_row + B) of a global batch, copied: {inputs, targets}, each (B, T) i32.
GlobalBatch batch_rows(const GlobalBatch& g, int64_t first_row, int B);

// Rank `rank`'s micro-batches (one per micro-step) of a global batch of world x micro_steps x B rows:
// micro-step i takes rows [(i * world + rank) * B, +B). Any disjoint split sums to the same gradient;
// this one interleaves the ranks as lab 02's loader does. MicroBatch is the lab's own type
// (lab03::MicroBatch, lab04::MicroBatch: {inputs, targets}, each (B, T) i32).
template <class MicroBatch>
std::vector<MicroBatch> rank_micro_batches(const GlobalBatch& g, int rank, int world, int micro_steps, int B) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < micro_steps; ++i) {
    const GlobalBatch rows = batch_rows(g, (static_cast<int64_t>(i) * world + rank) * B, B);
    MicroBatch mb;
    mb.inputs = rows.inputs;
    mb.targets = rows.targets;
    out.push_back(mb);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The reference: one process, the whole global batch in one forward and backward

// The one-process model every comparison starts from: GPT2(cfg, policy, CPU, kModelSeed).
std::unique_ptr<GPT2> make_model(const GPTConfig& cfg, const PrecisionPolicy& policy = PrecisionPolicy::fp32());
// zero_grad, forward, backward of the global batch: the gradients of its mean loss, what every rank
// must hold (or its shard of) after the reduction, before clipping and the optimizer. Returns the mean
// loss (nats per token).
float one_process_gradients(GPT2& model, const GlobalBatch& g);
// One step of the same training on one process: gradients as above, clip to grad_clip, optimizer.step(lr).
// (Not named one_process_step: lab 03's checks have a one_process_step that returns the norm alone, and
// argument-dependent lookup through GlobalBatch would find both.)
struct OneProcessStep {
  float loss = 0.0f;       // mean loss of the global batch, nats per token
  float grad_norm = 0.0f;  // global L2 norm of the gradient before clipping
};
OneProcessStep one_process_train_step(GPT2& model, Optimizer& optimizer, const GlobalBatch& g, float lr,
                                      float grad_clip);

// ---------------------------------------------------------------------------------------------
// Comparisons

// max |got - want| <= rtol * max |want| + atol: "" when it holds, else the first differing index with both
// values, the ratio, the max error and the bound. worst (may be null) receives the largest error relative
// to max |want| seen. got and want: fp32 CPU tensors of the same numel.
std::string compare_tensors(const std::string& name, const Tensor& got, const Tensor& want, double rtol, double atol,
                            double* worst = nullptr);
// Per gradient (grads = true) or parameter tensor of a shard (ModelShard: a tensor-parallel slice, a
// pipeline stage, whose tied copy of wte is compared with the dense wte): max |got - want's slice| <=
// rtol * max |want's slice| (+ atol). "" when all pass, else the first tensor over the bound with its
// first differing index and both values. worst receives the largest relative error seen.
std::string compare_with_dense_slices(const GPT2& shard, const GPT2& dense, bool grads, double rtol, double atol,
                                      double* worst);

}  // namespace scalelab::dp_test
