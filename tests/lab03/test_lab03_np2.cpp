// test_lab03_np2.cpp — lab 03's graded checks on 2 ranks (mpiexec -n 2; sl_add_graded_test NP 2).
// Each check compares what data parallelism must get right with ONE process training on the whole
// global batch, computed here on every rank (lab03_support.h): first the reduced gradients per tensor,
// before clipping and the optimizer (which can hide a wrong gradient), then parameters after steps of
// plain SGD (which cannot) and of AdamW; plus what the event log of the communicator says: the volume
// of the all-reduces and, for overlap, when each bucket was issued and completed.
// Every rank evaluates every assertion; grading::all_ranks combines them (grading.h), so a failure on
// one rank never leaves the other waiting. Lesson: labs/03_ddp/README.md ("What the tests check").
#include <gtest/gtest.h>

#include <cstdint>    // defines: int64_t
#include <algorithm>  // defines: std::min, std::max
#include <cmath>      // defines: std::fabs
#include <map>
#include <string>
#include <vector>

#include "ddp.h"                   // defines: lab03::* (the track under test)
#include "grading.h"               // defines: grading::Check, grading::run, grading::all_ranks
#include "lab03_support.h"         // defines: world, fresh_comm, reference helpers, comparisons
#include "scale_factor.h"          // defines: test::describe_scale, describe_ratio, data_parallel_factors
#include "scalelab/comm/comm.h"    // defines: Communicator, CommEvent, LinkModel
#include "scalelab/core/error.h"   // defines: scalelab::Error
#include "scalelab/model/optim.h"  // defines: Optimizer, OptimizerConfig

namespace {

using namespace scalelab;
using namespace scalelab::lab03_test;
namespace grading = scalelab::grading;

const lab03::SyncMode kModes[] = {lab03::SyncMode::Naive, lab03::SyncMode::Bucketed, lab03::SyncMode::Overlap};

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(Lab03Ddp, BroadcastMakesReplicasIdentical) {
  const grading::Check check{"lab03.broadcast_makes_replicas_identical", /*points=*/1,
                             /*target=*/
                             "ranks initialised with different seeds hold rank 0's parameters bit for bit after "
                             "broadcast_parameters; one broadcast per unit, root 0",
                             /*hint=*/"README 'Start identical': every unit's parameter buffer, from root 0"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = tiny_config();
    std::unique_ptr<Communicator> comm = fresh_comm();
    GPT2 model(cfg, PrecisionPolicy::fp32(), Device::CPU, kModelSeed + comm->rank());  // different on purpose
    lab03::broadcast_parameters(model, *comm);
    std::unique_ptr<GPT2> rank0_init = make_model(cfg);  // what rank 0 started with (seed kModelSeed + 0)
    const Comparison c = compare_parameters(model, *rank0_init, /*atol=*/0.0);
    int broadcasts = 0;
    bool all_root0 = true;
    for (const CommEvent& e : comm->events()) {
      if (e.op != "broadcast") continue;
      ++broadcasts;
      all_root0 = all_root0 && e.peer == 0;
    }
    record.measured("%d broadcasts (%d units); parameters %s", broadcasts, model.num_units(),
                    c.ok ? "equal rank 0's initial ones bit for bit" : c.failure.c_str());
    EXPECT_TRUE(grading::all_ranks(c.ok, c.failure)) << "parameters after broadcast_parameters";
    EXPECT_TRUE(grading::all_ranks(broadcasts == model.num_units() && all_root0,
                                   on_rank(std::to_string(broadcasts) + " broadcasts" +
                                           (all_root0 ? "" : ", not all from root 0"))))
        << "one broadcast per unit, root 0";
  });
}

TEST(Lab03Ddp, NaiveGradsEqualSingleProcess) {
  const grading::Check check{
      "lab03.naive_grads_equal_single_process", /*points=*/2,
      /*target=*/
      "naive mode, 2 ranks x 2 sequences: every reduced gradient tensor equals the one-process "
      "gradient of the 4 sequences within 1e-5 of its largest entry, before clipping and the "
      "optimizer; identical on every rank",
      /*hint=*/
      "README 'Naive data parallel': each rank's gradient is the mean over ITS sequences; the global "
      "mean is the average (not the sum) of the ranks' gradients"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_reduced_gradients_match(lab03::SyncMode::Naive));
  });
}

TEST(Lab03Ddp, BucketedGradsEqualSingleProcess) {
  const grading::Check check{
      "lab03.bucketed_grads_equal_single_process", /*points=*/3,
      /*target=*/
      "bucketed mode (0.0038 MiB buckets: 7 on the tiny model), 2 ranks: every reduced gradient "
      "tensor equals the one-process gradient within 1e-5 of its largest entry; identical on every rank",
      /*hint=*/"README 'Buckets': pack, all-reduce the flat buffer (Avg), unpack, for EVERY bucket"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_reduced_gradients_match(lab03::SyncMode::Bucketed));
  });
}

TEST(Lab03Ddp, OverlapGradsEqualSingleProcess) {
  const grading::Check check{
      "lab03.overlap_grads_equal_single_process", /*points=*/3,
      /*target=*/
      "overlap mode (buckets launched from the after_backward hook), 2 ranks: every reduced gradient "
      "tensor equals the one-process gradient within 1e-5 of its largest entry; identical on every rank",
      /*hint=*/
      "README 'Overlap': a bucket may go only when ALL its gradients are final (ready_unit; wte is "
      "final only at after_backward(0)); wait for every bucket and unpack it before the optimizer"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_reduced_gradients_match(lab03::SyncMode::Overlap));
  });
}

TEST(Lab03Ddp, OverlapLaunchesDuringBackward) {
  // A simulated link (comm.h LinkModel) makes every all-reduce last at least kHeldMs after it starts,
  // far longer than the tiny model's whole backward (about 1 ms): so a bucket that has completed by
  // the time backward ends was waited for inside backward. Only orders of events are asserted, never
  // a speed, and with 2 ranks (not more than the cores: docs/design.md).
  constexpr double kHeldMs = 200.0;
  const grading::Check check{
      "lab03.overlap_launches_during_backward", /*points=*/3,
      /*target=*/
      "event log, 2 ranks, every all-reduce held >= 200 ms by a simulated link: each bucket is "
      "all-reduced once, asynchronously, issued after its ready_unit's backward and before the "
      "backward of the unit below it starts, still in flight when backward ends, complete when "
      "finish() returns",
      /*hint=*/
      "README 'Overlap': launch from the after_backward hook with all_reduce_async, keep the handle, and "
      "wait only in wait_for_buckets (a blocking all_reduce, or wait() in the hook, serialises them)"};
  grading::run(check, [&](grading::Record& record) {
    const GPTConfig cfg = tiny_config();
    std::unique_ptr<Communicator> comm = fresh_comm();
    const int rank = comm->rank(), n = comm->size();
    LinkModel held;
    held.name = "test: 200 ms per call";
    held.base_s = kHeldMs / 1e3;
    held.bandwidth_bytes_per_s = 1e15;  // the size does not matter here
    comm->set_link_model(held);
    const GlobalBatch g = random_global_batch(kDataSeed, kMicroBatch * n, cfg.max_seq_len, cfg.vocab_size);

    std::unique_ptr<GPT2> model = make_model(cfg);
    lab03::GradSync sync(*model, *comm, lab03::SyncMode::Overlap, kTinyBucketMb);
    // Stamps on the communicator's clock (Communicator::now_ms), around the track's hook.
    const int U = model->num_units();
    // hook_done[u]: after_backward(u) returned, so backward goes on with the next unit (for u = 1 that is
    // the embeddings, which have no before_backward of their own: unit 0's fires first, gpt2.h).
    std::vector<double> backward_start(U, -1.0), ready(U, -1.0), hook_done(U, -1.0);
    const HookHandle start = model->add_hook(HookPoint::BeforeBackward, [&](const UnitHookArgs& a) {
      backward_start[a.unit] = Communicator::now_ms();
    });
    // Around GradSync's hook (which calls launch_ready_buckets): one before it, one after.
    const HookHandle before = model->add_hook(
        HookPoint::AfterBackward,
        [&](const UnitHookArgs& a) {
          ready[a.unit] = Communicator::now_ms();  // unit's gradients are final from here on
        },
        HookOrder::First);
    const HookHandle after = model->add_hook(HookPoint::AfterBackward, [&](const UnitHookArgs& a) {
      hook_done[a.unit] = Communicator::now_ms();
    });
    const lab03::MicroBatch mb = rank_micro_batches(g, rank, n, 1, kMicroBatch)[0];
    model->zero_grad();
    model->forward(mb.inputs, &mb.targets);
    model->backward();
    const double backward_end = Communicator::now_ms();
    sync.finish();
    const double finish_end = Communicator::now_ms();
    const std::vector<CommEvent> events = comm->events();

    std::map<std::string, std::vector<CommEvent>> by_tag;
    for (const CommEvent& e : events) {
      if (e.op == "all_reduce") by_tag[e.tag].push_back(e);
    }
    std::string problem;  // the first violation on this rank
    const auto fail = [&](const std::string& what) {
      if (problem.empty()) problem = what;
    };
    double first_end = 1e300, last_end = 0.0;  // completions of the buckets, for the record
    const std::vector<lab03::Bucket>& buckets = sync.buckets();
    for (size_t k = 0; k < buckets.size(); ++k) {
      const std::string tag = lab03::bucket_tag(k);
      const int r = buckets[k].ready_unit;
      const auto it = by_tag.find(tag);
      if (it == by_tag.end() || it->second.size() != 1) {
        fail(tag + ": " + std::to_string(it == by_tag.end() ? 0 : it->second.size()) +
             " all-reduces with this tag, expected exactly 1");
        continue;
      }
      const CommEvent& e = it->second[0];
      if (!e.async) fail(tag + ": a blocking all_reduce (it waits at once); use all_reduce_async");
      if (e.issue_ms < ready[r]) {
        fail(tag + ": issued before after_backward(" + std::to_string(r) + "), while its gradients were not final");
      }
      if (r > 0) {
        const double next_start = hook_done[r];  // the backward of unit r-1 starts right after this
        if (!(e.issue_ms < next_start)) {
          fail(tag + ": issued after the backward of unit " + std::to_string(r - 1) + " had started (ready at unit " +
               std::to_string(r) + "): launch it from after_backward(" + std::to_string(r) + ")");
        }
      }
      if (!(e.end_ms > backward_end)) {
        fail(tag + ": completed before backward ended (held " + std::to_string(kHeldMs) +
             " ms by the link): it was waited for inside backward");
      }
      if (!(e.end_ms > 0 && e.end_ms <= finish_end)) fail(tag + ": not complete when finish() returned");
      first_end = std::min(first_end, e.end_ms);
      last_end = std::max(last_end, e.end_ms);
    }
    if (by_tag.size() != buckets.size()) {
      fail(std::to_string(by_tag.size()) + " distinct all-reduce tags for " + std::to_string(buckets.size()) +
           " buckets (tag each with bucket_tag(k))");
    }
    const double backward_ms = backward_end - backward_start[U - 1];
    if (problem.empty()) {
      record.measured(
          "%zu buckets, each all-reduced once, asynchronously, issued from after_backward(ready_unit); "
          "backward took %.1f ms; the buckets completed %.0f to %.0f ms after it ended",
          buckets.size(), backward_ms, first_end - backward_end, last_end - backward_end);
    } else {
      record.measured("%zu buckets; backward took %.1f ms; %s", buckets.size(), backward_ms, problem.c_str());
    }
    EXPECT_TRUE(grading::all_ranks(problem.empty(), problem)) << "the overlap schedule, from the event log";
  });
}

TEST(Lab03Ddp, AccumulationGradsEqualSingleProcess) {
  const grading::Check check{
      "lab03.accumulation_grads_equal_single_process", /*points=*/3,
      /*target=*/
      "train_step with 2 micro-steps per rank on 2 ranks (global batch 8), SGD and grad_clip 0 (so the "
      "gradient buffers hold what the optimizer received), naive, bucketed and overlap: every "
      "gradient tensor equals the one-process gradient of the 8 sequences within 1e-5 of its largest "
      "entry; identical on every rank",
      /*hint=*/
      "README 'Gradient accumulation': zero once, backward adds; only the last micro-step synchronises "
      "(set_require_sync); divide by the number of micro-steps"};
  grading::run(check, [](grading::Record& record) {
    constexpr int kMicroSteps = 2;
    const GPTConfig cfg = tiny_config();
    std::string measured;
    bool ok = true, identical = true;
    std::string failure, differ_all;
    for (const lab03::SyncMode mode : kModes) {
      std::unique_ptr<Communicator> comm = fresh_comm();
      const int rank = comm->rank(), n = comm->size();
      const GlobalBatch g =
          random_global_batch(kDataSeed, kMicroBatch * n * kMicroSteps, cfg.max_seq_len, cfg.vocab_size);
      std::unique_ptr<GPT2> model = make_model(cfg);
      OptimizerConfig sgd;
      sgd.kind = OptimizerConfig::Kind::SGD;
      sgd.weight_decay = 0.0f;
      Optimizer optimizer(*model, sgd);
      lab03::GradSync sync(*model, *comm, mode, kTinyBucketMb);
      lab03::train_step(*model, optimizer, sync, rank_micro_batches(g, rank, n, kMicroSteps, kMicroBatch), 0.1f,
                        /*grad_clip=*/0.0f);

      std::unique_ptr<GPT2> expected = make_model(cfg);
      one_process_gradients(*expected, g);
      const Comparison c = compare_gradients(*model, *expected, kGradRtol);
      const std::string differ = ranks_differing_from_rank0(fingerprint(*model, /*grads=*/true));
      const std::string scaled =
          test::describe_scale(c.scale, test::data_parallel_factors(n, kMicroSteps), "the one-process gradient");
      char buf[320];
      std::snprintf(buf, sizeof(buf), "%s %.2e%s", lab03::sync_mode_name(mode), c.worst,
                    scaled.empty() ? "" : (": every gradient is " + scaled).c_str());
      measured += (measured.empty() ? "" : ", ") + std::string(buf);
      if (!c.ok && ok)
        failure = std::string(lab03::sync_mode_name(mode)) + " mode: " + gradient_failure(c, n, kMicroSteps);
      ok = ok && c.ok;
      if (!differ.empty() && identical) differ_all = std::string(lab03::sync_mode_name(mode)) + " mode: " + differ;
      identical = identical && differ.empty();
    }
    record.measured("max |accumulated - one-process| / max |one-process| per mode: %s", measured.c_str());
    EXPECT_TRUE(grading::all_ranks(ok, failure)) << "accumulated, reduced gradients";
    EXPECT_TRUE(grading::all_ranks(identical, differ_all)) << "ranks must hold identical gradients";
  });
}

TEST(Lab03Ddp, CommunicatesOncePerStep) {
  const grading::Check check{
      "lab03.communicates_once_per_step", /*points=*/2,
      /*target=*/
      "one train_step of 2 micro-steps, each mode: the all-reduced elements sum to the gradient size "
      "(7,872 on the tiny model) exactly once; one all-reduce per tensor (naive, tagged with its name) "
      "or per bucket (tagged bucket_tag(k)); nothing else is sent",
      /*hint=*/
      "README 'Gradient accumulation': micro-steps before the last must not communicate "
      "(set_require_sync(false) is PyTorch's no_sync); README 'Buckets' for the tags"};
  grading::run(check, [](grading::Record& record) {
    constexpr int kMicroSteps = 2;
    const GPTConfig cfg = tiny_config();
    std::string measured, problem;
    for (const lab03::SyncMode mode : kModes) {
      std::unique_ptr<Communicator> comm = fresh_comm();
      const int rank = comm->rank(), n = comm->size();
      const GlobalBatch g =
          random_global_batch(kDataSeed, kMicroBatch * n * kMicroSteps, cfg.max_seq_len, cfg.vocab_size);
      std::unique_ptr<GPT2> model = make_model(cfg);
      Optimizer optimizer(*model, OptimizerConfig{});
      lab03::GradSync sync(*model, *comm, mode, kTinyBucketMb);
      comm->clear_events();
      lab03::train_step(*model, optimizer, sync, rank_micro_batches(g, rank, n, kMicroSteps, kMicroBatch), 1e-3f, 1.0f);

      std::map<std::string, int> tags_expected;  // tag -> elements it must carry
      if (mode == lab03::SyncMode::Naive) {
        for (const ParamInfo& p : model->param_table()) tags_expected[p.name] = static_cast<int>(p.numel);
      } else {
        for (size_t k = 0; k < sync.buckets().size(); ++k) {
          tags_expected[lab03::bucket_tag(k)] = static_cast<int>(sync.buckets()[k].numel);
        }
      }
      int64_t elements = 0;
      int calls = 0;
      std::map<std::string, int> tags_seen;
      const std::string name = lab03::sync_mode_name(mode);
      for (const CommEvent& e : comm->events()) {
        if (e.op != "all_reduce") {
          if (problem.empty()) problem = name + ": a " + e.op + " (tag '" + e.tag + "') during the step";
          continue;
        }
        elements += e.count;
        ++calls;
        ++tags_seen[e.tag];
        const auto it = tags_expected.find(e.tag);
        if (problem.empty() && (it == tags_expected.end() || it->second != e.count)) {
          problem = name + ": an all-reduce of " + std::to_string(e.count) + " elements tagged '" + e.tag + "'" +
                    (it == tags_expected.end() ? " (no tensor or bucket has this tag)"
                                               : " (expected " + std::to_string(it->second) + ")");
        }
      }
      for (const auto& [tag, count] : tags_seen) {
        if (problem.empty() && count != 1)
          problem = name + ": '" + tag + "' all-reduced " + std::to_string(count) + " times";
      }
      if (problem.empty() && elements != model->num_params()) {
        problem = name + ": " + std::to_string(elements) + " elements all-reduced per step, the gradient has " +
                  std::to_string(model->num_params());
      }
      if (problem.empty() && calls != static_cast<int>(tags_expected.size())) {
        problem = name + ": " + std::to_string(calls) + " all-reduces, expected " +
                  std::to_string(tags_expected.size());
      }
      measured += (measured.empty() ? "" : "; ") + name + " " + std::to_string(calls) + " all-reduces, " +
                  std::to_string(elements) + " elements";
    }
    record.measured(measured);
    EXPECT_TRUE(grading::all_ranks(problem.empty(), on_rank(problem))) << "communication volume per optimizer step";
  });
}

TEST(Lab03Ddp, SgdStepsMatchSingleProcess) {
  // SGD moves each parameter by lr x its gradient, so a parameter is off by about lr x (its gradient's
  // rounding error) per step. Measured after 3 steps at lr 0.5: 3.7e-8 (2 ranks), 6.0e-8 (4 ranks), so
  // 1e-5 leaves a factor > 100. A wrongly scaled gradient moves parameters by ~lr x gradient ~ 1e-3 to 1e-1.
  constexpr double kParamAtol = 1e-5;
  const grading::Check check{
      "lab03.sgd_steps_match_single_process", /*points=*/3,
      /*target=*/
      "3 train_steps of plain SGD (lr 0.5, no weight decay, no clipping), 2 ranks x 2 micro-steps, then x 1 "
      "(the one micro-step is also the last: it synchronises), in each mode: gradients (1e-5 relative) and "
      "parameters (1e-5 absolute) match one process training on the global batch; parameters identical on "
      "every rank after every step",
      /*hint=*/
      "README 'Gradient accumulation': SGD applies the gradient as it is, so a missing average or 1/m "
      "shows here even when AdamW would hide it"};
  grading::run(check, [](grading::Record& record) {
    OptimizerConfig sgd;
    sgd.kind = OptimizerConfig::Kind::SGD;
    sgd.weight_decay = 0.0f;
    std::string measured;
    for (const int micro_steps : {2, 1}) {
      for (const lab03::SyncMode mode : kModes) {
        measured +=
            (measured.empty() ? "m " : " | m ") + std::to_string(micro_steps) + ", " +
            expect_steps_match(mode, sgd, /*lr=*/0.5f, /*grad_clip=*/0.0f, /*steps=*/3, micro_steps, kParamAtol);
      }
    }
    record.measured(measured);
  });
}

TEST(Lab03Ddp, AdamwStepsMatchSingleProcess) {
  // AdamW's first steps move a parameter by about lr x sign(gradient), whatever the gradient's scale (so
  // this check cannot see a missing average: the SGD check does). Where a gradient entry is near 0, its
  // rounding error can change the update by a fraction of lr. Measured after 3 steps: 1.0e-6; a gradient
  // of the wrong direction (a bucket left out, one rank's gradient) moves parameters by ~lr = 1e-3.
  constexpr double kParamAtol = 1e-4;
  const grading::Check check{
      "lab03.adamw_steps_match_single_process", /*points=*/2,
      /*target=*/
      "3 train_steps of AdamW (lr 1e-3, wd 0.1) with clipping at 0.05 (active), overlap mode, 2 ranks x "
      "2 micro-steps: parameters within 1e-4 of one process training on the global batch; identical on "
      "every rank after every step",
      /*hint=*/
      "README 'Gradient accumulation': clip AFTER the gradients are synchronised and divided by m, so "
      "every rank clips the same global gradient"};
  grading::run(check, [](grading::Record& record) {
    OptimizerConfig adamw;  // betas 0.9/0.95, eps 1e-8, weight decay 0.1
    record.measured(expect_steps_match(lab03::SyncMode::Overlap, adamw, /*lr=*/1e-3f, /*grad_clip=*/0.05f,
                                       /*steps=*/3, /*micro_steps=*/2, kParamAtol));
  });
}

TEST(Lab03Ddp, StepReportsLossAndNorm) {
  // What train_step returns is what the driver logs (loss, grad_norm per step). The loss is the mean of
  // this rank's m micro-batch losses, each computed here by a forward of the same parameters on the same
  // tokens: equal up to the float rounding of the mean (kLossRtol). The norm is the global norm of the
  // synchronised, 1/m-scaled gradient before clipping, the one-process gradient's norm up to the
  // gradients' own rounding (kGradRtol each; the norm is a sum of squares of them). The mistakes this
  // sees are of order 1: a sum of m losses is m times the mean; a norm after clipping is grad_clip; a
  // norm of the local or the unscaled gradient is off by tens of percent or m times.
  constexpr double kLossRtol = 1e-6;
  constexpr double kNormRtol = 1e-4;
  constexpr int kMicroSteps = 2;
  constexpr float kGradClip = 0.05f;  // active: the tiny model's gradient norm is above it
  const grading::Check check{
      "lab03.step_reports_loss_and_norm", /*points=*/1,
      /*target=*/
      "one train_step of 2 micro-steps on 2 ranks, each mode, clipping at 0.05 (active): loss = the mean "
      "of this rank's 2 micro-batch losses (1e-6 relative); grad_norm = the norm of the one-process "
      "gradient of the global batch before clipping (1e-4 relative)",
      /*hint=*/
      "README 'Gradient accumulation': the step's loss is the MEAN over its micro-batches; the norm is "
      "measured by clip_grad_norm on the synchronised gradient, after the 1/m and before clipping"};
  grading::run(check, [&](grading::Record& record) {
    const GPTConfig cfg = tiny_config();
    std::string measured, problem;
    for (const lab03::SyncMode mode : kModes) {
      std::unique_ptr<Communicator> comm = fresh_comm();
      const int rank = comm->rank(), n = comm->size();
      const GlobalBatch g =
          random_global_batch(kDataSeed, kMicroBatch * n * kMicroSteps, cfg.max_seq_len, cfg.vocab_size);
      const std::vector<lab03::MicroBatch> mbs = rank_micro_batches(g, rank, n, kMicroSteps, kMicroBatch);
      std::unique_ptr<GPT2> model = make_model(cfg);
      OptimizerConfig sgd;
      sgd.kind = OptimizerConfig::Kind::SGD;
      sgd.weight_decay = 0.0f;
      Optimizer optimizer(*model, sgd);
      lab03::GradSync sync(*model, *comm, mode, kTinyBucketMb);
      const lab03::StepResult got = lab03::train_step(*model, optimizer, sync, mbs, 0.1f, kGradClip);

      std::unique_ptr<GPT2> probe = make_model(cfg);  // the same starting parameters: forward only
      double loss_sum = 0.0;
      for (const lab03::MicroBatch& mb : mbs) loss_sum += probe->forward(mb.inputs, &mb.targets);
      const double want_loss = loss_sum / kMicroSteps;
      std::unique_ptr<GPT2> expected = make_model(cfg);
      Optimizer expected_optimizer(*expected, sgd);
      const double want_norm = one_process_step(*expected, expected_optimizer, g, 0.1f, kGradClip);

      const std::string name = lab03::sync_mode_name(mode);
      const std::vector<test::KnownFactor> factors = test::data_parallel_factors(n, kMicroSteps);
      char buf[480];
      if (problem.empty() && !(std::fabs(got.loss - want_loss) <= kLossRtol * std::fabs(want_loss))) {
        const std::string ratio = test::describe_ratio(got.loss, want_loss, factors);
        std::snprintf(buf, sizeof(buf),
                      "%s mode: loss %.7g, expected %.7g (the mean of this rank's %d micro-batch "
                      "losses)%s",
                      name.c_str(), got.loss, want_loss, kMicroSteps, ratio.empty() ? "" : ("; " + ratio).c_str());
        problem = buf;
      }
      if (problem.empty() && !(std::fabs(got.grad_norm - want_norm) <= kNormRtol * want_norm)) {
        const std::string ratio = test::describe_ratio(got.grad_norm, want_norm, factors);
        std::snprintf(buf, sizeof(buf),
                      "%s mode: grad_norm %.7g, expected %.7g (the global gradient's norm before "
                      "clipping at %g)%s",
                      name.c_str(), got.grad_norm, want_norm, kGradClip, ratio.empty() ? "" : ("; " + ratio).c_str());
        problem = buf;
      }
      std::snprintf(buf, sizeof(buf), "%s loss %.5f (want %.5f) grad_norm %.5f (want %.5f)", name.c_str(), got.loss,
                    want_loss, got.grad_norm, want_norm);
      measured += (measured.empty() ? "" : "; ") + std::string(buf);
    }
    record.measured(measured);
    EXPECT_TRUE(grading::all_ranks(problem.empty(), on_rank(problem))) << "what train_step returns";
  });
}
