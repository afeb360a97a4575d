// clock.h — the one clock every timing of the kit reads, and the virtual clock of a simulated GPU.
// Real runs (CPU ranks, GPUs) are timed by the wall clock (steady, ms since the process first asked). A run
// on the simulated GPU (Device::SIM, docs/simulation.md) is timed by a virtual clock instead: each op on a
// simulated device advances this rank's compute stream by its modelled time, each collective of the sim
// backend completes on the communication stream at the time the link model gives, and nothing sleeps. The
// same program, the same seed and the same options then give the same step times, bit for bit, however
// busy the machine is. Tests: tests/common/core/test_clock.cpp
#pragma once

namespace scalelab {

// Milliseconds on the kit's clock: the virtual compute stream's time while the virtual clock is on
// (VirtualClock::start), else the steady wall clock, 0 at its first use in the process. Communicator::now_ms,
// the training loop's step times and every timeline read this, so they line up with each other.
double clock_now_ms();
// True while the virtual clock is on: timings are simulated, deterministic, and must say so.
bool clock_is_virtual();
// Where clock_now_ms's wall-clock 0 lies on the steady clock's own epoch (boot, on Linux), in ms: processes
// of one machine compare their wall times through it (a message's send time, common/src/comm/comm.cpp).
double clock_wall_origin_steady_ms();
// The host is busy for ms (a padded compute, a slow rank, a slow loader: what a lab puts in on purpose):
// in real time it sleeps; on the virtual clock nothing sleeps, the compute stream advances by ms instead,
// so the time shows in the step exactly as asked. ms <= 0 does nothing.
void clock_pause_ms(double ms);

// The virtual clock of this process (one rank per process, as mpirun starts them). Two streams, as a GPU
// has: the compute stream, where ops run one after another, and the communication stream, where the
// collectives and messages of the sim backend run one after another, beside the compute (and a third, the
// copy streams, for asynchronous host <-> device copies). Times are
// seconds since start(). The host is taken to wait for the compute stream (every op is synchronous in
// virtual time), so "now" is the compute stream's time; overlap happens between the two streams.
// Thread-safe (the loader's prefetch thread may copy while the main thread computes), but the times are a
// function of the order of calls, so a run is deterministic only where that order is.
class VirtualClock {
 public:
  static VirtualClock& get();

  // Turns virtual time on (both streams at 0 s) or off. start() while on restarts at 0.
  void start();
  void stop();
  bool on() const;

  // The compute stream: when its last queued work ends (seconds), queue `seconds` more work (an op's
  // modelled time; >= 0), or wait for an event at t_s (the stream resumes at max(now, t_s): a Work::wait
  // of a collective that completes at t_s).
  double compute_s() const;
  void advance_compute(double seconds);
  void wait_compute_until(double t_s);
  // The simulated device's own work (an op, a copy, a memset: ops/dispatch.cpp, core/tensor.cpp), queued as
  // advance_compute queues it, unless an UnchargedDeviceWork is open on the calling thread: then dropped.
  void charge_device(double seconds);

  // The communication stream: when its last queued call ends. The sim backend starts a call at
  // max(compute_s(), comm_s()) and sets comm_s to its completion.
  double comm_s() const;
  void set_comm_s(double t_s);

  // The copy streams: host <-> device copies over the host link (core/host_copy.h copy_async), beside the
  // compute and communication streams, as a GPU's copy engines run beside its kernels. One per direction
  // (PCIe is full duplex; a GPU has a copy engine each way). A copy starts at max(compute_s(),
  // copy_s(its direction)) and sets that stream's time to its end.
  enum class CopyDir { ToHost, ToDevice };
  double copy_s(CopyDir dir) const;
  void set_copy_s(CopyDir dir, double t_s);

 private:
  VirtualClock() = default;
};

// While one lives, the simulated device's work on this thread queues nothing (VirtualClock::charge_device):
// a caller that times a piece of work by a figure of its own REPLACES the ops' charges with it (lab 06's
// uniform compute: a chunk's forward then takes exactly that long, whatever its ops), or leaves out work a
// GPU program would not do (lab 06's staging copy of a message). Pauses (clock_pause_ms) and waits
// (wait_compute_until) still count. Scopes nest; on the wall clock they change nothing.
class UnchargedDeviceWork {
 public:
  UnchargedDeviceWork();
  ~UnchargedDeviceWork();
  UnchargedDeviceWork(const UnchargedDeviceWork&) = delete;
  UnchargedDeviceWork& operator=(const UnchargedDeviceWork&) = delete;
  static bool open();  // true while one lives on the calling thread
};

}  // namespace scalelab
