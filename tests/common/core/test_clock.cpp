// test_clock.cpp — the kit's clock and the virtual clock (scalelab/core/clock.h), and the simulated GPU's
// memory (Device::SIM): host memory, counted by its own allocator, copied like any other.
#include <gtest/gtest.h>

#include "scalelab/core/allocator.h"  // defines: Allocator, Device
#include "scalelab/core/clock.h"      // defines: VirtualClock, UnchargedDeviceWork, clock_now_ms, clock_is_virtual
#include "scalelab/core/error.h"      // defines: scalelab::Error
#include "scalelab/core/tensor.h"     // defines: Tensor

namespace scalelab {
namespace {

// Stops the virtual clock when a test ends, so the next test (same process) starts on the wall clock.
struct VirtualClockGuard {
  VirtualClockGuard() { VirtualClock::get().start(); }
  ~VirtualClockGuard() { VirtualClock::get().stop(); }
};

TEST(Clock, WallClockMovesForwardAndIsNotVirtual) {
  ASSERT_FALSE(clock_is_virtual());
  const double a = clock_now_ms();
  volatile double sink = 0;
  for (int i = 0; i < 100000; i++) sink = sink + i;
  EXPECT_GE(clock_now_ms(), a);
}

TEST(Clock, VirtualTimeIsWhatTheComputeStreamWasGiven) {
  VirtualClockGuard guard;
  ASSERT_TRUE(clock_is_virtual());
  EXPECT_EQ(clock_now_ms(), 0.0);
  VirtualClock::get().advance_compute(0.25);
  VirtualClock::get().advance_compute(0.5);
  EXPECT_EQ(clock_now_ms(), 750.0);  // exact: 0.25 + 0.5 is exact in binary
  // A wait for an event in the past changes nothing; one in the future moves the stream to it.
  VirtualClock::get().wait_compute_until(0.1);
  EXPECT_EQ(VirtualClock::get().compute_s(), 0.75);
  VirtualClock::get().wait_compute_until(2.0);
  EXPECT_EQ(VirtualClock::get().compute_s(), 2.0);
  // The communication stream is apart from it.
  VirtualClock::get().set_comm_s(3.0);
  EXPECT_EQ(VirtualClock::get().comm_s(), 3.0);
  EXPECT_EQ(VirtualClock::get().compute_s(), 2.0);
  EXPECT_THROW(VirtualClock::get().advance_compute(-1.0), Error);
}

TEST(Clock, APauseSleepsInRealTimeAndAdvancesTheComputeStreamInVirtualTime) {
  const double a = clock_now_ms();
  clock_pause_ms(20.0);
  EXPECT_GE(clock_now_ms() - a, 19.0);  // slept (the steady clock's ms; a little early at most by rounding)
  VirtualClockGuard guard;
  VirtualClock::get().advance_compute(0.5);
  clock_pause_ms(250.0);
  EXPECT_EQ(clock_now_ms(), 750.0);  // exact: nothing slept, the stream took the 250 ms
  EXPECT_EQ(VirtualClock::get().comm_s(), 0.0);
  clock_pause_ms(0.0);
  clock_pause_ms(-5.0);
  EXPECT_EQ(clock_now_ms(), 750.0);
}

TEST(Clock, RestartingTheVirtualClockStartsBothStreamsAtZero) {
  VirtualClockGuard guard;
  VirtualClock::get().advance_compute(1.0);
  VirtualClock::get().set_comm_s(1.0);
  VirtualClock::get().start();
  EXPECT_EQ(VirtualClock::get().compute_s(), 0.0);
  EXPECT_EQ(VirtualClock::get().comm_s(), 0.0);
}

TEST(Clock, DeviceWorkInsideAnUnchargedScopeQueuesNothing) {
  VirtualClockGuard guard;
  VirtualClock::get().charge_device(0.25);  // device work: queued
  {
    UnchargedDeviceWork outer;
    UnchargedDeviceWork inner;  // nests
    EXPECT_TRUE(UnchargedDeviceWork::open());
    VirtualClock::get().charge_device(1.0);  // dropped: the caller times it by a figure of its own
    clock_pause_ms(500.0);                   // a pause still counts
  }
  EXPECT_FALSE(UnchargedDeviceWork::open());
  EXPECT_EQ(clock_now_ms(), 750.0);
  VirtualClock::get().charge_device(0.25);  // queued again once the scopes have closed
  EXPECT_EQ(clock_now_ms(), 1000.0);
}

TEST(SimDevice, MemoryIsCountedApartFromTheHostsAndCopiesBothWays) {
  const int64_t sim_before = Allocator::get(Device::SIM).stats().total_current_bytes;
  const int64_t cpu_before = Allocator::get(Device::CPU).stats().total_current_bytes;
  Tensor h = Tensor::empty({4}, DType::F32, Device::CPU);
  for (int i = 0; i < 4; i++) h.data<float>()[i] = 1.5f * i;
  {
    Tensor d = Tensor::zeros({4}, DType::F32, Device::SIM);
    EXPECT_EQ(d.device(), Device::SIM);
    EXPECT_STREQ(device_name(d.device()), "sim");
    EXPECT_EQ(Allocator::get(Device::SIM).stats().total_current_bytes, sim_before + 16);
    EXPECT_EQ(Allocator::get(Device::CPU).stats().total_current_bytes, cpu_before + 16);  // h only
    d.copy_from(h);
    Tensor back = Tensor::zeros({4}, DType::F32, Device::CPU);
    back.copy_from(d);
    for (int i = 0; i < 4; i++) EXPECT_EQ(back.data<float>()[i], 1.5f * i);
  }
  EXPECT_EQ(Allocator::get(Device::SIM).stats().total_current_bytes, sim_before);
}

}  // namespace
}  // namespace scalelab
