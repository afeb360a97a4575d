// context_parallel.cpp — the rank's chunks of a split sequence, and the identity of the context-parallel
// point (context_parallel.h): what a dense model (cp = 1) does there, the flash attention op, so the model
// calls the point unconditionally.
#include "scalelab/model/context_parallel.h"

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT
#include "scalelab/ops/ops.h"     // defines: attention_forward_flash, attention_backward_flash

namespace scalelab {

std::vector<CpChunk> cp_chunks(const ModelShard& shard, const GPTConfig& cfg, int T_local) {
  const int cp = shard.cp_size, r = shard.cp_rank;
  const int64_t T = int64_t{cp} * T_local;
  SL_CHECK_HINT(T_local > 0 && T <= cfg.max_seq_len,
                "each rank takes T/cp tokens of every sequence: T_local = T / cp_size, T <= max_seq_len",
                "context parallel %s: slices of T_local=%d tokens make sequences of T = %d x %d = %lld, but "
                "max_seq_len=%d",
                shard.str().c_str(), T_local, cp, T_local, static_cast<long long>(T), cfg.max_seq_len);
  if (!shard.cp_zigzag) return {{r * T_local, 0, T_local}};
  SL_CHECK_HINT(T_local % 2 == 0, "the zig-zag cuts each sequence into 2cp equal chunks: T divisible by 2 x cp_size",
                "context parallel %s: T_local=%d is odd (T = %lld is not divisible by 2cp = %d)", shard.str().c_str(),
                T_local, static_cast<long long>(T), 2 * cp);
  const int n = T_local / 2;  // chunk length
  return {{r * n, 0, n}, {(2 * cp - 1 - r) * n, n, n}};
}

void ContextParallel::attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                                        const std::vector<CpChunk>& chunks) {
  (void)chunks;  // cp = 1: the rank holds the whole sequence, one chunk at position 0
  attention_forward_flash(out, lse, qkv, NH);
}

void ContextParallel::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                         const Tensor& lse, int NH, const std::vector<CpChunk>& chunks) {
  (void)chunks;
  attention_backward_flash(dqkv, dout, qkv, out, lse, NH);
}

}  // namespace scalelab
