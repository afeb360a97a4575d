// sim_gpu.cpp — the simulated GPU's models and the active one (core/sim_gpu.h).
//
// The figures of the presets and where they come from (docs/simulation.md "GPU models" has the table):
//   peaks    dense bf16 (tensor cores, fp32 accumulate) and plain fp32, from the vendors' datasheets: the
//            same figures as the MFU peak table (common/src/measure/calibration.cpp, datasheet_peaks; a test
//            keeps the two equal). H100/H200 SXM 989 and 67 TFLOP/s, A100 312 and 19.5, RTX 4090 165 and
//            82.6 (Ada whitepaper, bf16 with fp32 accumulate).
//   HBM      datasheet bandwidth: H100 SXM 3.35 TB/s, H200 4.8, A100 SXM 80GB 2.039, RTX 4090 1.008 (GDDR6X).
//   memory   datasheet capacity in 1e9 bytes: 80, 141, 80, 24 (a process sees a little less on a real GPU).
//   launch   5 us per kernel: a round teaching value for one launch through the driver, the order of
//            magnitude of a small op's host-side cost in profiles of PyTorch; the same for every GPU.
//   eff      matmul 0.75, attention 0.50, memory-bound 0.85, the same for every GPU, round teaching values:
//            large cuBLAS GEMMs reach about three quarters of the dense peak, fused attention kernels
//            50-75 % (FlashAttention-2 on A100, Dao 2023, arXiv:2307.08691: 50-73 %; FlashAttention-3 on
//            H100, Shah et al. 2024, arXiv:2407.08608: 75 %), and bandwidth-bound kernels 80-90 % of the
//            datasheet bandwidth.
//   host     achievable PCIe, one direction: 4.0 x16 25 GB/s (docs/references.md; 32 GB/s raw), 5.0 x16
//            50 GB/s (twice that: the raw rate doubles; a round value).
//   host memory  50 GB/s per GPU, every preset: a round teaching value, not a measurement. A two-socket
//            server with 8 DDR5-4800 channels a socket has 8 x 38.4 = 307 GB/s peak a socket, about two
//            thirds of it achievable in a streaming kernel, shared by the 4 GPUs of a socket: about 50 GB/s
//            for one rank's host AdamW (ZeRO-Offload, Ren et al., USENIX ATC 2021, Sec. 5: CPU Adam is
//            memory-bound).
#include "scalelab/core/sim_gpu.h"

#include <atomic>  // defines: std::atomic (the timing-only flag)
#include <memory>  // defines: std::unique_ptr
#include <mutex>   // defines: std::mutex, std::lock_guard

#include "scalelab/core/allocator.h"  // defines: Allocator (the SIM allocator's capacity)
#include "scalelab/core/clock.h"      // defines: VirtualClock
#include "scalelab/core/error.h"      // defines: SL_CHECK, SL_CHECK_HINT, SL_FAIL

namespace scalelab {

namespace {
constexpr double kTera = 1e12;  // FLOP/s per TFLOP/s, bytes/s per TB/s
constexpr double kGB = 1e9;     // bytes per GB (decimal, as datasheets count)
constexpr double kUs = 1e-6;    // seconds per microsecond
constexpr double kHostMemoryGbPerS = 50;  // host memory bandwidth per GPU, GB/s (the comment above)

// One row per preset: the figures that differ between GPUs (the comment above says where each comes from).
struct PresetRow {
  const char* name;
  const char* display_name;
  double bf16_tflops, fp32_tflops;  // dense peaks, TFLOP/s
  double hbm_tb_per_s;              // TB/s
  double memory_gb;                 // GB (1e9 bytes)
  double host_gb_per_s;             // GB/s, one direction
  const char* host_link;
  const char* intra_node_link;  // LinkModel preset between the GPUs of one node
};
constexpr PresetRow kPresets[] = {
    {"h100", "simulated H100 SXM", 989, 67, 3.35, 80, 50, "PCIe 5.0 x16", "nvlink"},
    {"h200", "simulated H200 SXM", 989, 67, 4.8, 141, 50, "PCIe 5.0 x16", "nvlink"},
    {"a100", "simulated A100 SXM 80GB", 312, 19.5, 2.039, 80, 25, "PCIe 4.0 x16", "nvlink"},
    {"rtx4090", "simulated GeForce RTX 4090", 165, 82.6, 1.008, 24, 25, "PCIe 4.0 x16", "pcie"},  // no NVLink
};
}  // namespace

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Matmul: return "matmul";
    case OpClass::Attention: return "attention";
    case OpClass::MemoryBound: return "memory_bound";
  }
  return "?";
}

double GpuModel::peak_flops_per_s(DType math) const {
  SL_CHECK(math != DType::I32, "%s: no FLOP/s peak for %s math (an op's math runs in bf16 or f32)",
           display_name.c_str(), dtype_name(math));
  return math == DType::BF16 ? bf16_flops_per_s : fp32_flops_per_s;
}

double GpuModel::efficiency(OpClass c) const {
  switch (c) {
    case OpClass::Matmul: return eff_matmul;
    case OpClass::Attention: return eff_attention;
    case OpClass::MemoryBound: return eff_memory;
  }
  return eff_memory;
}

double GpuModel::copy_seconds(int64_t nbytes, Device dst, Device src) const {
  if (dst != Device::SIM && src != Device::SIM) return 0.0;
  if (dst == Device::SIM && src == Device::SIM)
    return launch_s + 2.0 * static_cast<double>(nbytes) / (hbm_bytes_per_s * eff_memory);  // read + write
  return launch_s + static_cast<double>(nbytes) / host_link_bytes_per_s;
}

double GpuModel::host_op_seconds(double bytes) const {
  return host_memory_bytes_per_s > 0 ? bytes / host_memory_bytes_per_s : 0.0;
}

double GpuModel::zero_seconds(int64_t nbytes) const {
  return launch_s + static_cast<double>(nbytes) / (hbm_bytes_per_s * eff_memory);
}

std::vector<std::string> GpuModel::preset_names() {
  std::vector<std::string> names;
  for (const PresetRow& row : kPresets) names.push_back(row.name);
  return names;
}

GpuModel GpuModel::preset(const std::string& name) {
  for (const PresetRow& row : kPresets) {
    if (name != row.name) continue;
    GpuModel m;
    m.name = row.name;
    m.display_name = row.display_name;
    m.bf16_flops_per_s = row.bf16_tflops * kTera;
    m.fp32_flops_per_s = row.fp32_tflops * kTera;
    m.hbm_bytes_per_s = row.hbm_tb_per_s * kTera;
    m.memory_bytes = static_cast<int64_t>(row.memory_gb * kGB);
    m.host_link_bytes_per_s = row.host_gb_per_s * kGB;
    m.host_link = row.host_link;
    m.intra_node_link = row.intra_node_link;
    m.host_memory_bytes_per_s = kHostMemoryGbPerS * kGB;
    m.launch_s = 5 * kUs;  // the same for every GPU, as are the efficiencies
    m.eff_matmul = 0.75;
    m.eff_attention = 0.50;
    m.eff_memory = 0.85;
    return m;
  }
  std::string names;
  for (const PresetRow& row : kPresets) names += std::string(names.empty() ? "" : ", ") + row.name;
  SL_FAIL("use one of: " + names + " (--sim-gpu)", "unknown simulated GPU '%s'", name.c_str());
}

// ---------------------------------------------------------------------------------------------
// The active model. Set before the SIM tensors are used and read by every SIM op, so a reference to it
// stays valid until the next sim_gpu_set / sim_gpu_clear (which must not race with running ops).

namespace {
std::mutex& active_mu() {
  static std::mutex mu;
  return mu;
}
std::unique_ptr<GpuModel>& active() {
  static std::unique_ptr<GpuModel> model;
  return model;
}
}  // namespace

void sim_gpu_set(const GpuModel& model) {
  SL_CHECK(model.bf16_flops_per_s > 0 && model.fp32_flops_per_s > 0 && model.hbm_bytes_per_s > 0 &&
               model.host_link_bytes_per_s > 0 && model.memory_bytes > 0 && model.launch_s >= 0 &&
               model.host_memory_bytes_per_s >= 0,
           "simulated GPU '%s': every peak, bandwidth and the memory must be > 0 (bf16 %g, fp32 %g FLOP/s, HBM %g, "
           "host link %g bytes/s, memory %lld bytes)",
           model.name.c_str(), model.bf16_flops_per_s, model.fp32_flops_per_s, model.hbm_bytes_per_s,
           model.host_link_bytes_per_s, static_cast<long long>(model.memory_bytes));
  for (const double eff : {model.eff_matmul, model.eff_attention, model.eff_memory})
    SL_CHECK(eff > 0 && eff <= 1, "simulated GPU '%s': an efficiency of %g is outside (0, 1]", model.name.c_str(), eff);
  {
    std::lock_guard<std::mutex> lock(active_mu());
    active() = std::make_unique<GpuModel>(model);
  }
  Allocator::get(Device::SIM).set_capacity_bytes(model.memory_bytes);
  VirtualClock::get().start();
}

bool sim_gpu_active() {
  std::lock_guard<std::mutex> lock(active_mu());
  return active() != nullptr;
}

const GpuModel& sim_gpu() {
  std::lock_guard<std::mutex> lock(active_mu());
  SL_CHECK_HINT(active() != nullptr,
                "choose the simulated GPU first: --sim-gpu h100 in a lab driver, "
                "sim_gpu_set(GpuModel::preset(\"h100\")) in code",
                "a SIM tensor was computed on, but no simulated GPU model is active (its time cannot be modelled)");
  return *active();
}

void sim_gpu_clear() {
  {
    std::lock_guard<std::mutex> lock(active_mu());
    active().reset();
  }
  VirtualClock::get().stop();
}

// ---------------------------------------------------------------------------------------------
// --timing-only

namespace {
std::atomic<bool> timing_only{false};  // set once before the SIM tensors exist; read by every thread
thread_local int real_data_depth = 0;  // open SimRealDataScopes of this thread
}  // namespace

void sim_set_timing_only(bool on) { timing_only.store(on); }
bool sim_timing_only() { return timing_only.load(); }
bool sim_skips_data() { return timing_only.load() && real_data_depth == 0; }
SimRealDataScope::SimRealDataScope() { ++real_data_depth; }
SimRealDataScope::~SimRealDataScope() { --real_data_depth; }

}  // namespace scalelab
