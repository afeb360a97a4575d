// rank_grid.h — the rank grid of 3D parallelism: world ranks arranged as tp x pp x dp (and, in lab 07, a
// fourth axis cp: tp x cp x pp x dp, docs/rank_grid.md#a-fourth-axis-context-parallel), and the
// communicators each rank needs ("tp", "pp", "dp", "embedding"). What labs 05-07 (tensor, pipeline
// and 3D parallel) stand on. Definition, the 8-rank table and the placement rule: docs/rank_grid.md.
//
//   GridLayout layout{/*tp_size=*/2, /*pp_size=*/2, /*dp_size=*/2, "tp-dp-pp"};  // pure, no MPI
//   layout.check(8);                             // throws with the numbers and a hint when it cannot be
//   RankGrid grid(world, 2, 2, 2);               // collective: splits world into the four groups
//   GridCoords c = grid.coords();                // this rank's; rank 5: {tp_rank 1, pp_rank 1, dp_rank 0}
//   grid.tp().all_reduce(partial, ReduceOp::Sum, "h.3 attn out");
//
// The order lists the axes from fastest- to slowest-varying, as Megatron-LM's RankGenerator does
// (megatron/core/parallel_state.py, default order "tp-cp-ep-dp-pp"; without context and expert
// parallelism that is our default "tp-dp-pp"). With ranks placed on nodes in world-rank order, the
// fastest axis stays inside a node and the slowest spans nodes: "TP inside a node (its all-reduces
// are on the critical path of every layer), PP across nodes (one activation per micro-batch crosses
// a stage boundary), DP on top". Any permutation is accepted, so the rule's effect can be measured.
// Tests: tests/common/comm/test_rank_grid.cpp (pure), tests/common/comm/test_rank_grid_mpi8.cpp (8 ranks)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (the layout for the run record)

#include "scalelab/comm/comm.h"  // defines: Communicator

namespace scalelab {

// CP: context parallel (each sequence split across the ranks of a group; lab 10), the optional fourth axis
// of lab 07's grid. Last, so the three of 3D parallelism keep their values.
enum class GridAxis { TP, PP, DP, CP };
const char* grid_axis_name(GridAxis axis);  // "tp", "pp", "dp", "cp"

// One rank's place in the grid: 0 <= tp_rank < tp_size, and so on; cp_rank is 0 unless the grid splits the
// sequence (cp_size > 1). cp_rank last: {tp, pp, dp} still initializes a 3D rank's coordinates.
struct GridCoords {
  int tp_rank = 0;
  int pp_rank = 0;
  int dp_rank = 0;
  int cp_rank = 0;
  int& operator[](GridAxis axis);
  int operator[](GridAxis axis) const;
  bool operator==(const GridCoords& o) const {
    return tp_rank == o.tp_rank && pp_rank == o.pp_rank && dp_rank == o.dp_rank && cp_rank == o.cp_rank;
  }
};

struct GridLayoutTestAccess;  // tests/common/comm/test_rank_grid.cpp: the private arithmetic, tested

// The grid's sizes and order, checked without a communicator. Consecutive ranks differ first along the
// order's fastest axis (the 8-rank table: docs/rank_grid.md). The arithmetic from a rank to its
// coordinates and groups is private (RankGrid's, and its test's): it is lab 07's exercise (TODO lab07-1,
// lab07-2), so no lab can hand it over by calling this class.
struct GridLayout {
  int tp_size = 1;
  int pp_size = 1;
  int dp_size = 1;
  // The axes, fastest- to slowest-varying, joined by '-': tp, pp and dp once each, and cp at most once
  // ("tp-cp-dp-pp"). An order without cp places it right after tp (Megatron-LM's default "tp-cp-ep-dp-pp"):
  // "tp-dp-pp" reads as "tp-cp-dp-pp", the same ranks while cp_size is 1. docs/rank_grid.md#a-fourth-axis-context-parallel
  std::string order = "tp-dp-pp";
  int cp_size = 1;  // context parallel (lab 07's fourth axis); after order, so {tp, pp, dp, order} still reads

  // Throws scalelab::Error naming the numbers, with a hint, when a size is < 1, the order is not a
  // permutation of tp, pp, dp (with cp optional), or tp_size * cp_size * pp_size * dp_size != world_size.
  void check(int world_size) const;
  // The same checks without throwing: "" when the layout is good, else the error's message and hint.
  std::string problem(int world_size) const;
  int size(GridAxis axis) const;
  int world_size() const { return tp_size * cp_size * pp_size * dp_size; }
  // The order, parsed: all four axes, fastest first, cp placed after tp when the order leaves it out
  // ("tp-dp-pp" -> {TP, CP, DP, PP}). Throws like check.
  std::vector<GridAxis> axes() const;
  // "tp 2 x pp 2 x dp 2 (order tp-dp-pp)"; "tp 2 x cp 2 x pp 2 x dp 1 (order tp-cp-dp-pp)" when cp_size > 1
  std::string describe() const;

 private:
  friend class RankGrid;
  friend struct GridLayoutTestAccess;
  // The coordinates of rank (0 <= rank < world_size()), and the inverse. Both throw scalelab::Error
  // for a rank or a coordinate out of range, or a bad order.
  GridCoords coords(int rank) const;
  int rank_of(const GridCoords& c) const;
  // The ranks of `rank`'s group along `axis` (the ranks that differ from it only in that coordinate),
  // in the group's rank order: by that coordinate, 0 first. Throws like coords().
  std::vector<int> group(GridAxis axis, int rank) const;
  // The embedding group of `rank`: the first and the last pipeline stage with its tp and dp
  // coordinates, first stage first ({rank} alone when pp_size == 1); empty for a rank on neither.
  // They hold the two copies of the tied token embedding / LM head and sum its gradient
  // (Megatron-LM's embedding group). Throws like coords().
  std::vector<int> embedding_group(int rank) const;
};

// The grid over a communicator (normally the world; its ranks are the grid's ranks): this rank's
// coordinates and its four groups, each a Communicator named after its axis. The link of each group
// follows world's topology (Communicator::set_topology): set it BEFORE making the grid.
class RankGrid {
 public:
  // Collective over world. Checks the layout first on every rank (GridLayout::check) and makes sure
  // every rank passed the same one (an all_reduce over world), so a bad layout throws scalelab::Error
  // on every rank before any split and no rank is left waiting: the numbers and a hint when this rank's
  // layout is bad, "another rank refused its layout" or "the ranks disagree on the layout (tp 2..4, ...)"
  // otherwise. Then splits world, in this order, into "tp", "pp", "dp" and "embedding".
  RankGrid(Communicator& world, int tp_size, int pp_size, int dp_size, const std::string& order = "tp-dp-pp");

  const GridLayout& layout() const { return layout_; }
  const GridCoords& coords() const { return coords_; }
  int tp_rank() const { return coords_.tp_rank; }
  int pp_rank() const { return coords_.pp_rank; }
  int dp_rank() const { return coords_.dp_rank; }
  bool is_first_stage() const { return coords_.pp_rank == 0; }
  bool is_last_stage() const { return coords_.pp_rank == layout_.pp_size - 1; }

  Communicator& tp() { return *tp_; }
  Communicator& pp() { return *pp_; }
  Communicator& dp() { return *dp_; }
  Communicator& group(GridAxis axis);
  // The embedding group, or nullptr on a rank that is neither a first nor a last stage.
  Communicator* embedding() { return embedding_.get(); }

  // For the run record: {"tp_size", "pp_size", "dp_size", "order", "ranks_per_node", and per group
  // "tp"/"pp"/"dp"/"embedding": {"world_ranks": [...], "link": "nvlink", "within_one_node": true}
  // (this rank's groups; "embedding": null when it has none)}.
  nlohmann::json to_json() const;

 private:
  GridLayout layout_;
  GridCoords coords_;
  std::unique_ptr<Communicator> tp_, pp_, dp_, embedding_;
};

}  // namespace scalelab
