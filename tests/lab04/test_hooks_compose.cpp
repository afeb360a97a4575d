// test_hooks_compose.cpp — the model's hooks are lists that compose (gpt2.h add_hook): DDP's (lab 03's
// GradSync in overlap mode) and FSDP's (lab 04, ZeRO-2) on ONE model both fire, in the order they were
// added, and removing one leaves the other running. Reference tracks of labs 03 and 04, one rank (the
// local communicator: the collectives are real calls that complete at once, and the event log shows
// which hook issued what, unit by unit). Not a graded check: it tests the kit's own machinery, which
// lab 07 (DDP on top of tensor- and pipeline-parallel stages) builds on.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp.h"                   // defines: lab03::GradSync (reference track)
#include "fsdp.h"                  // defines: lab04::FSDP (reference track)
#include "scalelab/comm/comm.h"    // defines: make_communicator, CommEvent
#include "scalelab/model/gpt2.h"   // defines: GPTConfig, HookPoint, UnitHookArgs
#include "scalelab/model/optim.h"  // defines: OptimizerConfig

namespace {

using namespace scalelab;

// What one forward + backward issued, in order: "reduce_scatter <unit>" (FSDP's after_backward) and
// "all_reduce <bucket tag>" (GradSync's), with the unit each was issued at (an observer hook stamps it).
std::vector<std::string> one_pass(lab04::FSDP& fsdp, Communicator& comm) {
  GPT2& model = fsdp.model();
  std::vector<std::string> seen;
  int unit = -1;
  size_t next_event = 0;
  // First in line at after_backward: names the unit; last in line: collects what the others issued.
  const HookHandle name = model.add_hook(
      HookPoint::AfterBackward, [&](const UnitHookArgs& a) { unit = a.unit; }, HookOrder::First);
  const HookHandle collect = model.add_hook(HookPoint::AfterBackward, [&](const UnitHookArgs&) {
    const std::vector<CommEvent> events = comm.events();
    for (; next_event < events.size(); ++next_event)
      seen.push_back("unit " + std::to_string(unit) + ": " + events[next_event].op + " " + events[next_event].tag);
  });
  const GPTConfig& cfg = model.config();
  Tensor x = Tensor::zeros({2, 8}, DType::I32), y = Tensor::zeros({2, 8}, DType::I32);  // (B, T) token ids
  for (int i = 0; i < 16; ++i) {
    x.data<int32_t>()[i] = (7 * i + 3) % cfg.vocab_size;
    y.data<int32_t>()[i] = (5 * i + 1) % cfg.vocab_size;
  }
  comm.clear_events();
  fsdp.zero_grad();
  model.forward(x, &y);
  model.backward();
  fsdp.finish_backward();
  return seen;
}

bool any_starts(const std::vector<std::string>& v, const std::string& what) {
  for (const std::string& s : v)
    if (s.find(what) != std::string::npos) return true;
  return false;
}

TEST(HooksCompose, DdpAndFsdpHooksFireInOrderAndRemovingOneKeepsTheOther) {
  std::unique_ptr<Communicator> comm = make_communicator("local");
  const GPTConfig cfg = GPTConfig::preset("tiny");
  lab04::FsdpOptions fo;
  fo.stage = lab04::ZeroStage::Zero2;  // after_backward: reduce-scatter the unit's gradient, keeping
  fo.overlap = true;                   // its full gradient until the next unit's (overlap on)
  lab04::FSDP fsdp(cfg, PrecisionPolicy::fp32(), Device::CPU, /*seed=*/7, *comm, fo);
  const int fsdp_hooks = fsdp.model().num_hooks(HookPoint::AfterBackward);
  ASSERT_EQ(fsdp_hooks, 1);

  std::vector<std::string> with_both;
  {
    // One bucket per tensor (bucket_mb 0): a bucket is ready at its own unit's after_backward, while
    // ZeRO-2 still holds that unit's full gradient.
    lab03::GradSync ddp(fsdp.model(), *comm, lab03::SyncMode::Overlap, /*bucket_mb=*/0.0);
    EXPECT_EQ(fsdp.model().num_hooks(HookPoint::AfterBackward), 2);
    with_both = one_pass(fsdp, *comm);
    // No ddp.finish(): it would copy the averaged buckets back into gradients ZeRO-2 has already
    // reduce-scattered and freed. The two are not a training recipe together; their hooks are the test.
    // (The local communicator completed every all-reduce at its call.)
  }
  EXPECT_EQ(fsdp.model().num_hooks(HookPoint::AfterBackward), 1) << "GradSync's destructor removes only its hook";
  const std::vector<std::string> fsdp_only = one_pass(fsdp, *comm);

  std::string all;
  for (const std::string& s : with_both) all += "  " + s + "\n";
  // Both fired, at every unit, FSDP's first (it was added first): the unit's reduce-scatter, then DDP's
  // all-reduces of the buckets that unit completed.
  const int L = cfg.n_layer;
  for (int u = L + 1; u >= 0; --u) {
    const std::string at = "unit " + std::to_string(u) + ": ";
    size_t rs = with_both.size(), ar = with_both.size();
    for (size_t i = 0; i < with_both.size(); ++i) {
      if (with_both[i].rfind(at + "reduce_scatter", 0) == 0 && rs == with_both.size()) rs = i;
      if (with_both[i].rfind(at + "all_reduce bucket", 0) == 0 && ar == with_both.size()) ar = i;
    }
    EXPECT_LT(rs, with_both.size()) << "FSDP's reduce-scatter missing at unit " << u << ":\n" << all;
    EXPECT_LT(ar, with_both.size()) << "DDP's bucket all-reduce missing at unit " << u << ":\n" << all;
    EXPECT_LT(rs, ar) << "at unit " << u << " FSDP's hook (added first) must run first:\n" << all;
  }
  // GradSync removed: FSDP's hook still fires at every unit, and no bucket is launched.
  EXPECT_FALSE(any_starts(fsdp_only, "bucket"));
  for (int u = L + 1; u >= 0; --u)
    EXPECT_TRUE(any_starts(fsdp_only, "unit " + std::to_string(u) + ": reduce_scatter")) << "unit " << u;
}

}  // namespace
