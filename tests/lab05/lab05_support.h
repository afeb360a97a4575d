// lab05_support.h — what lab 05's graded checks share (tests/lab05/test_lab05_np*.cpp): the model they
// split, the tensor-parallel setup of the track under test, the dense reference (ONE process, the whole
// model, computed on every rank), the comparison of a shard with the matching slice of the dense model,
// and the check bodies run at 2 and at 4 ranks. Implementation: lab05_support.cpp.
// Tolerances and what each check means: labs/05_tensor_parallel/README.md ("What the tests check").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data_parallel.h"        // defines: dp_test::world, fresh_comm, random_global_batch, ... (tests/support)
#include "scalelab/comm/comm.h"   // defines: Communicator
#include "scalelab/model/gpt2.h"  // defines: GPT2, GPTConfig, ModelShard
#include "tensor_parallel.h"      // defines: lab05::* (the track under test)

namespace scalelab::lab05_test {

using namespace dp_test;

// maxT 16, V 64, L 2, NH 4, C 32: NH, 4C and V divide by 2 and 4.
GPTConfig tp_config();

// A shard of tp_config on this rank's tensor-parallel group (all ranks of `comm`, tp = comm.size()), its
// points installed, initial weights the dense model's slices (kModelSeed).
struct TpSetup {
  std::unique_ptr<Communicator> tp_group;  // a fresh communicator of all ranks (empty event log)
  std::unique_ptr<lab05::MegatronPoints> points;
  std::unique_ptr<GPT2> model;
};
TpSetup make_tp_model(const GPTConfig& cfg, bool sequence_parallel);

// Sums of B*T terms in another order (per rank, then across the group) than the dense model's: rounding.
// Measured relative to each tensor's largest entry on tp_config: at most 6e-7 (tp 2 and 4, with and
// without sequence parallelism), so the bound leaves a factor above 10. A wrong factor is order 1.
constexpr double kGradRtol = 1e-5;
// The loss: a mean of B*T per-token losses, each a log-sum-exp over V computed as tp parts.
constexpr double kLossRtol = 1e-6;

// ---------------------------------------------------------------------------------------------
// Check bodies shared by the 2- and 4-rank programs; they assert through grading::all_ranks and return
// what they measured.

std::string expect_f_and_g_exact();
std::string expect_embedding_matches_dense(bool sequence_parallel);
std::string expect_cross_entropy_matches_dense();
std::string expect_gradients_match_dense(bool sequence_parallel);
// lab05::block_split: a cut for each of the twelve block tensors, refusal of other names, and the model cut by
// it at tp = comm size equals the dense model (loss and every gradient, as expect_gradients_match_dense).
std::string expect_block_split_matches_dense();
std::string expect_sgd_steps_match_dense(bool sequence_parallel);
std::string expect_collectives_per_layer(bool sequence_parallel);
std::string expect_activation_memory_matches_formula(bool sequence_parallel);

// The kit's activation formula for one (B, T) set of a tp shard (README "Activation memory"), in bytes.
int64_t activation_set_bytes(const GPTConfig& cfg, int B, int T, int tp, bool sequence_parallel);

}  // namespace scalelab::lab05_test
