// test_metrics.cpp — the JSONL run logs (common/include/scalelab/measure/metrics.h, docs/log_schema.md):
// every record is one parseable JSON line on disk as soon as it is logged, the keys the notebooks
// and the grader read are present, and every number that has a unit says it in its key.
#include <gtest/gtest.h>

#include <unistd.h>  // defines: getpid

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "scalelab/core/allocator.h"
#include "scalelab/measure/metrics.h"
#include "scalelab/core/tensor.h"

namespace fs = std::filesystem;
using nlohmann::json;
using scalelab::RunLogger;

namespace {

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        (fs::temp_directory_path() / ("sl_test_metrics_" + std::to_string(::getpid()) + "_" + info->name())).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every line of the file parsed as JSON (a line that does not parse fails the test).
  static std::vector<json> read_records(const std::string& path) {
    std::ifstream in(path);
    std::vector<json> out;
    std::string line;
    while (std::getline(in, line)) {
      EXPECT_NO_THROW(out.push_back(json::parse(line))) << "not JSON: " << line;
    }
    return out;
  }

  static scalelab::RunRecord run_record() {
    scalelab::RunRecord r;
    r.config = {{"model", "d12"}, {"batch_size", 4}, {"seq_len", 64}};
    r.world_size = 2;
    r.track = "reference";
    r.device = "cpu";
    r.threads = 1;
    r.precision = "fp32";
    r.peak_flops_per_s = 100e9;
    r.peak_source = "calibrated sgemm, d12 shapes, 1 thread, 2026-11-29";
    r.calibration_id = "cpu-gemm-0a1cdefe-1t-20261129";
    return r;
  }

  static scalelab::StepRecord step_record(int64_t step, double step_ms) {
    scalelab::StepRecord s;
    s.step = step;
    s.loss = 5.5 - 0.1 * static_cast<double>(step);
    s.lr = 6e-4;
    s.tokens = 512;
    s.step_ms = step_ms;
    s.data_wait_ms = 0.5;
    s.tokens_per_s = 512 / (step_ms / 1000.0);
    s.mfu = 0.25;
    s.grad_norm = 1.5;
    return s;  // comm_ms left unmeasured
  }

  std::string dir_;
};

// Keys that are counts, ratios or nats and so carry no unit suffix (docs/log_schema.md, "Units").
const std::set<std::string> kUnitless = {
    "step",          "loss",           "lr",          "tokens", "mfu",       "grad_norm",   "rank",     "world_size",
    "threads",       "cpu_cores",      "val_loss",    "steps",  "last_step", "timed_steps", "mean_mfu", "final_loss",
    "best_val_loss", "val_loss_start", "val_loss_end"};

bool has_unit_suffix(const std::string& key) {
  for (const char* suffix : {"_ms", "_s", "_bytes"}) {
    const std::string s = suffix;
    if (key.size() > s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_F(MetricsTest, RecordsRoundTripThroughTheFileOneJsonObjectPerLine) {
  RunLogger log("lab01", "testrun", 1, dir_);
  EXPECT_EQ(log.path(), (fs::path(dir_) / "lab01" / "testrun" / "rank1.jsonl").string());
  log.log_run(run_record());
  log.log_step(step_record(0, 900.0));
  log.log_step(step_record(1, 100.0));
  // Flushed per record: readable by another process (a notebook tailing the log) before the end.
  std::vector<json> recs = read_records(log.path());
  ASSERT_EQ(recs.size(), 3u);
  log.log_eval(1, 4.25);
  log.log("checkpoint", {{"path", "runs/x/ckpt_1.bin"}, {"write_ms", 12.5}});
  log.log_summary({{"exit", "ok"}});

  recs = read_records(log.path());
  ASSERT_EQ(recs.size(), 6u);
  const std::vector<std::string> types = {"run", "step", "step", "eval", "checkpoint", "summary"};
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i]["type"], types[i]);
    EXPECT_EQ(recs[i]["rank"], 1);
    EXPECT_TRUE(recs[i]["elapsed_s"].is_number());
  }
  EXPECT_EQ(recs[0]["config"]["model"], "d12");
  EXPECT_EQ(recs[1]["loss"], 5.5);
  EXPECT_EQ(recs[2]["step_ms"], 100.0);
  EXPECT_EQ(recs[3]["val_loss"], 4.25);
  EXPECT_EQ(recs[4]["path"], "runs/x/ckpt_1.bin");
  EXPECT_EQ(recs[5]["exit"], "ok");
  // The first record's first key is "type": logs stay readable with head(1).
  std::ifstream in(log.path());
  std::string first_line;
  std::getline(in, first_line);
  EXPECT_EQ(first_line.rfind("{\"type\":\"run\"", 0), 0u) << first_line;
}

TEST_F(MetricsTest, RunRecordHasTheKeysTheNotebooksRead) {
  RunLogger log("lab01", "r", 0, dir_);
  log.log_run(run_record());
  const json run = read_records(log.path()).at(0);
  for (const char* key : {"run_id", "lab", "world_size", "rank", "track", "git_sha", "device", "cpu_model", "cpu_cores",
                          "threads", "blas_build", "precision", "peak_flops_per_s", "peak_source", "calibration_id",
                          "hostname", "start_time", "config"}) {
    EXPECT_TRUE(run.contains(key)) << "run record lacks '" << key << "': " << run.dump();
  }
  EXPECT_EQ(run["world_size"], 2);
  EXPECT_EQ(run["peak_flops_per_s"], 100e9);
  EXPECT_FALSE(run["git_sha"].get<std::string>().empty());
  EXPECT_FALSE(run["cpu_model"].get<std::string>().empty());
  // ISO-8601 UTC, e.g. 2026-11-29T07:23:40Z
  const std::string t = run["start_time"];
  ASSERT_EQ(t.size(), 20u) << t;
  EXPECT_EQ(t[10], 'T');
  EXPECT_EQ(t.back(), 'Z');
}

TEST_F(MetricsTest, StepRecordHasRequiredKeysAndMemoryPerCategory) {
  // Hold some parameter bytes so the allocator counters are visibly non-zero.
  scalelab::Tensor params =
      scalelab::Tensor::zeros({1024}, scalelab::DType::F32, scalelab::Device::CPU, scalelab::MemCategory::Params);
  RunLogger log("lab01", "r", 0, dir_);
  scalelab::StepRecord s = step_record(3, 120.0);
  s.extra = {{"bucket_mb", 25}, {"simulated", true}};
  log.log_step(s);
  const json step = read_records(log.path()).at(0);
  for (const char* key :
       {"step", "loss", "lr", "tokens", "step_ms", "data_wait_ms", "comm_ms", "tokens_per_s", "mfu", "grad_norm",
        "memory_peak_bytes", "memory_current_bytes", "memory_reserved_bytes", "memory_reserved_peak_bytes"}) {
    EXPECT_TRUE(step.contains(key)) << "step record lacks '" << key << "': " << step.dump();
  }
  for (int c = 0; c < scalelab::kNumMemCategories; ++c) {
    const std::string name = scalelab::mem_category_name(static_cast<scalelab::MemCategory>(c));
    EXPECT_TRUE(step.contains("memory_" + name + "_bytes")) << name;
    EXPECT_TRUE(step.contains("memory_" + name + "_peak_bytes")) << name;
  }
  EXPECT_GE(step["memory_params_bytes"].get<int64_t>(), 4096);
  EXPECT_GE(step["memory_peak_bytes"].get<int64_t>(), step["memory_current_bytes"].get<int64_t>());
  EXPECT_GE(step["memory_reserved_bytes"].get<int64_t>(), step["memory_current_bytes"].get<int64_t>())
      << "held from the system >= in use";
  EXPECT_TRUE(step["comm_ms"].is_null()) << "a field that was not measured is written as null";
  EXPECT_EQ(step["bucket_mb"], 25);
  EXPECT_EQ(step["simulated"], true);
  EXPECT_GE(step["mfu"].get<double>(), 0.0);
  EXPECT_LE(step["mfu"].get<double>(), 1.0);
}

TEST_F(MetricsTest, EveryNumberWithAUnitSaysItInItsKey) {
  RunLogger log("lab01", "r", 0, dir_);
  log.log_run(run_record());
  log.log_step(step_record(0, 300.0));
  log.log_step(step_record(1, 100.0));
  log.log_eval(1, 4.0);
  log.log_summary();
  for (const json& rec : read_records(log.path())) {
    for (auto it = rec.begin(); it != rec.end(); ++it) {
      if (!it.value().is_number() || kUnitless.count(it.key())) continue;
      EXPECT_TRUE(has_unit_suffix(it.key()))
          << "'" << it.key() << "' in a " << rec["type"] << " record is a number without a unit suffix "
          << "(_ms, _s, _bytes, _per_s) and is not in the unitless list of docs/log_schema.md";
    }
  }
}

TEST_F(MetricsTest, SummaryLeavesTheWarmUpStepOutOfTheMeans) {
  RunLogger log("lab01", "r", 0, dir_);
  log.log_run(run_record());
  log.log_step(step_record(0, 5000.0));  // warm-up: slow
  log.log_step(step_record(1, 100.0));
  log.log_step(step_record(2, 300.0));
  log.log_eval(2, 4.5);
  log.log_eval(3, 4.0);
  log.log_summary();
  const json sum = read_records(log.path()).back();
  ASSERT_EQ(sum["type"], "summary");
  EXPECT_EQ(sum["steps"], 3);
  EXPECT_EQ(sum["timed_steps"], 2);
  EXPECT_EQ(sum["last_step"], 2);
  EXPECT_EQ(sum["tokens"], 3 * 512);
  EXPECT_DOUBLE_EQ(sum["mean_step_ms"].get<double>(), 200.0);
  EXPECT_DOUBLE_EQ(sum["tokens_per_s"].get<double>(), 2 * 512 / 0.4);  // tokens / seconds of the timed steps
  EXPECT_DOUBLE_EQ(sum["mean_mfu"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(sum["final_loss"].get<double>(), 5.3);
  EXPECT_DOUBLE_EQ(sum["best_val_loss"].get<double>(), 4.0);
  EXPECT_EQ(sum["peak_source"], run_record().peak_source);
  EXPECT_TRUE(sum.contains("memory_peak_bytes"));
  EXPECT_TRUE(sum.contains("end_time"));
  EXPECT_FALSE(sum.contains("warm_up_timed"));  // only a one-step run times its warm-up
}

// A run of one step: the warm-up step is the only one, so the summary's means are that step's, and the record
// says so (warm_up_timed), never tokens_per_s 0 or a null mean presented as "not run" (docs/log_schema.md).
TEST_F(MetricsTest, SummaryOfOneStepTimesThatStepAndSaysSo) {
  RunLogger log("lab01", "r", 0, dir_);
  log.log_run(run_record());
  log.log_step(step_record(0, 400.0));
  log.log_summary();
  const json sum = read_records(log.path()).back();
  ASSERT_EQ(sum["type"], "summary");
  EXPECT_EQ(sum["steps"], 1);
  EXPECT_EQ(sum["timed_steps"], 1);
  EXPECT_EQ(sum["warm_up_timed"], true);
  EXPECT_DOUBLE_EQ(sum["mean_step_ms"].get<double>(), 400.0);
  EXPECT_DOUBLE_EQ(sum["tokens_per_s"].get<double>(), 512 / 0.4);
  EXPECT_DOUBLE_EQ(sum["mean_mfu"].get<double>(), 0.25);
}

TEST_F(MetricsTest, MfuOutsideZeroOneWarnsOnce) {
  RunLogger log("lab01", "r", 0, dir_);
  scalelab::StepRecord s = step_record(0, 100.0);
  s.mfu = 25.0;  // a percentage by mistake
  ::testing::internal::CaptureStderr();
  log.log_step(s);
  log.log_step(s);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("mfu=25"), std::string::npos) << err;
  EXPECT_EQ(err.find("mfu=25"), err.rfind("mfu=25")) << "warned more than once:\n" << err;
}

TEST_F(MetricsTest, ReopeningTheSameRunAppends) {
  {
    RunLogger log("lab08", "r", 0, dir_);
    log.log_run(run_record());
  }
  RunLogger resumed("lab08", "r", 0, dir_);  // a restart after a crash
  resumed.log_run(run_record());
  EXPECT_EQ(read_records(resumed.path()).size(), 2u);
}

TEST_F(MetricsTest, TimelineRecordHoldsCommEventsAndComputeSpansOnOneClock) {
  RunLogger log("lab03", "tl", 1, dir_);
  scalelab::CommEvent ar;
  ar.op = "all_reduce";
  ar.tag = "bucket 0";
  ar.count = 256;
  ar.payload_bytes = 1024;
  ar.bus_bytes = 1024;  // 2(n-1)/n x payload, n = 2
  ar.issue_ms = 10.0;
  ar.start_ms = 10.5;
  ar.end_ms = 14.0;
  ar.modeled_ms = 3.0;
  ar.async = true;
  ar.simulated = true;
  ar.group = "dp";
  ar.world_ranks = {1, 3};
  scalelab::CommEvent pending = ar;
  pending.tag = "bucket 1";
  pending.end_ms = 0;  // not finished when logged
  const std::vector<scalelab::TimeSpan> compute = {{"forward", 1.0, 5.0}, {"backward", 5.0, 12.0}};
  log.log_timeline(4, {ar, pending}, compute);

  const json rec = read_records(log.path()).at(0);
  EXPECT_EQ(rec["type"], "timeline");
  EXPECT_EQ(rec["rank"], 1);
  EXPECT_EQ(rec["step"], 4);
  ASSERT_EQ(rec["events"].size(), 2u);
  const json& e = rec["events"][0];
  EXPECT_EQ(e["op"], "all_reduce");
  EXPECT_EQ(e["tag"], "bucket 0");
  EXPECT_EQ(e["count"], 256);
  EXPECT_EQ(e["payload_bytes"], 1024);
  EXPECT_EQ(e["bus_bytes"], 1024);
  EXPECT_EQ(e["issue_ms"], 10.0);
  EXPECT_EQ(e["start_ms"], 10.5);
  EXPECT_EQ(e["end_ms"], 14.0);
  EXPECT_EQ(e["modeled_ms"], 3.0);
  EXPECT_EQ(e["simulated"], true);
  EXPECT_EQ(e["group"], "dp");  // which communicator carried it
  EXPECT_EQ(e["world_ranks"], json::array({1, 3}));
  EXPECT_TRUE(rec["events"][1]["end_ms"].is_null()) << "a call still in flight has no end: null, not 0";
  ASSERT_EQ(rec["compute"].size(), 2u);
  EXPECT_EQ(rec["compute"][1]["name"], "backward");
  EXPECT_EQ(rec["compute"][1]["start_ms"], 5.0);
  EXPECT_EQ(rec["compute"][1]["end_ms"], 12.0);
  // Nested numbers follow the unit rule too (count is the one unitless key).
  for (const json* list : {&rec["events"], &rec["compute"]}) {
    for (const json& item : *list) {
      for (auto it = item.begin(); it != item.end(); ++it) {
        if (!it.value().is_number() || it.key() == "count") continue;
        EXPECT_TRUE(has_unit_suffix(it.key())) << "'" << it.key() << "' in a timeline entry has no unit suffix";
      }
    }
  }
}

// Regression: a text sample cut inside a multi-byte character made the summary record throw
// ("invalid UTF-8 byte") and ended every short lab 01 run with exit 1.
TEST_F(MetricsTest, InvalidUtf8InARecordIsReplacedNotThrown) {
  RunLogger log("lab01", "utf8", 0, dir_);
  const std::string bad = std::string("And God said") + '\xe2' + '\x80' + 'e';  // a 3-byte char cut short
  EXPECT_NO_THROW(log.log_summary({{"sample", bad}}));
  const std::vector<json> recs = read_records(log.path());
  ASSERT_FALSE(recs.empty());
  const std::string got = recs.back().at("sample").get<std::string>();
  EXPECT_EQ(got.rfind("And God said", 0), 0u) << got;
  EXPECT_NE(got.find("\xEF\xBF\xBD"), std::string::npos) << "expected U+FFFD in place of the bad bytes: " << got;
}

TEST(RunId, IsUtcTimePlusSuffixAndSlRunIdOverrides) {
  ::unsetenv("SL_RUN_ID");
  const std::string id = scalelab::make_run_id();
  // 20261129T072340Z-3fa9
  ASSERT_EQ(id.size(), 21u) << id;
  EXPECT_EQ(id[8], 'T');
  EXPECT_EQ(id[15], 'Z');
  EXPECT_EQ(id[16], '-');
  ::setenv("SL_RUN_ID", "pinned-by-grader", 1);
  EXPECT_EQ(scalelab::make_run_id(), "pinned-by-grader");
  ::unsetenv("SL_RUN_ID");
}

TEST(SystemInfo, DescribesThisMachine) {
  const scalelab::SystemInfo s = scalelab::system_info();
  EXPECT_FALSE(s.cpu_model.empty());
  EXPECT_GE(s.cores, 1);
  EXPECT_FALSE(s.hostname.empty());
}
