// test_bottleneck.cpp — the scaling verdict (common/include/scalelab/measure/bottleneck.h): synthetic records
// for each of the lesson's four causes alone, two at once, none, the straggler hidden in its peers'
// communication wait, missing evidence, the order of findings, and each threshold from both sides.
// Pure function, no timing: every number here is made up and exact.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "scalelab/measure/bottleneck.h"

using scalelab::BatchPoint;
using scalelab::CauseFinding;
using scalelab::kCauseNames;
using scalelab::RankTiming;
using scalelab::ScalingEvidence;
using scalelab::Verdict;

namespace {

const std::string kLoader = kCauseNames[0], kComm = kCauseNames[1], kBatch = kCauseNames[2],
                  kStraggler = kCauseNames[3];

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Two ranks that scale well: 0.95 efficiency, 200x loader headroom, 0.3 % data wait, ~5 % exposed
// comm with overlap on, compute-bound at B=8 (2 % more at B=16), ranks within 1 % of each other.
// step_ms = compute_ms + data_wait_ms + exposed_comm_ms on every rank.
ScalingEvidence healthy() {
  ScalingEvidence ev;
  ev.world_size = 2;
  ev.single_tokens_per_s = 10000;
  ev.multi_tokens_per_s = 19000;
  ev.loader_alone_tokens_per_s = 2.1e6;
  ev.consumption_tokens_per_s = 9800;
  ev.data_wait_share = 0.003;
  ev.exposed_comm_share = 0.052;
  ev.comm_busy_share = 0.30;
  ev.overlap_enabled = true;
  ev.link_name = "ethernet100";
  ev.link_simulated = true;
  ev.batch_sweep = {{1, 6000}, {2, 8500}, {4, 9500}, {8, 9900}, {16, 10100}};
  ev.micro_batch = 8;
  ev.ranks = {RankTiming{0, 100.0, 94.0, 0.3, 5.7}, RankTiming{1, 100.0, 95.0, 0.3, 4.7}};
  return ev;
}

// Two ranks with equal compute and `share` of each 100 ms step exposed in communication.
void set_comm_share(ScalingEvidence& ev, double share) {
  ev.exposed_comm_share = share;
  const double exposed = 100.0 * share;
  ev.ranks = {RankTiming{0, 100.0, 100.0 - 0.3 - exposed, 0.3, exposed},
              RankTiming{1, 100.0, 100.0 - 0.3 - exposed, 0.3, exposed}};
}

// Two ranks: rank 1 computes `ratio` x rank 0's 100 ms; rank 0 waits for it in the all-reduce, so
// both step times are equal (synchronous data parallel).
void set_straggler(ScalingEvidence& ev, double ratio) {
  const double slow = 100.0 * ratio, transfer = 5.0;
  const double step = slow + 0.3 + transfer;
  ev.ranks = {RankTiming{0, step, 100.0, 0.3, step - 100.0 - 0.3}, RankTiming{1, step, slow, 0.3, transfer}};
  ev.exposed_comm_share = ((step - 100.3) / step + transfer / step) / 2;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// None, and each cause alone

TEST(Bottleneck, HealthyRunNamesNoCulprit) {
  const Verdict v = scalelab::diagnose_scaling(healthy());
  ASSERT_EQ(v.findings.size(), 4u);
  for (const CauseFinding& f : v.findings) {
    EXPECT_TRUE(f.has_evidence) << f.cause << ": " << f.evidence;
    EXPECT_FALSE(f.culprit) << f.cause << ": " << f.evidence;
  }
  EXPECT_TRUE(v.culprits().empty());
  EXPECT_NEAR(v.scaling_efficiency, 0.95, 1e-12);
  EXPECT_TRUE(contains(v.conclusion, "no culprit")) << v.conclusion;
  EXPECT_TRUE(contains(v.findings[0].evidence, "2.1M tok/s")) << v.findings[0].evidence;
  EXPECT_TRUE(contains(v.findings[0].evidence, "214x headroom")) << v.findings[0].evidence;
  EXPECT_TRUE(contains(v.findings[0].evidence, "0.3 %")) << v.findings[0].evidence;
}

TEST(Bottleneck, SlowLoaderAloneIsTheOnlyCulprit) {
  ScalingEvidence ev = healthy();
  ev.multi_tokens_per_s = 14000;         // the lesson's 1.4x
  ev.loader_alone_tokens_per_s = 12000;  // per rank: 1.22x what the model eats
  ev.data_wait_share = 0.22;
  for (RankTiming& r : ev.ranks) r.data_wait_ms = 22.0;
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_EQ(v.culprits(), std::vector<std::string>{kLoader});
  EXPECT_NEAR(v.findings[0].measured, 12000.0 / 9800.0, 1e-12);
  EXPECT_EQ(v.findings[0].threshold, 1.5);
  EXPECT_TRUE(contains(v.findings[0].evidence, "1.22x headroom")) << v.findings[0].evidence;
  EXPECT_TRUE(contains(v.findings[0].fix, "prefetch")) << v.findings[0].fix;
  EXPECT_NEAR(v.scaling_efficiency, 0.70, 1e-12);
  EXPECT_TRUE(contains(v.conclusion, "fix first: " + kLoader)) << v.conclusion;
}

TEST(Bottleneck, ExposedCommWithoutOverlapIsTheOnlyCulprit) {
  ScalingEvidence ev = healthy();
  ev.overlap_enabled = false;
  set_comm_share(ev, 0.30);
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_EQ(v.culprits(), std::vector<std::string>{kComm});
  EXPECT_NEAR(v.findings[1].measured, 0.30, 1e-12);
  EXPECT_TRUE(contains(v.findings[1].evidence, "30.0 %")) << v.findings[1].evidence;
  EXPECT_TRUE(contains(v.findings[1].evidence, "overlap off")) << v.findings[1].evidence;
  EXPECT_TRUE(contains(v.findings[1].evidence, "ethernet100 (simulated)")) << v.findings[1].evidence;
  EXPECT_TRUE(contains(v.findings[1].fix, "--mode overlap")) << v.findings[1].fix;
  EXPECT_TRUE(contains(v.findings[1].fix, "simulated")) << v.findings[1].fix;
  // With overlap already on, the fix is buckets or the link, not "turn overlap on".
  ev.overlap_enabled = true;
  const Verdict w = scalelab::diagnose_scaling(ev);
  EXPECT_TRUE(w.findings[1].culprit);
  EXPECT_FALSE(contains(w.findings[1].fix, "--mode overlap")) << w.findings[1].fix;
  EXPECT_TRUE(contains(w.findings[1].fix, "--bucket-mb")) << w.findings[1].fix;
}

TEST(Bottleneck, SmallBatchStillRisingIsTheOnlyCulprit) {
  ScalingEvidence ev = healthy();
  ev.micro_batch = 1;  // 6000 tok/s; B=16 gives 10100: 1.68x
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_EQ(v.culprits(), std::vector<std::string>{kBatch});
  EXPECT_NEAR(v.findings[2].measured, 10100.0 / 6000.0, 1e-12);
  EXPECT_TRUE(contains(v.findings[2].evidence, "B=1: 6.0k tok/s")) << v.findings[2].evidence;
  EXPECT_TRUE(contains(v.findings[2].evidence, "overhead-bound")) << v.findings[2].evidence;
  EXPECT_TRUE(contains(v.findings[2].fix, "B=16")) << v.findings[2].fix;
}

TEST(Bottleneck, SlowRankAmongFourIsTheOnlyCulpritAndNamed) {
  ScalingEvidence ev = healthy();
  ev.world_size = 4;
  ev.multi_tokens_per_s = 31000;
  // Rank 3 computes 130 ms, the others ~100 ms and wait for it in the all-reduce.
  ev.ranks = {RankTiming{0, 135.3, 100.0, 0.3, 35.0}, RankTiming{1, 135.3, 102.0, 0.3, 33.0},
              RankTiming{2, 135.3, 98.0, 0.3, 37.0}, RankTiming{3, 135.3, 130.0, 0.3, 5.0}};
  ev.exposed_comm_share = (35.0 + 33.0 + 37.0 + 5.0) / 4 / 135.3;  // 20 %: over the comm limit on average
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_EQ(v.culprits(), std::vector<std::string>{kStraggler}) << scalelab::format_verdict(v);
  EXPECT_NEAR(v.findings[3].measured, 1.30, 1e-12);  // 130 / median(100, 102, 98)
  EXPECT_TRUE(contains(v.findings[3].evidence, "slowest rank 3")) << v.findings[3].evidence;
  EXPECT_TRUE(contains(v.findings[3].fix, "rank 3")) << v.findings[3].fix;
  // Cause 2 is decided on rank 3 (last to the all-reduce: 3.7 %), not on the 20 % mean.
  EXPECT_NEAR(v.findings[1].measured, 5.0 / 135.3, 1e-12);
  EXPECT_TRUE(contains(v.findings[1].evidence, "see cause 4")) << v.findings[1].evidence;
}

// ---------------------------------------------------------------------------------------------
// The hidden straggler: equal step times, compute_ms tells

TEST(Bottleneck, StragglerHiddenInPeersCommWaitIsFoundByComputeTime) {
  ScalingEvidence ev = healthy();
  set_straggler(ev, 1.35);
  ASSERT_EQ(ev.ranks[0].step_ms, ev.ranks[1].step_ms);  // step times alone show nothing
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_TRUE(v.findings[3].culprit) << v.findings[3].evidence;
  // With 2 ranks the ratio is against the other rank (1.35), not against the median of both
  // (135 / 117.5 = 1.149, which would pass under the 1.15 limit).
  EXPECT_NEAR(v.findings[3].measured, 1.35, 1e-12);
  EXPECT_TRUE(contains(v.findings[3].evidence, "slowest rank 1")) << v.findings[3].evidence;
  EXPECT_TRUE(contains(v.findings[3].evidence, "hidden in the others' communication wait")) << v.findings[3].evidence;
  // Rank 0's 35 ms of waiting is not blamed on the link: rank 1, last to arrive, waits 5 ms of 140.3.
  EXPECT_GT(ev.exposed_comm_share, 0.15);
  EXPECT_FALSE(v.findings[1].culprit) << v.findings[1].evidence;
  EXPECT_EQ(v.culprits(), std::vector<std::string>{kStraggler});
}

TEST(Bottleneck, StragglerNotCalledHiddenWhenPeersDoNotWaitForIt) {
  ScalingEvidence ev = healthy();
  set_straggler(ev, 1.30);
  ev.ranks[0].exposed_comm_ms = ev.ranks[1].exposed_comm_ms;  // peers' exposed comm no higher than the slow rank's
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_TRUE(v.findings[3].culprit);
  EXPECT_FALSE(contains(v.findings[3].evidence, "hidden")) << v.findings[3].evidence;
}

// ---------------------------------------------------------------------------------------------
// Two causes at once

TEST(Bottleneck, LoaderAndCommTogetherAreBothCulpritsLoaderFirst) {
  ScalingEvidence ev = healthy();
  ev.loader_alone_tokens_per_s = 9000;  // 0.92x: the loader cannot even match the model
  ev.overlap_enabled = false;
  set_comm_share(ev, 0.25);
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_EQ(v.culprits(), (std::vector<std::string>{kLoader, kComm}));
  EXPECT_TRUE(contains(v.conclusion, "fix first: " + kLoader + ", then " + kComm)) << v.conclusion;
}

TEST(Bottleneck, BatchAndStragglerTogetherAreBothCulprits) {
  ScalingEvidence ev = healthy();
  ev.micro_batch = 2;  // 8500 -> 10100 at B=16: 1.19x, not enough; make the sweep steeper
  ev.batch_sweep = {{1, 3000}, {2, 5000}, {4, 8000}, {8, 9000}};
  set_straggler(ev, 1.25);
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_EQ(v.culprits(), (std::vector<std::string>{kBatch, kStraggler})) << scalelab::format_verdict(v);
  EXPECT_NEAR(v.findings[2].measured, 9000.0 / 5000.0, 1e-12);
  EXPECT_TRUE(contains(v.findings[2].fix, "B=8")) << v.findings[2].fix;
}

// ---------------------------------------------------------------------------------------------
// Missing evidence: "not measured", never culprit, never a crash

TEST(Bottleneck, EmptyEvidenceGivesFourNotMeasuredFindings) {
  const Verdict v = scalelab::diagnose_scaling(ScalingEvidence{});
  ASSERT_EQ(v.findings.size(), 4u);
  for (const CauseFinding& f : v.findings) {
    EXPECT_FALSE(f.culprit) << f.cause;
    EXPECT_FALSE(f.has_evidence) << f.cause;
    EXPECT_EQ(f.evidence.rfind("not measured", 0), 0u) << f.cause << ": " << f.evidence;
    EXPECT_TRUE(std::isnan(f.measured)) << f.cause;
  }
  EXPECT_TRUE(std::isnan(v.scaling_efficiency));
  const std::string text = scalelab::format_verdict(v);
  size_t n = 0;
  for (size_t at = text.find("not measured\n"); at != std::string::npos; at = text.find("not measured\n", at + 1)) ++n;
  EXPECT_EQ(n, 4u) << text;  // the mark at the end of each cause's line
  EXPECT_TRUE(contains(v.conclusion, "no verdict")) << v.conclusion;
}

TEST(Bottleneck, PartlyMissingEvidenceIsNotMeasuredPerCause) {
  ScalingEvidence ev = healthy();
  ev.batch_sweep.clear();
  Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_FALSE(v.findings[2].has_evidence);
  EXPECT_TRUE(contains(v.findings[2].evidence, "no per-device batch sweep")) << v.findings[2].evidence;
  EXPECT_TRUE(v.findings[0].has_evidence && v.findings[1].has_evidence && v.findings[3].has_evidence);

  ev = healthy();
  ev.micro_batch = 3;  // not in the sweep
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[2].has_evidence);
  ev.micro_batch = 16;  // the largest swept: nothing above it to compare with
  v = scalelab::diagnose_scaling(ev);
  EXPECT_FALSE(v.findings[2].has_evidence);
  EXPECT_TRUE(contains(v.findings[2].evidence, "no batch above")) << v.findings[2].evidence;

  ev = healthy();
  ev.ranks.resize(1);  // one rank's compute: no straggler check; comm falls back to the mean share
  v = scalelab::diagnose_scaling(ev);
  EXPECT_FALSE(v.findings[3].has_evidence);
  EXPECT_TRUE(v.findings[1].has_evidence);
  EXPECT_NEAR(v.findings[1].measured, 0.052, 1e-12);

  ev = healthy();
  ev.world_size = 1;  // single device: no communication to check
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[1].has_evidence);

  ev = healthy();
  ev.loader_alone_tokens_per_s = scalelab::kNotMeasured;  // data wait alone still decides cause 1
  ev.data_wait_share = 0.20;
  v = scalelab::diagnose_scaling(ev);
  EXPECT_TRUE(v.findings[0].has_evidence);
  EXPECT_TRUE(v.findings[0].culprit);
  EXPECT_NEAR(v.findings[0].measured, 0.20, 1e-12);
  EXPECT_TRUE(contains(v.findings[0].evidence, "loader alone not timed")) << v.findings[0].evidence;
}

TEST(Bottleneck, SharesAreDerivedFromRankTimingsWhenNotGiven) {
  ScalingEvidence ev = healthy();
  ev.data_wait_share = scalelab::kNotMeasured;
  ev.loader_alone_tokens_per_s = scalelab::kNotMeasured;
  ev.ranks[0].data_wait_ms = 20.0;  // 20 % and 10 %: mean 15 % > 10 %
  ev.ranks[1].data_wait_ms = 10.0;
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_TRUE(v.findings[0].culprit) << v.findings[0].evidence;
  EXPECT_NEAR(v.findings[0].measured, 0.15, 1e-12);
}

// ---------------------------------------------------------------------------------------------
// Order and printing

TEST(Bottleneck, FindingsAreAlwaysFourInLessonOrder) {
  ScalingEvidence culprit_all = healthy();
  culprit_all.loader_alone_tokens_per_s = 5000;
  culprit_all.micro_batch = 1;
  set_straggler(culprit_all, 1.5);
  culprit_all.ranks[1].exposed_comm_ms = 40.0;  // last-arriver exposed too: comm is a culprit as well
  for (const ScalingEvidence& ev : {healthy(), ScalingEvidence{}, culprit_all}) {
    const Verdict v = scalelab::diagnose_scaling(ev);
    ASSERT_EQ(v.findings.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(v.findings[i].order, i + 1);
      EXPECT_EQ(v.findings[i].cause, kCauseNames[i]);
    }
  }
  EXPECT_EQ(scalelab::diagnose_scaling(culprit_all).culprits(),
            (std::vector<std::string>{kLoader, kComm, kBatch, kStraggler}));
}

TEST(Bottleneck, FormatMarksEachCauseAndPrintsFixOnlyForCulprits) {
  ScalingEvidence ev = healthy();
  ev.overlap_enabled = false;
  set_comm_share(ev, 0.30);
  ev.batch_sweep.clear();
  const std::string text = scalelab::format_verdict(scalelab::diagnose_scaling(ev));
  const size_t p1 = text.find("1. " + kLoader), p2 = text.find("2. " + kComm), p3 = text.find("3. " + kBatch),
               p4 = text.find("4. " + kStraggler), pv = text.find("Verdict:");
  ASSERT_NE(p1, std::string::npos) << text;
  ASSERT_NE(pv, std::string::npos) << text;
  EXPECT_TRUE(p1 < p2 && p2 < p3 && p3 < p4 && p4 < pv) << text;
  EXPECT_TRUE(contains(text.substr(p2, p3 - p2), "CULPRIT")) << text;
  EXPECT_TRUE(contains(text.substr(p2, p3 - p2), "fix: turn overlap on")) << text;
  EXPECT_TRUE(contains(text.substr(p1, p2 - p1), " ok\n")) << text;
  EXPECT_FALSE(contains(text.substr(p1, p2 - p1), "fix:")) << text;
  EXPECT_TRUE(contains(text.substr(p3, p4 - p3), "not measured")) << text;
  EXPECT_EQ(text.back(), '\n');
  std::printf("%s", text.c_str());  // for reading in --output-on-failure / -V
}

TEST(Bottleneck, NoCulpritButPoorEfficiencySaysToLookFurther) {
  ScalingEvidence ev = healthy();
  ev.multi_tokens_per_s = 14000;  // 0.70, yet every check passes
  const Verdict v = scalelab::diagnose_scaling(ev);
  EXPECT_TRUE(v.culprits().empty());
  EXPECT_TRUE(contains(v.conclusion, "none of the four causes fired")) << v.conclusion;
  EXPECT_TRUE(contains(v.conclusion, "1.40x on 2 devices")) << v.conclusion;
}

// ---------------------------------------------------------------------------------------------
// Thresholds, just below and just above (defaults; strict or not as documented in bottleneck.h)

TEST(Bottleneck, LoaderHeadroomThresholdEdges) {
  ScalingEvidence ev = healthy();
  ev.consumption_tokens_per_s = 10000;
  ev.loader_alone_tokens_per_s = 14900;  // 1.49x
  EXPECT_TRUE(scalelab::diagnose_scaling(ev).findings[0].culprit);
  ev.loader_alone_tokens_per_s = 15000;  // exactly 1.5x: enough
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[0].culprit);
  ev.loader_alone_tokens_per_s = 15100;  // 1.51x
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[0].culprit);
}

TEST(Bottleneck, DataWaitShareThresholdEdges) {
  ScalingEvidence ev = healthy();
  ev.data_wait_share = 0.099;
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[0].culprit);
  ev.data_wait_share = 0.101;
  const CauseFinding f = scalelab::diagnose_scaling(ev).findings[0];
  EXPECT_TRUE(f.culprit);
  EXPECT_EQ(f.threshold, 0.10);  // decided by the wait, the headroom (214x) being fine
}

TEST(Bottleneck, ExposedCommThresholdEdges) {
  ScalingEvidence ev = healthy();
  set_comm_share(ev, 0.149);
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[1].culprit);
  set_comm_share(ev, 0.151);
  EXPECT_TRUE(scalelab::diagnose_scaling(ev).findings[1].culprit);
}

TEST(Bottleneck, BatchGainThresholdEdges) {
  ScalingEvidence ev = healthy();
  ev.micro_batch = 4;
  ev.batch_sweep = {{4, 10000}, {8, 12900}};  // 1.29x
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[2].culprit);
  ev.batch_sweep = {{4, 10000}, {8, 13000}};  // exactly 1.3x: culprit (>=)
  EXPECT_TRUE(scalelab::diagnose_scaling(ev).findings[2].culprit);
  ev.batch_sweep = {{4, 10000}, {8, 13100}, {16, 11000}};  // 1.31x at B=8 even if B=16 falls off
  EXPECT_TRUE(scalelab::diagnose_scaling(ev).findings[2].culprit);
}

TEST(Bottleneck, StragglerRatioThresholdEdges) {
  ScalingEvidence ev = healthy();
  set_straggler(ev, 1.14);
  EXPECT_FALSE(scalelab::diagnose_scaling(ev).findings[3].culprit);
  set_straggler(ev, 1.16);
  EXPECT_TRUE(scalelab::diagnose_scaling(ev).findings[3].culprit);
}

TEST(Bottleneck, CustomThresholdsAreHonored) {
  const ScalingEvidence ev = healthy();  // healthy under the defaults
  scalelab::VerdictThresholds strict;
  strict.loader_headroom_min = 300;    // 214x is not enough now
  strict.straggler_ratio_max = 1.005;  // rank 1 computes 95 vs 94 ms: 1.011x
  const Verdict v = scalelab::diagnose_scaling(ev, strict);
  EXPECT_EQ(v.culprits(), (std::vector<std::string>{kLoader, kStraggler}));
  EXPECT_EQ(v.findings[0].threshold, 300);
}
