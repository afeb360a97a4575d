// test_lab06_np2.cpp — lab 06's graded checks on 2 ranks (mpiexec -n 2; sl_add_graded_test NP 2): a pipeline
// of two stages, compared with ONE process running the whole model on the same global batch (computed on
// every rank; lab06_support.h): the partition and the layouts alone, each schedule's order against its
// definition, every gradient of every stage and chunk, steps of SGD and of AdamW, the tied embedding's two
// copies, the activation memory the allocator counts against what each schedule holds, and the bubble
// against its formula. Every rank evaluates every assertion and grading::all_ranks combines them
// (grading.h), so a failure on one rank never leaves the other waiting.
// Lesson: labs/06_pipeline_parallel/README.md ("What the tests check").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>  // defines: std::memcmp
#include <string>

#include "grading.h"        // defines: grading::Check, grading::run, grading::all_ranks
#include "lab06_support.h"  // defines: the shared check bodies, make_pipeline, expected_schedule

namespace {

using namespace scalelab;
using namespace scalelab::lab06_test;
namespace grading = scalelab::grading;

// Every stage's schedule from the learner's function against the definition, for p in {1, 2, 4}, m 1..8
// (interleaved: m = p, 2p, ... up to 8, v in {2, 4} where the layers allow).
std::string schedules_against_definition(ScheduleKind kind) {
  std::string bad;
  int tested = 0;
  for (int p : {1, 2, 4}) {
    for (int m = 1; m <= 8; ++m) {
      for (int v : {1, 2, 4}) {
        if ((kind == ScheduleKind::Interleaved) != (v > 1) || (v > 1 && (p < 2 || m % p != 0))) continue;
        for (int s = 0; s < p && bad.empty(); ++s) {
          const std::vector<lab06::Action> got = kind == ScheduleKind::GPipe      ? lab06::gpipe_schedule(p, m, s)
                                                 : kind == ScheduleKind::OneFOneB ? lab06::one_f_one_b_schedule(p, m, s)
                                                 : kind == ScheduleKind::ZbH1     ? lab06::zb_h1_schedule(p, m, s)
                                                                              : lab06::interleaved_schedule(p, m, v, s);
          const std::vector<lab06::Action> want = expected_schedule(kind, p, m, v, s);
          ++tested;
          if (!(got == want))
            bad = "p " + std::to_string(p) + " m " + std::to_string(m) + (v > 1 ? " v " + std::to_string(v) : "") +
                  " stage " + std::to_string(s) + ": \"" + lab06::to_string(got) + "\", the definition: \"" +
                  lab06::to_string(want) + "\"";
        }
      }
    }
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), bad));
  return std::to_string(tested) + " (p, m, v, stage) schedules equal the definition";
}

// One step (lr 0: the gradients alone) of ZB-H1 and of 1F1B on the same micro-batches: every gradient of
// this stage equal bit for bit (both add each micro-batch's parts in micro-batch order), and ZB-H1's order.
std::string zb_h1_gradients_against_1f1b(const std::vector<int>& ms) {
  const GPTConfig cfg = pp_config();
  std::string bad, measured;
  for (int m : ms) {
    const GlobalBatch g = random_global_batch(7, m * kMicroBatch, kT, cfg.vocab_size);
    Pipeline zb = make_pipeline(cfg, ScheduleKind::ZbH1, m, 1), ref = make_pipeline(cfg, ScheduleKind::OneFOneB, m, 1);
    zb.step(micro_batches_of(g, m), 0.0f, 0.0f);
    ref.step(micro_batches_of(g, m), 0.0f, 0.0f);
    const int p = zb.layout.p, s = zb.layout.stage;
    int64_t compared = 0;
    for (int u = 0; u < zb.models[0]->num_units() && bad.empty(); ++u) {
      const Tensor& a = zb.models[0]->unit_grads(u);
      const Tensor& b = ref.models[0]->unit_grads(u);
      if (a.numel() == 0) continue;
      for (int64_t i = 0; i < a.numel() && bad.empty(); ++i)
        if (std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0)
          bad = "m " + std::to_string(m) + ", stage " + std::to_string(s) + ", unit " + std::to_string(u) + " [" +
                std::to_string(i) + "]: " + std::to_string(a.data<float>()[i]) + " vs 1F1B's " +
                std::to_string(b.data<float>()[i]);
      compared += a.numel();
    }
    const std::vector<Action> want = expected_schedule(ScheduleKind::ZbH1, p, m, 1, s);
    if (bad.empty() && !(zb.stage->ran() == want))
      bad = "m " + std::to_string(m) + ", stage " + std::to_string(s) + " ran \"" + lab06::to_string(zb.stage->ran()) +
            "\", the schedule is \"" + lab06::to_string(want) + "\"";
    measured += (measured.empty() ? "" : ", ") + ("m " + std::to_string(m)) + ": " + std::to_string(compared) +
                " gradient entries on stage " + std::to_string(s);
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank(bad)));
  return measured + " equal 1F1B's bit for bit";
}

}  // namespace

TEST(Lab06Pp, PartitionIsBalanced) {
  const grading::Check check{"lab06.partition_is_balanced", 2,
                             "for L in 1..12, p and v with p v <= L: the virtual stages' layers are contiguous, in "
                             "order, cover every layer once, L / (p v) each plus one for the first L % (p v); only "
                             "virtual stage 0 has the embedding and only the last the head",
                             "README 'The partition': chunk c of stage s is virtual stage c p + s"};
  grading::run(check, [](grading::Record& record) {
    std::string bad;
    int tested = 0;
    for (int L = 1; L <= 12 && bad.empty(); ++L) {
      GPTConfig cfg = pp_config();
      cfg.n_layer = L;
      for (int p = 1; p <= L && bad.empty(); ++p) {
        for (int v = 1; p * v <= L && bad.empty(); ++v) {
          const int n = p * v;
          int next = 0;  // the first layer the next virtual stage must start at
          for (int vs = 0; vs < n && bad.empty(); ++vs) {
            lab06::PipelineLayout l;
            l.p = p;
            l.v = v;
            l.stage = vs % p;
            l.schedule = v > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
            const ModelShard sh = lab06::chunk_shard(cfg, l, vs / p);
            const int size = L / n + (vs < L % n ? 1 : 0);
            ++tested;
            if (sh.first_layer != next || sh.last(cfg) != next + size - 1 || sh.has_embedding != (vs == 0) ||
                sh.has_head != (vs == n - 1) || sh.tp_size != 1)
              bad = "L " + std::to_string(L) + ", p " + std::to_string(p) + ", v " + std::to_string(v) +
                    ": virtual stage " + std::to_string(vs) + " got \"" + sh.str() + "\", expected layers " +
                    std::to_string(next) + "-" + std::to_string(next + size - 1) +
                    (vs == 0 ? " with the embedding" : "") + (vs == n - 1 ? " with the head" : "");
            next += size;
          }
        }
      }
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), bad));
    record.measured("%d virtual stages of %s", tested, bad.empty() ? "every partition right" : "the partitions");
  });
}

TEST(Lab06Pp, BadLayoutsFailOnEveryRank) {
  const grading::Check check{"lab06.bad_layouts_fail_on_every_rank", 2,
                             "make_layout accepts interleaved m = 2p v = 2 and refuses, on every rank and before any "
                             "message: more stages than layers, interleaved with m not a multiple of p or m < p, v not "
                             "dividing the layers per stage, chunks without the interleaved schedule, m = 0",
                             "README 'The partition': what each schedule needs of p, m and v"};
  grading::run(check, [](grading::Record& record) { record.measured(expect_bad_layouts_refused()); });
}

TEST(Lab06Pp, GpipeScheduleOrder) {
  const grading::Check check{"lab06.gpipe_schedule_order", 2,
                             "gpipe_schedule for p 1, 2, 4, m 1..8, every stage: F0 .. F(m-1) then B0 .. B(m-1)",
                             "README 'GPipe'"};
  grading::run(check,
               [](grading::Record& record) { record.measured(schedules_against_definition(ScheduleKind::GPipe)); });
}

TEST(Lab06Pp, OneForwardOneBackwardScheduleOrder) {
  const grading::Check check{"lab06.one_forward_one_backward_schedule_order", 2,
                             "one_f_one_b_schedule for p 1, 2, 4, m 1..8, every stage: min(p - s - 1, m) warm-up "
                             "forwards, then F/B pairs, then the cool-down backwards (Narayanan et al. 2021, Fig. 3)",
                             "README '1F1B': when can the first backward reach stage s?"};
  grading::run(check,
               [](grading::Record& record) { record.measured(schedules_against_definition(ScheduleKind::OneFOneB)); });
}

TEST(Lab06Pp, InterleavedScheduleOrder) {
  const grading::Check check{"lab06.interleaved_schedule_order", 2,
                             "interleaved_schedule for p 2, 4, m = p .. 8 in steps of p, v 2 and 4, every stage: the "
                             "definition of README 'Interleaved 1F1B' (e.g. p 2, m 4, v 2, stage 0: F0 F1 F0.1 F1.1 F2 "
                             "B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3)",
                             "README 'Interleaved 1F1B': which (micro-batch, chunk) is a rank's k-th forward"};
  grading::run(check, [](grading::Record& record) {
    record.measured(schedules_against_definition(ScheduleKind::Interleaved));
  });
}

TEST(Lab06Pp, ZbH1ScheduleOrder) {
  const grading::Check check{"lab06.zb_h1_schedule_order", 2,
                             "zb_h1_schedule for p 1, 2, 4, m 1..8, every stage: 1F1B's order with each B as I, W of "
                             "micro-batch k - s right after I of k, the last s W's at the end (Qi et al. 2024, Fig. 3; "
                             "p 2 m 4 stage 1: F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3)",
                             "README 'Zero bubble': which W can wait, and for how long?"};
  grading::run(check,
               [](grading::Record& record) { record.measured(schedules_against_definition(ScheduleKind::ZbH1)); });
}

TEST(Lab06Pp, ZbH1GradientsEqualOneForwardOneBackward) {
  const grading::Check check{"lab06.zb_h1_gradients_equal_one_forward_one_backward", 3,
                             "one step of ZB-H1 and of 1F1B, m 2 and 4: every gradient of every stage equal bit for "
                             "bit, and each stage ran the ZB-H1 order",
                             "README 'Zero bubble': W adds what the whole backward adds, in the same order"};
  grading::run(check, [](grading::Record& record) { record.measured(zb_h1_gradients_against_1f1b({2, 4})); });
}

TEST(Lab06Pp, GpipeGradientsMatchDense) {
  const grading::Check check{
      "lab06.gpipe_gradients_match_dense", 3,
      "GPipe at p = 2, m = 1 and 4: the step's loss within 1e-6 of the dense model's on the same "
      "global batch, every gradient of each stage within 1e-5 (relative to the tensor) of the "
      "dense one, and the order the stage ran equal to the schedule",
      "README 'The exchange' and 'The executor': what crosses a boundary in each direction; "
      "the tensor named in the failure says which stage lost it"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_gradients_match_dense({{ScheduleKind::GPipe, 1, 1}, {ScheduleKind::GPipe, 4, 1}}));
  });
}

TEST(Lab06Pp, OneForwardOneBackwardGradientsMatchDense) {
  const grading::Check check{"lab06.one_forward_one_backward_gradients_match_dense", 3,
                             "the same for 1F1B at p = 2, m = 1, 3 and 8",
                             "README 'The executor': a backward needs the activations of ITS micro-batch"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_gradients_match_dense({{ScheduleKind::OneFOneB, 1, 1},
                                                  {ScheduleKind::OneFOneB, 3, 1},
                                                  {ScheduleKind::OneFOneB, 8, 1}}));
  });
}

TEST(Lab06Pp, InterleavedGradientsMatchDense) {
  const grading::Check check{"lab06.interleaved_gradients_match_dense", 3,
                             "the same for interleaved 1F1B at p = 2, v = 2 (m 2 and 4) and v = 4 (m 4): every chunk's "
                             "gradients",
                             "README 'Interleaved 1F1B': the last rank's chunk c feeds the first rank's chunk c + 1"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_gradients_match_dense({{ScheduleKind::Interleaved, 2, 2},
                                                  {ScheduleKind::Interleaved, 4, 2},
                                                  {ScheduleKind::Interleaved, 4, 4}}));
  });
}

TEST(Lab06Pp, TiedEmbeddingCopiesEqual) {
  const grading::Check check{"lab06.tied_embedding_copies_equal", 2,
                             "4 AdamW steps of 1F1B at p = 2: after every step the last stage's copy of wte equals the "
                             "first stage's bit for bit, and both equal the dense model's wte within 1e-5",
                             "README 'The tied embedding': one parameter, two copies, one gradient"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = pp_config();
    Pipeline pl = make_pipeline(cfg, ScheduleKind::OneFOneB, 4, 1, OptimizerConfig::Kind::AdamW);
    const int p = pl.layout.p, s = pl.layout.stage;
    std::unique_ptr<GPT2> dense = make_model(cfg);
    Optimizer dense_opt(*dense, OptimizerConfig{});
    std::string bad;
    double worst = 0;
    for (int step = 0; step < 4; ++step) {
      const GlobalBatch g = random_global_batch(kDataSeed + step, 4 * kMicroBatch, kT, cfg.vocab_size);
      pl.step(micro_batches_of(g, 4), 1e-2f, 1.0f);
      one_process_train_step(*dense, dense_opt, g, 1e-2f, 1.0f);
      // The last stage sends its copy to the first, which compares the bits.
      Tensor wte = pl.stage->chunk(0).param("wte");  // the first stage's wte, the last stage's copy
      Tensor other = Tensor::empty(wte.shape(), DType::F32);
      if (s == p - 1) pl.world->send(wte, 0, "wte copy");
      if (s == 0) {
        pl.world->recv(other, p - 1, "wte copy");
        for (int64_t i = 0; i < wte.numel() && bad.empty(); ++i)
          if (wte.data<float>()[i] != other.data<float>()[i]) {
            char buf[200];
            std::snprintf(buf, sizeof(buf), "after step %d: the last stage's wte[%lld] = %.9g, the first stage's %.9g",
                          step, static_cast<long long>(i), other.data<float>()[i], wte.data<float>()[i]);
            bad = buf;
          }
      }
      if (bad.empty())
        bad = compare_tensors("wte after step " + std::to_string(step), wte, dense->param("wte"), 1e-5, 0, &worst);
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), bad.empty() ? bad : on_rank(bad)));
    record.measured("the two copies bit-equal after each of 4 steps; worst distance to the dense wte %.2g of its scale",
                    worst);
  });
}

TEST(Lab06Pp, SgdStepsMatchDense) {
  const grading::Check check{"lab06.sgd_steps_match_dense", 2,
                             "3 steps of train_step (1F1B, p = 2, m = 4) with plain SGD and clipping at 0.5: the loss, "
                             "the norm (the whole model's) and every parameter of each stage as the dense model's "
                             "(1e-5 relative)",
                             "README 'One training step': the mean over m, and the norm of the whole model (wte once)"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = pp_config();
    Pipeline pl = make_pipeline(cfg, ScheduleKind::OneFOneB, 4, 1, OptimizerConfig::Kind::SGD);
    std::unique_ptr<GPT2> dense = make_model(cfg);
    OptimizerConfig oc;
    oc.kind = OptimizerConfig::Kind::SGD;
    Optimizer dense_opt(*dense, oc);
    std::string bad;
    double worst = 0;
    float last_norm = 0;
    for (int step = 0; step < 3; ++step) {  // every step on every rank: a rank that stopped early would hang the others
      const GlobalBatch g = random_global_batch(kDataSeed + 10 + step, 4 * kMicroBatch, kT, cfg.vocab_size);
      const StepResult r = pl.step(micro_batches_of(g, 4), 0.5f, 0.5f);
      const OneProcessStep want = one_process_train_step(*dense, dense_opt, g, 0.5f, 0.5f);
      last_norm = want.grad_norm;
      char buf[200];
      if (bad.empty() && (std::fabs(r.loss - want.loss) > 1e-6 * std::fabs(want.loss) ||
                          std::fabs(r.grad_norm - want.grad_norm) > 1e-5 * want.grad_norm)) {
        std::snprintf(buf, sizeof(buf), "step %d: loss %.7g norm %.7g, the dense model's loss %.7g norm %.7g", step,
                      r.loss, r.grad_norm, want.loss, want.grad_norm);
        bad = buf;
      }
      if (bad.empty()) bad = compare_with_dense_slices(pl.stage->chunk(0), *dense, /*grads=*/false, 1e-5, 0, &worst);
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), bad.empty() ? bad : on_rank(bad)));
    record.measured("3 steps: loss, norm (%.3g at the last, clipped to 0.5) and parameters as dense; worst %.2g",
                    last_norm, worst);
  });
}

TEST(Lab06Pp, AdamwLossCurveFollowsOneRank) {
  const grading::Check check{"lab06.adamw_loss_curve_follows_one_rank", 2,
                             "8 AdamW steps of interleaved 1F1B (p = 2, v = 2, m = 4): every step's loss within 1e-5 "
                             "(relative) of one process training the dense model on the same batches",
                             "README 'One training step'"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig cfg = pp_config();
    Pipeline pl = make_pipeline(cfg, ScheduleKind::Interleaved, 4, 2, OptimizerConfig::Kind::AdamW);
    std::unique_ptr<GPT2> dense = make_model(cfg);
    Optimizer dense_opt(*dense, OptimizerConfig{});
    std::string bad;
    double worst = 0;
    float first = 0, last = 0;
    for (int step = 0; step < 8; ++step) {  // every step on every rank (the first difference is kept)
      const GlobalBatch g = random_global_batch(kDataSeed + 20 + step, 4 * kMicroBatch, kT, cfg.vocab_size);
      const StepResult r = pl.step(micro_batches_of(g, 4), 1e-2f, 1.0f);
      const OneProcessStep want = one_process_train_step(*dense, dense_opt, g, 1e-2f, 1.0f);
      const double rel = std::fabs(r.loss - want.loss) / std::fabs(want.loss);
      worst = std::max(worst, rel);
      if (step == 0) first = want.loss;
      last = want.loss;
      if (rel > 1e-5 && bad.empty()) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "step %d: loss %.7g, one process %.7g", step, r.loss, want.loss);
        bad = buf;
      }
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), bad));
    record.measured("loss %.4f -> %.4f in 8 steps, worst relative difference %.2g", first, last, worst);
  });
}

TEST(Lab06Pp, ActivationMemoryPerSchedule) {
  const grading::Check check{
      "lab06.activation_memory_per_schedule", 3,
      "the allocator's peak of activations during a step, minus before it, equals exactly the "
      "sets each schedule holds: GPipe m = 4 (4 on every stage), 1F1B m = 4 (min(m, p - s): 2, 1), "
      "interleaved v = 2 m = 4 (its warm-up + 1 chunk sets: 5, 3); nothing left after the step",
      "README 'Why 1F1B': when is a micro-batch's activation set made, and when freed?"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_activation_memory({{ScheduleKind::GPipe, 4, 1},
                                              {ScheduleKind::OneFOneB, 4, 1},
                                              {ScheduleKind::Interleaved, 4, 2}}));
  });
}

TEST(Lab06Pp, ZbH1ActivationMemory) {
  const grading::Check check{
      "lab06.zb_h1_activation_memory", 2,
      "ZB-H1 m = 4: the allocator's peak of activations equals the schedule's walk exactly (a set whole from F "
      "to I, what I keeps until W), and on every stage it is at most 1F1B's largest stage peak (m = 4, same "
      "model, from the allocator); nothing left",
      "README 'Zero bubble': what does a set keep between its I and its W?"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_activation_memory({{ScheduleKind::ZbH1, 4, 1}}));
  });
}

TEST(Lab06Pp, ZbH1BubbleMatchesFormula) {
  const grading::Check check{
      "lab06.zb_h1_bubble_matches_formula", 3,
      "on simulated H100s over a free link, uniform compute (F = 100 ms, I = W = 100 ms): each stage's idle "
      "share equals (p - 1)/(3m + p - 1) within 1e-9 for m = 2, 4, 8 (1/7, 1/13, 1/25)",
      "README 'Zero bubble': a W run too late, or an I waiting for its W, leaves a larger bubble"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_bubble_matches_formula({{{ScheduleKind::ZbH1, 2, 1}, 100.0},
                                                   {{ScheduleKind::ZbH1, 4, 1}, 100.0},
                                                   {{ScheduleKind::ZbH1, 8, 1}, 100.0}}));
  });
}

TEST(Lab06Pp, BubbleMatchesFormula) {
  const grading::Check check{
      "lab06.bubble_matches_formula", 3,
      "on simulated H100s over a free link (virtual time), uniform compute (forward F = 100 ms, "
      "backward 2F per stage and micro-batch): each stage's idle share of the window from the first "
      "forward's start to the last backward's end equals the formula within 1e-9: GPipe and 1F1B m = 4, "
      "(p - 1)/(m + p - 1) = 0.2; interleaved v = 2 m = 2, (p - 1)/(v m + p - 1) = 0.2",
      "README 'Measuring the bubble': a schedule that waits where it need not has a larger one"};
  grading::run(check, [](grading::Record& record) {
    record.measured(expect_bubble_matches_formula({{{ScheduleKind::GPipe, 4, 1}, 100.0},
                                                   {{ScheduleKind::OneFOneB, 4, 1}, 100.0},
                                                   {{ScheduleKind::Interleaved, 2, 2}, 100.0}}));
  });
}
