// resilience.h — what the learner writes in lab 08 (resilience), declared once for both tracks.
//   labs/08_resilience/resilience.cpp       the learner's file (TODO blocks)   -> lab08_learner
//   solutions/08_resilience/resilience.cpp  the reference (same file, filled)  -> lab08_ref
// The two tracks live in distinct inline namespaces (scalelab::lab08::learner / ::ref) chosen by
// SL_TRACK_LAB08, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/08_resilience/README.md   Graded tests: tests/lab08/ (test_lab08*.cpp)
//
// Over thousands of GPUs and weeks, failures are routine (Llama 3: 466 interruptions in 54 days,
// Dubey et al. 2024, Sec. 3.3.4): a job survives them only if it checkpoints often and restarts on its
// own from the newest checkpoint that is complete. A checkpoint of a sharded model is many files written
// by many ranks; any of them can be missing, short or damaged when a rank dies mid-write. What you write:
//   saving               a checkpoint no crash can leave looking complete when it is not       TODO lab08-1
//   is it complete?      can this directory be loaded, and if not, which file says why         TODO lab08-2
//   which one to load    the newest complete checkpoint, saying why each newer one was skipped   TODO lab08-3
//   which ones to delete keep the last k loadable ones; never what a restart may still need     TODO lab08-4
//   roll back?           a loss spike or a NaN, decided by all ranks together                    TODO lab08-5
//   who is slow?         the straggler of a window of steps, from compute and wait times         TODO lab08-6
// The shard files, the layout's description and the loading are given (shard_state.h); the supervisor that
// restarts a failed job is scripts/supervise.
#pragma once

#include <cstdint>
#include <filesystem>  // defines: std::filesystem (fs below)
#include <string>
#include <vector>

#include "parallel_3d.h"         // defines: lab07::Rank3D (lab 07's reference)
#include "scalelab/comm/comm.h"  // defines: Communicator
#include "shard_state.h"         // defines: ShardInfo, ResumeState, write_shard, write_checkpoint_file, ... (given)

#ifndef SL_TRACK_LAB08
#define SL_TRACK_LAB08 ref
#endif

namespace scalelab::lab08 {

namespace fs = std::filesystem;  // the checkpoint's directories and files, in both tracks' resilience.cpp

inline namespace SL_TRACK_LAB08 {

// TODO(lab08-1): the checkpoint of step `st.step` under root, collective over world (every rank calls it
// with its own part r and state st). It holds every rank's shard (write_shard), a manifest (kManifestName:
// describe_layout(r, zero1, world size, &st) plus "step" and "shards", every rank's ShardInfo in rank
// order; gather_shard_infos collects them) and the completion marker (kMarkerName, any short text), the
// last two written with write_checkpoint_file. Contract: a crash of any rank at any moment leaves either a
// complete checkpoint or one that checkpoint_problem refuses; no rank returns before the checkpoint is
// complete. Returns step_dir(root, step). README.md#a-sharded-checkpoint
std::string save_checkpoint(Communicator& world, const std::string& root, lab07::Rank3D& r, const ResumeState& st,
                            bool zero1);

// TODO(lab08-2): "" if the checkpoint in `dir` is complete (everything save_checkpoint writes is there,
// whole, and as the manifest records it: load_checkpoint can trust it), else one line saying what is
// wrong and naming the file. Reads the files only; never throws for a damaged checkpoint (a crash can
// leave any of its files missing, cut short or damaged). README.md#is-it-complete
std::string checkpoint_problem(const std::string& dir);

// What to load, and what was passed over on the way.
struct CheckpointChoice {
  std::string dir;                   // the newest complete checkpoint; "" when there is none
  int64_t step = -1;                 // its step; -1 when there is none
  std::vector<std::string> skipped;  // one line per newer checkpoint passed over: "<dir>: <its problem>"
};
// TODO(lab08-3): the newest complete checkpoint under root (list_step_dirs, checkpoint_problem), every newer
// incomplete one in `skipped` with its problem, newest first. A root that does not exist: no checkpoint.
// README.md#which-one-to-load
CheckpointChoice newest_complete_checkpoint(const std::string& root);

// TODO(lab08-4): retention: keeps the `keep_last` newest checkpoints a restart could load, and never deletes
// a directory a restart may still need (whatever keep_last says: README.md#retention names the cases);
// deletes the other step directories. keep_last >= 1 (else scalelab::Error). Returns the directories
// deleted, newest first. README.md#retention
std::vector<std::string> retain_checkpoints(const std::string& root, int keep_last);

// ---------------------------------------------------------------------------------------------
// Loss spikes (README.md#loss-spikes-roll-back-and-skip)

struct SpikeConfig {
  int window = 16;           // the z-score's statistics: the last `window` accepted losses
  int min_history = 8;       // fewer accepted losses than this: only the finiteness test
  double z_threshold = 6.0;  // z = (loss - mean) / std above this is a spike (one-sided: a loss that rises)
};
struct SpikeDecision {
  bool rollback = false;
  std::string reason;  // why, the same on every rank: "rank 1: loss nan", "rank 0: grad norm inf", "rank 0: loss
                       // 5.1650 is z = 23.2 above the mean 3.1649 (std 0.0864) of the last 8 steps"
};
// TODO(lab08-5): the rollback decision of one step, taken by all ranks together (collective over world).
// Each rank judges its own (loss, grad_norm) against `history`, the losses of the steps accepted so far
// (oldest first), by README.md#loss-spikes-roll-back-and-skip's rule (a value that is not finite, or a
// loss far above the recent ones, with the statistics and the thresholds of SpikeConfig). Contract: every
// rank returns the same decision: a rollback when ANY rank saw a spike, `reason` the lowest such rank's,
// prefixed "rank <r>: ". comm/host_values.h has the host-value collectives (all_reduce_value,
// broadcast_text).
SpikeDecision decide_rollback(Communicator& world, const std::vector<float>& history, float loss, float grad_norm,
                              const SpikeConfig& c);

// ---------------------------------------------------------------------------------------------
// Stragglers (README.md#stragglers; RankTimes and Straggler: shard_state.h)

// TODO(lab08-6): the stragglers of a window: every rank whose typical compute time per step exceeds
// `threshold` times a typical rank's (threshold 1.25: 25 % slower), slowest first, with what the others
// waited (the fields of Straggler, shard_state.h). One slow step (a checkpoint, a page fault) does not
// make a straggler, and the straggler itself must not move what "typical" means: README.md#stragglers
// defines the statistic. An empty list when no rank is slow.
std::vector<Straggler> find_stragglers(const std::vector<RankTimes>& ranks, double threshold);

}  // namespace SL_TRACK_LAB08
}  // namespace scalelab::lab08
