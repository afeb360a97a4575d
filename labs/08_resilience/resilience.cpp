// resilience.cpp — lab 08: checkpoints a sharded job can restart from (resilience.h). Each rank writes its
// shard, rank 0 writes the manifest and then the completion marker; a checkpoint is loaded only when its
// marker, its manifest and every shard it lists are there and intact; retention never deletes the newest
// complete one. A loss spike is decided by all ranks together; a straggler is named from compute and wait
// times. Declared in labs/08_resilience/resilience.h; the lesson is labs/08_resilience/README.md.
// Only the code between TODO(lab08-N) BEGIN/END is yours to write. The plumbing these functions call
// (shard_state.h: write_shard, gather_shard_infos, list_step_dirs, ...) is given once, in library lab08_given.
#include "resilience.h"

#include <algorithm>   // defines: std::sort, std::min
#include <cmath>       // defines: std::isfinite, std::sqrt
#include <cstdint>     // defines: int32_t
#include <cstdio>      // defines: std::snprintf
#include <filesystem>  // defines: std::filesystem::exists, file_size, remove_all
#include <fstream>     // defines: std::ifstream
#include <sstream>     // defines: std::ostringstream

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value
#include "scalelab/core/error.h"        // defines: SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/model/checkpoint.h"  // defines: file_checksum

namespace scalelab::lab08 {
inline namespace SL_TRACK_LAB08 {

// =============================================================================================
// Saving
// =============================================================================================
std::string save_checkpoint(Communicator& world, const std::string& root, lab07::Rank3D& r, const ResumeState& st,
                            bool zero1) {
  const std::string dir = step_dir(root, st.step);
  // TODO(lab08-1) BEGIN  a checkpoint that a crash at any moment cannot leave looking complete
  //   Done when: every rank's shard, the manifest and the marker are in `dir`, written in an order in which a
  //   crash of any rank at any moment leaves either a complete checkpoint or one that checkpoint_problem
  //   refuses, and no rank has returned before that. What must be on disk before the marker may say
  //   "complete", and which rank can know it? README.md#a-sharded-checkpoint
  throw scalelab::NotImplemented("lab08-1 save_checkpoint");
  // TODO(lab08-1) END
  return dir;
}

// =============================================================================================
// Is it complete?
// =============================================================================================
std::string checkpoint_problem(const std::string& dir) {
  // TODO(lab08-2) BEGIN  can this checkpoint be loaded? if not, which file says why
  //   Trust nothing a crash could have left half-done: which files could be missing, cut short or damaged,
  //   and what can you check of each without trusting it? Name the file in the answer. README.md#is-it-complete
  throw scalelab::NotImplemented("lab08-2 checkpoint_problem");
  // TODO(lab08-2) END
}

// =============================================================================================
// Which one to load
// =============================================================================================
CheckpointChoice newest_complete_checkpoint(const std::string& root) {
  CheckpointChoice choice;
  // TODO(lab08-3) BEGIN  newest first; the first complete one wins, each newer one is reported
  //   Newest first; say why each one you pass over cannot be loaded. README.md#which-one-to-load
  throw scalelab::NotImplemented("lab08-3 newest_complete_checkpoint");
  // TODO(lab08-3) END
  return choice;
}

// =============================================================================================
// Retention
// =============================================================================================
std::vector<std::string> retain_checkpoints(const std::string& root, int keep_last) {
  SL_CHECK_HINT(keep_last >= 1, "keep at least the newest complete checkpoint: --keep-last 1 or more",
                "keep_last is %d", keep_last);
  std::vector<std::string> deleted;
  // TODO(lab08-4) BEGIN  keep the newest loadable checkpoints and whatever a restart may still need
  //   Which directories can never be loaded, which may still be in the middle of being written, and which
  //   one must survive whatever keep_last says? README.md#retention
  throw scalelab::NotImplemented("lab08-4 retain_checkpoints");
  // TODO(lab08-4) END
  return deleted;
}

// =============================================================================================
// Loss spikes
// =============================================================================================
SpikeDecision decide_rollback(Communicator& world, const std::vector<float>& history, float loss, float grad_norm,
                              const SpikeConfig& c) {
  SpikeDecision d;
  // TODO(lab08-5) BEGIN  one decision for every rank: roll back or go on, and why
  //   Done when: every rank returns the same decision, a rollback exactly when some rank's step is a spike by
  //   the README's rule, with the lowest such rank's reason. What can a NaN be compared with? And a rank that
  //   rolls back alone leaves the others in a collective it never joins: what must every rank learn, and
  //   how? README.md#loss-spikes-roll-back-and-skip
  throw scalelab::NotImplemented("lab08-5 decide_rollback");
  // TODO(lab08-5) END
  return d;
}

// =============================================================================================
// Stragglers
// =============================================================================================
std::vector<Straggler> find_stragglers(const std::vector<RankTimes>& ranks, double threshold) {
  std::vector<Straggler> slow;
  // TODO(lab08-6) BEGIN  the ranks that compute markedly longer than a typical rank, slowest first
  //   Every rank of a synchronous job takes the same time per step: the straggler is the one that computes
  //   longest, while the others wait for it. What is a typical rank, and what statistic ignores one bad step?
  //   README.md#stragglers
  throw scalelab::NotImplemented("lab08-6 find_stragglers");
  // TODO(lab08-6) END
  return slow;
}

}  // namespace SL_TRACK_LAB08
}  // namespace scalelab::lab08
