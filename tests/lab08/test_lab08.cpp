// test_lab08.cpp — lab 08's graded checks that run in one process: retention on checkpoint directories made
// here, and the automatic restart, end to end: this program runs the track's lab 08 program under mpirun
// (2 ranks), once uninterrupted and once under scripts/supervise with a fault injected (a rank killed, a rank
// hung), and compares the final checkpoints byte for byte. Lesson: labs/08_resilience/README.md ("The checks").
#include <gtest/gtest.h>

#include <cstdio>   // defines: popen, pclose
#include <cstdlib>  // defines: std::getenv
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "grading.h"                    // defines: grading::Check, grading::run
#include "resilience.h"                 // defines: lab08::retain_checkpoints, ... (the track)
#include "scalelab/core/error.h"        // defines: scalelab::Error, NotImplemented
#include "scalelab/model/checkpoint.h"  // defines: CheckpointReader, file_checksum

namespace {

using namespace scalelab;
namespace fs = std::filesystem;
namespace grading = scalelab::grading;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sl_lab08_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// A checkpoint directory of `step` made here: one shard of random bytes, its manifest, and (complete) the marker.
void make_checkpoint(const std::string& root, int64_t step, bool marker) {
  const std::string dir = lab08::step_dir(root, step);
  fs::create_directories(dir);
  const std::string shard = (fs::path(dir) / lab08::shard_file_name(0)).string();
  std::string bytes(4096, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + step * 7) & 0xff);
  write_file_atomic(shard, bytes.data(), bytes.size());
  lab08::ShardInfo s;
  s.file = lab08::shard_file_name(0);
  s.bytes = bytes.size();
  s.checksum = file_checksum(shard);
  const nlohmann::json manifest = {{"format", 1}, {"world_size", 1}, {"step", step}, {"shards", {s.to_json()}}};
  const std::string text = manifest.dump(1);
  write_file_atomic((fs::path(dir) / lab08::kManifestName).string(), text.data(), text.size());
  if (marker) write_file_atomic((fs::path(dir) / lab08::kMarkerName).string(), "done\n", 5);
}

std::string steps_left(const std::string& root) {
  std::string s;
  for (const std::string& d : lab08::list_step_dirs(root)) s += (s.empty() ? "" : " ") + std::to_string(lab08::step_of_dir(d));
  return s;
}

// ---------------------------------------------------------------------------------------------
// The end-to-end runs

struct Ran {
  int status = -1;
  std::string output;
};

// Runs a shell command, its output (stdout and stderr) captured.
Ran run_command(const std::string& cmd) {
  Ran r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// A learner's TODO that throws shows in the program's output: the check then reports not implemented.
void rethrow_not_implemented(const Ran& r) {
  const std::string mark = "[scalelab] not implemented: ";
  const size_t at = r.output.find(mark);
  if (at == std::string::npos) return;
  const size_t end = r.output.find_first_of(" \n", at + mark.size());
  throw NotImplemented(r.output.substr(at + mark.size(), end - at - mark.size()));
}

constexpr int kSteps = 9, kEvery = 3;

// mpirun -np 2 <the track's lab08_resilience> on the tiny model, checkpoints every kEvery steps into ckpt.
std::string job(const std::string& ckpt, const std::string& extra) {
  const std::string src = env_or("SL_SOURCE_DIR", ".");
  const std::string track = SL_GRADED_TRACK;
  const std::string program = env_or("SL_BINARY_DIR", ".") + "/bin/" + track + "/lab08_resilience";
  return env_or("SL_MPIEXEC", "mpirun") + " -np 2 --oversubscribe --bind-to none " + program +
         " --model tiny --seq-len 16 --micro-batch 2 --micro-batches 2 --steps " + std::to_string(kSteps) +
         " --checkpoint-every " + std::to_string(kEvery) + " --keep-last 2 --val-every 0 --val-batches 1 --quiet" +
         " --data " + src + "/data/kjv --log-dir " + ckpt + "/logs --checkpoint-dir " + ckpt + " " + extra;
}

// "" when every section of every rank's shard of the final checkpoint is the same in both roots.
std::string compare_final(const std::string& a, const std::string& b) {
  for (int r = 0; r < 2; ++r) {
    const std::string fa = (fs::path(lab08::step_dir(a, kSteps)) / lab08::shard_file_name(r)).string();
    const std::string fb = (fs::path(lab08::step_dir(b, kSteps)) / lab08::shard_file_name(r)).string();
    if (!fs::exists(fa) || !fs::exists(fb)) return "no final checkpoint " + (fs::exists(fa) ? fb : fa);
    const CheckpointReader ra(fa), rb(fb);
    if (ra.names() != rb.names()) return fa + " and " + fb + " hold different sections";
    for (const std::string& name : ra.names())
      if (name != "meta" && ra.bytes(name) != rb.bytes(name))
        return "rank " + std::to_string(r) + ": " + name + " differs from the uninterrupted run's";
  }
  return "";
}

// The uninterrupted run, then the supervised one with `fault`; returns the supervisor's report.
nlohmann::json faulted_run(const std::string& name, const std::string& fault, double heartbeat_s, std::string& problem) {
  const std::string plain = fresh_dir(name + "_plain"), faulted = fresh_dir(name + "_faulted");
  const Ran a = run_command(job(plain, ""));
  rethrow_not_implemented(a);
  if (a.status != 0) {
    problem = "the uninterrupted run failed (status " + std::to_string(a.status) + "):\n" + a.output;
    return {};
  }
  const std::string report = faulted + "/report.json";
  char hb[64];
  std::snprintf(hb, sizeof(hb), "%g", heartbeat_s);
  const Ran b = run_command(env_or("SL_SOURCE_DIR", ".") + "/scripts/supervise --max-restarts 2 --backoff-s 0.2 " +
                            "--heartbeat-timeout-s " + hb + " --startup-timeout-s 60 --heartbeat-dir " + faulted +
                            "/heartbeat --report " + report + " -- " + job(faulted, "--resume latest " + fault));
  rethrow_not_implemented(b);
  nlohmann::json rep;
  try {
    std::ifstream in(report);
    rep = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    problem = "no report from scripts/supervise (status " + std::to_string(b.status) + "):\n" + b.output;
    return {};
  }
  if (b.status != 0 || !rep.value("finished", false))
    problem = "the supervised run did not finish (status " + std::to_string(b.status) + "):\n" + b.output;
  else if (rep.value("restarts", -1) != 1)
    problem = "expected exactly 1 restart, the supervisor made " + std::to_string(rep.value("restarts", -1)) + "\n" + b.output;
  else if (rep.value("steps_repeated", -1) < 1 || rep.value("steps_repeated", -1) > kEvery)
    problem = std::to_string(rep.value("steps_repeated", -1)) + " steps were repeated; a restart from the newest "
              "complete checkpoint repeats 1 to " + std::to_string(kEvery) + " (the interval)\n" + b.output;
  else
    problem = compare_final(plain, faulted);
  if (problem.empty()) {
    fs::remove_all(plain);
    fs::remove_all(faulted);
  }
  return rep;
}

}  // namespace

TEST(Lab08Retention, RetentionKeepsNewestComplete) {
  const grading::Check check{"lab08.retention_keeps_newest_complete", 3,
                             "retain_checkpoints: steps 1-5 complete and 6 incomplete, keep 2 -> 6 5 4 left; 8, 10 "
                             "complete and 9, 11, 12 incomplete, keep 1 -> 12 11 10 left; keep 0 refused "
                             "(scalelab::Error); no root: nothing deleted",
                             "README 'Retention'"};
  grading::run(check, [](grading::Record& record) {
    const std::string root = fresh_dir("retention");
    for (int s = 1; s <= 5; ++s) make_checkpoint(root, s, true);
    make_checkpoint(root, 6, false);
    const std::vector<std::string> deleted = lab08::retain_checkpoints(root, 2);
    EXPECT_EQ(steps_left(root), "6 5 4") << "keep 2 of complete 1-5 with an incomplete 6";
    EXPECT_EQ(deleted.size(), 3u) << "it should return the 3 directories it deleted";

    const std::string root2 = fresh_dir("retention2");
    make_checkpoint(root2, 8, true);
    make_checkpoint(root2, 9, false);
    make_checkpoint(root2, 10, true);
    make_checkpoint(root2, 11, true);
    fs::resize_file(fs::path(lab08::step_dir(root2, 11)) / lab08::shard_file_name(0), 100);  // marker, short shard
    make_checkpoint(root2, 12, false);
    lab08::retain_checkpoints(root2, 1);
    EXPECT_EQ(steps_left(root2), "12 11 10") << "keep 1: the newest complete (10) and what is newer (11, 12)";

    bool refused = false;
    try {
      lab08::retain_checkpoints(root2, 0);
    } catch (const NotImplemented&) {
      throw;
    } catch (const Error&) {
      refused = true;
    }
    EXPECT_TRUE(refused) << "keep_last 0 would delete every checkpoint: it must throw scalelab::Error";
    EXPECT_EQ(steps_left(root2), "12 11 10") << "a refused call deletes nothing";
    EXPECT_TRUE(lab08::retain_checkpoints(root + "/does_not_exist", 2).empty());
    record.measured("left: %s | %s", steps_left(root).c_str(), steps_left(root2).c_str());
    fs::remove_all(root);
    fs::remove_all(root2);
  });
}

TEST(Lab08Restart, KilledRankRestartsBitExact) {
  const grading::Check check{"lab08.killed_rank_restarts_bit_exact", 5,
                             "2 ranks, 9 steps, a checkpoint every 3; rank 1 SIGKILLed at step 7 under "
                             "scripts/supervise: 1 restart, 1-3 steps repeated, the final checkpoint (parameters, "
                             "AdamW state, loader) equal to an uninterrupted run's byte for byte",
                             "README 'Automatic restart' (which checkpoint does --resume latest load?)"};
  grading::run(check, [](grading::Record& record) {
    std::string problem;
    const nlohmann::json rep = faulted_run("kill", "--fail-at-step 7 --fail-rank 1 --fail-mode kill", 30, problem);
    ASSERT_TRUE(problem.empty()) << problem;
    record.measured("1 restart, %d steps repeated, final state identical; effective training time %.0f %%",
                    rep.value("steps_repeated", -1), 100 * rep.value("effective_training_time", 0.0));
  });
}

TEST(Lab08Restart, HungRankRestarts) {
  const grading::Check check{"lab08.hung_rank_restarts", 3,
                             "2 ranks, 9 steps, a checkpoint every 3; rank 1 hangs while the checkpoint of step 6 is "
                             "written (its shard on disk, no manifest, no marker): the supervisor sees no heartbeat "
                             "for 4 s, ends the job, restarts once from step 3 (1-3 steps repeated), the final "
                             "checkpoint equal to an uninterrupted run's",
                             "README 'Automatic restart' and 'Which one to load'"};
  grading::run(check, [](grading::Record& record) {
    std::string problem;
    const nlohmann::json rep =
        faulted_run("hang", "--fail-at-step 6 --fail-rank 1 --fail-mode hang --fail-in-checkpoint --wait-timeout-s 120",
                    4, problem);
    ASSERT_TRUE(problem.empty()) << problem;
    const std::string ended = rep["attempts"][0].value("ended", "");
    EXPECT_NE(ended.find("silent"), std::string::npos) << "attempt 0 should end for silence, it ended: " << ended;
    record.measured("attempt 0: %s; %d steps repeated", ended.c_str(), rep.value("steps_repeated", -1));
  });
}
