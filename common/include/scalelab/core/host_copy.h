// host_copy.h — an asynchronous copy between host and device memory (cudaMemcpyAsync on a copy stream):
// how ZeRO-Offload (Ren et al., USENIX ATC 2021, Sec. 4.1) moves gradients down to the host and updated
// parameters back up over PCIe while the GPU computes. On the simulated GPU it is charged at the host link's
// bandwidth (GpuModel::copy_seconds) on the virtual clock's copy stream, so it overlaps compute; on the CPU
// backend it is a memcpy. Used by lab 04 part 3 (labs/04_fsdp/README.md "Part 3: offload").
// Tests: tests/common/core/test_host_copy.cpp
#pragma once

#include <memory>
#include <vector>

#include "scalelab/core/clock.h"   // defines: VirtualClock::CopyDir
#include "scalelab/core/tensor.h"  // defines: Tensor

namespace scalelab {

// One copy in flight. The source is read when the copy is launched (copy_async) and the destination is
// written when it is waited for (or, at the latest, when the handle is dropped): the latest moment a real
// asynchronous copy may land. So a program that reads the destination before waiting sees the old bytes on
// every backend, as it might on a GPU, and a check can catch the missing wait.
class CopyInFlight {
 public:
  CopyInFlight(Tensor dst, std::vector<char> bytes, double end_s, bool virtual_time, VirtualClock::CopyDir dir);
  ~CopyInFlight();  // lands the bytes if nobody waited (no clock wait; counted in CopyWaitStats::unwaited)
  CopyInFlight(const CopyInFlight&) = delete;
  CopyInFlight& operator=(const CopyInFlight&) = delete;

  // The bytes are in the destination; on the virtual clock the compute stream waits until the copy ends.
  void wait();
  double end_s() const { return end_s_; }  // when it ends on the copy stream, seconds (0: not simulated)

 private:
  void land();
  Tensor dst_;
  std::vector<char> bytes_;  // the bytes on the way (the link's, not a tensor: counted by no allocator)
  bool landed_ = false;
  double end_s_ = 0.0;
  bool virtual_time_ = false;
  VirtualClock::CopyDir dir_;
};
using CopyPtr = std::unique_ptr<CopyInFlight>;

// Starts copying src into dst (same numel and dtype): one side on the host (Device::CPU), the other on the
// device (CPU, SIM or CUDA). On the simulated GPU the copy stream of its direction (VirtualClock::CopyDir)
// runs it from max(compute, that stream)
// of its direction for GpuModel::copy_seconds (launch + bytes / host link), unless an UnchargedDeviceWork is open. A CUDA
// tensor is copied at once (synchronously) in this version. --timing-only: charged, no bytes moved (a host
// destination receives zeros, as Tensor::copy_from's does).
CopyPtr copy_async(Tensor dst, const Tensor& src);

// What the compute stream waited for, in virtual time, for the charged copies of this process (one rank),
// per direction (index static_cast<int>(VirtualClock::CopyDir)): how a schedule of copies shows on the GPU.
// exposed_s: the sum over wait() calls of max(0, the copy's end - the compute stream's time at the wait), in
// seconds: the copy time the compute stream did not hide (docs/simulation.md rule 5's exposed time, for
// copies). waited: copies waited for. unwaited: copies dropped without a wait (their bytes landed, but
// the compute stream never waited for them: a GPU program would read the destination too early). Lab 04's
// `offload_copies_overlap_on_simulated_h100` reads the uploads' figures (labs/04_fsdp/README.md "Part 3").
struct CopyWaitStats {
  double exposed_s[2] = {0.0, 0.0};
  long long waited[2] = {0, 0};
  long long unwaited[2] = {0, 0};
};
CopyWaitStats copy_wait_stats();  // since the process started or the last reset_copy_wait_stats()
void reset_copy_wait_stats();

}  // namespace scalelab
