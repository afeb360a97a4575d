// sim.cpp — the `sim` communicator (comm.h): one simulated GPU per rank (Device::SIM). NCCL's contract
// (SIM tensors only; calls in order on this rank's communication stream) with the bytes moved over MPI and
// every call timed in virtual time by the link model and the topology (docs/simulation.md "Virtual time:
// the rules" 4-6). Nothing sleeps and nothing reads the wall clock: the same program gives the same times.
//
//   transports  two mpi communicators of the same members (make_mpi_communicator(/*sim_transport=*/true)):
//               `bytes` is handed the SIM tensors themselves (their memory is host memory; it would refuse
//               them otherwise) and moves the payloads; `clock` carries the virtual times, 8 bytes a call.
//               Neither has a link model, so neither times or sleeps; split() splits both alike. The
//               times travel apart from the payloads so that learning a call's start never waits for
//               someone else's large transfer.
//   start       a call starts on this rank's stream at max(compute_s at issue, comm_s) (rule 4). A
//               collective all-gathers its members' starts on `clock`, issued with it: it starts at the
//               latest of them and ends link.seconds(op, payload bytes, n) later. A send's start travels
//               to the receiver on `clock` (in the order of the payloads); the send ends start +
//               modelled, the recv at max(its own start, the send's start + modelled).
//   the stream  one per rank (VirtualClock's comm_s; every communicator of the process shares it). A
//               collective starts after everything issued before it; sends and recvs issued one after
//               another run side by side, each from max(its issue, the end of the last collective), as
//               NCCL runs a group's sends and recvs at once (the nccl backend groups them; a pipeline
//               stage sends and receives at once); the next collective starts after all of them.
//   resolving   a call's end needs its peers' starts, which arrive in real time: the end is worked out
//               when it is needed (wait, test, or the next call on the stream, whose start depends on it),
//               blocking until the peers have issued the call. When that happens never changes a time.
//   wait        compute_s = max(compute_s, end) (rule 5); the advance is the event's wait_ms. test() is
//               true iff end <= compute_s: deterministic, never the wall clock.
//   events      issue, start and end in virtual ms (Communicator::now_ms() is the compute stream's time); a
//               collective's start is the latest start of its members; modeled_ms is the link's time.
// --timing-only (core/sim_gpu.h sim_skips_data): the payloads stay where they are; each call still sends
// its header (the virtual start on `clock`) and is charged link.seconds of its real payload bytes.
// Device code: the transport reads and writes the SIM tensors' memory through raw() on its own thread;
// nothing here touches it. Tests: tests/common/comm/test_sim_comm_mpi.cpp
#include <algorithm>  // defines: std::max
#include <cstdio>     // defines: std::fprintf
#include <cstdlib>    // defines: std::_Exit
#include <cstring>    // defines: std::memcpy
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm_internal.h"  // defines: EventLog, make_event, check_*, check_on_device, default_topology
#include "scalelab/comm/comm.h"
#include "scalelab/core/clock.h"  // defines: VirtualClock
#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT
#include "scalelab/core/sim_gpu.h"  // defines: sim_gpu_active, sim_gpu (the node's link of the default topology), sim_skips_data

namespace scalelab::comm_detail {

namespace {

// One call on the communication stream, shared by its Work and the stream.
struct SimCall {
  bool collective = false;  // else a send or a recv
  double start_s = 0;       // this rank's start on its stream, virtual seconds
  double modeled_s = 0;     // the link model's seconds for the call
  bool resolved = false;    // end_s is known
  double end_s = 0;         // when the call ends, virtual seconds
  WorkPtr bytes;            // the payload's call on the `bytes` transport (null: a barrier; dropped once waited)
  WorkPtr times;            // a collective: the all-gather of the starts; a recv: the send's start; a send: it
  Tensor times_out;         // (2 size) i32 every member's start, or (2) i32 the send's start: doubles' bytes
  std::shared_ptr<EventLog> log;
  uint64_t event_id = 0;
};

// A virtual time as the two i32 words a transport moves (its 8 bytes), and back.
Tensor time_tensor(double t_s) {
  Tensor t = Tensor::empty({2}, DType::I32, Device::CPU, MemCategory::Comm);  // (2) i32: one double
  std::memcpy(t.raw(), &t_s, sizeof(double));
  return t;
}
double time_at(const Tensor& t, int64_t i) {
  double t_s = 0;
  std::memcpy(&t_s, static_cast<const char*>(t.raw()) + i * sizeof(double), sizeof(double));
  return t_s;
}

// This rank's communication stream (rule 4): the calls whose end is not folded into comm_s yet. Either one
// collective, or sends and recvs issued one after another.
class SimStream {
 public:
  static SimStream& get() {
    static SimStream stream;
    return stream;
  }

  // The start of a call issued now: max(compute_s, comm_s), once the calls it must follow are resolved
  // (a collective follows everything; a send or recv follows the open collective, not its fellow sends and
  // recvs). Blocks until their peers have issued them.
  double start(bool collective) {
    std::lock_guard<std::mutex> lock(mu_);
    if (collective || (!open_.empty() && open_.front()->collective)) settle();
    VirtualClock& vc = VirtualClock::get();
    return std::max(vc.compute_s(), vc.comm_s());
  }
  void add(std::shared_ptr<SimCall> call) {
    std::lock_guard<std::mutex> lock(mu_);
    open_.push_back(std::move(call));
  }

  // Works out the call's end (blocking for its peers' times), and nothing else: test() asks.
  double end_of(const std::shared_ptr<SimCall>& call) {
    std::lock_guard<std::mutex> lock(mu_);
    resolve_one(*call);
    return call->end_s;
  }

  // Works out the call's end and folds it into comm_s: a collective with everything before it, a send or
  // recv alone, as the compute stream is about to wait for it (any later call starts after that anyway;
  // its fellow sends and recvs are not waited for).
  void resolve(const std::shared_ptr<SimCall>& call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (call->collective) {
      if (std::find(open_.begin(), open_.end(), call) != open_.end()) settle();
      resolve_one(*call);  // (already settled: nothing to do)
      return;
    }
    resolve_one(*call);
    const auto at = std::find(open_.begin(), open_.end(), call);
    if (at == open_.end()) return;
    open_.erase(at);
    VirtualClock& vc = VirtualClock::get();
    vc.set_comm_s(std::max(vc.comm_s(), call->end_s));
  }

 private:
  // Resolves every open call, in order; comm_s becomes the latest end (mu_ held).
  void settle() {
    VirtualClock& vc = VirtualClock::get();
    for (const std::shared_ptr<SimCall>& call : open_) {
      resolve_one(*call);
      vc.set_comm_s(std::max(vc.comm_s(), call->end_s));
    }
    open_.clear();
  }

  // Rule 4: a collective ends at the latest start of its members + modelled; a recv at max(its start, the
  // send's start + modelled). A send was resolved when it was issued.
  static void resolve_one(SimCall& call) {
    if (call.resolved) return;
    call.times->wait();  // the peers' starts: rethrows the transport's error (a wait timeout) if any
    double start_s = call.start_s;
    if (call.collective) {
      for (int64_t r = 0; r < call.times_out.numel() / 2; ++r) start_s = std::max(start_s, time_at(call.times_out, r));
      call.end_s = start_s + call.modeled_s;
      call.log->set_start(call.event_id, 1e3 * start_s);
    } else {
      call.end_s = std::max(call.start_s, time_at(call.times_out, 0) + call.modeled_s);
    }
    call.times = nullptr;
    call.times_out = Tensor();
    call.resolved = true;
    call.log->set_end(call.event_id, 1e3 * call.end_s);
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<SimCall>> open_;
};

class SimWork : public Work {
 public:
  explicit SimWork(std::shared_ptr<SimCall> call) : call_(std::move(call)) {}
  ~SimWork() override {
    // As on the other backends, an unfinished Work waits (and the compute stream with it).
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[scalelab] an operation of the sim backend nobody waited for failed:\n%s\n", e.what());
    }
  }
  // Rule 5: the compute stream waits for the call's end; the time it adds is the call's exposed time.
  void wait() override {
    SimStream::get().resolve(call_);
    if (call_->bytes) {
      call_->bytes->wait();  // the payload is in place (real time); rethrows the transport's error
      call_->bytes = nullptr;
    }
    VirtualClock& vc = VirtualClock::get();
    const double before_s = vc.compute_s();
    vc.wait_compute_until(call_->end_s);
    call_->log->add_wait(call_->event_id, 1e3 * std::max(0.0, call_->end_s - before_s));
  }
  // Finished iff the call ends by the compute stream's time. Then the payload is waited for too: as on a GPU,
  // a finished call's bytes are in place.
  bool test() override {
    if (SimStream::get().end_of(call_) > VirtualClock::get().compute_s()) return false;
    SimStream::get().resolve(call_);
    if (call_->bytes) {
      call_->bytes->wait();
      call_->bytes = nullptr;
    }
    return true;
  }

 private:
  std::shared_ptr<SimCall> call_;
};

class SimCommunicator : public Communicator {
 public:
  // bytes and clock: two mpi communicators of the same members in the same order (make_mpi_communicator's
  // or split alike); the group `name` with the topology it inherits.
  SimCommunicator(std::unique_ptr<Communicator> bytes, std::unique_ptr<Communicator> clock, const std::string& name,
                  const Topology& topology)
      : bytes_(std::move(bytes)), clock_(std::move(clock)) {
    init_group(name, bytes_->world_ranks(), topology);
  }

  using Communicator::split;  // the two-argument form

  int rank() const override { return bytes_->rank(); }
  int size() const override { return bytes_->size(); }
  std::string backend() const override { return "sim"; }
  Device device() const override { return Device::SIM; }

  // --- collectives: the checks of the nccl backend, then the call on both transports --------------
  WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag) override {
    check_on_device(*this, "all_reduce", buf);
    check_reduce_dtype("all_reduce", rank(), size(), buf.dtype(), op);
    check_count_fits_int("all_reduce", rank(), buf.numel());
    return collective("all_reduce", tag, buf.numel(), buf.dtype(), -1,
                      [&] { return bytes_->all_reduce_async(buf, op, tag); });
  }

  WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag) override {
    check_on_device(*this, "reduce_scatter", in);
    check_on_device(*this, "reduce_scatter", out);
    check_reduce_dtype("reduce_scatter", rank(), size(), in.dtype(), op);
    check_reduce_scatter(rank(), size(), in, out);
    check_count_fits_int("reduce_scatter", rank(), in.numel());
    return collective("reduce_scatter", tag, in.numel(), in.dtype(), -1,
                      [&] { return bytes_->reduce_scatter_async(in, out, op, tag); });
  }

  WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag) override {
    check_on_device(*this, "all_gather", in);
    check_on_device(*this, "all_gather", out);
    check_all_gather(rank(), size(), in, out);
    check_count_fits_int("all_gather", rank(), out.numel());
    return collective("all_gather", tag, in.numel(), in.dtype(), -1,
                      [&] { return bytes_->all_gather_async(in, out, tag); });
  }

  WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag) override {
    check_on_device(*this, "broadcast", buf);
    check_root("broadcast", rank(), size(), root);
    check_count_fits_int("broadcast", rank(), buf.numel());
    return collective("broadcast", tag, buf.numel(), buf.dtype(), root,
                      [&] { return bytes_->broadcast_async(buf, root, tag); });
  }

  // Every rank has called it when the starts have been exchanged: no payload. It ends, in virtual time,
  // at the latest start + the link's barrier time, and the compute stream waits for that.
  void barrier() override {
    collective("barrier", "", 0, DType::F32, -1, [] { return WorkPtr(); })->wait();
  }

  // --- point to point ------------------------------------------------------------------------
  WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag) override {
    check_on_device(*this, "send", buf);
    check_peer("send", rank(), size(), peer);
    check_count_fits_int("send", rank(), buf.numel());
    CommEvent e;
    auto call = issue("send", tag, buf.numel(), buf.dtype(), peer, e);
    if (!sim_skips_data()) call->bytes = bytes_->send_async(buf, peer, tag);  // --timing-only: the header alone
    call->times = clock_->send_async(time_tensor(call->start_s), peer, tag);  // its start, after the payload
    call->end_s = call->start_s + call->modeled_s;                            // a send's end is its own
    call->resolved = true;
    e.end_ms = 1e3 * call->end_s;
    return record(call, std::move(e));
  }

  WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag) override {
    check_on_device(*this, "recv", buf);
    check_peer("recv", rank(), size(), peer);
    check_count_fits_int("recv", rank(), buf.numel());
    CommEvent e;
    auto call = issue("recv", tag, buf.numel(), buf.dtype(), peer, e);
    if (!sim_skips_data()) call->bytes = bytes_->recv_async(buf, peer, tag);
    call->times_out = Tensor::empty({2}, DType::I32, Device::CPU, MemCategory::Comm);  // (2) i32: the send's start
    call->times = clock_->recv_async(call->times_out, peer, tag);
    return record(call, std::move(e));
  }

  // --- the rest ------------------------------------------------------------------------------
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_color(rank(), size(), color);
    sync_wait_timeout();
    std::unique_ptr<Communicator> bytes = bytes_->split(color, key, name);
    std::unique_ptr<Communicator> clock = clock_->split(color, key, name);
    if (bytes == nullptr) return nullptr;  // kNoColor: this rank joins no group
    auto sub = std::make_unique<SimCommunicator>(std::move(bytes), std::move(clock), name, topology());
    sub->set_wait_timeout(wait_timeout());  // a child starts with its parent's timeout (comm.h)
    return sub;
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    bytes_->abort(exit_code, why);  // MPI_Abort: ends every rank
    std::_Exit(exit_code);          // not reached (the compiler cannot see that through the virtual call)
  }

  std::vector<CommEvent> events() const override { return log_->snapshot(); }
  void clear_events() override { log_->clear(); }

 private:
  // The virtual clock must be on: every time here is read from it.
  void check_clock(const char* op) const {
    SL_CHECK_HINT(VirtualClock::get().on(),
                  "run with --device sim (it starts the virtual clock); a test starts it with "
                  "VirtualClock::get().start()",
                  "%s on rank %d of %d (sim backend): the virtual clock is off", op, rank(), size());
  }

  // The transports wait as long as this communicator would (set_wait_timeout applies to later calls).
  void sync_wait_timeout() {
    if (bytes_->wait_timeout() != wait_timeout()) bytes_->set_wait_timeout(wait_timeout());
    if (clock_->wait_timeout() != wait_timeout()) clock_->set_wait_timeout(wait_timeout());
  }

  // A new call issued now: its start on the stream and its modelled time; its event in `e`, for record().
  std::shared_ptr<SimCall> issue(const char* name, const std::string& tag, int64_t count, DType dtype, int peer,
                                 CommEvent& e) {
    check_clock(name);
    sync_wait_timeout();
    auto call = std::make_shared<SimCall>();
    call->collective = std::strcmp(name, "send") != 0 && std::strcmp(name, "recv") != 0;
    call->start_s = SimStream::get().start(call->collective);
    call->modeled_s = link_model().seconds(name, count * static_cast<int64_t>(dtype_size(dtype)), size());
    const bool async = !issuing_blocking_call() && std::strcmp(name, "barrier") != 0;
    e = make_event(*this, name, tag, count, dtype, async, peer);
    e.start_ms = 1e3 * call->start_s;  // a collective's becomes its members' latest when it is resolved
    return call;
  }

  // The call's event in the log, the call on the stream, and its Work.
  WorkPtr record(const std::shared_ptr<SimCall>& call, CommEvent&& e) {
    call->log = log_;
    call->event_id = log_->add(std::move(e));
    SimStream::get().add(call);
    // The transports' own logs are of no use (their times are not the call's): kept empty.
    bytes_->clear_events();
    clock_->clear_events();
    return std::make_shared<SimWork>(call);
  }

  // A collective: the payload's call (move_bytes) on `bytes`, then this rank's start to every member on
  // `clock`. The checks ran before, so neither transport refuses it on one rank only.
  template <typename F>
  WorkPtr collective(const char* name, const std::string& tag, int64_t count, DType dtype, int peer, F&& move_bytes) {
    CommEvent e;
    auto call = issue(name, tag, count, dtype, peer, e);
    if (!sim_skips_data()) call->bytes = move_bytes();  // --timing-only: the times travel, the payload does not
    call->times_out = Tensor::empty({2 * size()}, DType::I32, Device::CPU, MemCategory::Comm);  // (2 size) i32
    call->times = clock_->all_gather_async(time_tensor(call->start_s), call->times_out, tag);
    return record(call, std::move(e));
  }

  std::unique_ptr<Communicator> bytes_;                           // moves the payloads (SIM tensors)
  std::unique_ptr<Communicator> clock_;                           // moves the virtual times
  std::shared_ptr<EventLog> log_ = std::make_shared<EventLog>();  // shared with the calls (a Work may outlive us)
};

// Without a link model set, a simulated cluster's groups use the active GPU model's link inside a node
// (GpuModel::intra_node_link: NVLink for the SXM parts, PCIe for a card without it; NVLink when no model
// is active) and InfiniBand across nodes (link_model.cpp: the presets and their sources); --link,
// --inter-link set others.
Topology sim_default_topology(int world_size) {
  Topology t = default_topology(world_size);
  t.intra = LinkModel::preset(sim_gpu_active() ? sim_gpu().intra_node_link : "nvlink");
  t.inter = LinkModel::preset("infiniband");
  return t;
}

}  // namespace

std::unique_ptr<Communicator> make_sim_communicator(std::unique_ptr<Communicator> bytes,
                                                    std::unique_ptr<Communicator> clock) {
  const int world_size = bytes->size();
  return std::make_unique<SimCommunicator>(std::move(bytes), std::move(clock), "world",
                                           sim_default_topology(world_size));
}

}  // namespace scalelab::comm_detail
