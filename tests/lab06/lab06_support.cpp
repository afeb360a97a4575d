// lab06_support.cpp — what lab 06's graded checks share (lab06_support.h).
#include "lab06_support.h"

#include <gtest/gtest.h>  // defines: EXPECT_TRUE

#include <algorithm>  // defines: std::min, std::max
#include <cmath>      // defines: std::fabs
#include <cstdio>     // defines: std::snprintf, std::sscanf
#include <cstdlib>    // defines: std::strtod
#include <map>

#include "grading.h"                  // defines: grading::all_ranks, rank_reducer
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/error.h"      // defines: scalelab::Error, NotImplemented, SL_CHECK
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "sim_cluster.h"             // defines: test::SimulatedCluster, test::on_device

namespace scalelab::lab06_test {

using test::on_device;
using test::SimulatedCluster;

GPTConfig pp_config() { return GPTConfig{16, 64, 8, 2, 16}; }

StepResult Pipeline::step(const std::vector<MicroBatch>& micro, float lr, float grad_clip) {
  return lab06::train_step(*stage, *exchange, grid->embedding(), optimizers, micro, lr, grad_clip);
}

Pipeline make_pipeline(const GPTConfig& cfg, ScheduleKind schedule, int m, int v, OptimizerConfig::Kind optimizer,
                       std::unique_ptr<Communicator> world) {
  Pipeline pl;
  pl.world = world ? std::move(world) : fresh_comm();
  const int p = pl.world->size();
  pl.layout = lab06::make_layout(cfg, p, pl.world->rank(), schedule, m, v);  // a NotImplemented ends the check here
  pl.grid = std::make_unique<RankGrid>(*pl.world, 1, p, 1);
  OptimizerConfig oc;
  oc.kind = optimizer;
  std::vector<GPT2*> chunks;
  for (int c = 0; c < v; ++c) {
    pl.models.push_back(std::make_unique<GPT2>(cfg, lab06::chunk_shard(cfg, pl.layout, c), PrecisionPolicy::fp32(),
                                               pl.world->device(), kModelSeed));
    pl.optimizers.push_back(std::make_unique<Optimizer>(*pl.models.back(), oc));
    chunks.push_back(pl.models.back().get());
  }
  pl.stage = std::make_unique<lab06::Stage>(chunks, pl.layout);
  pl.exchange = std::make_unique<lab06::StageExchange>(pl.grid->pp(), pl.layout);
  return pl;
}

std::vector<MicroBatch> micro_batches_of(const GlobalBatch& g, int m) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < m; ++i) {
    const GlobalBatch rows = batch_rows(g, static_cast<int64_t>(i) * kMicroBatch, kMicroBatch);
    out.push_back({rows.inputs, rows.targets});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The definitions

std::vector<Action> expected_schedule(ScheduleKind kind, int p, int m, int v, int s) {
  std::vector<Action> out;
  auto F = [&](int i, int c) { out.push_back({Action::Forward, i, c}); };
  auto B = [&](int i, int c) { out.push_back({Action::Backward, i, c}); };
  if (kind == ScheduleKind::GPipe) {  // Huang et al. 2019, Fig. 2(c): all forwards, then all backwards
    for (int i = 0; i < m; ++i) F(i, 0);
    for (int i = 0; i < m; ++i) B(i, 0);
    return out;
  }
  if (kind == ScheduleKind::ZbH1) {
    // Qi et al. 2024, Sec. 3.1, Fig. 3: 1F1B with each B split into I (in B's place) and W; stage s runs W of
    // micro-batch k - s right after I of k, and its last s W's at the end.
    for (const Action& a : expected_schedule(ScheduleKind::OneFOneB, p, m, 1, s)) {
      if (a.kind == Action::Forward) {
        out.push_back(a);
        continue;
      }
      out.push_back({Action::BackwardInput, a.micro_batch, 0});
      if (a.micro_batch >= s) out.push_back({Action::BackwardWeight, a.micro_batch - s, 0});
    }
    for (int k = std::max(m - s, 0); k < m; ++k) out.push_back({Action::BackwardWeight, k, 0});
    return out;
  }
  // 1F1B and interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2, Figs. 3 and 4) walk a rank's n = m * v units
  // of work (micro-batch, chunk) in one order for forwards and one for backwards: unit k of the forwards is
  // micro-batch (k / (p v)) p + k % p on chunk (k % (p v)) / p (groups of p micro-batches pass chunk 0, then
  // chunk 1, ...), of the backwards the same micro-batch on chunk v - 1 - (k % (p v)) / p. With v = 1 both
  // are micro-batch k. Warm-up: the forwards that run before the first backward can arrive, p - s - 1 for
  // 1F1B, 2 (p - s - 1) + (v - 1) p interleaved (Megatron-LM's schedules.py), at most n.
  const int n = m * v;
  const int warmup = std::min(v == 1 ? p - s - 1 : 2 * (p - s - 1) + (v - 1) * p, n);
  auto mb = [&](int k) { return k / (p * v) * p + k % p; };
  auto fchunk = [&](int k) { return k % (p * v) / p; };
  int f = 0, b = 0;
  while (f < warmup) F(mb(f), fchunk(f)), ++f;
  while (f < n) {
    F(mb(f), fchunk(f)), ++f;
    B(mb(b), v - 1 - fchunk(b)), ++b;
  }
  while (b < n) B(mb(b), v - 1 - fchunk(b)), ++b;
  return out;
}

namespace {

std::string on_rank_if(const std::string& s) { return s.empty() ? s : on_rank(s); }

std::string case_name(const ScheduleCase& c, int p) {
  std::string s = std::string(lab06::schedule_name(c.kind)) + " p " + std::to_string(p) + " m " + std::to_string(c.m);
  return c.v > 1 ? s + " v " + std::to_string(c.v) : s;
}

// The bytes of one activation set of each chunk for (kMicroBatch, kT), from the allocator: the second set
// made (the first also allocates the model's backward scratch).
std::vector<int64_t> set_bytes_per_chunk(lab06::Stage& stage) {
  std::vector<int64_t> bytes;
  Allocator& a = Allocator::get(Device::CPU);
  const int act = static_cast<int>(MemCategory::Activations);
  for (int c = 0; c < stage.num_chunks(); ++c) {
    GPT2Activations first = stage.chunk(c).make_activations(kMicroBatch, kT);
    const int64_t before = a.stats().current_bytes[act];
    GPT2Activations second = stage.chunk(c).make_activations(kMicroBatch, kT);
    bytes.push_back(a.stats().current_bytes[act] - before);
  }
  return bytes;
}

// The bytes a set keeps between its I and its W (GPT2::backward_input), of each chunk, from the allocator:
// one micro-batch's forward and I through the chunk (its own input, a random gradient), then its W; the
// gradients it added are zeroed again.
std::vector<int64_t> kept_bytes_per_chunk(lab06::Stage& stage, const lab06::StageExchange& exchange) {
  std::vector<int64_t> bytes;
  Allocator& a = Allocator::get(Device::CPU);
  const int act = static_cast<int>(MemCategory::Activations);
  const GPTConfig cfg = stage.chunk(0).config();
  const GlobalBatch g = random_global_batch(kDataSeed, kMicroBatch, kT, cfg.vocab_size);
  for (int c = 0; c < stage.num_chunks(); ++c) {
    GPT2& model = stage.chunk(c);
    const int64_t before = a.stats().current_bytes[act];
    GPT2Activations acts = model.make_activations(kMicroBatch, kT);
    const Tensor stream = Tensor::zeros({kMicroBatch, kT, cfg.n_embd}, DType::F32, Device::CPU, MemCategory::Workspace);
    Tensor dx = Tensor::zeros({kMicroBatch, kT, cfg.n_embd}, DType::F32, Device::CPU, MemCategory::Workspace);
    model.forward(acts, exchange.is_first(c) ? g.inputs : stream, exchange.is_last(c) ? &g.targets : nullptr);
    model.backward_input(acts, exchange.is_last(c) ? nullptr : &stream, exchange.is_first(c) ? nullptr : &dx);
    bytes.push_back(a.stats().current_bytes[act] - before);
    model.backward_weight(acts);
    model.zero_grad();
  }
  return bytes;
}

// Walks a schedule: the most bytes of activation sets alive at once. A set costs set_bytes from its F, and
// kept_bytes from its I to its W (empty: the schedule has no I).
int64_t peak_bytes_of(const std::vector<Action>& actions, const std::vector<int64_t>& set_bytes, int* peak_sets,
                      const std::vector<int64_t>& kept_bytes = {}) {
  int64_t now = 0, peak = 0;
  int sets = 0;
  *peak_sets = 0;
  for (const Action& a : actions) {
    const int64_t b = set_bytes.at(a.chunk);
    if (a.kind == Action::BackwardInput) {
      now -= b - kept_bytes.at(a.chunk);
      continue;
    }
    if (a.kind == Action::BackwardWeight) {
      now -= kept_bytes.at(a.chunk);
      --sets;
      continue;
    }
    now += a.kind == Action::Forward ? b : -b;
    sets += a.kind == Action::Forward ? 1 : -1;
    peak = std::max(peak, now);
    *peak_sets = std::max(*peak_sets, sets);
  }
  return peak;
}

// One step of pl after a first one (which allocates what persists: scratch, optimizer state): the
// allocator's peak of Activations during it minus before it, and what it left behind.
int64_t step_activation_peak(Pipeline& pl, const ScheduleCase& sc, int64_t* leaked) {
  Allocator& a = Allocator::get(Device::CPU);
  const int act = static_cast<int>(MemCategory::Activations);
  const GlobalBatch g = random_global_batch(kDataSeed, sc.m * kMicroBatch, kT, pl.models[0]->config().vocab_size);
  const std::vector<MicroBatch> micro = micro_batches_of(g, sc.m);
  pl.step(micro, 0.0f, 0.0f);
  const int64_t before = a.stats().current_bytes[act];
  a.reset_peak();
  pl.step(micro, 0.0f, 0.0f);
  if (leaked != nullptr) *leaked = a.stats().current_bytes[act] - before;
  return a.stats().peak_bytes[act] - before;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Check bodies

std::string expect_gradients_match_dense(const std::vector<ScheduleCase>& cases) {
  const GPTConfig cfg = pp_config();
  std::string measured;
  double worst_all = 0;
  for (const ScheduleCase& sc : cases) {
    Pipeline pl = make_pipeline(cfg, sc.kind, sc.m, sc.v);
    const int p = pl.layout.p, s = pl.layout.stage;
    const GlobalBatch g = random_global_batch(kDataSeed + sc.m, sc.m * kMicroBatch, kT, cfg.vocab_size);
    std::unique_ptr<GPT2> dense = make_model(cfg);
    const float want_loss = one_process_gradients(*dense, g);
    const StepResult r = pl.step(micro_batches_of(g, sc.m), /*lr=*/0.0f, /*grad_clip=*/0.0f);  // lr 0: grads only
    std::string bad;
    double worst = 0;
    for (int c = 0; c < sc.v && bad.empty(); ++c) {
      bad = compare_with_dense_slices(pl.stage->chunk(c), *dense, /*grads=*/true, kGradRtol, 0.0, &worst);
      if (!bad.empty()) bad = "chunk " + std::to_string(c) + " (" + pl.stage->chunk(c).shard().str() + "): " + bad;
    }
    if (bad.empty() && std::fabs(r.loss - want_loss) > 1e-6 * std::fabs(want_loss)) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "the step's loss %.7g, the dense model's %.7g", r.loss, want_loss);
      bad = buf;
    }
    const std::vector<Action> want = expected_schedule(sc.kind, p, sc.m, sc.v, s);
    if (bad.empty() && !(pl.stage->ran() == want))
      bad = "stage " + std::to_string(s) + " ran \"" + lab06::to_string(pl.stage->ran()) + "\", the schedule is \"" +
            lab06::to_string(want) + "\"";
    EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad.empty() ? bad : case_name(sc, p) + ": " + bad)));
    worst_all = std::max(worst_all, worst);
    measured += (measured.empty() ? "" : ", ") + case_name(sc, p);
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "; worst gradient error %.2g of its tensor's scale (bound %.0e)", worst_all,
                kGradRtol);
  return measured + buf;
}

int64_t step_activation_peak(const ScheduleCase& sc, int64_t* leaked) {
  const GPTConfig cfg = pp_config();
  Pipeline pl = make_pipeline(cfg, sc.kind, sc.m, sc.v);
  return step_activation_peak(pl, sc, leaked);
}

std::string expect_activation_memory(const std::vector<ScheduleCase>& cases) {
  const GPTConfig cfg = pp_config();
  std::string measured;
  for (const ScheduleCase& sc : cases) {
    Pipeline pl = make_pipeline(cfg, sc.kind, sc.m, sc.v);
    const int p = pl.layout.p, s = pl.layout.stage;
    const std::vector<int64_t> set_bytes = set_bytes_per_chunk(*pl.stage);
    const std::vector<int64_t> kept_bytes = kept_bytes_per_chunk(*pl.stage, *pl.exchange);
    int64_t leaked = 0;
    const int64_t got = step_activation_peak(pl, sc, &leaked);
    int sets = 0;
    const int64_t want = peak_bytes_of(expected_schedule(sc.kind, p, sc.m, sc.v, s), set_bytes, &sets, kept_bytes);
    // ZB-H1 keeps at most what 1F1B keeps (Qi et al. 2024, Sec. 3.1): this stage's peak against the LARGEST
    // stage peak of 1F1B with the same m, both from the allocator, on the same model and ranks. The stages'
    // sets differ (the last one holds the head), so "p sets of this stage" would not be 1F1B's memory.
    int64_t one_f_one_b_max = 0;
    if (sc.kind == ScheduleKind::ZbH1) {
      const int64_t mine = step_activation_peak({ScheduleKind::OneFOneB, sc.m, 1});
      for (const std::string& k : grading::rank_reducer().all_gather(std::to_string(mine)))
        one_f_one_b_max = std::max(one_f_one_b_max, static_cast<int64_t>(std::strtoll(k.c_str(), nullptr, 10)));
    }
    const bool within_1f1b = sc.kind != ScheduleKind::ZbH1 || got <= one_f_one_b_max;
    std::string bad;
    if (got != want || leaked != 0 || !within_1f1b) {
      char buf[320];
      std::snprintf(buf, sizeof(buf),
                    "stage %d held %lld bytes of activations at most (%.2f sets of %lld), the "
                    "schedule holds %d sets = %lld bytes; %lld bytes still held after the step",
                    s, static_cast<long long>(got), static_cast<double>(got) / set_bytes.back(),
                    static_cast<long long>(set_bytes.back()), sets, static_cast<long long>(want),
                    static_cast<long long>(leaked));
      bad = buf;
      if (!within_1f1b)
        bad += "; more than 1F1B's largest stage peak, " + std::to_string(one_f_one_b_max) + " bytes";
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad.empty() ? bad : case_name(sc, p) + ": " + bad)));
    // What every stage held, in sets, for the record.
    std::string per_stage;
    for (int t = 0; t < p; ++t) {
      int n = 0;
      peak_bytes_of(expected_schedule(sc.kind, p, sc.m, sc.v, t), set_bytes, &n, kept_bytes);
      per_stage += (t == 0 ? "" : "/") + std::to_string(n);
    }
    measured += (measured.empty() ? "" : "; ") + case_name(sc, p) + ": sets per stage " + per_stage;
    if (sc.kind == ScheduleKind::ZbH1) {  // every stage's peak against 1F1B's largest, KiB
      std::string peaks;
      for (const std::string& k : grading::rank_reducer().all_gather(std::to_string(got))) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(std::strtoll(k.c_str(), nullptr, 10)) / 1024.0);
        peaks += (peaks.empty() ? "" : "/") + std::string(buf);
      }
      char buf[96];
      std::snprintf(buf, sizeof(buf), ", peaks %s KiB <= 1F1B's largest stage %.1f KiB", peaks.c_str(),
                    static_cast<double>(one_f_one_b_max) / 1024.0);
      measured += buf;
    }
  }
  return measured + " (allocator = schedule, exactly)";
}

namespace {

// A double as a string and back, exactly (hexadecimal): the grading reducer gathers strings.
std::string exact(double x) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%a", x);
  return buf;
}

}  // namespace

std::vector<double> simulated_bubbles(const BubbleCase& bc, double* window_ms) {
  const ScheduleCase& sc = bc.schedule;
  const GPTConfig cfg = pp_config();
  SimulatedCluster cluster;
  Pipeline pl = make_pipeline(cfg, sc.kind, sc.m, sc.v, OptimizerConfig::Kind::SGD, SimulatedCluster::free_world());
  const int p = pl.layout.p;
  pl.stage->set_uniform_compute(bc.forward_ms / sc.v, 2 * bc.forward_ms / sc.v);
  const GlobalBatch g = random_global_batch(kDataSeed, sc.m * kMicroBatch, kT, cfg.vocab_size);
  std::vector<MicroBatch> micro;
  for (const MicroBatch& mb : micro_batches_of(g, sc.m))
    micro.push_back({on_device(mb.inputs, Device::SIM), on_device(mb.targets, Device::SIM)});
  pl.world->barrier();  // the ranks' compute streams meet (their models' copies in took different times)
  pl.stage->clear();
  pl.step(micro, 0.0f, 0.0f);
  // The formula's window, over all stages: the first forward's start to the last backward's end. What
  // runs before it (zeroing the gradients) and after it (the tied embedding, the norm, the optimizer) is
  // the step's, not the pipeline's.
  const std::vector<TimeSpan>& spans = pl.stage->spans();
  SL_CHECK(!spans.empty(), "stage %d ran no action", pl.layout.stage);
  const std::vector<std::string> all =
      grading::rank_reducer().all_gather(exact(spans.front().start_ms) + " " + exact(spans.back().end_ms));
  double first = spans.front().start_ms, last = spans.back().end_ms;
  for (const std::string& r : all) {
    double a = 0, b = 0;
    SL_CHECK(std::sscanf(r.c_str(), "%la %la", &a, &b) == 2, "a rank's span times '%s'", r.c_str());
    first = std::min(first, a);
    last = std::max(last, b);
  }
  *window_ms = last - first;
  // Every stage's bubble, to every rank (rank r's in slot r).
  const std::vector<std::string> bubbles =
      grading::rank_reducer().all_gather(exact(1.0 - pl.stage->compute_ms() / *window_ms));
  std::vector<double> out(p);
  for (int r = 0; r < p; ++r) out[r] = std::strtod(bubbles.at(r).c_str(), nullptr);
  return out;
}

std::string expect_bubble_matches_formula(const std::vector<BubbleCase>& cases) {
  std::string measured, failed;
  double worst = 0;  // the largest |measured - formula| of a stage
  for (const BubbleCase& bc : cases) {
    double window_ms = 0;
    const std::vector<double> got = simulated_bubbles(bc, &window_ms);
    const int p = static_cast<int>(got.size());
    lab06::PipelineLayout l;
    l.p = p;
    l.v = bc.schedule.v;
    l.m = bc.schedule.m;
    l.schedule = bc.schedule.kind;
    const double want = lab06::bubble_formula(l);
    std::string per_stage, bad;
    for (int s = 0; s < p; ++s) {
      char buf[120];
      std::snprintf(buf, sizeof(buf), "%.9f", got[s]);
      per_stage += (s == 0 ? "" : "/") + std::string(buf);
      worst = std::max(worst, std::fabs(got[s] - want));
      if (!(std::fabs(got[s] - want) <= kBubbleTol)) {
        std::snprintf(buf, sizeof(buf), "stage %d's bubble %.12f, the formula %.12f (%.2g apart)", s, got[s], want,
                      got[s] - want);
        bad += (bad.empty() ? "" : ", ") + std::string(buf);
      }
    }
    char head[200];
    std::snprintf(head, sizeof(head), "%s, F %.0f ms: window %.3f ms, formula %.9f, per stage ",
                  case_name(bc.schedule, p).c_str(), bc.forward_ms, window_ms, want);
    measured += (measured.empty() ? "" : "; ") + std::string(head) + per_stage;
    if (!bad.empty()) failed += (failed.empty() ? "" : "; ") + case_name(bc.schedule, p) + ": " + bad;
  }
  // Every rank measured every stage's bubble (all_gather): one verdict, the same on all.
  char tol[64];
  std::snprintf(tol, sizeof(tol), " (more than %.0e apart)", kBubbleTol);
  EXPECT_TRUE(grading::all_ranks(failed.empty(), failed.empty() ? failed : failed + tol));
  char tail[120];
  std::snprintf(tail, sizeof(tail), "; simulated H100s, free link, virtual time; worst |bubble - formula| %.2g", worst);
  return measured + tail;
}

std::string expect_bad_layouts_refused() {
  const int p = world().size(), s = world().rank();
  const GPTConfig cfg = pp_config();  // 8 layers
  const lab06::PipelineLayout good = lab06::make_layout(cfg, p, s, ScheduleKind::Interleaved, 2 * p, 2);
  const bool good_ok = good.p == p && good.v == 2 && good.m == 2 * p && good.stage == s &&
                       good.schedule == ScheduleKind::Interleaved;
  EXPECT_TRUE(grading::all_ranks(good_ok, on_rank("interleaved, m = 2p, v = 2 should be accepted as given")));
  GPTConfig shallow = cfg;
  shallow.n_layer = p - 1;  // fewer layers than stages
  struct Bad {
    const char* what;
    GPTConfig cfg;
    ScheduleKind kind;
    int m, v;
  };
  const std::vector<Bad> bad = {
      {"more stages than layers", shallow, ScheduleKind::OneFOneB, 4, 1},
      {"interleaved with m not a multiple of p", cfg, ScheduleKind::Interleaved, p + 1, 2},
      {"interleaved with m < p", cfg, ScheduleKind::Interleaved, p / 2, 2},
      {"v not dividing the layers per stage", cfg, ScheduleKind::Interleaved, p, 3},
      {"chunks with a schedule that has none", cfg, ScheduleKind::OneFOneB, 4, 2},
      {"no micro-batches", cfg, ScheduleKind::GPipe, 0, 1},
  };
  int refused = 0;
  std::string missed;
  for (const Bad& b : bad) {
    try {
      lab06::make_layout(b.cfg, p, s, b.kind, b.m, b.v);
      missed += (missed.empty() ? "" : ", ") + std::string(b.what);
    } catch (const NotImplemented&) {
      throw;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_TRUE(grading::all_ranks(missed.empty(), on_rank_if(missed.empty() ? missed : "accepted: " + missed)));
  return "the good layout as given; " + std::to_string(refused) + " of " + std::to_string(bad.size()) +
         " bad layouts refused on every rank";
}

}  // namespace scalelab::lab06_test
