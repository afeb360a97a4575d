// reshard.cpp — a checkpoint of one layout loaded by another (reshard.h: the algorithm in three steps).
#include "reshard.h"

#include <filesystem>  // defines: std::filesystem::path
#include <map>
#include <memory>

#include "fsdp.h"                       // defines: lab04::shard_layout (lab 04's reference)
#include "parallel_3d.h"                // defines: lab07::make_layout, chunk_shard (lab 07's reference)
#include "scalelab/core/error.h"        // defines: SL_CHECK_HINT
#include "scalelab/model/checkpoint.h"  // defines: CheckpointReader

namespace fs = std::filesystem;

namespace scalelab::lab08 {

namespace {

// One rank of the layout that wrote the checkpoint: where its file is and which part of the model it held.
struct OldRank {
  GridCoords coords;
  std::vector<ModelShard> chunks;          // chunk_shard of each of its chunks
  std::unique_ptr<CheckpointReader> file;  // opened on first use
};

// The old layout, rebuilt from the manifest with lab 07's arithmetic (the reference's make_layout).
class OldLayout {
 public:
  OldLayout(const std::string& dir, const nlohmann::json& manifest, const GPTConfig& cfg) : dir_(dir), cfg_(cfg) {
    const nlohmann::json& l = manifest.at("layout");
    grid_ = {l.at("tp").get<int>(), l.at("pp").get<int>(), l.at("dp").get<int>(), l.at("order").get<std::string>()};
    zero1_ = l.at("zero1").get<bool>();
    const int world = manifest.at("world_size").get<int>();
    for (const nlohmann::json& j : manifest.at("shards")) {
      const ShardInfo info = ShardInfo::from_json(j);
      const lab07::Layout layout = lab07::make_layout(cfg, grid_, world, info.rank,
                                                      lab06::schedule_from_name(l.at("schedule").get<std::string>()),
                                                      l.at("micro_batches").get<int>(), l.at("chunks").get<int>(), 0,
                                                      /*placement_rule=*/false);
      SL_CHECK(layout.coords == info.coords, "%s: shard %s has coordinates other than its rank's in %s", dir.c_str(),
               info.file.c_str(), grid_.describe().c_str());
      OldRank& r = ranks_[info.file];
      r.coords = info.coords;
      for (int c = 0; c < layout.pipeline.v; ++c) r.chunks.push_back(lab07::chunk_shard(cfg, layout, c));
    }
  }

  // Step 1: the flat buffer of `kind` of unit u as old tp rank `tp_rank` held it (all of it: with ZeRO-1 the
  // dp ranks' pieces end to end), and the shard it is a slice of. `like` gives the dtype.
  std::pair<Tensor, ModelShard> unit_buffer(const std::string& kind, int u, int tp_rank, DType like) {
    const bool pieces = zero1_ && kind != "params";  // ZeRO-1 shards the optimizer state over dp
    Tensor flat;
    ModelShard shard;
    for (auto& [file, r] : ranks_) {
      if (r.coords.tp_rank != tp_rank || (!pieces && r.coords.dp_rank != 0)) continue;
      for (int c = 0; c < static_cast<int>(r.chunks.size()); ++c) {
        if (!r.chunks[c].owns_unit(u, cfg_)) continue;
        shard = r.chunks[c];
        const int64_t numel = gpt2_unit_numel(cfg_, shard)[u];
        if (!flat.defined()) flat = Tensor::zeros({numel}, like, Device::CPU, MemCategory::Workspace);
        const lab04::ShardLayout piece = pieces ? lab04::shard_layout(numel, r.coords.dp_rank, grid_.dp)
                                                : lab04::shard_layout(numel, 0, 1);
        read(file, r, "c" + std::to_string(c) + "/" + kind + "/" + std::to_string(u), piece, flat);
      }
    }
    SL_CHECK(flat.defined(), "%s: no shard of the checkpoint holds %s of unit %d for tp rank %d", dir_.c_str(),
             kind.c_str(), u, tp_rank);
    return {flat, shard};
  }

  // Step 2: every tensor of unit u, dense (name -> tensor), assembled from the old tp ranks' slices.
  std::map<std::string, Tensor> dense_unit(const std::string& kind, int u, DType like) {
    std::map<std::string, Tensor> dense;
    for (int t = 0; t < grid_.tp; ++t) {
      auto [flat, shard] = unit_buffer(kind, u, t, like);
      for (const ParamInfo& p : gpt2_param_table(cfg_, shard)) {
        if (p.unit != u || p.tied_copy || (p.tp_replicated && t > 0)) continue;  // the replicas are equal
        auto it =
            dense.try_emplace(p.name, Tensor::zeros(p.dense_shape, like, Device::CPU, MemCategory::Workspace)).first;
        copy_shard_to_dense(p, shard, flat.view(p.offset, p.shape), it->second);
      }
    }
    return dense;
  }

  ResumeState resume_state_of_rank0() {
    for (auto& [file, r] : ranks_)
      if (r.coords == GridCoords{0, 0, 0}) return shard_resume_state(open(file, r));
    SL_FAIL("a manifest lists the shard of every rank", "%s: the manifest has no shard of rank (0, 0, 0)",
            dir_.c_str());
  }

 private:
  const CheckpointReader& open(const std::string& file, OldRank& r) {
    if (!r.file) r.file = std::make_unique<CheckpointReader>((fs::path(dir_) / file).string());
    return *r.file;
  }
  // Section `name` of `file` into piece's range [begin, begin + owned) of flat (ZeRO-1 padding dropped).
  void read(const std::string& file, OldRank& r, const std::string& name, const lab04::ShardLayout& piece,
            Tensor& flat) {
    const CheckpointReader& f = open(file, r);
    const size_t elem = flat.nbytes() / static_cast<size_t>(flat.numel());
    SL_CHECK_HINT(f.has(name) && f.size_bytes(name) == static_cast<size_t>(piece.shard) * elem,
                  "reshard with the --precision and --optimizer the checkpoint was written with",
                  "%s/%s: section %s is missing or of another size", dir_.c_str(), file.c_str(), name.c_str());
    if (piece.owned == 0) return;
    Tensor whole = Tensor::empty({piece.shard}, flat.dtype(), Device::CPU, MemCategory::Workspace);
    f.read(name, whole.raw(), whole.nbytes());
    Tensor dst = flat.view(piece.begin, {piece.owned});
    dst.copy_from(whole.view(0, {piece.owned}));
  }

  std::string dir_;
  GPTConfig cfg_;
  lab07::Grid grid_;
  bool zero1_ = false;
  std::map<std::string, OldRank> ranks_;  // by file name
};

}  // namespace

ResumeState load_resharded(const std::string& dir, const nlohmann::json& manifest, lab07::Rank3D& r) {
  const GPTConfig& cfg = r.models.front()->config();
  // The model must be the checkpoint's: its config, and every dense shape (the manifest's table).
  for (const ParamInfo& p : gpt2_param_table(cfg)) {
    const nlohmann::json& saved = manifest.at("dense_shapes");
    SL_CHECK_HINT(saved.contains(p.name) && saved.at(p.name).get<Shape>() == p.dense_shape,
                  "reshard with the --model the checkpoint was written with (its manifest.json's \"model\")",
                  "%s: tensor %s is %s in the checkpoint and %s here", dir.c_str(), p.name.c_str(),
                  saved.contains(p.name) ? saved.at(p.name).dump().c_str() : "absent",
                  nlohmann::json(p.dense_shape).dump().c_str());
  }
  const int m = manifest.at("layout").at("micro_batches").get<int>();
  SL_CHECK_HINT(m == r.layout.pipeline.m, ("keep the global batch: --micro-batches " + std::to_string(m)).c_str(),
                "%s was written with %d micro-batches a step, this run takes %d", dir.c_str(), m, r.layout.pipeline.m);
  OldLayout old(dir, manifest, cfg);
  for (const StateTensor& s : rank_state(r)) {
    GPT2& model = *r.models[s.chunk];
    const DType dtype = s.tensor->dtype();
    // Steps 2 and 3: the dense tensors of the unit, sliced for this rank into its flat buffer.
    std::map<std::string, Tensor> dense = old.dense_unit(s.kind, s.unit, dtype);
    std::map<std::string, Tensor> embedding;  // unit 0's, for a last stage's copy of wte
    const int64_t numel = gpt2_unit_numel(cfg, model.shard())[s.unit];
    Tensor flat = Tensor::zeros({numel}, dtype, Device::CPU, MemCategory::Workspace);
    for (const ParamInfo& p : gpt2_param_table(cfg, model.shard())) {
      if (p.unit != s.unit) continue;
      if (p.tied_copy && embedding.empty()) embedding = old.dense_unit(s.kind, 0, dtype);
      Tensor local = flat.view(p.offset, p.shape);
      copy_dense_to_shard(p, model.shard(), (p.tied_copy ? embedding : dense).at(p.name), local);
    }
    // With ZeRO-1 the optimizer tensors are this dp rank's piece of the flat buffer (the padding stays 0).
    const bool piece = !r.zero1.empty() && s.kind != "params";
    const lab04::ShardLayout l = piece ? r.zero1[s.chunk]->units[s.unit].layout : lab04::shard_layout(numel, 0, 1);
    Tensor src = Tensor::zeros({l.shard}, dtype, Device::CPU, MemCategory::Workspace);
    if (l.owned > 0) src.view(0, {l.owned}).copy_from(flat.view(l.begin, {l.owned}));
    s.tensor->copy_from(src);
  }
  ResumeState st = old.resume_state_of_rank0();
  for (size_t c = 0; c < r.models.size(); ++c) {
    if (!r.zero1.empty()) r.zero1[c]->optimizer_steps = st.optimizer_steps.front();
    else r.optimizers[c]->set_step_count(st.optimizer_steps.front());
  }
  st.optimizer_steps.assign(r.models.size(), st.optimizer_steps.front());
  st.resharded = true;
  return st;
}

data::LoaderState rebase_loader_state(const data::LoaderState& saved, const data::LoaderConfig& now) {
  if (saved.B == now.B && saved.dp_size == now.dp_size) return saved;
  const int64_t windows = static_cast<int64_t>(saved.B) * saved.dp_size;
  SL_CHECK_HINT(windows % now.dp_size == 0 && windows == static_cast<int64_t>(now.B) * now.dp_size,
                windows % now.dp_size == 0
                    ? ("keep the global batch: --micro-batch " + std::to_string(windows / now.dp_size) + " at dp " +
                       std::to_string(now.dp_size))
                          .c_str()
                    : "choose a dp that divides the checkpoint's windows per batch",
                "the checkpoint's loader took %d windows x dp %d = %lld a batch; this run takes %d x dp %d", saved.B,
                saved.dp_size, static_cast<long long>(windows), now.B, now.dp_size);
  data::LoaderState s = saved;
  s.B = now.B;
  s.dp_size = now.dp_size;
  s.dp_rank = now.dp_rank;
  return s;
}

}  // namespace scalelab::lab08
