// test_sim_gpu.cpp — the simulated GPU (scalelab/core/sim_gpu.h, docs/simulation.md): the presets and their
// figures, the active model (the SIM allocator's capacity, the virtual clock), copies and zeroing charged by
// rule 3, and host code refused a read of device memory (DeviceCodeScope, scalelab/core/tensor.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "expect_error.h"                  // defines: error_message, contains
#include "scalelab/core/allocator.h"       // defines: Allocator, Device
#include "scalelab/core/clock.h"           // defines: VirtualClock, clock_is_virtual
#include "scalelab/core/error.h"           // defines: Error, OutOfMemory
#include "scalelab/core/precision.h"       // defines: PrecisionPolicy
#include "scalelab/core/sim_gpu.h"         // defines: GpuModel, sim_gpu_set, sim_gpu, sim_gpu_clear
#include "scalelab/core/tensor.h"          // defines: Tensor, DeviceCodeScope
#include "scalelab/measure/calibration.h"  // defines: datasheet_peak, device_peak (the MFU peaks)

namespace scalelab {
namespace {

using test::contains;
using test::error_message;

// Makes `model` the active GPU for one test, and leaves none active (capacity uncapped) after it.
struct ActiveGpu {
  explicit ActiveGpu(const GpuModel& model) { sim_gpu_set(model); }
  ~ActiveGpu() {
    sim_gpu_clear();
    Allocator::get(Device::SIM).set_capacity_bytes(0);
  }
};

// A GPU with round figures, so the expected seconds below are exact in binary.
GpuModel round_gpu() {
  GpuModel m = GpuModel::preset("h100");
  m.launch_s = 0.25;
  m.hbm_bytes_per_s = 1024;
  m.eff_memory = 0.5;  // 512 bytes/s achieved
  m.host_link_bytes_per_s = 64;
  return m;
}

TEST(SimGpu, PresetsCarryTheirFiguresAndTheirLinks) {
  ASSERT_EQ(GpuModel::preset_names(), (std::vector<std::string>{"h100", "h200", "a100", "rtx4090"}));
  for (const std::string& name : GpuModel::preset_names()) {
    const GpuModel m = GpuModel::preset(name);
    EXPECT_EQ(m.name, name);
    EXPECT_TRUE(contains(m.display_name, "simulated")) << m.display_name;
    for (const double v : {m.bf16_flops_per_s, m.fp32_flops_per_s, m.hbm_bytes_per_s, m.launch_s,
                           m.host_link_bytes_per_s, static_cast<double>(m.memory_bytes)})
      EXPECT_GT(v, 0) << name;
    for (const OpClass c : {OpClass::Matmul, OpClass::Attention, OpClass::MemoryBound}) {
      EXPECT_GT(m.efficiency(c), 0) << name << " " << op_class_name(c);
      EXPECT_LE(m.efficiency(c), 1) << name << " " << op_class_name(c);
    }
    EXPECT_GT(m.peak_flops_per_s(DType::BF16), m.peak_flops_per_s(DType::F32)) << name << ": tensor cores";
  }
  EXPECT_EQ(GpuModel::preset("h100").intra_node_link, "nvlink");
  EXPECT_EQ(GpuModel::preset("h200").intra_node_link, "nvlink");
  EXPECT_EQ(GpuModel::preset("a100").intra_node_link, "nvlink");
  EXPECT_EQ(GpuModel::preset("rtx4090").intra_node_link, "pcie");
  EXPECT_EQ(GpuModel::preset("h200").memory_bytes, 141'000'000'000);
  EXPECT_EQ(GpuModel::preset("h100").hbm_bytes_per_s, 3.35e12);
  EXPECT_THROW(GpuModel::preset("h100").peak_flops_per_s(DType::I32), Error);
}

// The peaks are the MFU table's (common/src/measure/calibration.cpp): a simulated MFU and a real one on the
// same GPU divide by the same number.
TEST(SimGpu, PeaksAreTheDatasheetTableOfTheMfuPeaks) {
  const std::pair<const char*, const char*> devices[] = {{"h100", "NVIDIA H100 80GB HBM3"},
                                                         {"h200", "NVIDIA H200"},
                                                         {"a100", "NVIDIA A100-SXM4-80GB"},
                                                         {"rtx4090", "NVIDIA GeForce RTX 4090"}};
  for (const auto& [name, cuda_name] : devices) {
    const auto entry = datasheet_peak(cuda_name);
    ASSERT_TRUE(entry.has_value()) << cuda_name;
    EXPECT_EQ(GpuModel::preset(name).bf16_flops_per_s, entry->bf16_flops_per_s) << name;
    EXPECT_EQ(GpuModel::preset(name).fp32_flops_per_s, entry->fp32_flops_per_s) << name;
  }
}

// MFU on the simulated device divides by the simulated GPU's peak at the run's matmul precision.
TEST(SimGpu, TheMfuPeakOfTheSimDeviceIsTheSimulatedGpus) {
  ActiveGpu gpu(GpuModel::preset("h200"));
  const Peak fp32 = device_peak(Device::SIM, PrecisionPolicy::fp32(), 1);
  EXPECT_EQ(fp32.flops_per_s, 67e12);
  EXPECT_TRUE(contains(fp32.source, "simulated H200 SXM")) << fp32.source;
  EXPECT_TRUE(contains(fp32.source, "virtual time")) << fp32.source;
  EXPECT_EQ(device_peak(Device::SIM, PrecisionPolicy::bf16_compute(), 1).flops_per_s, 989e12);
}

TEST(SimGpu, AnUnknownNameIsRefusedNamingTheAcceptedOnes) {
  const std::string msg = error_message([] { GpuModel::preset("h800"); });
  EXPECT_TRUE(contains(msg, "h800")) << msg;
  EXPECT_TRUE(contains(msg, "h100, h200, a100, rtx4090")) << msg;
}

TEST(SimGpu, SettingAModelStartsTheVirtualClockAndCapsTheSimMemory) {
  ASSERT_FALSE(sim_gpu_active());
  const std::string msg = error_message([] { sim_gpu(); });
  EXPECT_TRUE(contains(msg, "no simulated GPU model is active")) << msg;
  EXPECT_TRUE(contains(msg, "--sim-gpu")) << msg;
  {
    ActiveGpu gpu(GpuModel::preset("a100"));
    EXPECT_TRUE(sim_gpu_active());
    EXPECT_EQ(sim_gpu().name, "a100");
    EXPECT_TRUE(clock_is_virtual());
    EXPECT_EQ(VirtualClock::get().compute_s(), 0.0);
    EXPECT_EQ(Allocator::get(Device::SIM).capacity_bytes(), 80'000'000'000);
  }
  EXPECT_FALSE(sim_gpu_active());
  EXPECT_FALSE(clock_is_virtual());
}

TEST(SimGpu, TheSimAllocatorRefusesBeyondTheModelsMemoryUntilACapOverridesIt) {
  GpuModel small = GpuModel::preset("rtx4090");
  small.memory_bytes = 4096;  // bytes
  ActiveGpu gpu(small);
  const int64_t in_use = Allocator::get(Device::SIM).stats().total_current_bytes;
  ASSERT_EQ(in_use, 0) << "another test left SIM tensors alive";
  Tensor fits = Tensor::empty({1024}, DType::F32, Device::SIM);  // 4096 bytes: exactly the capacity
  EXPECT_THROW(Tensor::empty({1}, DType::F32, Device::SIM), OutOfMemory);
  // The host's memory is not the simulated GPU's: the CPU allocator is not capped by the model.
  Tensor host = Tensor::empty({4096}, DType::F32, Device::CPU);
  // --memory-cap-mb comes after the model and overrides its capacity.
  Allocator::get(Device::SIM).set_capacity_bytes(8192);
  Tensor more = Tensor::empty({1024}, DType::F32, Device::SIM);
  EXPECT_EQ(Allocator::get(Device::SIM).stats().total_current_bytes, 8192);
}

// Rule 3 with round_gpu's figures: host <-> SIM 0.25 s + bytes / 64; SIM -> SIM 0.25 s + 2 bytes / 512;
// zero_ 0.25 s + bytes / 512; CPU <-> CPU nothing.
TEST(SimGpu, CopiesAreChargedOnTheHostLinkAndInsideTheDeviceAtHbmBandwidth) {
  ActiveGpu gpu(round_gpu());
  VirtualClock& clock = VirtualClock::get();
  Tensor h = Tensor::empty({64}, DType::F32, Device::CPU);  // 256 bytes
  for (int i = 0; i < 64; i++) h.data<float>()[i] = static_cast<float>(i);
  Tensor h2 = Tensor::empty({64}, DType::F32, Device::CPU);
  h2.copy_from(h);
  EXPECT_EQ(clock.compute_s(), 0.0) << "a host copy is not the simulated GPU's";

  Tensor d = Tensor::empty({64}, DType::F32, Device::SIM);
  d.copy_from(h);  // host -> device: 0.25 + 256 / 64 = 4.25 s
  EXPECT_EQ(clock.compute_s(), 4.25);
  Tensor d2 = Tensor::empty({64}, DType::F32, Device::SIM);
  d2.copy_from(d);  // device -> device: 0.25 + 2 * 256 / 512 = 1.25 s
  EXPECT_EQ(clock.compute_s(), 5.5);
  h2.copy_from(d2);  // device -> host: 4.25 s again
  EXPECT_EQ(clock.compute_s(), 9.75);
  d2.zero_();  // cudaMemset: 0.25 + 256 / 512 = 0.75 s
  EXPECT_EQ(clock.compute_s(), 10.5);
  EXPECT_EQ(std::memcmp(h.data<float>(), h2.data<float>(), 256), 0) << "the bytes went there and back";
  EXPECT_DOUBLE_EQ(GpuModel::preset("h100").copy_seconds(50'000'000'000, Device::SIM, Device::CPU), 1.0 + 5e-6)
      << "50 GB over PCIe 5.0 at 50 GB/s, plus one launch";
}

TEST(SimGpu, HostCodeCannotReadDeviceMemoryButDeviceCodeCan) {
  ActiveGpu gpu(round_gpu());
  Tensor d = Tensor::zeros({4}, DType::F32, Device::SIM);
  const std::string msg = error_message([&] { d.data<float>(); });
  EXPECT_TRUE(contains(msg, "host code read the simulated GPU's memory")) << msg;
  EXPECT_TRUE(contains(msg, "copy it to a CPU tensor first")) << msg;
  EXPECT_THROW(d.view(1, {2}).data<float>(), Error) << "a view is device memory too";
  EXPECT_FALSE(DeviceCodeScope::active());
  {
    DeviceCodeScope outer;
    {
      DeviceCodeScope inner;  // nested: still device code after it closes
    }
    EXPECT_TRUE(DeviceCodeScope::active());
    d.data<float>()[2] = 7.0f;
  }
  EXPECT_FALSE(DeviceCodeScope::active());
  EXPECT_THROW(d.data<float>(), Error);
  Tensor h = Tensor::empty({4}, DType::F32, Device::CPU);
  h.copy_from(d);  // the way host code reads it
  EXPECT_EQ(h.data<float>()[2], 7.0f);
}

}  // namespace
}  // namespace scalelab
