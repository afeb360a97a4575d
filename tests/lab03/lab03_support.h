// lab03_support.h — what lab 03's graded checks share (tests/lab03/test_lab03*.cpp): the world
// communicator, the reference every reduced gradient is compared with (ONE process training on the
// whole global batch), the split of that batch across ranks and micro-steps (these three shared with
// lab 04: tests/support/data_parallel.h), and the comparisons.
// Implementation: lab03_support.cpp. The checks and their tolerances: labs/03_ddp/README.md
// ("What the tests check").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data_parallel.h"         // defines: dp_test::world, random_global_batch, make_model, ... (tests/support)
#include "scale_factor.h"          // defines: test::ScaleFit (a constant-factor mismatch, named)
#include "ddp.h"                   // defines: lab03::MicroBatch, GradSync, SyncMode (the track under test)
#include "scalelab/comm/comm.h"    // defines: Communicator
#include "scalelab/model/gpt2.h"   // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"  // defines: OptimizerConfig

namespace scalelab::lab03_test {

// Shared with lab 04's checks, used here as if declared here (tests/support/data_parallel.h): the seeds
// (kModelSeed, kDataSeed), kMicroBatch, tiny_config, the world communicator (world, fresh_comm, on_rank),
// GlobalBatch and random_global_batch, and the one-process reference.
using namespace dp_test;

// Reduced gradients against the one-process gradient, per tensor: max |got - want| <= kGradRtol *
// max |want| of that tensor. Both are fp32 sums of the same B*T terms in a different order (per rank
// and micro-step, then across ranks), so they differ by rounding: a few units of fp32's 6e-8 times the
// terms' spread. Measured on the tiny model, relative to the tensor's largest entry: 3.5e-7 (2 ranks),
// 5.1e-7 (4 ranks), 5.6e-7 (2 ranks x 2 micro-steps), so the bound leaves a factor ~20. A real mistake
// is of order 1: a sum instead of an average is off by (world - 1) x, a missing 1/m by (m - 1) x, a
// bucket not reduced keeps one rank's gradient, which differs from the mean by tens of percent.
constexpr double kGradRtol = 1e-5;

// A bucket size for the tiny model that gives buckets spanning two units, buckets inside one unit and
// a tensor larger than the bucket: 1,000 elements (0.0038 MiB).
constexpr double kTinyBucketMb = 1000.0 * 4 / 1048576.0;

// Rank `rank`'s micro-batches (one per micro-step) of a global batch of world x micro_steps x B rows:
// micro-step i takes rows [(i * world + rank) * B, +B) (dp_test::rank_micro_batches).
inline std::vector<lab03::MicroBatch> rank_micro_batches(const GlobalBatch& g, int rank, int world, int micro_steps,
                                                         int B) {
  return dp_test::rank_micro_batches<lab03::MicroBatch>(g, rank, world, micro_steps, B);
}

// One step of one process on the whole global batch (dp_test::one_process_train_step): gradients, clip,
// optimizer.step(lr). Returns the gradient norm before clipping.
inline float one_process_step(GPT2& model, Optimizer& optimizer, const GlobalBatch& g, float lr, float grad_clip) {
  return dp_test::one_process_train_step(model, optimizer, g, lr, grad_clip).grad_norm;
}

// ---------------------------------------------------------------------------------------------
// Comparisons (every rank calls them; the caller reduces the result with grading::all_ranks)

struct Comparison {
  bool ok = true;
  double worst = 0.0;      // the largest error found (relative or absolute, see the function)
  std::string worst_name;  // the tensor it is in
  std::string failure;     // "" when ok: the first tensor over the bound, its first 5 bad indices, values,
                           // and its factor when it is the expected tensor times a constant
  test::ScaleFit scale;    // got ~ k x want over every tensor compared (a wrong scale is one k everywhere)
};
// Per gradient tensor: max |got - want| <= rtol * max |want| (relative to the tensor's largest entry).
Comparison compare_gradients(const GPT2& got, const GPT2& want, double rtol);
// Per parameter tensor: max |got - want| <= atol.
Comparison compare_parameters(const GPT2& got, const GPT2& want, double atol);
// What a failed gradient comparison says: "every gradient tensor is 2.00x the one-process gradient
// (summed over the 2 ranks instead of averaged?)" when one factor explains all of them, else c.failure
// (the first tensor over the bound, its first bad indices and values).
std::string gradient_failure(const Comparison& c, int world, int micro_steps);

// A fingerprint of every gradient (grads = true) or parameter, bit for bit (FNV-1a 64 over the bytes).
std::string fingerprint(const GPT2& model, bool grads);
// Collective: "" if every rank has rank 0's fingerprint, else which ranks differ.
std::string ranks_differing_from_rank0(const std::string& fingerprint);

// ---------------------------------------------------------------------------------------------
// Check bodies shared by the 2- and 4-rank programs (they EXPECT through grading::all_ranks and return
// what they measured, for grading::Record::measured)

// One backward of this rank's micro-batch of a global batch of kMicroBatch x ranks sequences,
// synchronised by the track in `mode` (GradSync::finish): every gradient tensor must equal the
// one-process gradient within kGradRtol, and be identical on every rank.
std::string expect_reduced_gradients_match(lab03::SyncMode mode);

// `steps` calls of the track's train_step (micro_steps per rank) beside one process training on the
// same global batches: after every step the gradients (compared only when grad_clip <= 0: clipping
// rescales them) and the parameters (within param_atol) must match, and the parameters must be
// identical on every rank. With grad_clip > 0 it also insists that clipping acted at least once.
std::string expect_steps_match(lab03::SyncMode mode, const OptimizerConfig& opt_cfg, float lr, float grad_clip,
                               int steps, int micro_steps, double param_atol);

}  // namespace scalelab::lab03_test
