// layouts.cpp — lab 09's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): a layout's checks, shards and links, the sizes of a shard, the refusals' words, the
// fullest stage and the one-line explanation of a plan's row. Declared under "Given" in
// labs/09_planner/planner.h. It calls the TODO functions of its own track (stage_memory): yours in
// labs/09_planner/planner.cpp, the reference's in solutions/09_planner/planner.cpp.
#include "planner.h"

#include <cstdint>  // defines: int64_t
#include <cstdio>   // defines: std::snprintf
#include <string>   // defines: std::string, std::to_string

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT, scalelab::Error

namespace scalelab::lab09 {

inline namespace SL_TRACK_LAB09 {

// =============================================================================================
// A layout's checks, shards and links; the sizes of a shard
// =============================================================================================
int64_t shard_numel(const GPTConfig& cfg, const ModelShard& s) {
  int64_t n = 0;
  for (int64_t u : gpt2_unit_numel(cfg, s)) n += u;
  return n;
}

int shard_blocks(const GPTConfig& cfg, const ModelShard& s) { return s.last(cfg) - s.first_layer + 1; }

std::string to_string(const Layout& x) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "tp %d pp %d dp %d | B %d x m %d | %s%s | zero %d%s | recompute %s", x.tp, x.pp, x.dp,
                x.micro_batch, x.micro_batches, lab06::schedule_name(x.schedule),
                x.chunks > 1 ? (" v " + std::to_string(x.chunks)).c_str() : "", x.zero_stage,
                x.sequence_parallel ? " | sp" : "", recompute_name(x.recompute));
  return buf;
}

std::string to_string(const Cluster& c) {
  char buf[220];
  std::snprintf(buf, sizeof buf,
                "%d devices, %d a node, %.1f GB each, %.4g TFLOP/s x %.2f; links %s inside a "
                "node, %s across",
                c.devices, c.devices_per_node, c.memory_bytes / 1e9, c.peak_flops_per_s / 1e12, c.efficiency,
                c.intra.name.c_str(), c.inter.name.c_str());
  return buf;
}

void check_plan_inputs(const GPTConfig& cfg, const Workload& w, const Cluster& c) {
  cfg.validate();
  SL_CHECK_HINT(c.devices >= 1, "a cluster has 1 or more devices (--gpus N)", "a cluster of %d devices", c.devices);
  SL_CHECK_HINT(c.devices_per_node >= 1, "a node has 1 or more devices (--gpus-per-node N)", "%d devices per node",
                c.devices_per_node);
  SL_CHECK_HINT(c.flops_per_s() > 0, "give the devices' peak FLOP/s and an efficiency (--peak-tflops, --efficiency)",
                "peak %g FLOP/s x efficiency %g: a cluster with no compute", c.peak_flops_per_s, c.efficiency);
  SL_CHECK_HINT(w.global_batch >= 1 && w.seq_len >= 1,
                "the global batch and T are 1 or more (--global-batch, --seq-len)", "global batch %d, T %d",
                w.global_batch, w.seq_len);
}

void check_layout(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  cfg.validate();
  SL_CHECK_HINT(x.tp >= 1 && x.pp >= 1 && x.dp >= 1 && x.micro_batch >= 1 && x.micro_batches >= 1 && x.chunks >= 1,
                "tp, pp, dp, the micro-batch B, the micro-batches m and the chunks v are 1 or more",
                "layout %s has a size below 1", to_string(x).c_str());
  SL_CHECK_HINT(x.devices() == c.devices, "a layout uses every device of the cluster: tp x pp x dp = devices",
                "tp %d x pp %d x dp %d = %d devices, the cluster has %d", x.tp, x.pp, x.dp, x.devices(), c.devices);
  SL_CHECK_HINT(static_cast<int64_t>(x.dp) * x.micro_batch * x.micro_batches == w.global_batch,
                "every replica runs m micro-batches of B sequences: dp x B x m = the global batch",
                "dp %d x B %d x m %d != global batch %d", x.dp, x.micro_batch, x.micro_batches, w.global_batch);
  SL_CHECK_HINT(x.zero_stage >= 0 && x.zero_stage <= 3, "ZeRO stages are 0 (DDP), 1, 2 and 3", "ZeRO stage %d",
                x.zero_stage);
  SL_CHECK_HINT(w.seq_len >= 1 && w.seq_len <= cfg.max_seq_len,
                "T is at most the model's position embeddings (maxT): a longer maxT, or a shorter T",
                "T %d with maxT %d", w.seq_len, cfg.max_seq_len);
  SL_CHECK_HINT(!x.sequence_parallel || (x.tp > 1 && static_cast<int64_t>(x.micro_batch) * w.seq_len % x.tp == 0),
                "sequence parallelism splits the B*T token rows over the tp group: tp > 1 dividing B*T",
                "sequence parallel with tp %d and B*T %d", x.tp, x.micro_batch * w.seq_len);
  SL_CHECK_HINT(w.lora_rank == 0 || (x.tp == 1 && x.pp == 1 && x.zero_stage == 0),
                "the planner's LoRA fine-tune replicates the frozen base on every device: tp 1, pp 1, ZeRO 0",
                "LoRA rank %d with %s", w.lora_rank, to_string(x).c_str());
  lab06::make_layout(cfg, x.pp, 0, x.schedule, x.micro_batches, x.chunks);  // lab 06's rules of the partition
  chunk_shard(cfg, x, 0, 0).validate(cfg);                                  // the tp split of the model
}

ModelShard chunk_shard(const GPTConfig& cfg, const Layout& x, int stage, int chunk) {
  const lab06::PipelineLayout pl = lab06::make_layout(cfg, x.pp, stage, x.schedule, x.micro_batches, x.chunks);
  ModelShard s = lab06::chunk_shard(cfg, pl, chunk);
  s.tp_size = x.tp;
  s.sequence_parallel = x.sequence_parallel;
  s.validate(cfg);
  return s;
}

GroupLinks group_links(const Cluster& c, const Layout& x) {
  auto link = [&](int extent) { return extent <= c.devices_per_node ? c.intra : c.inter; };
  return {link(x.tp), /*pp=*/link(x.devices()), /*dp=*/link(x.tp * x.dp)};
}

int64_t lora_adapter_numel(const GPTConfig& cfg, const ModelShard& shard, int rank) {
  // a (r, in) and b (out, r) for c_attn (C -> 3C), attn c_proj (C -> C), c_fc (C -> 4C), mlp c_proj (4C -> C)
  const int64_t C = cfg.n_embd, per_block = static_cast<int64_t>(rank) * ((C + 3 * C) + 2 * C + 5 * C + 5 * C);
  return shard_blocks(cfg, shard) * per_block;
}

int chunk_sets(const Layout& x, int sets, int chunk) {
  if (x.chunks == 1) return sets;
  int n = 0;  // the first `sets` forwards of the interleaved schedule go p to a chunk, chunk 0 first, round and round
  for (int k = 0; k < sets; ++k) n += (k / x.pp) % x.chunks == chunk;
  return n;
}

std::string refusal_text(const Error& e) {
  // what() is the report block: "[scalelab] check failed in ...", "[scalelab]   <message>", "stmt: ...", "hint: ..."
  std::string message, hint;
  const std::string report = e.what();
  size_t at = 0;
  for (int line = 0; at < report.size(); ++line) {
    size_t end = report.find('\n', at);
    if (end == std::string::npos) end = report.size();
    std::string text = report.substr(at, end - at);
    const size_t body = text.find_first_not_of(' ', text.rfind(']') == std::string::npos ? 0 : text.find(']') + 1);
    text = body == std::string::npos ? "" : text.substr(body);
    if (line == 1) message = text;
    if (text.rfind("hint: ", 0) == 0) hint = text.substr(6);
    at = end + 1;
  }
  if (message.empty()) return report;
  return hint.empty() ? message : message + " (" + hint + ")";
}

std::string memory_refusal(const DeviceMemory& m, const Cluster& c) {
  if (static_cast<double>(m.total()) <= c.memory_bytes) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, "needs %.2f GB a device (stage %d), has %.2f GB", m.total() / 1e9, m.stage,
                c.memory_bytes / 1e9);
  return buf;
}

DeviceMemory device_memory(const GPTConfig& cfg, const Layout& x, const Workload& w) {
  DeviceMemory fullest;
  for (int s = 0; s < x.pp; ++s) {
    const DeviceMemory d = stage_memory(cfg, x, s, w);
    if (s == 0 || d.total() > fullest.total()) fullest = d;
  }
  return fullest;
}

std::string explain(const Candidate& c, const Cluster& cluster) {
  const Layout& x = c.layout;
  // "tp 4 inside a node (nvlink)", or "tp 1" for a group of one (nothing to communicate)
  auto group = [&](const char* name, int size, int extent) {
    std::string g = std::string(name) + " " + std::to_string(size);
    if (size > 1) {
      const bool inside = extent <= cluster.devices_per_node;
      const std::string& link = (inside ? cluster.intra : cluster.inter).name;
      g += (inside ? " inside a node (" : " across nodes (") + (link == "none" ? "no link model" : link) + ")";
    }
    return g;
  };
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "%s, %s, %s on top; micro-batch %d x %d per replica%s%s, ZeRO %d, recompute %s: %.4g tokens/s "
                "predicted (step %.4g ms, bubble %.1f%%, dp %.1f%%), MFU %.1f%%, %.2f GB a device (stage %d)",
                group("tp", x.tp, x.tp).c_str(), group("pp", x.pp, x.devices()).c_str(),
                group("dp", x.dp, x.tp * x.dp).c_str(), x.micro_batch, x.micro_batches,
                x.chunks > 1 ? (", interleaved v " + std::to_string(x.chunks)).c_str() : "",
                x.sequence_parallel ? ", sequence parallel" : "", x.zero_stage, recompute_name(x.recompute),
                c.time.tokens_per_s, c.time.step_ms, 100.0 * c.time.bubble_ms / c.time.step_ms,
                100.0 * c.time.dp_ms / c.time.step_ms, 100.0 * c.time.mfu, c.memory.total() / 1e9, c.memory.stage);
  return buf;
}

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
