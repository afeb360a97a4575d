// shard_state.h — lab 08's given plumbing, one copy shared by both tracks (library lab08_given): what one
// rank of a 3D-parallel run holds, as named tensors; its shard file written and read back; the names and
// places of a checkpoint's files; and a log of every file a checkpoint wrote, in order, for the checks.
// The protocol around these files (the manifest, the completion marker, which checkpoint may be loaded,
// which may be deleted) is yours: resilience.h. Lesson: labs/08_resilience/README.md.
//
// A checkpoint of step s under a root directory (README.md#a-sharded-checkpoint):
//   <root>/step_00000012/rank_0.bin ... rank_<N-1>.bin   one shard per rank (checkpoint.h's file format)
//   <root>/step_00000012/manifest.json                   the layout, the step, every shard's size and checksum
//   <root>/step_00000012/COMPLETE                        the completion marker: "this checkpoint is complete"
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "parallel_3d.h"                // defines: lab07::Rank3D, Grid, Layout (lab 07's reference)
#include "scalelab/comm/comm.h"         // defines: Communicator
#include "scalelab/comm/rank_grid.h"    // defines: GridCoords
#include "scalelab/model/checkpoint.h"  // defines: CheckpointReader

namespace scalelab::lab08 {

// Milliseconds on the system clock: comparable between the processes of one machine (unlike now_ms()).
double wall_ms();

// ---------------------------------------------------------------------------------------------
// Names and places
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kMarkerName = "COMPLETE";

// "<root>/step_00000012" (8 digits, so names sort by step).
std::string step_dir(const std::string& root, int64_t step);
// The step of a directory named "…/step_<digits>", or -1 when the name has another form.
int64_t step_of_dir(const std::string& dir);
// Every "step_<digits>" directory in root, the highest step first; empty when root does not exist.
std::vector<std::string> list_step_dirs(const std::string& root);
// "rank_3.bin": the shard file of world rank `rank`, relative to its step directory.
std::string shard_file_name(int rank);

// ---------------------------------------------------------------------------------------------
// What a rank holds, and its shard file

// A tensor of a rank's training state and its name in the shard file: "c0/params/3" (chunk 0, unit 3),
// "c0/adam_m/3", "c0/adam_v/3", "c0/master/3". Units without storage on this rank are not listed. With
// ZeRO-1 the optimizer tensors are this rank's shard of them (lab 04's UnitShard).
struct StateTensor {
  std::string name;
  Tensor* tensor = nullptr;
  int chunk = 0, unit = 0;  // the parts of the name
  std::string kind;         // "params", "adam_m", "adam_v" or "master"
};
std::vector<StateTensor> rank_state(lab07::Rank3D& r);

// What a run needs besides the tensors to go on exactly where it stopped.
struct ResumeState {
  int64_t step = 0;                      // optimizer steps completed
  std::vector<uint8_t> loader;           // data::LoaderState::to_bytes() of this rank's loader
  std::array<uint64_t, 4> rng{};         // the driver's sampling RNG (Rng::state())
  std::vector<int64_t> optimizer_steps;  // per chunk (AdamW's t); filled by write_shard / read_shard
  bool resharded = false;                // load_checkpoint read another layout's shards (the loader
                                         // state is then the old rank 0's: rebase_loader_state)
};

// One rank's entry in a manifest.
struct ShardInfo {
  int rank = 0;           // world rank that wrote it
  GridCoords coords;      // its (tp, pp, dp) coordinates
  std::string file;       // shard_file_name(rank)
  uint64_t bytes = 0;     // size of the file as written
  uint32_t checksum = 0;  // Adler-32 of the whole file as written (file_checksum)
  nlohmann::json to_json() const;
  static ShardInfo from_json(const nlohmann::json& j);  // throws scalelab::Error on a missing key
};

// Writes this rank's shard <dir>/rank_<world_rank>.bin atomically and durably (CheckpointWriter::commit:
// on return the bytes are on disk under their final name), and returns its entry for the manifest. Collective
// over nothing; logged in file_log(). Throws scalelab::Error (disk full, no permission).
ShardInfo write_shard(const std::string& dir, lab07::Rank3D& r, int world_rank, const ResumeState& st);
// Reads the shard of `info` in dir into r and returns its ResumeState. Throws scalelab::Error, with r
// unchanged, if the file is damaged or was written by a rank of another layout (other coordinates, other
// shapes): loading at another layout is resharding (reshard.h). The caller checks the manifest.
ResumeState read_shard(const std::string& dir, const ShardInfo& info, lab07::Rank3D& r);
// The ResumeState a shard file holds (its meta's step and optimizer_steps, its loader and rng sections),
// without touching any model. Throws scalelab::Error for a missing section. read_shard and resharding use it.
ResumeState shard_resume_state(const CheckpointReader& shard);

// Loads the checkpoint in dir (one checkpoint_problem found complete) into every rank's r. At the layout it
// was written with, each rank reads its own shard (read_shard): the run goes on bit for bit. At another
// layout (world size, tp, pp, dp, order, ZeRO-1, schedule, micro-batches or chunks differ) it is refused
// with a hint, unless `reshard`: then every rank assembles its new part from the old shards
// (reshard.h, load_resharded) and ResumeState::resharded is set. The model must be the checkpoint's in
// both cases. Collective over world: when any rank fails, every rank throws scalelab::Error with that
// rank's reason, so none is left waiting.
ResumeState load_checkpoint(Communicator& world, const std::string& dir, lab07::Rank3D& r, bool zero1,
                            bool reshard = false);

// Every rank's ShardInfo, in rank order, on every rank. Collective over world.
std::vector<ShardInfo> gather_shard_infos(Communicator& world, const ShardInfo& mine);

// What the manifest says of the run besides its shards (given; your manifest adds "step" and "shards"):
// {"format": 1, "world_size", "layout": {tp, pp, dp, order, zero1, schedule, micro_batches, chunks},
//  "model": {n_layer, n_head, n_embd, vocab_size, max_seq_len},
//  "dense_shapes": {"wte": [V, C], "h.0.ln_1.weight": [C], ...}}: the dense model's tensors, which the
// shards hold slices of. The vocabulary is never padded (ModelShard::validate), so V is the true size.
// With `st` (rank 0's, when it writes the manifest) also where the run stands, for a reader of the manifest:
//  "resume": {"loader": {epoch, batch_in_epoch, B, dp_size, seed} (data::LoaderState; the 64 bytes as hex
//  when they are not one), "rng": [4 words], "optimizer_steps": [AdamW's t per chunk]}. The learning rate is
// a function of the step and the run's options (TrainLoop), so the step is the scheduler's whole state.
// Every shard holds its own rank's copy of the same; a load reads those.
nlohmann::json describe_layout(const lab07::Rank3D& r, bool zero1, int world_size, const ResumeState* st = nullptr);

// `text` of rank `root` on every rank (at most 1023 bytes; longer is cut). Collective over world.
std::string broadcast_text(Communicator& world, const std::string& text, int root);

// ---------------------------------------------------------------------------------------------
// The data windows a rollback skips (README.md#loss-spikes-roll-back-and-skip)

// Batches by their loader position (data::Batch's epoch and batch_in_epoch): every data-parallel rank reads
// its own windows of batch i, so skipping position i on every rank skips the whole global batch of a step.
class SkipList {
 public:
  struct Position {
    int64_t epoch = 0, batch_in_epoch = 0;
    bool operator==(const Position& o) const { return epoch == o.epoch && batch_in_epoch == o.batch_in_epoch; }
  };
  bool contains(int64_t epoch, int64_t batch_in_epoch) const;
  void add(const Position& p);  // no duplicates
  const std::vector<Position>& positions() const { return positions_; }
  // {"skip": [[epoch, batch_in_epoch], ...]} to path, atomically; load() of a missing file is an empty list,
  // of a damaged one a scalelab::Error naming it.
  void save(const std::string& path) const;
  static SkipList load(const std::string& path);

 private:
  std::vector<Position> positions_;
};

// ---------------------------------------------------------------------------------------------
// Per-rank timings (README.md#stragglers)

// One rank's timings over a window of steps: time in its own compute, time waiting in collectives.
struct RankTimes {
  int rank = 0;
  std::vector<double> compute_ms;  // per step
  std::vector<double> wait_ms;     // per step, the same steps
};
struct Straggler {
  int rank = 0;
  double compute_ms = 0;          // its median compute time per step
  double typical_compute_ms = 0;  // the median of every rank's median
  double ratio = 0;               // compute_ms / typical_compute_ms
  double others_wait_ms = 0;      // the mean over the OTHER ranks of their median wait per step
};
// Every rank's RankTimes window (`mine` on this rank; each has the last `window` steps, or fewer when fewer
// ran, the same count on every rank), in rank order, on every rank. Collective over world.
std::vector<RankTimes> gather_rank_times(Communicator& world, const RankTimes& mine, int window);
// The stragglers as the summary record's "stragglers" array (docs/log_schema.md), and as the lines rank 0
// prints under "stragglers over the last N steps:".
nlohmann::json stragglers_json(const std::vector<Straggler>& slow);
void print_stragglers(const std::vector<Straggler>& slow);

// ---------------------------------------------------------------------------------------------
// The file log (for the checks: which file of a checkpoint was written when)
struct FileEvent {
  std::string path;    // what was written
  double wall_ms = 0;  // the system clock (ms since 1970) when it was complete on disk: comparable across the
                       // processes of one machine
};
// Writes text to path atomically (write_file_atomic) and logs it. Use it for the manifest and the marker.
void write_checkpoint_file(const std::string& path, const std::string& text);
// A slow disk, simulated: write_shard and write_checkpoint_file of this process sleep this long before
// writing (0: none). The checks use it to make one rank late.
void set_write_delay_ms(double ms);
// What write_shard and write_checkpoint_file wrote in this process, in order; clear_file_log() empties it.
const std::vector<FileEvent>& file_log();
void clear_file_log();

}  // namespace scalelab::lab08
