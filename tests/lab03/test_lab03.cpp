// test_lab03.cpp — lab 03's single-process graded checks: the bucket layout and the micro-step count
// (pure functions, no communication). The multi-rank checks: test_lab03_np2.cpp (2 ranks) and
// test_lab03_np4.cpp (4 ranks). Built twice by sl_add_graded_test (tests/lab03/CMakeLists.txt):
// against lab03_learner (your labs/03_ddp/ddp.cpp) and lab03_ref (solutions/03_ddp/ddp.cpp).
// Every expected value is computed here, independently of the track. Lesson: labs/03_ddp/README.md.
#include <gtest/gtest.h>

#include <cstdint>  // defines: int64_t
#include <cstdio>   // defines: std::snprintf
#include <string>
#include <utility>  // defines: std::pair
#include <vector>

#include "ddp.h"                  // defines: lab03::make_buckets, micro_steps_per_step
#include "grading.h"              // defines: grading::Check, grading::run, grading::Record
#include "scalelab/core/error.h"  // defines: scalelab::Error
#include "scalelab/model/gpt2.h"  // defines: gpt2_param_table, GPTConfig

namespace {

using namespace scalelab;
namespace grading = scalelab::grading;

// The layout rule of the README ("Buckets"), written independently of the track: the tensors in
// reverse table order, cut into groups whose running size first reaches the cap, then each group's
// tensors merged into one range per unit (they are adjacent in the unit's buffer).
std::vector<lab03::Bucket> expected_buckets(const std::vector<ParamInfo>& table, double bucket_mb) {
  const int64_t cap = static_cast<int64_t>(bucket_mb * 1048576.0 / 4);  // elements of fp32
  std::vector<std::vector<ParamInfo>> groups(1);
  int64_t in_group = 0;
  for (size_t i = table.size(); i-- > 0;) {
    groups.back().push_back(table[i]);
    in_group += table[i].numel;
    if (in_group >= cap && i > 0) {
      groups.emplace_back();
      in_group = 0;
    }
  }
  std::vector<lab03::Bucket> out;
  for (const std::vector<ParamInfo>& group : groups) {
    lab03::Bucket b;
    for (const ParamInfo& p : group) {
      if (b.ranges.empty() || b.ranges.back().unit != p.unit) b.ranges.push_back({p.unit, p.offset, 0});
      b.ranges.back().offset = p.offset;  // tensors arrive in descending offset order within a unit
      b.ranges.back().count += p.numel;
      b.numel += p.numel;
      b.ready_unit = p.unit;
    }
    out.push_back(b);
  }
  return out;
}

// Every boundary of the rule, not one example. A bucket can close exactly when the walk's running size
// S (from the last tensor up) reaches the cap, so for each S: caps of S - 1, S and S + 1 elements, and
// the fractional S + 0.5 and S + 0.75 (the cap is floor(bucket_mb * 2^20 / 4): a bucket of S elements
// closes, one that rounds the cap up or compares bytes does not); every cap that divides the total
// exactly (each bucket then can fill to the element); the total itself, +-1; and 0. In MiB, exactly
// representable (an element count / 2^18).
std::vector<double> boundary_caps_mb(const std::vector<ParamInfo>& table) {
  std::vector<double> elements = {0.0};
  int64_t total = 0;
  for (const ParamInfo& p : table) total += p.numel;
  int64_t running = 0;
  for (size_t i = table.size(); i-- > 0;) {
    running += table[i].numel;
    for (const double d : {-1.0, 0.0, 0.5, 0.75, 1.0}) elements.push_back(static_cast<double>(running) + d);
  }
  for (int64_t k = 1; k <= 64; ++k)
    if (total % k == 0) elements.push_back(static_cast<double>(total / k));
  elements.push_back(static_cast<double>(total + 1));
  std::vector<double> mb;
  for (const double e : elements)
    if (e >= 0) mb.push_back(e * 4 / 1048576.0);
  return mb;
}

std::string describe(const lab03::Bucket& b) {
  std::string s = "{ready_unit " + std::to_string(b.ready_unit) + ", numel " + std::to_string(b.numel) + ", ranges";
  for (const lab03::GradRange& r : b.ranges) {
    s += " (unit " + std::to_string(r.unit) + ", offset " + std::to_string(r.offset) + ", count " +
         std::to_string(r.count) + ")";
  }
  return s + "}";
}

bool same(const lab03::Bucket& a, const lab03::Bucket& b) {
  if (a.ready_unit != b.ready_unit || a.numel != b.numel || a.ranges.size() != b.ranges.size()) return false;
  for (size_t i = 0; i < a.ranges.size(); ++i) {
    const lab03::GradRange &x = a.ranges[i], &y = b.ranges[i];
    if (x.unit != y.unit || x.offset != y.offset || x.count != y.count) return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(Lab03Ddp, BucketLayout) {
  const grading::Check check{
      "lab03.bucket_layout", /*points=*/3,
      /*target=*/
      "make_buckets equals the README's rule (table walked backwards, whole tensors, a bucket closes "
      "once it holds >= cap = floor(bucket_mb * 2^20 / 4) elements, one range per unit, ready_unit = "
      "lowest unit) at every boundary of the rule on the tiny model and a model of odd sizes (C=9): "
      "caps of S-1, S, S+0.5, S+0.75 and S+1 elements for every running size S of the walk, every cap "
      "dividing the total exactly, 0 and the total; demo at 1 MiB and d12 at 25 MiB; bucket_mb < 0 "
      "throws scalelab::Error",
      /*hint=*/
      "README 'Buckets': the walk order (the order backward produces gradients), when exactly a bucket "
      "closes (the cap is a whole number of elements, rounded down), what happens at the end of the walk, "
      "and why a bucket holding part of unit 0 is ready only after after_backward(0)"};
  grading::run(check, [](grading::Record& record) {
    struct Case {
      std::string model;
      GPTConfig cfg;
      double bucket_mb;
    };
    // The sizes' boundaries first on two small models (the tiny preset, every tensor a multiple of 16,
    // and one of odd sizes), then the README's two layouts of real size.
    const GPTConfig odd{/*max_seq_len=*/15, /*vocab_size=*/64, /*n_layer=*/2, /*n_head=*/3, /*n_embd=*/9};
    std::vector<Case> cases;
    for (const auto& [name, cfg] : {std::pair<std::string, GPTConfig>{"tiny", GPTConfig::preset("tiny")},
                                    std::pair<std::string, GPTConfig>{"C=9", odd}}) {
      for (const double mb : boundary_caps_mb(gpt2_param_table(cfg))) cases.push_back({name, cfg, mb});
    }
    cases.push_back({"demo", GPTConfig::preset("demo"), 1.0});
    cases.push_back({"d12", GPTConfig::preset("d12"), 25.0});
    int failures = 0, layouts = 0;
    std::string summary;
    for (const Case& c : cases) {
      const std::vector<ParamInfo> table = gpt2_param_table(c.cfg);
      const std::vector<lab03::Bucket> got = lab03::make_buckets(table, c.bucket_mb);
      const std::vector<lab03::Bucket> want = expected_buckets(table, c.bucket_mb);
      ++layouts;
      char where[160];
      std::snprintf(where, sizeof(where), "%s at %.9g MiB (%.2f elements, cap %lld): ", c.model.c_str(), c.bucket_mb,
                    c.bucket_mb * 1048576.0 / 4, static_cast<long long>(c.bucket_mb * 1048576.0 / 4));
      std::string problem;
      if (got.size() != want.size()) {
        problem = std::to_string(got.size()) + " buckets, expected " + std::to_string(want.size()) +
                  "; the first expected: " + describe(want[0]) + (got.empty() ? "" : ", got: " + describe(got[0]));
      } else {
        for (size_t k = 0; k < want.size() && problem.empty(); ++k) {
          if (!same(got[k], want[k]))
            problem = "bucket " + std::to_string(k) + " is " + describe(got[k]) + ", expected " + describe(want[k]);
        }
      }
      if (!problem.empty() && failures++ < 3) ADD_FAILURE() << where << problem;  // the first 3 layouts that differ
      if (c.model == "demo" || c.model == "d12") {
        summary += "; " + c.model + " at " + std::to_string(static_cast<int>(c.bucket_mb)) +
                   " MiB: " + std::to_string(got.size()) + " buckets";
      }
    }
    if (failures > 3) ADD_FAILURE() << failures << " of " << layouts << " layouts differ in all";
    record.measured(std::to_string(layouts - failures) + " of " + std::to_string(layouts) +
                    " layouts as the rule says" + summary);
    EXPECT_THROW(lab03::make_buckets(gpt2_param_table(GPTConfig::preset("tiny")), -1.0), scalelab::Error)
        << "bucket_mb < 0 must be refused";
  });
}

TEST(Lab03Ddp, MicroStepsPerStep) {
  const grading::Check check{
      "lab03.micro_steps_per_step", /*points=*/1,
      /*target=*/
      "micro_steps_per_step(global, micro, world) = global / (micro x world) for (8,2,2) = 2, (8,8,1) = 1, "
      "(48,4,4) = 3, (512,4,8) = 16; (10,2,4) and (4,8,1) throw scalelab::Error",
      /*hint=*/"README 'Gradient accumulation': one micro-step processes micro_batch sequences on EVERY rank"};
  grading::run(check, [](grading::Record& record) {
    struct Case {
      int global, micro, world, want;
    };
    const Case cases[] = {{8, 2, 2, 2}, {8, 8, 1, 1}, {48, 4, 4, 3}, {512, 4, 8, 16}};
    std::string got_text;
    for (const Case& c : cases) {  // the valid inputs first: an unfinished TODO reports "not implemented"
      const int got = lab03::micro_steps_per_step(c.global, c.micro, c.world);
      got_text += (got_text.empty() ? "" : ", ") + std::string("(") + std::to_string(c.global) + "," +
                  std::to_string(c.micro) + "," + std::to_string(c.world) + ") = " + std::to_string(got);
      EXPECT_EQ(got, c.want) << "micro_steps_per_step(" << c.global << ", " << c.micro << ", " << c.world << ")";
    }
    record.measured(got_text);
    EXPECT_THROW(lab03::micro_steps_per_step(10, 2, 4), scalelab::Error) << "10 is not a multiple of 2 x 4";
    EXPECT_THROW(lab03::micro_steps_per_step(4, 8, 1), scalelab::Error) << "4 sequences cannot fill a micro-step of 8";
  });
}
