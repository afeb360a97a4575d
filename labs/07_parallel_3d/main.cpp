// main.cpp — lab 07: GPT-2 trained 3D-parallel on tp x pp x dp ranks: every pipeline stage (lab 06) split
// across a tensor-parallel group (lab 05), the whole model replicated dp times (lab 03). Tokens/s, MFU, the
// bubble, and what each group (tp, pp, dp, embedding) carried and cost per step, optionally on a simulated
// cluster (--ranks-per-node, --link inside a node, --inter-link across). The driver is shared by both
// tracks: it calls the functions of parallel_3d.h, which come from your labs/07_parallel_3d/parallel_3d.cpp
// (bin/learner/lab07_parallel_3d) or from the reference solutions/07_parallel_3d/parallel_3d.cpp
// (bin/reference/lab07_parallel_3d). The loop around the step is common/include/scalelab/driver/train_loop.h.
// Lesson: labs/07_parallel_3d/README.md.
//
//   mpirun -np 8 build/bin/reference/lab07_parallel_3d --tp 2 --pp 2 --micro-batches 4 --steps 20
//   mpirun -np 8 build/bin/reference/lab07_parallel_3d --tp 2 --cp 2 --pp 2 --steps 20   (a fourth axis: each
//          sequence split across 2 ranks by lab 10's reference ring; README.md#a-fourth-axis-context-parallel)
//   mpirun -np 8 build/bin/reference/lab07_parallel_3d --tp 2 --pp 2 --order pp-dp-tp --ranks-per-node 4
//          --link nvlink --inter-link infiniband --uniform-compute-ms 40 --steps 5   (tp across the nodes)
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none; or scripts/run 07 ...)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf, std::snprintf
#include <string>
#include <vector>

#include "group_probe.h"              // defines: lab07_driver::GroupProbe (per group: calls, bytes, waits; the bubble)
#include "lab_parts.h"                // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "parallel_3d.h"              // defines: lab07::make_layout, build_rank, train_step, ... (YOU)
#include "scalelab/comm/comm.h"       // defines: Communicator, Topology
#include "scalelab/core/allocator.h"  // defines: Allocator (the --memory-cap-mb cap)
#include "scalelab/core/threads.h"    // defines: set_num_threads
#include "scalelab/driver/driver.h"   // defines: driver::DistributedOptions, make_link, comm_stats, ... (common/)
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/driver/train_loop.h"     // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/metrics.h"       // defines: RunLogger
#include "train_step.h"                     // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;

// The options labs 03-07 share, the simulated cluster's and the pipeline's (scalelab/driver/driver.h), and lab 07's.
struct Options : driver::DistributedOptions, driver::ClusterOptions, driver::PipelineOptions {
  Options() {
    sample_tokens = 0;  // a rank holds a slice of some layers: no sample
    inter_link = "infiniband";
  }
  int tp = 1, pp = 1, dp = 0;      // dp 0: the ranks / (tp x cp x pp)
  int cp = 1;                      // context parallel: each sequence split across cp ranks (lab 10's ring)
  std::string order = "tp-dp-pp";  // the grid's axes, fastest-varying first
  bool placement_rule = false;     // refuse a tp group that crosses a node
  double memory_cap_mb = 0;        // simulated device memory per rank (0: no cap)
  bool zero1 = false;              // shard the optimizer state across the dp group (ZeRO-1)
};

static int run(const Options& o, Communicator& world) {
  const int rank = world.rank(), n = world.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: the topology, the layout (checked on every rank before any collective), the rank's part
  driver::check_train_options(o);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  world.set_wait_timeout(o.wait_timeout_s);
  driver::set_links(world, o, o);  // before the splits: each group takes the link of its members' placement
  lab07::Grid grid{o.tp, o.pp, o.dp, o.order, o.cp};
  const int block = o.tp * o.cp * o.pp;  // the ranks of one replica
  if (grid.dp == 0 && block > 0) grid.dp = n / block > 0 ? n / block : 1;
  GPTConfig cfg = GPTConfig::preset(o.model);
  lab07::check_context_parallel(cfg, grid, o.seq_len);  // the fourth axis' refusals, on every rank alike
  const lab07::Layout layout = lab07::make_layout(cfg, grid, n, rank, lab06::schedule_from_name(o.schedule),
                                                  o.micro_batches, o.chunks, o.ranks_per_node, o.placement_rule);
  SL_CHECK_HINT(o.global_batch == 0 || o.global_batch == o.micro_batch * o.micro_batches * grid.dp,
                "the global batch is --micro-batch x --micro-batches x dp: leave --global-batch out",
                "--global-batch %d with --micro-batch %d x --micro-batches %d x dp %d", o.global_batch, o.micro_batch,
                o.micro_batches, grid.dp);
  // Every rank of one replica (its stages and tp ranks) reads the same windows; the replicas disjoint ones.
  driver::RunData data =
      driver::open_data(o, lab_parts(), o.micro_batch, o.micro_batches, layout.coords.dp_rank, grid.dp);
  const PrecisionPolicy policy = driver::precision_policy(o);  // --precision, --activations
  const OptimizerConfig oc = driver::optimizer_config(o);
  // The simulated device memory of this rank: from here on an allocation beyond it throws OutOfMemory (a
  // layout whose shards, optimizer state or in-flight activations do not fit ends with a report).
  if (o.memory_cap_mb > 0) Allocator::get(device).set_capacity_bytes(static_cast<int64_t>(o.memory_cap_mb * 1048576.0));
  std::unique_ptr<lab07::Rank3D> part = lab07::build_rank(world, data.cfg, layout, oc, policy, device, o.seed, o.zero1);
  for (auto& m : part->models) driver::apply_recompute(o, *m);
  lab07::Groups& g = part->groups;
  const int v = layout.pipeline.v;
  part->stage->set_uniform_compute(o.uniform_compute_ms / v, 2 * o.uniform_compute_ms / v, g.tp.get());

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, world, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);  // the WHOLE model's FLOPs per token
  RunLogger log("lab07", driver::run_id_all_ranks(world, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);
  const int global_batch = o.micro_batch * o.micro_batches * grid.dp;
  const double formula = lab06::bubble_formula(layout.pipeline);
  auto link_of = [](Communicator* c) { return c == nullptr ? std::string("-") : c->link_model().name; };
  // --link none on the sim backend keeps its own links (driver::set_links): the run names the one in a node
  const bool sim_own_links = world.backend() == "sim" && o.link == "none";
  nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
  config.update({{"n_layer", data.cfg.n_layer},
                 {"n_embd", data.cfg.n_embd},
                 {"n_params", gpt2_num_params(data.cfg)},
                 {"tp", grid.tp},
                 {"pp", grid.pp},
                 {"dp", grid.dp},
                 {"cp", grid.cp},
                 {"order", grid.order},
                 {"ranks_per_node", o.ranks_per_node},
                 {"placement_rule", o.placement_rule},
                 {"schedule", o.schedule},
                 {"micro_batches", o.micro_batches},
                 {"micro_steps", o.micro_batches},
                 {"chunks", v},
                 {"micro_batch", o.micro_batch},
                 {"global_batch", global_batch},
                 {"uniform_compute_ms", o.uniform_compute_ms},
                 {"bubble_formula", formula},
                 {"backend", world.backend()},
                 {"link", sim_own_links ? world.topology().intra.name : o.link},
                 {"inter_link", o.inter_link},
                 {"link_slowdown", o.link_slowdown},
                 {"tp_link", link_of(g.tp.get())},
                 {"pp_link", link_of(g.pp.get())},
                 {"dp_link", link_of(g.dp.get())},
                 {"embedding_link", link_of(g.embedding.get())},
                 {"cp_link", link_of(g.cp.get())},
                 {"memory_cap_mb", o.memory_cap_mb},
                 {"zero1", o.zero1}});
  RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, n, threads, policy, device, peak);
  run_rec.extra["layout"] = {{"tp", grid.tp},
                             {"pp", grid.pp},
                             {"dp", grid.dp},
                             {"cp", grid.cp},
                             {"order", grid.order},
                             {"tp_rank", layout.coords.tp_rank},
                             {"pp_rank", layout.coords.pp_rank},
                             {"dp_rank", layout.coords.dp_rank},
                             {"cp_rank", layout.coords.cp_rank},
                             {"tp_group", g.tp->world_ranks()},
                             {"pp_group", g.pp->world_ranks()},
                             {"dp_group", g.dp->world_ranks()},  // cp > 1: the cp x dp group ("dp-cp")
                             {"cp_group", g.cp ? nlohmann::json(g.cp->world_ranks()) : nullptr},
                             {"embedding_group", g.embedding ? nlohmann::json(g.embedding->world_ranks()) : nullptr},
                             {"stage_layers", part->models.front()->shard().str()}};
  const bool simulated = world.link_model().enabled() || o.ranks_per_node > 0;
  if (simulated) run_rec.extra["simulated"] = true;
  log.log_run(run_rec);
  if (rank == 0) {
    std::printf("lab07 | %s | %lld params | %d ranks = %s%s | %s, m = %d, v = %d | %d threads\n",
                data.cfg.str().c_str(), static_cast<long long>(gpt2_num_params(data.cfg)), n, grid.describe().c_str(),
                o.zero1 ? " + ZeRO-1" : "", o.schedule.c_str(), o.micro_batches, v, threads);
    std::printf(
        "global batch %d = micro-batch %d x %d micro-batches x %d replicas | T=%d | %s | bubble formula %.3f\n"
        "rank 0: %s | links: tp %s, pp %s, %s %s, embedding %s%s%s\nlogs: %s (one file per rank)\n",
        global_batch, o.micro_batch, o.micro_batches, grid.dp, o.seq_len, policy.name().c_str(), formula,
        part->models.front()->shard().str().c_str(), link_of(g.tp.get()).c_str(), link_of(g.pp.get()).c_str(),
        g.dp->name().c_str(), link_of(g.dp.get()).c_str(), link_of(g.embedding.get()).c_str(),
        g.cp ? ", cp (ring) " : "", g.cp ? link_of(g.cp.get()).c_str() : "", log.path().c_str());
  }

  // ------------------------------------------------------------------------------------------------
  // Training: the driver's loop around lab 07's step
  driver::TrainLoop loop(o, {"lab07", o.micro_batch, o.micro_batches, global_batch}, &world, *part->models.front(),
                         data, log, peak, flops_tok, device);
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    return lab07::train_step(*part, lab07::cp_slices(*part, micro), lr, o.grad_clip);  // cp > 1: my slices
  };
  loop.forward_loss = [&](const Tensor& x, const Tensor& y) { return lab07::forward_loss(*part, x, y); };
  loop.timeline_comm = g.tp.get();
  lab07_driver::GroupProbe probe(world, *part, formula, simulated);  // per group: calls, bytes, waits; the bubble
  loop.before_step = [&](double, double, bool) { probe.begin(); };
  loop.after_step = [&](double, double, bool want_timeline) { return probe.end(want_timeline); };
  loop.progress = [](const driver::StepMeasure& m, double) { return lab07_driver::GroupProbe::progress(m); };
  const driver::Summary s = loop.run();

  // ------------------------------------------------------------------------------------------------
  // Summary (every rank logs its own; rank 0 prints)
  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, simulated);
  summary.update({{"step_ms", s.step_ms},
                  {"bubble_formula", formula},
                  {"memory_peak_bytes", s.memory.total_peak_bytes}});
  log.log_summary(summary);
  if (rank == 0) {
    driver::print_summary_headline(s, peak, n);
    std::printf("\nrank 0 waited %.1f ms per step for communication (all groups, bubble included)", s.comm_ms);
    if (simulated) std::printf("; the simulated links charged %.1f ms", s.comm_modeled_ms);
    std::printf("\nper group and step: the step records' \"groups\" (%s)\n", log.path().c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{
      "lab 07: 3D-parallel GPT-2 (mpirun -np N, N = tp x pp x dp, or tp x cp x pp x dp with --cp); loss, tokens/s, "
      "MFU, per-group comm"};
  Options o;
  driver::add_distributed_options(app, o, "lab07");
  app.add_option("--tp", o.tp, "tensor-parallel group size (divides the heads, 4C and the vocabulary)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--pp", o.pp, "pipeline stages")->capture_default_str()->check(driver::positive_int());
  app.add_option("--cp", o.cp,
                 "context-parallel group size: each sequence split across cp ranks by lab 10's reference ring "
                 "(zig-zag: --seq-len a multiple of 2 cp); cp goes right after tp unless --order names it")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--dp", o.dp, "data-parallel replicas (0: the ranks / (tp x cp x pp))")
      ->capture_default_str()
      ->check(driver::non_negative_int());
  app.add_option("--order", o.order, "the grid's axes, fastest-varying first: tp-dp-pp puts tp inside a node")
      ->capture_default_str();
  app.add_flag("--zero1", o.zero1, "shard the optimizer state across the data-parallel group (ZeRO-1, lab 04)");
  app.add_flag("--placement-rule", o.placement_rule,
               "refuse a layout whose tensor-parallel groups cross a node (the lesson's rule: TP inside a node)");
  driver::add_cluster_options(app, o);
  driver::add_pipeline_options(app, o);
  app.get_option("--uniform-compute-ms")
      ->description(
          "a stage's forward of a micro-batch takes at least this long plus its tensor-parallel waits, its "
          "backward twice as long (0: as the compute takes)");
  app.add_option("--memory-cap-mb", o.memory_cap_mb,
                 "simulated device memory per rank, MiB (0: no cap); beyond it "
                 "an allocation fails with an out-of-memory report")
      ->capture_default_str()
      ->check(driver::finite_in_range(0, 1e9));
  driver::add_link_options(app, o);
  CLI11_PARSE(app, argc, argv);
  return driver::run_on_all_ranks(app, o, o.backend, [&](Communicator& comm) { return run(o, comm); });
}
