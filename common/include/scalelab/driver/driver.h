// driver.h — plumbing shared by the lab drivers (the main.cpp of labs 01 to 09): the options they all have, the
// --device check, the simulated link, the run id and run record, the MFU peak, and the validation pass. What a
// lab teaches (its training step, what it measures) stays in its main.cpp; only code that was the same, line
// for line, in two or three drivers lives here. It links no lab: the loader it reads is the data::BatchSource a
// lab program hands it (labs/common/lab_parts.h). Implementation: common/src/driver/driver.cpp (library
// scalelab_driver, above common's layers). Tested through the drivers (scripts/compare_runs.py, tests/perf).
#pragma once

#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (the run record's config)

#include <cstdint>
#include <functional>
#include <memory>  // defines: std::unique_ptr
#include <string>
#include <utility>  // defines: std::pair
#include <vector>

#include "scalelab/comm/comm.h"            // defines: Communicator, CommEvent, LinkModel
#include "scalelab/core/precision.h"       // defines: PrecisionPolicy
#include "scalelab/core/tensor.h"          // defines: Device, Tensor
#include "scalelab/data/batch_source.h"    // defines: data::BatchSource, OpenBatchSource, LoaderConfig, LoaderState
#include "scalelab/measure/calibration.h"  // defines: Peak
#include "scalelab/measure/metrics.h"      // defines: RunRecord
#include "scalelab/model/gpt2.h"           // defines: GPT2
#include "scalelab/model/optim.h"          // defines: OptimizerConfig

namespace scalelab::driver {

// ---------------------------------------------------------------------------------------------
// Options

// The options every training driver has, with the same defaults (lab 01 overrides `steps`).
struct TrainOptions {
  std::string device = "cpu";    // cpu, cuda, or sim (a simulated GPU: docs/simulation.md)
  std::string sim_gpu = "h100";  // --device sim: the GPU model (core/sim_gpu.h GpuModel::preset)
  std::string model = "demo";
  int seq_len = 128;       // T: tokens per sequence
  int steps = 100;         // optimizer steps
  float lr = 2e-3f;        // peak learning rate
  float min_lr = 2e-4f;    // end of the cosine decay
  int warmup = 20;         // steps of linear warmup
  float grad_clip = 1.0f;  // max global gradient L2 norm (0: off)
  float weight_decay = 0.1f;
  std::string optimizer = "adamw";
  std::string precision = "fp32";
  std::string activations = "fp32";  // --activations fp32|bf16: PrecisionPolicy::activation_dtype
  std::string data = "data/kjv";
  std::string log_dir = "runs";
  std::string run_id;  // "": time + random suffix (metrics.h make_run_id)
  uint64_t seed = 1337;
  int val_every = 50;              // steps between validation passes (0: only at start and end)
  int val_batches = 8;             // validation batches (labs 03, 04: of global_batch sequences)
  int sample_tokens = 200;         // bytes of text generated at the end
  int threads = 0;                 // CPU threads per rank (0: the default of set_num_threads)
  int timeline_steps = 3;          // steps 1..N log a `timeline` record (0: none; labs 03, 04: --timeline-steps)
  std::string calibration;         // --calibration FILE: a CPU run's MFU peak is exactly this calibration (run_peak)
  std::string recompute = "none";  // --recompute none|selective|full: activation recompute of every block
  bool quiet = false;
  bool timing_only = false;  // --timing-only (--device sim): time and memory without arithmetic (core/sim_gpu.h)
};

// What the multi-rank drivers (labs 03 and 04) add.
struct DistributedOptions : TrainOptions {
  int micro_batch = 8;           // sequences per rank per micro-step
  int global_batch = 0;          // sequences per optimizer step, all ranks together (0: micro_batch x ranks)
  std::string backend = "auto";  // communicator: auto, local, mpi, nccl, sim (comm.h make_communicator)
  std::string link = "none";     // simulated link preset
  double link_slowdown = 1.0;    // the simulated link made this many times slower
};

// Labs 05 and 07: a simulated cluster of nodes (docs/communicator.md "Groups and the simulated topology").
struct ClusterOptions {
  int ranks_per_node = 0;                  // simulated nodes of this many ranks (0: one link for every group)
  std::string inter_link = "ethernet100";  // with ranks_per_node: the link of a group that spans nodes
};
// Labs 06 and 07: the pipeline's schedule and its measurement.
struct PipelineOptions {
  std::string schedule = "1f1b";
  int micro_batches = 4;          // m: micro-batches per optimizer step (per replica)
  int chunks = 1;                 // v: model chunks per rank (interleaved)
  double uniform_compute_ms = 0;  // every stage's forward of a micro-batch takes this long, its backward twice
  double wait_timeout_s = 300;    // a wait longer than this ends the run with what every rank waited for
};

// --steps --lr --min-lr --warmup --grad-clip --weight-decay --optimizer (labs 01, 03, 04 alike).
void add_schedule_options(CLI::App& app, TrainOptions& o);

// Every training driver, in this --help order: --device --sim-gpu --model --seq-len, the schedule options,
// --precision --data --log-dir (<log-dir>/<lab>/<run-id>/rank<k>.jsonl) --run-id --seed --val-every
// --val-batches --sample-tokens --threads --calibration --recompute --quiet. A lab whose words differ for one of them changes its
// description after this call (app.get_option("--seed")->description(...)).
void add_train_options(CLI::App& app, TrainOptions& o, const std::string& lab);
// Labs 03 and 04: add_train_options and --micro-batch --global-batch --backend.
void add_distributed_options(CLI::App& app, DistributedOptions& o, const std::string& lab);
// Labs 03 and 04: --link --link-slowdown --timeline-steps.
void add_link_options(CLI::App& app, DistributedOptions& o);
// Labs 05 and 07: --ranks-per-node --inter-link.
void add_cluster_options(CLI::App& app, ClusterOptions& o);
// Labs 06 and 07: --schedule --micro-batches --chunks --uniform-compute-ms --wait-timeout-s.
void add_pipeline_options(CLI::App& app, PipelineOptions& o);

// ---------------------------------------------------------------------------------------------
// Setup

// --device cpu|cuda|sim as a Device; throws with a hint for another name, cuda without a usable GPU, or sim
// before start_device (comm.h) made a GPU model active.
Device device_from_option(const std::string& name);

// The device before anything else runs, then the program: scalelab::run_on_all_ranks(o.device, o.sim_gpu,
// backend, body) (comm.h): --device sim makes the --sim-gpu model active before the communicator and any
// tensor (a later --memory-cap-mb overrides its capacity); auto with --device sim is the sim backend under a
// launcher of more than one rank, local for one (its collectives are copies: it takes SIM tensors); a refused
// pair (--backend sim without --device sim; mpi or nccl with it) ends every rank with the option to change.
// Before the body, on every rank: require_checked_options(app) (a program whose numeric option has no range
// check is refused) and check_ranks_agree(comm, app, inputs) (option_checks.h): ranks started with
// different options, or reading other shards of --data (data_agreement_lines) or other `inputs` (lines that
// `read_inputs` returns on each rank: lab 08's checkpoint to resume), stop, every one, naming what differs.
// An exception of read_inputs becomes its line, so no rank leaves before the collective. Multi-rank drivers'
// main() returns this.
int run_on_all_ranks(CLI::App& app, const TrainOptions& o, const std::string& backend,
                     const std::function<int(Communicator&)>& body,
                     const std::function<std::vector<std::string>()>& read_inputs = nullptr);
// scalelab::run_single_process (comm.h) after require_checked_options(app) and start_device(o.device,
// o.sim_gpu, "local"): the one-process drivers (labs 01, 02).
int run_single_process(CLI::App& app, const TrainOptions& o, const std::function<int()>& body);

// "simulated H100 SXM, virtual time" while a simulated GPU is active (--device sim; ", timing only" added with
// --timing-only), else "": what every figure of a simulated run says about itself (the summary, the tables).
std::string simulated_label();

// --recompute on every block of the model (GPT2::set_recompute; gpt2.h Recompute): call it for each of
// this rank's models (a pipeline's chunks) before the first forward; the TrainLoop refuses a model that does
// not recompute what --recompute says. Throws scalelab::Error naming the accepted values for another name.
void apply_recompute(const TrainOptions& o, GPT2& model);

// The run's precision policy: --precision's (PrecisionPolicy::from_name) with --activations' dtype for the
// activations a forward keeps for its backward (PrecisionPolicy::activation_dtype). Throws scalelab::Error
// naming the accepted values for an unknown name.
PrecisionPolicy precision_policy(const TrainOptions& o);

// --attention materialized|flash|auto as an AttentionImpl, and why (for the header line and the run record).
// auto: flash when the materialized scores would take over a quarter of the memory there is: the simulated
// cap if one is set (Allocator capacity), else the GPU's memory (choose_attention, gpt2.h). On the CPU
// without a cap: materialized. B, T: the batch the model will see.
std::pair<AttentionImpl, std::string> attention_from_option(const std::string& name, const GPTConfig& cfg, int B, int T,
                                                            Device device);

// The simulated link (comm.h LinkModel): a preset, optionally `slowdown` times slower (latencies x F,
// bandwidth / F; its name gets "/F"). A CPU computes roughly 10^3-10^4 times slower than the GPUs the
// presets belong to; slowing the link down too puts a CPU run in the regime a GPU cluster is in, where
// the all-reduce takes about as long as the backward pass (labs/03_ddp/README.md "Measured").
LinkModel make_link(const std::string& name, double slowdown);

// The links of world's groups, set before any split: --link for every group, or with --ranks-per-node a
// simulated cluster (Topology): --link inside a node, --inter-link across nodes, both --link-slowdown
// times slower. Each group split later takes the link of its members' placement. On the sim backend
// --link none (the default) keeps the backend's own links (the GPU model's link inside a node: nvlink,
// pcie for rtx4090; infiniband across nodes), --link-slowdown times slower; a named --link replaces them.
// Labs without nodes pass ClusterOptions{} (--link alone).
void set_links(Communicator& world, const DistributedOptions& o, const ClusterOptions& cluster);

// The denominator of MFU, per device, in FLOP/s (scalelab::device_peak, calibration.h): the datasheet
// figure for a GPU, the sgemm calibration for the CPU (runs/calibration/cpu_<threads>t.json, measured
// when missing or provably stale: load_or_calibrate). With `calibration_file` (--calibration FILE) a
// CPU run divides by exactly that file's peak instead: no quick check, never measured again, refused
// (scalelab::Error) when it was measured on another CPU model, for another thread count or for the
// other GEMM (fp32 sgemm vs bf16-compute's bf16 matmul): two CPU runs compared by hand divide by the same
// number that way. A GPU run, real or simulated, ignores the file: its peak is the datasheet's (the graded
// speed checks run on the simulated GPU for that reason, tests/perf/perf_compare.h).
Peak run_peak(Device device, const PrecisionPolicy& policy, int threads, const std::string& calibration_file);
// run_peak on every rank. Without a file the CPU calibration is measured by rank 0 first (several ranks
// calibrating at once would measure each other) and read from the cache by the others.
// Collective (a barrier). Run bin/sl_calibrate --threads N beforehand to skip the measurement.
// On the GPU each rank's peak is its share of a GPU (shared_gpu_peak): ranks that share one divide its peak.
Peak device_peak_all_ranks(Device device, const PrecisionPolicy& policy, int threads, Communicator& comm,
                           const std::string& calibration_file);
// A rank's share of a GPU's peak when ranks_on_node ranks share `gpus` visible GPUs (e.g. 2 ranks on one
// H200: each gets half, so world_size x the per-rank peak is the one GPU's and MFU is of that GPU, not of
// two). Unchanged when every rank has a GPU of its own (ranks_on_node <= gpus) or gpus < 1.
Peak shared_gpu_peak(const Peak& per_gpu, int ranks_on_node, int gpus);

// The run id on every rank: `requested`, or rank 0's make_run_id() when it is "" (the random suffix
// differs per call, so rank 0 draws it and broadcasts it). At most 128 characters. Collective.
std::string run_id_all_ranks(Communicator& comm, const std::string& requested);

// --optimizer and --weight-decay as the optimizer's config (the betas and eps: OptimizerConfig's defaults).
OptimizerConfig optimizer_config(const TrainOptions& o);

// The keys of the `run` record's config every training driver writes, from its options: model, T, steps, lr,
// optimizer, precision (the policy's name), recompute, seed, data, device, and flops_per_token. A lab adds
// its own (config.update({...})); the record's keys: docs/log_schema.md.
nlohmann::json run_config(const TrainOptions& o, const PrecisionPolicy& policy, double flops_per_token);

// The `run` record's fields every driver fills the same way: config, world size, track (SL_TRACK_NAME
// of the calling program), threads per rank, precision, device name, peak FLOP/s per device
// (kNotMeasured when unknown), its source and calibration id. On the simulated GPU the device is "sim" and
// extra says so: sim_gpu (the preset), sim_gpu_name ("simulated H100 SXM"), simulated true, clock "virtual".
// The caller adds more `extra` keys.
RunRecord make_run_record(const nlohmann::json& config, const std::string& track, int world_size, int threads,
                          const PrecisionPolicy& policy, Device device, const Peak& peak);

// ---------------------------------------------------------------------------------------------
// Validation and reductions

// The average of one float over all ranks (a loss). Collective.
float mean_over_ranks(Communicator& comm, float x, const std::string& tag);

// The validation split: a loader (opened by `open`) with the training loader's config (B, T, seed, dp_rank,
// dp_size) but no shuffling and no prefetch thread, and the position every pass starts from, so that every
// pass evaluates the same windows. n_batches = requested batches, at least 1, at most one epoch of this rank.
struct ValidationSplit {
  ValidationSplit(const data::OpenBatchSource& open, const std::string& data_dir,
                  const data::LoaderConfig& train_config, int64_t requested_batches);
  std::unique_ptr<data::BatchSource> loader;
  data::LoaderState start;
  int n_batches = 0;  // loader batches per pass, each (B, T)
};

// Mean loss (nats per token) over the split's n_batches on this rank, read into x and y (inputs and
// targets, (B, T) i32). Forward only: the gradients are not touched.
float evaluate(GPT2& model, ValidationSplit& val, Tensor& x, Tensor& y);
// The same with another loss of one batch (tokens, targets) than model.forward: lab 06's pipeline.
float evaluate(ValidationSplit& val, Tensor& x, Tensor& y,
               const std::function<float(const Tensor& tokens, const Tensor& targets)>& loss_of);
// The same, averaged over the ranks: each rank evaluates its own windows (dp_rank), together they cover
// the windows one rank evaluating all of them would. Collective: every rank must call it (a ZeRO-3
// forward all-gathers each block).
float evaluate_all_ranks(GPT2& model, Communicator& comm, ValidationSplit& val, Tensor& x, Tensor& y);

// ---------------------------------------------------------------------------------------------
// Communication stats

// What the event log says about one step's collectives (comm.h CommEvent). Times in ms, sizes in bytes
// this rank contributed (payload, not bus bytes).
struct CommStats {
  double busy_ms = 0;         // time the transport had one in progress: sum of end - start (they run one at a
                              // time), including any wait for a slower rank to join
  double modeled_ms = 0;      // what the simulated link alone charges for them (0 without a link model)
  int64_t payload_bytes = 0;  // all ops counted below
  int64_t all_reduce_bytes = 0;
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int calls = 0;
  bool simulated = false;  // a link model decided (part of) their duration
};
// The events of op `only_op` ("all_reduce", ...; "": every op). An event still in flight (end_ms 0)
// counts as busy up to now_ms (Communicator::now_ms()).
CommStats comm_stats(const std::vector<CommEvent>& events, double now_ms, const std::string& only_op = "");

}  // namespace scalelab::driver
