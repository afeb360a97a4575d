// driver.cpp — plumbing shared by the lab drivers (scalelab/driver/driver.h).
#include "scalelab/driver/driver.h"

#include <algorithm>  // defines: std::max, std::min
#include <cstdio>     // defines: std::snprintf
#include <fstream>    // defines: std::ifstream (--calibration)
#include <stdexcept>  // defines: std::logic_error (require_checked_options)

#include <unistd.h>  // defines: sysconf (the host memory a real run of a large preset would need)

#include "scalelab/comm/host_values.h"  // defines: broadcast_string, all_reduce_value (any backend)
#include "scalelab/comm/link_spec.h"    // defines: parse_link (--link)
#include "scalelab/core/clock.h"        // defines: clock_is_virtual
#include "scalelab/core/device.h"  // defines: built_with_cuda, cuda_device_count, _name, _memory_bytes, cuda_unavailable_reason
#include "scalelab/core/error.h"            // defines: SL_CHECK_HINT
#include "scalelab/core/sim_gpu.h"          // defines: sim_gpu_active, sim_gpu, sim_set_timing_only
#include "scalelab/driver/option_checks.h"  // defines: require_checked_options, check_ranks_agree, positive_int, ...

namespace scalelab::driver {

// ---------------------------------------------------------------------------------------------
// Options

void add_schedule_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(positive_int());
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str()->check(finite_positive());
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay")
      ->capture_default_str()
      ->check(finite_non_negative());
  app.add_option("--warmup", o.warmup, "linear warmup steps")->capture_default_str()->check(non_negative_int());
  app.add_option("--grad-clip", o.grad_clip, "clip the global gradient norm (0: off)")
      ->capture_default_str()
      ->check(finite_non_negative());
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay on matrices")
      ->capture_default_str()
      ->check(finite_non_negative());
  app.add_option("--optimizer", o.optimizer, "adamw or sgd")->capture_default_str();
}

void add_train_options(CLI::App& app, TrainOptions& o, const std::string& lab) {
  app.add_option("--device", o.device,
                 "cpu, cuda (a build with the CUDA backend and a GPU) or sim (a simulated GPU: real arithmetic on "
                 "the CPU, time from a model of --sim-gpu, virtual time; docs/simulation.md)")
      ->capture_default_str();
  app.add_option("--sim-gpu", o.sim_gpu, "with --device sim: the GPU modelled, h100, h200, a100 or rtx4090")
      ->capture_default_str();
  app.add_option("--model", o.model,
                 "preset: tiny, demo, d12, d24, d36, d48; the lesson's sizes (with --device sim --timing-only): "
                 "gpt2-124m, gpt2-350m, gpt2-1.5b, gpt-7b, gpt-70b")
      ->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "T: tokens per sequence")->capture_default_str()->check(positive_int());
  add_schedule_options(app, o);
  app.add_option("--precision", o.precision,
                 "fp32, bf16 (= bf16-mixed: bf16 params, fp32 master and compute) or bf16-compute (bf16-mixed "
                 "with bf16 matmul operands: the GPU's bf16 tensor cores)")
      ->capture_default_str();
  app.add_option("--activations", o.activations,
                 "fp32 or bf16: the dtype of the activations each block keeps for its backward (bf16: stored in 16 "
                 "bits as Megatron-LM and torchtitan do, computed in fp32; docs/memory.md \"16-bit activations\")")
      ->capture_default_str();
  app.add_option("--data", o.data, "directory of token shards (scripts/prepare_corpus.sh)")->capture_default_str();
  app.add_option("--log-dir", o.log_dir, "logs go to <log-dir>/" + lab + "/<run-id>/rank<k>.jsonl")
      ->capture_default_str();
  app.add_option("--run-id", o.run_id, "name of this run (default: time + random suffix)");
  app.add_option("--seed", o.seed, "seed of the weights and the data order")
      ->capture_default_str()
      ->check(seed_value());
  app.add_option("--val-every", o.val_every, "steps between validation passes (0: start and end only)")
      ->capture_default_str()
      ->check(non_negative_int());
  app.add_option("--val-batches", o.val_batches, "validation batches per pass")
      ->capture_default_str()
      ->check(positive_int());
  app.add_option("--sample-tokens", o.sample_tokens, "bytes of text rank 0 generates at the end")
      ->capture_default_str()
      ->check(non_negative_int());
  app.add_option("--threads", o.threads, "CPU threads per rank (0: cores / ranks on this node)")
      ->capture_default_str()
      ->check(int_in_range(0, kMaxThreads));
  app.add_option("--calibration", o.calibration,
                 "CPU runs: divide MFU by exactly this calibration file (bin/sl_calibrate writes them to "
                 "runs/calibration/) instead of the cached one; ignored on a GPU");
  app.add_option("--recompute", o.recompute,
                 "activation recompute of every block: none, selective (the attention scores, recomputed in the "
                 "backward) or full (keep each block's input, re-run the block in the backward)")
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "print only validation and the summary");
  app.add_flag("--timing-only", o.timing_only,
               "with --device sim: ops charge their modelled time and compute nothing, memory is counted but not "
               "backed, no loss or norm is computed (docs/simulation.md \"Timing-only runs\"); for --model "
               "gpt2-124m .. gpt-70b");
}

void apply_recompute(const TrainOptions& o, GPT2& model) { model.set_recompute(recompute_from_name(o.recompute)); }

PrecisionPolicy precision_policy(const TrainOptions& o) {
  PrecisionPolicy policy = PrecisionPolicy::from_name(o.precision);
  policy.activation_dtype = PrecisionPolicy::activation_dtype_from_name(o.activations);
  return policy;
}

void add_distributed_options(CLI::App& app, DistributedOptions& o, const std::string& lab) {
  add_train_options(app, o, lab);
  app.add_option("--micro-batch", o.micro_batch, "sequences per rank per micro-step")
      ->capture_default_str()
      ->check(positive_int());
  app.add_option("--global-batch", o.global_batch, "sequences per optimizer step, all ranks (0: micro-batch x ranks)")
      ->capture_default_str()
      ->check(non_negative_int());
  app.get_option("--val-batches")->description("validation batches of --global-batch sequences");
  app.add_option("--backend", o.backend,
                 "communicator: auto (under mpirun: sim with --device sim, else mpi; one process: local), local, "
                 "mpi, nccl, sim (simulated GPUs in virtual time: needs --device sim)")
      ->capture_default_str();
}

void add_link_options(CLI::App& app, DistributedOptions& o) {
  app.add_option("--link", o.link,
                 "simulated link: none, free, nvlink, pcie, ethernet100, infiniband (none on --backend sim: its own "
                 "links, the --sim-gpu's inside a node, nvlink or pcie for rtx4090, and infiniband across nodes; free: "
                 "every message costs 0 s), or a measured one: alpha=25us,bw=118MB/s[,base=5us] (lab 00's fit)")
      ->capture_default_str();
  app.add_option("--link-slowdown", o.link_slowdown, "make the simulated link this many times slower")
      ->capture_default_str()
      ->check(finite_positive());
  app.add_option("--timeline-steps", o.timeline_steps, "steps 1..N log a timeline record (0: none)")
      ->capture_default_str()
      ->check(non_negative_int());
}

void add_cluster_options(CLI::App& app, ClusterOptions& o) {
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "simulate nodes of this many ranks (world-rank order): a group inside one node crosses --link, a "
                 "group across nodes --inter-link (0: every group crosses --link)")
      ->capture_default_str()
      ->check(non_negative_int());
  app.add_option("--inter-link", o.inter_link, "with --ranks-per-node: the link between nodes (the same presets or measured figures as --link)")
      ->capture_default_str();
}

void add_pipeline_options(CLI::App& app, PipelineOptions& o) {
  app.add_option("--schedule", o.schedule, "gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches,
                 "m: micro-batches per optimizer step (each --micro-batch sequences)")
      ->capture_default_str()
      ->check(positive_int());
  app.add_option("--chunks", o.chunks, "v: model chunks per rank (--schedule interleaved)")
      ->capture_default_str()
      ->check(positive_int());
  app.add_option("--uniform-compute-ms", o.uniform_compute_ms,
                 "every stage's forward of a micro-batch takes at least this long, its backward twice as long (0: as "
                 "the compute takes); the bubble formula's assumption")
      ->capture_default_str()
      ->check(finite_non_negative());
  app.add_option("--wait-timeout-s", o.wait_timeout_s,
                 "a receive or collective that waits longer than this fails, naming the peer and the message it waited "
                 "for (a schedule that deadlocks); 0: wait for ever")
      ->capture_default_str()
      ->check(finite_non_negative());
}

// ---------------------------------------------------------------------------------------------
// Setup

// `link` made `slowdown` times slower (latencies x F, bandwidth / F; its name gets "/F").
static LinkModel slowed(LinkModel link, double slowdown) {
  SL_CHECK_HINT(slowdown > 0, "--link-slowdown is a factor > 0 (1: the preset as it is)", "--link-slowdown %g",
                slowdown);
  if (link.enabled() && slowdown != 1.0) {
    link.alpha_s *= slowdown;
    link.base_s *= slowdown;
    link.bandwidth_bytes_per_s /= slowdown;
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "/%g", slowdown);
    link.name += suffix;
  }
  return link;
}

void set_links(Communicator& world, const DistributedOptions& o, const ClusterOptions& cluster) {
  if (world.backend() == "sim" && o.link == "none") {  // the sim backend's own links, kept (comm/sim.cpp)
    Topology topo = world.topology();
    topo.intra = slowed(topo.intra, o.link_slowdown);
    topo.inter = cluster.ranks_per_node > 0 ? make_link(cluster.inter_link, o.link_slowdown)
                                            : slowed(topo.inter, o.link_slowdown);
    topo.ranks_per_node = cluster.ranks_per_node;  // 0: the launcher's count, kept
    world.set_topology(topo);
    return;
  }
  world.set_link_model(make_link(o.link, o.link_slowdown));
  if (cluster.ranks_per_node > 0) {  // a simulated cluster: --link inside a node, --inter-link across nodes
    Topology topo;
    topo.ranks_per_node = cluster.ranks_per_node;
    topo.intra = make_link(o.link, o.link_slowdown);
    topo.inter = make_link(cluster.inter_link, o.link_slowdown);
    world.set_topology(topo);
  }
}

Device device_from_option(const std::string& name) {
  SL_CHECK_HINT(name == "cpu" || name == "cuda" || name == "sim", "use --device cpu, cuda or sim",
                "unknown device '%s'", name.c_str());
  if (name == "sim") {
    SL_CHECK_HINT(sim_gpu_active(), "main() starts it: return driver::run_on_all_ranks(app, o, o.backend, ...)",
                  "--device sim: no simulated GPU is active (start_device, comm.h, makes --sim-gpu one)");
    return Device::SIM;
  }
  const Device device = name == "cuda" ? Device::CUDA : Device::CPU;
  if (device == Device::CUDA)
    SL_CHECK_HINT(cuda_device_count() > 0,
                  built_with_cuda() ? "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu"
                                    : "rebuild where nvcc is found (cmake -DSL_WITH_CUDA=ON), or use --device cpu",
                  "--device cuda: no CUDA device is available to this program: %s", cuda_unavailable_reason().c_str());
  return device;
}

// require_checked_options, its complaint printed: false when a numeric option of the program has no check.
static bool numbers_checked(CLI::App& app) {
  try {
    require_checked_options(app);
    return true;
  } catch (const std::logic_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return false;
  }
}

// --timing-only: refused without --device sim; a real run of a preset whose model state alone outgrows this
// machine's memory is refused with the option to use. Then the flag is set, before any SIM tensor exists.
// Every rank checks the same options, so each refuses with the same message. False: refused (printed).
static bool start_timing_mode(const TrainOptions& o) {
  try {
    SL_CHECK_HINT(!o.timing_only || o.device == "sim",
                  "add --device sim (timing-only runs are simulated), or drop --timing-only",
                  "--timing-only needs the simulated GPU, but --device is '%s'", o.device.c_str());
    if (!o.timing_only && GPTConfig::has_own_vocabulary(o.model)) {  // the lesson's sizes; the others as before
      // A lower bound of what a real run holds in host memory, all ranks of this machine together: the model
      // state of one replica, 16 bytes a parameter (fp32 params and grads, AdamW m and v).
      const double need = 16.0 * static_cast<double>(gpt2_num_params(GPTConfig::preset(o.model)));
      const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
      SL_CHECK_HINT(need <= have,
                    "add --device sim --timing-only (time and memory without arithmetic), or use a smaller --model",
                    "--model %s: its model state alone, 16 B x %.2fB parameters = %.1f GB, is more than this machine's "
                    "%.1f GB of memory",
                    o.model.c_str(), gpt2_num_params(GPTConfig::preset(o.model)) / 1e9, need / 1e9, have / 1e9);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return false;
  }
  sim_set_timing_only(o.timing_only);
  return true;
}

int run_on_all_ranks(CLI::App& app, const TrainOptions& o, const std::string& backend,
                     const std::function<int(Communicator&)>& body,
                     const std::function<std::vector<std::string>()>& read_inputs) {
  if (!numbers_checked(app)) return 1;
  if (!start_timing_mode(o)) return 1;
  return scalelab::run_on_all_ranks(o.device, o.sim_gpu, backend, [&](Communicator& comm) {
    std::vector<std::string> inputs;  // what this rank reads: compared only where there are other ranks
    if (comm.size() > 1) {
      inputs = data_agreement_lines("--data", o.data);
      if (read_inputs) {
        try {
          const std::vector<std::string> more = read_inputs();
          inputs.insert(inputs.end(), more.begin(), more.end());
        } catch (const std::exception&) {  // the same line on every such rank; the run's own error follows
          inputs.push_back("inputs=(cannot be read)");
        }
      }
    }
    check_ranks_agree(comm, app, inputs);  // the ranks' first collective: nothing sized by an option has run yet
    return body(comm);
  });
}

int run_single_process(CLI::App& app, const TrainOptions& o, const std::function<int()>& body) {
  if (!numbers_checked(app)) return 1;
  if (!start_timing_mode(o)) return 1;
  return scalelab::run_single_process([&] {
    start_device(o.device, o.sim_gpu, "local");
    return body();
  });
}

std::string simulated_label() {
  if (!sim_gpu_active() || !clock_is_virtual()) return "";
  return sim_gpu().display_name + ", virtual time" + (sim_timing_only() ? ", timing only" : "");
}

std::pair<AttentionImpl, std::string> attention_from_option(const std::string& name, const GPTConfig& cfg, int B, int T,
                                                            Device device) {
  if (name != "auto") return {attention_impl_from_name(name), "--attention " + name};
  const int64_t cap = Allocator::get(device).capacity_bytes();
  const int64_t budget = cap > 0 ? cap : device == Device::CUDA ? cuda_device_memory_bytes() : 0;
  const AttentionImpl impl = choose_attention(cfg, B, T, budget);
  if (budget == 0) return {impl, "auto: no memory budget to compare with (no --memory-cap-mb)"};
  constexpr double kMiB = 1 << 20;
  char why[160];
  std::snprintf(why, sizeof(why), "auto: the scores, %.1f MiB, are %s a quarter of the %.0f MiB %s",
                attention_scores_bytes(cfg, B, T) / kMiB, impl == AttentionImpl::Flash ? "over" : "within",
                budget / kMiB, cap > 0 ? "cap" : "GPU memory");
  return {impl, why};
}

// A preset or measured figures (parse_link, scalelab/comm/link_spec.h), then slowed.
LinkModel make_link(const std::string& name, double slowdown) { return slowed(parse_link(name), slowdown); }

Peak run_peak(Device device, const PrecisionPolicy& policy, int threads, const std::string& calibration_file) {
  if (device != Device::CPU || calibration_file.empty()) return device_peak(device, policy, threads);
  const std::string hint = "make one for this machine: build/bin/sl_calibrate --threads " + std::to_string(threads) +
                           " (then --calibration runs/calibration/cpu_" + std::to_string(threads) + "t.json)";
  std::ifstream in(calibration_file);
  SL_CHECK_HINT(in.good(), hint, "--calibration %s: cannot read the file", calibration_file.c_str());
  Calibration c;
  try {
    c = Calibration::from_json(nlohmann::json::parse(in));
  } catch (const nlohmann::json::exception& e) {
    SL_FAIL(hint, "--calibration %s is not a calibration file: %s", calibration_file.c_str(), e.what());
  }
  const bool bf16 = policy.matmul_dtype == DType::BF16;  // as device_peak: bf16-compute's own GEMM
  const bool file_bf16 = c.id.rfind("cpu-bf16gemm-", 0) == 0;
  SL_CHECK_HINT(c.threads == threads, hint, "--calibration %s was measured with %d threads; this run uses %d",
                calibration_file.c_str(), c.threads, threads);
  SL_CHECK_HINT(c.cpu_model == system_info().cpu_model, hint, "--calibration %s was measured on '%s', this is '%s'",
                calibration_file.c_str(), c.cpu_model.c_str(), system_info().cpu_model.c_str());
  SL_CHECK_HINT(file_bf16 == bf16, hint + " (bf16-compute runs: the bf16 matmul's cpu_bf16_<t>t.json)",
                "--calibration %s times the %s, but this run's matmuls are %s", calibration_file.c_str(),
                file_bf16 ? "bf16 matmul" : "fp32 sgemm", bf16 ? "bf16 (bf16-compute)" : "fp32");
  SL_CHECK_HINT(c.flops_per_s > 0, hint, "--calibration %s has no peak", calibration_file.c_str());
  return {c.flops_per_s, c.source + " (--calibration " + calibration_file + ")", c.id};
}

Peak device_peak_all_ranks(Device device, const PrecisionPolicy& policy, int threads, Communicator& comm,
                           const std::string& calibration_file) {
  if (device == Device::CPU && calibration_file.empty() && comm.rank() == 0) load_or_calibrate(threads);
  comm.barrier();
  const Peak peak = run_peak(device, policy, threads, calibration_file);
  if (device != Device::CUDA) return peak;
  return shared_gpu_peak(peak, ranks_per_node_from_env(comm.size()), cuda_device_count());
}

Peak shared_gpu_peak(const Peak& per_gpu, int ranks_on_node, int gpus) {
  if (gpus < 1 || ranks_on_node <= gpus) return per_gpu;
  Peak p = per_gpu;
  p.flops_per_s = per_gpu.flops_per_s * gpus / ranks_on_node;
  p.source += detail::format(" (x %d/%d: %d ranks share %d GPU%s)", gpus, ranks_on_node, ranks_on_node, gpus,
                             gpus == 1 ? "" : "s");
  return p;
}

std::string run_id_all_ranks(Communicator& comm, const std::string& requested) {
  const std::string mine = comm.rank() == 0 ? (requested.empty() ? make_run_id() : requested) : "";
  // comm/host_values.h, any backend; up to 511 bytes: 128 i32 words (512 bytes, as this buffer always was)
  return broadcast_string(comm, mine, /*root=*/0, "run id", /*max_bytes=*/511);
}

OptimizerConfig optimizer_config(const TrainOptions& o) {
  OptimizerConfig oc;
  oc.kind = OptimizerConfig::kind_from_name(o.optimizer);
  oc.weight_decay = o.weight_decay;
  return oc;
}

nlohmann::json run_config(const TrainOptions& o, const PrecisionPolicy& policy, double flops_per_token) {
  return {{"model", o.model},
          {"T", o.seq_len},
          {"steps", o.steps},
          {"lr", o.lr},
          {"optimizer", o.optimizer},
          {"precision", policy.name()},
          {"recompute", o.recompute},
          {"seed", o.seed},
          {"flops_per_token", flops_per_token},
          {"data", o.data},
          {"device", o.device}};
}

RunRecord make_run_record(const nlohmann::json& config, const std::string& track, int world_size, int threads,
                          const PrecisionPolicy& policy, Device device, const Peak& peak) {
  RunRecord r;
  r.config = config;
  r.world_size = world_size;
  r.track = track;
  r.threads = threads;
  r.precision = policy.name();
  r.device = device == Device::CUDA ? cuda_device_name() : device == Device::SIM ? "sim" : "cpu";
  if (device == Device::SIM) {  // every simulated figure says so (docs/log_schema.md)
    r.extra["sim_gpu"] = sim_gpu().name;
    r.extra["sim_gpu_name"] = sim_gpu().display_name;
    r.extra["simulated"] = true;
    r.extra["clock"] = "virtual";
    if (sim_timing_only()) r.extra["timing_only"] = true;  // no arithmetic: no loss (docs/log_schema.md)
  }
  r.peak_flops_per_s = peak.flops_per_s > 0 ? peak.flops_per_s : kNotMeasured;
  r.peak_source = peak.source;
  r.calibration_id = peak.calibration_id;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Validation and reductions

float mean_over_ranks(Communicator& comm, float x, const std::string& tag) {
  return all_reduce_value(comm, x, ReduceOp::Avg, tag);
}

static data::LoaderConfig validation_config(const data::LoaderConfig& train_config) {
  data::LoaderConfig vc = train_config;
  vc.shuffle = false;
  vc.prefetch = false;
  vc.on_assemble = nullptr;  // a simulated slow or failing read is the training loader's, not the validation pass's
  return vc;
}

ValidationSplit::ValidationSplit(const data::OpenBatchSource& open, const std::string& data_dir,
                                 const data::LoaderConfig& train_config, int64_t requested_batches)
    : loader(open(data_dir, "val", validation_config(train_config))),
      start(loader->state()),
      n_batches(static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(requested_batches,
                                                                        loader->batches_per_epoch())))) {}

float evaluate(ValidationSplit& val, Tensor& x, Tensor& y,
               const std::function<float(const Tensor& tokens, const Tensor& targets)>& loss_of) {
  val.loader->restore(val.start);
  double sum = 0.0;
  for (int i = 0; i < val.n_batches; ++i) {
    data::load_batch(val.loader->next(), x, y);
    sum += loss_of(x, y);
  }
  return static_cast<float>(sum / val.n_batches);
}

float evaluate(GPT2& model, ValidationSplit& val, Tensor& x, Tensor& y) {
  return evaluate(val, x, y,
                  [&](const Tensor& tokens, const Tensor& targets) { return model.forward(tokens, &targets); });
}

float evaluate_all_ranks(GPT2& model, Communicator& comm, ValidationSplit& val, Tensor& x, Tensor& y) {
  return mean_over_ranks(comm, evaluate(model, val, x, y), "val loss");
}

// ---------------------------------------------------------------------------------------------
// Communication stats

CommStats comm_stats(const std::vector<CommEvent>& events, double now_ms, const std::string& only_op) {
  CommStats s;
  for (const CommEvent& e : events) {
    if (!only_op.empty() && e.op != only_op) continue;
    const double end_ms = e.end_ms > 0 ? e.end_ms : now_ms;
    s.busy_ms += end_ms - e.start_ms;
    s.modeled_ms += e.modeled_ms;
    s.payload_bytes += e.payload_bytes;
    if (e.op == "all_reduce") s.all_reduce_bytes += e.payload_bytes;
    if (e.op == "all_gather") s.all_gather_bytes += e.payload_bytes;
    if (e.op == "reduce_scatter") s.reduce_scatter_bytes += e.payload_bytes;
    s.calls += 1;
    s.simulated = s.simulated || e.simulated;
  }
  return s;
}

}  // namespace scalelab::driver
