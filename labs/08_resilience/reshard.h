// reshard.h — lab 08's given resharding: a checkpoint written by one layout loaded by another (4 ranks of
// dp 2 x tp 2 into 2 ranks of pp 2, say). One copy for both tracks (library lab08_given). Lesson:
// labs/08_resilience/README.md#resharding.
//
// A shard holds, per unit of the model it owns, ONE flat buffer per kind of state (the parameters, AdamW's
// m and v, the fp32 master weights): lab 05's tensor-parallel slice of every tensor of the unit, or with
// ZeRO-1 this dp rank's piece of that buffer (lab 04's ShardLayout). So every element of the dense model's
// state sits in a known place of a known shard, and a rank of the new layout can build its part alone:
//
//   for each unit u it owns, and each kind of state:
//     1. from the old shards holding u (one per old tp rank, dp rank 0; with ZeRO-1 the optimizer's pieces of
//        every dp rank, put end to end): the old tp slices of u's flat buffer
//     2. each tensor of u made dense again (copy_shard_to_dense, gpt2.h: the inverse of lab 05's slicing)
//     3. the new slice of each (copy_dense_to_shard), into the new flat buffer; with ZeRO-1 this rank's piece
//
// Nothing is communicated: every rank reads the files it needs. The last stage of a pipeline keeps its own
// copy of wte for the tied LM head (ParamInfo::tied_copy); it is equal to the first stage's wte, so it is
// never read, only written from unit 0's wte. What does NOT carry over bit for bit is the arithmetic after
// the load: the new layout sums in another order (README.md#silent-drift), so the run goes on with the same
// loss to a bound, not the same bits.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "scalelab/data/batch_source.h"  // defines: data::LoaderState, LoaderConfig
#include "shard_state.h"                 // defines: lab08::ResumeState, ShardInfo, rank_state

namespace scalelab::lab08 {

// Fills this rank's r (every tensor rank_state lists) from the checkpoint in dir, whose manifest (already
// parsed and found complete by checkpoint_problem) may be of any layout of the same model. Returns the
// resume state: the step and the sampling RNG of old rank 0, old rank 0's loader state (rebase it:
// rebase_loader_state), AdamW's step count set on every chunk. Collective over nothing. Throws
// scalelab::Error, with what to change, when the model (its config or a dense shape) or the precision
// differs, or a shard needed is damaged. r may be partly filled after a throw: the caller
// (load_checkpoint) makes every rank fail together.
ResumeState load_resharded(const std::string& dir, const nlohmann::json& manifest, lab07::Rank3D& r);

// A loader state saved by another layout, made this loader's: lab 02's loader gives dp ranks of B windows
// exactly the global batches of one rank of B x dp, so the position (seed, epoch, batch) carries over when
// B x dp_size is the same; B, dp_size and dp_rank become `now`'s. Throws scalelab::Error naming the
// --micro-batch that keeps the global batch when B x dp_size differs. At the same layout it returns the
// state unchanged (restore then checks it as before).
data::LoaderState rebase_loader_state(const data::LoaderState& saved, const data::LoaderConfig& now);

}  // namespace scalelab::lab08
