// op_cost.h — what each op of ops.h costs a GPU, from its shapes alone: FLOPs, bytes moved through device
// memory, the op class and the kernel launches; and its modelled seconds on a GPU model (core/sim_gpu.h),
// the roofline of docs/simulation.md rule 2. The simulated device's clock charges every op by it
// (dispatch.cpp); a planner can sum it over a step without running anything. Pure functions.
// Tests: tests/common/ops/test_op_cost.cpp
//
// What is counted (the op as the kit's CUDA twin runs it, common/src/ops/cuda/, since that is the program
// a GPU would run):
//   flops     the multiply-adds of the op's matrix products, 2 FLOPs each (2 N C OC for a linear layer), as
//             MFU counts them. The elementwise arithmetic around them (bias, softmax, GELU, norms, AdamW)
//             is not counted: it is cheap beside its memory traffic, and leaving it out makes the sum over a
//             step the model FLOPs that MFU divides by. Attention counts what the kernels compute: the
//             materialized op (cuBLAS) the whole T x T square, masked half included (attention.cu says so;
//             PaLM's MFU formula counts attention the same way); the flash op only the causal pairs
//             s <= t, T(T+1)/2 per head, which its kernels visit, and its backward's recomputation
//             (S and P twice: 14 HS FLOPs per pair against the forward's 4).
//   bytes     device-memory traffic: each kernel reads each of its inputs once and writes each output once;
//             an output it adds into (the ops.h += rule) is read and written. A gather or scatter counts
//             one row per index. Caches and small scratch (column partials) are not modelled.
//   launches  the kernels and cuBLAS calls the CUDA twin issues, and the token-range check's kernel where
//             dispatch.cpp runs one (encoder, cross-entropy). Host round trips inside a twin (encoder_backward
//             sorts the tokens on the host; sum_squares copies its result back) are not counted.
// Dimension letters as in ops.h (B, T, C, V, NH, N rows, OC, Vl); n elements of an elementwise op.
#pragma once

#include <cstdint>

#include "scalelab/core/sim_gpu.h"  // defines: GpuModel, OpClass
#include "scalelab/core/tensor.h"   // defines: DType

namespace scalelab {

struct OpCost {
  double flops = 0;  // FLOPs of the matrix products (2 per multiply-add)
  double bytes = 0;  // bytes read + written in device memory
  OpClass op_class = OpClass::MemoryBound;
  DType math = DType::F32;  // the dtype the products run in: its peak applies (bf16 or f32)
  int64_t launches = 0;     // kernels launched
};

// docs/simulation.md rule 2: launches x launch_s + max(flops / (peak(math) x eff(class)),
// bytes / (hbm_bytes_per_s x eff_memory)), in seconds.
double op_seconds(const OpCost& cost, const GpuModel& gpu);

// One function per op of ops.h, the same name, the op's dimensions as arguments.
namespace op_cost {
OpCost encoder_forward(int64_t B, int64_t T, int64_t C);
OpCost encoder_backward(int64_t B, int64_t T, int64_t C);
OpCost layernorm_forward(int64_t N, int64_t C);
OpCost layernorm_backward(int64_t N, int64_t C);
// The fp32 and the bf16 linear layers: operand = the dtype of inp, weight (and dout): f32 or bf16.
OpCost matmul_forward(int64_t N, int64_t C, int64_t OC, bool bias, DType operand = DType::F32);
OpCost matmul_backward(int64_t N, int64_t C, int64_t OC, bool dinp, bool dweight, bool dbias,
                       DType operand = DType::F32);
OpCost attention_forward(int64_t B, int64_t T, int64_t C, int64_t NH);
OpCost attention_backward(int64_t B, int64_t T, int64_t C, int64_t NH);
OpCost attention_forward_flash(int64_t B, int64_t T, int64_t C, int64_t NH);
OpCost attention_backward_flash(int64_t B, int64_t T, int64_t C, int64_t NH);
// The block ops count the visible pairs only (kv_offset + s <= q_offset + t), as the flash op does: a fully
// masked block costs its launches and nothing else, since its kernels skip every tile.
OpCost attention_forward_block(int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, int64_t q_offset,
                               int64_t kv_offset);
OpCost attention_backward_block(int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, int64_t q_offset,
                                int64_t kv_offset);
OpCost attention_merge(int64_t B, int64_t T, int64_t C, int64_t NH);
// Visible (query, key) pairs of one head: #{(t, s) : 0 <= t < Tq, 0 <= s < Tk, kv_offset + s <= q_offset + t}.
double attention_block_pairs(int64_t Tq, int64_t Tk, int64_t q_offset, int64_t kv_offset);
OpCost gelu_forward(int64_t n);
OpCost gelu_backward(int64_t n);
OpCost add_bias(int64_t N, int64_t OC);
OpCost residual_forward(int64_t n);
OpCost residual_backward(int64_t n);
OpCost softmax_crossentropy_forward(int64_t N, int64_t V);
OpCost softmax_crossentropy_backward(int64_t N, int64_t V);
OpCost encoder_forward_vocab_shard(int64_t B, int64_t T, int64_t C, bool wpe);
OpCost encoder_backward_vocab_shard(int64_t B, int64_t T, int64_t C, int64_t Vl, bool dwpe);
OpCost logits_row_max(int64_t N, int64_t Vl);
OpCost crossentropy_vocab_shard_partials(int64_t N, int64_t Vl);
OpCost crossentropy_vocab_shard_finish(int64_t N, int64_t Vl);
OpCost crossentropy_vocab_shard_backward(int64_t N, int64_t Vl);
OpCost adamw_update(int64_t n);
OpCost sgd_update(int64_t n);
OpCost sum_squares(int64_t n);
OpCost scale(int64_t n);
// A dtype conversion (dst != src). The same-dtype cast is a copy: GpuModel::copy_seconds.
OpCost cast(int64_t n, DType dst, DType src);
}  // namespace op_cost

}  // namespace scalelab
