// step_time.cpp — the step-time model (common/include/scalelab/measure/step_time.h, where the terms and
// their sources are). Tests: tests/common/measure/test_step_time.cpp
#include "scalelab/measure/step_time.h"

#include <algorithm>
#include <vector>

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT

namespace scalelab {

StepTime estimate_step_time(const GPTConfig& cfg, const StepLayout& x, const StepCluster& cluster) {
  cfg.validate();
  SL_CHECK_HINT(x.tp >= 1 && x.pp >= 1 && x.dp >= 1 && x.micro_batch >= 1 && x.micro_batches >= 1 && x.seq_len >= 1,
                "tp, pp, dp, the micro-batch, the micro-batches and T are 1 or more",
                "layout tp=%d pp=%d dp=%d B=%d m=%d T=%d", x.tp, x.pp, x.dp, x.micro_batch, x.micro_batches,
                x.seq_len);
  SL_CHECK_HINT(x.pp <= cfg.n_layer, "every pipeline stage needs at least one block: pp <= the model's layers",
                "pp=%d > L=%d", x.pp, cfg.n_layer);
  SL_CHECK_HINT(cluster.flops_per_s > 0, "give the FLOP/s one device sustains (a calibration, or a datasheet "
                "peak times an efficiency)", "flops_per_s=%g: a cluster with no compute", cluster.flops_per_s);
  ModelShard tp_shard;  // validates NH, 4C, V against tp, and sequence parallelism (tp > 1) with the model's
  tp_shard.tp_size = x.tp;
  tp_shard.sequence_parallel = x.sequence_parallel;
  tp_shard.validate(cfg);
  const double B = x.micro_batch, T = x.seq_len, C = cfg.n_embd, V = cfg.vocab_size, tp = x.tp, m = x.micro_batches;
  SL_CHECK_HINT(!x.sequence_parallel || x.micro_batch * x.seq_len % x.tp == 0,
                "with sequence parallelism the B*T token rows are split into tp equal blocks",
                "B*T=%d not divisible by tp=%d", x.micro_batch * x.seq_len, x.tp);

  // One stage's forward FLOPs, backward FLOPs (recompute included) and tensor-parallel seconds per micro-batch.
  struct Stage {
    double fwd = 0, bwd = 0, tp_s = 0;
  };
  const double per_block_fwd = B * T * (24.0 * C * C + 4.0 * T * C) / tp;  // c_attn, c_proj, c_fc, mlp c_proj, attention
  const double per_block_recompute = B * T * recompute_flops_per_token(cfg, x.seq_len, x.recompute) / cfg.n_layer / tp;
  const int64_t act = static_cast<int64_t>(B * T * C) * 4;  // bytes of the (B,T,C) fp32 activation
  const LinkModel& tl = cluster.tp_link;
  const int n = x.tp;
  // Megatron's collectives of one block's forward: g after attention's and the MLP's row-parallel c_proj (an
  // all-reduce each), or with sequence parallelism an all-gather before each column-parallel and a
  // reduce-scatter after each row-parallel linear. The backward has the same collectives (f's all-reduce,
  // or the reverse pair); full recompute runs the forward's again.
  const double block_fwd_tp =
      x.sequence_parallel ? 2.0 * (tl.seconds("all_gather", act / n, n) + tl.seconds("reduce_scatter", act, n))
                          : 2.0 * tl.seconds("all_reduce", act, n);
  const double block_tp = block_fwd_tp * (x.recompute == Recompute::Full ? 3.0 : 2.0);
  auto stage = [&](int blocks, bool first, bool last) {
    Stage st;
    st.fwd = blocks * per_block_fwd + (last ? B * T * 2.0 * C * V / tp : 0.0);  // the tied LM head's matmul
    st.bwd = 2.0 * st.fwd + blocks * per_block_recompute;
    st.tp_s = blocks * block_tp;
    if (first)  // the vocabulary-parallel embedding: an all-reduce (sp: reduce-scatter) forward, sp: all-gather back
      st.tp_s += x.sequence_parallel ? tl.seconds("reduce_scatter", act, n) + tl.seconds("all_gather", act / n, n)
                                     : tl.seconds("all_reduce", act, n);
    if (last)  // the head's f backward (sp: reduce-scatter); cross-entropy's max and sum over the vocabulary
      st.tp_s += (x.sequence_parallel ? tl.seconds("reduce_scatter", act, n) : tl.seconds("all_reduce", act, n)) +
                 tl.seconds("all_reduce", static_cast<int64_t>(B * T) * 4, n) +
                 tl.seconds("all_reduce", static_cast<int64_t>(B * T) * 8, n);
    return st;
  };
  // Lab 06's partition: L/pp blocks a stage, the first L % pp stages one more; the first stage (ceil(L/pp) blocks
  // and the embedding) or the last (floor(L/pp) and the head) is the slowest, and sets every slot's length.
  const int layers = (cfg.n_layer + x.pp - 1) / x.pp;
  const int last_layers = cfg.n_layer / x.pp;
  std::vector<Stage> stages;
  if (x.pp == 1) {
    stages.push_back(stage(cfg.n_layer, true, true));
  } else {
    stages.push_back(stage(layers, true, false));
    stages.push_back(stage(last_layers, false, true));
  }
  auto seconds = [&](const Stage& st) { return (st.fwd + st.bwd) / cluster.flops_per_s + st.tp_s; };
  const Stage& slowest = *std::max_element(stages.begin(), stages.end(),
                                           [&](const Stage& a, const Stage& b) { return seconds(a) < seconds(b); });
  StepTime t;
  t.forward_ms = 1e3 * slowest.fwd / cluster.flops_per_s;
  t.backward_ms = 1e3 * slowest.bwd / cluster.flops_per_s;
  t.tp_ms = 1e3 * slowest.tp_s;
  // pipeline: each micro-batch crosses a boundary forward (the activation) and backward (its gradient)
  if (x.pp > 1) {
    const int64_t boundary = x.sequence_parallel ? act / x.tp : act;
    t.pp_ms = 1e3 * 2.0 * cluster.pp_link.seconds("send", boundary, 2);
  }
  t.slot_ms = t.forward_ms + t.backward_ms + t.tp_ms + t.pp_ms;
  t.pipeline_ms = (m + x.pp - 1) * t.slot_ms;
  t.bubble_ms = (x.pp - 1) * t.slot_ms;

  // data parallel: the first stage's fp32 gradients (its blocks' tp shard, wte and wpe), the larger one
  const double block_params = 12.0 * C * C + 13.0 * C;
  const double stage_params = layers * block_params / tp + V * C / tp + cfg.max_seq_len * C;
  const int64_t grad_bytes = static_cast<int64_t>(stage_params) * 4;
  double dp_s = 0;
  if (x.dp > 1) {
    dp_s = x.zero1 ? cluster.dp_link.seconds("reduce_scatter", grad_bytes, x.dp) +
                         cluster.dp_link.seconds("all_gather", grad_bytes / x.dp, x.dp)
                   : cluster.dp_link.seconds("all_reduce", grad_bytes, x.dp);
  }
  if (x.pp > 1) dp_s += cluster.pp_link.seconds("all_reduce", static_cast<int64_t>(V * C / tp) * 4, 2);
  t.dp_ms = 1e3 * dp_s;
  t.step_ms = t.pipeline_ms + t.dp_ms;

  const double tokens = x.dp * m * B * T;
  t.tokens_per_s = tokens / (t.step_ms / 1e3);
  const double devices = static_cast<double>(x.tp) * x.pp * x.dp;
  const double model_flops = 6.0 * static_cast<double>(gpt2_num_params(cfg, /*with_wpe=*/false)) +
                             12.0 * cfg.n_layer * T * C;  // lab 01's flops_per_token
  t.mfu = t.tokens_per_s * model_flops / (devices * cluster.flops_per_s);
  t.hfu = t.tokens_per_s * (model_flops + recompute_flops_per_token(cfg, x.seq_len, x.recompute)) /
          (devices * cluster.flops_per_s);
  return t;
}

}  // namespace scalelab
