// main.cpp — lab 10: GPT-2 trained context-parallel on N ranks: groups of --cp ranks split every sequence
// (ring attention, or the all-gather variant), optionally inside --tp tensor-parallel groups (lab 05's
// reference points: each ring runs on one tp rank's NH/tp heads), world/(tp cp) data-parallel replicas of the
// tp x cp block; tokens/s, MFU, the attention work per rank and what the ring's transfers cost. The driver is
// shared by both tracks: it calls the functions of context_parallel_lab.h, from your
// labs/10_context_parallel/context_parallel_lab.cpp
// (bin/learner/lab10_context_parallel) or the reference (bin/reference/lab10_context_parallel). The loop around
// the step is common/include/scalelab/driver/train_loop.h. Lesson: labs/10_context_parallel/README.md.
//
//   mpirun -np 2 build/bin/reference/lab10_context_parallel --cp 2 --model demo --steps 50
//   mpirun -np 4 build/bin/reference/lab10_context_parallel --cp 4 --zigzag --variant allgather --link nvlink
//   mpirun -np 4 build/bin/reference/lab10_context_parallel --tp 2 --cp 2 --zigzag --model demo
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none; or scripts/run 10 ...)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf, std::snprintf
#include <memory>  // defines: std::unique_ptr
#include <string>
#include <utility>  // defines: std::move
#include <vector>

#include "context_parallel_lab.h"       // defines: lab10::RingAttention, train_step, make_layout, ... (YOU)
#include "ddp.h"                        // defines: lab03::micro_steps_per_step (lab 03's reference)
#include "lab_parts.h"                  // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "scalelab/comm/comm.h"         // defines: Communicator
#include "scalelab/comm/host_values.h"  // defines: all_reduce_value
#include "scalelab/core/threads.h"      // defines: set_num_threads
#include "scalelab/driver/driver.h"     // defines: driver::DistributedOptions, comm_stats, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/metrics.h"       // defines: RunLogger
#include "scalelab/model/gpt2.h"            // defines: GPT2
#include "scalelab/model/optim.h"           // defines: Optimizer
#include "tensor_parallel.h"                // defines: lab05::MegatronPoints (lab 05's reference)
#include "train_step.h"                     // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;

// The model's context-parallel point, timed: it calls the lab's point (the ring or the all-gather) and, while
// `recording` (the steps that log a timeline), keeps one span per call on the communication clock
// (Communicator::now_ms(), the clock of the ring's CommEvents): "attention forward L" / "attention backward L"
// for block L (the model calls the point once per block, in order). A span is the whole call: the block ops
// AND the waits; the ring's sends and receives are the step's CommEvents, so the timeline shows what ran under
// what. Two clock reads per call while recording; none otherwise.
class TimedPoint : public ContextParallel {
 public:
  TimedPoint(ContextParallel& inner, int n_layer) : inner_(inner), n_layer_(n_layer) {}
  void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int NH,
                         const std::vector<CpChunk>& chunks) override {
    const double t0 = recording ? Communicator::now_ms() : 0.0;
    inner_.attention_forward(out, lse, qkv, NH, chunks);
    if (recording) spans.push_back({"attention forward " + std::to_string(forward_calls_ % n_layer_), t0,
                                    Communicator::now_ms()});
    forward_calls_++;
  }
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          int NH, const std::vector<CpChunk>& chunks) override {
    const double t0 = recording ? Communicator::now_ms() : 0.0;
    inner_.attention_backward(dqkv, dout, qkv, out, lse, NH, chunks);
    // The backward runs the blocks last to first.
    if (recording) spans.push_back({"attention backward " + std::to_string(n_layer_ - 1 - backward_calls_ % n_layer_),
                                    t0, Communicator::now_ms()});
    backward_calls_++;
  }
  // Forgets the spans and restarts the block count: at the start of every step.
  void clear(bool record) {
    spans.clear();
    recording = record;
    forward_calls_ = backward_calls_ = 0;
  }
  bool recording = false;
  std::vector<TimeSpan> spans;

 private:
  ContextParallel& inner_;
  int n_layer_;
  int64_t forward_calls_ = 0, backward_calls_ = 0;
};

// The options labs 03-05 share (scalelab/driver/driver.h) and lab 10's own.
struct Options : driver::DistributedOptions, driver::ClusterOptions {
  Options() { sample_tokens = 0; }  // a rank holds a slice of each sequence: no sample by default
  int tp = 1;                       // ranks per tensor-parallel group (1: none)
  int cp = 0;                       // ranks per context-parallel group (0: all ranks / tp)
  bool zigzag = false;              // 2 cp chunks per sequence, rank r holding r and 2cp-1-r
  std::string variant = "ring";     // ring | allgather
  bool no_overlap = false;          // the ring waits for each transfer before computing
};

static int run(const Options& o, Communicator& world) {
  const int rank = world.rank(), n = world.size();
  driver::check_train_options(o);
  const Device device = driver::device_from_option(o.device);
  SL_CHECK_HINT(device != Device::CUDA, "lab 10's context-parallel points run on host memory: --device cpu or sim",
                "--device %s", o.device.c_str());
  const int threads = set_num_threads(o.threads);
  driver::set_links(world, o, o);  // --link, or a simulated cluster (--ranks-per-node, --inter-link)
  SL_CHECK_HINT(o.tp >= 1, "--tp is the size of one tensor-parallel group: 1 (none) or more", "--tp %d", o.tp);
  const int cp = o.cp > 0 ? o.cp : n / o.tp;
  const GPTConfig cfg = GPTConfig::preset(o.model);
  const lab10::Layout layout =
      lab10::make_layout(cfg, n, rank, o.tp, cp, o.zigzag, o.seq_len);  // throws everywhere alike
  // tp: tp consecutive ranks; cp: the same tp_rank in one replica; dp: the same (tp_rank, cp_rank).
  lab10::Groups groups = lab10::split_groups(world, layout);  // given (cp_given.cpp)
  std::unique_ptr<Communicator> tp_group = std::move(groups.tp), cp_group = std::move(groups.cp),
                                dp_group = std::move(groups.dp);
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * layout.dp;
  const int micro_steps = lab03::micro_steps_per_step(global_batch, o.micro_batch, layout.dp);  // lab 03's rule
  // Every rank of a tp x cp block reads the same whole sequences; the step slices them.
  driver::RunData data = driver::open_data(o, lab_parts(), o.micro_batch, micro_steps, layout.dp_rank, layout.dp);

  const PrecisionPolicy policy = driver::precision_policy(o);             // --precision, --activations
  GPT2 model(data.cfg, lab10::shard_of(layout), policy, device, o.seed);  // tp slices (or whole), a slice of tokens
  model.set_attention(AttentionImpl::Flash);  // as every cp > 1 shard runs: cp 1 is the comparison (no T x T)
  // tp > 1: lab 05's reference points over the tp group (no sequence parallel: cp already splits the sequence).
  lab05::MegatronPoints tp_points(*tp_group, /*sequence_parallel=*/false);
  if (layout.tp > 1) model.set_tensor_parallel(&tp_points);
  std::unique_ptr<lab10::RingAttention> ring;
  std::unique_ptr<lab10::AllGatherAttention> gather;
  SL_CHECK_HINT(o.variant == "ring" || o.variant == "allgather", "--variant ring or allgather", "--variant %s",
                o.variant.c_str());
  // cp 1 keeps the model's own point, the identity (the flash op on the whole sequence): nothing to pass round.
  if (o.variant == "ring") {
    ring = std::make_unique<lab10::RingAttention>(*cp_group, data.cfg, o.zigzag, !o.no_overlap);
  } else {
    gather = std::make_unique<lab10::AllGatherAttention>(*cp_group, data.cfg, o.zigzag);
  }
  ContextParallel& point = ring ? static_cast<ContextParallel&>(*ring) : static_cast<ContextParallel&>(*gather);
  TimedPoint timed(point, data.cfg.n_layer);  // YOUR point, timed for the timeline
  if (cp > 1) model.set_context_parallel(&timed);  // the model calls it in every block
  const OptimizerConfig oc = driver::optimizer_config(o);
  Optimizer optimizer(model, oc);

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, world, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);  // the WHOLE model's FLOPs per token
  RunLogger log("lab10", driver::run_id_all_ranks(world, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);
  const LinkModel& link = cp_group->link_model();
  nlohmann::json config = driver::run_config(o, policy, flops_tok);
  config.update({{"n_layer", data.cfg.n_layer},
                 {"n_embd", data.cfg.n_embd},
                 {"n_params", gpt2_num_params(data.cfg)},
                 {"tp", layout.tp},
                 {"cp", cp},
                 {"dp", layout.dp},
                 {"zigzag", o.zigzag},
                 {"variant", o.variant},
                 {"overlap", !o.no_overlap},
                 {"T_local", layout.T_local},
                 {"micro_batch", o.micro_batch},
                 {"global_batch", global_batch},
                 {"micro_steps", micro_steps},
                 {"backend", world.backend()},
                 {"link", link.name}});
  RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, n, threads, policy, device, peak);
  run_rec.extra["layout"] = {{"tp", layout.tp},           {"cp", cp},
                             {"dp", layout.dp},           {"tp_rank", layout.tp_rank},
                             {"cp_rank", layout.cp_rank}, {"dp_rank", layout.dp_rank}};
  if (link.enabled()) run_rec.extra["simulated"] = true;
  log.log_run(run_rec);
  if (rank == 0)
    std::printf("lab10 | %s | %d ranks = tp %d x cp %d x dp %d | T=%d, %d per rank%s | %s | link %s%s\nlogs: %s\n",
                data.cfg.str().c_str(), n, layout.tp, cp, layout.dp, o.seq_len, layout.T_local,
                o.zigzag ? " (zig-zag)" : "", cp > 1 ? o.variant.c_str() : "no ring (cp 1)", link.name.c_str(),
                link.enabled() ? " (simulated)" : "", log.path().c_str());

  driver::TrainLoop loop(o, {"lab10", o.micro_batch, micro_steps, global_batch, /*sample_on_every_rank=*/true}, &world,
                         model, data, log, peak, flops_tok, device);
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    return lab10::train_step(model, optimizer, tp_group.get(), *cp_group, dp_group.get(), micro, lr,
                             o.grad_clip);  // YOUR step
  };
  // Validation: every rank of the group takes its slice of the same whole sequences; the group's mean.
  loop.forward_loss = [&](const Tensor& x, const Tensor& y) {
    const std::vector<CpChunk> chunks = cp_chunks(model.shard(), model.config(), layout.T_local);
    const Tensor xs = lab10::slice_sequence(x, chunks, layout.T_local),
                 ys = lab10::slice_sequence(y, chunks, layout.T_local);
    return all_reduce_value(*cp_group, model.forward(xs, &ys), ReduceOp::Avg, "cp validation loss");
  };
  loop.timeline_comm = cp_group.get();  // the timeline shows the ring's transfers
  double step_start_ms = 0;  // after the data: where the step's compute and the ring begin
  loop.before_step = [&](double, double data_end_ms, bool want_timeline) {
    tp_group->clear_events();
    cp_group->clear_events();
    dp_group->clear_events();
    timed.clear(want_timeline);
    step_start_ms = data_end_ms;
  };
  loop.after_step = [&](double, double, bool want_timeline) {
    timed.recording = false;  // the validation forwards after the step are not part of it
    const double now = Communicator::now_ms();
    const driver::CommStats c = driver::comm_stats(cp_group->events(), now);
    const driver::CommStats d = driver::comm_stats(dp_group->events(), now);
    const driver::CommStats t = driver::comm_stats(tp_group->events(), now);  // blocking: all of it exposed
    const lab10::CpWork& w = ring ? ring->work() : gather->work();
    double exposed = 0;  // how long the step was blocked in the group's waits (the overlap hid the rest)
    for (const CommEvent& e : cp_group->events()) exposed += e.wait_ms;
    driver::StepMeasure m;
    m.comm_ms = exposed + d.busy_ms + t.busy_ms;
    m.comm_busy_ms = c.busy_ms + d.busy_ms + t.busy_ms;
    m.comm_modeled_ms = c.modeled_ms + d.modeled_ms + t.modeled_ms;
    m.simulated = c.simulated || d.simulated || t.simulated;
    m.extra = {{"tp_comm_ms", t.busy_ms},
               {"cp_comm_ms", c.busy_ms},
               {"cp_exposed_ms", exposed},
               {"cp_calls", c.calls},
               {"attention_pairs", w.pairs},
               {"blocks_computed", w.blocks_computed},
               {"blocks_skipped", w.blocks_skipped}};
    if (want_timeline) {
      m.spans = timed.spans;
      m.spans.push_back({"step", step_start_ms, now});  // the notebook aligns the ranks on it
    }
    return m;
  };
  loop.progress = [](const driver::StepMeasure& m, double) {
    char s[96];
    std::snprintf(s, sizeof(s), "comm %6.1f ms exposed | %lld pairs", m.comm_ms,
                  static_cast<long long>(m.extra.value("attention_pairs", int64_t{0})));
    return std::string(s);
  };
  const driver::Summary s = loop.run();

  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, /*simulated=*/link.enabled());
  summary.update({{"step_ms", s.step_ms},
                  {"memory_peak_bytes", s.memory.total_peak_bytes},
                  {"memory_activations_peak_bytes", s.memory.peak_bytes[static_cast<int>(MemCategory::Activations)]}});
  log.log_summary(summary);
  if (rank == 0) {
    driver::print_summary_headline(s, peak, n);
    std::printf("\ncommunication per step: exposed %.1f ms | peak memory of rank 0: %.1f MiB (activations %.1f)\n",
                s.comm_ms, s.memory.total_peak_bytes / 1048576.0,
                s.memory.peak_bytes[static_cast<int>(MemCategory::Activations)] / 1048576.0);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 10: context-parallel GPT-2 (ring attention) on N ranks (mpirun -np N); loss, tokens/s, MFU"};
  Options o;
  driver::add_distributed_options(app, o, "lab10");
  app.add_option("--tp", o.tp, "ranks per tensor-parallel group (lab 05's reference points; 1: none), innermost")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--cp", o.cp,
                 "ranks per context-parallel group (0: all ranks / tp); the rest are data-parallel replicas")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_flag("--zigzag", o.zigzag, "balance the causal work: 2 cp chunks, rank r holds r and 2cp-1-r");
  app.add_option("--variant", o.variant, "ring (kv passed round the group) or allgather (Llama 3)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ring", "allgather"}));
  app.add_flag("--no-overlap", o.no_overlap, "the ring waits for each kv transfer before computing on it");
  driver::add_link_options(app, o);
  driver::add_cluster_options(app, o);
  CLI11_PARSE(app, argc, argv);
  return driver::run_on_all_ranks(app, o, o.backend, [&](Communicator& comm) { return run(o, comm); });
}
