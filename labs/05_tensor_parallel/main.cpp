// main.cpp — lab 05: GPT-2 trained tensor-parallel (Megatron-LM) on N ranks: groups of --tp ranks split every
// matrix, world/tp data-parallel replicas of the group; tokens/s, MFU and what the group's collectives cost.
// The driver is shared by both tracks: it calls the functions of tensor_parallel.h, which come from your
// labs/05_tensor_parallel/tensor_parallel.cpp (bin/learner/lab05_tensor_parallel) or from the reference
// solutions/05_tensor_parallel/tensor_parallel.cpp (bin/reference/lab05_tensor_parallel). The loop around
// the step is common/include/scalelab/driver/train_loop.h. Lesson: labs/05_tensor_parallel/README.md.
//
//   mpirun -np 2 build/bin/reference/lab05_tensor_parallel --tp 2 --model demo --steps 50
//   mpirun -np 4 build/bin/reference/lab05_tensor_parallel --tp 4 --sequence-parallel --link nvlink
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none; or scripts/run 05 ...)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf, std::snprintf
#include <memory>  // defines: std::unique_ptr
#include <string>
#include <vector>

#include "ddp.h"                     // defines: lab03::micro_steps_per_step (lab 03's reference)
#include "lab_parts.h"               // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "scalelab/comm/comm.h"      // defines: Communicator
#include "scalelab/core/threads.h"   // defines: set_num_threads
#include "scalelab/driver/driver.h"  // defines: driver::DistributedOptions, make_link, comm_stats, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/metrics.h"       // defines: RunLogger
#include "scalelab/model/gpt2.h"            // defines: GPT2
#include "scalelab/model/optim.h"           // defines: Optimizer
#include "tensor_parallel.h"                // defines: lab05::MegatronPoints, train_step, make_layout, ... (YOU)
#include "train_step.h"                     // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;

// The options labs 03-05 share (scalelab/driver/driver.h) and lab 05's own.
struct Options : driver::DistributedOptions, driver::ClusterOptions {
  Options() { sample_tokens = 0; }  // a shard's logits are a slice of the vocabulary: no sample by default
  int tp = 0;                       // ranks per tensor-parallel group (0: all ranks)
  bool sequence_parallel = false;   // split the token rows too (Korthikanti et al. 2022)
};

static int run(const Options& o, Communicator& world) {
  const int rank = world.rank(), n = world.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: the layout (checked on every rank before any collective), the groups, data, model, peak
  driver::check_train_options(o);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  driver::set_links(world, o, o);  // --link, or a simulated cluster (--ranks-per-node, --inter-link)
  const int tp = o.tp > 0 ? o.tp : n;
  GPTConfig cfg = GPTConfig::preset(o.model);
  const lab05::Layout layout = lab05::make_layout(cfg, n, rank, tp, o.sequence_parallel);  // throws everywhere alike
  SL_CHECK_HINT(o.sample_tokens == 0 || tp == 1,
                "a tensor-parallel shard holds a slice of the vocabulary's "
                "logits: use --sample-tokens 0",
                "--sample-tokens %d with --tp %d", o.sample_tokens, tp);
  // tp fastest: ranks [g*tp, (g+1)*tp) form tensor-parallel group g; the ranks with the same tp_rank form
  // a data-parallel group (the replicas of one shard).
  // Each group takes the link of its members' placement (inside one simulated node or across nodes).
  std::unique_ptr<Communicator> tp_group = world.split(/*color=*/layout.dp_rank, /*key=*/layout.tp_rank, "tp");
  std::unique_ptr<Communicator> dp_group = world.split(/*color=*/layout.tp_rank, /*key=*/layout.dp_rank, "dp");
  const int global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * layout.dp;
  const int micro_steps = lab03::micro_steps_per_step(global_batch, o.micro_batch, layout.dp);  // lab 03's rule
  // Every rank of a tensor-parallel group reads the same windows: the data is split across replicas only.
  driver::RunData data = driver::open_data(o, lab_parts(), o.micro_batch, micro_steps, layout.dp_rank, layout.dp);

  const PrecisionPolicy policy = driver::precision_policy(o);             // --precision, --activations
  GPT2 model(data.cfg, lab05::shard_of(layout), policy, device, o.seed);  // the dense model's slices
  lab05::MegatronPoints points(*tp_group, o.sequence_parallel);
  model.set_tensor_parallel(&points);  // YOUR points: the model calls them inside every block
  driver::apply_recompute(o, model);   // full recompute calls them again in the backward
  const OptimizerConfig oc = driver::optimizer_config(o);
  Optimizer optimizer(model, oc);

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, world, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);  // the WHOLE model's FLOPs per token
  RunLogger log("lab05", driver::run_id_all_ranks(world, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);
  const LinkModel& link = tp_group->link_model();
  int owned_units = 0;
  for (int u = 0; u < model.num_units(); ++u)
    owned_units += model.owns_unit(u) ? 1 : 0;                       // the link the tensor-parallel collectives cross
  nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
  config.update({{"n_layer", data.cfg.n_layer},
                 {"n_embd", data.cfg.n_embd},
                 {"n_params", gpt2_num_params(data.cfg)},
                 {"shard_params", model.num_params()},
                 {"tp", tp},
                 {"dp", layout.dp},
                 {"sequence_parallel", o.sequence_parallel},
                 {"micro_batch", o.micro_batch},
                 {"global_batch", global_batch},
                 {"micro_steps", micro_steps},
                 {"backend", world.backend()},
                 {"link", link.name},
                 {"link_slowdown", o.link_slowdown},
                 {"ranks_per_node", o.ranks_per_node},
                 {"dp_link", dp_group->link_model().name},
                 {"link_alpha_s", link.alpha_s},
                 {"link_base_s", link.base_s},
                 {"link_bandwidth_bytes_per_s", link.bandwidth_bytes_per_s},
                 {"dp_link_alpha_s", dp_group->link_model().alpha_s},
                 {"dp_link_base_s", dp_group->link_model().base_s},
                 {"dp_link_bandwidth_bytes_per_s", dp_group->link_model().bandwidth_bytes_per_s},
                 {"owned_units", owned_units}});
  RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, n, threads, policy, device, peak);
  run_rec.extra["layout"] = {
      {"tp", tp}, {"pp", 1}, {"dp", layout.dp}, {"tp_rank", layout.tp_rank}, {"dp_rank", layout.dp_rank}};
  if (link.enabled()) run_rec.extra["simulated"] = true;
  log.log_run(run_rec);
  if (rank == 0) {
    std::printf("lab05 | %s | %lld params (%lld per rank) | %d ranks = tp %d x dp %d%s | %d threads | link %s%s\n",
                data.cfg.str().c_str(), static_cast<long long>(gpt2_num_params(data.cfg)),
                static_cast<long long>(model.num_params()), n, tp, layout.dp,
                o.sequence_parallel ? " (sequence parallel)" : "", threads, link.name.c_str(),
                link.enabled() ? " (simulated)" : "");
    std::printf(
        "global batch %d = micro-batch %d x %d replicas x %d micro-steps | T=%d | %s | peak %.1f GFLOP/s per "
        "rank (%s)\nlogs: %s (one file per rank)\n",
        global_batch, o.micro_batch, layout.dp, micro_steps, o.seq_len, policy.name().c_str(), peak.flops_per_s / 1e9,
        peak.source.c_str(), log.path().c_str());
  }

  // ------------------------------------------------------------------------------------------------
  // Training: the driver's loop around lab 05's step
  driver::TrainLoop loop(o, {"lab05", o.micro_batch, micro_steps, global_batch, /*sample_on_every_rank=*/true}, &world,
                         model, data, log, peak, flops_tok, device);
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    return lab05::train_step(model, optimizer, points, dp_group.get(), micro, lr, o.grad_clip);  // YOUR step
  };
  loop.timeline_comm = tp_group.get();  // the timeline shows the tensor-parallel collectives, layer by layer
  loop.before_step = [&](double, double, bool) {
    tp_group->clear_events();
    dp_group->clear_events();
  };
  loop.after_step = [&](double, double, bool) {
    // Every tensor-parallel collective is blocking: the step waits for all of it (exposed = busy).
    const double now = Communicator::now_ms();
    const driver::CommStats t = driver::comm_stats(tp_group->events(), now);
    const driver::CommStats d = driver::comm_stats(dp_group->events(), now);
    driver::StepMeasure m;
    m.comm_ms = t.busy_ms + d.busy_ms;
    m.comm_busy_ms = m.comm_ms;
    m.comm_modeled_ms = t.modeled_ms + d.modeled_ms;
    m.simulated = t.simulated || d.simulated;
    m.extra = {{"tp_comm_ms", t.busy_ms},
               {"tp_calls", t.calls},
               {"tp_payload_bytes", t.payload_bytes},
               {"dp_comm_ms", d.busy_ms},
               {"dp_payload_bytes", d.payload_bytes}};
    return m;
  };
  loop.progress = [](const driver::StepMeasure& m, double) {
    char s[96];
    std::snprintf(s, sizeof(s), "comm %6.1f ms (tp %d calls)", m.comm_ms, m.extra.value("tp_calls", 0));
    return std::string(s);
  };
  const driver::Summary s = loop.run();

  // ------------------------------------------------------------------------------------------------
  // Summary (every rank logs its own; rank 0 prints)
  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, /*simulated=*/link.enabled());
  summary.update({{"step_ms", s.step_ms},
                  {"memory_peak_bytes", s.memory.total_peak_bytes},
                  {"memory_activations_peak_bytes", s.memory.peak_bytes[static_cast<int>(MemCategory::Activations)]}});
  log.log_summary(summary);
  if (rank == 0) {
    driver::print_summary_headline(s, peak, n);
    std::printf("\ncommunication per step: the step waited %.1f ms (tensor parallel collectives are blocking)",
                s.comm_ms);
    if (link.enabled()) std::printf(", of which the simulated link charged %.1f ms", s.comm_modeled_ms);
    std::printf(" | peak memory of rank 0: %.1f MiB (activations %.1f)\n", s.memory.total_peak_bytes / 1048576.0,
                s.memory.peak_bytes[static_cast<int>(MemCategory::Activations)] / 1048576.0);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{
      "lab 05: tensor-parallel GPT-2 (Megatron-LM) on N ranks (mpirun -np N); loss, tokens/s, MFU, "
      "communication"};
  Options o;
  driver::add_distributed_options(app, o, "lab05");
  app.add_option("--tp", o.tp, "ranks per tensor-parallel group (0: all ranks); the rest are data-parallel replicas")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "split the layernorms and the residual stream across the group too (Korthikanti et al. 2022)");
  driver::add_link_options(app, o);
  driver::add_cluster_options(app, o);
  CLI11_PARSE(app, argc, argv);
  return driver::run_on_all_ranks(app, o, o.backend, [&](Communicator& comm) { return run(o, comm); });
}
