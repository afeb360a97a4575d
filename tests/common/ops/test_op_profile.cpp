// test_op_profile.cpp — the per-op time table (scalelab/ops/op_profile.h) that the dispatch point
// (common/src/ops/dispatch.cpp) fills while it is on: each ops.h call counted once under the phase set
// last, nothing while it is off, the table emptied when it is turned on again, a GPT-2 step's ops all
// seen. bench_lab01 --breakdown prints this table; the times themselves are not asserted (absolute speed
// decides no unit test), only that they are there and not negative.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "scalelab/model/gpt2.h"      // defines: GPT2, GPTConfig
#include "scalelab/ops/op_profile.h"  // defines: the functions under test
#include "scalelab/ops/ops.h"         // defines: gelu_forward, scale_

namespace {

using namespace scalelab;

// (phase/op) -> calls of the table now.
std::map<std::string, int64_t> calls() {
  std::map<std::string, int64_t> c;
  for (const OpTime& t : op_profile_table()) {
    EXPECT_GE(t.ms, 0.0) << t.phase << "/" << t.op;
    c[t.phase + "/" + t.op] = t.calls;
  }
  return c;
}

TEST(OpProfile, CountsEachCallUnderItsPhaseOnlyWhileOn) {
  Tensor x = Tensor::zeros({4, 8}, DType::F32), y = Tensor::zeros({4, 8}, DType::F32);
  op_profile_enable(true);
  op_profile_phase("forward");
  gelu_forward(y, x);
  gelu_forward(y, x);
  op_profile_phase("optimizer");
  scale_(y, 0.5f);
  op_profile_phase("forward");  // a phase set again adds to its earlier entries
  gelu_forward(y, x);
  op_profile_enable(false);
  gelu_forward(y, x);  // off: not counted
  const std::map<std::string, int64_t> want = {{"forward/gelu_forward", 3}, {"optimizer/scale_", 1}};
  EXPECT_EQ(calls(), want);
  const std::vector<OpTime> table = op_profile_table();
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].phase, "forward") << "phases in the order they were first set";

  op_profile_enable(true);  // on again: a fresh table
  EXPECT_TRUE(op_profile_table().empty());
  op_profile_enable(false);
}

TEST(OpProfile, SeesEveryOpOfAGpt2Step) {
  GPT2 model(GPTConfig::preset("tiny"));
  Tensor x = Tensor::zeros({2, 8}, DType::I32), y = Tensor::zeros({2, 8}, DType::I32);
  op_profile_enable(true);
  op_profile_phase("forward");
  model.forward(x, &y);
  op_profile_phase("backward");
  model.backward();
  op_profile_enable(false);
  const std::map<std::string, int64_t> c = calls();
  const int L = model.config().n_layer;
  // Per block: ln_1, c_attn, attention, c_proj, residual, ln_2, c_fc, gelu, c_proj, residual; then ln_f
  // and the LM head (one more matmul).
  EXPECT_EQ(c.at("forward/layernorm_forward"), 2 * L + 1);
  EXPECT_EQ(c.at("forward/matmul_forward"), 4 * L + 1);
  EXPECT_EQ(c.at("forward/attention_forward"), L);
  EXPECT_EQ(c.at("forward/gelu_forward"), L);
  EXPECT_EQ(c.at("forward/encoder_forward"), 1);
  EXPECT_EQ(c.at("forward/softmax_crossentropy_forward"), 1);
  EXPECT_EQ(c.at("backward/matmul_backward"), 4 * L + 1);
  EXPECT_EQ(c.at("backward/layernorm_backward"), 2 * L + 1);
  EXPECT_EQ(c.at("backward/attention_backward"), L);
  EXPECT_EQ(c.at("backward/encoder_backward"), 1);
}

}  // namespace
