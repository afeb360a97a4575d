// sim_gpu.h — the simulated GPU (Device::SIM, docs/simulation.md): models of named GPUs (dense peaks, HBM,
// capacity, kernel launch overhead, achievable efficiency per op class, host link) and the one model that is
// active in this process, on which every SIM op and copy is timed. The figures and their sources:
// common/src/core/sim_gpu.cpp and docs/simulation.md "GPU models". An op's modelled seconds: ops/op_cost.h.
// Tests: tests/common/core/test_sim_gpu.cpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/core/tensor.h"  // defines: DType, Device

namespace scalelab {

// The kinds of kernel an op's time is modelled by (docs/simulation.md rule 2); each reaches its own
// fraction of the GPU's peak: large GEMMs come close to it, attention's batched small products and softmax
// less, and everything else (norms, activations, the optimizer, copies) is limited by memory bandwidth.
enum class OpClass { Matmul, Attention, MemoryBound };
const char* op_class_name(OpClass c);  // "matmul", "attention", "memory_bound"

struct GpuModel {
  std::string name;          // the preset's name: "h100", "h200", "a100", "rtx4090"
  std::string display_name;  // what every simulated figure says it ran on: "simulated H100 SXM"
  // Dense peaks, FLOP/s. bf16: the tensor cores with fp32 accumulation (the kit's bf16 matmuls). fp32: the
  // plain fp32 units, no TF32 (the kit's fp32 GEMMs ask cuBLAS for CUBLAS_COMPUTE_32F, as PyTorch's default
  // fp32 matmul does; its attention is fp32 too).
  double bf16_flops_per_s = 0;
  double fp32_flops_per_s = 0;
  double hbm_bytes_per_s = 0;  // device memory bandwidth, bytes/s (datasheet)
  int64_t memory_bytes = 0;    // device memory, bytes: the SIM allocator's capacity while this model is active
  double launch_s = 0;         // fixed cost of one kernel launch or one cudaMemcpy call, seconds
  // Achievable fractions (0, 1] of the peak FLOP/s (matmul, attention) and of the HBM bandwidth (memory).
  double eff_matmul = 0;
  double eff_attention = 0;
  double eff_memory = 0;
  double host_link_bytes_per_s = 0;  // host <-> device copies (PCIe), bytes/s in one direction, achievable
  std::string host_link;             // its name: "PCIe 5.0 x16"
  // The host's (CPU's) memory bandwidth available to this GPU's rank, bytes/s: what an op of ops.h on host
  // memory (MemPlace::Host, lab 04's offloaded AdamW) costs in virtual time (host_op_seconds). A model, not
  // a measurement: a round teaching value (common/src/core/sim_gpu.cpp says where it comes from). 0: the
  // host's arithmetic takes no virtual time.
  double host_memory_bytes_per_s = 0;
  // The LinkModel preset (comm.h) the sim backend takes for GPUs of one node unless told otherwise:
  // "nvlink" for the SXM parts, "pcie" for cards without NVLink.
  std::string intra_node_link;

  // The dense peak of the dtype an op's math runs in: bf16 or f32 (i32 has none: throws).
  double peak_flops_per_s(DType math) const;
  // eff_matmul, eff_attention or eff_memory.
  double efficiency(OpClass c) const;
  // docs/simulation.md rule 3: a copy of nbytes from src to dst. Host <-> SIM crosses the host link
  // (launch_s + nbytes / host_link_bytes_per_s, as a cudaMemcpy); SIM -> SIM reads and writes HBM
  // (launch_s + 2 nbytes / (hbm_bytes_per_s * eff_memory)). 0 when neither side is SIM.
  double copy_seconds(int64_t nbytes, Device dst, Device src) const;
  // docs/simulation.md rule 8: an op on host memory that reads and writes `bytes` (its op_cost::) takes
  // bytes / host_memory_bytes_per_s seconds on the host (memory-bound, as AdamW is); 0 when that figure is 0.
  double host_op_seconds(double bytes) const;
  // A SIM buffer of nbytes set to zero (cudaMemset): launch_s + nbytes / (hbm_bytes_per_s * eff_memory).
  double zero_seconds(int64_t nbytes) const;

  // The model of a named GPU; throws scalelab::Error naming the accepted names for any other.
  static GpuModel preset(const std::string& name);
  static std::vector<std::string> preset_names();  // {"h100", "h200", "a100", "rtx4090"}
};

// The active model: the GPU every SIM op and copy of this process is timed on (one rank per process).
// sim_gpu_set(model) makes it active, starts the virtual clock at 0 (core/clock.h VirtualClock::start) and
// sets the SIM allocator's capacity to model.memory_bytes; a later Allocator::set_capacity_bytes
// (--memory-cap-mb) overrides the capacity. Call it before any SIM tensor is used, not while ops run.
void sim_gpu_set(const GpuModel& model);
// True while a model is active.
bool sim_gpu_active();
// The active model; throws scalelab::Error with a hint when none is (an op on SIM tensors before
// sim_gpu_set: the simulated device has no speed to be timed by).
const GpuModel& sim_gpu();
// No model active any more; stops the virtual clock. The SIM allocator's capacity is left as it is.
void sim_gpu_clear();

// --timing-only (docs/simulation.md "Timing-only runs"): the run keeps its schedule, its collectives and its
// memory, and drops its arithmetic. While it is on, SIM ops charge their modelled time and compute nothing
// (ops/ops.h), SIM copies and zeroing are charged and move no bytes (a SIM -> CPU copy writes zeros: the host
// sees finite values), the SIM allocator's blocks are address space reserved with mmap(MAP_NORESERVE) and never
// touched (no host memory behind them), the sim communicator moves its headers (the virtual times) but not the
// payloads, and the initial weights are not drawn (gpt2_initial_weights). Set it once, before any SIM tensor
// exists (the drivers do, from --timing-only); it applies to every thread of the process.
void sim_set_timing_only(bool on);
bool sim_timing_only();  // the flag above
// True where SIM data is skipped now: --timing-only, and no SimRealDataScope open on this thread.
bool sim_skips_data();
// Inside this scope a timing-only run moves SIM bytes for real: the host values a program reduces or
// broadcasts (comm/host_values.h: a flag, a run id, the options the ranks compare) are control, not arithmetic.
// Their buffers are a few bytes, so touching their pages costs nothing.
class SimRealDataScope {
 public:
  SimRealDataScope();
  ~SimRealDataScope();
  SimRealDataScope(const SimRealDataScope&) = delete;
  SimRealDataScope& operator=(const SimRealDataScope&) = delete;
};

}  // namespace scalelab
