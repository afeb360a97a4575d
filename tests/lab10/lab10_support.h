// lab10_support.h — what lab 10's graded checks share (tests/lab10/test_lab10_np*.cpp): the model they split
// along the sequence, the context-parallel setup of the track under test, the dense reference (ONE process,
// the whole sequences, computed on every rank) and the check bodies run at 2 and at 4 ranks.
// Implementation: lab10_support.cpp. What each check means: labs/10_context_parallel/README.md.
#pragma once

#include <string>

#include "context_parallel_lab.h"  // defines: lab10::* (the track under test)
#include "data_parallel.h"         // defines: dp_test::world, fresh_comm, random_global_batch, ... (tests/support)
#include "scalelab/model/gpt2.h"   // defines: GPT2, GPTConfig
#include "tensor_parallel.h"       // defines: lab05::MegatronPoints (lab 05's reference, for tp > 1)

namespace scalelab::lab10_test {

using namespace dp_test;

// maxT 16, V 64, L 2, NH 4, C 32: T = 16 splits into 2 cp = 8 chunks at cp 4.
GPTConfig cp_config();

// The cp models against the dense one, fp32: attention's sums split into blocks and merged, and the group's
// average of the ranks' gradients, in another order than the dense model's (measured at most 5.7e-7 of each
// tensor's scale on cp_config, cp 2 and 4). A mask by local positions, an unscaled merge or a dkv left on the wrong rank
// errs by O(1).
constexpr double kRtol = 1e-5;

// Check bodies; they assert through grading::all_ranks and return what they measured. cp = the world's size
// unless said otherwise.
// One forward and backward of the whole sequences split over the cp group (the point `variant`, "ring" or
// "allgather"): the group's mean loss and mean gradients against the dense model's.
std::string expect_gradients_match_dense(const std::string& variant, bool zigzag);
// Three SGD steps of lab10::train_step (the ring; gradient clipping at 1.0) on tp x cp x dp = world ranks
// against the dense model's: the loss, the whole model's gradient norm and every parameter (a tp shard's
// against the dense tensor's slice). With tp > 1 (lab 05's reference points over the tp group) the first
// step's dense norm must exceed the clip, so that the norm's tp sum decides the update.
std::string expect_sgd_steps_match_dense(int tp, int cp, bool zigzag);
// The ring's attention work per rank: balanced within 5 % with the zig-zag, the last rank cp-times-ish the
// first's without; the fully masked blocks skipped.
std::string expect_zigzag_balances_work();
// One activation set of a rank's model at the layout's T_local against the dense model's at T: exactly 1/cp.
std::string expect_activation_memory_falls_as_one_over_cp();
// lab10::make_layout: coordinates, and the refused layouts on every rank.
std::string expect_layout_and_refusals();
// visible_pairs on hand-counted blocks.
std::string expect_visible_pairs();
// On simulated H100s over a slow link (pcie), virtual time: one forward and backward with the ring that posts
// each transfer before computing is shorter, and blocked less in its waits, than with the ring that waits
// for each transfer first (RingAttention's overlap false).
std::string expect_ring_overlaps_transfers();
}  // namespace scalelab::lab10_test
