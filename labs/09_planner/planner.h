// planner.h — what the learner writes in lab 09 (the planner), declared once for both tracks.
//   labs/09_planner/planner.cpp       the learner's file (TODO blocks)   -> lab09_learner
//   solutions/09_planner/planner.cpp  the reference (same file, filled)  -> lab09_ref
//   labs/09_planner/layouts.cpp       the given code (the "Given" section below): compiled into both
//   labs/09_planner/plan_cli.cpp      libraries, each calling its own track's functions (plan_cli.cpp: the
//                                     command line, run by lab 09's program and by bin/sl_plan)
//   labs/09_planner/cp_terms.cpp      the given context-parallel axis (lab 10's ring, priced around yours)
// The functions live in distinct inline namespaces (scalelab::lab09::learner / ::ref) chosen by
// SL_TRACK_LAB09, which CMake sets per library; code that includes this header without it gets ref. The
// plain types above them are shared by both tracks, so one test can hand the same Layout to either.
// Lesson: labs/09_planner/README.md   Graded tests: tests/lab09/   CLI: labs/09_planner/plan_cli.cpp (bin/sl_plan)
//
// Which layout trains this model fastest on this cluster, and does it fit? A layout is tp x pp x dp (x cp, the
// context-parallel split of lab 10, priced by given code: "Context parallelism" below) with a micro-batch B,
// m micro-batches, a ZeRO stage over dp, sequence parallelism and activation recompute. For each, the planner
// predicts
//   memory per device   the model state of the device's shard (lab 04's exact count, common's
//                       estimate_model_state) and the activation sets its pipeline stage holds at once
//                       (lab 06's schedules; common's gpt2_activation_bytes), on the fullest stage;
//   step time           the FLOPs of the slowest stage at a sustained FLOP/s, the collectives of every
//                       group on its link (the alpha-beta model the simulated communicator charges:
//                       LinkModel::seconds), the pipeline bubble, and the optimizer's pass over its state;
// then drops what does not fit (saying why) and ranks the rest by predicted tokens/s. Labs 01 and 06 are
// linked from their REFERENCE: lab 01's flops_per_token and mfu, lab 06's partition and schedules.
// What you write:
//   activation sets       how many micro-batches' activations each schedule keeps on a stage      TODO lab09-1
//   memory of a device    its state and its activations, at that stage                          TODO lab09-2
//   compute               the FLOPs of one micro-batch on a stage: forward, backward, recompute  TODO lab09-3
//   communication         tp and pp per micro-batch; dp and the embedding group per step         TODO lab09-4
//   the step              slots, bubble, dp, optimizer; tokens/s, MFU and HFU                    TODO lab09-5
//   the plan              every layout of the cluster, what fits, ranked                        TODO lab09-6
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline_parallel.h"        // defines: lab06::ScheduleKind, make_layout, chunk_shard (lab 06's reference)
#include "scalelab/comm/comm.h"       // defines: LinkModel
#include "scalelab/core/error.h"      // defines: scalelab::Error
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel (per-op pricing)
#include "scalelab/measure/memory_estimator.h"  // defines: ModelStateBytes, estimate_model_state, gpt2_activation_bytes
#include "scalelab/model/gpt2.h"                // defines: GPTConfig, ModelShard, Recompute, AttentionImpl
#include "scalelab/model/optim.h"               // defines: OptimizerConfig::Kind

#ifndef SL_TRACK_LAB09
#define SL_TRACK_LAB09 ref
#endif

namespace scalelab::lab09 {

// ---------------------------------------------------------------------------------------------
// What is planned (shared by both tracks)

// The machine: identical devices in nodes. World ranks fill a node before the next, tp fastest-varying,
// then cp, then dp, then pp (lab 07's default order tp-dp-pp, Megatron-LM's, with its cp after tp): a group
// whose members lie within `extent` consecutive world ranks stays inside a node when extent <= devices_per_node
// (README.md#the-cluster).
struct Cluster {
  int devices = 8;  // all of them; a layout uses every one (tp * pp * dp * cp == devices)
  int devices_per_node = 8;
  double memory_bytes = 80e9;        // bytes per device
  double peak_flops_per_s = 989e12;  // FLOP/s of one device: MFU's denominator (a datasheet peak, or lab 00's
                                     // calibration on a CPU)
  double efficiency = 0.5;           // the fraction of the peak the model's FLOPs run at (1 with a CPU calibration)
  double memory_bandwidth_bytes_per_s = 0;  // the optimizer step's pass over its state; 0: not modelled
  LinkModel intra, inter;                   // a group inside one node / one that spans nodes
  // Lab 04 part 3's offload (Workload::offload_optimizer), the simulated GPU's figures (core/sim_gpu.h,
  // docs/simulation.md rules 3 and 8): the host link one way (PCIe 5.0 x16's 50 GB/s), a copy's launch, and
  // the host's memory bandwidth its AdamW streams at (50 GB/s a GPU: a teaching value, a model)
  double host_link_bytes_per_s = 50e9;
  double host_copy_launch_s = 5e-6;
  double host_memory_bytes_per_s = 50e9;
  double flops_per_s() const { return peak_flops_per_s * efficiency; }  // sustained, FLOP/s
};

// What is trained.
struct Workload {
  int seq_len = 1024;    // T
  int global_batch = 8;  // sequences per optimizer step, all replicas together
  PrecisionPolicy policy = PrecisionPolicy::bf16_mixed();
  OptimizerConfig::Kind optimizer = OptimizerConfig::Kind::AdamW;
  AttentionImpl attention = AttentionImpl::Materialized;
  int prefetch = 1;               // ZeRO-3: all-gathers in flight beyond the unit in use
  int activation_bytes = 4;       // bytes of one activation element on the wire (tp, pp): 4 in this kit (fp32
                                  // activations); 2 in 16-bit frameworks (Megatron-LM). Memory stays this kit's.
  int lora_rank = 0;              // > 0: a LoRA fine-tune (Hu et al. 2021, arXiv:2106.09685): the 16-bit base is
                                  // frozen; adapters of this rank on the four matrices of every block train
  bool overlap_dp = false;        // dp's gradient communication runs during the backward it follows (lab 03's
                                  // overlap); false: after the last micro-batch, as labs 04-07 run
  bool pp_scatter_gather = false;  // pp with tp > 1 and no sequence parallelism: each tp rank sends 1/tp of the
                                  // boundary activation and the receiving stage all-gathers it over tp (Narayanan
                                  // et al. 2021, Sec. 4.1, "scatter/gather"; Megatron-LM's default); false: every
                                  // tp rank sends the whole (B, T, C), as lab 07 does
  bool grad_clipped = true;       // per-op pricing: the clipping's scale runs (the norm above --grad-clip, as early
                                  // in training); false: it does not (--grad-clip 0, or a --timing-only run, whose
                                  // norm reads 0)
  bool offload_optimizer = false;  // lab 04 part 3's --offload optimizer (ZeRO-Offload, Ren et al. 2021): the
                                   // optimizer state and its update on the host (offload_memory, with_offload)
  double uniform_compute_ms = 0;  // a simulated device (labs 06 and 07's --uniform-compute-ms): a stage's
                                  // forward of one micro-batch takes this long whatever its FLOPs, its backward
                                  // twice; 0: the stage's FLOPs at Cluster::flops_per_s
};

// One candidate layout.
struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int micro_batch = 1;    // B: sequences per micro-batch
  int micro_batches = 1;  // m: micro-batches per optimizer step per replica (pipeline or accumulation)
  lab06::ScheduleKind schedule = lab06::ScheduleKind::OneFOneB;  // lab 06's; the planner tries 1F1B
  int chunks = 1;      // v: model chunks per pipeline rank (the interleaved schedule only)
  int zero_stage = 0;  // 0..3 over the dp group (lab 04)
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  // Context parallel (lab 10): ranks that split every sequence, T / cp tokens each with the whole stage's
  // parameters; the zig-zag ring (two chunks a rank, balanced causal work). 1: none. Your functions below
  // never read it: the given "Context parallelism" functions hand them one cp rank's T / cp tokens.
  int cp = 1;
  int devices() const { return tp * pp * dp * cp; }
};

// The memory of one device: at the fullest pipeline stage (device_memory), or at a given one (stage_memory).
struct DeviceMemory {
  int stage = 0;            // the pipeline stage these bytes are of
  int sets = 0;             // activation sets it holds at once (per chunk with chunks > 1)
  ModelStateBytes state;    // bytes: the largest params, grads and optimizer state during a step
  int64_t activations = 0;  // bytes: the sets, the backward scratch and the recompute buffers
  int64_t total() const { return state.total() + activations; }
};

// FLOPs of one micro-batch on one device of a stage (all its chunks), 2 FLOPs a multiply-add.
struct StageFlops {
  double forward = 0;    // the stage's blocks and (last stage) the tied LM head
  double backward = 0;   // gradients of the inputs and of the weights
  double recompute = 0;  // what the backward runs again (selective: attention; full: the blocks' forward)
  double total() const { return forward + backward + recompute; }
};

// Seconds of one micro-batch's communication on one device of a stage, on the critical path.
struct StageComm {
  double tp_s = 0;  // the tensor-parallel collectives inside its forward and backward
  double pp_s = 0;  // the sends to its neighbours: the activation forward, its gradient back
};

// The predicted step, milliseconds.
struct StepTime {
  int slowest_stage = 0;        // the stage whose slot sets the pace
  double compute_ms = 0;        // one micro-batch's FLOPs on that stage at Cluster::flops_per_s
  double tp_ms = 0, pp_ms = 0;  // its communication (StageComm)
  double slot_ms = 0;           // compute + tp + pp: one micro-batch through the slowest stage
  double pipeline_ms = 0;       // the schedule: m slots of work and the bubble
  double bubble_ms = 0;         // (p - 1) / v slots of it (0 for p = 1)
  double dp_ms = 0;             // the dp group's gradient communication and the embedding group's, exposed
                                // (cp > 1: and the cp group's gradient all-reduce, cp_step_time)
  double optimizer_ms = 0;      // the optimizer's pass over its state at memory bandwidth (0: not modelled)
  double step_ms = 0;           // pipeline + dp + optimizer
  double tokens_per_s = 0;      // dp * m * B * T / step
  double mfu = 0;               // lab 01's flops_per_token (the whole model's) x tokens/s / (devices x peak)
  double hfu = 0;               // the same with the recompute's FLOPs (Korthikanti et al. 2022, Sec. 6)
  double cp_ms = 0;             // cp > 1 (cp_step_time): the ring's exposed kv hand-overs in one slot (in slot_ms)
};

// One row of the plan.
struct Candidate {
  Layout layout;
  DeviceMemory memory;
  StepTime time;
  bool fits = false;
  std::string why_not;  // "" when it fits; else what refused it (the model, the batch, the memory)
};

// The groups' links of a layout on a cluster: tp spans tp ranks, cp tp*cp, dp tp*cp*dp, pp all of them (the
// order above).
struct GroupLinks {
  LinkModel tp, pp, dp;
  LinkModel cp;  // the context-parallel ring's (lab 10)
};

inline namespace SL_TRACK_LAB09 {

// ---------------------------------------------------------------------------------------------
// Given

// "tp 2 pp 2 dp 4 | B 2 x m 8 | 1f1b | zero 1 | sp | recompute selective"
std::string to_string(const Layout& x);
// "16 devices, 4 a node, 16.0 GB each, 989 TFLOP/s x 0.50; links nvlink inside a node, infiniband across"
std::string to_string(const Cluster& c);

// The elements of every parameter the shard holds (common's gpt2_unit_numel, summed), and its transformer
// blocks (first_layer .. last(cfg)).
int64_t shard_numel(const GPTConfig& cfg, const ModelShard& s);
int shard_blocks(const GPTConfig& cfg, const ModelShard& s);

// Throws scalelab::Error, with a hint, on a model that does not validate, a cluster with no devices,
// devices_per_node < 1 or no compute, or a global batch or T < 1: plan refuses these before your code runs.
void check_plan_inputs(const GPTConfig& cfg, const Workload& w, const Cluster& c);

// Throws scalelab::Error, with the numbers and what to change, unless the layout can train this model on
// this cluster: every size >= 1; tp * pp * dp * cp == devices; dp * B * m == the global batch; the model splits
// by tp (ModelShard::validate: NH, 4C, V) and by pp (lab06::make_layout: p <= L; interleaved: m a multiple
// of p, L divisible by p * v); ZeRO stage 0..3; sequence parallelism only with tp > 1 and B*T divisible by
// tp; LoRA only with ZeRO 0 and without pipeline or tensor parallelism; cp > 1 (check_context_parallel): T
// divisible by 2 cp, flash attention, no sequence parallelism, no LoRA, no uniform compute.
void check_layout(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c);

// The shard of chunk `chunk` of pipeline stage `stage`: lab 06's partition (virtual stage chunk * p + stage)
// sliced by tp (tp rank 0: every rank of a tp group holds the same sizes), with sequence parallelism; cp > 1:
// cp rank 0 of the zig-zag (every cp rank holds the same parameters and T / cp tokens).
ModelShard chunk_shard(const GPTConfig& cfg, const Layout& x, int stage, int chunk);

// tp: intra when tp <= devices_per_node; cp: when tp * cp is; dp: when tp * cp * dp is; pp (and the
// embedding group): when tp * cp * dp * pp is; else inter.
GroupLinks group_links(const Cluster& c, const Layout& x);

// LoRA's trainable adapters on one shard (tp 1): a (r, in) and b (out, r) on each block's c_attn (C -> 3C),
// attn c_proj (C -> C), c_fc (C -> 4C) and mlp c_proj (4C -> C): 16 r C elements a block. Elements.
int64_t lora_adapter_numel(const GPTConfig& cfg, const ModelShard& shard, int rank);

// Of the `sets` chunk sets a stage holds at its peak (activation_sets), those of chunk `chunk`: the first
// `sets` forwards of the interleaved schedule, p to a chunk, chunk 0 first, round and round (lab 06). All of
// them when chunks == 1. The total is lab 06's; the split is the warm-up's, which can differ from the split
// at the byte peak by a set (the validation measured 512 bytes more: README.md#validation-the-kits-own-runs).
int chunk_sets(const Layout& x, int sets, int chunk);

// The message and the hint of an error's report, on one line: "NH=12 heads not divisible by tp=8 (the
// tensor-parallel degree must divide ...)". A refused candidate's why_not.
std::string refusal_text(const Error& e);

// "" when the device's memory holds it; else "needs 3.20 GB a device (stage 0), has 1.00 GB": a candidate's
// why_not for memory.
std::string memory_refusal(const DeviceMemory& m, const Cluster& c);

// The fullest stage: stage_memory of every stage (offload_memory of it with w.offload_optimizer), the one
// with the largest total (the first on a tie); cp > 1: stage_memory of one cp rank (cp_local_workload: its
// T / cp tokens).
DeviceMemory device_memory(const GPTConfig& cfg, const Layout& x, const Workload& w);

// One row of a plan for layout x: x checked (check_layout), its device_memory and its step (cp_step_time: your
// step_time when x.cp == 1); fits when memory_refusal is "", else why_not says what it needs. A layout
// check_layout refuses is kept with fits = false and why_not its refusal_text; scalelab::NotImplemented (a TODO
// of this lab not written yet) is not a refusal and passes through. What the given cp axis (plan_with_cp)
// evaluates its rows with; your plan decides its rows' fate itself (TODO lab09-6). README.md#the-plan
Candidate evaluate_candidate(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c);

// The plan's order, in place (a stable sort): the fitting rows first, by tokens/s (highest first; a tie: less
// memory first), then the refused ones in the order given. What plan_with_cp and the command line's offload
// re-rank with; your plan ranks its rows itself (TODO lab09-6). README.md#the-plan
void rank_candidates(std::vector<Candidate>& rows);

// "tp 4 inside a node (nvlink), pp 2 across nodes (infiniband), dp 2 on top; ..." and the prediction.
std::string explain(const Candidate& c, const Cluster& cluster);

// ---------------------------------------------------------------------------------------------
// Offload (given): lab 04 part 3's --offload optimizer in the plan (ZeRO-Offload, Ren et al., USENIX ATC
// 2021, Sec. 4; labs/04_fsdp/README.md "Part 3: offload"). Memory: the device holds no optimizer state
// (estimate_memory's offload terms, which lab 04's allocator equals). Time: lab 04's reference schedule on
// the simulator's model: every unit's gradient shard down at once (fp32, on the device-to-host copy
// stream), the host's update of each unit as its gradient lands (op_cost's AdamW or SGD bytes, and the bf16
// rounding, at Cluster::host_memory_bytes_per_s), its parameters up (the parameter dtype) as it is done,
// waited for at once for the units kept gathered (ZeRO-3: embeddings and ln_f; ZeRO 0-2: every unit), a
// ZeRO-3 block's left in flight behind the next forward (taken as hidden). Units kept gathered first.

// The once-a-step offload of one device of stage `stage` (all its chunks, its 1/dp shard at ZeRO >= 1).
struct OffloadStep {
  int64_t down_bytes = 0;  // gradients to the host, bytes
  int64_t up_bytes = 0;    // parameters to the device, bytes
  double host_s = 0;       // the host's update, seconds (the sum over units)
  double step_s = 0;       // from the first copy down to the host's last update or awaited upload, seconds
};
OffloadStep offload_step(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w, const Cluster& c);
// The memory of a device with w.offload_optimizer: m with its optimizer state (persistent and peak) moved
// off the device; m unchanged otherwise.
DeviceMemory offload_memory(DeviceMemory m, const Workload& w);
// A step with w.offload_optimizer: the GPU's optimizer pass (optimizer_ms) replaced by the slowest stage's
// offload_step, the step, tokens/s, MFU and HFU with it; t unchanged otherwise.
StepTime with_offload(const StepTime& t, const GPTConfig& cfg, const Layout& x, const Workload& w,
                      const Cluster& c);

// ---------------------------------------------------------------------------------------------
// Per-op pricing (given): a simulated GPU's step, op by op (docs/labs/09_planner.md, "Per-op pricing")
//
// On the simulated GPU (--device sim) every op is charged by common's per-op cost model (ops/op_cost.h:
// launches, FLOPs at the class's efficiency, bytes at HBM bandwidth) and every copy and zeroing by
// GpuModel::copy_seconds / zero_seconds. These functions sum the same charges over the ops GPT2's forward
// and backward (common/src/model/gpt2.cpp) and the optimizer step (common/src/model/optim.cpp) issue, so
// the planner can price a step without FLOP/s and efficiency: your step_time then runs on them. Priced:
// tp 1, an fp32 policy (no casts), AdamW, any pipeline stage, recompute none/selective/full, either
// attention; check_per_op_pricing refuses the rest.

// Seconds of one micro-batch of B sequences on one device of stage `stage` (all its chunks): its forward
// (the input's copy in, the embedding, the blocks, the head and loss, the loss copied to the host) and its
// backward (with what it recomputes, the zeroed scratch, the gradient handed back).
struct StageOpSeconds {
  double forward = 0;
  double backward = 0;
};
// Throws scalelab::Error, with what to change, for what the pricing does not cover (the list above).
void check_per_op_pricing(const Layout& x, const Workload& w);
StageOpSeconds stage_op_seconds(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w,
                                const GpuModel& gpu);
// Seconds of the once-a-step ops of stage `stage`: the micro-batches' tokens and targets copied from the
// host, the gradients zeroed (and with m > 1 scaled by 1/m), the gradient norm's sums of squares (common's grad_sum_squares: a unit whole,
// or tensor by tensor where it holds the tied copy of wte or, on a tp rank other than 0, tensors rank 0
// counts; ZeRO >= 1: each unit's 1/dp shard, as lab 04 sums it) and the host values that carry the sum over
// the groups that split the model (tp, pp; ZeRO >= 1: dp), the clipping's scale (w.grad_clipped) and
// AdamW's update of every parameter it holds (ZeRO >= 1: its 1/dp of every unit, priced as a 1/dp slice of
// each parameter). With tp > 1 the norm is priced on a rank other than 0 (the one with more to sum).
double step_op_seconds(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w, const GpuModel& gpu);
// Your step_time with its compute priced op by op: each stage's micro-batch (stage_op_seconds) as
// w.uniform_compute_ms set to a third of the slowest stage's (step_time's slot: a forward and a backward
// twice it, 3 u), the optimizer's pass left to the once-a-step ops (memory bandwidth 0 in your formula,
// step_op_seconds added after, with the norm's all-reduces on their links: optimizer_ms), tokens/s and MFU
// recomputed from the new step. The links and peak are c's.
StepTime per_op_step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c,
                          const GpuModel& gpu);

// ---------------------------------------------------------------------------------------------
// Context parallelism (given, cp_terms.cpp): lab 10's split of every sequence over cp ranks, priced around
// your functions (docs/context_parallel.md, "The planner's cp axis")
//
// A cp rank holds T / cp tokens of every sequence (lab 10's zig-zag: chunks r and 2cp-1-r of 2 cp) and the
// whole parameters of its stage. Its memory: activations of a model run at T / cp (device_memory hands your
// stage_memory cp_local_workload), model state as without cp (the cp group averages the gradients as dp does;
// ZeRO shards over dp only, as lab 10 keeps whole parameters). Its time: your step_time at T / cp, plus what
// T / cp leaves out: attention against the whole sequence (the rank's share of the causal query-key pairs),
// the ring's kv hand-overs on the cp link beyond the block compute each overlaps, the dkv hand-overs home
// (Liu et al. 2023, "Ring Attention", arXiv:2310.01889, Sec. 3; lab 10's RingAttention), and the cp group's
// gradient all-reduce and loss average.

// Throws scalelab::Error, with a hint, unless cp > 1 runs as lab 10 runs it: T divisible by 2 cp (the
// zig-zag's chunks), flash attention (no T x T scores: lab 10's shards run the flash op), no sequence
// parallelism (both would split the sequence), no LoRA, no uniform compute (lab 10 has no such option).
// cp == 1: nothing to check. check_layout calls it.
void check_context_parallel(const Layout& x, const Workload& w);

// The workload one cp rank runs: w with seq_len T / cp (x.cp == 1: w itself).
Workload cp_local_workload(const Layout& x, const Workload& w);

// The busiest cp rank's share of one sequence's causal query-key pairs (key position <= query position),
// counted chunk pair by chunk pair as lab 10's visible_pairs: zig-zag (2 cp chunks, rank r holding r and
// 2cp-1-r) exactly 1 / cp; contiguous (rank r holding chunk r of cp) about (2 cp - 1) / cp^2, on rank cp - 1.
// Throws scalelab::Error unless cp >= 1 and T divides into the chunks.
double cp_attention_share(int cp, int T, bool zigzag);

// One micro-batch's context-parallel terms on one device of stage `stage` (seconds), lab 10's ring layer by
// layer: attention_s, the attention FLOPs the whole sequence adds to your T / cp terms (forward, backward,
// recompute) at c.flops_per_s(); ring_s, what of the kv hand-overs (B, T / cp, 2C / tp elements of
// w.activation_bytes, links.cp "send") outlasts the block compute it overlaps (the forward's cp - 1 beside a
// forward step, again under full recompute; the backward's cp - 1 beside a backward step), plus the
// backward's cp dkv hand-overs, which wait. Zero for cp == 1.
struct CpSlot {
  double attention_s = 0;
  double ring_s = 0;
};
CpSlot cp_slot_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w,
                       const Cluster& c);

// Seconds of the cp group's gradient average after the last backward on stage `stage`: one all-reduce per
// unit the stage holds (lab 10's average_grads), in the policy's reduce dtype, on links.cp. Zero for cp == 1.
double cp_grad_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w);

// Your step_time with the cp axis: step_time on cp_local_workload (one cp rank's tokens), each stage's slot
// rebuilt from your stage_flops and stage_comm with cp_slot_seconds added, the pipeline and bubble scaled to
// the new slot, dp_ms with the slowest stage's cp_grad_seconds and the loss's all-reduce, tokens/s of the
// whole sequences (dp * m * B * T), MFU and HFU of lab 01's flops_per_token at T over tp * pp * dp * cp
// devices. x.cp == 1: step_time itself.
StepTime cp_step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c);

// plan, searched over cp too: for cp = 1, 2, 4, ... up to max_cp dividing the cluster, your plan on a cluster
// of devices / cp, each row then given that cp (evaluate_candidate: check_layout, device_memory and cp_step_time
// on the whole cluster; a refusal kept with its reason); ranked as plan ranks (rank_candidates). max_cp 1: plan
// itself. Throws scalelab::Error, with a hint, on max_cp < 1.
std::vector<Candidate> plan_with_cp(const GPTConfig& cfg, const Workload& w, const Cluster& c, int max_cp);

// The longest sequence layout x (its cp, tp, pp, B; dp 1, m 1) fits into c.memory_bytes a device: the largest
// T, a multiple of 2 cp up to max_seq_len, whose device_memory fits, the model's position embedding grown to
// T (maxT = T). seq_len 0 when not even T = 2 cp fits. Throws on a layout check_layout refuses at T = 2 cp.
struct LongestSequence {
  int seq_len = 0;
  DeviceMemory memory;  // at seq_len
};
LongestSequence longest_sequence(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c,
                                 int max_seq_len);

// The planner's command line (plan_cli.cpp): lab 09's program and bin/sl_plan are this function on their
// track. --help lists the options; exit code 0 when the answer fits, 1 when nothing does, 2 for bad input,
// 3 for a TODO not written yet.
int plan_main(int argc, char** argv);

// ---------------------------------------------------------------------------------------------
// Memory (README.md#memory-per-device)

// TODO(lab09-1): the activation sets pipeline stage `stage` holds at its peak: one per micro-batch between
// its forward and its backward, for x.schedule (lab06::ScheduleKind::GPipe, OneFOneB or Interleaved; the
// interleaved schedule counts chunk sets, x.chunks of them per micro-batch). Lab 06 measured them:
// README.md#activation-sets-in-flight
int activation_sets(const Layout& x, int stage);

// TODO(lab09-2): the memory of one device of pipeline stage `stage`: the model state of its chunks (each
// chunk's shard sharded over dp at the ZeRO stage: estimate_model_state's peaks; LoRA: the frozen base in
// the parameter dtype and the adapters' state, unsharded) and its activations (each chunk's
// gpt2_activation_bytes with its share of the sets: activation_sets, chunk_sets). Bytes.
// README.md#memory-per-device
DeviceMemory stage_memory(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w);

// ---------------------------------------------------------------------------------------------
// Time (README.md#step-time)

// TODO(lab09-3): the FLOPs of one micro-batch of B sequences of T tokens on one device of stage `stage`,
// summed over its chunks (chunk_shard: each chunk's blocks first_layer..last(cfg), and the LM head on the
// chunk with has_head), in lab 01's convention (README.md#compute: what a block and the head cost a token,
// what tensor parallelism does to it); forward, backward (LoRA: no weight gradients of the frozen base)
// and the recompute (recompute_flops_per_token is the whole model's, a token). README.md#compute
StageFlops stage_flops(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w);

// TODO(lab09-4): one micro-batch's communication on one device of stage `stage` (seconds, StageComm), and the
// step's communication of that stage after its last backward (seconds). tp: Megatron's collectives of the
// (B, T, C) activation (w.activation_bytes an element) in every block, the vocabulary-parallel embedding and
// cross-entropy (fp32 row statistics); pp: one send each way per micro-batch (w.pp_scatter_gather: 1/tp of it
// a rank, all-gathered over tp where it arrives, README.md#communication). After the last backward: the
// gradient sync of the ZeRO stage unit by unit (dp), the tied wte's gradient all-reduce between the first
// and last stage (embedding) and, under sequence parallelism, each layernorm weight's and bias's over tp.
// Each call LinkModel::seconds on its group's link.
// README.md#communication
StageComm stage_comm(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w);
double dp_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w);

// TODO(lab09-5): the step as the schedule runs it: every stage's slot (its compute, at c.flops_per_s() or
// w.uniform_compute_ms, plus its communication), the pipeline paced by the slowest slot and its bubble (lab
// 06's formula), then dp (the slowest stage's; with overlap_dp only what outlasts the compute it runs
// beside), then the optimizer's pass over what this device updates at the memory bandwidth; tokens/s, MFU
// and HFU. README.md#the-step
StepTime step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c);

// ---------------------------------------------------------------------------------------------
// The plan (README.md#the-plan)

// TODO(lab09-6): every layout of the cluster for this workload: tp, pp, dp with tp * pp * dp == devices,
// every micro-batch B with dp * B dividing the global batch, ZeRO 0..3 (0 only when dp == 1), sequence
// parallelism (off, and on when tp > 1), recompute none, selective, full; chunks 1. A layout check_layout
// refuses, or whose device_memory exceeds the cluster's memory, is kept with fits = false and why_not
// saying so (refusal_text). The fitting ones first, by predicted tokens/s (highest first; a tie: less memory first), then
// the others in the order enumerated (why_not: refusal_text, memory_refusal). Throws scalelab::Error, with a hint, on a cluster with no devices,
// devices_per_node < 1, no compute, or a global batch or T < 1. README.md#the-plan
std::vector<Candidate> plan(const GPTConfig& cfg, const Workload& w, const Cluster& c);

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
