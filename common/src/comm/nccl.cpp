// nccl.cpp — the `nccl` communicator (comm.h): one GPU per rank, NCCL collectives on a
// communication stream. Compiled where CUDA, MPI and NCCL are found (SL_WITH_NCCL, common/CMakeLists.txt).
// UNVERIFIED: it compiles in CI, but several ranks need several GPUs, which the development machines
// do not have; treat it as a sketch until it has run. CPU twin: common/src/comm/mpi.cpp
//
//   bootstrap   MPI: rank 0 makes the ncclUniqueId and broadcasts it; GPU = the rank's index among the
//               ranks of its node (MPI_COMM_TYPE_SHARED) modulo the GPUs it sees (gpu_assignment.h). Two
//               ranks on one GPU are refused before NCCL would fail ("Duplicate GPU detected"): the device
//               UUIDs of all ranks are compared.
//   streams     every call waits for the compute stream (the legacy default stream, where the kit's
//               kernels run) with an event, runs on the communication stream, and records a done
//               event; wait() makes the compute stream wait for it and polls the host until it fired.
//               Each op holds its tensors until then (Op::buffers), so none goes back to the caching
//               allocator while NCCL's stream may still use it.
//   send/recv   NCCL runs a send and a recv that cross (a ring exchange) only inside one
//               ncclGroupStart/End, so consecutive sends and recvs are held back and launched together
//               at the next wait(), collective, barrier or split.
//   times       start_ms is when the call was enqueued, end_ms when wait()/test() first saw it done (an
//               upper bound). A link model makes wait() return no earlier than start + modelled; a
//               recv's no earlier than its SEND's start + modelled: the send's start travels in a
//               header (comm_internal.h MessageHeader), an MPI message on the communicator's MPI twin.
//               wait_ms is the host time blocked in wait(), 0 if the done event had fired by then.
//   groups      every NCCL communicator has an MPI twin of the same members in the same order (split
//               alike: ncclCommSplit and MPI_Comm_split both order by key, then by old rank), which
//               says the world ranks of the group (NCCL cannot) and carries the sends' headers.
//   errors      wait() never blocks in CUDA: it polls the done event (cudaEventQuery) and NCCL's
//               asynchronous error (ncclCommGetAsyncError) with a short back-off (poll_wait.h), so a dead
//               peer ends the wait with an error naming the rank, group, op, peer and NCCL's words
//               instead of hanging it for ever. Untested: a dead peer needs two GPUs.
//   timeout     with a wait timeout (comm.h set_wait_timeout) that loop has a deadline, and the MPI header
//               (MPI_Test) is polled against it too; it throws naming the rank, group, op, peer and tag
//               (not the other pending ops: nothing here lists them). After a timeout or an asynchronous
//               error the communicator takes no new calls and its destructor aborts NCCL (ncclCommAbort,
//               which ends the kernels that wait for a peer) instead of synchronising, and cancels the
//               unfinished headers (MPI_Cancel). Untested: one GPU here.
//   same call   before a collective is enqueued, the ranks compare it (op, count, dtype, root) on the MPI
//               twin, as the mpi backend does: other sizes are refused on every rank with every rank's
//               call named, never a kernel past a buffer (check_same_call). Untested: one GPU here.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_internal.h"  // defines: EventLog, make_event, check_*, mpi_init_once, MessageHeader, describe_wait
#include "mpi_internal.h"   // defines: SL_MPI_CALL, mpi_world_ranks, mpi_split_color
#include "scalelab/comm/comm.h"
#include "scalelab/comm/gpu_assignment.h"  // defines: gpu_for_local_rank, first_shared_gpu
#include "scalelab/comm/poll_wait.h"       // defines: poll_until, PollLoop, PollOutcome
#include "scalelab/core/cuda_check.h"      // defines: SL_CUDA_CHECK (cuda_runtime.h)
#include "scalelab/core/error.h"

#define SL_NCCL_CHECK(call)                                                                                    \
  do {                                                                                                         \
    const ncclResult_t sl_nccl_rc_ = (call);                                                                   \
    if (sl_nccl_rc_ != ncclSuccess)                                                                            \
      ::scalelab::detail::fail("NCCL", #call, __FILE__, __LINE__, __func__,                                    \
                               ::scalelab::detail::format("NCCL error '%s'", ncclGetErrorString(sl_nccl_rc_)), \
                               "NCCL_DEBUG=INFO shows what NCCL tried; with several ranks on one GPU "         \
                               "use --backend mpi");                                                           \
  } while (0)

namespace scalelab::comm_detail {

namespace {

// The kit's kernels run on the legacy default stream (common/src/ops/cuda/).
const cudaStream_t kComputeStream = cudaStreamLegacy;

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// One call: its done event and its place in the event log.
struct Op {
  uint64_t event_id = 0;
  double start_ms = 0;       // enqueued (a send's start, which its header carries)
  double modeled_ms = 0;     // the link model's time
  double not_before_ms = 0;  // start + modelled (link model); a recv: its send's start + modelled
  bool is_send = false, is_recv = false;
  MessageHeader header;  // sends and recvs: the send's start, over MPI (posted at launch)
  MPI_Request header_request = MPI_REQUEST_NULL;
  cudaEvent_t done = nullptr;
  int peer = -1;          // sends and recvs: the other rank
  bool launched = false;  // sends/recvs wait in State::pending until launched together
  bool finished = false;
  std::function<void()> launch;  // sends and recvs: the ncclSend / ncclRecv call (it holds its tensor)
  // Collectives: the tensors NCCL reads or writes, held until wait() has seen the done event. Without
  // this, a caller that drops its last reference before wait() (against comm.h's rule) would return the
  // block to the caching allocator (allocator.cpp), which hands it at once to the next default-stream
  // kernel while NCCL's stream still uses it; cudaFree used to synchronise the device and hide that.
  std::vector<Tensor> buffers;
  // The wait timeout (comm.h set_wait_timeout), taken when the op was issued.
  double timeout_s = 0;      // seconds; 0: wait forever
  std::string waited_for;    // "recv from rank 0 (world rank 0), tag 'activation'"
  bool abandoned = false;    // its wait timed out: never waited for again
  std::exception_ptr error;  // that timeout, rethrown by a second wait()
};

// What the communicator and its Works share (a Work may outlive its communicator).
struct State {
  ncclComm_t comm = nullptr;
  MPI_Comm mpi = MPI_COMM_NULL;  // the MPI twin: the same members in the same order
  int device = 0;
  cudaStream_t stream = nullptr;  // the communication stream
  cudaEvent_t ready = nullptr;    // "the compute stream got this far", recorded before each call
  EventLog log;
  std::mutex mu;                             // pending and the Ops' flags
  std::vector<std::shared_ptr<Op>> pending;  // sends/recvs not yet launched
  std::string who;                           // "rank 1 of group 'pp' (world rank 1)", for timeouts' messages
  std::atomic<bool> timed_out{false};        // a wait timed out: no new calls; abort NCCL at the end
  std::atomic<bool> broken{false};           // NCCL reported an asynchronous error: the same

  ~State() {
    cudaSetDevice(device);
    // After a timeout or an asynchronous error the stream may hold a kernel that waits for a peer forever:
    // abort first.
    if (unusable() && comm) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    if (stream) cudaStreamSynchronize(stream);
    if (comm) ncclCommDestroy(comm);
    if (ready) cudaEventDestroy(ready);
    if (stream) cudaStreamDestroy(stream);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && mpi != MPI_COMM_NULL) MPI_Comm_free(&mpi);
  }

  // A wait timed out or NCCL reported an error: no new calls, and the destructor aborts NCCL.
  bool unusable() const { return timed_out || broken; }

  // NCCL's asynchronous error of this communicator (ncclCommGetAsyncError), or ncclSuccess: a peer that died
  // or a network error shows here while the kernel waiting for that peer never ends.
  ncclResult_t async_error() const {
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return q;
    return r == ncclInProgress ? ncclSuccess : r;  // non-blocking communicators: an op still under way
  }

  // The communication stream waits for the work queued so far on the compute stream.
  void order_after_compute() {
    SL_CUDA_CHECK(cudaEventRecord(ready, kComputeStream));
    SL_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
  }

  // Launches the held-back sends and recvs as one NCCL group.
  void flush_p2p() {
    std::lock_guard<std::mutex> lock(mu);
    if (pending.empty()) return;
    SL_CUDA_CHECK(cudaSetDevice(device));
    order_after_compute();
    SL_NCCL_CHECK(ncclGroupStart());
    for (const auto& op : pending) op->launch();
    SL_NCCL_CHECK(ncclGroupEnd());
    for (const auto& op : pending) {
      SL_CUDA_CHECK(cudaEventRecord(op->done, stream));
      op->launched = true;
      // The header, in the order of the payloads (MPI keeps the order between two ranks per tag).
      if (op->is_send) {
        op->header.send_start_host_ms = to_host_clock_ms(op->start_ms);
        SL_MPI_CALL(MPI_Isend(&op->header, sizeof(MessageHeader), MPI_BYTE, op->peer, kHeaderTag, mpi,
                              &op->header_request));
      } else if (op->is_recv) {
        SL_MPI_CALL(MPI_Irecv(&op->header, sizeof(MessageHeader), MPI_BYTE, op->peer, kHeaderTag, mpi,
                              &op->header_request));
      }
    }
    pending.clear();
  }
  static constexpr int kHeaderTag = 1;
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<State> st, std::shared_ptr<Op> op) : st_(std::move(st)), op_(std::move(op)) {}
  ~NcclWork() override {
    // Not after a timeout (this op's, or another's on this communicator while this one is unfinished):
    // waiting could hang; the communicator's destructor aborts NCCL instead.
    if (op_->abandoned || (st_->unusable() && !op_->finished)) {
      abandon();
    } else {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[scalelab] an NCCL operation nobody waited for failed:\n%s\n", e.what());
        if (op_->abandoned) abandon();
      }
    }
    cudaEventDestroy(op_->done);
  }
  void wait() override {
    if (op_->abandoned) std::rethrow_exception(op_->error);  // its timeout, again, at once
    // wait_ms: the host time blocked here, unless the op (and its modelled time) had already finished.
    const double t0_ms = Communicator::now_ms();
    const bool done_before = op_->launched && cudaEventQuery(op_->done) == cudaSuccess &&
                             complete_header(/*block=*/false) && t0_ms >= op_->not_before_ms;
    if (!op_->launched) st_->flush_p2p();
    // Always polled (poll_wait.h), never cudaEventSynchronize: a blocking wait would not see NCCL's
    // asynchronous error when a peer dies (the kernel waiting for it never ends), and could not time out.
    // The compute stream waits for the event only once it has fired, so an op given up leaves no later
    // kernel waiting behind it.
    PollLoop loop;
    loop.done = [this] { return event_fired(); };
    loop.failed = [this] { return st_->async_error() != ncclSuccess; };
    loop.now_ms = [] { return Communicator::now_ms(); };
    loop.sleep_ms = [](double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); };
    loop.deadline_ms = op_->timeout_s > 0 ? t0_ms + 1e3 * op_->timeout_s : 0;
    switch (poll_until(loop)) {
      case PollOutcome::Done: break;
      case PollOutcome::Failed: fail_async(st_->async_error());
      case PollOutcome::Deadline: time_out(Communicator::now_ms() - t0_ms);
    }
    if (op_->timeout_s > 0) {
      while (!complete_header(/*block=*/false)) {
        if (Communicator::now_ms() >= loop.deadline_ms) time_out(Communicator::now_ms() - t0_ms);
        std::this_thread::sleep_for(kPollInterval);
      }
    }
    SL_CUDA_CHECK(cudaStreamWaitEvent(kComputeStream, op_->done, 0));  // later kernels see the result
    op_->buffers.clear();  // NCCL is done with them: they may go back to the allocator now
    complete_header(/*block=*/true);
    mark_finished();
    sleep_until_ms(op_->not_before_ms);
    if (!done_before) st_->log.add_wait(op_->event_id, Communicator::now_ms() - t0_ms);
  }
  bool test() override {
    if (!op_->launched) return false;
    if (!event_fired()) {
      const ncclResult_t r = st_->async_error();
      if (r != ncclSuccess) fail_async(r);
      return false;
    }
    if (!complete_header(/*block=*/false)) return false;
    mark_finished();
    return Communicator::now_ms() >= op_->not_before_ms;
  }

 private:
  // Completes the MPI header of a launched send or recv (true at once for collectives, or once done);
  // a recv then knows when it may complete: its send's start + the modelled time.
  bool complete_header(bool block) {
    if (op_->header_request == MPI_REQUEST_NULL) return true;  // none, or completed (MPI resets it)
    int flag = 1;
    if (block) {
      SL_MPI_CALL(MPI_Wait(&op_->header_request, MPI_STATUS_IGNORE));
    } else {
      SL_MPI_CALL(MPI_Test(&op_->header_request, &flag, MPI_STATUS_IGNORE));
    }
    if (flag && op_->is_recv) op_->not_before_ms = recv_not_before_ms(op_->header, op_->modeled_ms);
    return flag != 0;
  }
  void mark_finished() {
    std::lock_guard<std::mutex> lock(st_->mu);
    if (op_->finished) return;
    op_->finished = true;
    st_->log.set_end(op_->event_id, std::max(Communicator::now_ms(), op_->not_before_ms));
  }
  // Whether the op's done event has fired (cudaEventQuery); any CUDA error but "not ready" is thrown.
  bool event_fired() const {
    const cudaError_t rc = cudaEventQuery(op_->done);
    if (rc == cudaErrorNotReady) return false;
    SL_CUDA_CHECK(rc);
    return true;
  }
  // NCCL reported an asynchronous error while this op was unfinished: abandon it as a timeout does, mark the
  // communicator broken (no new calls; its destructor calls ncclCommAbort) and throw, naming the rank, the
  // group, the op and its peer, and NCCL's words.
  [[noreturn]] void fail_async(ncclResult_t r) {
    op_->abandoned = true;
    st_->broken = true;
    try {
      SL_FAIL(
          "a peer rank has most likely died or lost its network: read every rank's output first "
          "(NCCL_DEBUG=WARN says more); this communicator takes no new calls: destroy it (its destructor "
          "aborts NCCL)",
          "%s: NCCL reported an asynchronous error during %s: %s (%s)", st_->who.c_str(), op_->waited_for.c_str(),
          ncclGetErrorString(r), ncclGetLastError(st_->comm));
    } catch (const Error&) {
      op_->error = std::current_exception();
    }
    std::rethrow_exception(op_->error);
  }
  // The wait ran past the op's timeout: abandon it (its buffers stay held: NCCL may still use them),
  // mark the communicator, throw (comm_internal.h: the words every backend uses).
  [[noreturn]] void time_out(double waited_ms) {
    op_->abandoned = true;
    st_->timed_out = true;
    note_wait_timed_out();
    st_->log.add_wait(op_->event_id, waited_ms);
    try {
      SL_FAIL(wait_timeout_hint(op_->timeout_s), "%s waited %.1f s for %s: %s", st_->who.c_str(), waited_ms / 1e3,
              op_->waited_for.c_str(), wait_timeout_reason(op_->waited_for));
    } catch (const Error&) {
      op_->error = std::current_exception();
    }
    std::rethrow_exception(op_->error);
  }
  // An unfinished op is given up: its header's request is cancelled (MPI_Cancel, a moment for it, then
  // MPI_Request_free), and the op is kept for good: NCCL may still write its tensors (Op::buffers; back
  // in the caching allocator they would be handed to the next kernel) until ncclCommAbort, and MPI
  // op->header if it could not cancel that.
  void abandon() {
    if (op_->header_request != MPI_REQUEST_NULL) {
      MPI_Cancel(&op_->header_request);
      for (int i = 0; i < 100 && op_->header_request != MPI_REQUEST_NULL; ++i) {  // ~100 ms at most
        int flag = 0;
        MPI_Test(&op_->header_request, &flag, MPI_STATUS_IGNORE);
        if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (op_->header_request != MPI_REQUEST_NULL) MPI_Request_free(&op_->header_request);
    }
    static auto* kept = new std::vector<std::shared_ptr<Op>>();  // never freed, deliberately
    kept->push_back(op_);
  }
  static constexpr std::chrono::microseconds kPollInterval{50};  // polling a wait with a timeout
  std::shared_ptr<State> st_;
  std::shared_ptr<Op> op_;
};

class NcclCommunicator : public Communicator {
 public:
  // Takes ownership of comm and of its MPI twin mpi (same members, same order): the group `name`
  // with the topology it inherits.
  NcclCommunicator(ncclComm_t comm, MPI_Comm mpi, int device, const std::string& name, const Topology& topology)
      : st_(std::make_shared<State>()) {
    st_->comm = comm;
    st_->mpi = mpi;
    st_->device = device;
    init_group(name, mpi_world_ranks(mpi), topology);
    SL_CUDA_CHECK(cudaSetDevice(device));
    // Non-blocking: no implicit sync with the legacy default stream; the events order the two.
    SL_CUDA_CHECK(cudaStreamCreateWithFlags(&st_->stream, cudaStreamNonBlocking));
    SL_CUDA_CHECK(cudaEventCreateWithFlags(&st_->ready, cudaEventDisableTiming));
    SL_NCCL_CHECK(ncclCommUserRank(comm, &rank_));
    SL_NCCL_CHECK(ncclCommCount(comm, &size_));
    st_->who = describe_rank(*this);
  }
  ~NcclCommunicator() override {
    if (st_->unusable()) return;  // nothing new is launched after a timeout or error (~State aborts NCCL)
    try {
      st_->flush_p2p();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  using Communicator::split;  // the two-argument form

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::CUDA; }

  WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag) override {
    check_on_device(*this, "all_reduce", buf);
    check_reduce_dtype("all_reduce", rank_, size_, buf.dtype(), op);
    check_count_fits_int("all_reduce", rank_, buf.numel());
    return collective("all_reduce", tag, buf.numel(), buf.dtype(), -1, {buf}, [&] {
      SL_NCCL_CHECK(ncclAllReduce(buf.raw(), buf.raw(), buf.numel(), nccl_type(buf.dtype()), nccl_op(op), st_->comm,
                                  st_->stream));
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag) override {
    check_on_device(*this, "reduce_scatter", in);
    check_on_device(*this, "reduce_scatter", out);
    check_reduce_dtype("reduce_scatter", rank_, size_, in.dtype(), op);
    check_reduce_scatter(rank_, size_, in, out);
    check_count_fits_int("reduce_scatter", rank_, in.numel());
    return collective("reduce_scatter", tag, in.numel(), in.dtype(), -1, {in, out}, [&] {
      SL_NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), out.numel(), nccl_type(in.dtype()), nccl_op(op), st_->comm,
                                      st_->stream));
    });
  }

  WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag) override {
    check_on_device(*this, "all_gather", in);
    check_on_device(*this, "all_gather", out);
    check_all_gather(rank_, size_, in, out);
    check_count_fits_int("all_gather", rank_, out.numel());
    return collective("all_gather", tag, in.numel(), in.dtype(), -1, {in, out}, [&] {
      SL_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), in.numel(), nccl_type(in.dtype()), st_->comm, st_->stream));
    });
  }

  WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag) override {
    check_on_device(*this, "broadcast", buf);
    check_root("broadcast", rank_, size_, root);
    check_count_fits_int("broadcast", rank_, buf.numel());
    return collective("broadcast", tag, buf.numel(), buf.dtype(), root, {buf}, [&] {
      SL_NCCL_CHECK(ncclBroadcast(buf.raw(), buf.raw(), buf.numel(), nccl_type(buf.dtype()), root, st_->comm,
                                  st_->stream));
    });
  }

  WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag) override {
    check_on_device(*this, "send", buf);
    check_peer("send", rank_, size_, peer);
    check_count_fits_int("send", rank_, buf.numel());
    std::shared_ptr<State> st = st_;
    return point_to_point("send", tag, buf, peer, [st, buf, peer] {
      SL_NCCL_CHECK(ncclSend(buf.raw(), buf.numel(), nccl_type(buf.dtype()), peer, st->comm, st->stream));
    });
  }

  WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag) override {
    check_on_device(*this, "recv", buf);
    check_peer("recv", rank_, size_, peer);
    check_count_fits_int("recv", rank_, buf.numel());
    std::shared_ptr<State> st = st_;
    return point_to_point("recv", tag, buf, peer, [st, buf, peer] {
      SL_NCCL_CHECK(ncclRecv(buf.raw(), buf.numel(), nccl_type(buf.dtype()), peer, st->comm, st->stream));
    });
  }

  void barrier() override {
    // NCCL has no barrier: an all_reduce of one float, waited for by the host.
    if (!scratch_.defined()) scratch_ = Tensor::zeros({1}, DType::F32, Device::CUDA, MemCategory::Comm);
    collective("barrier", "", 0, DType::F32, -1, {scratch_}, [&] {
      SL_NCCL_CHECK(ncclAllReduce(scratch_.raw(), scratch_.raw(), 1, ncclFloat32, ncclSum, st_->comm, st_->stream));
    })->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_color(rank_, size_, color);
    check_not_timed_out("split");
    st_->flush_p2p();
    SL_CUDA_CHECK(cudaSetDevice(st_->device));
    MPI_Comm child_mpi = MPI_COMM_NULL;  // the twin first: same color and key, so the same members and order
    SL_MPI_CALL(MPI_Comm_split(st_->mpi, mpi_split_color(color), key, &child_mpi));
    ncclComm_t child = nullptr;
    SL_NCCL_CHECK(ncclCommSplit(st_->comm, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    if (child == nullptr) return nullptr;  // kNoColor: this rank joins no group
    auto sub = std::make_unique<NcclCommunicator>(child, child_mpi, st_->device, name, topology());
    sub->set_wait_timeout(wait_timeout());  // a child starts with its parent's timeout (comm.h)
    return sub;
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    std::fprintf(stderr, "[scalelab] rank %d of %d aborts the job: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    ncclCommAbort(st_->comm);  // frees NCCL's kernels waiting for peers
    st_->comm = nullptr;
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

  std::vector<CommEvent> events() const override { return st_->log.snapshot(); }
  void clear_events() override { st_->log.clear(); }

 private:
  std::shared_ptr<Op> new_op(const std::string& name, const std::string& tag, int64_t count, DType dtype, int peer) {
    check_not_timed_out(name);
    auto op = std::make_shared<Op>();
    op->timeout_s = wait_timeout();
    op->waited_for = describe_wait(*this, name, peer, tag);
    CommEvent e =
        make_event(*this, name, tag, count, dtype, /*async=*/!issuing_blocking_call() && name != "barrier", peer);
    e.start_ms = e.issue_ms;
    op->start_ms = e.start_ms;
    op->modeled_ms = e.modeled_ms;
    op->not_before_ms = e.start_ms + e.modeled_ms;
    op->peer = peer;
    op->is_send = name == "send";
    op->is_recv = name == "recv";
    op->event_id = st_->log.add(e);
    SL_CUDA_CHECK(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming));
    return op;
  }

  // After a wait timed out, a new call would queue behind the stuck one: refused.
  void check_not_timed_out(const std::string& op) const {
    SL_CHECK_HINT(!st_->unusable(), "destroy it (its destructor aborts NCCL) and make a new one",
                  "%s on %s: a wait on this communicator %s, it takes no new calls", op.c_str(), st_->who.c_str(),
                  st_->timed_out ? "timed out" : "failed (NCCL reported an asynchronous error)");
  }

  template <typename F>
  WorkPtr collective(const std::string& name, const std::string& tag, int64_t count, DType dtype, int peer,
                     std::vector<Tensor> buffers, F&& call) {
    check_not_timed_out(name);
    st_->flush_p2p();  // calls reach NCCL in issue order (and a peer waiting for our send gets it first)
    check_same_call(name, count, dtype, peer);
    SL_CUDA_CHECK(cudaSetDevice(st_->device));
    std::shared_ptr<Op> op = new_op(name, tag, count, dtype, peer);
    op->buffers = std::move(buffers);  // alive until wait() (see Op::buffers)
    st_->order_after_compute();
    call();
    SL_CUDA_CHECK(cudaEventRecord(op->done, st_->stream));
    op->launched = true;
    return std::make_shared<NcclWork>(st_, op);
  }

  // --- the same call on every rank -----------------------------------------------------------
  // NCCL, like MPI, leaves a collective whose ranks pass other counts, dtypes or roots undefined: a kernel
  // reads or writes past a buffer, or waits for ever. So before it is enqueued the group compares the call
  // on the MPI twin as the mpi backend does (mpi.cpp check_same_call): one all-reduce (MAX) of 8 int64,
  // each field next to its negation, gives every field's largest and smallest value; where they differ,
  // every rank all-gathers the calls and throws the same list. Costs one 64-byte host all-reduce per
  // collective, and the host waits there for the other ranks' calls: polled against the wait timeout, so
  // that a rank that stopped is named as one, not waited for for ever. Untested: one GPU here.
  void check_same_call(const std::string& name, int64_t count, DType dtype, int root) {
    int64_t call[4];
    call_signature(name, count, dtype, root, call);
    // On the heap: a request that times out stays posted (MPI cannot cancel a collective) and may still
    // write its buffer, which wait_for_call then keeps for good.
    auto range = std::make_shared<std::vector<int64_t>>(8);
    call_range(call, range->data());
    MPI_Request request = MPI_REQUEST_NULL;
    SL_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, range->data(), 8, MPI_INT64_T, MPI_MAX, st_->mpi, &request));
    wait_for_call(request, name, range);
    if (call_range_agrees(range->data())) return;
    // every rank's call, then this rank's (the send buffer: on the heap too)
    auto calls = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(4 * size_ + 4));
    std::copy(call, call + 4, calls->begin() + 4 * size_);
    SL_MPI_CALL(MPI_Iallgather(calls->data() + 4 * size_, 4, MPI_INT64_T, calls->data(), 4, MPI_INT64_T, st_->mpi,
                               &request));
    wait_for_call(request, name, calls);
    fail_different_calls(st_->who, calls->data(), size_);
  }

  // Polls `request` (check_same_call's) until it completes or the wait timeout (0: none) has passed; then
  // the communicator takes no new calls and `buffer`, which MPI may still write, is kept for good.
  void wait_for_call(MPI_Request& request, const std::string& name, std::shared_ptr<std::vector<int64_t>> buffer) {
    const double timeout_s = wait_timeout();
    if (timeout_s <= 0) {
      SL_MPI_CALL(MPI_Wait(&request, MPI_STATUS_IGNORE));
      return;
    }
    using Clock = std::chrono::steady_clock;  // the wall clock: a timeout is real time
    const Clock::time_point t0 = Clock::now();
    auto waited_s = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    for (int polls = 0;; ++polls) {
      int flag = 0;
      SL_MPI_CALL(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
      if (flag) return;
      if (waited_s() >= timeout_s) break;
      if (polls < 1000) std::this_thread::yield();  // the other ranks are usually microseconds away
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    static auto* kept = new std::vector<std::shared_ptr<std::vector<int64_t>>>();  // never freed, deliberately
    kept->push_back(std::move(buffer));
    st_->timed_out = true;
    note_wait_timed_out();
    SL_FAIL(wait_timeout_hint_collective(timeout_s, /*stopped=*/true),
            "%s waited %.1f s for the other ranks to make %s too (the check of its sizes before NCCL runs it): a "
            "rank of the group has not called it",
            st_->who.c_str(), waited_s(), name.c_str());
  }

  WorkPtr point_to_point(const std::string& name, const std::string& tag, const Tensor& buf, int peer,
                         std::function<void()> launch) {
    std::shared_ptr<Op> op = new_op(name, tag, buf.numel(), buf.dtype(), peer);
    op->launch = std::move(launch);
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->pending.push_back(op);
    }
    return std::make_shared<NcclWork>(st_, op);
  }

  std::shared_ptr<State> st_;
  int rank_ = 0;
  int size_ = 1;
  Tensor scratch_;  // (1) f32 on the GPU, for barrier()
};

// A printable UUID: "GPU-1a2b3c4d-..." as nvidia-smi -L shows it.
std::string uuid_string(const cudaUUID_t& u) {
  char s[64];
  const unsigned char* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(s, sizeof(s), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator() {
  mpi_init_once();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  // 1. This rank's GPU: its index among the ranks of its node.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  // local_rank % devices: with each rank seeing every GPU of its node, rank k takes GPU k; with each rank
  // seeing only its own (Slurm --gpus-per-task=1), every rank takes its device 0. Every rank of the node
  // sees the same count, so without a GPU they all refuse together (nobody waits below).
  const int device = gpu_for_local_rank(local_rank, devices);
  SL_CUDA_CHECK(cudaSetDevice(device));

  // 2. Two ranks on one physical GPU (more ranks than GPUs, CUDA_VISIBLE_DEVICES, containers): compare the
  //    device UUIDs of all ranks before NCCL fails with "Duplicate GPU detected".
  cudaDeviceProp prop;
  SL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::vector<cudaUUID_t> uuids(static_cast<size_t>(size));
  MPI_Allgather(&prop.uuid, sizeof(cudaUUID_t), MPI_BYTE, uuids.data(), sizeof(cudaUUID_t), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::string> names;
  for (const cudaUUID_t& u : uuids) names.push_back(uuid_string(u));
  const auto [r, q] = first_shared_gpu(names);
  SL_CHECK_HINT(r < 0,
                "NCCL needs one GPU per rank: start at most as many ranks per node as there are GPUs, or use "
                "--backend mpi (it stages GPU tensors through host memory)",
                "ranks %d and %d share GPU %s (%d rank(s) on this node, %d GPU(s) visible to rank %d)", r, q,
                r < 0 ? "" : names[static_cast<size_t>(r)].c_str(), local_size, devices, rank);

  // 3. NCCL's bootstrap: rank 0's unique id, broadcast over MPI.
  ncclUniqueId id;
  if (rank == 0) SL_NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  SL_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  MPI_Comm mpi = MPI_COMM_NULL;  // the MPI twin of the world (group members, headers)
  SL_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &mpi));
  SL_MPI_CALL(MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN));
  return std::make_unique<NcclCommunicator>(comm, mpi, device, "world", default_topology(size));
}

}  // namespace scalelab::comm_detail
