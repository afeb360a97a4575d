// test_host_copy.cpp — memory in two places (allocator.h MemPlace) and the asynchronous host <-> device copy
// (host_copy.h): host bytes counted apart from the device's, the source read at launch and the destination
// written at wait, the simulated copy charged on the copy stream beside compute, the compute stream's waits
// for copies counted (copy_wait_stats), and an op on host memory charged at the host's memory bandwidth
// (docs/simulation.md rule 8).
#include <gtest/gtest.h>

#include <vector>

#include "scalelab/core/allocator.h"  // defines: Allocator, MemPlace, MemStats
#include "scalelab/core/clock.h"      // defines: VirtualClock
#include "scalelab/core/host_copy.h"  // defines: copy_async, CopyPtr
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "scalelab/core/tensor.h"     // defines: Tensor
#include "scalelab/ops/ops.h"         // defines: adamw_update

namespace scalelab {
namespace {

// (n,) fp32 on the CPU holding 1, 2, ..., n.
Tensor iota(int64_t n, MemPlace place = MemPlace::Device) {
  Tensor t = Tensor::empty({n}, DType::F32, Device::CPU, MemCategory::Other, place);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(i + 1);
  return t;
}

TEST(MemPlace, HostBytesCountedApartFromTheDevice) {
  Allocator& cpu = Allocator::get(Device::CPU);
  const MemStats dev0 = cpu.stats(MemPlace::Device), host0 = cpu.stats(MemPlace::Host);
  {
    Tensor h = Tensor::zeros({1000}, DType::F32, Device::CPU, MemCategory::OptimizerState, MemPlace::Host);
    EXPECT_EQ(h.place(), MemPlace::Host);
    const MemStats dev = cpu.stats(MemPlace::Device), host = cpu.stats(MemPlace::Host);
    EXPECT_EQ(dev.total_current_bytes, dev0.total_current_bytes);  // the device place did not move
    EXPECT_EQ(host.total_current_bytes - host0.total_current_bytes, 4000);
    EXPECT_EQ(host.current_bytes[static_cast<int>(MemCategory::OptimizerState)] -
                  host0.current_bytes[static_cast<int>(MemCategory::OptimizerState)],
              4000);
    EXPECT_GE(host.total_peak_bytes, host0.total_current_bytes + 4000);
  }
  EXPECT_EQ(cpu.stats(MemPlace::Host).total_current_bytes, host0.total_current_bytes);  // freed to its place
  EXPECT_ANY_THROW(Tensor::empty({4}, DType::F32, Device::SIM, MemCategory::Other, MemPlace::Host));
}

TEST(CopyAsync, SourceReadAtLaunchDestinationWrittenAtWait) {
  Tensor src = iota(8), dst = Tensor::zeros({8});
  CopyPtr c = copy_async(dst, src);
  src.data<float>()[0] = 100.0f;          // after launch: not what the copy carries
  EXPECT_EQ(dst.data<float>()[3], 0.0f);  // not waited for: the old bytes
  c->wait();
  EXPECT_EQ(dst.data<float>()[0], 1.0f);
  EXPECT_EQ(dst.data<float>()[7], 8.0f);
  Tensor dst2 = Tensor::zeros({8});
  copy_async(dst2, src);  // dropped without a wait: lands anyway
  EXPECT_EQ(dst2.data<float>()[0], 100.0f);
}

TEST(CopyAsync, SimulatedCopiesRunOnACopyStreamPerDirection) {
  GpuModel m = GpuModel::preset("h100");
  m.launch_s = 0.25;
  m.host_link_bytes_per_s = 64;  // 64 bytes: 1 s over the link
  sim_gpu_set(m);                // starts the virtual clock at 0
  {
    Tensor d = Tensor::zeros({16}, DType::F32, Device::SIM);
    VirtualClock& clock = VirtualClock::get();
    const double t0 = clock.compute_s();  // after the zeroing
    Tensor h = iota(16, MemPlace::Host);
    CopyPtr up = copy_async(d, h);
    EXPECT_DOUBLE_EQ(up->end_s(), t0 + 0.25 + 1.0);
    EXPECT_DOUBLE_EQ(clock.compute_s(), t0);  // compute did not wait
    clock.advance_compute(0.5);               // compute beside the copy
    CopyPtr up2 = copy_async(d, h);           // queued behind the first on the same stream
    EXPECT_DOUBLE_EQ(up2->end_s(), t0 + 2 * 1.25);
    CopyPtr down = copy_async(h, d);  // the other direction: its own stream, from the compute's time
    EXPECT_DOUBLE_EQ(down->end_s(), t0 + 0.5 + 1.25);
    up->wait();
    EXPECT_DOUBLE_EQ(clock.compute_s(), t0 + 1.25);  // waited for the copy's end, not more
    down->wait();
    EXPECT_DOUBLE_EQ(clock.compute_s(), t0 + 1.75);
    up2->wait();
    EXPECT_DOUBLE_EQ(clock.compute_s(), t0 + 2.5);
  }
  sim_gpu_clear();
  Allocator::get(Device::SIM).set_capacity_bytes(0);
}

TEST(CopyAsync, WaitStatsCountExposedTimeAndCopiesNeverWaitedFor) {
  GpuModel m = GpuModel::preset("h100");
  m.launch_s = 0.25;
  m.host_link_bytes_per_s = 64;  // 64 bytes: 1 s over the link
  sim_gpu_set(m);
  reset_copy_wait_stats();
  constexpr int kUp = static_cast<int>(VirtualClock::CopyDir::ToDevice);
  constexpr int kDown = static_cast<int>(VirtualClock::CopyDir::ToHost);
  {
    Tensor d = Tensor::zeros({16}, DType::F32, Device::SIM);
    VirtualClock& clock = VirtualClock::get();
    Tensor h = iota(16, MemPlace::Host);
    CopyPtr up = copy_async(d, h);  // ends 1.25 s after launch
    clock.advance_compute(1.0);     // 1 s of it hidden behind compute
    up->wait();                     // 0.25 s exposed
    up->wait();                     // a second wait exposes nothing more
    CopyPtr down = copy_async(h, d);
    clock.advance_compute(2.0);  // all of it hidden
    down->wait();
    copy_async(d, h);  // dropped without a wait
    const CopyWaitStats st = copy_wait_stats();
    EXPECT_DOUBLE_EQ(st.exposed_s[kUp], 0.25);
    EXPECT_DOUBLE_EQ(st.exposed_s[kDown], 0.0);
    EXPECT_EQ(st.waited[kUp], 1);
    EXPECT_EQ(st.waited[kDown], 1);
    EXPECT_EQ(st.unwaited[kUp], 1);
    EXPECT_EQ(st.unwaited[kDown], 0);
  }
  reset_copy_wait_stats();
  EXPECT_EQ(copy_wait_stats().waited[kUp], 0);
  sim_gpu_clear();
  Allocator::get(Device::SIM).set_capacity_bytes(0);
}

TEST(HostOps, AnOpOnHostMemoryTakesItsBytesAtTheHostsBandwidth) {
  GpuModel m = GpuModel::preset("h100");
  EXPECT_DOUBLE_EQ(m.host_memory_bytes_per_s, 50e9);  // docs/simulation.md rule 8's teaching value
  m.host_memory_bytes_per_s = 28e3;                   // AdamW on 1000 elements: 28,000 bytes, 1 s
  sim_gpu_set(m);
  {
    VirtualClock& clock = VirtualClock::get();
    const auto host = [] { return Tensor::zeros({1000}, DType::F32, Device::CPU, MemCategory::Other, MemPlace::Host); };
    Tensor w = host(), g = host(), mo = host(), v = host();
    const double t0 = clock.compute_s();
    adamw_update(w, g, mo, v, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
    EXPECT_DOUBLE_EQ(clock.compute_s(), t0 + 1.0);  // read w, g, m, v; write w, m, v: 7 x 4 bytes an element
    Tensor dw = Tensor::zeros({1000}), dg = Tensor::zeros({1000}), dm = Tensor::zeros({1000}),
           dv = Tensor::zeros({1000});
    adamw_update(dw, dg, dm, dv, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);  // the CPU "device"'s memory: not the host's
    EXPECT_DOUBLE_EQ(clock.compute_s(), t0 + 1.0);
  }
  sim_gpu_clear();
  Allocator::get(Device::SIM).set_capacity_bytes(0);
}

}  // namespace
}  // namespace scalelab
