// context_parallel_lab.cpp — lab 10: context parallelism, ring attention (Liu et al. 2023, arXiv:2310.01889)
// and its all-gather variant (Llama 3, Dubey et al. 2024, Sec. 3.3.2): the point where a model split along the
// sequence talks, over the context-parallel group. Declared in labs/10_context_parallel/context_parallel_lab.h;
// the lesson is labs/10_context_parallel/README.md. Only the code between TODO(lab10-N) BEGIN/END is yours to
// write. The code around it (constructors, chunks_of, the row copies, average_grads) is given once, in
// labs/10_context_parallel/cp_given.cpp, and compiled into both tracks.
#include <algorithm>  // defines: std::max, std::min
#include <utility>    // defines: std::swap

#include "context_parallel_lab.h"
#include "scalelab/comm/host_values.h"  // defines: all_reduce_value (the group's mean loss)
#include "scalelab/core/error.h"        // defines: SL_CHECK, SL_CHECK_HINT, scalelab::NotImplemented
#include "scalelab/model/optim.h"       // defines: clip_grad_norm (with groups)
#include "scalelab/ops/ops.h"  // defines: attention_forward_block, attention_backward_block, attention_merge, scale_

namespace scalelab::lab10 {
inline namespace SL_TRACK_LAB10 {

// =============================================================================================
// The layout
// =============================================================================================
Layout make_layout(const GPTConfig& cfg, int world_size, int rank, int tp, int cp, bool zigzag, int seq_len) {
  Layout l;
  // TODO(lab10-1) BEGIN  this rank's place in the layout, or a clear error on every rank
  SL_CHECK_HINT(tp >= 1, "--tp is the size of one tensor-parallel group: 1 (none) or more", "--tp %d", tp);
  SL_CHECK_HINT(cp >= 1 && tp * cp <= world_size,
                "--cp is the size of one context-parallel group: 1 .. the number of ranks / tp",
                "--tp %d x --cp %d = %d ranks, but %d ranks", tp, cp, tp * cp, world_size);
  SL_CHECK_HINT(world_size % (tp * cp) == 0,
                "tp x cp must divide the number of ranks (the rest are data-parallel replicas), e.g. -np 4 with "
                "--cp 2, or -np 8 with --tp 2 --cp 2",
                "--tp %d x --cp %d = %d does not divide %d ranks", tp, cp, tp * cp, world_size);
  ModelShard split;  // the model's own rules for a tp split: NH, 4C and V divisible by tp (numbers, hint)
  split.tp_size = tp;
  split.validate(cfg);
  const int pieces = zigzag ? 2 * cp : cp;  // the zig-zag cuts each sequence into 2 cp chunks
  SL_CHECK_HINT(seq_len % pieces == 0,
                "every rank holds an equal slice: pick --seq-len a multiple of cp (2 cp with --zigzag)",
                "--seq-len %d is not divisible by %d (cp %d%s)", seq_len, pieces, cp, zigzag ? ", zig-zag" : "");
  SL_CHECK_HINT(seq_len <= cfg.max_seq_len, "the whole sequence still needs a position embedding row per token",
                "--seq-len %d > the model's max_seq_len %d", seq_len, cfg.max_seq_len);
  l.tp = tp;
  l.cp = cp;
  l.dp = world_size / (tp * cp);
  l.tp_rank = rank % tp;         // tp fastest: ranks 0..tp-1 split every layer's matrices, inside one node
  l.cp_rank = (rank / tp) % cp;  // then cp: the ring of one tp_rank's heads, tp ranks apart
  l.dp_rank = rank / (tp * cp);  // the replicas of the tp x cp block outermost
  l.zigzag = zigzag;
  l.T_local = seq_len / cp;
  // TODO(lab10-1) END
  return l;
}

// =============================================================================================
// Which blocks to compute
// =============================================================================================
int64_t visible_pairs(const CpChunk& q, const CpChunk& kv) {
  int64_t pairs = 0;
  // TODO(lab10-2) BEGIN  the causal mask's query-key pairs between two chunks, by absolute positions
  // Query position p sees keys kv.position .. min(p, kv_last): max(0, min(p, kv_last) - kv.position + 1) keys.
  const int64_t kv_last = kv.position + kv.length - 1;
  for (int64_t p = q.position; p < q.position + q.length; p++)
    pairs += std::max<int64_t>(0, std::min(p, kv_last) - kv.position + 1);
  // TODO(lab10-2) END
  return pairs;
}

// =============================================================================================
// The ring
// =============================================================================================
void RingAttention::attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                                      const std::vector<CpChunk>& chunks) {
  work_ = CpWork{};
  // TODO(lab10-3) BEGIN  this rank's queries against every rank's keys and values, one block per ring step
  const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3;
  const Device dev = qkv.device();  // CPU, or a simulated GPU (host memory, virtual time)
  const int cp = comm_.size(), r = comm_.rank();
  // One accumulator (out, lse) per query chunk; the kv block in hand and the one arriving from rank r-1.
  std::vector<Tensor> q, acc, acc_lse;
  for (const CpChunk& c : chunks) {
    q.push_back(seq_rows(qkv, c.row, c.length, 0, C));
    acc.push_back(scratch({B, c.length, C}, dev));
    acc_lse.push_back(minus_inf({B, NH, c.length}, dev));
  }
  Tensor kv = seq_rows(qkv, 0, Tl, C, 2 * C), kv_next = scratch({B, Tl, 2 * C}, dev);
  const int next = (r + 1) % cp, prev = (r - 1 + cp) % cp;
  for (int step = 0; step < cp; step++) {
    // Post the hand-over of the block in hand BEFORE computing on it: the transfer runs under the compute.
    WorkPtr transfer;
    if (step + 1 < cp) transfer = comm_.sendrecv_async(kv, next, kv_next, prev, "ring kv");
    if (transfer && !overlap_) transfer->wait();  // the variant that waits: the transfer exposed
    const int owner = (r - step + cp) % cp;       // the block in hand left its owner `step` hops ago
    const std::vector<CpChunk> kv_chunks = chunks_of(owner, static_cast<int>(Tl));
    for (size_t i = 0; i < chunks.size(); i++)
      for (const CpChunk& d : kv_chunks) {
        const int64_t pairs = visible_pairs(chunks[i], d);
        if (pairs == 0) {  // wholly in the queries' future: nothing to add
          work_.blocks_skipped++;
          continue;
        }
        Tensor part = scratch({B, chunks[i].length, C}, dev), part_lse = scratch({B, NH, chunks[i].length}, dev);
        attention_forward_block(part, part_lse, q[i], seq_rows(kv, d.row, d.length, 0, 2 * C), NH, chunks[i].position,
                                d.position);
        attention_merge(acc[i], acc_lse[i], part, part_lse, NH);  // the online-softmax rule, by lse
        work_.pairs += pairs;
        work_.blocks_computed++;
      }
    if (transfer) {
      transfer->wait();
      std::swap(kv, kv_next);
    }
  }
  out.zero_();
  for (size_t i = 0; i < chunks.size(); i++) {
    add_seq_rows(out, acc[i], chunks[i].row, 0);
    set_lse_rows(lse, acc_lse[i], chunks[i].row);
  }
  // TODO(lab10-3) END
}

void RingAttention::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                       const Tensor& lse, int NH, const std::vector<CpChunk>& chunks) {
  // TODO(lab10-4) BEGIN  dq here; dk, dv travel round the ring with their kv block and home again
  const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3;
  const Device dev = qkv.device();  // CPU, or a simulated GPU (host memory, virtual time)
  const int cp = comm_.size(), r = comm_.rank();
  Tensor kv = seq_rows(qkv, 0, Tl, C, 2 * C), kv_next = scratch({B, Tl, 2 * C}, dev);
  Tensor dkv = scratch({B, Tl, 2 * C}, dev), dkv_next = scratch({B, Tl, 2 * C}, dev);
  Tensor dq = scratch({B, Tl, C}, dev);
  const int next = (r + 1) % cp, prev = (r - 1 + cp) % cp;
  for (int step = 0; step < cp; step++) {
    WorkPtr kv_transfer;  // the next kv block can travel while this one is used (it does not change)
    if (step + 1 < cp) kv_transfer = comm_.sendrecv_async(kv, next, kv_next, prev, "ring kv (backward)");
    if (kv_transfer && !overlap_) kv_transfer->wait();  // the variant that waits, as in the forward
    const int owner = (r - step + cp) % cp;
    const std::vector<CpChunk> kv_chunks = chunks_of(owner, static_cast<int>(Tl));
    for (const CpChunk& c : chunks) {
      const Tensor q_c = seq_rows(qkv, c.row, c.length, 0, C), dout_c = seq_rows(dout, c.row, c.length, 0, C);
      const Tensor out_c = seq_rows(out, c.row, c.length, 0, C), lse_c = lse_rows(lse, c.row, c.length);
      Tensor dq_c = scratch({B, c.length, C}, dev);
      for (const CpChunk& d : kv_chunks) {
        if (visible_pairs(c, d) == 0) continue;
        Tensor dkv_d = scratch({B, d.length, 2 * C}, dev);
        attention_backward_block(dq_c, dkv_d, dout_c, q_c, seq_rows(kv, d.row, d.length, 0, 2 * C), out_c, lse_c, NH,
                                 c.position, d.position);
        add_seq_rows(dkv, dkv_d, d.row, 0);  // this rank's queries' share of the owner's dk, dv
      }
      add_seq_rows(dq, dq_c, c.row, 0);
    }
    // The dkv block follows its kv block to rank r+1 (which holds it next); after the last step one more hop
    // brings every dkv home: rank r then holds the block of owner r+1, and passes it on to r+1.
    comm_.sendrecv(dkv, next, dkv_next, prev, "ring dkv");
    std::swap(dkv, dkv_next);
    if (kv_transfer) {
      kv_transfer->wait();
      std::swap(kv, kv_next);
    }
  }
  add_seq_rows(dqkv, dq, 0, 0);
  add_seq_rows(dqkv, dkv, 0, C);
  // TODO(lab10-4) END
}

// =============================================================================================
// The all-gather variant
// =============================================================================================
void AllGatherAttention::attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                                           const std::vector<CpChunk>& chunks) {
  work_ = CpWork{};
  // TODO(lab10-5) BEGIN  gather every rank's kv (B, Tl, 2C) into (cp, B, Tl, 2C), then every block at once
  const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3;
  const Device dev = qkv.device();  // CPU, or a simulated GPU (host memory, virtual time)
  const int cp = comm_.size();
  const Tensor kv = seq_rows(qkv, 0, Tl, C, 2 * C);
  Tensor all_kv = scratch({cp, B, Tl, 2 * C}, dev);
  comm_.all_gather(kv, all_kv, "all-gather kv");
  out.zero_();
  for (const CpChunk& c : chunks) {
    const Tensor q_c = seq_rows(qkv, c.row, c.length, 0, C);
    Tensor acc = scratch({B, c.length, C}, dev), acc_lse = minus_inf({B, NH, c.length}, dev);
    Tensor part = scratch({B, c.length, C}, dev), part_lse = scratch({B, NH, c.length}, dev);
    for (int owner = 0; owner < cp; owner++) {
      const Tensor kv_j = all_kv.view(owner * kv.numel(), {B, Tl, 2 * C});
      for (const CpChunk& d : chunks_of(owner, static_cast<int>(Tl))) {
        const int64_t pairs = visible_pairs(c, d);
        if (pairs == 0) {
          work_.blocks_skipped++;
          continue;
        }
        attention_forward_block(part, part_lse, q_c, seq_rows(kv_j, d.row, d.length, 0, 2 * C), NH, c.position,
                                d.position);
        attention_merge(acc, acc_lse, part, part_lse, NH);
        work_.pairs += pairs;
        work_.blocks_computed++;
      }
    }
    add_seq_rows(out, acc, c.row, 0);
    set_lse_rows(lse, acc_lse, c.row);
  }
  // TODO(lab10-5) END
}

void AllGatherAttention::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                            const Tensor& lse, int NH, const std::vector<CpChunk>& chunks) {
  // TODO(lab10-5) BEGIN  every owner's dk, dv from this rank's queries, summed at the owner by a reduce-scatter
  const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3;
  const Device dev = qkv.device();  // CPU, or a simulated GPU (host memory, virtual time)
  const int cp = comm_.size();
  const Tensor kv = seq_rows(qkv, 0, Tl, C, 2 * C);
  Tensor all_kv = scratch({cp, B, Tl, 2 * C}, dev), all_dkv = scratch({cp, B, Tl, 2 * C}, dev);
  comm_.all_gather(kv, all_kv, "all-gather kv (backward)");  // not kept from the forward: memory as the ring
  Tensor dq = scratch({B, Tl, C}, dev);
  for (const CpChunk& c : chunks) {
    const Tensor q_c = seq_rows(qkv, c.row, c.length, 0, C), dout_c = seq_rows(dout, c.row, c.length, 0, C);
    const Tensor out_c = seq_rows(out, c.row, c.length, 0, C), lse_c = lse_rows(lse, c.row, c.length);
    Tensor dq_c = scratch({B, c.length, C}, dev);
    for (int owner = 0; owner < cp; owner++) {
      const Tensor kv_j = all_kv.view(owner * kv.numel(), {B, Tl, 2 * C});
      Tensor dkv_j = all_dkv.view(owner * kv.numel(), {B, Tl, 2 * C});
      for (const CpChunk& d : chunks_of(owner, static_cast<int>(Tl))) {
        if (visible_pairs(c, d) == 0) continue;
        Tensor dkv_d = scratch({B, d.length, 2 * C}, dev);
        attention_backward_block(dq_c, dkv_d, dout_c, q_c, seq_rows(kv_j, d.row, d.length, 0, 2 * C), out_c, lse_c, NH,
                                 c.position, d.position);
        add_seq_rows(dkv_j, dkv_d, d.row, 0);
      }
    }
    add_seq_rows(dq, dq_c, c.row, 0);
  }
  Tensor dkv = scratch({B, Tl, 2 * C}, dev);
  comm_.reduce_scatter(all_dkv, dkv, ReduceOp::Sum, "reduce-scatter dkv");  // owner r gets chunk r, summed
  add_seq_rows(dqkv, dq, 0, 0);
  add_seq_rows(dqkv, dkv, 0, C);
  // TODO(lab10-5) END
}

// =============================================================================================
// One training step
// =============================================================================================
StepResult train_step(GPT2& model, Optimizer& optimizer, Communicator* tp_group, Communicator& cp_group,
                      Communicator* dp_group, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip) {
  SL_CHECK(!micro_batches.empty(), "train_step needs at least one micro-batch");
  StepResult r;
  // TODO(lab10-6) BEGIN  one optimizer step of a context-parallel shard
  const int T_local = static_cast<int>(micro_batches[0].inputs.size(1)) / model.shard().cp_size;
  const std::vector<CpChunk> chunks = cp_chunks(model.shard(), model.config(), T_local);
  model.zero_grad();
  double loss = 0.0;
  for (const MicroBatch& mb : micro_batches) {
    const Tensor inputs = slice_sequence(mb.inputs, chunks, T_local);
    const Tensor targets = slice_sequence(mb.targets, chunks, T_local);
    loss += model.forward(inputs, &targets);  // the mean over this rank's B x T_local tokens
    model.backward();
  }
  const int m = static_cast<int>(micro_batches.size());
  if (m > 1)
    for (int u = 0; u < model.num_units(); ++u)
      if (model.owns_unit(u)) scale_(model.unit_grads(u), 1.0f / static_cast<float>(m));
  // Equal slices: the whole sequence's mean loss is the cp ranks' average, and so is its gradient. The cp and
  // dp groups hold this rank's tp_rank only: they average this tp shard's gradients.
  average_grads(model, cp_group, "cp");
  if (dp_group != nullptr && dp_group->size() > 1) average_grads(model, *dp_group, "dp");
  const float group_loss = all_reduce_value(cp_group, static_cast<float>(loss / m), ReduceOp::Avg, "cp loss");
  // The whole model's norm: the tp shards' squares added over the tp group (a replicated tensor counted once).
  r.grad_norm = clip_grad_norm(model, grad_clip, {tp_group});
  optimizer.step(lr);
  r.loss = group_loss;
  // TODO(lab10-6) END
  return r;
}

}  // namespace SL_TRACK_LAB10
}  // namespace scalelab::lab10
