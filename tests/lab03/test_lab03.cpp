// test_lab03.cpp — lab 03's single-process graded checks: the bucket layout and the micro-step count
// (pure functions, no communication). The multi-rank checks: test_lab03_np2.cpp (2 ranks) and
// test_lab03_np4.cpp (4 ranks). Built twice by sl_add_graded_test (tests/lab03/CMakeLists.txt):
// against lab03_learner (your labs/03_ddp/ddp.cpp) and lab03_ref (solutions/03_ddp/ddp.cpp).
// Every expected value is computed here, independently of the track. Lesson: labs/03_ddp/README.md.
#include <gtest/gtest.h>

#include <cstdint>  // defines: int64_t
#include <string>
#include <vector>

#include "ddp.h"             // defines: lab03::make_buckets, micro_steps_per_step
#include "grading.h"         // defines: grading::Check, grading::run, grading::Record
#include "scalelab/core/error.h"  // defines: scalelab::Error
#include "scalelab/model/gpt2.h"   // defines: gpt2_param_table, GPTConfig

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
      /*target=*/"make_buckets equals the README's rule (table walked backwards, whole tensors, a bucket closes "
                 "once it holds >= bucket_mb MiB of fp32, one range per unit, ready_unit = lowest unit) for the "
                 "tiny model at 0, 48 elements (exactly 3 tensors), 0.0038, 0.01 and 25 MiB, demo at 1 MiB and d12 "
                 "at 25 MiB; bucket_mb < 0 "
                 "throws scalelab::Error",
      /*hint=*/"README 'Buckets': the walk order (the order backward produces gradients), when a bucket closes, "
               "and why a bucket holding part of unit 0 is ready only after after_backward(0)"};
  grading::run(check, [](grading::Record& record) {
    struct Case {
      const char* preset;
      double bucket_mb;
    };
    // 48 elements: ln_f.bias + ln_f.weight + h.1.mlp.c_proj.bias fill the cap exactly (>= closes, > would not)
    const double exactly_48 = 48.0 * 4 / 1048576.0;
    const Case cases[] = {{"tiny", 0.0},  {"tiny", exactly_48}, {"tiny", 1000.0 * 4 / 1048576.0}, {"tiny", 0.01},
                          {"tiny", 25.0}, {"demo", 1.0},        {"d12", 25.0}};
    std::string summary;
    for (const Case& c : cases) {
      const std::vector<ParamInfo> table = gpt2_param_table(GPTConfig::preset(c.preset));
      const std::vector<lab03::Bucket> got = lab03::make_buckets(table, c.bucket_mb);
      const std::vector<lab03::Bucket> want = expected_buckets(table, c.bucket_mb);
      const std::string where = std::string(c.preset) + " at " + std::to_string(c.bucket_mb) + " MiB: ";
      if (got.size() != want.size()) {
        ADD_FAILURE() << where << got.size() << " buckets, expected " << want.size() << "; the first expected: "
                      << describe(want[0]) << (got.empty() ? "" : ", got: " + describe(got[0]));
        continue;
      }
      for (size_t k = 0; k < want.size(); ++k) {
        if (!same(got[k], want[k])) {
          ADD_FAILURE() << where << "bucket " << k << " is " << describe(got[k]) << ", expected " << describe(want[k]);
          break;
        }
      }
      summary += (summary.empty() ? "" : "; ") + std::string(c.preset) + "@" + std::to_string(c.bucket_mb).substr(0, 6) +
                 " MiB: " + std::to_string(got.size()) + " buckets";
    }
    record.measured(summary);
    EXPECT_THROW(lab03::make_buckets(gpt2_param_table(GPTConfig::preset("tiny")), -1.0), scalelab::Error)
        << "bucket_mb < 0 must be refused";
  });
}

TEST(Lab03Ddp, MicroStepsPerStep) {
  const grading::Check check{
      "lab03.micro_steps_per_step", /*points=*/1,
      /*target=*/"micro_steps_per_step(global, micro, world) = global / (micro x world) for (8,2,2) = 2, (8,8,1) = 1, "
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
