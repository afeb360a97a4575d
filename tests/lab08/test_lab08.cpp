// test_lab08.cpp — lab 08's graded checks that run in one process: retention on checkpoint directories made
// here, and end to end: this program runs the track's lab 08 program under mpirun, once uninterrupted and
// once under scripts/supervise with a fault injected (a rank killed, a rank hung), and compares the final
// checkpoints byte for byte; the same for a poisoned window rolled back; and a checkpoint of 4 ranks loaded
// by 2 of another layout, whose losses are compared. Lesson: labs/08_resilience/README.md ("The checks").
#include <gtest/gtest.h>

#include <algorithm>  // defines: std::max
#include <cmath>      // defines: std::abs
#include <cstdio>     // defines: popen, pclose
#include <cstdlib>    // defines: std::getenv
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "grading.h"                    // defines: grading::Check, grading::run, grading::error_excerpt
#include "lab08_support.h"              // defines: make_checkpoint, steps_left, all_orderings, retained_steps
#include "resilience.h"                 // defines: lab08::retain_checkpoints, ... (the track)
#include "scalelab/core/error.h"        // defines: scalelab::Error, NotImplemented
#include "scalelab/model/checkpoint.h"  // defines: CheckpointReader, file_checksum

namespace {

using namespace scalelab;
using namespace scalelab::lab08_test;
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

// A learner's TODO that throws shows in the program's output: the check then reports not implemented, naming
// the program's place of the throw ("lab08-5 decide_rollback (labs/08_resilience/resilience.cpp:130)").
void rethrow_not_implemented(const Ran& r) {
  const std::string mark = "[scalelab] not implemented: ";
  const size_t at = r.output.find(mark);
  if (at == std::string::npos) return;
  const size_t open = r.output.find_first_of("(\n", at + mark.size());
  const std::string todo = r.output.substr(at + mark.size(), open - 1 - at - mark.size());
  const size_t close = r.output.find(')', open);
  const std::string where = open != std::string::npos && r.output[open] == '(' && close != std::string::npos
                                ? r.output.substr(open + 1, close - open - 1)
                                : "";
  const size_t colon = where.rfind(':');
  if (colon == std::string::npos) throw NotImplemented(todo);
  throw NotImplemented(todo, ("/" + where.substr(0, colon)).c_str(), std::atoi(where.c_str() + colon + 1));
}

constexpr int kSteps = 9, kEvery = 3;
// The restart checks need lab08-1 to lab08-4 only: no rollback decision, no straggler report.
const std::string kRestartOnly = "--spike-z 0 --straggler-window 0";

// mpirun -np <ranks> <the track's lab08_resilience> on the tiny model, `steps` steps, a checkpoint every `every`
// into ckpt, its logs in ckpt/logs. `layout`: the grid and the micro-batch size.
std::string job_at(int ranks, const std::string& layout, const std::string& ckpt, const std::string& extra, int steps,
                   int every) {
  const std::string src = env_or("SL_SOURCE_DIR", ".");
  const std::string track = SL_GRADED_TRACK;
  const std::string program = env_or("SL_BINARY_DIR", ".") + "/bin/" + track + "/lab08_resilience";
  return env_or("SL_MPIEXEC", "mpirun") + " -np " + std::to_string(ranks) + " --oversubscribe --bind-to none " +
         program + " --model tiny --seq-len 16 --micro-batches 2 " + layout + " --steps " + std::to_string(steps) +
         " --checkpoint-every " + std::to_string(every) + " --keep-last 2 --val-every 0 --val-batches 1 --quiet" +
         " --data " + src + "/data/kjv --log-dir " + ckpt + "/logs --checkpoint-dir " + ckpt + " " + extra;
}
// The end-to-end checks train on data/kjv: "" when its training shards are there, else why a check that
// needs them is skipped and the command that makes them (scripts/grade and scripts/run make it themselves).
std::string corpus_missing() {
  const fs::path kjv = fs::path(env_or("SL_SOURCE_DIR", ".")) / "data" / "kjv";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(kjv, ec))
    if (e.path().filename().string().rfind("train_", 0) == 0) return "";
  return "the corpus " + kjv.string() +
         " is missing: make it from the repository root with scripts/prepare_corpus.sh --build-dir " +
         env_or("SL_BINARY_DIR", "build") + " --out data/kjv (scripts/grade 08 makes it when it can)";
}

// The restart and rollback checks: 2 ranks of plain data parallelism.
std::string job(const std::string& ckpt, const std::string& extra, int steps = kSteps, int every = kEvery) {
  return job_at(2, "--micro-batch 2", ckpt, extra, steps, every);
}

// Rank 0's step losses of the runs logged under log_root, by step.
std::map<int64_t, double> step_losses(const std::string& log_root) {
  std::map<int64_t, double> loss;
  for (const auto& e : fs::recursive_directory_iterator(log_root)) {
    if (e.path().filename() != "rank0.jsonl") continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (rec.is_object() && rec.value("type", "") == "step" && rec["loss"].is_number())
        loss[rec["step"].get<int64_t>()] = rec["loss"].get<double>();
    }
  }
  return loss;
}

// "" when every section of every rank's shard of the final checkpoint (step `steps`) is the same in both roots.
std::string compare_final(const std::string& a, const std::string& b, int steps = kSteps) {
  for (int r = 0; r < 2; ++r) {
    const std::string fa = (fs::path(lab08::step_dir(a, steps)) / lab08::shard_file_name(r)).string();
    const std::string fb = (fs::path(lab08::step_dir(b, steps)) / lab08::shard_file_name(r)).string();
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
nlohmann::json faulted_run(const std::string& name, const std::string& fault, double heartbeat_s,
                           std::string& problem) {
  const std::string plain = fresh_dir(name + "_plain"), faulted = fresh_dir(name + "_faulted");
  const Ran a = run_command(job(plain, kRestartOnly));
  rethrow_not_implemented(a);
  if (a.status != 0) {
    problem = "the uninterrupted run failed (status " + std::to_string(a.status) + "):\n" +
              grading::error_excerpt(a.output);
    return {};
  }
  const std::string report = faulted + "/report.json";
  char hb[64];
  std::snprintf(hb, sizeof(hb), "%g", heartbeat_s);
  const Ran b = run_command(env_or("SL_SOURCE_DIR", ".") + "/scripts/supervise --max-restarts 2 --backoff-s 0.2 " +
                            "--heartbeat-timeout-s " + hb + " --startup-timeout-s 60 --heartbeat-dir " + faulted +
                            "/heartbeat --report " + report + " -- " +
                            job(faulted, kRestartOnly + " --resume latest " + fault));
  rethrow_not_implemented(b);
  nlohmann::json rep;
  try {
    std::ifstream in(report);
    rep = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    problem = "no report from scripts/supervise (status " + std::to_string(b.status) + "):\n" +
              grading::error_excerpt(b.output);
    return {};
  }
  if (b.status != 0 || !rep.value("finished", false))
    problem = "the supervised run did not finish (status " + std::to_string(b.status) + "):\n" +
              grading::error_excerpt(b.output);
  else if (rep.value("restarts", -1) != 1)
    problem = "expected exactly 1 restart, the supervisor made " + std::to_string(rep.value("restarts", -1)) + "\n" +
              grading::error_excerpt(b.output);
  else if (rep.value("steps_repeated", -1) < 1 || rep.value("steps_repeated", -1) > kEvery)
    problem = std::to_string(rep.value("steps_repeated", -1)) +
              " steps were repeated; a restart from the newest "
              "complete checkpoint repeats 1 to " +
              std::to_string(kEvery) + " (the interval)\n" + grading::error_excerpt(b.output);
  else problem = compare_final(plain, faulted);
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
                             "(scalelab::Error); no root: nothing deleted; and every ordering of 5 complete and "
                             "incomplete checkpoints with keep 1, 2, 3 leaves what the rule says",
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

    // Every ordering of 5 complete and incomplete checkpoints (an incomplete one between complete ones
    // too), keep 1, 2 and 3: what is left against the README's rule, computed without walking them.
    int orderings = 0;
    std::string first_wrong;
    for (const Ordering& o : all_orderings(5))
      for (int keep = 1; keep <= 3; ++keep) {
        const std::string dir = fresh_dir("retention_orderings");
        make_ordering(dir, o);
        lab08::retain_checkpoints(dir, keep);
        const std::string got = steps_left(dir), want = retained_steps(o, keep);
        ++orderings;
        if (got != want && first_wrong.empty())
          first_wrong = "lab08-4 retain_checkpoints: " + o.describe() + "; keep " + std::to_string(keep) + ": left \"" +
                        got + "\", expected \"" + want + "\"";
        fs::remove_all(dir);
      }
    EXPECT_TRUE(first_wrong.empty()) << first_wrong;
    record.measured("left: %s | %s; %d orderings of 5 checkpoints x keep 1-3%s", steps_left(root).c_str(),
                    steps_left(root2).c_str(), orderings,
                    first_wrong.empty() ? " as the rule says" : (", first wrong: " + first_wrong).c_str());
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
    const std::string no_corpus = corpus_missing();
    if (!no_corpus.empty()) GTEST_SKIP() << no_corpus;
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
    const std::string no_corpus = corpus_missing();
    if (!no_corpus.empty()) GTEST_SKIP() << no_corpus;
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

TEST(Lab08Straggler, StragglerStatistic) {
  const grading::Check check{"lab08.straggler_statistic", 3,
                             "find_stragglers on 6 windows made here: a rank 2x slower named (the others' wait "
                             "beside it), the ranks that waited for it not; none when all are within 10 %; one slow "
                             "step of 8 is not a straggler (medians); two slow ranks slowest first; 5 ranks, even "
                             "step counts; threshold respected",
                             "README 'Stragglers'"};
  grading::run(check, [](grading::Record& record) {
    // Rank r's window: `compute` ms per step (one step replaced by `outlier` when > 0), `wait` ms per step.
    auto window = [](int rank, double compute, double wait, int steps, double outlier = 0) {
      lab08::RankTimes t;
      t.rank = rank;
      for (int i = 0; i < steps; ++i) {
        t.compute_ms.push_back(i == 3 && outlier > 0 ? outlier : compute + 0.1 * (i % 3));
        t.wait_ms.push_back(wait);
      }
      return t;
    };
    auto names = [](const std::vector<lab08::Straggler>& v) {
      std::string s;
      for (const lab08::Straggler& x : v) s += (s.empty() ? "" : ",") + std::to_string(x.rank);
      return s;
    };
    // Rank 1 computes 20 ms, the others 10 and wait 10 for it: only rank 1.
    std::vector<lab08::Straggler> got = lab08::find_stragglers({window(0, 10, 10, 7), window(1, 20, 0.2, 7),
                                                                window(2, 10, 10, 7), window(3, 10, 10, 7)},
                                                               1.25);
    EXPECT_EQ(names(got), "1") << "rank 1 computes twice as long; ranks 0, 2, 3 only wait for it";
    if (got.size() == 1) {
      EXPECT_NEAR(got[0].ratio, 2.0, 0.05) << "ratio = its median compute / the median of the medians";
      EXPECT_NEAR(got[0].others_wait_ms, 10.0, 1e-9) << "others_wait_ms: the mean of the other ranks' median waits";
      EXPECT_NEAR(got[0].typical_compute_ms, 10.1, 0.05);
    }
    EXPECT_EQ(names(lab08::find_stragglers({window(0, 10, 1, 6), window(1, 10.9, 0, 6), window(2, 10, 1, 6)}, 1.25)),
              "")
        << "every rank within 10 %: no straggler";
    EXPECT_EQ(names(lab08::find_stragglers({window(0, 10, 1, 8, 100), window(1, 10, 1, 8), window(2, 10, 1, 8)}, 1.25)),
              "")
        << "one step of 100 ms among 8 of 10 ms (a checkpoint, a page fault) is not a straggler";
    EXPECT_EQ(names(lab08::find_stragglers({window(0, 10, 9, 8), window(1, 15, 4, 8), window(2, 19, 0, 8),
                                            window(3, 10, 9, 8), window(4, 10, 9, 8)},
                                           1.25)),
              "2,1")
        << "two slow ranks (19 and 15 ms against 10), slowest first";
    EXPECT_EQ(names(lab08::find_stragglers({window(0, 10, 5, 4), window(1, 12, 3, 4), window(2, 10, 5, 4)}, 1.25)), "")
        << "12 ms against 10 is under the threshold 1.25";
    EXPECT_EQ(names(lab08::find_stragglers({window(0, 10, 5, 4), window(1, 12, 3, 4), window(2, 10, 5, 4)}, 1.1)), "1")
        << "... and over the threshold 1.1";
    record.measured("6 windows judged");
  });
}

TEST(Lab08Rollback, PoisonedWindowRollsBack) {
  const grading::Check check{"lab08.poisoned_window_rolls_back", 4,
                             "2 ranks, 112 steps, a checkpoint every 10; rank 1's windows of step 105 are garbage "
                             "(every target byte 0): both ranks roll back to step 100 and skip those 2 windows; the "
                             "final checkpoint equals that of a run that skipped them from the start (--skip-list)",
                             "README 'Loss spikes: roll back and skip'"};
  grading::run(check, [](grading::Record& record) {
    const std::string no_corpus = corpus_missing();
    if (!no_corpus.empty()) GTEST_SKIP() << no_corpus;
    constexpr int kLong = 112, kEveryLong = 10;
    const std::string spiked = fresh_dir("spiked"), clean = fresh_dir("clean");
    const std::string spike = " --spike-window 8 --spike-min-history 8 --spike-z 6 --straggler-window 0";
    const Ran a = run_command(job(spiked, "--poison-at-step 105 --poison-rank 1" + spike, kLong, kEveryLong));
    rethrow_not_implemented(a);
    ASSERT_EQ(a.status, 0) << "the run with the poisoned windows failed:\n" << grading::error_excerpt(a.output);
    ASSERT_NE(a.output.find("rollback at step 105"), std::string::npos)
        << "no rollback at step 105 (the loss there is far above the last 8):\n"
        << grading::error_excerpt(a.output);
    ASSERT_NE(a.output.find("back to step 100"), std::string::npos) << "the rollback should go back to step 100:\n"
                                                                    << grading::error_excerpt(a.output);
    int ranks_rolled_back = 0;  // every rank's log has its own rollback record
    for (const auto& e : fs::recursive_directory_iterator(spiked + "/logs")) {
      if (e.path().extension() != ".jsonl") continue;
      std::ifstream in(e.path());
      for (std::string line; std::getline(in, line);)
        if (line.find("\"rollback\"") != std::string::npos && line.find("\"to_step\":100") != std::string::npos)
          ++ranks_rolled_back;
    }
    EXPECT_EQ(ranks_rolled_back, 2) << "both ranks log one rollback record (type rollback, to_step 100)";
    const lab08::SkipList skipped = lab08::SkipList::load(spiked + "/skip_list.json");
    ASSERT_EQ(skipped.positions().size(), 2u) << "the skip list should hold the 2 windows of step 105";
    fs::copy_file(spiked + "/skip_list.json", clean + "/skip_these.json");
    const Ran b = run_command(job(clean, "--skip-list " + clean + "/skip_these.json" + spike, kLong, kEveryLong));
    ASSERT_EQ(b.status, 0) << "the run that skips them from the start failed:\n" << grading::error_excerpt(b.output);
    EXPECT_EQ(b.output.find("rollback"), std::string::npos) << "the clean run rolled back:\n"
                                                            << grading::error_excerpt(b.output);
    const std::string diff = compare_final(spiked, clean, kLong);
    ASSERT_TRUE(diff.empty()) << diff;
    record
        .measured("rolled back 105 -> 100 on both ranks, 2 windows skipped, final state identical to the clean run's");
    fs::remove_all(spiked);
    fs::remove_all(clean);
  });
}

TEST(Lab08Reshard, ReshardedContinuesWithinBound) {
  const grading::Check check{"lab08.resharded_continues_within_bound", 4,
                             "4 ranks (dp 2 x tp 2, micro-batch 2) train 4 steps and checkpoint; the checkpoint is "
                             "loaded by 2 ranks of pp 2 (micro-batch 4: the same global batches) with --reshard "
                             "(without it: refused, naming --reshard), and steps 4-7 have the losses of the 4 ranks "
                             "going on at their own layout to 1e-4 nats",
                             "README 'Resharding'"};
  grading::run(check, [](grading::Record& record) {
    const std::string no_corpus = corpus_missing();
    if (!no_corpus.empty()) GTEST_SKIP() << no_corpus;
    constexpr int kFirst = 4, kLast = 8;  // checkpoint after step 4; go on to 8
    constexpr double kBound = 1e-4;       // nats per step (README 'Resharding': measured 0 at the log's float32)
    const std::string first = fresh_dir("reshard_first"), same = fresh_dir("reshard_same"),
                      other = fresh_dir("reshard_other");
    const std::string dp2tp2 = "--tp 2 --micro-batch 2", pp2 = "--pp 2 --micro-batch 4";
    const std::string quiet = " --spike-z 0 --straggler-window 0";
    const Ran a = run_command(job_at(4, dp2tp2, first, quiet, kFirst, kFirst));
    rethrow_not_implemented(a);
    ASSERT_EQ(a.status, 0) << "4 ranks, dp 2 x tp 2, failed:\n" << grading::error_excerpt(a.output);
    const std::string ckpt = lab08::step_dir(first, kFirst);
    ASSERT_TRUE(lab08::checkpoint_problem(ckpt).empty()) << lab08::checkpoint_problem(ckpt);
    for (const std::string& to : {same, other})
      fs::copy(ckpt, lab08::step_dir(to, kFirst), fs::copy_options::recursive);

    const std::string resume = quiet + " --resume latest";
    const Ran refused = run_command(job_at(2, pp2, other, resume, kLast, kLast));
    EXPECT_NE(refused.status, 0) << "a checkpoint of another layout was loaded without --reshard:\n"
                                 << grading::error_excerpt(refused.output);
    EXPECT_NE(refused.output.find("--reshard"), std::string::npos) << "the refusal should name --reshard:\n"
                                                                   << grading::error_excerpt(refused.output);
    fs::remove_all(other + "/logs");
    const Ran b = run_command(job_at(4, dp2tp2, same, resume, kLast, kLast));
    ASSERT_EQ(b.status, 0) << "going on at dp 2 x tp 2 failed:\n" << grading::error_excerpt(b.output);
    const Ran c = run_command(job_at(2, pp2, other, resume + " --reshard", kLast, kLast));
    ASSERT_EQ(c.status, 0) << "resharding to pp 2 failed:\n" << grading::error_excerpt(c.output);
    EXPECT_NE(c.output.find("resharded"), std::string::npos) << "the pp 2 run should say it resharded:\n"
                                                             << grading::error_excerpt(c.output);

    const std::map<int64_t, double> want = step_losses(same + "/logs"), got = step_losses(other + "/logs");
    double worst = 0;
    for (int64_t step = kFirst; step < kLast; ++step) {
      ASSERT_TRUE(want.count(step) && got.count(step)) << "no loss of step " << step << " in both runs' logs";
      const double gap = std::abs(got.at(step) - want.at(step));
      worst = std::max(worst, gap);
      EXPECT_LE(gap, kBound) << "step " << step << ": loss " << got.at(step) << " after resharding, " << want.at(step)
                             << " at the checkpoint's own layout";
    }
    record.measured("steps %d-%d: the largest loss gap %.1e nats (bound %.0e)", kFirst, kLast - 1, worst, kBound);
    if (!::testing::Test::HasFailure())
      for (const std::string& d : {first, same, other}) fs::remove_all(d);
  });
}
