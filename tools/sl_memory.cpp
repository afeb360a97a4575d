// sl_memory.cpp — bin/sl_memory: per-rank memory of data-parallel training with ZeRO stages 0..3
// (Rajbhandari et al. 2019), for this kit's GPT-2 exactly as lab 04 lays it out, or at paper level for
// any parameter count, and the FAQ "how many devices of X GB do I need?".
// Library: common/src/measure/memory_estimator.cpp. Tests: tests/common/measure/test_memory_estimator.cpp. Doc: docs/memory.md
//
//   bin/sl_memory --model d24 --ranks 1,2,4,8 --precision bf16 --micro-batch 4 --seq-len 1024 --prefetch 1
//   bin/sl_memory --psi 7.5e9 --ranks 64 --paper      # the paper's Fig. 1 numbers: 120 / 31.4 / 16.6 / 1.9 GB
//   bin/sl_memory --psi 7e9 --device-gb 80 --precision bf16   # devices needed per stage
#include <CLI/CLI.hpp>  // defines: CLI::App (command line)

#include <cstdio>
#include <string>
#include <vector>

#include "scalelab/core/error.h"                // defines: scalelab::Error, SL_CHECK_HINT
#include "scalelab/model/gpt2.h"                // defines: GPTConfig::preset
#include "scalelab/measure/memory_estimator.h"  // defines: format_memory_table, format_zero_table, format_fit_table
#include "scalelab/model/optim.h"               // defines: OptimizerConfig::kind_from_name
#include "scalelab/core/precision.h"            // defines: PrecisionPolicy::from_name
#include "scalelab/core/sim_gpu.h"              // defines: GpuModel (the h100 preset's host link)
#include "scalelab/driver/option_checks.h"      // defines: positive_int, finite_positive, ..., require_checked_options

int main(int argc, char** argv) {
  using namespace scalelab::driver;  // the option checks
  CLI::App app{"Per-rank memory of ZeRO stages 0..3 (params, grads, optimizer state, activations)"};
  std::string model, precision = "bf16", optimizer = "adamw", activations = "fp32";
  double psi = 0.0, device_gb = 0.0;
  std::vector<int> ranks{1, 2, 4, 8};
  int stage = -1, micro_batch = 4, seq_len = -1, prefetch = 1, max_ranks = 1024;
  bool paper = false, exact_bytes = false, offload_fit = false;
  app.add_option("--model", model,
                 "preset: tiny, demo, d12, d24, d36, d48, gpt2-124m, gpt2-350m, gpt2-1.5b, gpt-7b, gpt-70b (exact "
                 "per-rank estimate)");
  app.add_option("--psi", psi, "parameter count for the paper-level formula, e.g. 7.5e9")->check(finite_positive());
  app.add_option("--ranks", ranks, "data-parallel world sizes, comma separated")->delimiter(',')->check(positive_int());
  app.add_option("--stage", stage, "only this ZeRO stage 0..3 (default: all)")->check(int_in_range(0, 3));
  app.add_option("--precision", precision, "fp32 | bf16 (bf16 params, fp32 master and grads)");
  app.add_option("--optimizer", optimizer, "adamw | sgd");
  app.add_option("--activations", activations,
                 "fp32 | bf16: the dtype of the activations each block keeps for its backward, as the lab programs' "
                 "--activations (with --model)");
  app.add_flag("--paper", paper, "the ZeRO paper's policy: 16-bit params AND grads, K = 12 (fp32 master, m, v)");
  app.add_flag("--bytes", exact_bytes, "print exact bytes (compare with the logs' memory_<category>_bytes)");
  app.add_option("--micro-batch", micro_batch, "B of the activations per rank (with --model; 0: model state only)")
      ->check(non_negative_int());
  app.add_option("--seq-len", seq_len, "T of the activations (with --model; default the model's max_seq_len)")
      ->check(positive_int());
  app.add_option("--prefetch", prefetch, "ZeRO-3 all-gathers in flight beyond the unit in use")
      ->check(non_negative_int());
  app.add_option("--device-gb", device_gb, "device memory in GB (1e9 bytes): print the devices needed per stage")
      ->check(finite_non_negative());
  app.add_option("--max-ranks", max_ranks, "largest world size the device search tries (power of two)")
      ->check(positive_int());
  app.add_flag("--offload-fit", offload_fit,
               "with --device-gb: the largest model whose state fits ONE device, with and without lab 04's "
               "--offload optimizer, and the host link bytes and seconds a step costs (PCIe 5.0 x16, h100 preset)");
  require_checked_options(app);  // a numeric option without a range check: a programming error
  CLI11_PARSE(app, argc, argv);

  try {
    SL_CHECK_HINT(offload_fit || model.empty() != (psi <= 0.0),
                  "e.g. --model d24, or --psi 7.5e9 for the paper-level formula",
                  "give exactly one of --model NAME and --psi N (got model='%s', psi=%g)", model.c_str(), psi);
    for (int N : ranks)
      SL_CHECK_HINT(N > 0, "world sizes are 1 or more, e.g. --ranks 1,2,4,8", "--ranks has %d <= 0", N);
    SL_CHECK_HINT(!ranks.empty(), "e.g. --ranks 1,2,4,8", "--ranks is empty");
    SL_CHECK_HINT(stage >= -1 && stage <= 3, "ZeRO stages are 0 (DDP), 1 (P_os), 2 (P_os+g), 3 (P_os+g+p)",
                  "--stage %d is not in 0..3", stage);
    SL_CHECK_HINT(prefetch >= 0, "--prefetch 0 gathers one unit at a time; 1 overlaps the next gather",
                  "--prefetch %d < 0", prefetch);
    SL_CHECK_HINT(micro_batch >= 0, "e.g. --micro-batch 4 (0 = model state only)", "--micro-batch %d < 0", micro_batch);
    SL_CHECK_HINT(device_gb >= 0.0, "e.g. --device-gb 80 for an 80 GB H100", "--device-gb %g < 0", device_gb);
    SL_CHECK_HINT(max_ranks >= 1, "e.g. --max-ranks 1024", "--max-ranks %d < 1", max_ranks);
    const std::vector<int> stages = stage >= 0 ? std::vector<int>{stage} : std::vector<int>{0, 1, 2, 3};
    const scalelab::OptimizerConfig::Kind opt = scalelab::OptimizerConfig::kind_from_name(optimizer);
    scalelab::PrecisionPolicy policy = paper ? scalelab::zero_paper_policy()
                                             : scalelab::PrecisionPolicy::from_name(precision);
    policy.activation_dtype = scalelab::PrecisionPolicy::activation_dtype_from_name(activations);
    SL_CHECK_HINT(policy.activation_dtype == scalelab::DType::F32 || (!model.empty() && !offload_fit),
                  "activations are counted only for a model's table: add --model NAME (and --micro-batch B)",
                  "--activations %s without --model", activations.c_str());
    const double device_bytes = device_gb * 1e9;

    if (offload_fit) {  // ZeRO-Offload (Ren et al. 2021): model state per parameter on one device, with and without
      SL_CHECK_HINT(device_bytes > 0, "e.g. --offload-fit --device-gb 24", "--offload-fit needs --device-gb");
      const double Bp = static_cast<double>(scalelab::dtype_size(policy.param_dtype));
      const double Bg = static_cast<double>(scalelab::dtype_size(policy.grad_dtype));
      const double K = scalelab::optimizer_bytes_per_param(policy, opt);
      const double link = scalelab::GpuModel::preset("h100").host_link_bytes_per_s;  // bytes/s, each way
      const double psi_on = device_bytes / (Bp + Bg + K), psi_off = device_bytes / (Bp + Bg);
      std::printf("one device of %g GB, %s, %s: model state only (activations not counted), paper-level\n", device_gb,
                  policy.name().c_str(), optimizer.c_str());
      std::printf("  optimizer on the device:  %.0f + %.0f + %.0f = %.0f bytes/param -> largest model %.2fB params\n",
                  Bp, Bg, K, Bp + Bg + K, psi_on / 1e9);
      std::printf(
          "  --offload optimizer:      %.0f + %.0f = %.0f bytes/param on the device -> %.2fB params (%.1fx); "
          "host %.0f bytes/param (%.0f GB)\n",
          Bp, Bg, Bp + Bg, psi_off / 1e9, psi_off / psi_on, K + Bg + (Bp == 4 ? 0 : Bp),
          psi_off * (K + Bg + (Bp == 4 ? 0 : Bp)) / 1e9);
      std::printf(
          "  its cost per step over PCIe at %.0f GB/s each way: %.1f GB down (gradients) in %.2f s, %.1f GB up "
          "(parameters) in %.2f s; hidden only as far as compute overlaps them\n",
          link / 1e9, psi_off * Bg / 1e9, psi_off * Bg / link, psi_off * Bp / 1e9, psi_off * Bp / link);
      return 0;
    }

    if (!model.empty()) {
      const scalelab::GPTConfig cfg = scalelab::GPTConfig::preset(model);
      if (seq_len < 0) seq_len = cfg.max_seq_len;
      SL_CHECK_HINT(seq_len <= cfg.max_seq_len, "use --seq-len <= the model's max_seq_len",
                    "--seq-len %d exceeds %s's max_seq_len %d", seq_len, model.c_str(), cfg.max_seq_len);
      std::printf("%s", scalelab::format_memory_table(cfg, ranks, stages, policy, opt, prefetch, micro_batch, seq_len,
                                                      exact_bytes)
                            .c_str());
      if (device_bytes > 0) {
        std::printf("\ndevices of %g GB needed (peak model state + activations, N a power of two <= %d):\n", device_gb,
                    max_ranks);
        for (int s : stages) {
          const int N = scalelab::min_devices_to_fit(cfg, s, policy, opt, prefetch, micro_batch, seq_len, device_bytes,
                                                     max_ranks);
          if (N > 0) std::printf("  stage %d: %d\n", s, N);
          else std::printf("  stage %d: never\n", s);
        }
      }
      return 0;
    }
    if (device_bytes > 0) {
      std::printf("%s", scalelab::format_fit_table(psi, stages, policy, opt, device_bytes, 0, max_ranks).c_str());
      if (!paper) {  // the same question with the paper's 16-bit gradients (K = 12), for comparison
        std::printf("\nthe ZeRO paper's policy (16-bit gradients):\n%s",
                    scalelab::format_fit_table(psi, stages, scalelab::zero_paper_policy(), opt, device_bytes, 0,
                                               max_ranks)
                        .c_str());
      }
      return 0;
    }
    std::printf("%s", scalelab::format_zero_table(psi, ranks, stages, policy, opt).c_str());
    return 0;
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
