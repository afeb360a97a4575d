// test_rank_grid.cpp — the rank grid's pure layout (common/src/comm/rank_grid.cpp, GridLayout): coordinates,
// groups and the embedding group for several layouts and orders, the errors of bad layouts, and RankGrid
// over the local backend (one rank). Expected values are written out by hand or computed from the
// formula rank = c[a0] + size[a0] * (c[a1] + size[a1] * c[a2]) here, never by GridLayout itself (its arithmetic
// is private: GridLayoutTestAccess below).
// The grid's communicators on 8 ranks: tests/common/comm/test_rank_grid_mpi8.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "expect_error.h"             // defines: error_message, contains
#include "scalelab/comm/comm.h"       // defines: make_communicator
#include "scalelab/comm/rank_grid.h"  // defines: GridLayout, GridCoords, GridAxis, RankGrid

// GridLayout's arithmetic is private (lab 07's exercise: no lab may call it); this test reaches it through
// the friend the header names for it.
namespace scalelab {
struct GridLayoutTestAccess {
  static GridCoords coords(const GridLayout& g, int rank) { return g.coords(rank); }
  static int rank_of(const GridLayout& g, const GridCoords& c) { return g.rank_of(c); }
  static std::vector<int> group(const GridLayout& g, GridAxis axis, int rank) { return g.group(axis, rank); }
  static std::vector<int> embedding_group(const GridLayout& g, int rank) { return g.embedding_group(rank); }
};
}  // namespace scalelab

namespace {

using Access = scalelab::GridLayoutTestAccess;
using scalelab::GridAxis;
using scalelab::GridCoords;
using scalelab::GridLayout;
using scalelab::RankGrid;
using scalelab::test::contains;
using scalelab::test::error_message;
using Ranks = std::vector<int>;

// tp 2 x pp 2 x dp 2 in the default order tp-dp-pp: rank = tp + 2 dp + 4 pp (docs/rank_grid.md's table).
TEST(GridLayout, DefaultOrderPutsTpFastestAndPpSlowest) {
  const GridLayout g{2, 2, 2};
  EXPECT_EQ(g.order, "tp-dp-pp");
  const GridCoords want[8] = {{0, 0, 0}, {1, 0, 0}, {0, 0, 1}, {1, 0, 1}, {0, 1, 0}, {1, 1, 0}, {0, 1, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    const GridCoords c = Access::coords(g, r);
    EXPECT_TRUE(c == want[r]) << "rank " << r << ": tp " << c.tp_rank << " pp " << c.pp_rank << " dp " << c.dp_rank;
    EXPECT_EQ(Access::rank_of(g, want[r]), r);
  }
  EXPECT_EQ(Access::group(g, GridAxis::TP, 5), (Ranks{4, 5}));
  EXPECT_EQ(Access::group(g, GridAxis::DP, 5), (Ranks{5, 7}));
  EXPECT_EQ(Access::group(g, GridAxis::PP, 5), (Ranks{1, 5}));  // first stage first
  EXPECT_EQ(Access::embedding_group(g, 5), (Ranks{1, 5}));
  EXPECT_EQ(Access::embedding_group(g, 2), (Ranks{2, 6}));
  EXPECT_EQ(g.describe(), "tp 2 x pp 2 x dp 2 (order tp-dp-pp)");
}

// The fourth axis (docs/rank_grid.md "A fourth axis: context parallel"): an order without cp places it right
// after tp, so tp 2 x cp 2 x pp 2 in "tp-dp-pp" is rank = tp + 2 cp + 4 pp; a named cp goes where it is named.
TEST(GridLayout, CpGoesRightAfterTpUnlessTheOrderNamesIt) {
  const GridLayout g{2, 2, 1, "tp-dp-pp", 2};
  EXPECT_EQ(g.axes(), (std::vector<GridAxis>{GridAxis::TP, GridAxis::CP, GridAxis::DP, GridAxis::PP}));
  EXPECT_EQ(g.world_size(), 8);
  const GridCoords six = Access::coords(g, 6);  // tp 0, cp 1, pp 1
  EXPECT_TRUE(six == (GridCoords{0, 1, 0, 1})) << six.tp_rank << " " << six.pp_rank << " " << six.cp_rank;
  EXPECT_EQ(Access::rank_of(g, GridCoords{1, 1, 0, 1}), 7);
  EXPECT_EQ(Access::group(g, GridAxis::CP, 5), (Ranks{5, 7}));
  EXPECT_EQ(Access::group(g, GridAxis::PP, 2), (Ranks{2, 6}));
  EXPECT_EQ(Access::embedding_group(g, 3), (Ranks{3, 7}));  // same tp, cp and dp
  EXPECT_EQ(g.describe(), "tp 2 x cp 2 x pp 2 x dp 1 (order tp-dp-pp)");
  const GridLayout named{2, 2, 1, "cp-tp-dp-pp", 2};  // cp fastest: rank = cp + 2 tp + 4 pp
  EXPECT_EQ(Access::group(named, GridAxis::CP, 5), (Ranks{4, 5}));
  EXPECT_EQ(Access::group(named, GridAxis::TP, 5), (Ranks{5, 7}));
  std::string msg = error_message([] { GridLayout{2, 2, 1, "tp-cp-pp", 2}.check(8); });  // dp missing
  EXPECT_TRUE(contains(msg, "is not a permutation of tp, pp and dp (with cp at most once)")) << msg;
  msg = error_message([] { GridLayout{2, 2, 2, "tp-dp-pp", 2}.check(8); });
  EXPECT_TRUE(contains(msg, "tp 2 x cp 2 x pp 2 x dp 2 = 16 ranks, but the communicator has 8")) << msg;
  EXPECT_TRUE(contains(msg, "give dp 1 (= 8 / (tp 2 x cp 2 x pp 2))")) << msg;
}

// Every order, on a 2 x 3 x 4 grid: coordinates from the formula, groups vary exactly one coordinate.
TEST(GridLayout, EveryOrderFollowsTheMixedRadixFormula) {
  const int tp = 2, pp = 3, dp = 4;
  for (const char* order : {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"}) {
    const GridLayout g{tp, pp, dp, order};
    const std::string o = order;
    // The axes' sizes in the order's sequence, and a coordinate's stride (computed here, independently).
    auto size_of = [&](const std::string& a) { return a == "tp" ? tp : a == "pp" ? pp : dp; };
    const std::string a0 = o.substr(0, 2), a1 = o.substr(3, 2), a2 = o.substr(6, 2);
    auto stride = [&](const std::string& a) { return a == a0 ? 1 : a == a1 ? size_of(a0) : size_of(a0) * size_of(a1); };
    for (int r = 0; r < tp * pp * dp; ++r) {
      const GridCoords c = Access::coords(g, r);
      EXPECT_EQ(r, c.tp_rank * stride("tp") + c.pp_rank * stride("pp") + c.dp_rank * stride("dp")) << order << " " << r;
      EXPECT_EQ(Access::rank_of(g, c), r);
      for (GridAxis axis : {GridAxis::TP, GridAxis::PP, GridAxis::DP}) {
        const std::string name = scalelab::grid_axis_name(axis);
        const Ranks members = Access::group(g, axis, r);
        ASSERT_EQ(static_cast<int>(members.size()), size_of(name));
        for (int i = 0; i < size_of(name); ++i) {
          // Member i: this rank with the axis' coordinate set to i.
          EXPECT_EQ(members[i], r + (i - c[axis]) * stride(name)) << order << " " << name << " group of " << r;
        }
      }
    }
  }
}

TEST(GridLayout, EmbeddingGroupIsFirstAndLastStageOrNone) {
  const GridLayout deep{1, 4, 2};                              // tp 1, pp 4, dp 2: rank = dp + 2 pp
  EXPECT_EQ(Access::embedding_group(deep, 1), (Ranks{1, 7}));  // dp 1, stage 0 -> stages 0 and 3
  EXPECT_EQ(Access::embedding_group(deep, 6), (Ranks{0, 6}));  // dp 0, stage 3
  EXPECT_TRUE(Access::embedding_group(deep, 3).empty());       // stage 1 holds no embedding
  EXPECT_TRUE(Access::embedding_group(deep, 4).empty());       // stage 2
  const GridLayout flat{4, 1, 2};                              // no pipeline: the rank holds both ends itself
  for (int r = 0; r < 8; ++r) EXPECT_EQ(Access::embedding_group(flat, r), (Ranks{r}));
}

TEST(GridLayout, BadLayoutsNameTheNumbersAndAHint) {
  std::string msg = error_message([] { GridLayout{2, 2, 3}.check(8); });
  EXPECT_TRUE(contains(msg, "rank grid tp 2 x pp 2 x dp 3 = 12 ranks, but the communicator has 8")) << msg;
  EXPECT_TRUE(contains(msg, "give dp 2 (= 8 / (tp 2 x pp 2))")) << msg;
  msg = error_message([] { GridLayout{3, 1, 1}.check(8); });
  EXPECT_TRUE(contains(msg, "tp x pp must divide 8")) << msg;
  msg = error_message([] { GridLayout{0, 2, 4}.check(8); });
  EXPECT_TRUE(contains(msg, "tp 0 x pp 2 x dp 4: every size must be >= 1")) << msg;
  for (const char* order : {"tp-pp", "tp-dp-pp-tp", "tp-dp-ep", "tp-tp-dp", "TP-DP-PP", ""}) {
    msg = error_message([&] { GridLayout{2, 2, 2, order}.check(8); });
    EXPECT_TRUE(contains(msg, std::string("order '") + order + "' is not a permutation of tp, pp and dp")) << msg;
    EXPECT_TRUE(contains(msg, "tp-dp-pp (the default")) << msg;
  }
  const GridLayout good{2, 2, 2};
  EXPECT_EQ(good.problem(8), "");
  EXPECT_TRUE(contains(good.problem(4), "but the communicator has 4"));
  msg = error_message([&] { Access::coords(good, 8); });
  EXPECT_TRUE(contains(msg, "rank 8 is out of range")) << msg;
}

// RankGrid over the local backend: one rank, every group is that rank; pp 1 makes the embedding
// group the rank itself (it holds both ends of the model).
TEST(RankGridLocal, OneRankIsEveryGroup) {
  auto world = scalelab::make_communicator("local");
  RankGrid grid(*world, 1, 1, 1);
  EXPECT_EQ(grid.tp().name(), "tp");
  EXPECT_EQ(grid.pp().name(), "pp");
  EXPECT_EQ(grid.dp().name(), "dp");
  ASSERT_NE(grid.embedding(), nullptr);
  EXPECT_EQ(grid.embedding()->name(), "embedding");
  EXPECT_EQ(grid.embedding()->world_ranks(), Ranks{0});
  EXPECT_TRUE(grid.is_first_stage() && grid.is_last_stage());
  EXPECT_EQ(&grid.group(GridAxis::DP), &grid.dp());
  const nlohmann::json j = grid.to_json();
  EXPECT_EQ(j["order"], "tp-dp-pp");
  EXPECT_EQ(j["tp"]["world_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(j["embedding"]["link"], "none");
  // The layout check runs before any split (and the vote over the ranks of one).
  const std::string msg = error_message([&] { RankGrid bad(*world, 2, 1, 1); });
  EXPECT_TRUE(contains(msg, "rank 0 of 1: rank grid tp 2 x pp 1 x dp 1 = 2 ranks, but the communicator has 1")) << msg;
}

}  // namespace
