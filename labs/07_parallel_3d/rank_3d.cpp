// rank_3d.cpp — lab 07's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the grid's words, the shard of a chunk, build_rank (this rank's groups, chunks,
// stage and exchange; its ZeRO-1 state under --zero1), the norm from ZeRO-1 shards and the forward-only loss.
// Declared in labs/07_parallel_3d/parallel_3d.h. It calls the TODO functions of its own track: yours in
// labs/07_parallel_3d/parallel_3d.cpp, the reference's in solutions/07_parallel_3d/parallel_3d.cpp.
#include "parallel_3d.h"

#include <algorithm>  // defines: std::max, std::min
#include <memory>     // defines: std::make_unique
#include <string>     // defines: std::string, std::to_string
#include <vector>     // defines: std::vector

#include "scalelab/comm/host_values.h"  // defines: all_reduce_value (the eval loss, any backend)
#include "scalelab/core/error.h"        // defines: SL_CHECK
#include "scalelab/ops/ops.h"           // defines: cast, sum_squares

namespace scalelab::lab07 {
inline namespace SL_TRACK_LAB07 {

// =============================================================================================
// The grid
// =============================================================================================
int Grid::size(GridAxis axis) const {
  return axis == GridAxis::TP ? tp : axis == GridAxis::PP ? pp : axis == GridAxis::DP ? dp : cp;
}

std::string Grid::describe() const {
  return "tp " + std::to_string(tp) + (cp == 1 ? "" : " x cp " + std::to_string(cp)) + " x pp " +
         std::to_string(pp) + " x dp " + std::to_string(dp) + " (order " + order + ")";
}

std::vector<GridAxis> parse_order(const std::string& order) {
  GridLayout probe;  // common's parser; its error names the order and lists good ones
  probe.order = order;
  return probe.axes();  // four axes: cp right after tp when the order leaves it out
}

// =============================================================================================
// This rank's part: its chunks, its groups, its stage
// =============================================================================================
ModelShard chunk_shard(const GPTConfig& cfg, const Layout& layout, int chunk) {
  ModelShard s = lab06::chunk_shard(cfg, layout.pipeline, chunk);  // its layers, embedding, head
  s.tp_rank = layout.coords.tp_rank;                               // and lab 05's slice of each
  s.tp_size = layout.grid.tp;
  s.tp_split = &lab05::block_split;  // lab 05's column/row split of each block tensor
  s.cp_rank = layout.coords.cp_rank;  // and lab 10's slice of every sequence (cp 1: the whole)
  s.cp_size = layout.grid.cp;
  s.cp_zigzag = layout.grid.cp > 1;  // chunks cp_rank and 2 cp - 1 - cp_rank: the same causal work per rank
  return s;
}

void check_context_parallel(const GPTConfig& cfg, const Grid& grid, int seq_len) {
  SL_CHECK_HINT(grid.cp >= 1, "--cp 1 splits no sequence; --cp N (N > 1) splits each across N ranks",
                "%s: cp must be >= 1, got %d", grid.describe().c_str(), grid.cp);
  if (grid.cp == 1 || seq_len == 0) return;
  SL_CHECK_HINT(seq_len % (2 * grid.cp) == 0 && seq_len <= cfg.max_seq_len,
                "the zig-zag cuts each sequence into 2 cp equal chunks: choose --seq-len a multiple of 2 cp (at most "
                "the model's max_seq_len), or a smaller --cp",
                "%s: sequences of %d tokens do not cut into 2 x cp = %d chunks within max_seq_len %d",
                grid.describe().c_str(), seq_len, 2 * grid.cp, cfg.max_seq_len);
}

namespace {

// Lab 04's ZeRO-1 state of one chunk on this rank of the dp group, built around the chunk's own buffers as
// lab04::FSDP builds it around a dense model: per owned unit, its parameters and gradients moved into
// buffers padded to dp equal shards (the model's unit buffers become views of their first n elements),
// this rank's shard of each a view, and the optimizer state (AdamW's m and v; the fp32 master copy under
// a 16-bit policy) of that shard only. A unit the chunk does not own gets an empty layout.
std::unique_ptr<lab04::FsdpState> make_zero1_state(GPT2& model, Communicator& dp, const OptimizerConfig& oc) {
  auto s = std::make_unique<lab04::FsdpState>(lab04::FsdpState{
      model, dp, lab04::ZeroStage::Zero1, oc, /*prefetch=*/0, /*optimizer_steps=*/0, {}, {}});
  s->units.resize(model.num_units());
  const Device device = model.device();
  for (int u = 0; u < model.num_units(); ++u) {
    lab04::UnitShard& us = s->units[u];
    if (!model.owns_unit(u)) {
      us.keep_gathered = false;  // nothing to gather, update or reduce
      continue;
    }
    us.layout = lab04::shard_layout(model.unit_params(u).numel(), dp.rank(), dp.size());
    const lab04::ShardLayout& l = us.layout;
    us.full_params = Tensor::zeros({l.padded}, model.unit_params(u).dtype(), device, MemCategory::Params);
    us.full_params.view(0, {l.numel}).copy_from(model.unit_params(u));  // padding stays 0
    model.unit_params(u) = us.full_params.view(0, {l.numel});           // the chunk's own buffer is freed
    us.param_shard = us.full_params.view(l.begin, {l.shard});
    us.full_grads = Tensor::zeros({l.padded}, DType::F32, device, MemCategory::Grads);
    model.unit_grads(u) = us.full_grads.view(0, {l.numel});
    us.grad_shard = us.full_grads.view(l.begin, {l.shard});
    if (oc.kind == OptimizerConfig::Kind::AdamW) {
      us.m = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
      us.v = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
    }
    if (model.policy().has_master_copy()) {
      us.master = Tensor::zeros({l.shard}, DType::F32, device, MemCategory::OptimizerState);
      cast(us.master, us.param_shard);
    }
  }
  return s;
}

}  // namespace

std::unique_ptr<Rank3D> build_rank(Communicator& world, const GPTConfig& cfg, const Layout& layout,
                                   const OptimizerConfig& optimizer, const PrecisionPolicy& policy, Device device,
                                   uint64_t seed, bool zero1) {
  check_context_parallel(cfg, layout.grid, 0);  // the same on every rank, before any collective
  auto r = std::make_unique<Rank3D>();
  r->layout = layout;
  r->groups = make_groups(world, layout);  // YOUR groups
  SL_CHECK(r->groups.tp && r->groups.pp && r->groups.dp, "make_groups left the tp, pp or dp group empty");
  SL_CHECK(r->groups.tp->size() == layout.grid.tp && r->groups.pp->size() == layout.grid.pp &&
               r->groups.dp->size() == layout.grid.dp,
           "make_groups: groups of %d, %d, %d ranks for %s", r->groups.tp->size(), r->groups.pp->size(),
           r->groups.dp->size(), layout.grid.describe().c_str());
  // The fourth axis (README.md#a-fourth-axis-context-parallel), cp > 1 only (the same on every rank): two more
  // splits of world, made from YOUR coordinates. cp: the ranks that differ only in cp_rank (the ring).
  // dp-cp: every rank with this tp_rank and pp_rank, i.e. the same parameters, whose gradients are averaged
  // (Megatron-LM's data-parallel group with context parallelism); it replaces your dp group.
  const Grid& grid = layout.grid;
  if (grid.cp > 1) {
    GridCoords ring0 = layout.coords, block0 = layout.coords;
    ring0.cp_rank = 0;
    block0.cp_rank = block0.dp_rank = 0;
    r->groups.cp = world.split(rank_of(grid, ring0), layout.coords.cp_rank, "cp");
    r->groups.dp =
        world.split(rank_of(grid, block0), layout.coords.cp_rank + grid.cp * layout.coords.dp_rank, "dp-cp");
    SL_CHECK(r->groups.cp->size() == grid.cp && r->groups.dp->size() == grid.cp * grid.dp,
             "build_rank: cp and dp-cp groups of %d and %d ranks for %s (coords_of / rank_of)", r->groups.cp->size(),
             r->groups.dp->size(), grid.describe().c_str());
    r->ring = std::make_unique<lab10::RingAttention>(*r->groups.cp, cfg, /*zigzag=*/true);
  }
  r->points = std::make_unique<lab05::MegatronPoints>(*r->groups.tp, /*sequence_parallel=*/false);
  std::vector<GPT2*> chunks;
  for (int c = 0; c < layout.pipeline.v; ++c) {
    r->models.push_back(std::make_unique<GPT2>(cfg, chunk_shard(cfg, layout, c), policy, device, seed));
    GPT2& model = *r->models.back();
    if (layout.grid.tp > 1) model.set_tensor_parallel(r->points.get());  // lab 05's points (tp 1: none)
    if (r->ring) {
      model.set_attention(AttentionImpl::Flash);  // the ring merges flash blocks by their log-sum-exp
      model.set_context_parallel(r->ring.get());  // lab 10's reference ring in every block
    }
    if (zero1) r->zero1.push_back(make_zero1_state(model, *r->groups.dp, optimizer));
    else r->optimizers.push_back(std::make_unique<Optimizer>(model, optimizer));
    chunks.push_back(&model);
  }
  r->stage = std::make_unique<lab06::Stage>(chunks, layout.pipeline);
  r->exchange = std::make_unique<lab06::StageExchange>(*r->groups.pp, layout.pipeline);
  return r;
}

double zero1_sum_squares(const lab04::FsdpState& s) {
  const bool tp_rank0 = s.model.shard().tp_rank == 0;
  double sq = 0.0;
  for (const ParamInfo& p : s.model.param_table()) {
    if (p.tied_copy || (p.tp_replicated && !tp_rank0)) continue;  // counted by another rank
    const lab04::ShardLayout& l = s.units.at(p.unit).layout;
    const int64_t lo = std::max(p.offset, l.begin), hi = std::min(p.offset + p.numel, l.begin + l.owned);
    if (lo < hi) sq += sum_squares(s.units[p.unit].grad_shard.view(lo - l.begin, {hi - lo}));
  }
  return sq;
}

// =============================================================================================
// Forward only
// =============================================================================================
std::vector<MicroBatch> cp_slices(const Rank3D& r, const std::vector<MicroBatch>& whole) {
  if (r.layout.grid.cp == 1) return whole;
  const GPT2& model = *r.models.front();
  std::vector<MicroBatch> out;
  for (const MicroBatch& mb : whole) {
    const int T = static_cast<int>(mb.inputs.size(1)), T_local = T / r.layout.grid.cp;
    check_context_parallel(model.config(), r.layout.grid, T);
    const std::vector<CpChunk> chunks = cp_chunks(model.shard(), model.config(), T_local);
    out.push_back({lab10::slice_sequence(mb.inputs, chunks, T_local), lab10::slice_sequence(mb.targets, chunks, T_local)});
  }
  return out;
}

float forward_loss(Rank3D& r, const Tensor& tokens, const Tensor& targets) {
  const std::vector<MicroBatch> mine = cp_slices(r, {{tokens, targets}});  // cp > 1: this rank's slice
  const float loss = lab06::forward_loss(*r.stage, *r.exchange, mine[0].inputs, mine[0].targets);
  return r.groups.dp->size() > 1 ? all_reduce_value(*r.groups.dp, loss, ReduceOp::Avg, "eval loss (dp)") : loss;
}

}  // namespace SL_TRACK_LAB07
}  // namespace scalelab::lab07
