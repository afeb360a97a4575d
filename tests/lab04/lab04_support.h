// lab04_support.h — what lab 04's graded checks share (tests/lab04/test_lab04*.cpp): the world
// communicator, the models the checks train, the reference every sharded result is compared with (ONE
// process, a plain GPT2 + Optimizer, on the whole global batch; these shared with lab 03:
// tests/support/data_parallel.h), the comparisons per unit slice, and the check bodies shared by the
// 1-, 2- and 4-rank programs. Implementation: lab04_support.cpp.
// The API under test: labs/04_fsdp/fsdp.h. The memory formulas: scalelab/measure/memory_estimator.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data_parallel.h"            // defines: dp_test::world, random_global_batch, make_model, ... (tests/support)
#include "scale_factor.h"             // defines: test::ScaleFit (a constant-factor mismatch, named)
#include "fsdp.h"                     // defines: lab04::FSDP, ZeroStage, MicroBatch (the track under test)
#include "scalelab/comm/comm.h"       // defines: Communicator
#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig
#include "scalelab/model/optim.h"     // defines: Optimizer, OptimizerConfig
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace scalelab::lab04_test {

// Shared with lab 03's checks, used here as if declared here (tests/support/data_parallel.h): the seeds
// (kModelSeed, kDataSeed), kMicroBatch, tiny_config, the world communicator (world, fresh_comm, on_rank),
// GlobalBatch and random_global_batch, and the one-process reference (make_model, one_process_train_step).
using namespace dp_test;

// Reduced gradient shards against the one-process gradient, per unit and rank:
//   || got - want ||_2 <= kGradRtol * || want ||_2 + kGradAtol   over the rank's slice [begin, begin+owned).
// Both are fp32 sums of the same B*T terms in a different order (per rank, then the reduce-scatter's
// average), so they differ by rounding: a few units of fp32's 6e-8 relative to the terms. lab 03
// measured 3.5e-7 .. 5.6e-7 per tensor (relative to its largest entry) for the same sums; the norm
// bound is looser per element and tighter for a whole slice. A real mistake is of order 1: a sum
// instead of an average is off by (N - 1)x, one rank's gradient by tens of percent, a shard at the
// wrong offset by 100 %. kGradAtol only matters for a slice whose exact gradient is ~0 (where the
// relative bound alone would ask for bit-exactness); 1e-9 is far below any real gradient's norm here.
constexpr double kGradRtol = 1e-5;
constexpr double kGradAtol = 1e-9;

// The models (every check uses one of these; all run in milliseconds per step on one core).
// tiny: tiny_config() above: units 1280, 3280, 3280, 32 elements, all divisible by 2 and 4 (no padding).
// uneven: maxT 15, V 64, L 2, NH 3, C 9: units 711, 1089, 1089, 18 elements; 711 and 1089 are odd
//         (padded at 2 and 4 ranks), 18 is padded at 4 ranks (shard 5, the last rank owns 3).
GPTConfig uneven_config();
// sliver: maxT 8, V 16, L 1, NH 1, C 3: units 72, 147, 6 elements; at 4 ranks ln_f (6) has shard 2,
//         padded 8: rank 3 owns NOTHING of it (owned 0), and 147 leaves rank 3 36 of 37.
GPTConfig sliver_config();
// memory: L 8, C 64, NH 4, V 256, maxT 32 (418,432 parameters): enough layers that 1 + prefetch
//         gathered blocks are a small part of the model, so a leak of gathered copies shows in bytes.
GPTConfig memory_config();

// ---------------------------------------------------------------------------------------------
// Data

// Rank `rank`'s micro-batches of a global batch of world x micro_steps x B rows: micro-step i takes
// rows [(i * world + rank) * B, +B) (dp_test::rank_micro_batches, as lab 03's tests).
inline std::vector<lab04::MicroBatch> rank_micro_batches(const GlobalBatch& g, int rank, int world, int micro_steps,
                                                         int B) {
  return dp_test::rank_micro_batches<lab04::MicroBatch>(g, rank, world, micro_steps, B);
}

// ---------------------------------------------------------------------------------------------
// The two sides of every comparison (the one-process side: make_model, one_process_train_step above)

// The sharded model on `comm`: FSDP(cfg, policy, CPU, kModelSeed, comm, {stage, prefetch, overlap, opt}).
std::unique_ptr<lab04::FSDP> make_fsdp(const GPTConfig& cfg, const PrecisionPolicy& policy, Communicator& comm,
                                       lab04::ZeroStage stage, const OptimizerConfig& opt, int prefetch = 1);
OptimizerConfig adamw();                                                  // betas 0.9/0.95, eps 1e-8, weight decay 0.1
OptimizerConfig sgd();                                                    // plain SGD, no weight decay
lab04::ZeroStage stage_of(int s);                                         // 1, 2, 3 -> ZeroStage
std::string stage_short(lab04::ZeroStage stage);                          // "ZeRO-1"
std::vector<int64_t> padded_sizes(const GPTConfig& cfg, int world_size);  // P_u = N * ceil(n_u / N)

// ---------------------------------------------------------------------------------------------
// Comparisons (every rank calls them; the caller reduces the result with grading::all_ranks)

struct Comparison {
  bool ok = true;
  double worst = 0.0;                 // the largest error found (see each function)
  std::string worst_name = "unit 0";  // "unit 3"
  std::string failure;                // "" when ok: the first slice over the bound, its first 5 bad indices, values
  test::ScaleFit scale;               // compare_grad_shards: got ~ k x want over every slice (a wrong scale is one k)
};
// Per unit u: grad_shard_owned(u) against want.unit_grads(u)[begin, begin + owned) (this rank's slice),
// || got - want || <= rtol || want || + atol. worst = the largest || got - want || / || want ||.
Comparison compare_grad_shards(lab04::FSDP& fsdp, const GPT2& want, double rtol, double atol);

// Parameters: every unit gathered (FSDP::gather_unit_f32, a collective) against want's unit_params
// (read as fp32). An element passes when |got - want| <= atol or, with bf16_ulps > 0, when it is within
// bf16_ulps units in the last place of bf16 at max(|got|, |want|). worst = the largest |got - want|.
// Also counts the elements that differ at all (bf16: how many roundings flipped).
struct ParamTolerance {
  double atol = 0.0;
  int bf16_ulps = 0;
};
Comparison compare_params(lab04::FSDP& fsdp, const GPT2& want, const ParamTolerance& tol, int64_t* n_differ = nullptr);

// The units every rank keeps gathered (all in ZeRO-1/2, the root units in ZeRO-3): the model's
// parameters (what the next forward reads) must equal the gathered shards bit for bit, and their
// padding must be zero. "" when so, else what differs. Collective (gathers every unit).
std::string kept_units_consistent(lab04::FSDP& fsdp);

// ---------------------------------------------------------------------------------------------
// Check bodies shared by the programs (they EXPECT through grading::all_ranks and return what they
// measured, for grading::Record::measured)

// One train_step (AdamW, no clipping, lr 1e-3) of `micro_steps` micro-batches per rank: every rank's
// grad_shard_owned(u) must equal its slice of the one-process gradient of the global batch.
std::string expect_grad_shards_match(const GPTConfig& cfg, lab04::ZeroStage stage, int micro_steps);

// `steps` train_steps beside one process training on the same global batches: after every step the
// mean loss over the ranks (relative loss_rtol), the gradient norm before clipping (relative
// loss_rtol) and every parameter (tol) must match; the kept units must be consistent
// (kept_units_consistent). With grad_clip > 0 clipping must have acted at least once.
struct StepsSpec {
  GPTConfig cfg;
  lab04::ZeroStage stage = lab04::ZeroStage::Zero3;
  PrecisionPolicy policy = PrecisionPolicy::fp32();
  OptimizerConfig opt;
  float lr = 1e-3f;
  float grad_clip = 0.0f;
  int steps = 3;
  int micro_steps = 1;
  ParamTolerance tol;
  double loss_rtol = 1e-5;
};
std::string expect_steps_match(const StepsSpec& spec);
// The AdamW steps check of one stage (2 and 4 ranks): 3 steps, lr 1e-3, clipping at 0.05 (active on
// these models, gradient norms ~0.2 to 0.5), parameters within kAdamwParamAtol (lab04_support.cpp says why).
std::string adamw_steps(int stage, const GPTConfig& cfg);

// Memory per rank on memory_config(), AdamW, prefetch 1, one micro-batch of 1 x 16 tokens: for stages
// 1..3 and policies fp32 and bf16, the allocator's Params, Grads and OptimizerState bytes (current after
// a step: persistent; peak during the next step after reset_peak) must equal
// estimate_memory(cfg, N, stage, policy, AdamW, 1, 0, 0) within kMemoryRtol.
constexpr double kMemoryRtol = 0.05;
std::string expect_memory_matches_estimate();

// The event log of one train_step of 2 micro-steps, stages 1..3, fp32 and bf16, on cfg: per unit,
// exactly the collectives the stage needs with the payload the unit's padded size gives; ZeRO-1's bus
// bytes equal an fp32 all_reduce of the padded gradients (what DDP moves).
std::string expect_communication_volume(const GPTConfig& cfg);

}  // namespace scalelab::lab04_test
