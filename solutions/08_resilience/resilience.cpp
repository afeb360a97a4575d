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
  const ShardInfo mine = write_shard(dir, r, world.rank(), st);
  const std::vector<ShardInfo> all = gather_shard_infos(world, mine);  // after it, every shard is on disk
  if (world.rank() == 0) {
    nlohmann::json manifest = describe_layout(r, zero1, world.size(), &st);
    manifest["step"] = st.step;
    manifest["shards"] = nlohmann::json::array();
    for (const ShardInfo& s : all) manifest["shards"].push_back(s.to_json());
    write_checkpoint_file((fs::path(dir) / kManifestName).string(), manifest.dump(1));
    write_checkpoint_file((fs::path(dir) / kMarkerName).string(), "step " + std::to_string(st.step) + "\n");
  }
  world.barrier();  // the checkpoint is complete for every rank when save_checkpoint returns
  // TODO(lab08-1) END
  return dir;
}

// =============================================================================================
// Is it complete?
// =============================================================================================
std::string checkpoint_problem(const std::string& dir) {
  // TODO(lab08-2) BEGIN  can this checkpoint be loaded? if not, which file says why
  const fs::path d(dir);
  std::error_code ec;
  if (!fs::exists(d / kMarkerName, ec)) return "no completion marker " + (d / kMarkerName).string();
  std::ifstream in(d / kManifestName);
  if (!in) return "no manifest " + (d / kManifestName).string();
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(in);
    manifest.at("step");
    manifest.at("shards").at(0);
  } catch (const nlohmann::json::exception& e) {
    return "manifest " + (d / kManifestName).string() + " is not a manifest: " + e.what();
  }
  for (const nlohmann::json& entry : manifest["shards"]) {
    ShardInfo s;
    try {
      s = ShardInfo::from_json(entry);
    } catch (const Error& e) {
      return "manifest " + (d / kManifestName).string() + ": " + e.what();
    }
    const fs::path file = d / s.file;
    if (!fs::exists(file, ec)) return "shard " + file.string() + " is missing";
    const uint64_t bytes = fs::file_size(file, ec);
    if (bytes != s.bytes)
      return "shard " + file.string() + " has size " + std::to_string(bytes) + " bytes, the manifest says " +
             std::to_string(s.bytes) + " (truncated?)";
    const uint32_t sum = file_checksum(file.string());
    if (sum != s.checksum) {
      std::ostringstream m;
      m << "shard " << file.string() << " fails its checksum: Adler-32 " << std::hex << sum << ", the manifest says "
        << s.checksum;
      return m.str();
    }
  }
  return "";
  // TODO(lab08-2) END
}

// =============================================================================================
// Which one to load
// =============================================================================================
CheckpointChoice newest_complete_checkpoint(const std::string& root) {
  CheckpointChoice choice;
  // TODO(lab08-3) BEGIN  newest first; the first complete one wins, each newer one is reported
  for (const std::string& dir : list_step_dirs(root)) {
    const std::string problem = checkpoint_problem(dir);
    if (problem.empty()) {
      choice.dir = dir;
      choice.step = step_of_dir(dir);
      break;
    }
    choice.skipped.push_back(dir + ": " + problem);
  }
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
  int complete_seen = 0;
  for (const std::string& dir : list_step_dirs(root)) {  // newest first
    const bool complete = checkpoint_problem(dir).empty();
    if (complete_seen == 0 && !complete) continue;  // newer than every complete one: maybe being written
    if (complete && complete_seen < keep_last) {
      ++complete_seen;
      continue;
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    deleted.push_back(dir);
  }
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
  char why[160] = "";
  if (!std::isfinite(loss)) {
    std::snprintf(why, sizeof(why), "loss %g", loss);
  } else if (!std::isfinite(grad_norm)) {
    std::snprintf(why, sizeof(why), "grad norm %g", grad_norm);
  } else if (static_cast<int>(history.size()) >= c.min_history) {
    const size_t n = std::min(history.size(), static_cast<size_t>(c.window));
    double mean = 0, var = 0;
    for (size_t i = history.size() - n; i < history.size(); ++i) mean += history[i];
    mean /= static_cast<double>(n);
    for (size_t i = history.size() - n; i < history.size(); ++i) var += (history[i] - mean) * (history[i] - mean);
    const double std = std::sqrt(var / static_cast<double>(n));
    const double z = std > 0 ? (loss - mean) / std : 0.0;
    if (z > c.z_threshold)
      std::snprintf(why, sizeof(why), "loss %.4f is z = %.1f above the mean %.4f (std %.4f) of the last %zu steps",
                    loss, z, mean, std, n);
  }
  // Everyone's decision: the lowest rank with a spike, found by a max over (size - rank), tells its reason.
  // A host value (all_reduce_value stages it through the communicator's device): 0 for "no spike here".
  const int32_t mine = why[0] != '\0' ? world.size() - world.rank() : 0;
  const int32_t lowest = all_reduce_value(world, mine, ReduceOp::Max, "spike?");
  const int winner = lowest > 0 ? world.size() - lowest : -1;
  if (winner >= 0) {
    d.rollback = true;
    d.reason = "rank " + std::to_string(winner) + ": " + broadcast_text(world, why, winner);
  }
  // TODO(lab08-5) END
  return d;
}

// =============================================================================================
// Stragglers
// =============================================================================================
std::vector<Straggler> find_stragglers(const std::vector<RankTimes>& ranks, double threshold) {
  std::vector<Straggler> slow;
  // TODO(lab08-6) BEGIN  the ranks that compute markedly longer than a typical rank, slowest first
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  };
  std::vector<double> compute, wait;
  for (const RankTimes& r : ranks) {
    compute.push_back(median(r.compute_ms));
    wait.push_back(median(r.wait_ms));
  }
  const double typical = median(compute);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (typical <= 0 || compute[i] <= threshold * typical) continue;
    Straggler s;
    s.rank = ranks[i].rank;
    s.compute_ms = compute[i];
    s.typical_compute_ms = typical;
    s.ratio = compute[i] / typical;
    for (size_t j = 0; j < ranks.size(); ++j)
      if (j != i) s.others_wait_ms += wait[j] / static_cast<double>(ranks.size() - 1);
    slow.push_back(s);
  }
  std::sort(slow.begin(), slow.end(), [](const Straggler& a, const Straggler& b) { return a.ratio > b.ratio; });
  // TODO(lab08-6) END
  return slow;
}

}  // namespace SL_TRACK_LAB08
}  // namespace scalelab::lab08
