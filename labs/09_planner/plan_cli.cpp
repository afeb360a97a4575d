// plan_cli.cpp — lab 09's given code, one file compiled into both tracks (sl_add_lab's GIVEN in
// labs/CMakeLists.txt): the planner's command line (plan_main, planner.h), which lab 09's program and
// bin/sl_plan (tools/sl_plan.cpp, on the reference) run. Which layout for this model on this cluster: every
// tp x pp x dp split with its micro-batches, ZeRO stage, sequence parallelism and recompute, its memory per
// device and predicted step time; what does not fit counted with its reason; the rest ranked by predicted
// tokens/s. Also one given layout predicted term by term (--tp ... --json, what bench/plan_validate.py
// reads), the smallest cluster that trains N tokens in D days, a LoRA fine-tune, the context-parallel axis
// (--cp, --max-cp) and the longest sequence that fits with cp 1, 2, 4, 8 (--longest-seq). It calls the functions
// of its own track's planner.h: yours in labs/09_planner/planner.cpp, or the reference's.
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (--json)

#include <algorithm>  // defines: std::max, std::min
#include <cstdio>     // defines: std::printf
#include <map>        // defines: std::map
#include <string>
#include <vector>

#include "planner.h"                        // defines: lab09::plan, step_time, device_memory, ... (this track's)
#include "scalelab/comm/comm.h"             // defines: run_single_process
#include "scalelab/core/error.h"            // defines: scalelab::Error, SL_CHECK_HINT
#include "scalelab/driver/driver.h"         // defines: driver::make_link
#include "scalelab/driver/option_checks.h"  // defines: driver::positive_int, ... (every numeric option checked)
#include "scalelab/measure/calibration.h"   // defines: datasheet_peak

namespace scalelab::lab09 {
inline namespace SL_TRACK_LAB09 {

namespace {

const char* kExamples = R"(
The lesson's questions (labs/09_planner/README.md#the-faq-answered), the 7B model as --layers 32 --hidden 4096
--heads 32 --vocab 32000:
  bin/sl_plan --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq-len 2048 --global-batch 64 \
      --gpus 2 --gpu h100                  # does a 7B model train on two 80 GB cards?
  bin/sl_plan --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq-len 2048 --global-batch 8 \
      --gpus 1 --gpu rtx4090 --lora 16     # a LoRA fine-tune of it on one 24 GB card
  bin/sl_plan --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq-len 2048 --global-batch 512 \
      --gpu h100 --tokens 100e9 --days 7   # how many GPUs for 100B tokens in a week?
  bin/sl_plan --layers 80 --hidden 8192 --heads 64 --vocab 32000 --seq-len 2048 --global-batch 512 \
      --gpus 64 --gpu h100                 # 70B on 8 nodes: where do tp, pp and dp go?
  bin/sl_plan --model gpt2-1.5b --gpu h100 --attention flash --longest-seq \
      --max-seq-len 1048576                # the longest sequence one layout fits with cp 1, 2, 4, 8
  bin/sl_plan --model gpt2-1.5b --seq-len 131072 --global-batch 8 --gpus 8 --gpu h100 --attention flash \
      --max-cp 8                           # a long sequence: tp x pp x dp x cp, cp searched
  bin/sl_plan --model demo --gpu cpu --peak-tflops 0.024 --efficiency 1 --memory-gb 1 --seq-len 64 \
      --global-batch 16 --tp 1 --pp 2 --dp 1 --micro-batch 4 --json   # one layout, term by term
(--gpu cpu: give --peak-tflops from your calibration, bin/sl_calibrate, and --memory-gb.)
)";

// A known device: its datasheet peak (common's table), its memory and its links.
struct GpuPreset {
  const char* name;
  const char* datasheet;  // the name datasheet_peak knows
  double memory_gb;
  const char* intra;
};
const GpuPreset kGpus[] = {
    {"a100", "NVIDIA A100-SXM4-80GB", 80, "nvlink"},
    {"h100", "NVIDIA H100 80GB HBM3", 80, "nvlink"},
    {"h200", "NVIDIA H200", 141, "nvlink"},
    {"rtx4090", "NVIDIA GeForce RTX 4090", 24, "pcie"},
};

// A refusal's kind, for the count: its first line with every number written as #.
std::string reason_kind(const std::string& why) {
  std::string k;
  for (size_t i = 0; i < why.size() && why[i] != '\n'; ++i) {
    const bool digit = why[i] >= '0' && why[i] <= '9';
    if (!digit) {
      if (why[i] != '.' || k.empty() || k.back() != '#') k += why[i];
    } else if (k.empty() || k.back() != '#') {
      k += '#';
    }
  }
  return k;
}

nlohmann::json to_json(const lab09::Candidate& r) {
  const lab09::StepTime& t = r.time;
  const lab09::DeviceMemory& m = r.memory;
  const lab09::Layout& x = r.layout;
  return {{"layout", lab09::to_string(x)},
          {"fits", r.fits},
          {"why_not", r.why_not},
          {"tp", x.tp},
          {"pp", x.pp},
          {"dp", x.dp},
          {"micro_batch", x.micro_batch},
          {"micro_batches", x.micro_batches},
          {"zero_stage", x.zero_stage},
          {"sequence_parallel", x.sequence_parallel},
          {"recompute", recompute_name(x.recompute)},
          {"cp", x.cp},
          {"memory",
           {{"stage", m.stage},
            {"sets", m.sets},
            {"params_bytes", m.state.params},
            {"grads_bytes", m.state.grads},
            {"optimizer_state_bytes", m.state.optimizer_state},
            {"activations_bytes", m.activations},
            {"total_bytes", m.total()}}},
          {"time",
           {{"slowest_stage", t.slowest_stage},
            {"compute_ms", t.compute_ms},
            {"tp_ms", t.tp_ms},
            {"pp_ms", t.pp_ms},
            {"slot_ms", t.slot_ms},
            {"pipeline_ms", t.pipeline_ms},
            {"bubble_ms", t.bubble_ms},
            {"dp_ms", t.dp_ms},
            {"cp_ms", t.cp_ms},
            {"optimizer_ms", t.optimizer_ms},
            {"step_ms", t.step_ms},
            {"tokens_per_s", t.tokens_per_s},
            {"mfu", t.mfu},
            {"hfu", t.hfu}}}};
}

// plan_with_cp() (plan() when max_cp is 1) with w.offload_optimizer's step times (with_offload; its memory is already
// device_memory's): the fitting rows re-ranked by the new tokens/s (rank_candidates, the plan's order), the rest after.
std::vector<lab09::Candidate> offloaded_plan(const GPTConfig& cfg, const lab09::Workload& w, const lab09::Cluster& c,
                                            int max_cp) {
  std::vector<lab09::Candidate> rows = lab09::plan_with_cp(cfg, w, c, max_cp);
  if (!w.offload_optimizer) return rows;
  for (lab09::Candidate& r : rows)
    if (r.fits) r.time = lab09::with_offload(r.time, cfg, r.layout, w, c);
  lab09::rank_candidates(rows);
  return rows;
}

}  // namespace

int plan_main(int argc, char** argv) {
  CLI::App app{"Choose a layout: memory per device and predicted step time of every tp x pp x dp split"};
  app.footer(kExamples);
  std::string model, gpu = "h100", precision = "bf16", optimizer = "adamw", intra, inter = "infiniband";
  std::string recompute = "none", schedule = "1f1b", offload = "none";
  bool largest_model = false;
  int layers = 0, hidden = 0, heads = 0, vocab = 256, top = 10, max_gpus = 4096;
  double memory_gb = 0, peak_tflops = 0, efficiency = 0.5, tokens = 0, days = 0, bandwidth_gbs = 0, slowdown = 1;
  double intra_gbs = 0, inter_gbs = 0;
  lab09::Cluster cluster;
  lab09::Workload w;
  lab09::Layout one;
  bool json = false, sp = false, per_op = false, longest_seq = false;
  std::string attention = "materialized";
  int max_cp = 1, max_seq_len = 1 << 20;
  std::string reduce_dtype;                                  // "" : the --precision's
  std::string activations = "fp32";                          // --activations: the policy's activation_dtype
  double eff_matmul = 0, eff_attention = 0, eff_memory = 0;  // --per-op: the --gpu preset's unless given
  app.add_option("--model", model,
                 "preset: tiny, demo, d12, d24, d36, d48, gpt2-124m, gpt2-350m, gpt2-1.5b, gpt-7b, gpt-70b (or "
                 "--layers --hidden --heads)");
  app.add_option("--layers", layers, "L, with --hidden and --heads: a model of your own")
      ->check(driver::positive_int());
  app.add_option("--hidden", hidden, "C (n_embd)")->check(driver::positive_int());
  app.add_option("--heads", heads, "NH")->check(driver::positive_int());
  app.add_option("--vocab", vocab, "V (with --layers)")->capture_default_str()->check(driver::positive_int());
  app.add_option("--seq-len", w.seq_len, "T: tokens per sequence")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--global-batch", w.global_batch, "sequences per optimizer step, all replicas")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--gpu", gpu, "a100 | h100 | h200 | rtx4090 (datasheet peak, memory, link) | cpu (give the rest)")
      ->capture_default_str();
  app.add_option("--gpus", cluster.devices, "devices in the cluster (every layout uses all of them)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--gpus-per-node", cluster.devices_per_node, "devices per node")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--memory-gb", memory_gb, "memory per device, GB (1e9 bytes); default: the --gpu's")
      ->check(driver::finite_non_negative());
  app.add_option("--peak-tflops", peak_tflops, "dense peak per device, TFLOP/s; default: the --gpu's datasheet")
      ->check(driver::finite_non_negative());
  app.add_option("--efficiency", efficiency, "the fraction of the peak the model's FLOPs run at")
      ->capture_default_str()
      ->check(driver::finite_in_range(0, 1, /*min_excluded=*/true));
  app.add_option("--memory-bandwidth-gbs", bandwidth_gbs, "GB/s for the optimizer's pass (0: not modelled)")
      ->check(driver::finite_non_negative());
  app.add_option("--intra", intra, "link inside a node: nvlink, pcie, infiniband, ethernet100 (default: the --gpu's)");
  app.add_option("--inter", inter, "link across nodes")->capture_default_str();
  app.add_option("--intra-gbs", intra_gbs, "the intra-node link's bus bandwidth, GB/s (default: its preset's)")
      ->check(driver::finite_non_negative());
  app.add_option("--inter-gbs", inter_gbs, "the inter-node link's bus bandwidth, GB/s (default: its preset's)")
      ->check(driver::finite_non_negative());
  app.add_option("--activation-bytes", w.activation_bytes,
                 "bytes of an activation on the wire: 4 (this kit, fp32), 2 (16-bit frameworks)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_option("--link-slowdown", slowdown, "both links this many times slower (as the lab programs' option)")
      ->capture_default_str()
      ->check(driver::finite_positive());
  app.add_option("--uniform-compute-ms", w.uniform_compute_ms,
                 "a simulated device: every stage's forward of a micro-batch takes this long, its backward twice")
      ->check(driver::finite_non_negative());
  app.add_option("--precision", precision, "fp32 | bf16 (bf16 params, fp32 grads and master)")->capture_default_str();
  app.add_option("--activations", activations,
                 "fp32 | bf16: the dtype of the activations each block keeps for its backward (bf16: 16-bit, as "
                 "Megatron-LM and torchtitan keep them; the lab drivers' --activations)")
      ->capture_default_str();
  app.add_option("--reduce-dtype", reduce_dtype,
                 "fp32 | bf16: the gradients on the data-parallel wire (default: the --precision's; a 16-bit "
                 "framework's fp16 run, Megatron-LM's default, reduces them in 16 bits)");
  app.add_option("--optimizer", optimizer, "adamw | sgd")->capture_default_str();
  app.add_option("--lora", w.lora_rank, "a LoRA fine-tune with adapters of this rank (0: full training)")
      ->check(driver::non_negative_int());
  app.add_option("--offload", offload,
                 "none | optimizer: lab 04 part 3's offload, the optimizer state and update on the host")
      ->capture_default_str();
  app.add_flag("--largest-model", largest_model,
               "the largest preset (gpt2-124m .. gpt-70b) the cluster can train, without and with --offload "
               "optimizer, and the step each costs");
  app.add_flag("--overlap-dp", w.overlap_dp, "dp's communication overlaps the backward (lab 03's overlap)");
  app.add_flag("--pp-scatter-gather", w.pp_scatter_gather,
               "pp with tp > 1: each tp rank sends 1/tp of the boundary activation, all-gathered over tp where it "
               "arrives (Megatron-LM's default; Narayanan et al. 2021, Sec. 4.1)");
  app.add_option("--top", top, "rows of the ranking to print")->capture_default_str()->check(driver::positive_int());
  app.add_option("--tokens", tokens, "with --days: the smallest power-of-two cluster that trains this many tokens")
      ->check(driver::finite_positive());
  app.add_option("--days", days, "in this many days (with --tokens)")->check(driver::finite_positive());
  app.add_option("--max-gpus", max_gpus, "the largest cluster --tokens/--days tries")
      ->capture_default_str()
      ->check(driver::positive_int());
  auto* tp_opt =
      app.add_option("--tp", one.tp, "with --pp and --dp: predict this one layout")->check(driver::positive_int());
  app.add_option("--pp", one.pp, "pipeline stages of --tp's layout")->check(driver::positive_int());
  app.add_option("--dp", one.dp, "data-parallel replicas of --tp's layout")->check(driver::positive_int());
  app.add_option("--micro-batch", one.micro_batch, "B of --tp's layout")->check(driver::positive_int());
  app.add_option("--micro-batches", one.micro_batches, "m of --tp's layout")->check(driver::positive_int());
  app.add_option("--schedule", schedule, "1f1b | gpipe | interleaved, of --tp's layout")->capture_default_str();
  app.add_option("--chunks", one.chunks, "v of --tp's layout (interleaved)")->check(driver::positive_int());
  app.add_option("--zero", one.zero_stage, "ZeRO stage of --tp's layout")->check(driver::int_in_range(0, 3));
  app.add_flag("--sp", sp, "sequence parallelism in --tp's layout");
  app.add_option("--recompute", recompute, "none | selective | full, of --tp's layout")->capture_default_str();
  app.add_flag("--per-op", per_op,
               "with --tp: price compute op by op as the simulated --gpu charges it (--device sim), "
               "not at --peak-tflops x --efficiency (docs/labs/09_planner.md, per-op pricing)");
  app.add_option("--eff-matmul", eff_matmul, "with --per-op: the matmuls' share of the peak (default: the --gpu's)")
      ->check(driver::finite_in_range(0, 1));
  app.add_option("--eff-attention", eff_attention,
                 "with --per-op: attention's share of the peak (default: the --gpu's)")
      ->check(driver::finite_in_range(0, 1));
  app.add_option("--eff-memory", eff_memory, "with --per-op: the share of HBM bandwidth reached (default: the --gpu's)")
      ->check(driver::finite_in_range(0, 1));
  app.add_flag(
      "--no-clip", [&](int64_t) { w.grad_clipped = false; },
      "with --per-op: the clipping's scale does not run (--grad-clip 0, or a --timing-only run: its norm "
      "reads 0)");
  app.add_option("--attention", attention, "materialized (the T x T scores) | flash; context parallelism needs flash")
      ->capture_default_str()
      ->check(CLI::IsMember({"materialized", "flash"}));
  app.add_option("--cp", one.cp, "context-parallel ranks of --tp's layout (lab 10's zig-zag ring)")
      ->check(driver::positive_int());
  app.add_option("--max-cp", max_cp, "the ranking also tries cp = 2, 4, ... up to this (needs --attention flash)")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_flag("--longest-seq", longest_seq,
               "the longest T one layout (--tp --pp --micro-batch --recompute --zero; dp 1, m 1) fits into "
               "--memory-gb, with cp 1, 2, 4 and 8");
  app.add_option("--max-seq-len", max_seq_len, "the longest T --longest-seq tries")
      ->capture_default_str()
      ->check(driver::positive_int());
  app.add_flag("--json", json, "print --tp's layout, or the ranking's --top rows, as one JSON object");
  CLI11_PARSE(app, argc, argv);
  driver::require_checked_options(app);  // a numeric option without a range check: a programming error

  return run_single_process(
      [&]() -> int {
        GPTConfig cfg;
        if (!model.empty()) {
          cfg = GPTConfig::preset(model);
        } else if (largest_model) {
          cfg = GPTConfig::preset("gpt2-124m");  // --largest-model tries the presets itself
        } else {
          SL_CHECK_HINT(layers > 0 && hidden > 0 && heads > 0,
                        "e.g. --model d24, or --layers 32 --hidden 4096 --heads 32",
                        "give --model NAME, or --layers, --hidden and --heads (got %d, %d, %d)", layers, hidden, heads);
          cfg.n_layer = layers;
          cfg.n_embd = hidden;
          cfg.n_head = heads;
          cfg.vocab_size = vocab;
        }
        cfg.max_seq_len = std::max(cfg.max_seq_len, w.seq_len);
        cfg.validate();
        // The cluster: a known GPU's figures unless given, or a CPU whose figures are all given.
        if (gpu != "cpu") {
          const GpuPreset* g = nullptr;
          for (const GpuPreset& p : kGpus)
            if (gpu == p.name) g = &p;
          SL_CHECK_HINT(g != nullptr, "--gpu a100, h100, h200, rtx4090, or cpu with --peak-tflops and --memory-gb",
                        "unknown --gpu '%s'", gpu.c_str());
          if (peak_tflops == 0) peak_tflops = datasheet_peak(g->datasheet)->bf16_flops_per_s / 1e12;
          if (memory_gb == 0) memory_gb = g->memory_gb;
          if (intra.empty()) intra = g->intra;
        } else {
          if (intra.empty()) intra = "none";
        }
        SL_CHECK_HINT(peak_tflops > 0 && efficiency > 0 && efficiency <= 1,
                      gpu == "cpu" ? "a CPU's peak is its sgemm calibration: bin/sl_calibrate --threads 1 prints it in "
                                     "GFLOP/s (e.g. 24.4 GFLOP/s: --peak-tflops 0.0244 --efficiency 1)"
                                   : "e.g. --peak-tflops 989 --efficiency 0.5",
                      "--peak-tflops %g and --efficiency %g: the peak is > 0, the efficiency in (0, 1]", peak_tflops,
                      efficiency);
        SL_CHECK_HINT(memory_gb > 0,
                      gpu == "cpu" ? "e.g. --memory-gb 1 (a CPU rank's memory is what you allow it)"
                                   : "e.g. --memory-gb 80",
                      "--memory-gb %g", memory_gb);
        cluster.memory_bytes = memory_gb * 1e9;
        cluster.peak_flops_per_s = peak_tflops * 1e12;
        cluster.efficiency = efficiency;
        cluster.memory_bandwidth_bytes_per_s = bandwidth_gbs * 1e9;
        cluster.intra = driver::make_link(intra, slowdown);
        cluster.inter = driver::make_link(inter, slowdown);
        if (intra_gbs > 0) cluster.intra.bandwidth_bytes_per_s = intra_gbs * 1e9 / slowdown;
        if (inter_gbs > 0) cluster.inter.bandwidth_bytes_per_s = inter_gbs * 1e9 / slowdown;
        w.policy = PrecisionPolicy::from_name(precision);
        w.policy.activation_dtype = PrecisionPolicy::activation_dtype_from_name(activations);
        if (!reduce_dtype.empty()) {
          SL_CHECK_HINT(reduce_dtype == "fp32" || reduce_dtype == "bf16", "--reduce-dtype fp32 or bf16",
                        "unknown --reduce-dtype '%s'", reduce_dtype.c_str());
          w.policy.reduce_dtype = reduce_dtype == "bf16" ? DType::BF16 : DType::F32;
        }
        w.optimizer = OptimizerConfig::kind_from_name(optimizer);
        SL_CHECK_HINT(offload == "none" || offload == "optimizer", "--offload none or optimizer",
                      "unknown --offload '%s'", offload.c_str());
        w.offload_optimizer = offload == "optimizer";
        w.attention = attention == "flash" ? AttentionImpl::Flash : AttentionImpl::Materialized;
        SL_CHECK_HINT(max_cp == 1 || w.attention == AttentionImpl::Flash,
                      "context parallelism runs the flash attention (lab 10): add --attention flash",
                      "--max-cp %d with --attention %s", max_cp, attention.c_str());

        if (longest_seq) {  // the longest T of one layout, cp 1, 2, 4, 8 (docs/context_parallel.md)
          SL_CHECK_HINT(!*tp_opt || (one.dp == 1 && one.cp == 1),
                        "--longest-seq tries cp 1, 2, 4, 8 itself, with dp 1: leave out --dp and --cp",
                        "--longest-seq with --dp %d --cp %d", one.dp, one.cp);
          if (!*tp_opt) one.tp = 1;
          one.schedule = lab06::schedule_from_name(schedule);
          one.recompute = recompute_from_name(recompute);
          one.micro_batches = 1;
          w.global_batch = one.micro_batch;
          std::printf("model %s | one device: %.1f GB, %.4g TFLOP/s x %.2f | %s, B %d, %s attention\n",
                      cfg.str().c_str(), cluster.memory_bytes / 1e9, peak_tflops, efficiency, w.policy.name().c_str(),
                      one.micro_batch, attention.c_str());
          std::printf("%4s %12s %10s %14s %12s %12s\n", "cp", "longest T", "GB/dev", "activations GB", "step ms",
                      "tokens/s");
          for (int cp : {1, 2, 4, 8}) {
            lab09::Layout x = one;
            x.cp = cp;
            lab09::Cluster c = cluster;
            c.devices = x.devices();
            c.devices_per_node = std::max(cluster.devices_per_node, x.tp * x.cp);  // the layout in one node
            const lab09::LongestSequence l = lab09::longest_sequence(cfg, x, w, c, max_seq_len);
            if (l.seq_len == 0) {
              std::printf("%4d %12s\n", cp, "none fits");
              continue;
            }
            GPTConfig grown = cfg;
            grown.max_seq_len = l.seq_len;
            lab09::Workload wt = w;
            wt.seq_len = l.seq_len;
            const lab09::StepTime t = lab09::cp_step_time(grown, x, wt, c);
            std::printf("%4d %12d %10.2f %14.2f %12.4g %12.4g%s\n", cp, l.seq_len, l.memory.total() / 1e9,
                        l.memory.activations / 1e9, t.step_ms, t.tokens_per_s,
                        l.seq_len + 2 * cp > max_seq_len ? "  (--max-seq-len)" : "");
          }
          return 0;
        }

        // The options of one layout mean nothing without --tp: say so rather than ignore them.
        for (const char* opt : {"--pp", "--dp", "--micro-batch", "--micro-batches", "--schedule", "--chunks", "--zero",
                                "--sp", "--recompute", "--cp"})
          SL_CHECK_HINT(*tp_opt || app.count(opt) == 0,
                        "give --tp, --pp and --dp with it to predict that one layout, "
                        "or leave the layout's options out to rank every layout",
                        "%s without --tp", opt);
        SL_CHECK_HINT(!per_op || (*tp_opt && gpu != "cpu"),
                      "give --per-op with one layout (--tp, --pp, --dp) on a simulated GPU (--gpu h100, ...)",
                      "--per-op prices one layout on a --gpu preset (got %s, --gpu %s)",
                      *tp_opt ? "a layout" : "no --tp", gpu.c_str());
        for (const char* opt : {"--eff-matmul", "--eff-attention", "--eff-memory", "--no-clip"})
          SL_CHECK_HINT(per_op || app.count(opt) == 0,
                        "the per-op efficiencies change the simulated GPU's pricing: give --per-op with them "
                        "(without it, --efficiency scales the FLOP/s)",
                        "%s without --per-op", opt);
        if (*tp_opt) {                                                    // one layout, term by term
          if (app.count("--gpus") == 0) cluster.devices = one.devices();  // the cluster is the layout's unless given
          if (app.count("--micro-batches") == 0 && one.dp * one.micro_batch > 0)
            one.micro_batches = std::max(1, w.global_batch / (one.dp * one.micro_batch));  // the rest of the batch
          one.schedule = lab06::schedule_from_name(schedule);
          one.sequence_parallel = sp;
          one.recompute = recompute_from_name(recompute);
          lab09::check_layout(cfg, one, w, cluster);
          SL_CHECK_HINT(!per_op || one.cp == 1, "--per-op prices cp 1 only: leave out --cp", "--per-op with --cp %d",
                        one.cp);
          lab09::Candidate r;
          r.layout = one;
          r.memory = lab09::device_memory(cfg, one, w);
          GpuModel device = GpuModel::preset(gpu == "cpu" ? "h100" : gpu);  // priced only with --per-op
          if (eff_matmul > 0) device.eff_matmul = eff_matmul;
          if (eff_attention > 0) device.eff_attention = eff_attention;
          if (eff_memory > 0) device.eff_memory = eff_memory;
          r.time = lab09::with_offload(per_op ? lab09::per_op_step_time(cfg, one, w, cluster, device)
                                              : lab09::cp_step_time(cfg, one, w, cluster),
                                       cfg, one, w, cluster);
          r.why_not = lab09::memory_refusal(r.memory, cluster);
          r.fits = r.why_not.empty();
          if (json) {
            std::printf("%s\n", to_json(r).dump().c_str());
          } else {
            std::printf("model %s | %s\n%s\n", cfg.str().c_str(), lab09::to_string(cluster).c_str(),
                        lab09::explain(r, cluster).c_str());
            if (!r.fits) std::printf("=> does not fit: %s\n", r.why_not.c_str());
          }
          return r.fits ? 0 : 1;
        }

        if (!json)
          std::printf("model %s, %.4g parameters | T %d, global batch %d sequences | %s + %s%s\n", cfg.str().c_str(),
                      static_cast<double>(gpt2_num_params(cfg)), w.seq_len, w.global_batch, w.policy.name().c_str(),
                      optimizer.c_str(), w.lora_rank > 0 ? (", LoRA rank " + std::to_string(w.lora_rank)).c_str() : "");
        if (!json)
          std::printf(
              "activations are this kit's (fp32, llm.c's tensor set: docs/memory.md); compute at %.4g TFLOP/s "
              "a device (%.4g x %.2f)\n",
              cluster.flops_per_s() / 1e12, peak_tflops, efficiency);

        if (largest_model) {  // the largest preset that fits, without and with offload, and its best step
          std::printf("the largest model %d device(s) of %.4g GB can train (T %d, global batch %d, %s + %s):\n",
                      cluster.devices, cluster.memory_bytes / 1e9, w.seq_len, w.global_batch,
                      w.policy.name().c_str(), optimizer.c_str());
          int found = 0;
          for (const bool off : {false, true}) {
            lab09::Workload wo = w;
            wo.offload_optimizer = off;
            std::string best_name;
            lab09::Candidate best;
            for (const char* name : {"gpt2-124m", "gpt2-350m", "gpt2-1.5b", "gpt-7b", "gpt-70b"}) {
              GPTConfig pc = GPTConfig::preset(name);
              pc.max_seq_len = std::max(pc.max_seq_len, wo.seq_len);
              const std::vector<lab09::Candidate> prows = offloaded_plan(pc, wo, cluster, 1);
              if (prows.empty() || !prows.front().fits) break;  // the presets grow: a larger one fits no better
              best_name = name;
              best = prows.front();
            }
            if (best_name.empty()) {
              std::printf("  offload %-9s: not even gpt2-124m fits\n", off ? "optimizer" : "none");
              continue;
            }
            ++found;
            std::printf("  offload %-9s: %s (%.4g parameters), %.2f GB a device, step %.4g ms (of it %.4g ms "
                        "optimizer%s), %.4g tokens/s\n      %s\n",
                        off ? "optimizer" : "none", best_name.c_str(),
                        static_cast<double>(gpt2_num_params(GPTConfig::preset(best_name))), best.memory.total() / 1e9,
                        best.time.step_ms, best.time.optimizer_ms, off ? ": copies and the host's AdamW" : "",
                        best.time.tokens_per_s, lab09::to_string(best.layout).c_str());
          }
          std::printf("(predicted, the planner's model: the host's AdamW at %.4g GB/s, the host link at %.4g GB/s "
                      "each way; activations are this kit's fp32 ones)\n",
                      cluster.host_memory_bytes_per_s / 1e9, cluster.host_link_bytes_per_s / 1e9);
          return found > 0 ? 0 : 1;
        }

        if (tokens > 0 || days > 0) {  // the smallest power-of-two cluster that finishes in time
          SL_CHECK_HINT(tokens > 0 && days > 0, "give both, e.g. --tokens 10e9 --days 1", "--tokens %g --days %g",
                        tokens, days);
          for (int n = 1; n <= max_gpus; n *= 2) {
            lab09::Cluster c = cluster;
            c.devices = n;
            c.devices_per_node = std::min(cluster.devices_per_node, n);
            const std::vector<lab09::Candidate> rows = lab09::plan(cfg, w, c);
            if (rows.empty() || !rows.front().fits) {
              std::printf("%5d GPUs: no layout fits\n", n);
              continue;
            }
            const double need_days = tokens / rows.front().time.tokens_per_s / 86400.0;
            std::printf("%5d GPUs: %.3g days   %s\n", n, need_days, lab09::explain(rows.front(), c).c_str());
            if (need_days <= days) {
              std::printf(
                  "\n=> %d GPUs train %.3g tokens in %.3g days (predicted; data loading and host overheads "
                  "are not in the model)\n",
                  n, tokens, need_days);
              return 0;
            }
          }
          std::printf("\n=> no cluster of up to %d GPUs trains %.3g tokens in %.3g days\n", max_gpus, tokens, days);
          return 1;
        }

        const std::vector<lab09::Candidate> rows = offloaded_plan(cfg, w, cluster, max_cp);
        if (json) {  // the ranking for a script or a notebook: the top rows that fit, and the refusals by reason
          nlohmann::json out = {{"model", cfg.str()},
                                {"cluster", lab09::to_string(cluster)},
                                {"candidates", rows.size()},
                                {"rows", nlohmann::json::array()},
                                {"refused", nlohmann::json::object()}};
          for (const lab09::Candidate& r : rows) {
            if (r.fits && static_cast<int>(out["rows"].size()) < top) out["rows"].push_back(to_json(r));
            if (!r.fits) out["refused"][reason_kind(r.why_not)] = out["refused"].value(reason_kind(r.why_not), 0) + 1;
          }
          if (!rows.empty() && rows.front().fits) out["explained"] = lab09::explain(rows.front(), cluster);
          std::printf("%s\n", out.dump().c_str());
          return rows.empty() || !rows.front().fits ? 1 : 0;
        }
        std::printf("cluster: %s: %zu candidate layouts\n\n", lab09::to_string(cluster).c_str(), rows.size());
        std::printf("%4s %4s %4s %4s %4s %4s %4s %3s %-9s | %8s %9s %8s %6s %11s %6s\n", "tp", "pp", "dp", "cp", "B",
                    "m", "zero", "sp", "recompute", "GB/dev", "step ms", "bubble%", "dp%", "tokens/s", "MFU%");
        int fit = 0;
        std::map<std::string, std::pair<int, std::string>> refused;  // kind: how many, the first one in full
        for (const lab09::Candidate& r : rows) {
          if (!r.fits) {
            auto& [n, first] = refused[reason_kind(r.why_not)];
            if (n++ == 0) first = lab09::to_string(r.layout) + ": " + r.why_not;
            continue;
          }
          if (fit++ >= top) continue;
          const lab09::Layout& x = r.layout;
          std::printf("%4d %4d %4d %4d %4d %4d %4d %3s %-9s | %8.2f %9.4g %8.1f %6.1f %11.4g %6.1f\n", x.tp, x.pp, x.dp,
                      x.cp, x.micro_batch, x.micro_batches, x.zero_stage, x.sequence_parallel ? "yes" : "",
                      recompute_name(x.recompute), r.memory.total() / 1e9, r.time.step_ms,
                      100.0 * r.time.bubble_ms / r.time.step_ms, 100.0 * r.time.dp_ms / r.time.step_ms,
                      r.time.tokens_per_s, 100.0 * r.time.mfu);
        }
        std::printf("\n%d layouts fit, %zu do not:\n", fit, rows.size() - fit);
        for (const auto& [why, seen] : refused)
          std::printf("  %6d  %s\n          e.g. %s\n", seen.first, why.c_str(), seen.second.c_str());
        if (fit == 0) {
          std::printf("\n=> no layout fits: more devices, more memory a device, a smaller global batch or T\n");
          return 1;
        }
        std::printf("\n=> %s\n", lab09::explain(rows.front(), cluster).c_str());
        return 0;
      },
      /*error_exit=*/2);
}

}  // namespace SL_TRACK_LAB09
}  // namespace scalelab::lab09
