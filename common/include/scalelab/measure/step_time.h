// step_time.h — the predicted time of one optimizer step of GPT-2 under a tp x pp x dp layout, beside the
// memory estimator (memory_estimator.h): the step-time half of lab 09's planner (issue 20, item 3).
//
//   compute   the FLOPs of the slowest stage per micro-batch (lab 06's partition: the first stage with
//             ceil(L/pp) blocks and the embedding, or the last with floor(L/pp) and the head) (gpt2 forward 2 FLOPs a MAC per weight, plus
//             attention's 4*T*C a token a layer; backward twice the forward; recompute_flops_per_token on
//             top), divided by tp, at `flops_per_s` per device (lab 00's calibration on CPU, a datasheet
//             peak times an efficiency on a GPU);
//   tp        per block and micro-batch (plus the vocabulary-parallel embedding, head and cross-entropy),
//             Megatron's collectives (Shoeybi et al. 2019, Sec. 3): 2 all-reduces
//             of the (B,T,C) activation forward and 2 backward, or with sequence parallelism (Korthikanti et
//             al. 2022, Sec. 4.2.2) an all-gather and a reduce-scatter in place of each; full recompute
//             repeats the forward's. On the critical path (not overlapped);
//   pp        per micro-batch and stage boundary, one send of the stage's output forward and one of its
//             gradient backward;
//   bubble    GPipe and 1F1B (Narayanan et al. 2021, Sec. 2.2): (m + p - 1) slots of one micro-batch's
//             forward + backward + tp + pp time, of which p - 1 are the bubble: fraction (p - 1) / m of the
//             ideal;
//   dp        after the last micro-batch, the all-reduce of the first stage's fp32 gradients (ZeRO-1: a
//             reduce-scatter of them and an all-gather of the parameters), and with pp > 1 the embedding
//             group's all-reduce of wte's gradient (Megatron's tied embedding rule). Not overlapped.
// Every link time is LinkModel::seconds (the alpha-beta model the simulated communicator charges).
// Not yet validated against measured runs (issue 20, item 5); what it leaves out: data loading, the
// optimizer step, kernel launch and host overheads, any overlap of communication with compute, the tp
// all-reduce of replicated parameters' gradients, and the interleaved schedule.
// Tests: tests/common/measure/test_step_time.cpp
#pragma once

#include <cstdint>
#include <string>

#include "scalelab/comm/comm.h"   // defines: LinkModel
#include "scalelab/model/gpt2.h"  // defines: GPTConfig, Recompute

namespace scalelab {

// A layout of one training step. world size = tp * pp * dp.
struct StepLayout {
  int tp = 1, pp = 1, dp = 1;
  int micro_batch = 1;     // B: sequences per micro-batch per data-parallel replica
  int micro_batches = 1;   // m: micro-batches per optimizer step (pipeline micro-batches or accumulation)
  int seq_len = 128;       // T
  bool sequence_parallel = false;
  bool zero1 = false;      // optimizer state sharded over dp: reduce-scatter + all-gather instead of all-reduce
  Recompute recompute = Recompute::None;
};

// The machine: what one device computes and the links each group uses.
struct StepCluster {
  double flops_per_s = 0;  // FLOP/s one device sustains on the model's work (> 0)
  LinkModel tp_link, pp_link, dp_link;  // "none" (LinkModel{}): that group's communication is free
};

// Milliseconds of one optimizer step and their parts.
struct StepTime {
  double forward_ms = 0;     // one micro-batch's forward on the slowest stage (compute only)
  double backward_ms = 0;    // its backward, recompute included
  double tp_ms = 0;          // one micro-batch's tensor-parallel collectives on that stage
  double pp_ms = 0;          // one micro-batch's sends on that stage, forward and backward
  double slot_ms = 0;        // forward + backward + tp + pp: one micro-batch through a stage
  double pipeline_ms = 0;    // (m + p - 1) slots
  double bubble_ms = 0;      // (p - 1) slots of it
  double dp_ms = 0;          // gradient all-reduce (or ZeRO-1's pair) and the embedding all-reduce
  double step_ms = 0;        // pipeline_ms + dp_ms
  double tokens_per_s = 0;   // global batch tokens (dp * m * B * T) / step
  double mfu = 0, hfu = 0;   // of all tp*pp*dp devices at flops_per_s (hfu: with the recompute's FLOPs)
};

// The prediction. Throws scalelab::Error, with the numbers and a hint, when the layout does not fit the
// model (NH % tp, 4C % tp, V % tp, pp > L, B*T % tp under sequence parallelism, sizes < 1) or the cluster
// has no compute (flops_per_s <= 0).
StepTime estimate_step_time(const GPTConfig& cfg, const StepLayout& layout, const StepCluster& cluster);

}  // namespace scalelab
