// main.cpp — lab 06: GPT-2 trained pipeline-parallel on N ranks: the layers cut into N stages (v chunks per
// rank with the interleaved schedule), every optimizer step m micro-batches flowing through them under
// GPipe, 1F1B, interleaved 1F1B or ZB-H1; tokens/s, MFU, the measured bubble beside its formula, and what the
// stage boundaries carried. The driver is shared by both tracks: it calls the functions of
// pipeline_parallel.h, which come from your labs/06_pipeline_parallel/pipeline_parallel.cpp
// (bin/learner/lab06_pipeline_parallel) or from the reference solutions/06_pipeline_parallel/pipeline_parallel.cpp
// (bin/reference/lab06_pipeline_parallel). The loop around the step is common/include/scalelab/driver/train_loop.h.
// Lesson: labs/06_pipeline_parallel/README.md.
//
//   mpirun -np 2 build/bin/reference/lab06_pipeline_parallel --schedule 1f1b --micro-batches 4 --steps 50
//   mpirun -np 4 build/bin/reference/lab06_pipeline_parallel --schedule interleaved --chunks 2 --micro-batches 8
//          --uniform-compute-ms 20 --steps 5     (the bubble against its formula)
//   (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks than cores:
//    mpirun --oversubscribe --bind-to none; or scripts/run 06 ...)
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (log records)

#include <cstdio>  // defines: std::printf, std::snprintf
#include <memory>  // defines: std::unique_ptr
#include <string>
#include <vector>

#include "lab_parts.h"                  // defines: lab_parts (lab 02's loader, lab 01's throughput and MFU: references)
#include "pipeline_parallel.h"          // defines: lab06::make_layout, Stage, StageExchange, train_step, ... (YOU)
#include "scalelab/comm/comm.h"         // defines: Communicator
#include "scalelab/comm/host_values.h"  // defines: all_reduce_values (the summary per stage)
#include "scalelab/comm/rank_grid.h"    // defines: RankGrid (the pipeline and the embedding group)
#include "scalelab/core/threads.h"      // defines: set_num_threads
#include "scalelab/driver/driver.h"     // defines: driver::DistributedOptions, make_link, comm_stats, ... (common/)
#include "scalelab/driver/train_loop.h"  // defines: driver::TrainLoop, open_data (common/)
#include "scalelab/measure/metrics.h"    // defines: RunLogger
#include "scalelab/model/gpt2.h"         // defines: GPT2
#include "scalelab/model/optim.h"        // defines: Optimizer
#include "train_step.h"                  // defines: lab01::flops_per_token (lab 01's reference)

using namespace scalelab;

// The options labs 03-06 share and the pipeline's (scalelab/driver/driver.h).
struct Options : driver::DistributedOptions, driver::PipelineOptions {
  Options() { sample_tokens = 0; }  // a stage holds only some layers: no sample by default
};

static int run(const Options& o, Communicator& world) {
  const int rank = world.rank(), p = world.size();
  // ------------------------------------------------------------------------------------------------
  // Setup: the layout (checked on every rank before any message), the groups, data, the stage's chunks
  driver::check_train_options(o);
  const Device device = driver::device_from_option(o.device);
  const int threads = set_num_threads(o.threads);
  driver::set_links(world, o, driver::ClusterOptions{});  // every stage boundary crosses --link
  world.set_wait_timeout(o.wait_timeout_s);               // the groups split from world inherit both
  SL_CHECK_HINT(o.global_batch == 0 || o.global_batch == o.micro_batch * o.micro_batches,
                "a pipeline's global "
                "batch is --micro-batch x --micro-batches: leave --global-batch out",
                "--global-batch %d with "
                "--micro-batch %d x --micro-batches %d",
                o.global_batch, o.micro_batch, o.micro_batches);
  SL_CHECK_HINT(o.sample_tokens == 0 || p == 1, "a stage holds only some layers: use --sample-tokens 0",
                "--sample-tokens %d with %d stages", o.sample_tokens, p);
  GPTConfig cfg = GPTConfig::preset(o.model);
  const lab06::PipelineLayout layout = lab06::make_layout(cfg, p, rank, lab06::schedule_from_name(o.schedule),
                                                          o.micro_batches, o.chunks);  // throws everywhere alike
  RankGrid grid(world, /*tp=*/1, /*pp=*/p, /*dp=*/1);  // the pipeline group and the embedding group
  lab06::StageExchange exchange(grid.pp(), layout);
  // Every stage reads the same windows (the first uses the tokens, the last the targets).
  driver::RunData data = driver::open_data(o, lab_parts(), o.micro_batch, layout.m, /*dp_rank=*/0, /*dp_size=*/1);

  const PrecisionPolicy policy = driver::precision_policy(o);  // --precision, --activations
  const OptimizerConfig oc = driver::optimizer_config(o);
  std::vector<std::unique_ptr<GPT2>> models;  // this rank's chunks: the dense model's layers, sliced
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  std::vector<GPT2*> chunks;
  for (int c = 0; c < layout.v; ++c) {
    models.push_back(std::make_unique<GPT2>(data.cfg, lab06::chunk_shard(data.cfg, layout, c), policy, device, o.seed));
    optimizers.push_back(std::make_unique<Optimizer>(*models.back(), oc));
    chunks.push_back(models.back().get());
    driver::apply_recompute(o, *chunks.back());
  }
  lab06::Stage stage(chunks, layout);
  stage.set_uniform_compute(o.uniform_compute_ms / layout.v, 2 * o.uniform_compute_ms / layout.v);

  const Peak peak = driver::device_peak_all_ranks(device, policy, threads, world, o.calibration);
  const double flops_tok = lab01::flops_per_token(data.cfg, o.seq_len);  // the WHOLE model's FLOPs per token
  RunLogger log("lab06", driver::run_id_all_ranks(world, o.run_id), rank, o.log_dir);
  log.set_memory_device(device);
  const LinkModel& link = grid.pp().link_model();
  const int global_batch = o.micro_batch * layout.m;
  const double formula = lab06::bubble_formula(layout);
  std::string layers;
  for (GPT2* m : chunks) layers += (layers.empty() ? "" : ", ") + m->shard().str();
  nlohmann::json config = driver::run_config(o, policy, flops_tok);  // model, T, steps, lr, ... (driver.h)
  config.update({{"n_layer", data.cfg.n_layer},
                 {"n_embd", data.cfg.n_embd},
                 {"n_params", gpt2_num_params(data.cfg)},
                 {"micro_batch", o.micro_batch},
                 {"global_batch", global_batch},
                 {"micro_steps", layout.m},
                 {"pp", p},
                 {"schedule", o.schedule},
                 {"micro_batches", layout.m},
                 {"chunks", layout.v},
                 {"uniform_compute_ms", o.uniform_compute_ms},
                 {"bubble_formula", formula},
                 {"stage_layers", layers},
                 {"backend", world.backend()},
                 {"link", link.name},
                 {"link_slowdown", o.link_slowdown}});
  RunRecord run_rec = driver::make_run_record(config, SL_TRACK_NAME, p, threads, policy, device, peak);
  run_rec.extra["layout"] = grid.to_json();
  if (link.enabled()) run_rec.extra["simulated"] = true;
  log.log_run(run_rec);
  if (rank == 0) {
    std::printf(
        "lab06 | %s | %lld params | %d stages x %d chunk%s | %s, m = %d micro-batches | %d threads | link %s%s\n",
        data.cfg.str().c_str(), static_cast<long long>(gpt2_num_params(data.cfg)), p, layout.v,
        layout.v == 1 ? "" : "s", o.schedule.c_str(), layout.m, threads, link.name.c_str(),
        link.enabled() ? " (simulated)" : "");
    std::printf(
        "global batch %d = micro-batch %d x %d micro-batches | T=%d | %s | bubble formula %.3f | peak %.1f "
        "GFLOP/s per rank (%s)\nstage 0 holds %s\nlogs: %s (one file per rank)\n",
        global_batch, o.micro_batch, layout.m, o.seq_len, policy.name().c_str(), formula, peak.flops_per_s / 1e9,
        peak.source.c_str(), layers.c_str(), log.path().c_str());
  }

  // ------------------------------------------------------------------------------------------------
  // Training: the driver's loop around lab 06's step
  driver::TrainLoop loop(o, {"lab06", o.micro_batch, layout.m, global_batch}, &world, *chunks[0], data, log, peak,
                         flops_tok, device);
  loop.step = [&](std::vector<MicroBatch>& micro, float lr) {
    return lab06::train_step(stage, exchange, grid.embedding(), optimizers, micro, lr, o.grad_clip);  // YOUR step
  };
  loop.forward_loss = [&](const Tensor& x, const Tensor& y) { return lab06::forward_loss(stage, exchange, x, y); };
  loop.timeline_comm = &exchange.group();  // the timeline shows the activations crossing each stage boundary
  double start_ms = 0, bubble_sum = 0;
  int steps_seen = 0, overruns = 0;
  loop.before_step = [&](double, double, bool) {
    exchange.group().clear_events();
    exchange.gradient_channel().clear_events();
    stage.clear();
    world.barrier();  // every stage starts the step together: the idle time until its first action is bubble
    start_ms = Communicator::now_ms();
  };
  loop.after_step = [&](double, double, bool want_timeline) {
    world.barrier();  // ... and so is the time after its last action until the last stage is done
    const double now = Communicator::now_ms(), window_ms = now - start_ms;
    const driver::CommStats a = driver::comm_stats(exchange.group().events(), now);
    const driver::CommStats g = driver::comm_stats(exchange.gradient_channel().events(), now);
    driver::StepMeasure m;
    m.comm_ms = 0;  // exposed: the time this stage sat in a recv (or a send's wait) = its bubble + transfers
    for (Communicator* channel : {&exchange.group(), &exchange.gradient_channel()})
      for (const CommEvent& e : channel->events()) m.comm_ms += e.wait_ms;
    m.comm_busy_ms = a.busy_ms + g.busy_ms;
    m.comm_modeled_ms = a.modeled_ms + g.modeled_ms;
    m.simulated = a.simulated || g.simulated;
    const double bubble = 1.0 - stage.compute_ms() / window_ms;
    if (steps_seen++ > 0) bubble_sum += bubble;  // step 0 is the warm-up, not timed
    overruns += stage.overruns();
    m.extra = {{"bubble", bubble},
               {"bubble_formula", formula},
               {"uniform_overruns", stage.overruns()},
               {"compute_ms", stage.compute_ms()},
               {"pipeline_ms", window_ms},
               {"p2p_calls", a.calls + g.calls},
               {"p2p_payload_bytes", a.payload_bytes + g.payload_bytes},
               {"ran", lab06::to_string(stage.ran())}};
    if (want_timeline) {
      m.spans = stage.spans();
      m.spans.push_back({"step", start_ms, now});  // the notebook aligns the ranks on it
    }
    return m;
  };
  loop.progress = [](const driver::StepMeasure& m, double) {
    char s[96];
    std::snprintf(s, sizeof(s), "bubble %.3f (formula %.3f)", m.extra.value("bubble", 0.0),
                  m.extra.value("bubble_formula", 0.0));
    return std::string(s);
  };
  const driver::Summary s = loop.run();

  // ------------------------------------------------------------------------------------------------
  // Summary (every rank logs its own; rank 0 prints)
  nlohmann::json summary = driver::summary_record(s, peak, /*comm=*/true, /*simulated=*/link.enabled());
  summary.update({{"step_ms", s.step_ms},
                  {"bubble_formula", formula},
                  {"memory_peak_bytes", s.memory.total_peak_bytes},
                  {"memory_activations_peak_bytes", s.memory.peak_bytes[static_cast<int>(MemCategory::Activations)]}});
  const double bubble_mean = steps_seen > 1 ? bubble_sum / (steps_seen - 1) : 0.0;
  const int64_t act_peak = s.memory.peak_bytes[static_cast<int>(MemCategory::Activations)];
  summary.update({{"bubble", bubble_mean}, {"uniform_overruns", overruns}});
  log.log_summary(summary);
  // Every stage's bubble and activation peak, for rank 0 to print: one slot per stage, summed.
  std::vector<float> per_stage(3 * p, 0.0f);
  per_stage[3 * rank] = static_cast<float>(bubble_mean);
  per_stage[3 * rank + 1] = static_cast<float>(act_peak / 1048576.0);
  per_stage[3 * rank + 2] = static_cast<float>(overruns);
  per_stage = all_reduce_values(world, per_stage, ReduceOp::Sum, "summary per stage");
  if (rank == 0) {
    driver::print_summary_headline(s, peak, p);
    std::printf("\nstage 0 waited %.1f ms per step for messages (bubble and transfers)", s.comm_ms);
    if (link.enabled()) std::printf(", the simulated link charged %.1f ms", s.comm_modeled_ms);
    std::printf("\nbubble per stage (mean of the timed steps):");
    for (int t = 0; t < p; ++t) std::printf(" %.3f", per_stage[3 * t]);
    std::printf(" | formula %.3f\npeak activations per stage:", formula);
    for (int t = 0; t < p; ++t) std::printf(" %.1f", per_stage[3 * t + 1]);
    std::printf(" MiB | peak memory of stage 0: %.1f MiB\n", s.memory.total_peak_bytes / 1048576.0);
    int over = 0;
    for (int t = 0; t < p; ++t) over += static_cast<int>(per_stage[3 * t + 2]);
    if (over > 0)
      std::printf(
          "warning: %d forwards and backwards took longer than --uniform-compute-ms (the compute alone did): "
          "the bubble is then not the formula's; raise it, or use a smaller --micro-batch / --seq-len\n",
          over);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 06: pipeline-parallel GPT-2 on N ranks (mpirun -np N: N stages); loss, tokens/s, MFU, bubble"};
  Options o;
  driver::add_distributed_options(app, o, "lab06");
  driver::add_pipeline_options(app, o);
  driver::add_link_options(app, o);
  CLI11_PARSE(app, argc, argv);
  return driver::run_on_all_ranks(app, o, o.backend, [&](Communicator& comm) { return run(o, comm); });
}
