// megatron_split.h — a tensor-parallel split rule for common/'s own tests (tests/common link common/ alone,
// never lab 05, whose block_split is the learner's): Megatron-LM's column/row split (Shoeybi et al. 2019,
// Sec. 3), so a tp shard of the model can be built and its slices checked without a lab.
#pragma once

#include <string>

#include "scalelab/core/error.h"         // defines: SL_FAIL
#include "scalelab/model/gpt2_layout.h"  // defines: TpSplit, ModelShard

namespace scalelab::test {

inline TpSplit megatron_split(const std::string& t) {
  if (t == "attn.c_attn.weight" || t == "attn.c_attn.bias") return {0, 3};                     // q | k | v, whole heads
  if (t == "mlp.c_fc.weight" || t == "mlp.c_fc.bias") return {0, 1};                           // output rows
  if (t == "attn.c_proj.weight" || t == "mlp.c_proj.weight") return {1, 1};                    // input columns
  if (t == "attn.c_proj.bias" || t == "mlp.c_proj.bias" || t.rfind("ln_", 0) == 0) return {};  // whole
  SL_FAIL("a block tensor of gpt2_param_table without \"h.<l>.\"", "megatron_split: unknown \"%s\"", t.c_str());
}

// A shard of the model with megatron_split: tp rank `tp_rank` of `tp` (sequence parallel or not), blocks
// first..last (last -1: to the end), with or without the embedding and the head.
inline ModelShard megatron_shard(int tp_rank, int tp, bool sp, int first, int last, bool emb, bool head) {
  ModelShard s;
  s.tp_rank = tp_rank;
  s.tp_size = tp;
  s.tp_split = &megatron_split;
  s.sequence_parallel = sp;
  s.first_layer = first;
  s.last_layer = last;
  s.has_embedding = emb;
  s.has_head = head;
  return s;
}

}  // namespace scalelab::test
