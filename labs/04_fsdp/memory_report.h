// memory_report.h — lab 04's memory per rank, measured by the allocator beside the estimator's figures
// (scalelab/measure/memory_estimator.h, docs/memory.md): the summary record's memory keys, the table
// rank 0 prints at the end, and --estimate's table (main.cpp; the same for both tracks).
#pragma once

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <cstdint>
#include <cstdio>  // defines: std::printf
#include <string>

#include "scalelab/core/allocator.h"            // defines: MemStats, MemCategory
#include "scalelab/measure/memory_estimator.h"  // defines: MemoryEstimate, estimate_memory, format_memory_table
#include "scalelab/model/gpt2.h"                // defines: GPTConfig, gpt2_num_params
#include "scalelab/model/optim.h"               // defines: OptimizerConfig

namespace scalelab::lab04_driver {

constexpr double kMiB = 1024.0 * 1024.0;  // bytes

inline int64_t current(const MemStats& m, MemCategory c) { return m.current_bytes[static_cast<int>(c)]; }
inline int64_t peak(const MemStats& m, MemCategory c) { return m.peak_bytes[static_cast<int>(c)]; }

// The header's line of the estimator's figures for this run (and the cap, when there is one).
inline void print_estimate_line(const MemoryEstimate& est, int64_t cap_bytes) {
  std::printf("memory per rank (estimator): persistent %.1f MiB, peak %.1f MiB (model state %.1f + activations %.1f)%s",
              est.persistent.total() / kMiB, est.total_peak_bytes() / kMiB, est.peak.total() / kMiB,
              est.activations_bytes / kMiB, cap_bytes > 0 ? "" : "\n");
  if (cap_bytes > 0) std::printf(" | cap %.1f MiB per rank\n", cap_bytes / kMiB);
}

// between_steps: the allocator right after the last step (what stays between steps: the persistent
// state); mem: at the end of the run (the peaks). cap_bytes: --memory-cap-mb (0: none).
inline nlohmann::json memory_summary(const MemStats& between_steps, const MemStats& mem, const MemoryEstimate& est,
                                     int64_t cap_bytes) {
  return {{"memory_params_persistent_bytes", current(between_steps, MemCategory::Params)},
          {"memory_grads_persistent_bytes", current(between_steps, MemCategory::Grads)},
          {"memory_optimizer_state_persistent_bytes", current(between_steps, MemCategory::OptimizerState)},
          {"memory_params_peak_bytes", peak(mem, MemCategory::Params)},
          {"memory_grads_peak_bytes", peak(mem, MemCategory::Grads)},
          {"memory_optimizer_state_peak_bytes", peak(mem, MemCategory::OptimizerState)},
          {"memory_activations_peak_bytes", peak(mem, MemCategory::Activations)},
          {"memory_estimated_params_persistent_bytes", est.persistent.params},
          {"memory_estimated_grads_persistent_bytes", est.persistent.grads},
          {"memory_estimated_optimizer_state_persistent_bytes", est.persistent.optimizer_state},
          {"memory_estimated_params_peak_bytes", est.peak.params},
          {"memory_estimated_grads_peak_bytes", est.peak.grads},
          {"memory_estimated_optimizer_state_peak_bytes", est.peak.optimizer_state},
          {"memory_estimated_activations_bytes", est.activations_bytes},
          {"memory_estimated_peak_bytes", est.total_peak_bytes()},
          {"memory_cap_bytes", cap_bytes}};
}

inline void print_memory_table(const MemStats& between_steps, const MemStats& mem, const MemoryEstimate& est,
                               int64_t cap_bytes) {
  auto cur = [](const MemStats& m, MemCategory c) { return current(m, c); };
  auto pk = [](const MemStats& m, MemCategory c) { return peak(m, c); };
  std::printf(
      "\nmemory of rank 0, MiB       measured   estimated  |  measured  estimated\n"
      "                           persistent persistent  |    peak       peak\n");
  const struct {
    const char* name;
    MemCategory c;
    int64_t est_persistent, est_peak;
  } rows[] = {
      {"params", MemCategory::Params, est.persistent.params, est.peak.params},
      {"grads", MemCategory::Grads, est.persistent.grads, est.peak.grads},
      {"optimizer state", MemCategory::OptimizerState, est.persistent.optimizer_state, est.peak.optimizer_state},
  };
  for (const auto& row : rows)
    std::printf("%-26s %9.2f  %9.2f   | %9.2f  %9.2f\n", row.name, cur(between_steps, row.c) / kMiB,
                row.est_persistent / kMiB, pk(mem, row.c) / kMiB, row.est_peak / kMiB);
  std::printf("%-26s %9s  %9s   | %9.2f  %9.2f\n", "activations", "-", "-", pk(mem, MemCategory::Activations) / kMiB,
              est.activations_bytes / kMiB);
  std::printf("%-26s %9s  %9s   | %9.2f  %9s\n", "comm (reduce-scatter out)", "-", "-",
              pk(mem, MemCategory::Comm) / kMiB, "-");
  std::printf("%-26s %9s  %9s   | %9.2f  %9s\n", "workspace + data + other", "-", "-",
              (pk(mem, MemCategory::Workspace) + pk(mem, MemCategory::Data) + pk(mem, MemCategory::Other)) / kMiB, "-");
  const int64_t state_now = cur(between_steps, MemCategory::Params) + cur(between_steps, MemCategory::Grads) +
                            cur(between_steps, MemCategory::OptimizerState);
  const int64_t state_peaks = pk(mem, MemCategory::Params) + pk(mem, MemCategory::Grads) +
                              pk(mem, MemCategory::OptimizerState);
  std::printf("%-26s %9.2f  %9.2f   | %9.2f  %9.2f   (sum of the three peaks)\n", "model state", state_now / kMiB,
              est.persistent.total() / kMiB, state_peaks / kMiB, est.peak.total() / kMiB);
  std::printf(
      "%-26s %9s  %9s   | %9.2f  %9.2f   (measured: peak of the sum of all; estimated: model state "
      "+ activations)\n",
      "total", "", "", mem.total_peak_bytes / kMiB, est.total_peak_bytes() / kMiB);
  if (cap_bytes > 0)
    std::printf("memory per rank: peak %.1f MiB of the %.1f MiB cap (%.0f %%)\n", mem.total_peak_bytes / kMiB,
                cap_bytes / kMiB, 100.0 * mem.total_peak_bytes / cap_bytes);
}

// Part 3 (--offload optimizer): the bytes one step moves over the host link per rank, each way: every unit's
// gradient shard down (fp32, 4 bytes an element) and its updated parameter shard up (param dtype). Bytes.
struct PcieBytes {
  int64_t down = 0;  // device -> host
  int64_t up = 0;    // host -> device
};
inline PcieBytes offload_pcie_bytes_per_step(const GPTConfig& cfg, int world, int stage,
                                             const PrecisionPolicy& policy) {
  const ModelStateBytes h = offload_host_bytes(cfg, world, stage, policy, OptimizerConfig::Kind::SGD);
  const int64_t shard_elems = h.grads / 4;  // sum over units of s_u
  return {h.grads, shard_elems * static_cast<int64_t>(dtype_size(policy.param_dtype))};
}

inline void print_offload_line(const MemoryEstimate& est, const PcieBytes& pcie) {
  std::printf(
      "offload (estimator): host %.1f MiB per rank (master + moments %.1f, gradients %.1f, params %.1f) | "
      "host link per step %.1f MiB down + %.1f MiB up\n",
      est.host.total() / kMiB, est.host.optimizer_state / kMiB, est.host.grads / kMiB, est.host.params / kMiB,
      pcie.down / kMiB, pcie.up / kMiB);
}

// The host place's counts (Allocator::get(Device::CPU).stats(MemPlace::Host)) beside the estimator's.
inline nlohmann::json offload_summary(const MemStats& host, const MemoryEstimate& est, const PcieBytes& pcie) {
  return {{"memory_host_params_bytes", current(host, MemCategory::Params)},
          {"memory_host_grads_bytes", current(host, MemCategory::Grads)},
          {"memory_host_optimizer_state_bytes", current(host, MemCategory::OptimizerState)},
          {"memory_estimated_host_bytes", est.host.total()},
          {"pcie_down_bytes_per_step", pcie.down},
          {"pcie_up_bytes_per_step", pcie.up}};
}

inline void print_host_memory(const MemStats& host, const MemoryEstimate& est) {
  std::printf(
      "host memory of rank 0 (offloaded), MiB: measured %.2f (optimizer state %.2f, grads %.2f, params "
      "%.2f), estimated %.2f\n",
      host.total_current_bytes / kMiB, current(host, MemCategory::OptimizerState) / kMiB,
      current(host, MemCategory::Grads) / kMiB, current(host, MemCategory::Params) / kMiB, est.host.total() / kMiB);
}

// --estimate: the estimator's table at this world size, DDP (stage 0) for comparison and stages 1-3, and
// with a cap (MiB, 0: none) whether each stage fits in it.
inline void print_estimate(const GPTConfig& cfg, int world, const PrecisionPolicy& policy, OptimizerConfig::Kind kind,
                           const std::string& optimizer, int prefetch, int B, int T, double cap_mb) {
  std::printf("lab04 --estimate | %s | %lld params | %d rank%s | %s | %s | prefetch %d | B=%d T=%d\n",
              cfg.str().c_str(), static_cast<long long>(gpt2_num_params(cfg)), world, world == 1 ? "" : "s",
              policy.name().c_str(), optimizer.c_str(), prefetch, B, T);
  std::printf("%s", format_memory_table(cfg, {world}, {0, 1, 2, 3}, policy, kind, prefetch, B, T).c_str());
  for (int s = 1; s <= 3 && cap_mb > 0; ++s) {
    const int64_t peak = estimate_memory(cfg, world, s, policy, kind, prefetch, B, T).total_peak_bytes();
    std::printf("ZeRO-%d on %d rank%s: peak %.1f MiB %s the cap of %.1f MiB\n", s, world, world == 1 ? "" : "s",
                peak / kMiB, peak <= cap_mb * kMiB ? "fits in" : "EXCEEDS", cap_mb);
  }
}

}  // namespace scalelab::lab04_driver
