// rank_grid.cpp — the rank grid (rank_grid.h): the pure layout (coordinates, groups) and RankGrid,
// which splits a communicator into the tp, pp, dp and embedding groups.
// Megatron-LM's RankGenerator (megatron/core/parallel_state.py) orders the axes the same way: the
// first named varies fastest. Definition and the 8-rank table: docs/rank_grid.md.
// Tests: tests/common/comm/test_rank_grid.cpp, tests/common/comm/test_rank_grid_mpi8.cpp
#include "scalelab/comm/rank_grid.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scalelab/comm/host_values.h"  // defines: all_reduce_values (the layout vote)
#include "scalelab/core/error.h"        // defines: SL_CHECK_HINT, SL_FAIL, detail::format

namespace scalelab {

namespace {

constexpr GridAxis kAxes[3] = {GridAxis::TP, GridAxis::PP, GridAxis::DP};                     // RankGrid's groups
constexpr GridAxis kOrderAxes[4] = {GridAxis::TP, GridAxis::PP, GridAxis::DP, GridAxis::CP};  // an order's names

// What is wrong with a layout, as an error's message and hint; empty when nothing is.
struct Problem {
  std::string message, hint;
  bool empty() const { return message.empty(); }
};

// "tp-dp-pp" -> {TP, CP, DP, PP}; "tp-cp-dp-pp" -> the same; "dp-cp-tp-pp" -> {DP, CP, TP, PP}. Empty when it
// is not a permutation of tp, pp and dp with cp at most once. An order without cp places it right after tp,
// as Megatron-LM's default order "tp-cp-ep-dp-pp" does: with cp_size 1 it changes no rank.
std::vector<GridAxis> parse_order(const std::string& order) {
  std::vector<GridAxis> axes;
  size_t begin = 0;
  for (;;) {
    const size_t end = order.find('-', begin);
    const std::string name = order.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    const GridAxis* axis = std::find_if(std::begin(kOrderAxes), std::end(kOrderAxes),
                                        [&](GridAxis a) { return name == grid_axis_name(a); });
    if (axis == std::end(kOrderAxes) || std::count(axes.begin(), axes.end(), *axis) > 0) return {};
    axes.push_back(*axis);
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (axes.size() == 3 && std::count(axes.begin(), axes.end(), GridAxis::CP) == 0) {
    axes.insert(std::find(axes.begin(), axes.end(), GridAxis::TP) + 1, GridAxis::CP);  // cp right after tp
  }
  return axes.size() == 4 ? axes : std::vector<GridAxis>{};
}

Problem find_problem(const GridLayout& g, int world_size) {
  const std::string sizes =
      g.cp_size == 1 ? detail::format("tp %d x pp %d x dp %d", g.tp_size, g.pp_size, g.dp_size)
                     : detail::format("tp %d x cp %d x pp %d x dp %d", g.tp_size, g.cp_size, g.pp_size, g.dp_size);
  if (g.tp_size < 1 || g.pp_size < 1 || g.dp_size < 1 || g.cp_size < 1) {
    return {"rank grid " + sizes + ": every size must be >= 1",
            "use 1 for an axis that is not split (tp 1 x pp 1 x dp " + std::to_string(world_size) +
                " is plain data parallel)"};
  }
  if (parse_order(g.order).empty()) {
    return {"rank grid order '" + g.order + "' is not a permutation of tp, pp and dp (with cp at most once)",
            "list the axes from fastest- to slowest-varying, joined by '-': tp-dp-pp (the default: TP inside "
            "a node, PP across nodes), tp-pp-dp, dp-tp-pp, ...; tp-cp-dp-pp with context parallel (without cp, "
            "it goes right after tp)"};
  }
  const int64_t product = int64_t{g.tp_size} * g.cp_size * g.pp_size * g.dp_size;
  if (product != world_size) {
    const int64_t not_dp = int64_t{g.tp_size} * g.cp_size * g.pp_size;  // every axis but dp
    const std::string hint =
        world_size % not_dp == 0
            ? detail::format("give dp %lld (= %d / (%s)), or other sizes whose product is %d",
                             static_cast<long long>(world_size / not_dp), world_size,
                             (g.cp_size == 1 ? detail::format("tp %d x pp %d", g.tp_size, g.pp_size)
                                             : detail::format("tp %d x cp %d x pp %d", g.tp_size, g.cp_size, g.pp_size))
                                 .c_str(),
                             world_size)
            : detail::format("choose tp, pp and dp whose product is the %d ranks (%s must divide %d)", world_size,
                             g.cp_size == 1 ? "tp x pp" : "tp x cp x pp", world_size);
    return {detail::format("rank grid %s = %lld ranks, but the communicator has %d", sizes.c_str(),
                           static_cast<long long>(product), world_size),
            hint};
  }
  return {};
}

// The permutation as a small number (the index of the order among the 6), for the vote.
int order_code(const std::vector<GridAxis>& axes) {
  int code = 0;
  for (GridAxis a : axes) code = code * 4 + static_cast<int>(a);  // base 4: one digit per axis
  return code;
}

}  // namespace

const char* grid_axis_name(GridAxis axis) {
  switch (axis) {
    case GridAxis::TP: return "tp";
    case GridAxis::PP: return "pp";
    case GridAxis::DP: return "dp";
    case GridAxis::CP: return "cp";
  }
  return "?";
}

int& GridCoords::operator[](GridAxis axis) {
  return axis == GridAxis::TP ? tp_rank : axis == GridAxis::PP ? pp_rank : axis == GridAxis::DP ? dp_rank : cp_rank;
}
int GridCoords::operator[](GridAxis axis) const {
  return axis == GridAxis::TP ? tp_rank : axis == GridAxis::PP ? pp_rank : axis == GridAxis::DP ? dp_rank : cp_rank;
}

// ---------------------------------------------------------------------------------------------
// The pure layout

std::string GridLayout::problem(int world_size) const {
  const Problem p = find_problem(*this, world_size);
  return p.empty() ? "" : p.message + " (hint: " + p.hint + ")";
}

void GridLayout::check(int world_size) const {
  const Problem p = find_problem(*this, world_size);
  if (!p.empty()) SL_FAIL(p.hint, "%s", p.message.c_str());
}

int GridLayout::size(GridAxis axis) const {
  return axis == GridAxis::TP ? tp_size : axis == GridAxis::PP ? pp_size : axis == GridAxis::DP ? dp_size : cp_size;
}

std::vector<GridAxis> GridLayout::axes() const {
  const std::vector<GridAxis> axes = parse_order(order);
  if (axes.empty()) check(world_size());  // throws: the order's problem
  return axes;
}

// rank = c[a0] + size[a0] * (c[a1] + size[a1] * c[a2]): digits of a mixed-radix number, a0 lowest.
GridCoords GridLayout::coords(int rank) const {
  SL_CHECK_HINT(rank >= 0 && rank < world_size(), "grid ranks are 0 .. tp_size * cp_size * pp_size * dp_size - 1",
                "rank grid %s: rank %d is out of range", describe().c_str(), rank);
  GridCoords c;
  int rest = rank;
  for (GridAxis a : axes()) {
    c[a] = rest % size(a);
    rest /= size(a);
  }
  return c;
}

int GridLayout::rank_of(const GridCoords& c) const {
  const std::vector<GridAxis> order_axes = axes();
  int rank = 0;
  for (auto a = order_axes.rbegin(); a != order_axes.rend(); ++a) {  // slowest first (Horner)
    SL_CHECK_HINT(c[*a] >= 0 && c[*a] < size(*a), "each coordinate is 0 .. its axis' size - 1",
                  "rank grid %s: %s_rank %d is out of range", describe().c_str(), grid_axis_name(*a), c[*a]);
    rank = rank * size(*a) + c[*a];
  }
  return rank;
}

std::vector<int> GridLayout::group(GridAxis axis, int rank) const {
  GridCoords c = coords(rank);
  std::vector<int> members;
  for (int i = 0; i < size(axis); ++i) {
    c[axis] = i;
    members.push_back(rank_of(c));
  }
  return members;
}

std::vector<int> GridLayout::embedding_group(int rank) const {
  GridCoords c = coords(rank);
  if (c.pp_rank != 0 && c.pp_rank != pp_size - 1) return {};  // a middle stage holds neither copy
  c.pp_rank = 0;
  std::vector<int> members = {rank_of(c)};
  c.pp_rank = pp_size - 1;
  if (pp_size > 1) members.push_back(rank_of(c));
  return members;
}

std::string GridLayout::describe() const {
  if (cp_size == 1) return detail::format("tp %d x pp %d x dp %d (order %s)", tp_size, pp_size, dp_size, order.c_str());
  return detail::format("tp %d x cp %d x pp %d x dp %d (order %s)", tp_size, cp_size, pp_size, dp_size, order.c_str());
}

// ---------------------------------------------------------------------------------------------
// RankGrid

RankGrid::RankGrid(Communicator& world, int tp_size, int pp_size, int dp_size, const std::string& order)
    : layout_{tp_size, pp_size, dp_size, order} {
  const int me = world.rank(), n = world.size();
  // 1. The vote: every rank checks its own layout without throwing, then all ranks compare theirs
  //    (max of each number and of its negation = max and -min), so they all throw together, before
  //    any split, whether one rank or all of them got a bad layout.
  const Problem mine = find_problem(layout_, n);
  const int code = mine.empty() ? order_code(parse_order(order)) : -1;
  const std::vector<int32_t> ballot = {
      mine.empty() ? 0 : 1, tp_size, pp_size, dp_size, code, -tp_size, -pp_size, -dp_size, -code};
  const std::vector<int32_t> v = all_reduce_values(world, ballot, ReduceOp::Max, "rank grid: layout check");
  if (!mine.empty()) SL_FAIL(mine.hint, "rank %d of %d: %s", me, n, mine.message.c_str());
  SL_CHECK_HINT(v[0] == 0, "read the error of the rank(s) that refused it: every rank must pass the same good layout",
                "rank grid on rank %d of %d: %s is fine here, but another rank refused its layout", me, n,
                layout_.describe().c_str());
  SL_CHECK_HINT(v[1] == -v[5] && v[2] == -v[6] && v[3] == -v[7] && v[4] == -v[8],
                "pass the same tp, pp, dp and order on every rank",
                "rank grid on rank %d of %d: the ranks disagree on the layout (tp %d..%d, pp %d..%d, dp %d..%d, %s)",
                me, n, -v[5], v[1], -v[6], v[2], -v[7], v[3], v[4] == -v[8] ? "one order" : "different orders");

  // 2. The groups, split in the same order on every rank. Color: the group's first member (unique per
  //    group); key: the coordinate along the axis, so the group's ranks follow it.
  coords_ = layout_.coords(me);
  for (GridAxis axis : kAxes) {
    const std::vector<int> members = layout_.group(axis, me);
    std::unique_ptr<Communicator> g = world.split(members.front(), coords_[axis], grid_axis_name(axis));
    SL_CHECK(g && g->size() == layout_.size(axis), "rank grid on rank %d: the %s group has %d ranks, expected %d", me,
             grid_axis_name(axis), g ? g->size() : 0, layout_.size(axis));
    (axis == GridAxis::TP ? tp_ : axis == GridAxis::PP ? pp_ : dp_) = std::move(g);
  }
  const std::vector<int> emb = layout_.embedding_group(me);
  embedding_ = world.split(emb.empty() ? Communicator::kNoColor : emb.front(), coords_.pp_rank, "embedding");
}

Communicator& RankGrid::group(GridAxis axis) {
  return axis == GridAxis::TP ? tp() : axis == GridAxis::PP ? pp() : dp();
}

nlohmann::json RankGrid::to_json() const {
  auto group_json = [](const Communicator* g) -> nlohmann::json {
    if (g == nullptr) return nullptr;
    return {{"world_ranks", g->world_ranks()},
            {"link", g->link_model().name},
            {"within_one_node", g->topology().within_one_node(g->world_ranks())}};
  };
  return {{"tp_size", layout_.tp_size},
          {"pp_size", layout_.pp_size},
          {"dp_size", layout_.dp_size},
          {"order", layout_.order},
          {"ranks_per_node", tp_->topology().ranks_per_node},
          {"tp_rank", coords_.tp_rank},
          {"pp_rank", coords_.pp_rank},
          {"dp_rank", coords_.dp_rank},
          {"tp", group_json(tp_.get())},
          {"pp", group_json(pp_.get())},
          {"dp", group_json(dp_.get())},
          {"embedding", group_json(embedding_.get())}};
}

}  // namespace scalelab
