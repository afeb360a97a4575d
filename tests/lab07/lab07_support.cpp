// lab07_support.cpp — what lab 07's graded checks share (lab07_support.h).
#include "lab07_support.h"

#include <gtest/gtest.h>  // defines: EXPECT_TRUE

#include <algorithm>  // defines: std::max
#include <cmath>      // defines: std::fabs, std::sqrt
#include <cstdio>     // defines: std::snprintf
#include <cstring>    // defines: std::strlen
#include <utility>    // defines: std::pair

#include "grading.h"                  // defines: grading::all_ranks
#include "scalelab/core/allocator.h"  // defines: Allocator, MemCategory
#include "scalelab/core/error.h"      // defines: scalelab::Error, NotImplemented

namespace scalelab::lab07_test {

GPTConfig grid_config() { return GPTConfig{16, 64, 4, 2, 16}; }

const std::vector<std::string>& all_orders() {
  static const std::vector<std::string> orders = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                                  "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};
  return orders;
}

namespace {

std::string on_rank_if(const std::string& s) { return s.empty() ? s : on_rank(s); }

std::string list(const std::vector<int>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

// The axes of an order, fastest first, by name: "tp-dp-pp" -> "tp", "dp", "pp" (the test's own parse).
std::vector<std::string> axis_names(const std::string& order) {
  return {order.substr(0, 2), order.substr(3, 2), order.substr(6, 2)};
}

int size_of(const lab07::Grid& g, const std::string& axis) { return axis == "tp" ? g.tp : axis == "pp" ? g.pp : g.dp; }

int stride_of(const lab07::Grid& g, const std::string& axis) {
  int stride = 1;
  for (const std::string& a : axis_names(g.order)) {
    if (a == axis) return stride;
    stride *= size_of(g, a);
  }
  return 0;
}

// The group along `axis` of rank r: r + (i - c) stride, i = 0 .. size - 1.
std::vector<int> strided_group(const lab07::Grid& g, const std::string& axis, int r) {
  const int stride = stride_of(g, axis), size = size_of(g, axis), c = (r / stride) % size;
  std::vector<int> out;
  for (int i = 0; i < size; ++i) out.push_back(r + (i - c) * stride);
  return out;
}

}  // namespace

std::vector<TableRow> expected_table(const lab07::Grid& g) {
  std::vector<TableRow> rows;
  for (int r = 0; r < g.world_size(); ++r) {
    TableRow row;
    row.coords.tp_rank = (r / stride_of(g, "tp")) % g.tp;
    row.coords.pp_rank = (r / stride_of(g, "pp")) % g.pp;
    row.coords.dp_rank = (r / stride_of(g, "dp")) % g.dp;
    row.tp = strided_group(g, "tp", r);
    row.pp = strided_group(g, "pp", r);
    row.dp = strided_group(g, "dp", r);
    if (row.coords.pp_rank == 0 || row.coords.pp_rank == g.pp - 1) {
      row.embedding.push_back(row.pp.front());               // the first stage of my pipeline
      if (g.pp > 1) row.embedding.push_back(row.pp.back());  // and the last
    }
    rows.push_back(row);
  }
  return rows;
}

std::string case_name(const Case& c) {
  std::string s = c.grid.describe() + " " + lab06::schedule_name(c.schedule) + " m " + std::to_string(c.m);
  if (c.v > 1) s += " v " + std::to_string(c.v);
  return c.zero1 ? s + " ZeRO-1" : s;
}

Run3D make_run(const GPTConfig& cfg, const Case& c, OptimizerConfig::Kind optimizer) {
  Run3D run;
  run.world = fresh_comm();
  run.layout = lab07::make_layout(cfg, c.grid, run.world->size(), run.world->rank(), c.schedule, c.m, c.v, 0, false);
  OptimizerConfig oc;
  oc.kind = optimizer;
  run.rank =
      lab07::build_rank(*run.world, cfg, run.layout, oc, PrecisionPolicy::fp32(), Device::CPU, kModelSeed, c.zero1);
  return run;
}

std::vector<MicroBatch> replica_micro_batches(const GlobalBatch& g, int d, int m) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < m; ++i) {
    const GlobalBatch rows = batch_rows(g, (static_cast<int64_t>(d) * m + i) * kMicroBatch, kMicroBatch);
    out.push_back({rows.inputs, rows.targets});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The grid

std::string expect_grid_arithmetic(const std::vector<lab07::Grid>& grids) {
  std::string bad;
  int checked = 0;
  for (const lab07::Grid& sizes : grids) {
    for (const std::string& order : all_orders()) {
      lab07::Grid g = sizes;
      g.order = order;
      const std::vector<TableRow> table = expected_table(g);
      for (int r = 0; r < g.world_size() && bad.empty(); ++r) {
        const TableRow& want = table[r];
        const GridCoords got = lab07::coords_of(g, r);
        char buf[256];
        if (!(got == want.coords)) {
          std::snprintf(buf, sizeof(buf),
                        "%s: coords_of(%d) = (tp %d, pp %d, dp %d), the table's (tp %d, pp %d, dp %d)",
                        g.describe().c_str(), r, got.tp_rank, got.pp_rank, got.dp_rank, want.coords.tp_rank,
                        want.coords.pp_rank, want.coords.dp_rank);
          bad = buf;
        } else if (lab07::rank_of(g, want.coords) != r) {
          std::snprintf(buf, sizeof(buf), "%s: rank_of(tp %d, pp %d, dp %d) = %d, the table's %d", g.describe().c_str(),
                        want.coords.tp_rank, want.coords.pp_rank, want.coords.dp_rank, lab07::rank_of(g, want.coords),
                        r);
          bad = buf;
        }
        const std::pair<GridAxis, const std::vector<int>*> groups[] = {
            {GridAxis::TP, &want.tp}, {GridAxis::PP, &want.pp}, {GridAxis::DP, &want.dp}};
        for (const auto& [axis, members] : groups) {
          const std::vector<int> got_members = lab07::group_members(g, axis, r);
          if (bad.empty() && got_members != *members)
            bad = g.describe() + ": group_members(" + grid_axis_name(axis) + ", " + std::to_string(r) +
                  ") = " + list(got_members) + ", the table's " + list(*members);
        }
        const std::vector<int> got_emb = lab07::embedding_members(g, r);
        if (bad.empty() && got_emb != want.embedding)
          bad = g.describe() + ": embedding_members(" + std::to_string(r) + ") = " + list(got_emb) + ", the table's " +
                list(want.embedding);
        ++checked;
      }
    }
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  return std::to_string(checked) + " (grid, order, rank) rows: coordinates, inverse, tp/pp/dp and embedding members";
}

std::string expect_groups_from_splits(const lab07::Grid& sizes, int ranks_per_node) {
  const GPTConfig cfg = grid_config();
  std::string bad;
  int links_inside = 0, links_across = 0;
  for (const std::string& order : all_orders()) {
    lab07::Grid g = sizes;
    g.order = order;
    std::unique_ptr<Communicator> world = fresh_comm();
    Topology t;
    t.ranks_per_node = ranks_per_node;
    t.intra = LinkModel::preset("nvlink");
    t.inter = LinkModel::preset("infiniband");
    if (ranks_per_node > 0) world->set_topology(t);
    const int me = world->rank();
    const lab07::Layout layout =
        lab07::make_layout(cfg, g, world->size(), me, ScheduleKind::OneFOneB, 2, 1, ranks_per_node, false);
    lab07::Groups groups = lab07::make_groups(*world, layout);
    const TableRow want = expected_table(g)[me];
    struct Expect {
      const char* name;
      Communicator* comm;
      const std::vector<int>* members;
      int rank;
    };
    const int emb_rank = want.coords.pp_rank == 0 ? 0 : 1;
    const std::vector<Expect> expects = {{"tp", groups.tp.get(), &want.tp, want.coords.tp_rank},
                                         {"pp", groups.pp.get(), &want.pp, want.coords.pp_rank},
                                         {"dp", groups.dp.get(), &want.dp, want.coords.dp_rank},
                                         {"embedding", groups.embedding.get(), &want.embedding, emb_rank}};
    for (const Expect& e : expects) {
      std::string problem;
      if (e.members->empty()) {
        if (e.comm != nullptr) problem = "a middle stage got an embedding group " + list(e.comm->world_ranks());
      } else if (e.comm == nullptr) {
        problem = "no group, the table's " + list(*e.members);
      } else if (e.comm->world_ranks() != *e.members) {
        problem = "members " + list(e.comm->world_ranks()) + ", the table's " + list(*e.members);
      } else if (e.comm->rank() != e.rank) {
        problem = "rank " + std::to_string(e.comm->rank()) + " in it, the table's " + std::to_string(e.rank);
      } else if (e.comm->name() != e.name) {
        problem = "named '" + e.comm->name() + "'";
      } else if (ranks_per_node > 0) {
        bool inside = true;
        for (int r : *e.members) inside = inside && r / ranks_per_node == e.members->front() / ranks_per_node;
        (inside ? links_inside : links_across) += 1;
        const std::string want_link = inside ? "nvlink" : "infiniband";
        if (e.comm->link_model().name != want_link)
          problem = "link " + e.comm->link_model().name + ", its members " + std::string(inside ? "share" : "span") +
                    " nodes: " + want_link;
      }
      if (bad.empty() && !problem.empty())
        bad = g.describe() + ", rank " + std::to_string(me) + ", " + e.name + " group: " + problem;
    }
    // Every member of each group agrees on who is in it: gather every member's world rank.
    for (const Expect& e : expects) {
      if (e.comm == nullptr || e.comm->world_ranks() != *e.members) continue;
      const int n = e.comm->size();
      Tensor mine = Tensor::empty({1}, DType::I32), all = Tensor::empty({n}, DType::I32);
      mine.data<int32_t>()[0] = dp_test::world().rank();
      e.comm->all_gather(mine, all, std::string(e.name) + ": who is here");
      for (int i = 0; i < n; ++i)
        if (bad.empty() && all.data<int32_t>()[i] != (*e.members)[i])
          bad = g.describe() + ", " + e.name + " group of rank " + std::to_string(me) + ": member " +
                std::to_string(i) + " is world rank " + std::to_string(all.data<int32_t>()[i]) + ", the table's " +
                std::to_string((*e.members)[i]);
    }
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  // The sizes alone: `sizes` has no order (Grid::describe would print "(order )"); every order was checked.
  std::string measured = "tp " + std::to_string(sizes.tp) + " x pp " + std::to_string(sizes.pp) + " x dp " +
                         std::to_string(sizes.dp) +
                         " in all 6 orders: 4 groups of every rank as the table, members agree";
  if (ranks_per_node > 0)
    measured += "; " + std::to_string(ranks_per_node) + " ranks per node: rank 0's groups " +
                std::to_string(links_inside) + " inside a node (nvlink), " + std::to_string(links_across) +
                " across (infiniband)";
  return measured;
}

// ---------------------------------------------------------------------------------------------
// The step against the dense model

enum class Measure { Loss, Norm, Grad };  // what why_step_differs is told a ratio of
static std::string why_step_differs(const Case& c, double ratio, Measure what);

// The dense model's gradient of `p`, cut as this chunk holds it.
static Tensor dense_grad_slice(const GPT2& chunk, const GPT2& dense, const ParamInfo& p) {
  Tensor want = Tensor::empty(p.shape, DType::F32);
  copy_dense_to_shard(p, chunk.shard(), dense.grad(p.name), want);
  return want;
}

// The failure's kind, for a gradient tensor that compare_with_dense_slices named ("dh.0.attn.c_attn.weight[3]
// = ..."): its least-squares scale against the dense slice, s = <got, want> / <want, want>, and what is
// left, |got - s want| / |want|. Nothing left: a pure scale, whose factor why_step_differs names (m, dp,
// tp). Something left: not a scale but other numbers: a gradient that missed a sync, or was mixed over
// the wrong group. The tied wte alone wrong, every other tensor of the chunk right: its two copies were not
// summed (the embedding group); anything else: the replicas' group.
static std::string why_gradient_differs(const Case& c, const GPT2& chunk, const GPT2& dense, const std::string& bad) {
  if (bad.rfind("d", 0) != 0 || bad.find('[') == std::string::npos) return bad;
  const std::string name = bad.substr(1, bad.find('[') - 1);
  const ParamInfo* info = nullptr;
  bool others_right = true;
  for (const ParamInfo& p : chunk.param_table()) {
    if (p.name == name) info = &p;
    else if (others_right)
      others_right =
          compare_tensors(p.name, chunk.grad(p.name), dense_grad_slice(chunk, dense, p), kGradRtol, 0).empty();
  }
  if (info == nullptr) return bad;
  const Tensor got = chunk.grad(name), want = dense_grad_slice(chunk, dense, *info);
  double gw = 0, ww = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    gw += static_cast<double>(got.data<float>()[i]) * want.data<float>()[i];
    ww += static_cast<double>(want.data<float>()[i]) * want.data<float>()[i];
  }
  if (ww == 0) return bad;
  const double scale = gw / ww;
  double rest = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = got.data<float>()[i] - scale * want.data<float>()[i];
    rest += d * d;
  }
  rest = std::sqrt(rest / ww);
  if (rest < 1e-3) return bad + ": the whole tensor is " + why_step_differs(c, scale, Measure::Grad);
  char buf[400];
  if (name == "wte" && c.grid.pp > 1 && others_right)
    std::snprintf(buf, sizeof(buf),
                  ": not a scale of the dense gradient (%.2g of it left after the best scale, %.3fx), and every "
                  "other tensor of the chunk is right: this stage's copy of the tied wte holds only its own part; "
                  "the two copies' sum is the embedding group's (lab07-6 train_step)",
                  rest, scale);
  else
    std::snprintf(buf, sizeof(buf),
                  ": not a scale of the dense gradient (%.2g of it left after the best scale, %.3fx): one replica's "
                  "gradient alone, or one mixed over the wrong group: which ranks hold copies of this tensor, "
                  "which hold other slices or other layers? (lab07-5 average_over_dp, the groups of lab07-6)",
                  rest, scale);
  return bad + buf;
}

std::string expect_gradients_match_dense(const std::vector<Case>& cases) {
  const GPTConfig cfg = grid_config();
  std::string measured;
  double worst_all = 0;
  for (const Case& c : cases) {
    Run3D run = make_run(cfg, c);
    const int dp = c.grid.dp, d = run.layout.coords.dp_rank;
    const GlobalBatch g = random_global_batch(kDataSeed + c.m, dp * c.m * kMicroBatch, kT, cfg.vocab_size);
    std::unique_ptr<GPT2> dense = make_model(cfg);
    const float want_loss = one_process_gradients(*dense, g);
    const StepResult r = lab07::train_step(*run.rank, replica_micro_batches(g, d, c.m), 0.0f, 0.0f);  // lr 0
    std::string bad;
    double worst = 0;
    for (int k = 0; k < c.v && bad.empty(); ++k) {
      GPT2& chunk = run.rank->stage->chunk(k);
      bad = compare_with_dense_slices(chunk, *dense, /*grads=*/true, kGradRtol, 0.0, &worst);
      if (!bad.empty())
        bad = "chunk " + std::to_string(k) + " (" + chunk.shard().str() +
              "): " + why_gradient_differs(c, chunk, *dense, bad);
    }
    if (bad.empty() && std::fabs(r.loss - want_loss) > 2e-6 * std::fabs(want_loss)) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "the step's loss %.7g, the dense model's %.7g (the global batch's mean)", r.loss,
                    want_loss);
      bad = buf;
    }
    EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad.empty() ? bad : case_name(c) + ": " + bad)));
    worst_all = std::max(worst_all, worst);
    measured += (measured.empty() ? "" : ", ") + case_name(c);
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "; worst gradient error %.2g of its tensor's scale (bound %.0e)", worst_all,
                kGradRtol);
  return measured + buf;
}

// What a step's loss, norm or gradient that differs from the dense model's points to, from their ratio
// (mine / dense). The step's own arithmetic makes whole factors: a factor of m or of dp is a sum where a mean
// belongs, or a divide done twice (the micro-batches' 1/m, the replicas' average); for a gradient also tp
// (a tensor-parallel group's sum where each rank already holds its slice's whole gradient); the square root
// of a group's size (dp, tp, pp) is a norm summed over the wrong groups (copies counted k times, or k
// slices left out). Anything else: the generic pointer. Within 2 %, as lab 05's step check.
static std::string why_step_differs(const Case& c, double ratio, Measure what) {
  const bool norm = what == Measure::Norm;
  using Sizes = std::vector<std::pair<std::string, int>>;
  const char* todo = c.zero1 ? "lab07-7 zero1_update" : "lab07-6 train_step";
  auto near = [&](double want) { return std::fabs(ratio / want - 1) < 0.02; };
  auto named = [&](const Sizes& sizes, bool root) {  // "m 2, dp 2": the sizes k > 1 the ratio is near (the root of)
    std::string names;
    for (const auto& [name, k] : sizes) {
      const double f = root ? std::sqrt(static_cast<double>(k)) : k;
      if (k > 1 && (near(f) || near(1 / f))) names += (names.empty() ? "" : ", ") + name + " " + std::to_string(k);
    }
    return names;
  };
  const int m = c.m, dp = c.grid.dp, cp = c.grid.cp;
  Sizes means = {{"m", m}, {"dp", dp}, {"m x dp", m > 1 && dp > 1 ? m * dp : 1}};  // the step's divisors
  if (cp > 1) means.insert(means.end(), {{"cp", cp}, {"cp x dp", dp > 1 ? cp * dp : 1}});  // the dp-cp group's
  if (what == Measure::Grad) means.push_back({"tp", c.grid.tp});
  const Sizes groups = {{"dp", dp}, {"tp", c.grid.tp}, {"pp", c.grid.pp}, {"cp", cp}};  // what a norm sums over
  char buf[400];
  if (const std::string f = named(means, false); !f.empty()) {
    std::snprintf(buf, sizeof(buf),
                  "%.3fx, a whole factor (%s): a sum where a mean belongs, or a divide done twice: the mean over "
                  "the m micro-batches, the replicas' average (%s; lab07-5 average_over_dp)",
                  ratio, f.c_str(), todo);
  } else if (const std::string r = named(groups, true); norm && !r.empty()) {
    std::snprintf(buf, sizeof(buf),
                  "%.3fx, the square root of a group's size (%s): the norm sums over the wrong groups: which "
                  "hold different parts of the model, which hold copies of the same part? (%s)",
                  ratio, r.c_str(), todo);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3fx (%s; README 'One training step')", ratio, todo);
  }
  return buf;
}

std::string expect_steps_match_dense(const Case& c, OptimizerConfig::Kind optimizer, int steps, float lr,
                                     float grad_clip) {
  const GPTConfig cfg = grid_config();
  Run3D run = make_run(cfg, c, optimizer);
  std::unique_ptr<GPT2> dense = make_model(cfg);
  OptimizerConfig oc;
  oc.kind = optimizer;
  Optimizer dense_opt(*dense, oc);
  const int dp = c.grid.dp, d = run.layout.coords.dp_rank;
  std::string bad;
  double worst_loss = 0, worst_param = 0;
  float first = 0, last = 0;
  int clipped = 0;
  for (int step = 0; step < steps; ++step) {  // every step on every rank: one that stopped early would hang the others
    const GlobalBatch g = random_global_batch(kDataSeed + 30 + step, dp * c.m * kMicroBatch, kT, cfg.vocab_size);
    // cp > 1: every rank of the replica takes its cp slice of the same whole sequences (given: cp_slices)
    const std::vector<MicroBatch> mine = lab07::cp_slices(*run.rank, replica_micro_batches(g, d, c.m));
    const StepResult r = lab07::train_step(*run.rank, mine, lr, grad_clip);
    const OneProcessStep want = one_process_train_step(*dense, dense_opt, g, lr, grad_clip);
    if (step == 0) first = want.loss;
    last = want.loss;
    clipped += grad_clip > 0 && want.grad_norm > grad_clip ? 1 : 0;
    const double rel = std::fabs(r.loss - want.loss) / std::fabs(want.loss);
    worst_loss = std::max(worst_loss, rel);
    if (bad.empty() && (rel > 1e-5 || std::fabs(r.grad_norm - want.grad_norm) > 1e-5 * want.grad_norm)) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "step %d: loss %.7g norm %.7g, the dense model's loss %.7g norm %.7g", step,
                    r.loss, r.grad_norm, want.loss, want.grad_norm);
      // The loss first: a wrong loss says nothing of the norm; the norm is judged only with the loss right.
      bad = std::string(buf) +
            (rel > 1e-5 ? ": the loss is " + why_step_differs(c, r.loss / want.loss, Measure::Loss)
                        : ": the norm is " + why_step_differs(c, r.grad_norm / want.grad_norm, Measure::Norm));
    }
  }
  // SGD: every parameter too. Not after AdamW: it divides each gradient by its own running size, so an entry
  // whose gradient is rounding noise moves by lr either way (measured: 3e-6 apart on a bias after 5 steps).
  for (int k = 0; k < c.v && bad.empty() && optimizer == OptimizerConfig::Kind::SGD; ++k)
    bad = compare_with_dense_slices(run.rank->stage->chunk(k), *dense, /*grads=*/false, 1e-5, 0, &worst_param);
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad.empty() ? bad : case_name(c) + ": " + bad)));
  char buf[240];
  std::snprintf(buf, sizeof(buf), "%s, %d %s steps (%d clipped): loss %.4f -> %.4f, worst loss difference %.2g",
                case_name(c).c_str(), steps, optimizer == OptimizerConfig::Kind::SGD ? "SGD" : "AdamW", clipped, first,
                last, worst_loss);
  if (optimizer == OptimizerConfig::Kind::SGD)
    std::snprintf(buf + std::strlen(buf), sizeof(buf) - std::strlen(buf), ", parameters %.2g", worst_param);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// What each group carries

namespace {

int64_t tensor_bytes(Communicator* c) {
  if (c == nullptr) return 0;
  int64_t bytes = 0;
  for (const CommEvent& e : c->events())
    if (e.count > kScalarElements) bytes += e.payload_bytes;
  return bytes;
}

}  // namespace

std::string expect_group_bytes(const std::vector<Case>& cases) {
  const GPTConfig cfg = grid_config();
  const int64_t B = kMicroBatch, T = kT, C = cfg.n_embd, V = cfg.vocab_size;
  const int64_t btc = B * T * C * 4, n_rows = B * T;  // bytes of one (B, T, C) fp32 activation; rows
  std::string measured, bad;
  for (const Case& c : cases) {
    Run3D run = make_run(cfg, c);
    lab07::Rank3D& r = *run.rank;
    const GlobalBatch g = random_global_batch(kDataSeed, c.grid.dp * c.m * kMicroBatch, kT, cfg.vocab_size);
    const std::vector<MicroBatch> micro = replica_micro_batches(g, run.layout.coords.dp_rank, c.m);
    lab07::train_step(r, micro, 0.0f, 0.0f);  // the first step: lazy allocations; then count the second
    std::vector<Communicator*> comms = {r.groups.tp.get(), r.groups.pp.get(), &r.exchange->gradient_channel(),
                                        r.groups.dp.get(), r.groups.embedding.get()};
    for (Communicator* comm : comms)
      if (comm != nullptr) comm->clear_events();
    lab07::train_step(r, micro, 0.0f, 0.0f);

    // What the layout must move, per step, from this rank's shards (README "What each group carries").
    int64_t want_tp = 0, want_pp = 0, want_dp = 0, want_emb = 0;
    const int p = c.grid.pp, s = run.layout.coords.pp_rank;
    for (int k = 0; k < c.v; ++k) {
      GPT2& chunk = r.stage->chunk(k);
      const ModelShard& sh = chunk.shard();
      const int layers = sh.last(cfg) - sh.first_layer + 1;
      const bool first = k == 0 && s == 0, last = k == c.v - 1 && s == p - 1;  // of the virtual pipeline
      if (c.grid.tp > 1) {
        // per micro-batch: each block's g forward (attention, MLP) and f backward (their inputs), the
        // embedding's sum, the head's f backward and the cross-entropy's max and two sums over the rows
        const int64_t per_mb = layers * 4 * btc + (sh.has_embedding ? btc : 0) +
                               (sh.has_head ? btc + 3 * n_rows * 4 : 0);
        want_tp += c.m * per_mb;
      }
      // per micro-batch: an activation sent and a gradient received unless last; the reverse unless first
      want_pp += c.m * 2 * btc * ((last ? 0 : 1) + (first ? 0 : 1));
      if (c.grid.dp > 1)
        for (int u = 0; u < chunk.num_units(); ++u)
          if (chunk.owns_unit(u)) want_dp += chunk.unit_grads(u).numel() * 4;
    }
    if (p > 1 && (s == 0 || s == p - 1)) want_emb = V / c.grid.tp * C * 4;  // this rank's rows of wte's gradient
    const int64_t got_tp = tensor_bytes(r.groups.tp.get());
    const int64_t got_pp = tensor_bytes(r.groups.pp.get()) + tensor_bytes(&r.exchange->gradient_channel());
    const int64_t got_dp = tensor_bytes(r.groups.dp.get()), got_emb = tensor_bytes(r.groups.embedding.get());
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  "tp %lld, pp %lld, dp %lld, embedding %lld bytes; the layout's tp %lld, pp %lld, "
                  "dp %lld, embedding %lld",
                  static_cast<long long>(got_tp), static_cast<long long>(got_pp), static_cast<long long>(got_dp),
                  static_cast<long long>(got_emb), static_cast<long long>(want_tp), static_cast<long long>(want_pp),
                  static_cast<long long>(want_dp), static_cast<long long>(want_emb));
    if (bad.empty() && (got_tp != want_tp || got_pp != want_pp || got_dp != want_dp || got_emb != want_emb))
      bad = case_name(c) + ", rank " + std::to_string(run.world->rank()) + ": " + buf;
    if (run.world->rank() == 0) measured += (measured.empty() ? "" : "; ") + case_name(c) + " rank 0: " + buf;
  }
  EXPECT_TRUE(grading::all_ranks(bad.empty(), on_rank_if(bad)));
  return measured;
}

// ---------------------------------------------------------------------------------------------
// ZeRO-1

std::string expect_zero1_state_sharded(const Case& c) {
  const GPTConfig cfg = grid_config();
  Allocator& a = Allocator::get(Device::CPU);
  const int os = static_cast<int>(MemCategory::OptimizerState);
  const int64_t before = a.stats().current_bytes[os];
  Run3D run = make_run(cfg, c, OptimizerConfig::Kind::AdamW);
  lab07::Rank3D& r = *run.rank;
  const int dp = c.grid.dp, d = run.layout.coords.dp_rank;
  const GlobalBatch g = random_global_batch(kDataSeed, dp * c.m * kMicroBatch, kT, cfg.vocab_size);
  const std::vector<MicroBatch> micro = replica_micro_batches(g, d, c.m);
  lab07::train_step(r, micro, 1e-2f, 1.0f);
  r.groups.dp->clear_events();
  lab07::train_step(r, micro, 1e-2f, 1.0f);
  const int64_t got_state = a.stats().current_bytes[os] - before;
  // What ZeRO-1 keeps (the padded layout of lab 04: shard = ceil(n / dp)), computed here from the chunks.
  int64_t want_state = 0, full_state = 0, want_dp = 0;
  for (int k = 0; k < c.v; ++k) {
    GPT2& chunk = r.stage->chunk(k);
    for (int u = 0; u < chunk.num_units(); ++u) {
      if (!chunk.owns_unit(u)) continue;
      const int64_t n = chunk.unit_params(u).numel(), shard = (n + dp - 1) / dp;
      want_state += 2 * shard * 4;  // AdamW's m and v, fp32
      full_state += 2 * n * 4;
      want_dp += dp * shard * 4 + shard * 4;  // the reduce-scatter's padded input, the all-gather's chunk
    }
  }
  const int64_t got_dp = tensor_bytes(r.groups.dp.get());
  std::string other_ops;  // ZeRO-1's dp traffic is reduce-scatters and all-gathers; an all-reduce is plain dp
  for (const CommEvent& e : r.groups.dp->events())
    if (e.count > kScalarElements && e.op != "reduce_scatter" && e.op != "all_gather") other_ops += " " + e.op;
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "rank %d: optimizer state %lld bytes (ZeRO-1 of dp %d: %lld; unsharded %lld), dp "
                "group %lld bytes a step (%lld)",
                run.world->rank(), static_cast<long long>(got_state), dp, static_cast<long long>(want_state),
                static_cast<long long>(full_state), static_cast<long long>(got_dp), static_cast<long long>(want_dp));
  const bool ok = got_state == want_state && got_dp == want_dp && other_ops.empty();
  EXPECT_TRUE(grading::all_ranks(ok, on_rank_if(ok ? ""
                                                   : case_name(c) + ": " + buf +
                                                         (other_ops.empty() ? ""
                                                                            : "; the dp group also did" + other_ops))));
  return case_name(c) + ": " + buf;
}

// ---------------------------------------------------------------------------------------------
// Bad layouts

std::string expect_bad_layouts_refused() {
  const int n = world().size(), me = world().rank();
  const GPTConfig cfg = grid_config();  // NH 2, L 4
  struct Bad {
    const char* what;
    lab07::Grid grid;
    ScheduleKind schedule;
    int m, v, ranks_per_node;
    bool rule;
    const char* must_say;  // a number or word the message must contain
  };
  const int half = n / 2;
  const std::vector<Bad> bad = {
      {"tp x pp x dp above the ranks", {2, 2, n / 2, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1, 0, false, "ranks"},
      {"tp x pp x dp below the ranks", {1, 1, half, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1, 0, false, "ranks"},
      {"tp not dividing the heads", {n, 1, 1, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1, 0, false, "2"},
      {"not a permutation", {2, half, 1, "tp-pp"}, ScheduleKind::OneFOneB, 2, 1, 0, false, "tp-pp"},
      {"a size of 0", {0, 2, half, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1, 0, false, "0"},
      {"more stages than layers", {1, n, 1, "tp-dp-pp"}, ScheduleKind::OneFOneB, 2, 1, 0, false, "layer"},
      {"interleaved with m not a multiple of pp",
       {2, 2, half / 2, "tp-dp-pp"},
       ScheduleKind::Interleaved,
       3,
       2,
       0,
       false,
       "3"},
      {"a tp group across nodes under the rule",
       {2, 2, half / 2, "pp-dp-tp"},
       ScheduleKind::OneFOneB,
       2,
       1,
       half,
       true,
       "node"},
  };
  // The good ones: the rule kept (tp first, tp dividing the node), and the same placement without the rule.
  const std::vector<Bad> good = {
      {"the lesson's placement under the rule",
       {2, 2, half / 2, "tp-dp-pp"},
       ScheduleKind::OneFOneB,
       2,
       1,
       half,
       true,
       ""},
      {"tp across nodes without the rule", {2, 2, half / 2, "pp-dp-tp"}, ScheduleKind::OneFOneB, 2, 1, half, false, ""},
  };
  std::string missed, unclear, refused_good;
  int refused = 0, cases = 0;
  for (const Bad& b : bad) {
    if (std::string(b.what) == "more stages than layers" && n <= cfg.n_layer) continue;  // needs n > L
    ++cases;
    try {
      lab07::make_layout(cfg, b.grid, n, me, b.schedule, b.m, b.v, b.ranks_per_node, b.rule);
      missed += (missed.empty() ? "" : ", ") + std::string(b.what);
    } catch (const NotImplemented&) {
      throw;
    } catch (const Error& e) {
      ++refused;
      if (std::string(e.what()).find(b.must_say) == std::string::npos)
        unclear += (unclear.empty() ? "" : "; ") + std::string(b.what) + " (no '" + b.must_say + "' in: " + e.what() +
                   ")";
    }
  }
  for (const Bad& b : good) {
    try {
      const lab07::Layout l = lab07::make_layout(cfg, b.grid, n, me, b.schedule, b.m, b.v, b.ranks_per_node, b.rule);
      const TableRow want = expected_table(b.grid)[me];
      if (!(l.coords == want.coords) || l.pipeline.stage != want.coords.pp_rank || l.pipeline.p != b.grid.pp)
        refused_good += (refused_good.empty() ? "" : ", ") + std::string(b.what) + ": wrong coordinates or stage";
    } catch (const NotImplemented&) {
      throw;
    } catch (const Error& e) {
      refused_good += (refused_good.empty() ? "" : ", ") + std::string(b.what) + " (" + e.what() + ")";
    }
  }
  // Mixed placements, judged for every rank of a 6-rank world whatever the real one (make_layout takes the
  // world size and the rank as arguments): tp 2 x dp 3 on 2 nodes of 3 ranks puts group {2, 3} across the
  // nodes and {0, 1}, {4, 5} inside them, so a rule that looks only at the calling rank's own group accepts on
  // ranks 0, 1, 4 and 5. On 3 nodes of 2 every group is inside a node: accepted on every rank.
  const lab07::Grid mixed{2, 1, 3, "tp-dp-pp"};
  constexpr int kMixedWorld = 6;
  std::string mixed_missed, mixed_refused;
  for (const int per_node : {3, 2}) {
    std::string ranks;  // the ranks that decided against the rule's verdict
    for (int r = 0; r < kMixedWorld; ++r) {
      bool threw = false;
      try {
        lab07::make_layout(cfg, mixed, kMixedWorld, r, ScheduleKind::OneFOneB, 2, 1, per_node, true);
      } catch (const NotImplemented&) {
        throw;
      } catch (const Error& e) {
        threw = true;
        if (per_node == 3 && std::string(e.what()).find("node") == std::string::npos && unclear.empty())
          unclear = std::string("the mixed placement (no 'node' in: ") + e.what() + ")";
      }
      if (threw != (per_node == 3)) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (per_node == 3 && !ranks.empty())
      mixed_missed = mixed.describe() + " on 2 nodes of 3 ranks (group 2-3 across nodes, 0-1 and 4-5 not) on ranks " +
                     ranks + " of 6: every rank must refuse, the rule is about every tp group (lab07-3 make_layout)";
    if (per_node == 2 && !ranks.empty())
      mixed_refused = mixed.describe() + " on 3 nodes of 2 ranks (every group inside a node) on ranks " + ranks +
                      " of 6";
  }
  ++cases;
  if (mixed_missed.empty()) ++refused;
  if (!mixed_missed.empty()) missed += (missed.empty() ? "" : ", ") + mixed_missed;
  if (!mixed_refused.empty()) refused_good += (refused_good.empty() ? "" : ", ") + mixed_refused;
  EXPECT_TRUE(grading::all_ranks(missed.empty(), on_rank_if(missed.empty() ? missed : "accepted: " + missed)));
  EXPECT_TRUE(grading::all_ranks(refused_good.empty(),
                                 on_rank_if(refused_good.empty() ? "" : "refused: " + refused_good)));
  EXPECT_TRUE(grading::all_ranks(unclear.empty(), on_rank_if(unclear.empty() ? "" : "unclear: " + unclear)));
  return std::to_string(refused) + " of " + std::to_string(cases) +
         " bad layouts refused on every rank, naming the "
         "numbers (a mixed placement on all 6 ranks of a virtual world); the 3 good ones accepted";
}

}  // namespace scalelab::lab07_test
