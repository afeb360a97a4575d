// mpi.cpp — the `mpi` communicator (comm.h), over OpenMPI. Compiled only where CMake found MPI
// (SL_WITH_MPI, common/CMakeLists.txt). Design notes: docs/communicator.md.
//
// Progress. A non-blocking MPI collective (MPI_Iallreduce) barely moves while the caller computes,
// unless someone calls into MPI (docs/design.md "Platform facts"). So every call of a communicator is
// handed, in issue order, to ONE communication thread of that communicator, which executes the
// blocking MPI call (MPI_Allreduce, ...) while the caller's thread computes. An *_async call returns
// a Work that waits for its op; overlap with compute is real and measurable. Needs MPI_THREAD_MULTIPLE
// (several communicators = several threads in MPI at once).
// A blocking collective issued while nothing is pending on the communicator runs on the caller's own
// thread instead: handing it over and waking the caller again costs two thread wake-ups, several
// times a small all_reduce's own time on a machine without spare cores (docs/communicator.md
// "Progress"). Order is kept: with anything pending, it queues behind.
// Point to point does not block that thread: a send or recv is posted (MPI_Isend / MPI_Irecv) and
// completed later by polling, so "send to next, recv from previous" around a ring cannot deadlock.
// Each payload travels behind a header with the send's start time, so a recv completes no earlier
// than that start + the modelled time (comm_internal.h MessageHeader).
//
// Delivery at wait (SL_COMM_DELIVER_AT_WAIT=1; every graded multi-rank check runs so). MPI runs the
// collectives in issue order, so with results written at once a caller who waits for the LAST of several
// async ops finds the earlier ones done too, and code that forgets a wait() passes by luck. In this
// mode an async op on CPU tensors computes into a private copy and writes its output tensor only when
// ITS Work is waited for (or destroyed): a forgotten wait() leaves stale bytes that a check sees.
//
// Tests: tests/common/comm/test_comm_mpi.cpp (2 and 4 ranks). NCCL twin: common/src/comm/nccl.cpp
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>  // defines: std::getenv
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_internal.h"  // defines: EventLog, make_event, check_*, describe_call, MessageHeader
#include "mpi_internal.h"   // defines: SL_MPI_CALL, mpi_world_ranks, mpi_split_color
#include "scalelab/core/bf16.h"     // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/comm/comm.h"
#include "scalelab/core/error.h"

#ifdef SL_WITH_CUDA
#include "scalelab/core/cuda_check.h"  // defines: SL_CUDA_CHECK (cuda_runtime.h)
#endif

namespace scalelab::comm_detail {

// ---------------------------------------------------------------------------------------------
// MPI start and end

namespace {
bool g_we_initialized_mpi = false;

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
}  // namespace

void mpi_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0, provided = 0;
    SL_MPI_CALL(MPI_Initialized(&initialized));
    if (!initialized) {
      SL_MPI_CALL(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      g_we_initialized_mpi = true;
      std::atexit(finalize_mpi_at_exit);  // runs after main() has destroyed its communicators
    } else {
      SL_MPI_CALL(MPI_Query_thread(&provided));  // someone else initialised MPI: is it enough?
    }
    SL_CHECK_HINT(provided >= MPI_THREAD_MULTIPLE,
                  "the communication threads need an MPI built with thread support (OpenMPI: ompi_info | "
                  "grep MPI_THREAD_MULTIPLE should say yes; Debian's does); if your program calls "
                  "MPI_Init itself, call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) instead",
                  "MPI provides thread level %d, the mpi backend needs MPI_THREAD_MULTIPLE (%d)", provided,
                  MPI_THREAD_MULTIPLE);
  });
}

namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT;
    case DType::BF16: return MPI_UINT16_T;  // moved as bits; reductions go through fp32 (below)
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }  // Avg = Sum, then / n

// ---------------------------------------------------------------------------------------------
// Host staging: the bytes MPI reads or writes for a tensor. A CPU tensor's own memory; for a CUDA
// tensor a pinned host copy (Debian's OpenMPI is not CUDA-aware, docs/design.md "Platform facts"). The
// copies are cudaMemcpy on the legacy default stream, so they wait for kernels queued before them.
// (One cudaMallocHost per call; a pool would be faster, this path is the fallback for several ranks
// sharing one GPU, where NCCL refuses to run.)
class HostStage {
 public:
  // copy_in: fill the host copy from the device now (the tensor is an input). The tensor's storage is
  // kept alive by the op's closure, which outlives its stage; the stage itself holds only pointers.
  HostStage(const Tensor& t, int cuda_device, bool copy_in) : device_ptr_(t.raw()), nbytes_(t.nbytes()) {
    if (t.device() == Device::CPU || t.nbytes() == 0) {
      ptr_ = t.raw();
      return;
    }
#ifdef SL_WITH_CUDA
    SL_CUDA_CHECK(cudaSetDevice(cuda_device));  // this thread's current device: the caller's
    SL_CUDA_CHECK(cudaMallocHost(&pinned_, t.nbytes()));
    ptr_ = pinned_;
    if (copy_in) SL_CUDA_CHECK(cudaMemcpy(pinned_, t.raw(), t.nbytes(), cudaMemcpyDeviceToHost));
#else
    SL_FAIL("rebuild with CUDA", "a CUDA tensor in a build without CUDA");
#endif
  }
  ~HostStage() {
#ifdef SL_WITH_CUDA
    if (pinned_) cudaFreeHost(pinned_);
#endif
  }
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;

  void* ptr() const { return ptr_; }
  // The tensor is an output: write the host copy back to the device (nothing to do on the CPU).
  void copy_out() {
#ifdef SL_WITH_CUDA
    if (pinned_) SL_CUDA_CHECK(cudaMemcpy(device_ptr_, pinned_, nbytes_, cudaMemcpyHostToDevice));
#endif
  }

 private:
  void* device_ptr_;  // the tensor's own bytes (on the GPU when pinned_ is set)
  size_t nbytes_;
  void* ptr_ = nullptr;
  void* pinned_ = nullptr;
};

// The caller's CUDA device (the comm thread must use the same one), or -1 for CPU tensors.
int caller_cuda_device(const Tensor& a, const Tensor& b) {
  if (a.device() != Device::CUDA && b.device() != Device::CUDA) return -1;
  int dev = 0;
#ifdef SL_WITH_CUDA
  SL_CUDA_CHECK(cudaGetDevice(&dev));
#endif
  return dev;
}

// bf16 <-> fp32 copies: MPI has no bf16 type, so bf16 reductions run in fp32 and round back to bf16
// once at the end (NCCL adds in bf16 at every ring step, so its last bit can differ from ours).
std::vector<float> bf16_to_floats(const void* src, int64_t count) {
  const bf16* s = static_cast<const bf16*>(src);
  std::vector<float> f(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) f[i] = bf16_to_float(s[i]);
  return f;
}

void floats_to_bf16(const std::vector<float>& f, void* dst) {
  bf16* d = static_cast<bf16*>(dst);
  for (size_t i = 0; i < f.size(); ++i) d[i] = float_to_bf16(f[i]);
}

void scale_f32(void* data, int64_t count, float factor) {
  float* x = static_cast<float*>(data);
  for (int64_t i = 0; i < count; ++i) x[i] *= factor;
}

// ---------------------------------------------------------------------------------------------
// An output held back until its op is waited for (delivery at wait, above): the op computes into
// `bytes`, and deliver() copies them into the output tensor on the caller's thread, once.
struct Delivery {
  Delivery(const Tensor& out, bool copy_in) : target(out), bytes(out.nbytes()) {
    if (copy_in && !bytes.empty()) std::memcpy(bytes.data(), out.raw(), bytes.size());  // in place: the input
  }
  void* data() { return bytes.data(); }
  void deliver() {
    if (!delivered && !bytes.empty()) std::memcpy(target.raw(), bytes.data(), bytes.size());
    delivered = true;
    target = Tensor();  // the output's storage is the caller's again (allocator counts stay exact)
  }
  Tensor target;
  std::vector<char> bytes;
  bool delivered = false;
};

// One call on its way through the communication thread, shared with the Work that waits for it.
struct Op {
  std::string what;       // "all_reduce of 1000 f32 elements on rank 1 of 4": for error messages
  uint64_t event_id = 0;  // its CommEvent in the log
  std::shared_ptr<EventLog> log;  // that log (shared: a Work may outlive its communicator); null: no event
  double modeled_ms = 0;  // the link model's time: the op completes no earlier than start + this

  // A collective (or barrier, split): the blocking MPI call(s), staging included.
  std::function<void()> run;
  // A send or recv: post posts the header's and the payload's MPI_Isend / MPI_Irecv into requests;
  // complete runs once both transfers are done, with the payload's status.
  std::function<void(MPI_Request* requests)> post;
  std::function<void(const MPI_Status&)> complete;
  bool is_p2p() const { return static_cast<bool>(post); }

  // Set by the thread that runs it.
  MessageHeader header;  // p2p: the send's start, sent ahead of the payload (a recv's: received)
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // p2p: header, payload
  MPI_Status statuses[2] = {};
  bool transferred = false;   // p2p: MPI says both requests are done
  double not_before_ms = 0;   // start + modeled_ms; a recv: the send's start + modeled_ms

  // Delivery at wait: the output, written by the Work's wait() (or destructor); null otherwise.
  std::shared_ptr<Delivery> delivery;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  bool error_seen = false;
};

class MpiWork : public Work {
 public:
  explicit MpiWork(std::shared_ptr<Op> op) : op_(std::move(op)) {}
  ~MpiWork() override {
    // The tensors must stay untouched until the op is done, so an unfinished Work waits (and that
    // wait is the caller's too: it counts in wait_ms).
    std::unique_lock<std::mutex> lock(op_->mu);
    block_until_done(lock);
    if (op_->delivery && !op_->error) op_->delivery->deliver();
    if (op_->error && !op_->error_seen) {
      try {
        std::rethrow_exception(op_->error);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[scalelab] an operation nobody waited for failed:\n%s\n", e.what());
      }
    }
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(op_->mu);
    block_until_done(lock);
    if (op_->error) {
      op_->error_seen = true;
      std::rethrow_exception(op_->error);
    }
    if (op_->delivery) op_->delivery->deliver();
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(op_->mu);
    return op_->done;
  }

 private:
  // Blocks until the communication thread has finished the op; the time blocked goes to the event's
  // wait_ms. An op already done adds nothing: its communication was hidden from this caller.
  void block_until_done(std::unique_lock<std::mutex>& lock) {
    if (op_->done) return;
    const double t0_ms = Communicator::now_ms();
    op_->cv.wait(lock, [&] { return op_->done; });
    if (op_->log) op_->log->add_wait(op_->event_id, Communicator::now_ms() - t0_ms);
  }

  std::shared_ptr<Op> op_;
};

// ---------------------------------------------------------------------------------------------
class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of comm (a duplicate of MPI_COMM_WORLD or the result of a split), the group
  // `name` with the topology it inherits.
  MpiCommunicator(MPI_Comm comm, const std::string& name, const Topology& topology) : comm_(comm) {
    SL_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
    SL_MPI_CALL(MPI_Comm_size(comm_, &size_));
    init_group(name, mpi_world_ranks(comm_), topology);
    const char* at_wait = std::getenv("SL_COMM_DELIVER_AT_WAIT");
    deliver_at_wait_ = at_wait != nullptr && std::strcmp(at_wait, "") != 0 && std::strcmp(at_wait, "0") != 0;
    // Errors come back as return codes (SL_MPI_CALL turns them into exceptions naming the call)
    // instead of MPI's default of killing the job without a word about what we were doing.
    SL_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    thread_ = std::thread([this] { thread_main(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stop_ = true;  // the thread finishes what was issued, then ends
    }
    queue_cv_.notify_all();
    thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  using Communicator::split;  // the two-argument form

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  // --- collectives -------------------------------------------------------------------------
  // Each makes a closure that runs the blocking MPI call on host memory (HostStage) and hands it to
  // collective(), which runs it here or on the communication thread.
  WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("all_reduce", rank_, size_, buf.dtype(), op);
    check_count_fits_int("all_reduce", rank_, buf.numel());
    const int dev = caller_cuda_device(buf, buf);
    auto d = held_back(buf, /*copy_in=*/true);
    return collective("all_reduce", tag, buf.numel(), buf.dtype(), -1, d, [this, buf, op, dev, d] {
      if (d) return all_reduce_host(d->data(), buf.numel(), buf.dtype(), op);
      HostStage h(buf, dev, /*copy_in=*/true);
      all_reduce_host(h.ptr(), buf.numel(), buf.dtype(), op);
      h.copy_out();
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("reduce_scatter", rank_, size_, in.dtype(), op);
    check_reduce_scatter(rank_, size_, in, out);
    check_count_fits_int("reduce_scatter", rank_, in.numel());
    const int dev = caller_cuda_device(in, out);
    auto d = held_back(out, /*copy_in=*/false);
    return collective("reduce_scatter", tag, in.numel(), in.dtype(), -1, d, [this, in, out, op, dev, d] {
      HostStage h_in(in, dev, /*copy_in=*/true);
      HostStage h_out(out, dev, /*copy_in=*/false);
      reduce_scatter_host(h_in.ptr(), d ? d->data() : h_out.ptr(), out.numel(), in.dtype(), op);
      if (!d) h_out.copy_out();
    });
  }

  WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag) override {
    check_all_gather(rank_, size_, in, out);
    check_count_fits_int("all_gather", rank_, out.numel());
    const int dev = caller_cuda_device(in, out);
    auto d = held_back(out, /*copy_in=*/false);
    return collective("all_gather", tag, in.numel(), in.dtype(), -1, d, [this, in, out, dev, d] {
      HostStage h_in(in, dev, /*copy_in=*/true);
      HostStage h_out(out, dev, /*copy_in=*/false);
      all_gather_host(h_in.ptr(), d ? d->data() : h_out.ptr(), in.numel(), in.dtype());
      if (!d) h_out.copy_out();
    });
  }

  WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag) override {
    check_root("broadcast", rank_, size_, root);
    check_count_fits_int("broadcast", rank_, buf.numel());
    const int dev = caller_cuda_device(buf, buf);
    auto d = held_back(buf, /*copy_in=*/rank_ == root);
    return collective("broadcast", tag, buf.numel(), buf.dtype(), root, d, [this, buf, root, dev, d] {
      HostStage h(buf, dev, /*copy_in=*/rank_ == root);
      SL_MPI_CALL(MPI_Bcast(d ? d->data() : h.ptr(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), root,
                            comm_));
      if (rank_ != root && !d) h.copy_out();
    });
  }

  void barrier() override {
    collective("barrier", "", 0, DType::F32, -1, nullptr, [this] { SL_MPI_CALL(MPI_Barrier(comm_)); })->wait();
  }

  // --- point to point ----------------------------------------------------------------------
  // Two messages per send, in this order: the header (the send's start time, kHeaderTag) and the
  // payload (kTag). MPI keeps the order of messages between two ranks per tag, so the k-th header and
  // the k-th payload from a peer belong together.
  WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag) override {
    check_peer("send", rank_, size_, peer);
    check_count_fits_int("send", rank_, buf.numel());
    auto o = new_op("send", tag, buf.numel(), buf.dtype(), peer);
    const int dev = caller_cuda_device(buf, buf);
    auto stage = std::make_shared<std::unique_ptr<HostStage>>();  // lives until the send completes
    Op* op = o.get();  // the closure lives inside *op: a raw pointer, no cycle
    o->post = [this, buf, peer, dev, stage, op](MPI_Request* requests) {
      *stage = std::make_unique<HostStage>(buf, dev, /*copy_in=*/true);
      SL_MPI_CALL(MPI_Isend(&op->header, sizeof(MessageHeader), MPI_BYTE, peer, kHeaderTag, comm_, &requests[0]));
      SL_MPI_CALL(MPI_Isend((*stage)->ptr(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), peer, kTag,
                            comm_, &requests[1]));
    };
    o->complete = [stage](const MPI_Status&) { stage->reset(); };
    return submit(o);
  }

  WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag) override {
    check_peer("recv", rank_, size_, peer);
    check_count_fits_int("recv", rank_, buf.numel());
    auto o = new_op("recv", tag, buf.numel(), buf.dtype(), peer);
    const int dev = caller_cuda_device(buf, buf);
    auto stage = std::make_shared<std::unique_ptr<HostStage>>();
    Op* op = o.get();
    o->delivery = held_back(buf, /*copy_in=*/false);
    o->post = [this, buf, peer, dev, stage, op](MPI_Request* requests) {
      *stage = std::make_unique<HostStage>(buf, dev, /*copy_in=*/false);
      void* dst = op->delivery ? op->delivery->data() : (*stage)->ptr();
      SL_MPI_CALL(MPI_Irecv(&op->header, sizeof(MessageHeader), MPI_BYTE, peer, kHeaderTag, comm_, &requests[0]));
      SL_MPI_CALL(MPI_Irecv(dst, static_cast<int>(buf.numel()), mpi_type(buf.dtype()), peer, kTag, comm_,
                            &requests[1]));
    };
    o->complete = [this, buf, peer, stage, op](const MPI_Status& status) {
      int received = 0;
      SL_MPI_CALL(MPI_Get_count(&status, mpi_type(buf.dtype()), &received));
      SL_CHECK_HINT(received == buf.numel(), "send and recv the same number of elements",
                    "recv on rank %d of %d: expected %lld %s elements from rank %d, got %d", rank_, size_,
                    static_cast<long long>(buf.numel()), dtype_name(buf.dtype()), peer, received);
      if (!op->delivery) (*stage)->copy_out();
      stage->reset();
      // The bytes cannot have crossed the link before the sender started plus the modelled time.
      op->not_before_ms = recv_not_before_ms(op->header, op->modeled_ms);
    };
    return submit(o);
  }

  // --- the rest ------------------------------------------------------------------------------
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_color(rank_, size_, color);
    // MPI_Comm_split is a collective on comm_: it runs on the communication thread, in order with
    // the calls issued before it (two threads must never run collectives on one communicator at once).
    MPI_Comm child = MPI_COMM_NULL;
    auto o = std::make_shared<Op>();
    o->what = "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ", '" + name +
              "') on rank " + std::to_string(rank_) + " of " + std::to_string(size_);
    o->event_id = kNoEvent;
    o->run = [this, color, key, &child] { SL_MPI_CALL(MPI_Comm_split(comm_, mpi_split_color(color), key, &child)); };
    submit(o)->wait();
    if (child == MPI_COMM_NULL) return nullptr;  // kNoColor: this rank joins no group
    return std::make_unique<MpiCommunicator>(child, name, topology());
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    std::fprintf(stderr, "[scalelab] rank %d of %d aborts the job: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);  // ends every rank, also those waiting in a collective
    std::_Exit(exit_code);                 // not reached
  }

  std::vector<CommEvent> events() const override { return log_->snapshot(); }
  void clear_events() override { log_->clear(); }

 private:
  static constexpr int kTag = 0;        // payloads: order between two ranks is the order of the calls
  static constexpr int kHeaderTag = 1;  // their headers (MessageHeader), in the same order
  static constexpr uint64_t kNoEvent = ~uint64_t{0};

  // --- the reductions on host memory (run on the communication thread) ---------------------
  void all_reduce_host(void* data, int64_t count, DType dt, ReduceOp op) {
    if (dt == DType::BF16) {
      std::vector<float> f = bf16_to_floats(data, count);
      all_reduce_host(f.data(), count, DType::F32, op);
      floats_to_bf16(f, data);
      return;
    }
    SL_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(dt), mpi_op(op), comm_));
    if (op == ReduceOp::Avg) scale_f32(data, count, 1.0f / static_cast<float>(size_));  // f32 only (i32 refused)
  }

  // in (size_ * chunk) -> out (chunk): this rank's chunk of the reduction.
  void reduce_scatter_host(const void* in, void* out, int64_t chunk, DType dt, ReduceOp op) {
    if (dt == DType::BF16) {
      std::vector<float> f_in = bf16_to_floats(in, chunk * size_);
      std::vector<float> f_out(static_cast<size_t>(chunk));
      reduce_scatter_host(f_in.data(), f_out.data(), chunk, DType::F32, op);
      floats_to_bf16(f_out, out);
      return;
    }
    const size_t chunk_bytes = static_cast<size_t>(chunk) * dtype_size(dt);
    std::vector<char> in_copy;  // MPI forbids in and out to overlap: copy the input first if they do
    if (overlaps(in, chunk_bytes * size_, out, chunk_bytes)) {
      in_copy.assign(static_cast<const char*>(in), static_cast<const char*>(in) + chunk_bytes * size_);
      in = in_copy.data();
    }
    SL_MPI_CALL(MPI_Reduce_scatter_block(in, out, static_cast<int>(chunk), mpi_type(dt), mpi_op(op), comm_));
    if (op == ReduceOp::Avg) scale_f32(out, chunk, 1.0f / static_cast<float>(size_));
  }

  // in (chunk) -> out (size_ * chunk). In place when in is out's chunk rank_ (MPI_IN_PLACE means
  // exactly that for MPI_Allgather); a copy first when they overlap any other way.
  void all_gather_host(const void* in, void* out, int64_t chunk, DType dt) {
    const size_t chunk_bytes = static_cast<size_t>(chunk) * dtype_size(dt);
    const void* send = in;
    std::vector<char> in_copy;
    if (chunk_bytes > 0 && in == static_cast<char*>(out) + rank_ * chunk_bytes) {
      send = MPI_IN_PLACE;
    } else if (overlaps(in, chunk_bytes, out, chunk_bytes * size_)) {
      in_copy.assign(static_cast<const char*>(in), static_cast<const char*>(in) + chunk_bytes);
      send = in_copy.data();
    }
    SL_MPI_CALL(MPI_Allgather(send, static_cast<int>(chunk), mpi_type(dt), out, static_cast<int>(chunk),
                              mpi_type(dt), comm_));
  }

  // --- issuing (caller thread) -------------------------------------------------------------
  // The event of a call issued now (blocking forms and barrier say async = false).
  CommEvent event(const char* name, const std::string& tag, int64_t count, DType dtype, int peer) const {
    const bool async = !issuing_blocking_call() && std::strcmp(name, "barrier") != 0;
    return make_event(*this, name, tag, count, dtype, async, peer);
  }

  // An op for the communication thread, its event in the log from now on (pending: end_ms 0).
  std::shared_ptr<Op> new_op(CommEvent&& e) {
    auto o = std::make_shared<Op>();
    o->what = describe_call(e.op, e.count, e.dtype, rank_, size_, e.tag);
    o->modeled_ms = e.modeled_ms;
    o->event_id = log_->add(std::move(e));
    o->log = log_;
    return o;
  }
  std::shared_ptr<Op> new_op(const char* name, const std::string& tag, int64_t count, DType dtype, int peer) {
    return new_op(event(name, tag, count, dtype, peer));
  }

  // A collective: `run` makes the blocking MPI call(s), staging included. A blocking call issued while
  // nothing is pending on this communicator runs right here, on the caller's thread: the communication
  // thread is idle and has nothing in flight, so the call takes its place in the order of issue, and
  // the two thread wake-ups of a hand-off (tens of microseconds on a machine without a spare core,
  // where an 8-byte MPI_Allreduce takes well under one) are saved. Anything else goes to the thread.
  // `delivery` (delivery at wait, else null): where `run` leaves the output until the Work's wait().
  template <typename F>
  WorkPtr collective(const char* name, const std::string& tag, int64_t count, DType dtype, int peer,
                     std::shared_ptr<Delivery> delivery, F&& run) {
    CommEvent e = event(name, tag, count, dtype, peer);
    // pending_ only grows on this (the caller's) thread; 0 means the thread finished everything, MPI
    // calls included (acquire pairs with finish()'s release).
    if (!e.async && pending_.load(std::memory_order_acquire) == 0) {
      WorkPtr w = run_here(std::move(e), run);
      if (delivery) delivery->deliver();  // a blocking call is its own wait
      return w;
    }
    std::shared_ptr<Op> o = new_op(std::move(e));
    o->run = std::forward<F>(run);
    o->delivery = std::move(delivery);
    return submit(o);
  }

  // Delivery at wait, for an output on the CPU (GPU tensors are written at once, as always).
  std::shared_ptr<Delivery> held_back(const Tensor& out, bool copy_in) const {
    if (!deliver_at_wait_ || out.device() != Device::CPU) return nullptr;
    return std::make_shared<Delivery>(out, copy_in);
  }

  // Runs a blocking collective on the caller's thread, then records its event, complete: the caller
  // was blocked from issue to end, which is its wait_ms. Errors are thrown from here (the blocking
  // form would rethrow them from wait() at once anyway). Two clock reads per call, issue and end.
  template <typename F>
  WorkPtr run_here(CommEvent&& e, F& run) {
    e.start_ms = e.issue_ms;  // it starts as it is issued (one clock read less: ~60 ns in a VM)
    std::exception_ptr error;
    try {
      run();
      if (e.modeled_ms > 0) sleep_until_ms(e.start_ms + e.modeled_ms);  // the link model's time, if any
    } catch (const std::exception& ex) {
      error = std::make_exception_ptr(Error(std::string(ex.what()) + "\n[scalelab]   during " +
                                            describe_call(e.op, e.count, e.dtype, rank_, size_, e.tag)));
    }
    e.end_ms = Communicator::now_ms();
    e.wait_ms = e.end_ms - e.issue_ms;
    log_->add(std::move(e));
    if (error) std::rethrow_exception(error);
    return finished_work();
  }

  // Hands the op to the communication thread.
  WorkPtr submit(const std::shared_ptr<Op>& o) {
    pending_.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.push_back(o);
    }
    queue_cv_.notify_one();
    return std::make_shared<MpiWork>(o);
  }

  // --- the communication thread --------------------------------------------------------------
  void thread_main() {
    std::vector<std::shared_ptr<Op>> in_flight;  // posted sends and recvs, not yet completed
    for (;;) {
      std::shared_ptr<Op> op;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        auto ready = [&] { return stop_ || !queue_.empty(); };
        if (in_flight.empty()) {
          queue_cv_.wait(lock, ready);
        } else {
          queue_cv_.wait_for(lock, kPollInterval, ready);  // come back to poll the transfers
        }
        if (!queue_.empty()) {
          op = queue_.front();
          queue_.pop_front();
        } else if (stop_ && in_flight.empty()) {
          return;
        }
      }
      if (op) start(op, in_flight);
      poll(in_flight);
    }
  }

  // Runs a collective to its end, or posts a send or recv into in_flight.
  void start(const std::shared_ptr<Op>& op, std::vector<std::shared_ptr<Op>>& in_flight) {
    const double start_ms = Communicator::now_ms();
    if (op->event_id != kNoEvent) log_->set_start(op->event_id, start_ms);
    // The link is busy with one op at a time: this thread sleeps out a collective's modelled time
    // before it picks up the next op. (Sends and recvs overlap other ops, like a full-duplex link.)
    op->not_before_ms = start_ms + op->modeled_ms;
    try {
      if (op->is_p2p()) {
        op->header.send_start_host_ms = to_host_clock_ms(start_ms);  // a send's header says when it started
        op->post(op->requests);
        in_flight.push_back(op);
        return;
      }
      op->run();
      // The link model's remaining time (if any), keeping the sends and recvs moving meanwhile.
      for (double left_ms = op->not_before_ms - Communicator::now_ms(); left_ms > 0;
           left_ms = op->not_before_ms - Communicator::now_ms()) {
        poll(in_flight);
        std::this_thread::sleep_for(std::min<std::chrono::duration<double, std::micro>>(
            kPollInterval, std::chrono::duration<double, std::milli>(left_ms)));
      }
      finish(op, nullptr);
    } catch (const std::exception& e) {
      finish(op, std::make_exception_ptr(Error(std::string(e.what()) + "\n[scalelab]   during " + op->what)));
    }
  }

  // Completes the sends and recvs whose transfer is done and whose modelled time has passed (a recv's:
  // from its sender's start, set by its complete()).
  void poll(std::vector<std::shared_ptr<Op>>& in_flight) {
    for (size_t i = 0; i < in_flight.size();) {
      const std::shared_ptr<Op>& op = in_flight[i];
      std::exception_ptr error;
      try {
        if (!op->transferred) {
          int flag = 0;
          SL_MPI_CALL(MPI_Testall(2, op->requests, &flag, op->statuses));
          if (flag) {
            op->transferred = true;
            op->complete(op->statuses[1]);  // the payload's status
          }
        }
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(std::string(e.what()) + "\n[scalelab]   during " + op->what));
      }
      if (error || (op->transferred && Communicator::now_ms() >= op->not_before_ms)) {
        finish(op, error);
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  void finish(const std::shared_ptr<Op>& op, std::exception_ptr error) {
    if (op->event_id != kNoEvent) log_->set_end(op->event_id, Communicator::now_ms());
    // Done with MPI for this op: a blocking call issued after this may run on the caller's thread.
    pending_.fetch_sub(1, std::memory_order_release);
    // The closures hold the op's tensors: drop them BEFORE the caller wakes, so a caller that drops its
    // own references after wait() frees the bytes at once (the allocator's counts are exact).
    op->run = nullptr;
    op->post = nullptr;
    op->complete = nullptr;
    {
      std::lock_guard<std::mutex> lock(op->mu);
      op->done = true;
      op->error = error;
    }
    op->cv.notify_all();
  }

  static constexpr std::chrono::microseconds kPollInterval{50};  // while sends/recvs are in flight

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<EventLog> log_ = std::make_shared<EventLog>();  // shared with the Ops (wait_ms)

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Op>> queue_;  // issued, not yet started
  std::atomic<int> pending_{0};  // ops handed to the thread and not finished (queued, running or in flight)
  bool stop_ = false;
  bool deliver_at_wait_ = false;  // SL_COMM_DELIVER_AT_WAIT (file comment)
  std::thread thread_;  // the communication thread, started by the constructor's body
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  mpi_init_once();
  // A duplicate of the world: this communicator's messages never mix with anyone else's (another
  // communicator, a library using MPI_COMM_WORLD), and it can be freed.
  MPI_Comm comm = MPI_COMM_NULL;
  SL_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  int world_size = 1;
  SL_MPI_CALL(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  return std::make_unique<MpiCommunicator>(comm, "world", default_topology(world_size));
}

}  // namespace scalelab::comm_detail
