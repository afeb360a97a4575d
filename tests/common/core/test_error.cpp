// test_error.cpp — scalelab's error reports (scalelab/core/error.h, common/src/core/error.cpp) and the errors
// users meet first: unknown precision names (precision.cpp), unknown model presets and invalid
// configs (gpt2_layout.cpp). A report must say what failed, where (file:line, function), with which values,
// and what to do (docs/style.md 19-20); these tests read the text a user would read.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/core/error.h"      // defines: Error, NotImplemented, SL_CHECK, SL_CHECK_HINT, SL_FAIL
#include "scalelab/model/gpt2.h"      // defines: GPTConfig
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace {

// The lines of the checks below, so the tests can look for "test_error.cpp:<line>" in the report.
// Each macro is written on ONE line: __LINE__ inside a multi-line macro call is compiler-dependent.
constexpr int kCheckLine = __LINE__ + 1;
void check_heads(int C, int NH) { SL_CHECK(C % NH == 0, "C=%d not divisible by NH=%d", C, NH); }
constexpr int kHintLine = __LINE__ + 1;
void check_batch(int B) { SL_CHECK_HINT(B > 0, "pass --batch-size >= 1", "batch size B=%d", B); }
void fail_always(const char* what) { SL_FAIL("call it with a known name", "unknown thing '%s'", what); }

using scalelab::test::contains;
using scalelab::test::error_message;

// Sets an environment variable for one test and restores its previous state afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The macros

TEST(Error, CheckReportHasValuesFileLineFunctionAndStatement) {
  EXPECT_NO_THROW(check_heads(768, 12));
  const std::string msg = error_message([] { check_heads(100, 3); });
  EXPECT_EQ(msg.rfind("[scalelab] check failed", 0), 0u) << msg;     // the block starts with what failed
  EXPECT_TRUE(contains(msg, "C=100 not divisible by NH=3")) << msg;  // the formatted values
  EXPECT_TRUE(contains(msg, "test_error.cpp:" + std::to_string(kCheckLine))) << msg;
  EXPECT_TRUE(contains(msg, "check_heads")) << msg;  // the function
  EXPECT_TRUE(contains(msg, "stmt: C % NH == 0")) << msg;
  EXPECT_FALSE(contains(msg, "hint:")) << "SL_CHECK has no hint line:\n" << msg;
}

TEST(Error, CheckHintAddsAHintLine) {
  EXPECT_NO_THROW(check_batch(4));
  const std::string msg = error_message([] { check_batch(0); });
  EXPECT_TRUE(contains(msg, "\n[scalelab]   hint: pass --batch-size >= 1")) << msg;
  EXPECT_TRUE(contains(msg, "batch size B=0")) << msg;
  EXPECT_TRUE(contains(msg, "test_error.cpp:" + std::to_string(kHintLine))) << msg;
  EXPECT_TRUE(contains(msg, "check_batch")) << msg;
}

TEST(Error, FailThrowsWithMessageAndHint) {
  const std::string msg = error_message([] { fail_always("frobnicator"); });
  EXPECT_TRUE(contains(msg, "unknown thing 'frobnicator'")) << msg;
  EXPECT_TRUE(contains(msg, "hint: call it with a known name")) << msg;
  EXPECT_TRUE(contains(msg, "fail_always")) << msg;
}

// The condition is evaluated once, and the message is formatted only when the check fails.
TEST(Error, CheckEvaluatesItsConditionOnceAndFormatsOnlyOnFailure) {
  int evaluations = 0, formats = 0;
  auto cond = [&] {
    ++evaluations;
    return true;
  };
  auto value = [&] {
    ++formats;
    return 1;
  };
  SL_CHECK(cond(), "value %d", value());
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(formats, 0);
}

// Messages are formatted into a std::string of the right length, not a fixed buffer.
TEST(Error, LongMessagesAreKeptWhole) {
  const std::string long_name(5000, 'x');
  const std::string msg = error_message([&] { SL_CHECK(false, "name %s end", long_name.c_str()); });
  EXPECT_TRUE(contains(msg, "name " + long_name + " end")) << "message truncated to " << msg.size() << " chars";
}

// Under mpirun a report names the rank (docs/style.md 19), so interleaved output of many ranks is readable.
TEST(Error, ReportNamesTheRankWhenLaunchedByMpirun) {
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "3");
  const std::string msg = error_message([] { check_heads(10, 4); });
  EXPECT_TRUE(contains(msg, ") rank 3")) << msg;
}

TEST(Error, ErrorTypesFormOneHierarchy) {
  static_assert(std::is_base_of_v<std::runtime_error, scalelab::Error>, "main() may catch std::exception");
  static_assert(std::is_base_of_v<scalelab::Error, scalelab::OutOfMemory>);
  static_assert(std::is_base_of_v<scalelab::Error, scalelab::NotImplemented>);
  EXPECT_THROW(check_heads(1, 2), std::runtime_error);
}

TEST(Error, NotImplementedCarriesItsTodoId) {
  const std::string msg =
      error_message<scalelab::NotImplemented>([] { throw scalelab::NotImplemented("lab01-2 flops_per_token"); });
  EXPECT_TRUE(contains(msg, "not implemented: lab01-2 flops_per_token")) << msg;
  EXPECT_TRUE(contains(msg, "TODO(lab01-2)")) << "the hint names the fence to fill in:\n" << msg;
  // ... and the file of the throw, relative to the repository (a learner looks there, not in a header)
  EXPECT_TRUE(contains(msg, "tests/common/core/test_error.cpp:")) << msg;
  EXPECT_FALSE(contains(msg, "/tests/common/core/test_error.cpp")) << "path should be repository-relative:\n" << msg;
  try {
    throw scalelab::NotImplemented("lab03-1 all_reduce_grads");
  } catch (const scalelab::NotImplemented& e) {
    EXPECT_EQ(e.todo, "lab03-1 all_reduce_grads");  // the grader reads this field
  }
}

// ---------------------------------------------------------------------------------------------
// Errors of names and configs

TEST(PrecisionPolicy, FromNameAcceptsTheDocumentedNames) {
  EXPECT_EQ(scalelab::PrecisionPolicy::from_name("fp32").name(), "fp32");
  EXPECT_EQ(scalelab::PrecisionPolicy::from_name("bf16").name(), "bf16-mixed");
  EXPECT_EQ(scalelab::PrecisionPolicy::from_name("bf16-mixed").name(), "bf16-mixed");
  EXPECT_TRUE(scalelab::PrecisionPolicy::from_name("bf16").has_master_copy());
  EXPECT_FALSE(scalelab::PrecisionPolicy::from_name("fp32").has_master_copy());
}

TEST(PrecisionPolicy, UnknownNameErrorListsTheAcceptedNames) {
  const std::string msg = error_message([] { scalelab::PrecisionPolicy::from_name("fp16"); });
  EXPECT_TRUE(contains(msg, "'fp16'")) << msg;
  EXPECT_TRUE(contains(msg, "hint:")) << msg;
  EXPECT_TRUE(contains(msg, "fp32") && contains(msg, "bf16")) << msg;
}

TEST(GPTConfig, UnknownPresetErrorListsThePresets) {
  EXPECT_NO_THROW(scalelab::GPTConfig::preset("d12"));
  const std::string msg = error_message([] { scalelab::GPTConfig::preset("d13"); });
  EXPECT_TRUE(contains(msg, "'d13'")) << msg;
  for (const char* name : {"tiny", "demo", "d12", "d24", "d36", "d48"})
    EXPECT_TRUE(contains(msg, name)) << name << " missing from:\n" << msg;
}

TEST(GPTConfig, ValidateRejectsHeadsNotDividingTheWidthAndNonPositiveSizes) {
  scalelab::GPTConfig cfg = scalelab::GPTConfig::preset("tiny");
  EXPECT_NO_THROW(cfg.validate());
  cfg.n_embd = 100;
  cfg.n_head = 3;
  std::string msg = error_message([&] { cfg.validate(); });
  EXPECT_TRUE(contains(msg, "C=100 not divisible by NH=3")) << msg;
  EXPECT_TRUE(contains(msg, "hint:")) << msg;
  cfg = scalelab::GPTConfig::preset("tiny");
  cfg.n_layer = 0;
  msg = error_message([&] { cfg.validate(); });
  EXPECT_TRUE(contains(msg, "L=0")) << "the report prints the config:\n" << msg;
}
