// test_lab08_np2.cpp — lab 08's graded checks on 2 ranks (mpiexec -n 2; sl_add_graded_test NP 2): the order in
// which a sharded checkpoint's files are written, and which checkpoint is loaded when the newest one is
// partial. The model is lab 07's reference at dp 2 (tiny shapes); the checkpoint functions are the track's.
// Lesson: labs/08_resilience/README.md ("The checks").
#include <gtest/gtest.h>
#include <sys/stat.h>  // defines: stat (modification times in nanoseconds)

#include <cctype>   // defines: std::tolower
#include <cstring>  // defines: std::memcmp
#include <limits>   // defines: std::numeric_limits
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data_parallel.h"              // defines: dp_test::fresh_comm, random_global_batch, batch_rows, tiny_config
#include "grading.h"                    // defines: grading::Check, grading::run, grading::all_ranks
#include "lab08_support.h"              // defines: lab08_test::all_orderings, make_ordering, chosen_step
#include "parallel_3d.h"                // defines: lab07::make_layout, build_rank, train_step (lab 07's reference)
#include "resilience.h"                 // defines: lab08::save_checkpoint, checkpoint_problem, ... (the track)
#include "scalelab/model/checkpoint.h"  // defines: file_checksum

namespace {

using namespace scalelab;
namespace fs = std::filesystem;
namespace grading = scalelab::grading;

constexpr int kT = 8;
// Modification times come from the kernel's coarse clock (a tick of up to 10 ms); the delays are 300 ms.
constexpr double kClockSlackMs = 10;

// Lab 07's reference at tp 1 x pp 1 x dp 2 on a fresh communicator, AdamW.
struct Job {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<lab07::Rank3D> rank;
  int steps = 0;
};

Job make_run() {
  Job run;
  run.world = dp_test::fresh_comm();
  const GPTConfig cfg = dp_test::tiny_config();
  const lab07::Layout layout = lab07::make_layout(cfg, {1, 1, run.world->size(), "tp-dp-pp"}, run.world->size(),
                                                  run.world->rank(), lab06::ScheduleKind::OneFOneB, 1, 1, 0, false);
  run.rank = lab07::build_rank(*run.world, cfg, layout, OptimizerConfig{}, PrecisionPolicy::fp32(), Device::CPU,
                               dp_test::kModelSeed);
  return run;
}

// One AdamW step on this replica's rows of a random global batch.
void train(Job& run) {
  const int dp = run.world->size(), d = run.world->rank();
  const dp_test::GlobalBatch g =
      dp_test::random_global_batch(dp_test::kDataSeed + run.steps, dp * dp_test::kMicroBatch, kT, 64);
  const dp_test::GlobalBatch rows =
      dp_test::batch_rows(g, static_cast<int64_t>(d) * dp_test::kMicroBatch, dp_test::kMicroBatch);
  lab07::train_step(*run.rank, {{rows.inputs, rows.targets}}, 1e-2f, 1.0f);
  ++run.steps;
}

lab08::ResumeState state_at(const Job& run) {
  lab08::ResumeState st;
  st.step = run.steps;
  st.loader = std::vector<uint8_t>(64, static_cast<uint8_t>(run.steps));
  st.rng = {1, 2, 3, static_cast<uint64_t>(run.steps)};
  return st;
}

// A fresh directory shared by the ranks (rank 0 makes it; every rank gets its name).
std::string shared_dir(Communicator& world, const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / ("sl_lab08_" + name + "_" + std::to_string(::getppid()))).string();
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  return dir;
}

double mtime_ms(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return st.st_mtim.tv_sec * 1e3 + st.st_mtim.tv_nsec / 1e6;
}

bool exists(const std::string& p) { return fs::exists(p); }

// The manifest of dir against the files: step, layout, every rank's entry. "" when it all holds.
std::string manifest_problems(const std::string& dir, const Job& run, int64_t step) {
  std::ifstream in(fs::path(dir) / lab08::kManifestName);
  if (!in) return "no manifest.json in " + dir;
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return std::string("manifest.json is not JSON: ") + e.what();
  }
  const lab08::ResumeState st = state_at(run);
  const nlohmann::json want = lab08::describe_layout(*run.rank, false, run.world->size(), &st);
  for (const auto& [key, value] : want.items())
    if (!m.contains(key) || m[key] != value) return "manifest \"" + key + "\" should be " + value.dump();
  if (m.value("step", int64_t{-1}) != step) return "manifest \"step\" should be " + std::to_string(step);
  if (!m.contains("shards") || !m["shards"].is_array() || static_cast<int>(m["shards"].size()) != run.world->size())
    return "manifest \"shards\" should list " + std::to_string(run.world->size()) + " entries, one per rank";
  for (int r = 0; r < run.world->size(); ++r) {
    lab08::ShardInfo s;
    try {
      s = lab08::ShardInfo::from_json(m["shards"][r]);
    } catch (const std::exception& e) {
      return e.what();
    }
    const std::string file = (fs::path(dir) / lab08::shard_file_name(r)).string();
    if (s.rank != r || s.file != lab08::shard_file_name(r))
      return "shards[" + std::to_string(r) + "] is not rank " + std::to_string(r) + "'s " + lab08::shard_file_name(r);
    if (!exists(file) || s.bytes != fs::file_size(file) || s.checksum != file_checksum(file))
      return "shards[" + std::to_string(r) + "]: bytes or adler32 differ from " + file;
  }
  return "";
}

}  // namespace

TEST(Lab08Save, MarkerWrittenLastTwoRanks) {
  const grading::Check check{
      "lab08.marker_written_last_two_ranks", 4,
      "save_checkpoint on 2 ranks, one with a slow disk (300 ms a file): both shards, then "
      "(rank 0 only) the manifest (step, layout, each shard's bytes and adler32), then the "
      "marker (by their modification times, the slow disk's 300 ms per file telling the order); the marker there on every rank "
      "when save_checkpoint returns",
      "README 'A sharded checkpoint'"};
  grading::run(check, [](grading::Record& record) {
    Job run = make_run();
    Communicator& w = *run.world;
    const std::string root = shared_dir(w, "order");
    std::string problem;
    // 1. Rank 1's disk is slow: the marker must wait for its shard.
    train(run);
    lab08::set_write_delay_ms(w.rank() == 1 ? 300 : 0);
    lab08::clear_file_log();
    std::string dir = lab08::save_checkpoint(w, root, *run.rank, state_at(run), false);
    lab08::set_write_delay_ms(0);
    const std::string marker = (fs::path(dir) / lab08::kMarkerName).string();
    if (dir != lab08::step_dir(root, 1)) problem = "returned " + dir + ", not " + lab08::step_dir(root, 1);
    else if (!exists(marker)) problem = "no marker when save_checkpoint returned (step 1)";
    w.barrier();
    if (problem.empty() && w.rank() == 0) {
      problem = manifest_problems(dir, run, 1);
      const double shard1 = mtime_ms((fs::path(dir) / lab08::shard_file_name(1)).string());
      if (problem.empty() && mtime_ms(marker) < shard1 - kClockSlackMs)
        problem = "the marker was written " + std::to_string(static_cast<int>(shard1 - mtime_ms(marker))) +
                  " ms before rank 1's (slow) shard was complete";
    }
    ASSERT_TRUE(grading::all_ranks(problem.empty(), problem));

    // 2. Rank 0's disk is slow: its manifest, then its marker; rank 1 returns only once the marker is there.
    train(run);
    lab08::set_write_delay_ms(w.rank() == 0 ? 300 : 0);
    lab08::clear_file_log();
    dir = lab08::save_checkpoint(w, root, *run.rank, state_at(run), false);
    lab08::set_write_delay_ms(0);
    const bool marker_on_return = exists((fs::path(dir) / lab08::kMarkerName).string());
    std::vector<std::string> written;
    for (const lab08::FileEvent& e : lab08::file_log()) written.push_back(fs::path(e.path).filename().string());
    const std::vector<std::string> want =
        w.rank() == 0 ? std::vector<std::string>{lab08::shard_file_name(0), lab08::kManifestName, lab08::kMarkerName}
                      : std::vector<std::string>{lab08::shard_file_name(1)};
    if (!marker_on_return) problem = "rank " + std::to_string(w.rank()) + ": no marker when save_checkpoint returned";
    else if (written != want) {
      problem = "rank " + std::to_string(w.rank()) + " wrote";
      for (const std::string& f : written) problem += " " + f;
      problem += " (in this order); it should write";
      for (const std::string& f : want) problem += " " + f;
    } else if (w.rank() == 0) {
      problem = manifest_problems(dir, run, 2);
      const double manifest = mtime_ms((fs::path(dir) / lab08::kManifestName).string());
      if (problem.empty() && mtime_ms((fs::path(dir) / lab08::kMarkerName).string()) < manifest + 250)
        problem = "the marker was not written after the manifest was complete";
    }
    ASSERT_TRUE(grading::all_ranks(problem.empty(), problem));
    record.measured("steps 1 and 2: shards, manifest, marker in order; the marker there on both ranks on return");
    if (w.rank() == 0) fs::remove_all(root);
  });
}

TEST(Lab08Load, PartialCheckpointsSkippedTwoRanks) {
  const grading::Check check{
      "lab08.partial_checkpoints_skipped_two_ranks", 5,
      "checkpoints of steps 2 and 4 on 2 ranks; step 4 damaged 6 ways (no marker, no manifest, "
      "a manifest cut short, rank_1.bin missing, cut by 64 bytes ('size'), one byte flipped "
      "('checksum')): each time checkpoint_problem names the file and "
      "newest_complete_checkpoint picks step 2, step 4 in skipped; intact: step 4, nothing "
      "skipped; both damaged: none; every ordering of 4 complete and incomplete checkpoints: the "
      "newest complete chosen, each newer one skipped; step 2 then loads bit for bit",
      "README 'Is it complete?' and 'Which one to load'"};
  grading::run(check, [](grading::Record& record) {
    Job run = make_run();
    Communicator& w = *run.world;
    const std::string root = shared_dir(w, "partial");
    train(run);
    train(run);
    lab08::save_checkpoint(w, root, *run.rank, state_at(run), false);
    std::vector<std::vector<uint8_t>> saved;  // this rank's state at step 2
    for (const lab08::StateTensor& s : lab08::rank_state(*run.rank)) {
      const auto* p = static_cast<const uint8_t*>(s.tensor->raw());
      saved.emplace_back(p, p + s.tensor->nbytes());
    }
    train(run);
    train(run);
    lab08::save_checkpoint(w, root, *run.rank, state_at(run), false);

    std::string problem;
    int cases = 0;
    if (w.rank() == 0) {  // the files are rank 0's to damage and judge; rank 1 waits at the barrier below
      const fs::path d4 = lab08::step_dir(root, 4), d2 = lab08::step_dir(root, 2);
      const fs::path backup = fs::path(root) / "backup", backup2 = fs::path(root) / "backup2";
      fs::copy(d4, backup);
      fs::copy(d2, backup2);
      auto judge = [&](const std::string& what, const std::string& file, const std::string& word) {
        ++cases;
        const std::string p = lab08::checkpoint_problem(d4.string());
        const lab08::CheckpointChoice c = lab08::newest_complete_checkpoint(root);
        std::string bad;
        if (p.empty()) bad = "checkpoint_problem found nothing wrong";
        else if (p.find(file) == std::string::npos) bad = "checkpoint_problem \"" + p + "\" does not name " + file;
        else if (!word.empty() && p.find(word) == std::string::npos)
          bad = "checkpoint_problem \"" + p + "\" does not say " + word;
        else if (c.step != 2 || c.dir != d2.string())
          bad = "newest_complete_checkpoint chose " + (c.dir.empty() ? "none" : c.dir);
        else if (c.skipped.size() != 1 || c.skipped[0].find(d4.string()) != 0)
          bad = "skipped should be one line that starts with " + d4.string();
        if (!bad.empty() && problem.empty()) problem = what + ": " + bad;
        fs::remove_all(d4);
        fs::copy(backup, d4);
      };
      const std::string p = lab08::checkpoint_problem(d4.string());
      const lab08::CheckpointChoice c = lab08::newest_complete_checkpoint(root);
      if (!p.empty()) problem = "intact step 4: checkpoint_problem says \"" + p + "\"";
      else if (c.step != 4 || c.dir != d4.string() || !c.skipped.empty())
        problem = "intact: newest_complete_checkpoint should choose " + d4.string() + " and skip nothing";
      ++cases;
      fs::remove(d4 / lab08::kMarkerName);
      judge("no marker", lab08::kMarkerName, "");
      fs::remove(d4 / lab08::kManifestName);
      judge("no manifest", lab08::kManifestName, "");
      fs::resize_file(d4 / lab08::kManifestName, fs::file_size(d4 / lab08::kManifestName) / 2);
      judge("a manifest cut short", lab08::kManifestName, "");
      fs::remove(d4 / lab08::shard_file_name(1));
      judge("rank_1.bin missing", lab08::shard_file_name(1), "");
      fs::resize_file(d4 / lab08::shard_file_name(1), fs::file_size(d4 / lab08::shard_file_name(1)) - 64);
      judge("rank_1.bin cut by 64 bytes", lab08::shard_file_name(1), "size");
      {
        std::fstream f(d4 / lab08::shard_file_name(1), std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(static_cast<std::streamoff>(fs::file_size(d4 / lab08::shard_file_name(1)) / 2));
        char b = 0;
        f.read(&b, 1);
        b = static_cast<char>(b ^ 0x10);
        f.seekp(static_cast<std::streamoff>(fs::file_size(d4 / lab08::shard_file_name(1)) / 2));
        f.write(&b, 1);
      }
      judge("one byte of rank_1.bin flipped", lab08::shard_file_name(1), "checksum");
      fs::remove(d4 / lab08::kMarkerName);
      fs::remove(d2 / lab08::shard_file_name(0));
      const lab08::CheckpointChoice none = lab08::newest_complete_checkpoint(root);
      ++cases;
      if (problem.empty() && (!none.dir.empty() || none.step != -1 || none.skipped.size() != 2))
        problem = "both damaged: newest_complete_checkpoint should find none and skip 2 (chose " +
                  (none.dir.empty() ? std::string("none") : none.dir) + ", skipped " +
                  std::to_string(none.skipped.size()) + ")";
      fs::remove_all(d2);
      fs::copy(backup2, d2);
      // Every ordering of 4 complete and incomplete checkpoints (lab08_support.h): the newest complete one
      // chosen, every newer one skipped, newest first, each line starting with its directory.
      for (const lab08_test::Ordering& o : lab08_test::all_orderings(4)) {
        ++cases;
        const std::string dir = (fs::path(root) / "orderings").string();
        fs::create_directories(dir);
        lab08_test::make_ordering(dir, o);
        const lab08::CheckpointChoice got = lab08::newest_complete_checkpoint(dir);
        const int64_t want = lab08_test::chosen_step(o);
        const std::vector<int64_t> skip = lab08_test::skipped_steps(o);
        std::string bad;
        if (got.step != want || got.dir != (want < 0 ? std::string() : lab08::step_dir(dir, want)))
          bad = "chose step " + std::to_string(got.step) + ", expected " + std::to_string(want);
        else if (got.skipped.size() != skip.size())
          bad = "skipped " + std::to_string(got.skipped.size()) + " lines, expected " + std::to_string(skip.size());
        for (size_t i = 0; bad.empty() && i < skip.size(); ++i)
          if (got.skipped[i].rfind(lab08::step_dir(dir, skip[i]), 0) != 0)
            bad = "skipped[" + std::to_string(i) + "] should start with " + lab08::step_dir(dir, skip[i]);
        if (!bad.empty() && problem.empty()) problem = o.describe() + ": newest_complete_checkpoint (lab08-3) " + bad;
        fs::remove_all(dir);
      }
    }
    ASSERT_TRUE(grading::all_ranks(problem.empty(), problem));
    w.barrier();
    // The choice, loaded: every rank's state is step 2's again, bit for bit.
    lab08::load_checkpoint(w, lab08::step_dir(root, 2), *run.rank, false);
    const std::vector<lab08::StateTensor> now = lab08::rank_state(*run.rank);
    bool same = now.size() == saved.size();
    for (size_t i = 0; same && i < now.size(); ++i)
      same = now[i].tensor->nbytes() == saved[i].size() &&
             std::memcmp(now[i].tensor->raw(), saved[i].data(), saved[i].size()) == 0;
    ASSERT_TRUE(grading::all_ranks(same, "step 2 loaded is not the state saved at step 2"));
    record.measured("%d cases judged", cases);
    if (w.rank() == 0) fs::remove_all(root);
  });
}

TEST(Lab08Spike, RollbackDecidedTogetherTwoRanks) {
  const grading::Check check{"lab08.rollback_decided_together_two_ranks", 3,
                             "decide_rollback on 2 ranks, 10 cases: a NaN loss or an infinite norm on ONE rank, a "
                             "loss z > 6 above the last `window` losses, rolls BOTH ranks back with the lowest such "
                             "rank's reason ('rank r: ...'); z 4, a loss below the mean, too little history, a "
                             "constant history, or a spike only when the older losses outside the window are "
                             "counted, does not",
                             "README 'Loss spikes: roll back and skip'"};
  grading::run(check, [](grading::Record& record) {
    auto w = dp_test::fresh_comm();
    const int r = w->rank();
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<float> calm;  // mean 3.0, population std 0.01 exactly: 3.01 and 2.99 alternating
    for (int i = 0; i < 10; ++i) calm.push_back(i % 2 == 0 ? 3.01f : 2.99f);
    std::vector<float> drifted(10, 5.0f);  // older losses far above: counted, they would hide the spike
    drifted.insert(drifted.end(), calm.begin(), calm.end());
    lab08::SpikeConfig c;
    c.window = 10;
    c.min_history = 8;
    c.z_threshold = 6.0;
    struct Case {
      const char* what;
      std::vector<float> history;
      float loss[2], norm[2];
      bool rollback;
      int reason_rank;  // -1: none
      const char* word;
    };
    const std::vector<Case> cases = {
        {"calm", calm, {3.005f, 3.0f}, {1, 1}, false, -1, ""},
        {"NaN loss on rank 1", calm, {3.0f, nan}, {1, 1}, true, 1, "nan"},
        {"infinite norm on rank 0", calm, {3.0f, 3.0f}, {inf, 1}, true, 0, "inf"},
        {"z 8 on rank 1", calm, {3.0f, 3.08f}, {1, 1}, true, 1, ""},
        {"z 8 on both ranks", calm, {3.08f, 3.08f}, {1, 1}, true, 0, ""},
        {"z 4", calm, {3.04f, 3.04f}, {1, 1}, false, -1, ""},
        {"far below the mean", calm, {2.5f, 2.5f}, {1, 1}, false, -1, ""},
        {"5 losses of history",
         std::vector<float>(calm.begin(), calm.begin() + 5),
         {9.0f, 9.0f},
         {1, 1},
         false,
         -1,
         ""},
        {"a constant history", std::vector<float>(10, 3.0f), {3.001f, 3.001f}, {1, 1}, false, -1, ""},
        {"older losses outside the window", drifted, {3.08f, 3.0f}, {1, 1}, true, 0, ""},
    };
    std::string problem;
    for (const Case& k : cases) {
      const lab08::SpikeDecision d = lab08::decide_rollback(*w, k.history, k.loss[r], k.norm[r], c);
      std::string bad;
      if (d.rollback != k.rollback) bad = std::string("rollback ") + (d.rollback ? "true" : "false");
      else if (k.reason_rank >= 0 && d.reason.rfind("rank " + std::to_string(k.reason_rank) + ": ", 0) != 0)
        bad = "reason \"" + d.reason + "\" should start with \"rank " + std::to_string(k.reason_rank) + ": \"";
      else if (*k.word != '\0') {
        std::string lower = d.reason;
        for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (lower.find(k.word) == std::string::npos) bad = "reason \"" + d.reason + "\" should say " + k.word;
      }
      if (!bad.empty() && problem.empty())
        problem = std::string(k.what) + ": " + bad + " (rank " + std::to_string(r) + ")";
    }
    ASSERT_TRUE(grading::all_ranks(problem.empty(), problem));
    record.measured("%zu cases decided alike on both ranks", cases.size());
  });
}
