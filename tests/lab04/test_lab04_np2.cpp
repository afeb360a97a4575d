// test_lab04_np2.cpp — lab 04's graded checks on 2 ranks (mpiexec -n 2; sl_add_graded_test NP 2).
// Each check compares what sharded data parallelism must get right with ONE process training on the
// whole global batch (a plain GPT2 + Optimizer, computed here on every rank; lab04_support.h): first
// the reduced gradient shards per unit, before the optimizer can hide a wrong gradient, then the
// parameters after steps of AdamW, of plain SGD (which hides nothing), with accumulation and in bf16;
// then what the allocator and the communicator's event log say: bytes per category against
// estimate_memory, gathered copies freed after use, the collectives per unit and step, and prefetch.
// Every rank evaluates every assertion; grading::all_ranks combines them (grading.h), so a failure on
// one rank never leaves the other waiting.
#include <gtest/gtest.h>

#include <algorithm>  // defines: std::max
#include <cstdint>    // defines: int64_t
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fsdp.h"                               // defines: lab04::* (the track under test)
#include "grading.h"                            // defines: grading::Check, grading::run, grading::all_ranks
#include "lab04_support.h"                      // defines: fresh_comm, the reference, comparisons, shared bodies
#include "scalelab/core/allocator.h"            // defines: Allocator, MemStats
#include "scalelab/comm/comm.h"                 // defines: Communicator, CommEvent
#include "scalelab/measure/memory_estimator.h"  // defines: estimate_memory
#include "scalelab/model/optim.h"               // defines: OptimizerConfig

namespace {

using namespace scalelab;
using namespace scalelab::lab04_test;
namespace grading = scalelab::grading;

}  // namespace

// ---------------------------------------------------------------------------------------------
// (a) the reduced gradient shards, one stage at a time

TEST(Lab04Fsdp, Zero1GradShardsEqualSingleProcess) {
  const grading::Check check{
      "lab04.zero1_grad_shards_equal_single_process", /*points=*/2,
      /*target=*/
      "ZeRO-1, 2 ranks x 2 sequences, one train_step (fp32, AdamW, no clipping): on every rank and unit "
      "grad_shard_owned equals its slice of the one-process gradient of the 4 sequences, "
      "||got - want|| <= 1e-5 ||want|| + 1e-9",
      /*hint=*/
      "README 'Reduce-scatter': ReduceOp::Avg over the PADDED full gradient; rank r receives chunk r; "
      "ZeRO-1 reduces once, after the last micro-step"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_grad_shards_match(tiny_config(), lab04::ZeroStage::Zero1, 1));
  });
}

TEST(Lab04Fsdp, Zero2GradShardsEqualSingleProcess) {
  const grading::Check check{
      "lab04.zero2_grad_shards_equal_single_process", /*points=*/2,
      /*target=*/
      "ZeRO-2, 2 ranks x 2 sequences, one train_step: every rank's grad_shard_owned equals its slice of the "
      "one-process gradient, ||got - want|| <= 1e-5 ||want|| + 1e-9 per unit",
      /*hint=*/
      "README 'Reduce-scatter': the hooks reduce-scatter each unit after its backward; finish_reduce_scatter "
      "ADDS rs_out into grad_shard and frees the full gradient"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_grad_shards_match(tiny_config(), lab04::ZeroStage::Zero2, 1));
  });
}

TEST(Lab04Fsdp, Zero3GradShardsEqualSingleProcess) {
  const grading::Check check{
      "lab04.zero3_grad_shards_equal_single_process", /*points=*/2,
      /*target=*/
      "ZeRO-3 (prefetch 1), 2 ranks x 2 sequences, one train_step: every rank's grad_shard_owned equals "
      "its slice of the one-process gradient, ||got - want|| <= 1e-5 ||want|| + 1e-9 per unit",
      /*hint=*/
      "README 'ZeRO-3': a block's parameters must be gathered (whole, in the right order) before its "
      "forward AND its backward; install the view [0, n) of the padded buffer"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_grad_shards_match(tiny_config(), lab04::ZeroStage::Zero3, 1));
  });
}

// ---------------------------------------------------------------------------------------------
// (b) the parameters after AdamW steps, one stage at a time

TEST(Lab04Fsdp, Zero1AdamwStepsMatchSingleProcess) {
  const grading::Check check{
      "lab04.zero1_adamw_steps_match_single_process", /*points=*/2,
      /*target=*/
      "ZeRO-1, 3 train_steps of AdamW (lr 1e-3, wd 0.1, clip 0.05 active), 2 ranks x 2 sequences: after "
      "every step the gathered parameters within 1e-4 of one process (GPT2 + Optimizer), the mean loss "
      "and the gradient norm within 1e-5 relative, the kept units' full parameters equal the shards",
      /*hint=*/
      "README 'The update': weight decay per parameter (ParamInfo::decay) on the intersection of each "
      "parameter with your shard; t counts steps, not units; all-gather the new shards"};
  grading::run(check, [](grading::Record& record) { record.measured(adamw_steps(1, tiny_config())); });
}

TEST(Lab04Fsdp, Zero2AdamwStepsMatchSingleProcess) {
  const grading::Check check{
      "lab04.zero2_adamw_steps_match_single_process", /*points=*/2,
      /*target=*/
      "ZeRO-2, 3 AdamW steps (lr 1e-3, clip 0.05 active), 2 ranks: parameters within 1e-4 of one process, "
      "loss and gradient norm within 1e-5 relative after every step",
      /*hint=*/
      "README 'The update': the global norm is the sqrt of the SUM over ranks of each shard's sum of "
      "squares; zero the grad shards at the start of each step"};
  grading::run(check, [](grading::Record& record) { record.measured(adamw_steps(2, tiny_config())); });
}

TEST(Lab04Fsdp, Zero3AdamwStepsMatchSingleProcess) {
  const grading::Check check{
      "lab04.zero3_adamw_steps_match_single_process", /*points=*/2,
      /*target=*/
      "ZeRO-3, 3 AdamW steps (lr 1e-3, clip 0.05 active), 2 ranks: parameters within 1e-4 of one process, "
      "loss and gradient norm within 1e-5 relative after every step; root units consistent",
      /*hint=*/
      "README 'ZeRO-3': blocks keep only param_shard between uses, so the update must write it (and "
      "the root units' full_params are refreshed by the all-gather after the update)"};
  grading::run(check, [](grading::Record& record) { record.measured(adamw_steps(3, tiny_config())); });
}

// ---------------------------------------------------------------------------------------------
TEST(Lab04Fsdp, SgdStepsMatchSingleProcess) {
  // SGD moves each parameter by lr x its gradient, so a parameter is off by about lr x (its gradient's
  // rounding error) per step: measured 3.0e-8 after 3 steps at lr 0.5 (lab 03: 3.7e-8). A wrongly scaled
  // gradient (a sum instead of an average, a missing 1/m) moves parameters by ~lr x gradient ~ 1e-3 to
  // 1e-1; weight decay missing or applied to biases and layernorms by lr x wd x |p| = 1e-3 (|p| = 0.02)
  // to 5e-2 (|p| = 1) per step.
  constexpr double kSgdParamAtol = 1e-5;
  const grading::Check check{
      "lab04.sgd_steps_match_single_process", /*points=*/3,
      /*target=*/
      "stages 1, 2, 3: 3 train_steps of plain SGD (lr 0.5, weight decay 0.1, no clipping), 2 ranks x 2 "
      "sequences: parameters within 1e-5 of one process, loss and gradient norm within 1e-5 relative",
      /*hint=*/
      "README 'Reduce-scatter': SGD applies the gradient as it is, so a sum instead of an average "
      "(ReduceOp::Avg) shows here even when AdamW would hide it"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (int st = 1; st <= 3; ++st) {
      StepsSpec spec;
      spec.cfg = tiny_config();
      spec.stage = stage_of(st);
      spec.opt = sgd();
      spec.opt.weight_decay = 0.1f;  // decoupled, on the matrices and embeddings only (ParamInfo::decay)
      spec.lr = 0.5f;
      spec.steps = 3;
      spec.tol.atol = kSgdParamAtol;
      measured += (measured.empty() ? "" : " | ") + expect_steps_match(spec);
    }
    record.measured(measured);
  });
}

TEST(Lab04Fsdp, AccumulationMatchesSingleProcess) {
  constexpr double kSgdParamAtol = 1e-5;  // as lab04.sgd_steps_match_single_process
  const grading::Check check{
      "lab04.accumulation_matches_single_process", /*points=*/3,
      /*target=*/
      "stages 1, 2, 3 with 2 micro-steps per rank (global batch 8): after one train_step the grad shards "
      "equal the one-process gradient of the 8 sequences (1e-5 relative per unit); 3 SGD steps (lr 0.5) "
      "give parameters within 1e-5 of one process",
      /*hint=*/
      "README 'The training step': ZeRO-2/3 reduce-scatter every micro-step and ADD into grad_shard, "
      "ZeRO-1 only after the last; then divide by the number of micro-steps, once"};
  grading::run(check, [](grading::Record& record) {
    std::string measured;
    for (int st = 1; st <= 3; ++st) {
      measured += (measured.empty() ? "" : " | ") + expect_grad_shards_match(tiny_config(), stage_of(st), 2);
      StepsSpec spec;
      spec.cfg = tiny_config();
      spec.stage = stage_of(st);
      spec.opt = sgd();
      spec.lr = 0.5f;
      spec.steps = 3;
      spec.micro_steps = 2;
      spec.tol.atol = kSgdParamAtol;
      measured += "; " + expect_steps_match(spec);
    }
    record.measured(measured);
  });
}

TEST(Lab04Fsdp, Bf16MixedMatchesSingleProcess) {
  // Both sides compute with the same bf16 parameters (gathers copy bf16 bits exactly) and keep fp32
  // gradients and fp32 master weights; only the order of the fp32 gradient sums differs (1e-7
  // relative). That changes a master weight by far less than one bf16 step (2^-8 relative), but now and
  // then a master weight sits next to a rounding boundary and its bf16 copy flips by ONE unit in the
  // last place (ulp) of bf16; the next forward then sees a 2^-8 relative change of that weight, and the
  // differences after k steps stay of order one bf16 ulp. So: every parameter within 2 bf16 ulp of
  // one process (or 1e-6 absolute near 0), the loss within 1e-3 relative (a flipped weight moves it by
  // ~1e-5). A real mistake (reducing in bf16 without a master copy, a master copy not cast back, the
  // gather of fp32 bytes as bf16) is off by many ulp in most elements.
  constexpr ParamTolerance kBf16Tol{/*atol=*/1e-6, /*bf16_ulps=*/2};
  const grading::Check check{
      "lab04.bf16_mixed_matches_single_process", /*points=*/2,
      /*target=*/
      "PrecisionPolicy::bf16_mixed(), stages 1, 2, 3, 3 AdamW steps (lr 1e-3, clip 0.05), 2 ranks: every "
      "parameter within 2 bf16 ulp (or 1e-6) of one process under the same policy, the loss and "
      "gradient norm within 1e-3 relative",
      /*hint=*/
      "README 'The update': with a master copy update the fp32 master shard, then cast it into the bf16 "
      "param_shard; gathers move the param dtype, reduce-scatters fp32"};
  grading::run(check, [&](grading::Record& record) {
    std::string measured;
    for (int st = 1; st <= 3; ++st) {
      StepsSpec spec;
      spec.cfg = tiny_config();
      spec.stage = stage_of(st);
      spec.policy = PrecisionPolicy::bf16_mixed();
      spec.opt = adamw();
      spec.lr = 1e-3f;
      spec.grad_clip = 0.05f;
      spec.steps = 3;
      spec.tol = kBf16Tol;
      spec.loss_rtol = 1e-3;
      measured += (measured.empty() ? "" : " | ") + expect_steps_match(spec);
    }
    record.measured(measured);
  });
}

// ---------------------------------------------------------------------------------------------
TEST(Lab04Fsdp, MemoryMatchesEstimate) {
  const grading::Check check{
      "lab04.memory_matches_estimate", /*points=*/3,
      /*target=*/
      "2 ranks, L=8 C=64 model, AdamW, prefetch 1, stages 1-3, fp32 and bf16: each rank's params, grads "
      "and optimizer_state bytes (allocator, persistent after a step and peak during one) within 5 % of "
      "estimate_memory",
      /*hint=*/
      "README 'Reduce-scatter' and 'ZeRO-3': the full gradient and the gathered copy must be FREED (every "
      "view of them dropped, model.unit_grads/unit_params too), not just zeroed; the peak counts 1 + "
      "prefetch gathered blocks (README 'Prefetch')"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_memory_matches_estimate()); });
}

TEST(Lab04Fsdp, GatheredCopiesFreedAfterUse) {
  const grading::Check check{
      "lab04.gathered_copies_freed_after_use", /*points=*/2,
      /*target=*/
      "ZeRO-3, L=8 model, prefetch 0, 1, 2, 2 ranks: during forward and backward gathered_count() <= 1 + "
      "prefetch after every hook; a block's gathered copy (full_params and the model's view) is gone after "
      "its forward and its backward; peak params bytes <= estimate_memory's peak; after the step no block "
      "is gathered and params bytes are back to the persistent estimate",
      /*hint=*/
      "README 'ZeRO-3' and 'Prefetch': release_params drops BOTH references (a Tensor frees its bytes when "
      "the last view goes); prefetch at most s.prefetch blocks ahead, counting those already in flight"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = memory_config();
    Allocator& alloc = Allocator::get(Device::CPU);
    std::string measured, problem;
    for (int k = 0; k <= 2; ++k) {
      std::unique_ptr<Communicator> comm = fresh_comm();
      const int rank = comm->rank(), n = comm->size();
      const MemStats base = alloc.stats();
      std::unique_ptr<lab04::FSDP> fsdp =
          make_fsdp(cfg, PrecisionPolicy::fp32(), *comm, lab04::ZeroStage::Zero3, adamw(), /*prefetch=*/k);
      const lab04::FsdpState& s = fsdp->state();
      GPT2& model = fsdp->model();
      int max_gathered = 0;
      const auto observe = [&](const char* where, int u, bool after_use) {
        max_gathered = std::max(max_gathered, s.gathered_count());
        if (s.gathered_count() > 1 + k && problem.empty()) {
          problem = "prefetch " + std::to_string(k) + ": " + std::to_string(s.gathered_count()) + " blocks gathered " +
                    where + "(" + std::to_string(u) + "), at most " + std::to_string(1 + k) + " allowed";
        }
        if (after_use && !s.units[u].keep_gathered && problem.empty() &&
            (s.units[u].full_params.defined() || model.unit_params(u).defined())) {
          problem = "prefetch " + std::to_string(k) + ": unit " + std::to_string(u) + " is still gathered after " +
                    where + "(" + std::to_string(u) + ") (" +
                    (s.units[u].full_params.defined() ? "full_params" : "model.unit_params") + " kept)";
        }
      };
      std::vector<HookHandle> observers;  // after FSDP's hooks at each point: what they left gathered
      for (const HookPoint p :
           {HookPoint::BeforeForward, HookPoint::AfterForward, HookPoint::BeforeBackward, HookPoint::AfterBackward})
        observers.push_back(model.add_hook(p, [&, p](const UnitHookArgs& a) {
          observe(hook_point_name(p), a.unit, p == HookPoint::AfterForward || p == HookPoint::AfterBackward);
        }));

      const GlobalBatch g = random_global_batch(kDataSeed, n, 16, cfg.vocab_size);
      const std::vector<lab04::MicroBatch> mb = rank_micro_batches(g, rank, n, 1, 1);
      lab04::train_step(*fsdp, mb, 1e-3f, 1.0f);  // allocates the activations
      alloc.reset_peak();
      lab04::train_step(*fsdp, mb, 1e-3f, 1.0f);
      const MemStats after = alloc.stats();
      const int P = static_cast<int>(MemCategory::Params);
      const int64_t peak = after.peak_bytes[P] - base.current_bytes[P];
      const int64_t now = after.current_bytes[P] - base.current_bytes[P];
      const MemoryEstimate e =
          estimate_memory(cfg, n, 3, PrecisionPolicy::fp32(), OptimizerConfig::Kind::AdamW, k, 0, 0);
      if (problem.empty() && peak > e.peak.params) {
        problem = "prefetch " + std::to_string(k) + ": peak params " + std::to_string(peak) + " bytes > " +
                  std::to_string(e.peak.params) + " (persistent + " + std::to_string(std::min(1 + k, cfg.n_layer)) +
                  " gathered blocks)";
      }
      int still = 0;
      for (int u = 0; u < s.num_units(); ++u) {
        still += !s.units[u].keep_gathered && (s.units[u].full_params.defined() || model.unit_params(u).defined());
      }
      if (problem.empty() && (still > 0 || s.gathered_count() != 0)) {
        problem = "prefetch " + std::to_string(k) + ": " + std::to_string(still) +
                  " blocks still gathered after the step";
      }
      if (problem.empty() && now != e.persistent.params) {
        problem = "prefetch " + std::to_string(k) + ": params bytes after the step " + std::to_string(now) +
                  ", persistent estimate " + std::to_string(e.persistent.params);
      }
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%sprefetch %d: at most %d gathered, peak params %lld B (bound %lld)",
                    measured.empty() ? "" : "; ", k, max_gathered, static_cast<long long>(peak),
                    static_cast<long long>(e.peak.params));
      measured += buf;
      observers.clear();  // they capture locals of this iteration
    }
    record.measured(measured);
    EXPECT_TRUE(grading::all_ranks(problem.empty(), on_rank(problem))) << "gathered copies in ZeRO-3";
  });
}

TEST(Lab04Fsdp, CommunicationVolumePerStage) {
  const grading::Check check{
      "lab04.communication_volume_per_stage", /*points=*/3,
      /*target=*/
      "one train_step of 2 micro-steps, 2 ranks, stages 1-3, fp32 and bf16, from the event log: per unit "
      "ZeRO-1 one reduce_scatter (padded unit, fp32) + one all_gather (one shard, param dtype); ZeRO-2 a "
      "reduce_scatter per micro-step + one all_gather; ZeRO-3 blocks gathered twice per micro-step, root "
      "units once after the update; nothing else but the scalar norm all_reduce; ZeRO-1's bus bytes equal "
      "an fp32 all_reduce of the padded gradient (DDP's)",
      /*hint=*/
      "README 'Reduce-scatter' and 'The update': tag every collective with gather_tag(u) / "
      "reduce_scatter_tag(u); ZeRO-1 communicates once per step, ZeRO-3 blocks are gathered when used"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_communication_volume(tiny_config())); });
}

TEST(Lab04Fsdp, PrefetchIssuesNextGatherEarly) {
  const grading::Check check{
      "lab04.prefetch_issues_next_gather_early", /*points=*/2,
      /*target=*/
      "ZeRO-3, prefetch 1, L=8 model, 2 ranks, one micro-step: the all-gather of block u+1 is issued "
      "(asynchronously) before block u's forward ends (after_forward(u)), and in backward the gather of "
      "block u-1 before block u's backward ends, for every block (event issue_ms vs hook stamps on "
      "Communicator::now_ms)",
      /*hint=*/
      "README 'Prefetch': after waiting for unit u, use_params starts the gathers of the next blocks in "
      "`order` (forward 1..L, backward L..1) with all_gather_async, and does not wait for them"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = memory_config();
    const int L = cfg.n_layer;
    std::unique_ptr<Communicator> comm = fresh_comm();
    const int rank = comm->rank(), n = comm->size();
    std::unique_ptr<lab04::FSDP> fsdp =
        make_fsdp(cfg, PrecisionPolicy::fp32(), *comm, lab04::ZeroStage::Zero3, adamw(), /*prefetch=*/1);
    GPT2& model = fsdp->model();
    std::vector<double> forward_end(L + 2, -1.0), backward_end(L + 2, -1.0);  // ms, Communicator::now_ms
    // Before FSDP's hooks (HookOrder::First): the moment unit u's computation is done.
    HookHandle fwd = model.add_hook(
        HookPoint::AfterForward, [&](const UnitHookArgs& a) { forward_end[a.unit] = Communicator::now_ms(); },
        HookOrder::First);
    HookHandle bwd = model.add_hook(
        HookPoint::AfterBackward, [&](const UnitHookArgs& a) { backward_end[a.unit] = Communicator::now_ms(); },
        HookOrder::First);
    const GlobalBatch g = random_global_batch(kDataSeed, n, 16, cfg.vocab_size);
    comm->clear_events();
    lab04::train_step(*fsdp, rank_micro_batches(g, rank, n, 1, 1), 1e-3f, 1.0f);
    const std::vector<CommEvent> events = comm->events();
    fwd.remove();
    bwd.remove();

    std::map<std::string, std::vector<CommEvent>> gathers;  // tag -> all-gathers in issue order
    for (const CommEvent& e : events) {
      if (e.op == "all_gather") gathers[e.tag].push_back(e);
    }
    std::string problem;
    int early = 0, checked = 0;
    double lead_sum = 0.0;  // ms between a gather's issue and the end of the previous block's compute
    const auto expect_early = [&](int next, int index, int current, const std::vector<double>& end, const char* pass) {
      ++checked;
      const std::vector<CommEvent>& v = gathers[lab04::gather_tag(next)];
      if (static_cast<int>(v.size()) <= index) {
        if (problem.empty()) problem = "block " + std::to_string(next) + " has no " + pass + " all-gather";
        return;
      }
      const CommEvent& e = v[index];
      if (!e.async && problem.empty()) {
        problem = std::string(pass) + ": the gather of block " + std::to_string(next) +
                  " is blocking (all_gather "
                  "instead of all_gather_async)";
      }
      if (e.issue_ms < end[current]) {
        ++early;
        lead_sum += end[current] - e.issue_ms;
      } else if (problem.empty()) {
        char buf[200];
        std::snprintf(buf, sizeof(buf),
                      "%s: the gather of block %d was issued %.3f ms AFTER block %d's %s had ended "
                      "(not prefetched)",
                      pass, next, e.issue_ms - end[current], current, pass);
        problem = buf;
      }
    };
    for (int u = 1; u < L; ++u) expect_early(u + 1, 0, u, forward_end, "forward");
    for (int u = L; u > 1; --u) expect_early(u - 1, 1, u, backward_end, "backward");
    record.measured("%d of %d next-block gathers issued before the current block finished (mean lead %.3f ms)%s%s",
                    early, checked, early ? lead_sum / early : 0.0, problem.empty() ? "" : "; ", problem.c_str());
    EXPECT_TRUE(grading::all_ranks(problem.empty(), on_rank(problem))) << "prefetch, from the event log";
  });
}
