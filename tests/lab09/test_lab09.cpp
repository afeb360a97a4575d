// test_lab09.cpp — lab 09's graded checks (one process each; sl_add_graded_test): the track's memory and time
// terms against the model (tests/lab09/oracle.h: the repository's reference, built apart) on a set of layouts,
// and against what does not come from the model at all: the activation sets lab 06's allocator measured,
// common's estimate_memory, the whole model's FLOPs, the bubble formula. Then the planner built on the track's
// terms against the model's choice in three scenarios, and bad inputs.
// Lesson: labs/09_planner/README.md ("What the tests check").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "grading.h"              // defines: grading::Check, grading::run
#include "lab09_support.h"        // defines: lab09_test::layout
#include "oracle.h"               // defines: lab09::oracle_model (the model)
#include "planner.h"              // defines: lab09::* (the track's terms)
#include "scalelab/core/error.h"  // defines: scalelab::Error, scalelab::NotImplemented

namespace {

using namespace scalelab;
using namespace scalelab::lab09;
using scalelab::lab09_test::layout;
namespace grading = scalelab::grading;
namespace model = scalelab::lab09::oracle_model;

constexpr double kRel = 1e-9;  // relative: the same sums in another order differ in the last bits, no more

bool close(double got, double want) { return std::fabs(got - want) <= kRel * std::max(1.0, std::fabs(want)); }

// One case: a model, a workload and a layout of it.
struct Case {
  std::string name;
  GPTConfig cfg;
  Workload w;
  Layout x;
};

GPTConfig seven_b() {  // Llama-2-7B's shape as GPT-2: 32 layers, C 4096, 32 heads, V 32000 (README "The FAQ")
  GPTConfig c;
  c.n_layer = 32;
  c.n_embd = 4096;
  c.n_head = 32;
  c.vocab_size = 32000;
  c.max_seq_len = 2048;
  return c;
}

Workload workload(int T, int global_batch, PrecisionPolicy p = PrecisionPolicy::bf16_mixed(), int lora = 0,
                  AttentionImpl attention = AttentionImpl::Materialized) {
  Workload w;
  w.seq_len = T;
  w.global_batch = global_batch;
  w.policy = p;
  w.lora_rank = lora;
  w.attention = attention;
  return w;
}

// Layouts of every kind: one device, pipelines under each schedule, tensor parallel with and without sequence
// parallelism, ZeRO 0-3, the three recompute modes, flash attention, LoRA, a 7B model on 64 devices.
std::vector<Case> cases() {
  using S = lab06::ScheduleKind;
  const GPTConfig demo = GPTConfig::preset("demo"), d12 = GPTConfig::preset("d12"), d24 = GPTConfig::preset("d24");
  const PrecisionPolicy fp32 = PrecisionPolicy::fp32();
  return {
      {"demo, one device", demo, workload(64, 4, fp32), layout(1, 1, 1, 4, 1)},
      {"demo, pp 2 1F1B m 4", demo, workload(64, 8, fp32), layout(1, 2, 1, 2, 4)},
      {"demo, pp 4 GPipe m 8", demo, workload(64, 8, fp32), layout(1, 4, 1, 1, 8, 0, false, Recompute::None, S::GPipe)},
      {"demo, pp 2 interleaved v 2 m 4", demo, workload(64, 8),
       layout(1, 2, 1, 2, 4, 0, false, Recompute::None, S::Interleaved, 2)},
      {"demo, tp 2 pp 2 dp 2 ZeRO-1 sp selective", demo, workload(64, 16),
       layout(2, 2, 2, 2, 4, 1, true, Recompute::Selective)},
      {"demo, tp 2 dp 2 flash full", demo, workload(128, 8, fp32, 0, AttentionImpl::Flash),
       layout(2, 1, 2, 2, 2, 0, false, Recompute::Full)},
      {"d12, tp 4 dp 2 ZeRO-3 full", d12, workload(256, 16), layout(4, 1, 2, 2, 4, 3, false, Recompute::Full)},
      {"d12, dp 4 ZeRO-2", d12, workload(256, 16, fp32), layout(1, 1, 4, 2, 2, 2)},
      {"d24, pp 4 dp 2 ZeRO-2 m 8", d24, workload(1024, 16), layout(1, 4, 2, 1, 8, 2)},
      {"d12, LoRA r 8, dp 2", d12, workload(256, 8, PrecisionPolicy::bf16_mixed(), 8), layout(1, 1, 2, 2, 2)},
      {"7B, tp 8 pp 4 dp 2 ZeRO-1 sp selective", seven_b(), workload(2048, 32),
       layout(8, 4, 2, 1, 16, 1, true, Recompute::Selective)},
  };
}

// A cluster for case x: CPU-like (no links, a memory bandwidth) or H100 nodes of 8, or of 2 (so tp crosses).
Cluster cluster_for(const Layout& x, int per_node, bool cpu) {
  Cluster c;
  c.devices = x.devices();
  c.devices_per_node = per_node;
  c.memory_bytes = 80e9;
  c.peak_flops_per_s = cpu ? 100e9 : 989e12;
  c.efficiency = cpu ? 1.0 : 0.45;
  c.memory_bandwidth_bytes_per_s = cpu ? 10e9 : 3.35e12;
  if (!cpu) {
    c.intra = LinkModel::preset("nvlink");
    c.inter = LinkModel::preset("infiniband");
  }
  return c;
}

std::string bytes_diff(const char* what, int64_t got, int64_t want) {
  return got == want ? "" : std::string(what) + " " + std::to_string(got) + ", the model " + std::to_string(want);
}

// A problem with one field: "<what> <got>, the model <want>", or "".
std::string field_diff(const char* what, double got, double want) {
  if (close(got, want)) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %.10g, the model %.10g", what, got, want);
  return buf;
}

std::string memory_diff(const DeviceMemory& got, const DeviceMemory& want) {
  for (const std::string& d :
       {bytes_diff("stage", got.stage, want.stage), bytes_diff("sets", got.sets, want.sets),
        bytes_diff("params bytes", got.state.params, want.state.params),
        bytes_diff("grads bytes", got.state.grads, want.state.grads),
        bytes_diff("optimizer state bytes", got.state.optimizer_state, want.state.optimizer_state),
        bytes_diff("activation bytes", got.activations, want.activations)})
    if (!d.empty()) return d;
  return "";
}

std::string time_diff(const StepTime& got, const StepTime& want) {
  if (got.slowest_stage != want.slowest_stage)
    return bytes_diff("slowest stage", got.slowest_stage, want.slowest_stage);
  for (const std::string& d :
       {field_diff("compute_ms", got.compute_ms, want.compute_ms), field_diff("tp_ms", got.tp_ms, want.tp_ms),
        field_diff("pp_ms", got.pp_ms, want.pp_ms), field_diff("slot_ms", got.slot_ms, want.slot_ms),
        field_diff("pipeline_ms", got.pipeline_ms, want.pipeline_ms),
        field_diff("bubble_ms", got.bubble_ms, want.bubble_ms), field_diff("dp_ms", got.dp_ms, want.dp_ms),
        field_diff("optimizer_ms", got.optimizer_ms, want.optimizer_ms),
        field_diff("step_ms", got.step_ms, want.step_ms),
        field_diff("tokens_per_s", got.tokens_per_s, want.tokens_per_s), field_diff("mfu", got.mfu, want.mfu),
        field_diff("hfu", got.hfu, want.hfu)})
    if (!d.empty()) return d;
  return "";
}

// The what() of the scalelab::Error f throws ("" when none); a learner's NotImplemented passes through, so
// the grader reports "not implemented".
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const NotImplemented&) {
    throw;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Lab09Planner, ActivationSetsPerSchedule) {
  const grading::Check check{"lab09.activation_sets_per_schedule", 2,
                             "lab 06's measured sets (p 4: GPipe m 8 holds 8 on every stage, 1F1B 4, 3, 2, 1; "
                             "interleaved v 2 m 4: 8, 8, 7, 5 chunk sets), and the model's for p 1, 2, 4, m 1..8, "
                             "every schedule and stage",
                             "README 'Activation sets in flight': what a stage has run forward and not yet backward"};
  grading::run(check, [](grading::Record& record) {
    using S = lab06::ScheduleKind;
    const std::vector<int> gpipe = {8, 8, 8, 8}, ofob = {4, 3, 2, 1}, inter = {8, 8, 7, 5};  // lab 06's allocator
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(activation_sets(layout(1, 4, 1, 1, 8, 0, false, Recompute::None, S::GPipe), s), gpipe[s])
          << "GPipe stage " << s;
      EXPECT_EQ(activation_sets(layout(1, 4, 1, 1, 8), s), ofob[s]) << "1F1B stage " << s;
      EXPECT_EQ(activation_sets(layout(1, 4, 1, 1, 4, 0, false, Recompute::None, S::Interleaved, 2), s), inter[s])
          << "interleaved stage " << s;
    }
    int n = 0;
    for (int p : {1, 2, 4})
      for (int m = 1; m <= 8; ++m)
        for (S kind : {S::GPipe, S::OneFOneB, S::Interleaved})
          for (int v : {1, 2}) {
            if ((kind == S::Interleaved) != (v > 1) || (v > 1 && (p < 2 || m % p))) continue;
            const Layout x = layout(1, p, 1, 1, m, 0, false, Recompute::None, kind, v);
            for (int s = 0; s < p; ++s, ++n)
              ASSERT_EQ(activation_sets(x, s), model::activation_sets(x, s))
                  << lab06::schedule_name(kind) << " p " << p << " m " << m << " v " << v << " stage " << s;
          }
    record.measured("%d (schedule, p, m, stage) counts equal the model's and lab 06's", n);
  });
}

TEST(Lab09Planner, MemoryEqualsTheEstimator) {
  const grading::Check check{"lab09.memory_equals_the_estimator", 4,
                             "data parallel (tp 1, pp 1) at ZeRO 0-3 on 1, 2, 4 devices, fp32, bf16 and bf16 "
                             "with 16-bit activations, each recompute mode: device_memory equals common's "
                             "estimate_memory per category to the byte; 11 layouts of every kind: every stage "
                             "equals the model to the byte",
                             "README 'Memory per device': a stage's chunks, their state over dp, their sets"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig demo = GPTConfig::preset("demo");
    int n = 0;
    PrecisionPolicy bf16_activations = PrecisionPolicy::bf16_mixed();
    bf16_activations.activation_dtype = DType::BF16;  // --activations bf16
    for (const PrecisionPolicy& p : {PrecisionPolicy::fp32(), PrecisionPolicy::bf16_mixed(), bf16_activations})
      for (int N : {1, 2, 4})
        for (int zero = 0; zero <= 3; ++zero)
          for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
            const Workload w = workload(64, 4 * N, p);
            const Layout x = layout(1, 1, N, 4, 1, zero, false, r);
            const DeviceMemory got = device_memory(demo, x, w);
            const MemoryEstimate e = estimate_memory(demo, N, zero, p, w.optimizer, w.prefetch, 4, 64, r);
            const std::string at = p.name() + " N " + std::to_string(N) + " ZeRO " + std::to_string(zero) + " " +
                                   recompute_name(r);
            ASSERT_EQ(got.state.params, e.peak.params) << at;
            ASSERT_EQ(got.state.grads, e.peak.grads) << at;
            ASSERT_EQ(got.state.optimizer_state, e.peak.optimizer_state) << at;
            ASSERT_EQ(got.activations, e.activations_bytes) << at;
            ++n;
          }
    for (const Case& c : cases()) {
      for (int s = 0; s < c.x.pp; ++s) {
        const std::string d = memory_diff(stage_memory(c.cfg, c.x, s, c.w), model::stage_memory(c.cfg, c.x, s, c.w));
        ASSERT_TRUE(d.empty()) << c.name << ", stage " << s << ": " << d;
      }
      const std::string d = memory_diff(device_memory(c.cfg, c.x, c.w), model::device_memory(c.cfg, c.x, c.w));
      ASSERT_TRUE(d.empty()) << c.name << ", the fullest stage: " << d;
    }
    record.measured("%d data-parallel layouts equal estimate_memory; %zu layouts' stages equal the model", n,
                    cases().size());
  });
}

TEST(Lab09Planner, ComputeTermsMatchTheModel) {
  const grading::Check check{"lab09.compute_terms_match_the_model", 3,
                             "every stage of 11 layouts: forward, backward and recompute FLOPs equal the model's "
                             "(relative 1e-9); the stages' forwards times tp add up to the whole model's",
                             "README 'Compute': lab 01's count, one stage's share, split by tp"};
  grading::run(check, [](grading::Record& record) {
    for (const Case& c : cases()) {
      double forward = 0;
      for (int s = 0; s < c.x.pp; ++s) {
        const StageFlops got = stage_flops(c.cfg, c.x, s, c.w), want = model::stage_flops(c.cfg, c.x, s, c.w);
        for (const std::string& d :
             {field_diff("forward", got.forward, want.forward), field_diff("backward", got.backward, want.backward),
              field_diff("recompute", got.recompute, want.recompute)})
          ASSERT_TRUE(d.empty()) << c.name << ", stage " << s << ": " << d;
        forward += got.forward * c.x.tp;
      }
      // independent of the model: B T (L (24 C^2 + 4 T C) + 2 C V) for the whole model
      const double B = c.x.micro_batch, T = c.w.seq_len, C = c.cfg.n_embd, L = c.cfg.n_layer, V = c.cfg.vocab_size;
      EXPECT_TRUE(close(forward, B * T * (L * (24 * C * C + 4 * T * C) + 2 * C * V)))
          << c.name << ": the stages' forwards x tp = " << forward;
    }
    record.measured("%zu layouts, every stage", cases().size());
  });
}

TEST(Lab09Planner, CommunicationTermsMatchTheModel) {
  const grading::Check check{"lab09.communication_terms_match_the_model", 3,
                             "every stage of 11 layouts, and of tp 4 x pp 2 with Megatron's pp scatter/gather, "
                             "on nodes of 8 and of 2 (NVLink inside, InfiniBand "
                             "across): tp and pp seconds per micro-batch and the step's dp seconds equal the "
                             "model's (relative 1e-9); with no links, all 0",
                             "README 'Communication': which collectives each group runs, how many, how large"};
  grading::run(check, [](grading::Record& record) {
    int n = 0;
    std::vector<Case> all = cases();
    Workload scatter_gather = workload(256, 16);
    scatter_gather.pp_scatter_gather = true;  // each tp rank sends 1/tp of the boundary, gathered on arrival
    all.push_back({"d12, tp 4 pp 2 pp scatter/gather", GPTConfig::preset("d12"), scatter_gather,
                   layout(4, 2, 1, 2, 8)});
    for (const Case& c : all)
      for (int per_node : {8, 2}) {
        const GroupLinks links = group_links(cluster_for(c.x, per_node, false), c.x);
        for (int s = 0; s < c.x.pp; ++s, ++n) {
          const StageComm got = stage_comm(c.cfg, c.x, s, links, c.w);
          const StageComm want = model::stage_comm(c.cfg, c.x, s, links, c.w);
          for (const std::string& d : {field_diff("tp_s", got.tp_s, want.tp_s), field_diff("pp_s", got.pp_s, want.pp_s),
                                       field_diff("dp_seconds", dp_seconds(c.cfg, c.x, s, links, c.w),
                                                  model::dp_seconds(c.cfg, c.x, s, links, c.w))})
            ASSERT_TRUE(d.empty()) << c.name << ", nodes of " << per_node << ", stage " << s << ": " << d;
        }
        const GroupLinks none = group_links(cluster_for(c.x, per_node, true), c.x);
        for (int s = 0; s < c.x.pp; ++s) {
          const StageComm free = stage_comm(c.cfg, c.x, s, none, c.w);
          EXPECT_EQ(free.tp_s + free.pp_s + dp_seconds(c.cfg, c.x, s, none, c.w), 0.0) << c.name << " without links";
        }
      }
    record.measured("%d (layout, cluster, stage) terms equal the model's", n);
  });
}

TEST(Lab09Planner, StepTimeMatchesTheModel) {
  const grading::Check check{"lab09.step_time_matches_the_model", 3,
                             "11 layouts on a CPU-like cluster, H100 nodes of 8 and of 2, dp overlapped or not, a "
                             "uniform simulated compute: "
                             "every field of the step equals the model's (relative 1e-9); the bubble's share of "
                             "the pipeline is lab 06's formula",
                             "README 'The step': the slowest slot sets the pace; then what cannot overlap"};
  grading::run(check, [](grading::Record& record) {
    int n = 0;
    for (const Case& c : cases())
      for (int k = 0; k < 5; ++k) {
        const Cluster cl = cluster_for(c.x, k == 2 ? 2 : 8, k == 0);
        Workload w = c.w;
        w.overlap_dp = k == 3;
        w.uniform_compute_ms = k == 4 ? 25 : 0;
        const StepTime got = step_time(c.cfg, c.x, w, cl);
        const std::string d = time_diff(got, model::step_time(c.cfg, c.x, w, cl));
        ASSERT_TRUE(d.empty()) << c.name << ", cluster " << to_string(cl) << (w.overlap_dp ? ", overlap" : "")
                               << (k == 4 ? ", uniform compute 25 ms" : "") << ": " << d;
        lab06::PipelineLayout pl;  // independent of the model: lab 06's bubble formula
        pl.p = c.x.pp;
        pl.v = c.x.chunks;
        pl.m = c.x.micro_batches;
        EXPECT_TRUE(close(got.bubble_ms / got.pipeline_ms, lab06::bubble_formula(pl))) << c.name;
        ++n;
      }
    record.measured("%d (layout, cluster) steps equal the model's", n);
  });
}

TEST(Lab09Planner, PlannerPicksTheReferenceLayout) {
  const grading::Check check{"lab09.planner_picks_the_reference_layout", 4,
                             "three scenarios (d24 on 4 nodes of 4 x 4 GB; a 7B model on 8 x 80 GB H100; the demo "
                             "model on 4 CPU ranks, 2 a node): the same rows as the model's plan, in the same "
                             "order, the same first choice with the same prediction",
                             "README 'The plan': enumerate, refuse with a reason, rank by tokens/s"};
  grading::run(check, [](grading::Record& record) {
    struct Scenario {
      const char* name;
      GPTConfig cfg;
      Workload w;
      Cluster c;
    };
    Cluster d24c = cluster_for(layout(4, 4, 1, 1, 1), 4, false);
    d24c.memory_bytes = 4e9;
    Cluster h100 = cluster_for(layout(8, 1, 1, 1, 1), 8, false);
    Cluster cpu = cluster_for(layout(4, 1, 1, 1, 1), 2, true);
    cpu.intra = LinkModel::preset("pcie");
    cpu.inter = LinkModel::preset("ethernet100");
    cpu.memory_bytes = 0.15e9;
    const std::vector<Scenario> scenarios = {
        {"d24 on 4 nodes of 4 x 4 GB", GPTConfig::preset("d24"), workload(1024, 64), d24c},
        {"7B on 8 x 80 GB H100", seven_b(), workload(2048, 64), h100},
        {"demo on 4 CPU ranks", GPTConfig::preset("demo"), workload(256, 16, PrecisionPolicy::fp32()), cpu},
    };
    std::string firsts;
    for (const Scenario& sc : scenarios) {
      const std::vector<Candidate> got = plan(sc.cfg, sc.w, sc.c), want = model::plan(sc.cfg, sc.w, sc.c);
      ASSERT_EQ(got.size(), want.size()) << sc.name << ": rows";
      ASSERT_TRUE(!want.empty() && want.front().fits) << sc.name << ": the model finds no layout";
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(to_string(got[i].layout), to_string(want[i].layout)) << sc.name << ": row " << i;
        ASSERT_EQ(got[i].fits, want[i].fits) << sc.name << ": row " << i << " " << to_string(want[i].layout);
        ASSERT_EQ(got[i].why_not.empty(), want[i].why_not.empty()) << sc.name << ": row " << i;
      }
      const std::string d = time_diff(got.front().time, want.front().time) +
                            memory_diff(got.front().memory, want.front().memory);
      ASSERT_TRUE(d.empty()) << sc.name << ", the first choice: " << d;
      firsts += std::string(firsts.empty() ? "" : "; ") + sc.name + ": " + to_string(got.front().layout);
    }
    record.measured("%s", firsts.c_str());
  });
}

TEST(Lab09Planner, BadInputsGetClearAnswers) {
  const grading::Check check{"lab09.bad_inputs_get_clear_answers", 2,
                             "a cluster of 0 devices, one with no compute, a global batch of 0: an error naming "
                             "the number and the option; d12 (12 heads) on 8 devices: tp 8 rows refused naming NH; "
                             "d48 on 2 x 1 GB: every row refused with what it needs and what there is",
                             "README 'The plan': refuse what cannot run, and say why"};
  grading::run(check, [](grading::Record& record) {
    const GPTConfig d12 = GPTConfig::preset("d12");
    Cluster c = cluster_for(layout(8, 1, 1, 1, 1), 8, false);
    Cluster empty = c;
    empty.devices = 0;
    const std::string e0 = refusal([&] { plan(d12, workload(256, 8), empty); });
    EXPECT_TRUE(contains(e0, "0 devices") && contains(e0, "--gpus")) << "0 devices: \"" << e0 << "\"";
    Cluster idle = c;
    idle.efficiency = 0;
    EXPECT_TRUE(contains(refusal([&] { plan(d12, workload(256, 8), idle); }), "no compute")) << "no compute";
    const std::string eb = refusal([&] { plan(d12, workload(256, 0), c); });
    EXPECT_TRUE(contains(eb, "global batch 0")) << "global batch 0: \"" << eb << "\"";
    int tp8 = 0, tp8_refused = 0;
    for (const Candidate& r : plan(d12, workload(256, 8), c)) {
      if (r.layout.tp != 8) continue;
      ++tp8;
      tp8_refused += !r.fits && contains(r.why_not, "NH");
    }
    EXPECT_TRUE(tp8 > 0 && tp8 == tp8_refused) << tp8_refused << " of " << tp8 << " tp 8 rows refused naming NH";
    Cluster small = cluster_for(layout(2, 1, 1, 1, 1), 2, false);
    small.memory_bytes = 1e9;
    const std::vector<Candidate> rows = plan(GPTConfig::preset("d48"), workload(1024, 2), small);  // 25 heads
    int told = 0, tp1 = 0, fit = 0;
    for (const Candidate& r : rows) {
      fit += r.fits;
      if (r.layout.tp != 1) continue;  // tp 2 does not divide the heads
      ++tp1;
      told += contains(r.why_not, "needs") && contains(r.why_not, "has 1.00 GB");
    }
    EXPECT_TRUE(fit == 0 && tp1 > 0 && told == tp1)
        << fit << " of " << rows.size() << " d48 rows fit 1 GB; " << told << " of the " << tp1
        << " tp 1 rows say what they need and what there is";
    record.measured("errors named; %d tp 8 rows refused for NH; %d d48 rows refused for memory", tp8_refused, told);
  });
}
