// mpi.cpp — the `mpi` communicator (comm.h), over OpenMPI. Compiled only where CMake found MPI
// (SL_WITH_MPI, common/CMakeLists.txt). Design notes: docs/communicator.md.
//
// Progress. A non-blocking MPI collective (MPI_Iallreduce) barely moves while the caller computes,
// unless someone calls into MPI (docs/design.md "Platform facts"). So every call of a communicator is
// handed, in issue order, to ONE communication thread of that communicator, which executes the
// blocking MPI call (MPI_Allreduce, ...) while the caller's thread computes. An *_async call returns
// a Work that waits for its op; overlap with compute is real and measurable. Needs MPI_THREAD_MULTIPLE
// (several communicators = several threads in MPI at once).
// Point to point does not block that thread: a send or recv is posted (MPI_Isend / MPI_Irecv) and
// completed later by polling, so "send to next, recv from previous" around a ring cannot deadlock.
//
// Tests: tests/common/comm/test_comm_mpi.cpp (2 and 4 ranks). NCCL twin: common/src/comm/nccl.cpp
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_internal.h"  // defines: EventLog, make_event, check_*, describe_call
#include "scalelab/core/bf16.h"     // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/comm/comm.h"
#include "scalelab/core/error.h"

#ifdef SL_WITH_CUDA
#include "scalelab/core/cuda_check.h"  // defines: SL_CUDA_CHECK (cuda_runtime.h)
#endif

// SL_MPI_CALL(call): like SL_MPI_CHECK (error.h), with MPI's own words for the error.
#define SL_MPI_CALL(call)                                                                          \
  do {                                                                                             \
    const int sl_rc_ = (call);                                                                     \
    if (sl_rc_ != MPI_SUCCESS) {                                                                   \
      char sl_msg_[MPI_MAX_ERROR_STRING] = {0};                                                    \
      int sl_len_ = 0;                                                                             \
      MPI_Error_string(sl_rc_, sl_msg_, &sl_len_);                                                 \
      ::scalelab::detail::fail("MPI", #call, __FILE__, __LINE__, __func__,                        \
                               ::scalelab::detail::format("MPI error %d: %s", sl_rc_, sl_msg_),   \
                               "a peer may have failed first: read every rank's output");         \
    }                                                                                              \
  } while (0)

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
  // copy_in: fill the host copy from the device now (the tensor is an input).
  HostStage(const Tensor& t, int cuda_device, bool copy_in) : t_(t) {
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
    if (pinned_) SL_CUDA_CHECK(cudaMemcpy(t_.raw(), pinned_, t_.nbytes(), cudaMemcpyHostToDevice));
#endif
  }

 private:
  Tensor t_;  // keeps the storage alive
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

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// ---------------------------------------------------------------------------------------------
// One call on its way through the communication thread, shared with the Work that waits for it.
struct Op {
  std::string what;       // "all_reduce of 1000 f32 elements on rank 1 of 4": for error messages
  uint64_t event_id = 0;  // its CommEvent in the log
  std::shared_ptr<EventLog> log;  // that log (shared: a Work may outlive its communicator); null: no event
  double modeled_ms = 0;  // the link model's time: the op completes no earlier than start + this

  // A collective (or barrier, split): the blocking MPI call(s), staging included.
  std::function<void()> run;
  // A send or recv: post posts MPI_Isend / MPI_Irecv; complete runs once the transfer is done.
  std::function<MPI_Request()> post;
  std::function<void(const MPI_Status&)> complete;
  bool is_p2p() const { return static_cast<bool>(post); }

  // Set by the communication thread.
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Status status{};
  bool transferred = false;   // p2p: MPI says the request is done
  double not_before_ms = 0;   // start + modeled_ms

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
  // Takes ownership of comm (a duplicate of MPI_COMM_WORLD or the result of a split).
  MpiCommunicator(MPI_Comm comm, const LinkModel& link) : comm_(comm), link_(link) {
    SL_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
    SL_MPI_CALL(MPI_Comm_size(comm_, &size_));
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

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  // --- collectives -------------------------------------------------------------------------
  WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("all_reduce", rank_, size_, buf.dtype(), op);
    check_count_fits_int("all_reduce", rank_, buf.numel());
    auto o = new_op("all_reduce", tag, buf.numel(), buf.dtype(), -1);
    const int dev = caller_cuda_device(buf, buf);
    o->run = [this, buf, op, dev] {
      HostStage h(buf, dev, /*copy_in=*/true);
      all_reduce_host(h.ptr(), buf.numel(), buf.dtype(), op);
      h.copy_out();
    };
    return submit(o);
  }

  WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("reduce_scatter", rank_, size_, in.dtype(), op);
    check_reduce_scatter(rank_, size_, in, out);
    check_count_fits_int("reduce_scatter", rank_, in.numel());
    auto o = new_op("reduce_scatter", tag, in.numel(), in.dtype(), -1);
    const int dev = caller_cuda_device(in, out);
    o->run = [this, in, out, op, dev] {
      HostStage h_in(in, dev, /*copy_in=*/true);
      HostStage h_out(out, dev, /*copy_in=*/false);
      reduce_scatter_host(h_in.ptr(), h_out.ptr(), out.numel(), in.dtype(), op);
      h_out.copy_out();
    };
    return submit(o);
  }

  WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag) override {
    check_all_gather(rank_, size_, in, out);
    check_count_fits_int("all_gather", rank_, out.numel());
    auto o = new_op("all_gather", tag, in.numel(), in.dtype(), -1);
    const int dev = caller_cuda_device(in, out);
    o->run = [this, in, out, dev] {
      HostStage h_in(in, dev, /*copy_in=*/true);
      HostStage h_out(out, dev, /*copy_in=*/false);
      all_gather_host(h_in.ptr(), h_out.ptr(), in.numel(), in.dtype());
      h_out.copy_out();
    };
    return submit(o);
  }

  WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag) override {
    check_root("broadcast", rank_, size_, root);
    check_count_fits_int("broadcast", rank_, buf.numel());
    auto o = new_op("broadcast", tag, buf.numel(), buf.dtype(), root);
    const int dev = caller_cuda_device(buf, buf);
    o->run = [this, buf, root, dev] {
      HostStage h(buf, dev, /*copy_in=*/rank_ == root);
      SL_MPI_CALL(MPI_Bcast(h.ptr(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), root, comm_));
      if (rank_ != root) h.copy_out();
    };
    return submit(o);
  }

  void barrier() override {
    auto o = new_op("barrier", "", 0, DType::F32, -1);
    o->run = [this] { SL_MPI_CALL(MPI_Barrier(comm_)); };
    submit(o)->wait();
  }

  // --- point to point ----------------------------------------------------------------------
  WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag) override {
    check_peer("send", rank_, size_, peer);
    check_count_fits_int("send", rank_, buf.numel());
    auto o = new_op("send", tag, buf.numel(), buf.dtype(), peer);
    const int dev = caller_cuda_device(buf, buf);
    auto stage = std::make_shared<std::unique_ptr<HostStage>>();  // lives until the send completes
    o->post = [this, buf, peer, dev, stage] {
      *stage = std::make_unique<HostStage>(buf, dev, /*copy_in=*/true);
      MPI_Request req;
      SL_MPI_CALL(MPI_Isend((*stage)->ptr(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), peer,
                            kTag, comm_, &req));
      return req;
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
    o->post = [this, buf, peer, dev, stage] {
      *stage = std::make_unique<HostStage>(buf, dev, /*copy_in=*/false);
      MPI_Request req;
      SL_MPI_CALL(MPI_Irecv((*stage)->ptr(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), peer,
                            kTag, comm_, &req));
      return req;
    };
    o->complete = [this, buf, peer, stage](const MPI_Status& status) {
      int received = 0;
      SL_MPI_CALL(MPI_Get_count(&status, mpi_type(buf.dtype()), &received));
      SL_CHECK_HINT(received == buf.numel(), "send and recv the same number of elements",
                    "recv on rank %d of %d: expected %lld %s elements from rank %d, got %d", rank_, size_,
                    static_cast<long long>(buf.numel()), dtype_name(buf.dtype()), peer, received);
      (*stage)->copy_out();
      stage->reset();
    };
    return submit(o);
  }

  // --- the rest ------------------------------------------------------------------------------
  std::unique_ptr<Communicator> split(int color, int key) override {
    SL_CHECK_HINT(color >= 0, "colors are >= 0 (as in MPI_Comm_split)", "split on rank %d of %d: color %d",
                  rank_, size_, color);
    // MPI_Comm_split is a collective on comm_: it runs on the communication thread, in order with
    // the calls issued before it (two threads must never run collectives on one communicator).
    MPI_Comm child = MPI_COMM_NULL;
    auto o = std::make_shared<Op>();
    o->what = "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ") on rank " +
              std::to_string(rank_) + " of " + std::to_string(size_);
    o->event_id = kNoEvent;
    o->run = [this, color, key, &child] { SL_MPI_CALL(MPI_Comm_split(comm_, color, key, &child)); };
    submit(o)->wait();
    return std::make_unique<MpiCommunicator>(child, link_);
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    std::fprintf(stderr, "[scalelab] rank %d of %d aborts the job: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);  // ends every rank, also those waiting in a collective
    std::_Exit(exit_code);                 // not reached
  }

  void set_link_model(const LinkModel& link) override { link_ = link; }
  const LinkModel& link_model() const override { return link_; }
  std::vector<CommEvent> events() const override { return log_->snapshot(); }
  void clear_events() override { log_->clear(); }

 private:
  static constexpr int kTag = 0;  // one MPI tag: order between two ranks is the order of the calls
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
  std::shared_ptr<Op> new_op(const std::string& name, const std::string& tag, int64_t count, DType dtype,
                             int peer) {
    auto o = std::make_shared<Op>();
    const bool async = !issuing_blocking_call() && name != "barrier";
    const CommEvent e = make_event(name, tag, count, dtype, size_, async, peer, link_);
    o->what = describe_call(name, count, dtype, rank_, size_, tag);
    o->modeled_ms = e.modeled_ms;
    o->event_id = log_->add(e);
    o->log = log_;
    return o;
  }

  WorkPtr submit(const std::shared_ptr<Op>& o) {
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

  void start(const std::shared_ptr<Op>& op, std::vector<std::shared_ptr<Op>>& in_flight) {
    const double start_ms = Communicator::now_ms();
    if (op->event_id != kNoEvent) log_->set_start(op->event_id, start_ms);
    // The link is busy with one op at a time: this thread sleeps out a collective's modelled time
    // before it picks up the next op. (Sends and recvs overlap other ops, like a full-duplex link.)
    op->not_before_ms = start_ms + op->modeled_ms;
    try {
      if (op->is_p2p()) {
        op->request = op->post();
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

  // Completes the sends and recvs whose transfer is done and whose modelled time has passed.
  void poll(std::vector<std::shared_ptr<Op>>& in_flight) {
    for (size_t i = 0; i < in_flight.size();) {
      const std::shared_ptr<Op>& op = in_flight[i];
      std::exception_ptr error;
      try {
        if (!op->transferred) {
          int flag = 0;
          SL_MPI_CALL(MPI_Test(&op->request, &flag, &op->status));
          if (flag) {
            op->transferred = true;
            op->complete(op->status);
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
  LinkModel link_;  // read and written by the caller's thread only (each op keeps its modelled time)
  std::shared_ptr<EventLog> log_ = std::make_shared<EventLog>();  // shared with the Ops (wait_ms)

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Op>> queue_;  // issued, not yet started
  bool stop_ = false;
  std::thread thread_;  // the communication thread, started by the constructor's body
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  mpi_init_once();
  // A duplicate of the world: this communicator's messages never mix with anyone else's (another
  // communicator, a library using MPI_COMM_WORLD), and it can be freed.
  MPI_Comm comm = MPI_COMM_NULL;
  SL_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::make_unique<MpiCommunicator>(comm, LinkModel{});
}

}  // namespace scalelab::comm_detail
