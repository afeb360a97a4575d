// test_scaling_report.cpp — "why not 2x?" from the logs (tools/scaling_report.h): small synthetic
// rank<k>.jsonl texts (docs/log_schema.md keys, exact made-up numbers) -> the per-rank means over
// timed steps, the run's throughput, the ScalingEvidence for diagnose_scaling, the batch sweep's
// filters, the table, and errors that name the run and the line. No timing, no files.
// End to end (the lab04_fsdp runs, one provocation each): tests/lab04_scaling/CMakeLists.txt.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "expect_error.h"                 // defines: error_message, contains
#include "scalelab/measure/bottleneck.h"  // defines: diagnose_scaling, kCauseNames
#include "scaling_report.h"               // defines: parse_run, make_evidence, format_report

using scalelab::kCauseNames;
using scalelab::ScalingEvidence;
using scalelab::Verdict;
using scalelab::scaling::cause_order_from_name;
using scalelab::scaling::format_report;
using scalelab::scaling::make_evidence;
using scalelab::scaling::parse_run;
using scalelab::scaling::RunSummary;
using scalelab::test::contains;
using scalelab::test::error_message;

namespace {

constexpr double kExact = 1e-9;  // the numbers below are small binary fractions or exact ratios

// One line of each record type, as lab04_fsdp writes them (only the keys the report reads, plus noise).
std::string run_line(int rank, int world, int B, int T, const std::string& link = "none",
                     const std::string& overlap = "on") {
  return "{\"type\":\"run\",\"rank\":" + std::to_string(rank) + ",\"world_size\":" + std::to_string(world) +
         ",\"lab\":\"lab04\",\"config\":{\"model\":\"demo\",\"stage\":3,\"prefetch\":1,\"micro_batch\":" +
         std::to_string(B) + ",\"T\":" + std::to_string(T) + ",\"link\":\"" + link + "\",\"overlap\":\"" + overlap +
         "\"}}\n";
}
std::string step_line(int rank, int step, double step_ms, double data_ms, const std::string& comm_ms, double tokens,
                      double peak_bytes, const std::string& compute_ms = "", double busy_ms = -1) {
  std::string s = "{\"type\":\"step\",\"rank\":" + std::to_string(rank) + ",\"step\":" + std::to_string(step) +
                  ",\"loss\":3.5,\"tokens\":" + std::to_string(tokens) + ",\"step_ms\":" + std::to_string(step_ms) +
                  ",\"data_wait_ms\":" + std::to_string(data_ms) + ",\"comm_ms\":" + comm_ms +
                  ",\"tokens_per_s\":1.0,\"mfu\":0.25,\"memory_peak_bytes\":" + std::to_string(peak_bytes);
  if (!compute_ms.empty()) s += ",\"compute_ms\":" + compute_ms;
  if (busy_ms >= 0) s += ",\"comm_busy_ms\":" + std::to_string(busy_ms);
  return s + "}\n";
}
std::string loader_line(int rank, double tok_s) {
  return "{\"type\":\"loader_alone\",\"rank\":" + std::to_string(rank) +
         ",\"batches\":5,\"tokens_per_s\":" + std::to_string(tok_s) + "}\n";
}
std::string summary_line(int rank, double tok_s, double mfu, double peak_bytes) {
  return "{\"type\":\"summary\",\"rank\":" + std::to_string(rank) + ",\"tokens_per_s\":" + std::to_string(tok_s) +
         ",\"mfu\":" + std::to_string(mfu) + ",\"memory_peak_bytes\":" + std::to_string(peak_bytes) + "}\n";
}

// One device, B and T, every timed step `step_ms` long (step 0, the warm-up, 10x slower).
RunSummary one_device(int B, int T, double step_ms, const std::string& name = "single") {
  std::string r = run_line(0, 1, B, T);
  r += step_line(0, 0, 10 * step_ms, 0, "0", B * T, 1 << 20);
  for (int s = 1; s <= 4; ++s) r += step_line(0, s, step_ms, 0, "0", B * T, 1 << 20);
  return parse_run(name, {r});
}

// Two ranks, B=8, T=128: rank r's timed steps are 100 ms = compute + data + comm as given.
RunSummary two_ranks(double data0, double comm0, double data1, double comm1, double loader_tok_s = 1e6) {
  std::vector<std::string> ranks;
  const double tokens = 2 * 8 * 128;
  for (int r = 0; r < 2; ++r) {
    const double data = r == 0 ? data0 : data1, comm = r == 0 ? comm0 : comm1;
    std::string t = run_line(r, 2, 8, 128) + loader_line(r, loader_tok_s);
    t += step_line(r, 0, 900, 0, "0", tokens, 1 << 20);  // warm-up: left out
    for (int s = 1; s <= 4; ++s)
      t += step_line(r, s, 100, data, std::to_string(comm), tokens, 1 << 20, std::to_string(100 - data - comm), 50);
    ranks.push_back(t);
  }
  return parse_run("multi", ranks);
}

TEST(ScalingReport, MeansOverTimedStepsLeaveOutTheWarmUpStep) {
  std::string r0 = run_line(0, 2, 8, 128, "ethernet100/300", "off") + loader_line(0, 2048);
  r0 += step_line(0, 0, 1000, 500, "400", 2048, 100);  // warm-up: left out
  r0 += step_line(0, 1, 100, 10, "20", 2048, 300, "70", 40);
  r0 += step_line(0, 2, 300, 30, "60", 2048, 200, "210", 80);
  r0 += summary_line(0, 10240, 0.125, 400);
  std::string r1 = run_line(1, 2, 8, 128) + step_line(1, 1, 200, 0, "null", 2048, 100);  // comm_ms null, no compute_ms
  const RunSummary s = parse_run("run", {r1, r0});  // files in any order: the records say the rank
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.micro_batch, 8);
  EXPECT_EQ(s.seq_len, 128);
  EXPECT_EQ(s.stage, 3);
  EXPECT_EQ(s.model, "demo");
  EXPECT_EQ(s.link, "ethernet100/300");
  EXPECT_FALSE(s.overlap);
  const auto& a = s.ranks[0];
  EXPECT_EQ(a.rank, 0);
  EXPECT_EQ(a.timed_steps, 2);
  EXPECT_NEAR(a.step_ms, 200, kExact);
  EXPECT_NEAR(a.median_step_ms, 200, kExact);
  EXPECT_NEAR(a.data_wait_ms, 20, kExact);
  EXPECT_NEAR(a.comm_ms, 40, kExact);
  EXPECT_NEAR(a.compute_ms, 140, kExact);
  EXPECT_NEAR(a.comm_busy_ms, 60, kExact);
  EXPECT_NEAR(a.peak_bytes, 400, kExact);  // the largest of steps (warm-up included) and summary
  EXPECT_NEAR(a.loader_alone_tokens_per_s, 2048, kExact);
  // Throughput and MFU of the run: rank 0's summary.
  EXPECT_NEAR(s.tokens_per_s, 10240, kExact);
  EXPECT_NEAR(s.mfu, 0.125, kExact);
  // Rank 1: comm_ms null is "not measured"; compute is what is left of the step.
  const auto& b = s.ranks[1];
  EXPECT_TRUE(std::isnan(b.comm_ms));
  EXPECT_NEAR(b.compute_ms, 200, kExact);
  EXPECT_TRUE(std::isnan(b.loader_alone_tokens_per_s));
}

TEST(ScalingReport, WithoutASummaryThroughputComesFromTheTimedSteps) {
  std::string r = run_line(0, 1, 4, 64);
  r += step_line(0, 0, 5000, 0, "0", 256, 1);
  r += step_line(0, 1, 100, 0, "0", 256, 1);
  r += step_line(0, 2, 300, 0, "0", 256, 1);
  const RunSummary s = parse_run("cut short", {r});
  EXPECT_NEAR(s.tokens_per_s, 512 / 0.4, kExact);  // 2 x 256 tokens in 0.4 s; the warm-up left out
  EXPECT_NEAR(s.mfu, 0.25, kExact);
  EXPECT_NEAR(s.ranks[0].median_step_ms, 200, kExact);
}

TEST(ScalingReport, AOneStepRunUsesItsOnlyStep) {
  const RunSummary s = parse_run("one step", {run_line(0, 1, 1, 16) + step_line(0, 0, 50, 0, "0", 16, 1)});
  EXPECT_EQ(s.ranks[0].timed_steps, 1);
  EXPECT_NEAR(s.ranks[0].step_ms, 50, kExact);
}

TEST(ScalingReport, BadInputIsRefusedNamingTheRunAndTheLine) {
  const std::string bad = error_message([] { parse_run("r7", {run_line(0, 1, 1, 16) + "{\"type\":\"step\",\n"}); });
  EXPECT_TRUE(contains(bad, "run 'r7'")) << bad;
  EXPECT_TRUE(contains(bad, "line 2")) << bad;
  const std::string no_steps = error_message([] { parse_run("r8", {run_line(0, 1, 1, 16)}); });
  EXPECT_TRUE(contains(no_steps, "rank 0 logged no step record")) << no_steps;
  const std::string empty = error_message([] { parse_run("r9", {""}); });
  EXPECT_TRUE(contains(empty, "no records")) << empty;
  const std::string no_dir = error_message([] { scalelab::scaling::read_run("/nonexistent/lab04/x"); });
  EXPECT_TRUE(contains(no_dir, "no such run folder")) << no_dir;
}

TEST(ScalingReport, EvidenceCarriesThroughputSharesAndPerRankTimes) {
  const RunSummary single = one_device(8, 128, 50);  // 1024 tokens / 50 ms = 20480 tok/s
  RunSummary multi = two_ranks(/*data0=*/10, /*comm0=*/20, /*data1=*/0, /*comm1=*/30, /*loader=*/4096);
  multi.tokens_per_s = 30720;
  const ScalingEvidence ev = make_evidence(single, multi, {});
  EXPECT_EQ(ev.world_size, 2);
  EXPECT_NEAR(ev.single_tokens_per_s, 20480, kExact);
  EXPECT_NEAR(ev.multi_tokens_per_s, 30720, kExact);
  EXPECT_NEAR(ev.loader_alone_tokens_per_s, 4096, kExact);
  // Per rank: 1024 tokens per step / (100 - data wait) ms, averaged: (1024/0.09 + 1024/0.1) / 2.
  EXPECT_NEAR(ev.consumption_tokens_per_s, (1024 / 0.09 + 1024 / 0.1) / 2, 1e-6);
  EXPECT_NEAR(ev.data_wait_share, 0.05, kExact);
  EXPECT_NEAR(ev.exposed_comm_share, 0.25, kExact);
  EXPECT_NEAR(ev.comm_busy_share, 0.5, kExact);
  EXPECT_TRUE(ev.overlap_enabled);
  EXPECT_EQ(ev.link_name, "none");
  EXPECT_FALSE(ev.link_simulated);
  EXPECT_EQ(ev.micro_batch, 8);
  ASSERT_EQ(ev.ranks.size(), 2u);
  EXPECT_NEAR(ev.ranks[0].compute_ms, 70, kExact);
  EXPECT_NEAR(ev.ranks[1].compute_ms, 70, kExact);
  EXPECT_NEAR(ev.ranks[1].exposed_comm_ms, 30, kExact);
  EXPECT_NEAR(scalelab::scaling_efficiency(ev), 0.75, kExact);
}

TEST(ScalingReport, SweepKeepsOneDeviceRunsOfTheSameTAtTheirMedianStep) {
  const RunSummary single = one_device(8, 128, 50);
  const RunSummary multi = two_ranks(0, 5, 0, 5);
  std::vector<RunSummary> sweep = {one_device(1, 128, 25, "b1"), one_device(16, 128, 80, "b16"),
                                   one_device(4, 64, 10, "other T"), one_device(8, 128, 999, "B=8 again"),
                                   two_ranks(0, 0, 0, 0)};
  std::vector<std::string> notes;
  const ScalingEvidence ev = make_evidence(single, multi, sweep, &notes);
  ASSERT_EQ(ev.batch_sweep.size(), 3u);  // B=1, 8 (the single run, first), 16
  EXPECT_EQ(ev.batch_sweep[0].micro_batch, 1);
  EXPECT_NEAR(ev.batch_sweep[0].tokens_per_s_per_device, 128 / 0.025, 1e-6);
  EXPECT_EQ(ev.batch_sweep[1].micro_batch, 8);
  EXPECT_NEAR(ev.batch_sweep[1].tokens_per_s_per_device, 1024 / 0.05, 1e-6);
  EXPECT_EQ(ev.batch_sweep[2].micro_batch, 16);
  EXPECT_NEAR(ev.batch_sweep[2].tokens_per_s_per_device, 2048 / 0.08, 1e-6);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_TRUE(contains(notes[0], "'other T' left out: T=64")) << notes[0];
  EXPECT_TRUE(contains(notes[1], "2 ranks")) << notes[1];
}

// The verdict on parsed records: each cause alone is named (the same function the ctests use).
TEST(ScalingReport, VerdictNamesEachCauseFromParsedRecords) {
  const RunSummary single = one_device(8, 128, 50);
  auto culprits = [&](const RunSummary& multi, const std::vector<RunSummary>& sweep) {
    return diagnose_scaling(make_evidence(single, multi, sweep)).culprits();
  };
  const std::vector<RunSummary> flat = {one_device(16, 128, 100, "b16")};  // 1024 tok per 50 ms at B=8 and 16
  EXPECT_TRUE(culprits(two_ranks(0, 5, 0, 5), flat).empty());
  EXPECT_EQ(culprits(two_ranks(40, 5, 40, 5), flat), std::vector<std::string>{kCauseNames[0]});
  EXPECT_EQ(culprits(two_ranks(0, 40, 0, 40), flat), std::vector<std::string>{kCauseNames[1]});
  EXPECT_EQ(culprits(two_ranks(0, 5, 0, 5), {one_device(16, 128, 50, "b16 twice as fast")}),
            std::vector<std::string>{kCauseNames[2]});
  // Rank 1 computes 90 ms, rank 0 60 ms and waits 35 ms for it: hidden in rank 0's communication wait.
  EXPECT_EQ(culprits(two_ranks(0, 35, 0, 5), flat), std::vector<std::string>{kCauseNames[3]});
}

TEST(ScalingReport, TableShowsBothColumnsPerRankTimesAndTheVerdict) {
  const RunSummary single = one_device(8, 128, 50);
  RunSummary multi = two_ranks(0, 35, 0, 5);
  multi.tokens_per_s = 28672;
  std::vector<std::string> notes = {"a note"};
  const ScalingEvidence ev = make_evidence(single, multi, {one_device(16, 128, 100, "b16")}, &notes);
  const Verdict v = diagnose_scaling(ev);
  const std::string t = format_report(single, multi, ev, v, notes);
  for (const char* part :
       {"Why not 2x? model demo, ZeRO-3, T=128", "1 device", "2 devices", "tokens/s per device", "MFU", "25.0 %",
        "peak memory per rank (MiB)", "exposed comm (% of step)", "rank 0 35.0 %, rank 1 5.0 %", "compute time (ms)",
        "rank 0 65.0, rank 1 95.0", "spread 46.2 %", "B=8 20.5k | B=16 20.5k", "note: a note",
        "Scaling efficiency: 70 % (1.40x on 2 devices", "straggling device               CULPRIT"})
    EXPECT_TRUE(contains(t, part)) << "missing '" << part << "' in\n" << t;
  EXPECT_EQ(t.back(), '\n');
}

TEST(ScalingReport, BlindTableHidesTheRunsOptions) {  // why_not_2x.sh --blind: the header must not name the cause
  const RunSummary single = one_device(2, 16, 50);
  RunSummary multi = two_ranks(0, 35, 0, 5);
  multi.micro_batch = 1;
  multi.seq_len = 16;
  multi.link = "ethernet100";
  std::vector<std::string> notes;
  const ScalingEvidence ev = make_evidence(single, multi, {one_device(16, 16, 100, "b16")}, &notes);
  ASSERT_FALSE(notes.empty());  // "per-device batch differs": a note that names the batch provocation
  const Verdict v = diagnose_scaling(ev);
  const std::string t = format_report(single, multi, ev, v, notes, false, false);
  EXPECT_TRUE(contains(t,
                       "Why not 2x? model demo, ZeRO-3 | 1 device vs 2 devices; the runs' B, T, overlap and link "
                       "are not shown\n"))
      << t;
  for (const char* part : {"T=16", "B=1 each", "1 device: B=2", "ethernet100", "overlap on", "note:", "Verdict"})
    EXPECT_FALSE(contains(t, part)) << "'" << part << "' in a blind table:\n" << t;
  EXPECT_TRUE(contains(t, "batch sweep, 1 device, the runs' T (tokens/s at the median step): B=2 640 | B=16")) << t;
}

TEST(ScalingReport, ProvocationNamesMapToTheLessonsOrder) {
  EXPECT_EQ(cause_order_from_name("loader"), 1);
  EXPECT_EQ(cause_order_from_name("comm"), 2);
  EXPECT_EQ(cause_order_from_name("batch"), 3);
  EXPECT_EQ(cause_order_from_name("straggler"), 4);
  EXPECT_EQ(cause_order_from_name("none"), 0);
}

}  // namespace
