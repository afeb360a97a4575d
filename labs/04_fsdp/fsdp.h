// fsdp.h — what the learner writes in lab 04 (FSDP / ZeRO), declared once for both tracks.
//   labs/04_fsdp/fsdp.cpp       the learner's file (TODO blocks)   -> library lab04_learner
//   solutions/04_fsdp/fsdp.cpp  the reference (same file, filled)  -> library lab04_ref
//   labs/04_fsdp/fsdp_wrapper.cpp  the given code (the FSDP class and its hooks, the tags): compiled into
//                                  both libraries, each calling its own track's functions
// The two tracks live in distinct inline namespaces (scalelab::lab04::learner / ::ref) chosen by
// SL_TRACK_LAB04, which CMake sets per library; code that includes this header without it gets ref.
// Lesson: labs/04_fsdp/README.md   Graded tests: tests/lab04/   Memory formulas: scalelab/measure/memory_estimator.h
//
// ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, Sec. 5): data parallel, but each of the N ranks keeps
// only 1/N of the model state. Stage 1 shards the optimizer state (P_os), stage 2 also the gradients
// (P_os+g), stage 3 also the parameters (P_os+g+p; PyTorch's FSDP FULL_SHARD). The pieces, in the order
// a step uses them (README.md#the-picture):
//   shard_layout                 which elements of a unit this rank owns, padding     TODO lab04-1
//   gather_params_async          ZeRO-3: all-gather one unit's parameters              TODO lab04-2
//   use_params                   ZeRO-3: wait for the unit, prefetch the next ones     TODO lab04-3
//   release_params               ZeRO-3: free the gathered copy after use              TODO lab04-4
//   reduce_scatter_grads_async   each rank receives the averaged shard it owns         TODO lab04-5
//   finish_reduce_scatter        wait, keep the shard, free the full gradient          TODO lab04-6
//   clip_grad_norm_sharded       the global gradient norm from N shards                TODO lab04-7
//   optimizer_step               AdamW/SGD on this rank's shard; all-gather the result TODO lab04-8
//   train_step                   one optimizer step over micro-batches                 TODO lab04-9
// Part 3, offload (ZeRO-Offload, Ren et al., USENIX ATC 2021, Sec. 4; README.md#part-3-offload):
//   offload_optimizer_state      the fp32 master shard, m and v in host memory         TODO lab04-10
//   offload_optimizer_step       gradients down, AdamW on the host, parameters up      TODO lab04-11
//   finish_params_upload         before a unit's all-gather: its new shard arrived     TODO lab04-12
//   FSDP (given)                 owns the shards, installs the hooks that call the above
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"
#include "scalelab/model/batch.h"
#include "scalelab/model/gpt2.h"
#include "scalelab/model/optim.h"
#include "scalelab/core/host_copy.h"
#include "scalelab/core/precision.h"
#include "scalelab/core/tensor.h"

#ifndef SL_TRACK_LAB04
#define SL_TRACK_LAB04 ref
#endif

namespace scalelab::lab04 {
inline namespace SL_TRACK_LAB04 {

// What each rank keeps only 1/N of (Rajbhandari et al. 2019, Sec. 5.1-5.3, Fig. 1).
enum class ZeroStage : int {
  Zero1 = 1,  // P_os: optimizer state (AdamW m, v and the fp32 master weights)
  Zero2 = 2,  // P_os+g: and the gradients
  Zero3 = 3,  // P_os+g+p: and the parameters (FSDP FULL_SHARD)
};
ZeroStage zero_stage_from_int(int stage);      // 1, 2 or 3; throws scalelab::Error with a hint otherwise
const char* zero_stage_name(ZeroStage stage);  // "ZeRO-1 (optimizer state)", ...

// Part 3: what lives in host memory instead of the device's (ZeRO-Offload, Ren et al. 2021, Sec. 3).
enum class Offload : int {
  None = 0,   // everything on the device
  Optimizer,  // the fp32 master shard, AdamW's m and v and the update on the host (MemPlace::Host)
};
Offload offload_from_name(const std::string& name);  // "none", "optimizer"; throws scalelab::Error otherwise
const char* offload_name(Offload offload);           // "none", "optimizer"

// =============================================================================================
// Shards and padding
// =============================================================================================
// One unit's flat buffer of n elements, split over N ranks. Collectives need equal chunks, so the
// buffer is padded to N equal chunks, the smallest that hold n elements; rank r owns chunk r of the
// padded buffer. Elements past n are padding: always zero, never seen by the model (the model views
// only [0, n)). README.md#shards-and-padding.
struct ShardLayout {
  int64_t numel = 0;   // n: elements of the unit (what the model sees)
  int64_t shard = 0;   // s: elements per rank, the same on every rank
  int64_t padded = 0;  // elements of the padded buffer the collectives use (every rank's chunk, in rank order)
  int64_t begin = 0;   // where this rank's shard starts in the padded buffer
  int64_t owned = 0;   // how many of the shard's s elements are real parameters (not padding): 0 .. s
};

// TODO(lab04-1): the layout of a unit of `numel` elements for `rank` of `world_size` ranks.
// numel >= 1, 0 <= rank < world_size; anything else is refused (scalelab::Error).
ShardLayout shard_layout(int64_t numel, int rank, int world_size);
// Given: that refusal, which shard_layout makes before your code runs.
void check_shard_args(int64_t numel, int rank, int world_size);

// =============================================================================================
// The state of one rank (the FSDP class below builds it; your functions read and change it)
// =============================================================================================
// One unit on one rank. Buffers are empty (Tensor()) when not held. Categories: what the counting
// allocator books them under, so memory per rank shows in the logs and the checks.
struct UnitShard {
  ShardLayout layout;
  bool keep_gathered = true;  // the full parameters stay in memory between uses: every unit in ZeRO-1/2;
                              // in ZeRO-3 only the root units (0: embeddings + tied LM head, L+1: ln_f)
  // Parameters (policy.param_dtype, category Params)
  Tensor full_params;  // (padded,) the gathered unit; the model's unit_params(u) is its view [0, n).
                       // ZeRO-3 blocks: only between use_params and release_params
  Tensor param_shard;  // (shard,) ZeRO-3 blocks: this rank's part, the only copy kept between uses.
                       // Other units: a view of full_params at [begin, begin + shard)
  WorkPtr gather;      // ZeRO-3: the all-gather filling full_params, while in flight
  // Gradients (fp32, category Grads)
  Tensor full_grads;       // (padded,) the model's unit_grads(u) is its view [0, n). ZeRO-1: always held;
                           // ZeRO-2/3: only from the unit's before_backward until its reduce-scatter is done
  Tensor grad_shard;       // (shard,) the averaged gradient of this rank's shard: what the optimizer reads.
                           // ZeRO-1: a view of full_grads at [begin, begin + shard); ZeRO-2/3: its own buffer
  Tensor rs_out;           // (shard,) fp32, category Comm: the output of the reduce-scatter in flight
  WorkPtr reduce_scatter;  // the reduce-scatter of full_grads, while in flight
  // Optimizer state (fp32, category OptimizerState), all (shard,)
  Tensor master;  // fp32 master weights when the policy stores parameters in bf16 (else empty);
                  // offloaded: always, in host memory (the weights the host's AdamW updates)
  Tensor m, v;    // AdamW moments (empty for SGD); offloaded: in host memory
  // Part 3, Offload::Optimizer only (else empty): host memory (MemPlace::Host), all (shard,)
  Tensor host_grads;   // fp32, category Grads: grad_shard copied down for the host's update
  Tensor host_params;  // policy.param_dtype, category Params: the updated shard rounded for its copy up
                       // (bf16 policy; under fp32 master itself goes up)
  CopyPtr grads_down;  // the copy grad_shard -> host_grads, while in flight
  CopyPtr params_up;   // the copy of the updated shard into param_shard, while in flight
};

struct FsdpState {
  GPT2& model;
  Communicator& comm;
  ZeroStage stage;
  OptimizerConfig optimizer;
  int prefetch = 1;                            // ZeRO-3: gathers allowed in flight beyond the unit in use (0: none)
  int64_t optimizer_steps = 0;                 // AdamW's t: updates done so far
  std::vector<UnitShard> units;                // units[u] for u = 0 .. L+1
  std::vector<int> reduce_scatters_in_flight;  // units whose reduce-scatter is launched, not finished
  Offload offload = Offload::None;             // part 3: where the optimizer state and update live
  bool overlap = true;                         // false: every copy waited for as soon as it is issued

  int num_units() const { return static_cast<int>(units.size()); }
  // Blocks of ZeRO-3 whose full_params is allocated now (gathered or being gathered).
  int gathered_count() const;
};

// The order in which a pass uses the units: forward 0, 1, ..., L, L+1; backward 0 (the tied LM head
// runs first), L+1, L, ..., 1. use_params prefetches along it.
enum class Pass { Forward, Backward };
std::vector<int> unit_order(int num_units, Pass pass);

// =============================================================================================
// ZeRO-3: gather a unit's parameters before use, free them after
// =============================================================================================
// Tags of the collectives (the checks find them in the event log by these):
std::string gather_tag(int unit);          // "gather unit 3"
std::string reduce_scatter_tag(int unit);  // "reduce_scatter unit 3"

// TODO(lab04-2): start the all-gather of unit u's parameters (a ZeRO-3 block whose full_params is
// empty). On return a gather is in flight (its handle in units[u].gather, tag gather_tag(u)) that fills
// units[u].full_params, (padded,) in the policy's parameter dtype (category Params), with every rank's
// param_shard in that rank's chunk. README.md#zero-3.
void gather_params_async(FsdpState& s, int unit);

// TODO(lab04-3): the before_forward / before_backward hook of a ZeRO-3 block. On return
// model.unit_params(u) is the gathered unit [0, n) (never the padding), and the next s.prefetch blocks of
// `order` after u (units kept gathered do not count) are gathered or being gathered: at most
// 1 + prefetch blocks at once, and no block gathered twice. README.md#zero-3, README.md#prefetch.
void use_params(FsdpState& s, int unit, const std::vector<int>& order);

// TODO(lab04-4): the after_forward / after_backward hook of a ZeRO-3 block: free the gathered copy
// (model.unit_params(u) and units[u].full_params become empty); param_shard stays. README.md#zero-3.
void release_params(FsdpState& s, int unit);

// =============================================================================================
// Gradients: each rank receives the averaged shard it owns
// =============================================================================================
// TODO(lab04-5): start the reduce-scatter of unit u's full gradient (tag reduce_scatter_tag(u)): when it
// completes, rank r's units[u].rs_out, a (shard,) fp32 buffer (category Comm), holds the AVERAGE over the
// ranks of chunk r. Its handle is in units[u].reduce_scatter and u in s.reduce_scatters_in_flight.
// README.md#reduce-scatter.
void reduce_scatter_grads_async(FsdpState& s, int unit);

// TODO(lab04-6): wait for unit u's reduce-scatter and keep its result in grad_shard, which then holds
// the step's averaged gradient so far (ZeRO-1 reduces once per step; ZeRO-2/3 once per micro-step, so
// their shards accumulate the micro-steps). rs_out is freed, and in ZeRO-2/3 the full gradient too
// (nothing may refer to it: that is what makes gradient memory 1/N); u leaves
// s.reduce_scatters_in_flight. README.md#reduce-scatter.
void finish_reduce_scatter(FsdpState& s, int unit);

// =============================================================================================
// The update, on this rank's shard only
// =============================================================================================
// TODO(lab04-7): the global L2 norm of the WHOLE model's gradient, computed from the shards, the same
// number on every rank. If max_norm > 0, every grad_shard is clipped exactly as torch's clip_grad_norm_
// (and scalelab/model/optim.h clip_grad_norm) clips a whole gradient. Returns the norm before clipping.
// README.md#the-update.
float clip_grad_norm_sharded(FsdpState& s, float max_norm);

// TODO(lab04-8): one AdamW (or SGD) update of this rank's shard of every unit: the fp32 weights (`master`
// under the bf16 policy, else param_shard), every real element with ITS parameter's weight decay
// (ParamInfo::decay), AdamW's step count advanced once per call. On return the new parameters are where
// the next forward reads them: param_shard (rounded from master), and for the units kept gathered,
// full_params on every rank (tag gather_tag(u)). ZeRO-3 blocks are gathered when next used.
// README.md#the-update.
void optimizer_step(FsdpState& s, float lr);

// =============================================================================================
// Part 3: offload the optimizer state and its update to the host (README.md#part-3-offload)
// =============================================================================================
// The device keeps the parameters, the gradients and the activations; the host keeps the fp32 master shard
// and AdamW's moments and runs the update. Each step a unit's gradient shard goes down over the host link
// (PCIe) and its updated parameters come back up, asynchronously (scalelab/core/host_copy.h copy_async):
// the same update as on the device, bit for bit, with 12 (bf16) or 8 (fp32) bytes per parameter of
// optimizer state off the device.

// TODO(lab04-10): called by the FSDP constructor (offload on) once the device shards hold the initial
// weights; the device holds no optimizer state. On return every unit has, in host memory (Device::CPU,
// MemPlace::Host), all (shard,): master (fp32, category OptimizerState) equal to param_shard's values; m and
// v (AdamW only, zeros, OptimizerState); host_grads (fp32, Grads); and host_params (policy.param_dtype,
// Params) when that dtype is not fp32. Nothing of this on the device. README.md#part-3-offload.
void offload_optimizer_state(FsdpState& s);

// TODO(lab04-11): optimizer_step when offloaded (it calls this): the same update, on the host. Every
// unit's grad_shard (final: averaged, clipped) copied down into host_grads (grads_down), and per unit once
// its copy is waited for: AdamW (or SGD) on master with host_grads, m and v, every real element with ITS
// parameter's weight decay, t advanced once per call; the new parameters copied up into param_shard
// (params_up; rounded to the parameter dtype on the host first). Units kept gathered wait for their copy and
// all-gather full_params (tag gather_tag(u)) as optimizer_step does; a ZeRO-3 block's copy stays in flight
// until its next use (finish_params_upload), unless s.overlap is false: then every copy is waited for
// at once. README.md#part-3-offload.
void offload_optimizer_step(FsdpState& s, float lr);

// TODO(lab04-12): called (offload on) right before a ZeRO-3 block's all-gather starts (the first line of
// gather_params_async, given: also for a prefetch) and by FSDP::gather_unit_f32: on return the unit's
// updated parameters have arrived in param_shard (its params_up, if any, waited for and dropped), so the
// all-gather sends the new values. README.md#part-3-offload.
void finish_params_upload(FsdpState& s, int unit);

// =============================================================================================
// The training step
// =============================================================================================
using scalelab::MicroBatch;  // (B, T) inputs and targets (scalelab/model/batch.h)
using scalelab::StepResult;  // loss of THIS rank's micro-batches; norm of the averaged gradient

class FSDP;

// TODO(lab04-9): one optimizer step over this rank's micro-batches (one per micro-step): the update one
// process makes with the mean loss of the whole global batch, clipped to grad_clip (<= 0: no clipping).
// ZeRO-2/3 reduce-scatter inside backward (the hooks call your functions); ZeRO-1 reduces once per step,
// as DDP's no_sync. The FSDP class below offers what a step needs around the model's forward and
// backward. Returns this rank's mean loss and the global norm before clipping. README.md#the-training-step.
StepResult train_step(FSDP& fsdp, const std::vector<MicroBatch>& micro_batches, float lr, float grad_clip);

// =============================================================================================
// FSDP (given): builds the sharded model and installs the hooks
// =============================================================================================
struct FsdpOptions {
  ZeroStage stage = ZeroStage::Zero3;
  int prefetch = 1;     // ZeRO-3 gathers in flight beyond the unit in use
  bool overlap = true;  // false: every collective is waited for as soon as it is issued, and no
                        // prefetch (the lesson's "communication not overlapped" on purpose); offloaded,
                        // every host <-> device copy too
  OptimizerConfig optimizer;
  Offload offload = Offload::None;  // part 3: Optimizer keeps the optimizer state and update on the host
};

// Builds the model WITHOUT ever holding all of it (GPT2::without_storage, then gpt2_initial_weights
// one unit at a time: each rank keeps its shards), so a model too big for one device can be built on N.
// The weights are the ones a 1-rank GPT2(cfg, policy, device, seed) starts from, on every rank.
// Adds the model's hooks (ZeRO-2/3 gradients, ZeRO-3 gathers), removed by the destructor; other hooks on
// the model (a probe's, DDP's) keep running beside them. One FSDP per model.
// Throws OutOfMemory (allocator cap) like any allocation; scalelab::Error for bad options.
class FSDP {
 public:
  FSDP(const GPTConfig& cfg, const PrecisionPolicy& policy, Device device, uint64_t seed, Communicator& comm,
       const FsdpOptions& options);
  ~FSDP();
  FSDP(const FSDP&) = delete;
  FSDP& operator=(const FSDP&) = delete;

  GPT2& model() { return model_; }
  FsdpState& state() { return state_; }
  ZeroStage stage() const { return state_.stage; }
  Communicator& comm() { return state_.comm; }

  // Zeroes the gradients a step accumulates into: ZeRO-1 the full gradients, ZeRO-2/3 the grad_shards.
  void zero_grad();
  // ZeRO-2/3, after a backward: waits for the reduce-scatters still in flight (finish_reduce_scatter).
  void finish_backward();
  // ZeRO-1, after the last micro-step's backward: reduce-scatter every unit (launch all, then finish all).
  void reduce_scatter_all();

  // This rank's copy of unit u's parameters as fp32 values [0, n) gathered from all ranks (a collective:
  // every rank must call it). For checks and checkpoints; allocates (numel,) fp32, category Other.
  Tensor gather_unit_f32(int unit);
  // This rank's averaged gradient shard of unit u: elements [begin, begin + owned) of the unit.
  Tensor grad_shard_owned(int unit) const;

 private:
  GPT2 model_;
  FsdpState state_;
  std::vector<HookHandle> hooks_;  // the four hooks above; declared last, so they go first
};

}  // namespace SL_TRACK_LAB04
}  // namespace scalelab::lab04
