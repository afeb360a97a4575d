// test_rank_grid_mpi8.cpp — RankGrid (common/src/comm/rank_grid.cpp) on 8 ranks, 4 per simulated node:
// the groups every rank gets, the members they agree on and the link each group chose, against the
// table of docs/rank_grid.md written out below (from the formula, not from RankGrid); bad layouts
// refused on every rank without a hang. Registered at exactly 8 ranks (the _mpi8 suffix,
// tests/CMakeLists.txt); run directly (one rank) every test skips visibly.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "expect_error.h"             // defines: error_message, contains
#include "mpi_test.h"                 // defines: test::world
#include "scalelab/comm/comm.h"       // defines: Communicator, Topology, LinkModel, ReduceOp
#include "scalelab/comm/rank_grid.h"  // defines: RankGrid, GridAxis
#include "scalelab/core/tensor.h"     // defines: Tensor, DType

namespace {

using scalelab::Communicator;
using scalelab::DType;
using scalelab::GridAxis;
using scalelab::LinkModel;
using scalelab::RankGrid;
using scalelab::ReduceOp;
using scalelab::Tensor;
using scalelab::Topology;
using scalelab::test::contains;
using scalelab::test::error_message;
using Ranks = std::vector<int>;
namespace test = scalelab::test;

// tp 2 x pp 2 x dp 2, order tp-dp-pp: rank = tp_rank + 2 dp_rank + 4 pp_rank; 4 ranks per node, so
// node 0 holds ranks 0-3 and node 1 ranks 4-7. (docs/rank_grid.md, "Eight ranks, four per node")
struct Row {
  int tp_rank, pp_rank, dp_rank;
  Ranks tp, pp, dp, embedding;
};
const Row kTable[8] = {
    //  tp pp dp   tp group  pp group  dp group  embedding
    {0, 0, 0, {0, 1}, {0, 4}, {0, 2}, {0, 4}}, {1, 0, 0, {0, 1}, {1, 5}, {1, 3}, {1, 5}},
    {0, 0, 1, {2, 3}, {2, 6}, {0, 2}, {2, 6}}, {1, 0, 1, {2, 3}, {3, 7}, {1, 3}, {3, 7}},
    {0, 1, 0, {4, 5}, {0, 4}, {4, 6}, {0, 4}}, {1, 1, 0, {4, 5}, {1, 5}, {5, 7}, {1, 5}},
    {0, 1, 1, {6, 7}, {2, 6}, {4, 6}, {2, 6}}, {1, 1, 1, {6, 7}, {3, 7}, {5, 7}, {3, 7}},
};
// Inside one node (intra link) or across nodes (inter), the same for every rank: TP and DP stay inside
// a node, PP and the embedding group cross nodes.
constexpr bool kTpInside = true, kPpInside = false, kDpInside = true, kEmbeddingInside = false;

// A copy of the world with 4 ranks per simulated node: nvlink inside a node, infiniband across.
std::unique_ptr<Communicator> world_of_two_nodes() {
  auto w = test::world().split(0, test::world().rank(), "world");
  Topology t;
  t.ranks_per_node = 4;
  t.intra = LinkModel::preset("nvlink");
  t.inter = LinkModel::preset("infiniband");
  w->set_topology(t);
  return w;
}

// Every member of g sees the same members in the same order: each rank's world rank, gathered in g's
// rank order, is g.world_ranks(); and every member's list, gathered, equals this rank's.
void expect_members_agree(Communicator& g, const Ranks& want, const std::string& what) {
  EXPECT_EQ(g.world_ranks(), want) << what;
  const int n = g.size();
  Tensor me = Tensor::empty({1}, DType::I32);
  me.data<int32_t>()[0] = test::world().rank();
  Tensor all = Tensor::empty({n}, DType::I32);
  g.all_gather(me, all, what + ": who is here");
  Tensor list = Tensor::empty({n}, DType::I32), lists = Tensor::empty({n * n}, DType::I32);
  for (int i = 0; i < n; ++i) list.data<int32_t>()[i] = g.world_ranks()[i];
  g.all_gather(list, lists, what + ": whose list");
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(all.data<int32_t>()[i], want[i]) << what << ": member " << i;
    for (int q = 0; q < n; ++q)
      EXPECT_EQ(lists.data<int32_t>()[q * n + i], want[i]) << what << ": rank " << q << "'s list";
  }
}

TEST(RankGridMpi8, GroupsOnEightRanksWithFourPerNodeAreTheTable) {
  if (test::world().size() != 8) GTEST_SKIP() << "the table is for 8 ranks (mpirun -np 8)";
  auto world = world_of_two_nodes();
  const int r = world->rank();
  RankGrid grid(*world, /*tp=*/2, /*pp=*/2, /*dp=*/2);
  const Row& want = kTable[r];
  EXPECT_EQ(grid.tp_rank(), want.tp_rank);
  EXPECT_EQ(grid.pp_rank(), want.pp_rank);
  EXPECT_EQ(grid.dp_rank(), want.dp_rank);
  auto link = [](bool inside) { return inside ? "nvlink" : "infiniband"; };
  expect_members_agree(grid.tp(), want.tp, "tp");
  expect_members_agree(grid.pp(), want.pp, "pp");
  expect_members_agree(grid.dp(), want.dp, "dp");
  ASSERT_NE(grid.embedding(), nullptr);  // pp 2: every rank is a first or a last stage
  expect_members_agree(*grid.embedding(), want.embedding, "embedding");
  EXPECT_EQ(grid.tp().link_model().name, link(kTpInside));
  EXPECT_EQ(grid.pp().link_model().name, link(kPpInside));
  EXPECT_EQ(grid.dp().link_model().name, link(kDpInside));
  EXPECT_EQ(grid.embedding()->link_model().name, link(kEmbeddingInside));
  EXPECT_EQ(grid.tp().rank(), want.tp_rank);  // a group's rank is the coordinate along its axis
  EXPECT_EQ(grid.pp().rank(), want.pp_rank);
  EXPECT_EQ(grid.dp().rank(), want.dp_rank);

  // The events say which group carried what, and the link each one modelled.
  Tensor x = Tensor::zeros({256});
  grid.tp().clear_events();
  grid.tp().all_reduce(x, ReduceOp::Sum, "h.0 mlp out");
  const scalelab::CommEvent e = grid.tp().events().at(0);
  EXPECT_EQ(e.group, "tp");
  EXPECT_EQ(e.world_ranks, want.tp);
  EXPECT_TRUE(e.simulated);
  EXPECT_DOUBLE_EQ(e.modeled_ms, 1e3 * LinkModel::preset("nvlink").seconds("all_reduce", 1024, 2));
  const nlohmann::json j = grid.to_json();
  EXPECT_EQ(j["ranks_per_node"], 4);
  EXPECT_EQ(j["pp"]["within_one_node"], false);
  EXPECT_EQ(j["pp"]["link"], "infiniband");
}

// The placement rule's opposite, pp-dp-tp: tp varies slowest, so every tp group spans the two nodes.
TEST(RankGridMpi8, ReversedOrderPutsTensorParallelAcrossNodes) {
  if (test::world().size() != 8) GTEST_SKIP() << "needs 8 ranks";
  auto world = world_of_two_nodes();
  const int r = world->rank();
  RankGrid grid(*world, 2, 2, 2, "pp-dp-tp");  // rank = pp_rank + 2 dp_rank + 4 tp_rank
  EXPECT_EQ(grid.tp().world_ranks(), (Ranks{r % 4, r % 4 + 4}));
  EXPECT_EQ(grid.tp().link_model().name, "infiniband");
  EXPECT_EQ(grid.pp().world_ranks(), (Ranks{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(grid.pp().link_model().name, "nvlink");
}

// Bad layouts throw on every rank before any split, so no rank is left waiting in one: the same bad
// layout everywhere, one rank with a bad order, and ranks that disagree (each layout fine on its own).
TEST(RankGridMpi8, BadLayoutsAreRefusedOnEveryRank) {
  if (test::world().size() != 8) GTEST_SKIP() << "needs 8 ranks";
  auto world = world_of_two_nodes();
  const int r = world->rank();
  std::string msg = error_message([&] { RankGrid g(*world, 2, 2, 3); });
  EXPECT_TRUE(contains(msg, "tp 2 x pp 2 x dp 3 = 12 ranks, but the communicator has 8")) << msg;
  msg = error_message([&] { RankGrid g(*world, 2, 2, 2, r == 5 ? "tp-dp-ep" : "tp-dp-pp"); });
  EXPECT_TRUE(contains(msg, r == 5 ? "order 'tp-dp-ep' is not a permutation" : "another rank refused its layout"))
      << msg;
  msg = error_message([&] { RankGrid g(*world, r == 3 ? 4 : 2, r == 3 ? 1 : 2, 2); });
  EXPECT_TRUE(contains(msg, "the ranks disagree on the layout (tp 2..4, pp 1..2, dp 2..2")) << msg;
  world->barrier();  // everyone is still here, and the communicator still works
  RankGrid good(*world, 1, 1, 8);
  EXPECT_EQ(good.dp().size(), 8);
  EXPECT_EQ(good.dp().link_model().name, "infiniband");
}

}  // namespace
