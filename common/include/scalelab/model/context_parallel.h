// context_parallel.h — the context-parallel point of GPT-2: where a model whose sequence is split across a
// context-parallel group must communicate (docs/context_parallel.md). Each rank holds a slice of every
// sequence (ModelShard::cp_rank of cp_size: its tokens, their activations, the whole parameters); every
// layer is local to the slice except attention, whose queries need the keys and values of every earlier
// position. The model calls this point in place of the flash attention op; this base class is the identity
// (cp = 1: the flash op itself, the dense model bit for bit). Lab 10 derives from it and implements the ring
// (Liu et al. 2023, "Ring Attention", arXiv:2310.01889, Sec. 3) with the block ops of ops.h
// (attention_forward_block, attention_backward_block, attention_merge).
// Tests: tests/common/model/test_context_parallel.cpp
#pragma once

#include <vector>

#include "scalelab/core/tensor.h"        // defines: Tensor
#include "scalelab/model/gpt2_layout.h"  // defines: ModelShard, GPTConfig

namespace scalelab {

// One run of consecutive positions of a rank's slice: rows [row, row + length) of the rank's (B, T_local, ..)
// tensors hold positions [position, position + length) of the whole sequence.
struct CpChunk {
  int position;  // the chunk's first position in the whole sequence (0-based)
  int row;       // its first row in the rank's slice
  int length;    // tokens
};

// The chunks of rank shard.cp_rank for slices of T_local tokens (a whole sequence of T = cp_size * T_local):
//   contiguous (cp_zigzag false): one chunk, positions [r * T_local, (r+1) * T_local);
//   zig-zag (cp_zigzag true): the sequence cut into 2cp chunks of T_local/2, rank r holding chunks r and
//   2cp-1-r (in that order in its slice), so every rank has the same causal work (docs/context_parallel.md).
// cp_size 1: one chunk {0, 0, T_local}. Throws, with the numbers, unless T = cp_size * T_local <= max_seq_len
// and (zig-zag) T_local is even.
std::vector<CpChunk> cp_chunks(const ModelShard& shard, const GPTConfig& cfg, int T_local);

class ContextParallel {
 public:
  virtual ~ContextParallel() = default;

  // Every rank of the group calls these at the same point (they are collectives in lab 10). Shapes: B batch,
  // Tl = T_local this rank's tokens per sequence, C the channels the rank's attention sees (C/tp under tensor
  // parallelism), NH its heads. chunks: cp_chunks of this rank (where its rows sit in the sequence).
  // qkv (B, Tl, 3C): this rank's q | k | v rows. On return out (B, Tl, C) and lse (B, NH, Tl) are this rank's
  // rows of the WHOLE sequence's causal attention (as attention_forward_flash computes them on the whole
  // sequence): the final out and lse, over every key the rank's queries see, on whichever rank it sits.
  virtual void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                                 const std::vector<CpChunk>& chunks);
  // dout (B, Tl, C): this rank's rows of d(loss)/d(out); qkv, out, lse as the forward left them. dqkv
  // (B, Tl, 3C) += the gradient of this rank's q, k and v, from every rank's queries: its dq from its own
  // queries, its dk and dv summed over the queries of every rank that saw its keys.
  virtual void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, int NH, const std::vector<CpChunk>& chunks);
};

}  // namespace scalelab
