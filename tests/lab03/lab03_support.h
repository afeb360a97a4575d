// lab03_support.h — what lab 03's graded checks share (tests/lab03/test_lab03*.cpp): the world
// communicator, the reference every reduced gradient is compared with (ONE process training on the
// whole global batch), the split of that batch across ranks and micro-steps, and the comparisons.
// Implementation: lab03_support.cpp. The checks and their tolerances: labs/03_ddp/README.md
// ("What the tests check").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp.h"                // defines: lab03::MicroBatch, GradSync, SyncMode (the track under test)
#include "scalelab/comm.h"      // defines: Communicator
#include "scalelab/gpt2.h"      // defines: GPT2, GPTConfig
#include "scalelab/optim.h"     // defines: OptimizerConfig

namespace scalelab::lab03_test {

constexpr uint64_t kModelSeed = 1337;  // parameter init of every model in a comparison
constexpr uint64_t kDataSeed = 42;     // the random global batches
constexpr int kMicroBatch = 2;         // sequences per rank per micro-step

// Reduced gradients against the one-process gradient, per tensor: max |got - want| <= kGradRtol *
// max |want| of that tensor. Both are fp32 sums of the same B*T terms in a different order (per rank
// and micro-step, then across ranks), so they differ by rounding: a few units of fp32's 6e-8 times the
// terms' spread. Measured on the tiny model, relative to the tensor's largest entry: 3.5e-7 (2 ranks),
// 5.1e-7 (4 ranks), 5.6e-7 (2 ranks x 2 micro-steps), so the bound leaves a factor ~20. A real mistake
// is of order 1: a sum instead of an average is off by (world - 1) x, a missing 1/m by (m - 1) x, a
// bucket not reduced keeps one rank's gradient, which differs from the mean by tens of percent.
constexpr double kGradRtol = 1e-5;

// The tiny model (tests; GPTConfig::preset("tiny")): 7,872 parameters in 4 units.
GPTConfig tiny_config();
// A bucket size for the tiny model that gives buckets spanning two units, buckets inside one unit and
// a tensor larger than the bucket: 1,000 elements (0.0038 MiB).
constexpr double kTinyBucketMb = 1000.0 * 4 / 1048576.0;

// ---------------------------------------------------------------------------------------------
// Communicators

// The program's world: make_communicator("auto") once (mpi under mpiexec, local when run directly).
// The first call also plugs a rank reducer on a communicator of its own into the grading helpers
// (unless the program's main() already did), so grading::all_ranks and grading::run see every rank.
Communicator& world();
// A fresh communicator of all ranks with an empty event log, for one check to inspect. Collective.
std::unique_ptr<Communicator> fresh_comm();

// ---------------------------------------------------------------------------------------------
// Data

// A global batch of random tokens and next-token targets, the same on every rank (seeded).
struct GlobalBatch {
  Tensor inputs;   // (B_global, T) i32
  Tensor targets;  // (B_global, T) i32
};
GlobalBatch random_global_batch(uint64_t seed, int B_global, int T, int V);

// Rank `rank`'s micro-batches (one per micro-step) of a global batch of world x micro_steps x B rows:
// micro-step i takes rows [(i * world + rank) * B, +B). Any disjoint split sums to the same gradient;
// this one interleaves the ranks as lab 02's loader does.
std::vector<lab03::MicroBatch> rank_micro_batches(const GlobalBatch& g, int rank, int world, int micro_steps, int B);

// ---------------------------------------------------------------------------------------------
// The reference: one process, the whole global batch in one forward and backward

// The model every check starts from: kModelSeed, fp32, CPU.
std::unique_ptr<GPT2> make_model(const GPTConfig& cfg);
// The gradients of the global batch's mean loss, as one process computes them (zero_grad, forward,
// backward): what every rank must hold after the all-reduce, before clipping and the optimizer.
void one_process_gradients(GPT2& model, const GlobalBatch& g);
// One step of the same training on one process: gradients as above, clip, optimizer.step(lr).
// Returns the gradient norm before clipping.
float one_process_step(GPT2& model, Optimizer& optimizer, const GlobalBatch& g, float lr, float grad_clip);

// ---------------------------------------------------------------------------------------------
// Comparisons (every rank calls them; the caller reduces the result with grading::all_ranks)

struct Comparison {
  bool ok = true;
  double worst = 0.0;      // the largest error found (relative or absolute, see the function)
  std::string worst_name;  // the tensor it is in
  std::string failure;     // "" when ok: the first tensor over the bound, its first 5 bad indices, values
};
// Per gradient tensor: max |got - want| <= rtol * max |want| (relative to the tensor's largest entry).
Comparison compare_gradients(const GPT2& got, const GPT2& want, double rtol);
// Per parameter tensor: max |got - want| <= atol.
Comparison compare_parameters(const GPT2& got, const GPT2& want, double atol);

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

// A short "rank r: ..." prefix for messages.
std::string on_rank(const std::string& message);

}  // namespace scalelab::lab03_test
