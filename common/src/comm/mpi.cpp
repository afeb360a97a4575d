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
// It is posted on the caller's own thread when nothing is queued ahead of it, and its Work's wait()
// and test() test it there (MPI_Testall): no thread hand-off between the call and the bytes (three
// hand-offs cost 0.2-3 ms a message on a 2-core machine; now a few us, bench/p2p.md).
// With a link model each payload travels behind a header with the send's start time, so a recv completes
// no earlier than that start + the modelled time (comm_internal.h MessageHeader); without one a send is
// one MPI message. Per message the caller's thread formats no text (an error's or a timeout's words are
// made from the op's fields when one happens) and allocates little (the op, its Work, the event). The
// blocking send, recv and sendrecv need not even those (blocking_p2p): with nothing pending they post and
// test their messages on the caller's stack, and hand them to the ops above only when the peer is late.
//
// Delivery at wait (SL_COMM_DELIVER_AT_WAIT=1; every graded multi-rank check runs so). MPI runs the
// collectives in issue order, so with results written at once a caller who waits for the LAST of several
// async ops finds the earlier ones done too, and code that forgets a wait() passes by luck. In this
// mode an async op on CPU tensors computes into a private copy and writes its output tensor only when
// ITS Work is waited for (or destroyed): a forgotten wait() leaves stale bytes that a check sees.
//
// Wait timeout (comm.h set_wait_timeout). A Work's wait gives up after the op's timeout and throws an
// error naming this rank, the group, the op, its peer and tag, and the other ops still pending here
// (PendingOps), so a deadlocked pipeline schedule explains itself on every rank. The op is abandoned,
// the communicator refuses new calls, and its destructor tells the communication thread to cancel
// the posted sends and recvs (MPI_Cancel, then MPI_Request_free for what MPI cannot cancel) instead
// of finishing them. A collective the thread is already inside cannot be cancelled (MPI has no way):
// the caller's wait still throws, but the destructor then waits for that thread (it says so on stderr).
//
// The sim backend's transport (make_mpi_communicator(/*sim_transport=*/true), common/src/comm/sim.cpp): the
// same communicator, which also moves SIM tensors (host memory, as a CPU tensor's) and has no link model,
// so it times nothing; the sim backend times its calls in virtual time. Otherwise SIM tensors are refused.
//
// Tests: tests/common/comm/test_comm_mpi.cpp (2 and 4 ranks). NCCL twin: common/src/comm/nccl.cpp
#include <mpi.h>

#include <algorithm>  // defines: std::remove_if
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm_internal.h"       // defines: EventLog, make_event, check_*, describe_call, MessageHeader
#include "mpi_internal.h"        // defines: SL_MPI_CALL, mpi_world_ranks, mpi_split_color
#include "scalelab/core/bf16.h"  // defines: bf16, float_to_bf16, bf16_to_float
#include "scalelab/comm/comm.h"
#include "scalelab/comm/staging_pool.h"  // defines: StagingPool
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
// Host staging: the bytes MPI reads or writes for a tensor. A CPU tensor's own memory (and a SIM tensor's,
// which is host memory too: the sim backend's transport, below); for a CUDA tensor a pinned host copy
// (Debian's OpenMPI is not CUDA-aware, docs/design.md "Platform facts"). This path is the fallback for
// several ranks sharing one GPU, where NCCL refuses to run (docs/cuda_backend.md "The mpi backend on GPUs").
//   buffers  from the communicator's StagingPool (scalelab/comm/staging_pool.h): pinned buffers reused
//            across calls, not one cudaMallocHost + cudaFreeHost (each synchronises the device) per call;
//   order    the copies run on the communicator's own non-blocking copy stream, after an event recorded on
//            the compute stream (the legacy default stream, where the kit's kernels run) when the call was
//            ISSUED: they wait for the kernels that produced the tensor, not for the kernels queued after
//            the issue, so an async call's time is communication, not the caller's later GPU compute.

// How one call stages its tensors, made on the caller's thread at issue (MpiCommunicator::staging_for) and
// carried by the call's closure. device < 0: host tensors only, nothing is staged or copied.
struct Staging {
  int device = -1;                    // the caller's CUDA device (the communication thread uses the same)
  std::shared_ptr<StagingPool> pool;  // the communicator's pinned buffers
#ifdef SL_WITH_CUDA
  std::shared_ptr<CUstream_st> stream;  // the communicator's copy stream (non-blocking)
  std::shared_ptr<CUevent_st> ready;    // recorded on the compute stream at issue
#endif
};

class HostStage {
 public:
  // copy_in: fill the host copy from the device now (the tensor is an input). The tensor's storage is
  // kept alive by the op (its buf, or a collective's closure), which outlives its stage; the stage itself
  // holds only pointers.
  HostStage(const Tensor& t, const Staging& s, bool copy_in) : device_ptr_(t.raw()), nbytes_(t.nbytes()) {
    if (t.device() != Device::CUDA || t.nbytes() == 0) {
      ptr_ = t.raw();
      return;
    }
#ifdef SL_WITH_CUDA
    SL_CUDA_CHECK(cudaSetDevice(s.device));  // this thread's current device: the caller's
    pinned_ = s.pool->acquire(nbytes_);
    ptr_ = pinned_.data();
    stream_ = s.stream;
    // The copy stream waits for the compute stream as it was at the issue (a wait queued on a stream holds
    // for everything queued after it there, copy_out's copy included).
    SL_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), s.ready.get(), 0));
    if (copy_in) {
      SL_CUDA_CHECK(cudaMemcpyAsync(ptr_, t.raw(), nbytes_, cudaMemcpyDeviceToHost, stream_.get()));
      SL_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // MPI reads the bytes next
    }
#else
    (void)s;
    (void)copy_in;
    SL_FAIL("rebuild with CUDA", "a CUDA tensor in a build without CUDA");
#endif
  }
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;

  void* ptr() const { return ptr_; }
  // The tensor is an output: write the host copy back to the device (nothing to do on the CPU). It is on the
  // device when this returns: the caller's kernels after its wait() read it.
  void copy_out() {
#ifdef SL_WITH_CUDA
    if (!pinned_.data()) return;
    SL_CUDA_CHECK(cudaMemcpyAsync(device_ptr_, ptr_, nbytes_, cudaMemcpyHostToDevice, stream_.get()));
    SL_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
#endif
  }

 private:
  void* device_ptr_;  // the tensor's own bytes (on the GPU when pinned_ holds a buffer)
  size_t nbytes_;
  void* ptr_ = nullptr;
  StagingPool::Lease pinned_;  // the pinned buffer, back to the pool when the stage ends
#ifdef SL_WITH_CUDA
  std::shared_ptr<CUstream_st> stream_;
#endif
};

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

struct Op;

// What a communicator shares with its Ops (a Work may outlive its communicator): the ops handed to the
// communication thread and not finished yet, listed by a wait timeout's message, and whether a wait
// has timed out. It holds the ops themselves, not their words: an op is listed from its issue until
// finish() removes it (it is alive all that time: the queue, the thread or its Work holds it), and its
// words are formatted only when a timeout lists them. No allocation per op once the list has grown.
struct PendingOps {
  std::atomic<bool> timed_out{false};

  uint64_t add(const Op* op) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.emplace_back(next_, op);
    return next_++;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < ops_.size(); ++i) {  // few entries; the oldest usually finishes first
      if (ops_[i].first == id) {
        ops_.erase(ops_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
  }
  // "send to rank 0 (world rank 0), tag 'x'; recv from ..." in issue order, without op `id`; "" if none.
  std::string others(uint64_t id) const;  // (defined after Op)

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, const Op*>> ops_;  // issue number -> the op, in issue order
  uint64_t next_ = 0;
};

// Who has called which collective, so that a wait timeout can name the ranks that did not join. Each
// collective a rank hands to its communication thread is announced to every other rank of the group: a
// small message (its number in this rank's sequence of collectives, and what it is) on a duplicate of
// the group's MPI_Comm, sent non-blocking. A rank reads the announcements that have arrived whenever it
// announces one (so they do not pile up) and when a wait times out; it then compares every rank's last
// number with its own. A rank that never announced the op has stopped, is slow, or waits for something
// else first; one that announced another op under the same number calls the collectives in another
// order. Costs (size - 1) sends of 104 bytes per collective and rank, only with a wait timeout set.
class Roll {
 public:
  struct Call {
    uint64_t seq = 0;    // 1, 2, ...: the rank's collectives in issue order
    char what[96] = {};  // "all_reduce of 1000 f32 elements, tag 'loss'"
  };

  Roll(MPI_Comm group, int rank, int size) : rank_(rank), size_(size), heard_(static_cast<size_t>(size)) {
    SL_MPI_CALL(MPI_Comm_dup(group, &comm_));
    SL_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  ~Roll() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& [req, call] : sends_) {  // an announcement still in flight: MPI may still read its buffer
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) {
        MPI_Request_free(&req);
        new std::shared_ptr<Call>(call);  // kept for good (a few bytes), as cancel() keeps ops
      }
    }
    MPI_Comm_free(&comm_);
  }

  // Announces this rank's next collective to every other rank; returns its number.
  uint64_t announce(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    auto call = std::make_shared<Call>();
    call->seq = ++issued_;
    std::snprintf(call->what, sizeof call->what, "%s", what.c_str());
    for (int peer = 0; peer < size_; ++peer) {
      MPI_Request req = MPI_REQUEST_NULL;
      if (peer == rank_ || MPI_Isend(call.get(), sizeof(Call), MPI_BYTE, peer, 0, comm_, &req) != MPI_SUCCESS) continue;
      sends_.emplace_back(req, call);
    }
    mine_.push_back(*call);
    if (mine_.size() > kHistory) mine_.pop_front();
    drain();
    return issued_;
  }

  // What a wait timeout of this rank's collective number `seq` adds: "Ranks of the group that have not
  // called it: rank 2 (world rank 2; its last collective: #4, barrier). "; `stopped` says whether the
  // ranks named simply have not got there (stopped or slow) rather than called another op in its place.
  std::string absent(uint64_t seq, const std::vector<int>& world_ranks, bool& stopped) {
    std::lock_guard<std::mutex> lock(mu_);
    drain();
    std::string mine;
    for (const Call& c : mine_) {
      if (c.seq == seq) mine = c.what;
    }
    std::string behind, other;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::string who = "rank " + std::to_string(r) + " (world rank " + std::to_string(world_ranks[r]);
      const std::deque<Call>& h = heard_[static_cast<size_t>(r)];
      const uint64_t last = h.empty() ? 0 : h.back().seq;
      if (last < seq) {
        behind += (behind.empty() ? "" : ", ") + who +
                  (last == 0 ? "; no collective yet)"
                             : "; its last collective: #" + std::to_string(last) + ", " + h.back().what + ")");
        continue;
      }
      for (const Call& c : h) {
        if (c.seq == seq && op_of(c.what) != op_of(mine)) {
          other += (other.empty() ? "" : ", ") + who + ") called #" + std::to_string(seq) + ", " + c.what;
        }
      }
    }
    stopped = other.empty();
    std::string s = "It is collective #" + std::to_string(seq) + " of this rank on this group. ";
    if (!behind.empty()) s += "Ranks of the group that have not called it: " + behind + ". ";
    if (!other.empty()) s += "Ranks that called another collective as #" + std::to_string(seq) + ": " + other + ". ";
    if (behind.empty() && other.empty()) s += "Every rank of the group has called it. ";
    return s;
  }

 private:
  // "all_reduce of 1000 f32 elements, tag 'x'" -> "all_reduce of 1000 f32 elements": what must match.
  static std::string op_of(const std::string& what) { return what.substr(0, what.find(", tag")); }

  // Reads every announcement that has arrived, and forgets the sends MPI has finished (mu_ held).
  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, 0, comm_, &flag, &st) != MPI_SUCCESS || !flag) break;
      Call c;
      if (MPI_Recv(&c, sizeof c, MPI_BYTE, st.MPI_SOURCE, 0, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      c.what[sizeof c.what - 1] = '\0';
      std::deque<Call>& h = heard_[static_cast<size_t>(st.MPI_SOURCE)];
      h.push_back(c);
      if (h.size() > kHistory) h.pop_front();
    }
    while (!sends_.empty()) {
      int done = 0;
      if (MPI_Test(&sends_.front().first, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
      sends_.pop_front();
    }
  }

  static constexpr size_t kHistory = 64;  // announcements kept per rank
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_, size_;
  std::mutex mu_;
  uint64_t issued_ = 0;
  std::deque<Call> mine_;                                            // this rank's latest calls
  std::deque<std::pair<MPI_Request, std::shared_ptr<Call>>> sends_;  // in flight
  std::vector<std::deque<Call>> heard_;                              // per rank: its latest announcements
};

// A waiter on a send or recv (MpiWork, MpiCommunicator::blocking_p2p) first tests it this long without
// yielding the core: a yield is a system call (~0.3-1 us in a VM), as long as a small message itself, and a
// message that arrives during one waits for its end. Then it yields between tests (Op::spin_ms).
constexpr double kPureSpinMs = 0.01;

// One call on its way through the communication thread, shared with the Work that waits for it.
struct Op {
  // What it is, kept as fields; the words of an error or a timeout's message (what(), waited_for()) are
  // formatted only when one needs them: formatting them for every call cost more than a small message
  // itself takes (bench/p2p.md).
  const char* name = "";  // "send", "all_reduce", ... (a string literal)
  std::string tag;        // the caller's tag ("" none)
  int64_t count = 0;      // elements
  DType dtype = DType::F32;
  int peer = -1;            // send/recv: the other rank; broadcast: the root; -1: none (ranks of the group)
  int peer_world = -1;      // that rank's world rank
  int rank = 0, size = 1;   // this rank, the group's size
  std::string fixed_words;  // split: "split(color 1, key 0, 'tp')" instead of the fields
  // "all_reduce of 1000 f32 elements on rank 1 of 4 (tag 'x')": for error messages
  std::string what() const {
    if (!fixed_words.empty()) return fixed_words + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
    return describe_call(name, count, dtype, rank, size, tag);
  }
  // "recv from rank 0 (world rank 0), tag 'activation mb 3'": what a wait for it waits for
  std::string waited_for() const {
    return fixed_words.empty() ? describe_wait(name, peer, peer_world, tag) : fixed_words;
  }

  uint64_t event_id = 0;          // its CommEvent in the log
  std::shared_ptr<EventLog> log;  // that log (shared: a Work may outlive its communicator); null: no event
  double modeled_ms = 0;          // the link model's time: the op completes no earlier than start + this

  // A collective (or barrier, split): the blocking MPI call(s), staging included.
  std::function<void()> run;
  // A send or recv: its tensor (kept alive until it is finished), how it is staged, and the staged bytes
  // (MpiCommunicator::post_p2p posts it, complete_p2p ends it). Fields, not closures: no allocation.
  enum class Kind { Collective, Send, Recv };
  Kind kind = Kind::Collective;
  Tensor buf;
  Staging staging;
  std::optional<HostStage> stage;  // from posting to completion
  bool is_p2p() const { return kind != Kind::Collective; }
  // p2p: may be posted on the caller's thread (submit). Not a CUDA tensor's: its staging copy would block
  // the caller until the kernels before it are done; the communication thread posts those.
  bool post_on_caller = true;
  // p2p: a header travels ahead of the payload (the communicator has a link model: a recv completes no
  // earlier than the send's start + the modelled time). Without one the payload goes alone: one MPI
  // message a send, as plain MPI_Isend. Every rank of a group has the same link (set_link_model,
  // set_topology on every rank alike), so sender and receiver agree.
  bool with_header = false;

  // Set by the thread that runs it.
  MessageHeader header;  // p2p with_header: the send's start, sent ahead of the payload (a recv's: received)
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // p2p: header, payload
  MPI_Status statuses[2] = {};
  bool transferred = false;  // p2p: MPI says both requests are done
  double not_before_ms = 0;  // start + modeled_ms; a recv: the send's start + modeled_ms
  // p2p: who may test the requests now. The communication thread polls them and the caller's wait()
  // tests them too (MpiCommunicator::advance); whoever sets this first tests, the other skips a turn.
  std::atomic<bool> testing{false};
  std::atomic<bool> posted{false};  // p2p: requests hold the posted MPI_Isend / MPI_Irecv (until then: nothing to test)
  bool finished = false;            // p2p: finish() has run (read and written only while holding `testing`)
  double spin_ms = 0;               // p2p: how long a waiter tests without sleeping (MpiWork::progress_until_done)
  // p2p: one turn of advance() for this op (true: it is finished), set by submit(). Called by a waiter
  // only while the op is not done: the communicator outlives its unfinished ops (its destructor waits).
  std::function<bool()> progress;

  // Delivery at wait: the output, written by the Work's wait() (or destructor); null otherwise.
  std::shared_ptr<Delivery> delivery;

  // The wait timeout (set by submit()): its limit and the words of its message.
  double timeout_s = 0;  // the communicator's wait timeout when the op was issued, seconds; 0: forever
  std::shared_ptr<const std::string> who;  // "rank 1 of group 'pp' (world rank 1)" (the communicator's)
  std::shared_ptr<PendingOps> pending;     // the communicator's list, where this op is entry pending_id
  uint64_t pending_id = 0;
  std::shared_ptr<Roll> roll;    // a collective: who has called what (null: a send, recv, or a group of one)
  uint64_t roll_seq = 0;         // its number in this rank's collectives on the group
  std::vector<int> world_ranks;  // the group's (for the names in the message)
  bool leaked = false;           // the thread freed requests MPI could not cancel: the op is kept for good

  // finish() has run: the op holds nothing the communication thread must still poll (read without op.mu
  // by submit, which drops such ops from the list of caller-posted ones).
  std::atomic<bool> settled{false};

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  bool error_seen = false;
  bool abandoned = false;  // a wait timed out: nobody waits again, nothing is delivered, error stays
};

std::string PendingOps::others(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string list;
  for (const auto& [other, op] : ops_) {
    if (other != id) list += (list.empty() ? "" : "; ") + op->waited_for();
  }
  return list;
}

class MpiWork : public Work {
 public:
  explicit MpiWork(std::shared_ptr<Op> op) : op_(std::move(op)) {}
  ~MpiWork() override {
    // The tensors must stay untouched until the op is done, so an unfinished Work waits (and that
    // wait is the caller's too: it counts in wait_ms). Not after a timeout: an abandoned op is never
    // waited for again, nor an unfinished one after another wait of its communicator timed out (that
    // error listed it; waiting could hang the unwinding of a deadlocked step).
    std::unique_lock<std::mutex> lock(op_->mu);
    if (op_->abandoned) return;
    if (!op_->done && op_->pending && op_->pending->timed_out) {
      op_->abandoned = true;
      return;
    }
    try {
      block_until_done(lock);
    } catch (const std::exception& e) {  // the timeout: a destructor must not throw
      std::fprintf(stderr, "[scalelab] an operation nobody waited for timed out:\n%s\n", e.what());
      return;
    }
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
    if (op_->abandoned) std::rethrow_exception(op_->error);  // its timeout, again, at once
    block_until_done(lock);
    if (op_->error) {
      op_->error_seen = true;
      std::rethrow_exception(op_->error);
    }
    if (op_->delivery) op_->delivery->deliver();
  }
  // A send or recv is tested here too (one MPI_Testall, as MPI_Test would): one the caller posted
  // moves when the caller calls into MPI (test, wait) or the communication thread is awake (submit).
  bool test() override {
    {
      std::lock_guard<std::mutex> lock(op_->mu);
      if (op_->done) return true;
    }
    if (op_->progress) op_->progress();
    std::lock_guard<std::mutex> lock(op_->mu);
    return op_->done;
  }

 private:
  // Blocks until the communication thread has finished the op; the time blocked goes to the event's
  // wait_ms. An op already done adds nothing: its communication was hidden from this caller. With a
  // timeout, throws once it has waited that long (time_out).
  void block_until_done(std::unique_lock<std::mutex>& lock) {
    if (op_->done) return;
    const double t0_ms = Communicator::now_ms();
    auto finished = [&] { return op_->done; };
    bool done = true;
    if (op_->progress) {
      done = progress_until_done(lock, t0_ms);
    } else if (op_->timeout_s > 0) {  // (capped at ~30 years, so the deadline cannot overflow the clock)
      done = op_->cv.wait_for(lock, std::chrono::duration<double>(std::min(op_->timeout_s, 1e9)), finished);
    } else {
      op_->cv.wait(lock, finished);
    }
    const double waited_ms = Communicator::now_ms() - t0_ms;
    if (op_->log) op_->log->add_wait(op_->event_id, waited_ms);
    if (!done) time_out(waited_ms);
  }

  // A send or recv: its requests are tested right here, on the caller's thread (MPI_Testall, through
  // op_->progress), so the caller resumes as soon as MPI says the bytes are there, not when the
  // communication thread next polls and then wakes it (two thread hand-offs: 1-3 ms on a 2-core
  // machine with both ranks busy, against ~1 us for the message itself). It spins for op_->spin_ms:
  // the time in which a peer that is about to send usually has, plus the time the bytes take (a large
  // message crosses shared memory in fragments, each needing a test on both sides: tests far apart
  // stretch it); a longer wait (a slow upstream stage, a rank waiting for rank 0) tests every kWaitPoll
  // and sleeps between the tests, so it costs no core (a spinning rank would also lose its core to the
  // other processes of a busy machine, and wait for it again).
  // The spin's first kPureSpinMs test without yielding; the spin reads the op's `settled` flag, not its
  // mutex (once finish() has set it, `done` follows at once under op_->mu).
  // Returns false when the op's timeout ran out first. `lock` holds op_->mu, released while testing.
  bool progress_until_done(std::unique_lock<std::mutex>& lock, double t0_ms) {
    const double deadline_ms = op_->timeout_s > 0 ? t0_ms + 1e3 * std::min(op_->timeout_s, 1e9) : -1;
    for (;;) {
      lock.unlock();
      bool settled = false;
      double now_ms = t0_ms;
      for (;;) {  // finishes the op once its transfer is complete (here, or the communication thread meanwhile)
        settled = op_->progress() || op_->settled.load(std::memory_order_acquire);
        if (settled) break;
        now_ms = Communicator::now_ms();
        if (now_ms - t0_ms >= op_->spin_ms || (deadline_ms >= 0 && now_ms >= deadline_ms)) break;
        // let a thread of this core run (a peer rank's, when oversubscribed)
        if (now_ms - t0_ms >= kPureSpinMs) std::this_thread::yield();
      }
      lock.lock();
      if (settled || op_->done) {
        op_->cv.wait(lock, [&] { return op_->done; });
        return true;
      }
      if (deadline_ms >= 0 && now_ms >= deadline_ms) return false;
      op_->cv.wait_for(lock, kWaitPoll, [&] { return op_->done; });  // past the spin: one test every kWaitPoll
    }
  }

  static constexpr std::chrono::microseconds kWaitPoll{50};  // a waiter's tests after its spin

  // The op waited past its timeout (op_->mu held): abandon it, tell the communicator (it refuses new
  // calls; its destructor cancels instead of finishing) and the process (comm_wait_timed_out), throw.
  [[noreturn]] void time_out(double waited_ms) {
    op_->abandoned = true;
    op_->error_seen = true;
    if (op_->pending) op_->pending->timed_out = true;
    note_wait_timed_out();
    const std::string others = op_->pending ? op_->pending->others(op_->pending_id) : std::string();
    bool stopped = true;  // a collective: the ranks that did not join have stopped (or are slow), not mismatched
    const std::string roll = op_->roll ? op_->roll->absent(op_->roll_seq, op_->world_ranks, stopped) : std::string();
    const std::string waited_for = op_->waited_for();
    try {
      SL_FAIL(op_->roll ? wait_timeout_hint_collective(op_->timeout_s, stopped) : wait_timeout_hint(op_->timeout_s),
              "%s waited %.1f s for %s: %s. %s%s", op_->who->c_str(), waited_ms / 1e3, waited_for.c_str(),
              wait_timeout_reason(waited_for), roll.c_str(),
              others.empty() ? "Nothing else is pending on this communicator"
                             : ("Still pending on this communicator: " + others).c_str());
    } catch (const Error&) {
      op_->error = std::current_exception();
    }
    std::rethrow_exception(op_->error);
  }

  std::shared_ptr<Op> op_;
};

// ---------------------------------------------------------------------------------------------
class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of comm (a duplicate of MPI_COMM_WORLD or the result of a split), the group
  // `name` with the topology it inherits.
  // moves_sim_memory: the sim backend's transport (make_mpi_transport), which also moves SIM tensors (host
  // memory).
  MpiCommunicator(MPI_Comm comm, const std::string& name, const Topology& topology, bool moves_sim_memory)
      : comm_(comm), moves_sim_memory_(moves_sim_memory) {
    SL_MPI_CALL(MPI_Comm_rank(comm_, &rank_));
    SL_MPI_CALL(MPI_Comm_size(comm_, &size_));
    init_group(name, mpi_world_ranks(comm_), topology);
    const char* at_wait = std::getenv("SL_COMM_DELIVER_AT_WAIT");
    deliver_at_wait_ = at_wait != nullptr && std::strcmp(at_wait, "") != 0 && std::strcmp(at_wait, "0") != 0;
    // Errors come back as return codes (SL_MPI_CALL turns them into exceptions naming the call)
    // instead of MPI's default of killing the job without a word about what we were doing.
    SL_MPI_CALL(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    who_ = std::make_shared<const std::string>(describe_rank(*this));
    if (size_ > 1) roll_ = std::make_shared<Roll>(comm_, rank_, size_);  // collective: every rank of the group
    thread_ = std::thread([this] { thread_main(); });
  }

  ~MpiCommunicator() override {
    std::string stuck_in;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stop_ = true;  // the thread finishes what was issued, then ends
      // After a timeout it cancels instead: the abandoned ops will never complete. With a timeout set,
      // sends and recvs still in flight (their Works outlive this communicator) get that long.
      abandon_ = pending_ops_->timed_out.load();
      if (wait_timeout() > 0) stop_deadline_ms_ = Communicator::now_ms() + 1e3 * wait_timeout();
    }
    queue_cv_.notify_all();
    if (abandon_) {
      // A collective whose late rank did call it after all returns within milliseconds: give the thread
      // kStuckCollectiveGraceS to leave it, so the communicator is joined and freed. One whose rank has
      // stopped never returns: then the thread is left there (below).
      std::unique_lock<std::mutex> lock(queue_mu_);
      running_cv_.wait_for(lock, std::chrono::duration<double>(kStuckCollectiveGraceS),
                           [this] { return running_ == nullptr; });
      if (running_) stuck_in = running_->waited_for();
    }
    if (!stuck_in.empty()) {
      // The collective cannot be cancelled, and it cannot return either: a rank it waits for has given up
      // (that is why the wait timed out). Joining would hang this rank for ever, so the thread is left
      // inside the MPI call and the communicator's MPI_Comm is not freed; the process must end soon after
      // (a graded check's program exits without MPI_Finalize after a timeout, tests/grading/graded_main.cpp;
      // a lab program aborts the job on the error, run_on_all_ranks).
      std::fprintf(stderr,
                   "[scalelab] %s: a wait on this communicator timed out, and its communication thread is "
                   "inside %s, an MPI collective that cannot be cancelled: left there (end the process)\n",
                   who_->c_str(), stuck_in.c_str());
      std::fflush(stderr);
      thread_.detach();
      return;
    }
    thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  using Communicator::split;  // the two-argument form

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::CPU; }  // CUDA tensors staged, SIM ones in the transport

  // --- collectives -------------------------------------------------------------------------
  // Each makes a closure that runs the blocking MPI call on host memory (HostStage) and hands it to
  // collective(), which runs it here or on the communication thread.
  WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("all_reduce", rank_, size_, buf.dtype(), op);
    check_count_fits_int("all_reduce", rank_, buf.numel());
    const Staging stg = staging_for("all_reduce", buf, buf);
    auto d = held_back(buf, /*copy_in=*/true);
    return collective("all_reduce", tag, buf.numel(), buf.dtype(), -1, d, [this, buf, op, stg, d] {
      if (d) return all_reduce_host(d->data(), buf.numel(), buf.dtype(), op);
      HostStage h(buf, stg, /*copy_in=*/true);
      all_reduce_host(h.ptr(), buf.numel(), buf.dtype(), op);
      h.copy_out();
    });
  }

  WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("reduce_scatter", rank_, size_, in.dtype(), op);
    check_reduce_scatter(rank_, size_, in, out);
    check_count_fits_int("reduce_scatter", rank_, in.numel());
    const Staging stg = staging_for("reduce_scatter", in, out);
    auto d = held_back(out, /*copy_in=*/false);
    return collective("reduce_scatter", tag, in.numel(), in.dtype(), -1, d, [this, in, out, op, stg, d] {
      HostStage h_in(in, stg, /*copy_in=*/true);
      HostStage h_out(out, stg, /*copy_in=*/false);
      reduce_scatter_host(h_in.ptr(), d ? d->data() : h_out.ptr(), out.numel(), in.dtype(), op);
      if (!d) h_out.copy_out();
    });
  }

  WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag) override {
    check_all_gather(rank_, size_, in, out);
    check_count_fits_int("all_gather", rank_, out.numel());
    const Staging stg = staging_for("all_gather", in, out);
    auto d = held_back(out, /*copy_in=*/false);
    return collective("all_gather", tag, in.numel(), in.dtype(), -1, d, [this, in, out, stg, d] {
      HostStage h_in(in, stg, /*copy_in=*/true);
      HostStage h_out(out, stg, /*copy_in=*/false);
      all_gather_host(h_in.ptr(), d ? d->data() : h_out.ptr(), in.numel(), in.dtype());
      if (!d) h_out.copy_out();
    });
  }

  WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag) override {
    check_root("broadcast", rank_, size_, root);
    check_count_fits_int("broadcast", rank_, buf.numel());
    const Staging stg = staging_for("broadcast", buf, buf);
    auto d = held_back(buf, /*copy_in=*/rank_ == root);
    return collective("broadcast", tag, buf.numel(), buf.dtype(), root, d, [this, buf, root, stg, d] {
      HostStage h(buf, stg, /*copy_in=*/rank_ == root);
      SL_MPI_CALL(MPI_Bcast(d ? d->data() : h.ptr(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), root,
                            comm_));
      if (rank_ != root && !d) h.copy_out();
    });
  }

  void barrier() override {
    collective("barrier", "", 0, DType::F32, -1, nullptr, [this] { SL_MPI_CALL(MPI_Barrier(comm_)); })->wait();
  }

  // --- point to point ----------------------------------------------------------------------
  // One MPI message per send: the payload (kTag). With a link model a header goes first (the send's start
  // time, kHeaderTag); MPI keeps the order of messages between two ranks per tag, so the k-th header and
  // the k-th payload from a peer belong together. The op records the call's fields; post_p2p posts it.
  // A send's or recv's arguments (`op` "send" or "recv"): the peer a rank of the group, the count an int.
  void check_p2p(const char* op, const Tensor& buf, int peer) const {
    check_peer(op, rank_, size_, peer);
    check_count_fits_int(op, rank_, buf.numel());
  }

  WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag) override {
    check_p2p("send", buf, peer);
    auto o = new_op("send", tag, buf.numel(), buf.dtype(), peer);
    o->kind = Op::Kind::Send;
    o->staging = staging_for("send", buf, buf);
    o->buf = buf;
    return submit(o);
  }

  WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag) override {
    check_p2p("recv", buf, peer);
    auto o = new_op("recv", tag, buf.numel(), buf.dtype(), peer);
    o->kind = Op::Kind::Recv;
    o->staging = staging_for("recv", buf, buf);
    o->buf = buf;
    o->delivery = held_back(buf, /*copy_in=*/false);
    return submit(o);
  }

  // The blocking send, recv and sendrecv (Communicator::blocking_p2p). On host tensors, with no link model
  // and nothing pending on this communicator (so every call issued before it has completed: the order of
  // issue stays the order on the wire), the messages are posted right here (MPI_Isend, then MPI_Irecv, as
  // sendrecv_async orders them) into requests on this stack frame and tested right here (MPI_Testall) for
  // as long as a waiter spins (Op::spin_ms); done, both events are logged complete under one lock. No Op,
  // no Work, no list, no condition variable: per message what is left is the event (bench/p2p.md). A
  // transfer that outlasts the spin (a late or dead peer) is handed to the usual machinery (adopt): its
  // Works wait with the wait timeout and fail with its error, so this never blocks inside MPI. Anything
  // else (CUDA tensors, a link model, calls pending) returns false: the async path.
  bool blocking_p2p(const Tensor* send_buf, int dst, Tensor* recv_buf, int src, const std::string& tag) override {
    if (size_ < 2 || link_model().enabled() || pending_.load(std::memory_order_acquire) != 0) return false;
    for (const Tensor* t : {send_buf, static_cast<const Tensor*>(recv_buf)}) {
      if (t && t->device() != Device::CPU && !(t->device() == Device::SIM && moves_sim_memory_)) return false;
    }
    // The checks of the async path, in its order (sendrecv_async, send_async, recv_async).
    if (send_buf && recv_buf) check_sendrecv(rank_, size_, *send_buf, dst, *recv_buf, src);
    if (send_buf) check_p2p("send", *send_buf, dst);
    if (recv_buf) check_p2p("recv", *recv_buf, src);
    check_not_timed_out(send_buf ? "send" : "recv");
    CommEvent sent, received;  // (op "" when there is no such message)
    if (send_buf) sent = make_event(*this, "send", tag, send_buf->numel(), send_buf->dtype(), /*async=*/false, dst);
    if (recv_buf) {
      received = make_event(*this, "recv", tag, recv_buf->numel(), recv_buf->dtype(), /*async=*/false, src);
    }
    const double t0_ms = send_buf ? sent.issue_ms : received.issue_ms;
    sent.start_ms = sent.issue_ms;  // posted as issued
    received.start_ms = received.issue_ms;

    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // the send's, the recv's
    MPI_Status statuses[2] = {};
    if (send_buf) {
      const int rc = MPI_Isend(send_buf->raw(), static_cast<int>(send_buf->numel()), mpi_type(send_buf->dtype()), dst,
                               kTag, comm_, &requests[0]);
      if (rc != MPI_SUCCESS) fail_blocking_p2p(mpi_failure("MPI_Isend", rc), sent, nullptr);
    }
    if (recv_buf) {
      const int rc = MPI_Irecv(recv_buf->raw(), static_cast<int>(recv_buf->numel()), mpi_type(recv_buf->dtype()), src,
                               kTag, comm_, &requests[1]);
      if (rc != MPI_SUCCESS) {
        // The send is posted: its Work (adopt) waits for it while the error unwinds.
        WorkPtr send_work = send_buf ? adopt(Op::Kind::Send, *send_buf, std::move(sent), requests[0]) : nullptr;
        fail_blocking_p2p(mpi_failure("MPI_Irecv", rc), received, nullptr);
      }
    }
    // The spin: the first kPureSpinMs without giving up the core (a small message's peer is usually
    // there within microseconds), then yielding between tests as a waiter does (MpiWork).
    const double spin_ms = spin_ms_for(std::max(sent.payload_bytes, received.payload_bytes));
    int flag = 0;
    for (;;) {
      const int rc = MPI_Testall(2, requests, &flag, statuses);
      if (rc != MPI_SUCCESS) {  // the request of the failing message says so (MPI_ERR_IN_STATUS): name it
        const bool recv_failed = recv_buf && (!send_buf || statuses[0].MPI_ERROR == MPI_SUCCESS);
        CommEvent* other = recv_failed ? (send_buf ? &sent : nullptr) : (recv_buf ? &received : nullptr);
        fail_blocking_p2p(mpi_failure("MPI_Testall", rc), recv_failed ? received : sent, other);
      }
      if (flag) break;
      const double waited_ms = Communicator::now_ms() - t0_ms;
      if (waited_ms >= spin_ms) {
        // Late: the usual Works take the posted requests over (wait timeout, its error, cancellation).
        WorkPtr send_work = send_buf ? adopt(Op::Kind::Send, *send_buf, std::move(sent), requests[0]) : nullptr;
        WorkPtr recv_work = recv_buf ? adopt(Op::Kind::Recv, *recv_buf, std::move(received), requests[1]) : nullptr;
        if (send_work) send_work->wait();
        if (recv_work) recv_work->wait();
        return true;
      }
      if (waited_ms >= kPureSpinMs) std::this_thread::yield();
    }
    if (recv_buf) {
      try {
        check_received(statuses[1], *recv_buf, src);
      } catch (const std::exception& e) {
        fail_blocking_p2p(e.what(), received, send_buf ? &sent : nullptr);
      }
    }
    const double end_ms = Communicator::now_ms();
    for (CommEvent* e : {&sent, &received}) {
      e->end_ms = end_ms;
      e->wait_ms = end_ms - e->issue_ms;  // the caller was blocked from issue to end, as in run_here
    }
    if (send_buf && recv_buf) {
      log_->add(std::move(sent), std::move(received));
    } else {
      log_->add(std::move(send_buf ? sent : received));
    }
    return true;
  }

  // --- the rest ------------------------------------------------------------------------------
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_color(rank_, size_, color);
    // MPI_Comm_split is a collective on comm_: it runs on the communication thread, in order with
    // the calls issued before it (two threads must never run collectives on one communicator at once).
    check_not_timed_out("split");
    // The thread writes the child: shared, so a wait that times out leaves it nothing dead to write to.
    auto child = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    auto o = std::make_shared<Op>();
    o->fixed_words = "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ", '" + name + "')";
    o->rank = rank_;
    o->size = size_;
    o->event_id = kNoEvent;
    o->run = [this, color, key, child] {
      SL_MPI_CALL(MPI_Comm_split(comm_, mpi_split_color(color), key, child.get()));
    };
    submit(o)->wait();
    if (*child == MPI_COMM_NULL) return nullptr;  // kNoColor: this rank joins no group
    auto sub = std::make_unique<MpiCommunicator>(*child, name, topology(), moves_sim_memory_);
    sub->set_wait_timeout(wait_timeout());  // a child starts with its parent's timeout (comm.h)
    return sub;
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
    SL_MPI_CALL(MPI_Allgather(send, static_cast<int>(chunk), mpi_type(dt), out, static_cast<int>(chunk), mpi_type(dt),
                              comm_));
  }

  // --- the same call on every rank (run on the thread that makes the MPI call) ----------------
  // MPI leaves a collective whose ranks pass other counts, dtypes or roots undefined: in practice one
  // rank's buffer is written past its end (ranks started with other --steps corrupted the heap). So
  // before the payload moves, the group compares the call: one MPI_Allreduce (MAX) of 8 int64 on the
  // same MPI_Comm, each field next to its negation, gives every field's largest and smallest value on
  // every rank. They differ on every rank alike, so every rank then all-gathers the calls and throws the
  // same list. Costs one 64-byte all-reduce per collective.
  void check_same_call(const char* name, int64_t count, DType dtype, int root) {
    int64_t call[4];
    call_signature(name, count, dtype, root, call);
    int64_t range[8];
    call_range(call, range);
    SL_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, range, 8, MPI_INT64_T, MPI_MAX, comm_));
    if (call_range_agrees(range)) return;
    std::vector<int64_t> calls(static_cast<size_t>(4 * size_));
    SL_MPI_CALL(MPI_Allgather(call, 4, MPI_INT64_T, calls.data(), 4, MPI_INT64_T, comm_));
    fail_different_calls(*who_, calls.data(), size_);
  }

  // --- issuing (caller thread) -------------------------------------------------------------
  // The event of a call issued now (blocking forms and barrier say async = false).
  CommEvent event(const char* name, const std::string& tag, int64_t count, DType dtype, int peer) const {
    check_not_timed_out(name);
    const bool async = !issuing_blocking_call() && std::strcmp(name, "barrier") != 0;
    return make_event(*this, name, tag, count, dtype, async, peer);
  }

  // After a wait timed out, the abandoned sends and recvs are still posted and would match the next
  // messages out of order: the communicator takes no new calls.
  void check_not_timed_out(const char* op) const {
    SL_CHECK_HINT(!pending_ops_->timed_out,
                  "destroy it (its destructor cancels its sends and recvs) and make a "
                  "new one: make_communicator, or split() of a communicator that did not time out",
                  "%s on %s: a wait on this communicator timed out, it takes no new calls", op, who_->c_str());
  }

  // "MPI_Isend failed: MPI_ERR_RANK: invalid rank": the words of a failed MPI call (as SL_MPI_CALL's).
  static std::string mpi_failure(const char* call, int rc) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return std::string("[scalelab] ") + call + " failed: " + text;
  }

  // blocking_p2p's error: the failed message's event (and `other`: the call's other message, if any) logged as
  // ended now, then the error "<why>\n[scalelab]   during <the failed op>", as the async path's.
  [[noreturn]] void fail_blocking_p2p(const std::string& why, CommEvent& failed, CommEvent* other) {
    const double end_ms = Communicator::now_ms();
    const std::string during = describe_call(failed.op, failed.count, failed.dtype, rank_, size_, failed.tag);
    for (CommEvent* e : {&failed, other}) {
      if (!e) continue;
      e->end_ms = end_ms;
      e->wait_ms = end_ms - e->issue_ms;
      log_->add(std::move(*e));
    }
    throw Error(why + "\n[scalelab]   during " + during);
  }

  // A send or recv that blocking_p2p posted (into `request`) and that is not done after its spin: an Op as
  // if submit() had posted it on the caller's thread (event, pending lists, the thread's polling), and its
  // Work, whose wait() completes it with the wait timeout.
  WorkPtr adopt(Op::Kind kind, const Tensor& buf, CommEvent&& e, MPI_Request request) {
    const double start_ms = e.start_ms;
    std::shared_ptr<Op> o = new_op(kind == Op::Kind::Send ? "send" : "recv", std::move(e));  // its peer: e.peer
    o->kind = kind;
    o->buf = buf;
    o->stage.emplace(o->buf, o->staging, /*copy_in=*/false);  // host memory: nothing is staged
    o->requests[1] = request;
    o->not_before_ms = start_ms;  // no link model: nothing to wait out
    enlist(o);
    o->posted.store(true, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      list_posted(o);
    }
    return std::make_shared<MpiWork>(o);
  }

  // An op for the communication thread, its event in the log from now on (pending: end_ms 0).
  // `name`: the op's name as a string literal (the event's, e.op, is a copy).
  std::shared_ptr<Op> new_op(const char* name, CommEvent&& e) {
    auto o = std::make_shared<Op>();
    o->name = name;  // the fields of its words (Op::what, Op::waited_for), formatted only if needed
    o->tag = e.tag;
    o->count = e.count;
    o->dtype = e.dtype;
    o->peer = e.peer;
    o->peer_world = e.peer >= 0 && e.peer < size_ ? world_ranks()[static_cast<size_t>(e.peer)] : -1;
    o->rank = rank_;
    o->size = size_;
    o->with_header = link_model().enabled();
    o->modeled_ms = e.modeled_ms;
    o->spin_ms = spin_ms_for(e.payload_bytes);
    o->event_id = log_->add(std::move(e));
    o->log = log_;
    return o;
  }
  std::shared_ptr<Op> new_op(const char* name, const std::string& tag, int64_t count, DType dtype, int peer) {
    return new_op(name, event(name, tag, count, dtype, peer));
  }

  // A collective: `run` makes the blocking MPI call(s), staging included. A blocking call issued while
  // nothing is pending on this communicator runs right here, on the caller's thread: the communication
  // thread is idle and has nothing in flight, so the call takes its place in the order of issue, and
  // the two thread wake-ups of a hand-off (tens of microseconds on a machine without a spare core,
  // where an 8-byte MPI_Allreduce takes well under one) are saved. Anything else goes to the thread.
  // `delivery` (delivery at wait, else null): where `run` leaves the output until the Work's wait().
  // On a group of more than one rank `run` first checks that every rank makes the same call
  // (check_same_call), before any payload moves.
  template <typename F>
  WorkPtr collective(const char* name, const std::string& tag, int64_t count, DType dtype, int peer,
                     std::shared_ptr<Delivery> delivery, F&& payload) {
    std::function<void()> run = std::forward<F>(payload);
    if (size_ > 1) {
      run = [this, name, count, dtype, peer, payload = std::move(run)] {
        check_same_call(name, count, dtype, peer);
        payload();
      };
    }
    CommEvent e = event(name, tag, count, dtype, peer);
    // pending_ only grows on this (the caller's) thread; 0 means the thread finished everything, MPI
    // calls included (acquire pairs with finish()'s release).
    // With a wait timeout (wait_timeout() > 0) every call goes to the thread instead, so that the caller's
    // wait can give up: a blocking MPI call on the caller's thread could not (a deadlocked schedule whose
    // other ranks have stopped would leave this one inside MPI_Allreduce for ever).
    if (!e.async && pending_.load(std::memory_order_acquire) == 0 && wait_timeout() <= 0) {
      WorkPtr w = run_here(std::move(e), run);
      if (delivery) delivery->deliver();  // a blocking call is its own wait
      return w;
    }
    std::shared_ptr<Op> o = new_op(name, std::move(e));
    o->run = std::move(run);
    o->delivery = std::move(delivery);
    if (wait_timeout() > 0 && roll_) {  // who has called what, for the timeout's message (Roll)
      // "all_reduce of 1000 f32 elements, tag 'loss'": the same words on every rank (Roll compares them)
      const std::string announced = std::string(name) + " of " + std::to_string(count) + " " + dtype_name(dtype) +
                                    " elements" + (tag.empty() ? "" : ", tag '" + tag + "'");
      o->roll = roll_;
      o->roll_seq = roll_->announce(announced);
      o->world_ranks = world_ranks();
    }
    return submit(o);
  }

  // How the thread stages a call's tensors (Staging, above): for CUDA tensors the caller's device, the pool,
  // the copy stream and an event recorded now on the compute stream; for host tensors nothing. SIM tensors
  // are refused unless this communicator is the sim backend's transport: the sim backend times them in
  // virtual time, this one would not.
  Staging staging_for(const char* op, const Tensor& a, const Tensor& b) {
    for (const Tensor* t : {&a, &b}) {
      SL_CHECK_HINT(t->device() != Device::SIM || moves_sim_memory_ || t->numel() == 0,
                    "tensors on the simulated GPU go through --backend sim, which times their calls in virtual time",
                    "%s on rank %d of %d: the mpi backend moves CPU and CUDA tensors, this one lives on the sim", op,
                    rank_, size_);
    }
    Staging s;
    if (a.device() != Device::CUDA && b.device() != Device::CUDA) return s;
#ifdef SL_WITH_CUDA
    SL_CUDA_CHECK(cudaGetDevice(&s.device));
    std::lock_guard<std::mutex> lock(staging_mu_);
    if (!copy_stream_) {  // the first CUDA call: the pool and the stream, on the caller's device
      staging_pool_ = StagingPool::make(
          [](size_t n) {
            void* p = nullptr;
            SL_CUDA_CHECK(cudaMallocHost(&p, n));
            return p;
          },
          [](void* p) { cudaFreeHost(p); });
      cudaStream_t st = nullptr;
      // Non-blocking: no implicit sync with the legacy default stream; the events order the two.
      SL_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      copy_stream_ = std::shared_ptr<CUstream_st>(st, [](cudaStream_t x) { cudaStreamDestroy(x); });
    }
    cudaEvent_t ev = nullptr;
    SL_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    s.ready = std::shared_ptr<CUevent_st>(ev, [](cudaEvent_t x) { cudaEventDestroy(x); });
    SL_CUDA_CHECK(cudaEventRecord(ev, nullptr));  // the compute stream: the legacy default stream
    s.pool = staging_pool_;
    s.stream = copy_stream_;
#endif
    return s;
  }

  // Delivery at wait, for an output in host memory (CPU, or SIM in the sim backend's transport; GPU tensors
  // are written at once, as always).
  std::shared_ptr<Delivery> held_back(const Tensor& out, bool copy_in) const {
    if (!deliver_at_wait_ || out.device() == Device::CUDA) return nullptr;
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

  // Hands the op to the communication thread, with this communicator's wait timeout. A send or recv
  // on host memory is posted right here instead, on the caller's thread, when the thread has nothing
  // ahead of it (no op queued, none being started or run): every call issued before it has then been
  // posted or has completed, so the order of issue is still the order on the wire, and the message
  // leaves now instead of when the thread wakes up. Its Work's wait() and test() complete it (advance);
  // the thread polls it too whenever it is awake for other ops.
  WorkPtr submit(const std::shared_ptr<Op>& o) {
    enlist(o);
    bool post_here = false;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      post_here = o->is_p2p() && o->post_on_caller && queue_.empty() && !thread_busy_;
      if (post_here) {
        list_posted(o);  // listed before it is posted (one lock a message): the thread skips it until `posted`
      } else {
        queue_.push_back(o);
      }
    }
    if (post_here) post(*o);
    // A send or recv posted here does not wake the thread: that wake-up, and the thread's polling every
    // kPollInterval after it, took the core from the caller and the peer and cost ~20 us a message on the
    // 2-core machine (bench/p2p.md). The thread adds it to its polls the next time it is awake.
    if (!post_here) queue_cv_.notify_one();
    return std::make_shared<MpiWork>(o);
  }

  // An op's wait timeout, its entry in the pending lists, and (a send or recv) its turn of advance().
  void enlist(const std::shared_ptr<Op>& o) {
    o->timeout_s = wait_timeout();
    o->who = who_;
    o->pending = pending_ops_;
    o->pending_id = pending_ops_->add(o.get());
    pending_.fetch_add(1, std::memory_order_relaxed);
    if (o->is_p2p()) {
      o->post_on_caller = o->staging.device < 0;
      Op* op = o.get();  // the closure lives inside *op: a raw pointer, no cycle (two pointers: no allocation)
      o->progress = [this, op] { return advance(*op); };
    }
  }

  // A send or recv posted on the caller's thread, for the communication thread to poll from its next wake-up
  // (queue_mu_ held).
  void list_posted(const std::shared_ptr<Op>& o) {
    // The ops their callers have finished meanwhile leave the list first: the thread does not wake for
    // posted ops, so without this a run of sends and recvs (lab 00's sweep: tens of thousands) piled up
    // here until its next wake-up, each kept alive, and that wake-up then polled them all.
    posted_.erase(std::remove_if(posted_.begin(), posted_.end(),
                                 [](const std::shared_ptr<Op>& p) {
                                   return p->settled.load(std::memory_order_acquire);
                                 }),
                  posted_.end());
    posted_.push_back(o);  // the thread polls it from now on
  }

  // --- the communication thread --------------------------------------------------------------
  void thread_main() {
    std::vector<std::shared_ptr<Op>> in_flight;  // posted sends and recvs, not yet completed
    for (;;) {
      std::shared_ptr<Op> op;
      std::deque<std::shared_ptr<Op>> abandoned;  // told to stop after a timeout: every queued op
      bool abandon = false, out_of_time = false;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        auto ready = [&] { return stop_ || !queue_.empty() || !posted_.empty(); };
        if (in_flight.empty()) {
          queue_cv_.wait(lock, ready);
        } else {
          queue_cv_.wait_for(lock, kPollInterval, ready);  // come back to poll the transfers
        }
        in_flight.insert(in_flight.end(), posted_.begin(), posted_.end());  // posted by callers (submit)
        posted_.clear();
        if (stop_ && abandon_) {
          abandon = true;
          abandoned.swap(queue_);
        } else if (!queue_.empty()) {
          op = queue_.front();
          queue_.pop_front();
          thread_busy_ = true;  // until start() returns: a send or recv issued meanwhile queues behind it
        } else if (stop_ && in_flight.empty()) {
          return;
        } else if (stop_ && stop_deadline_ms_ > 0 && Communicator::now_ms() >= stop_deadline_ms_) {
          out_of_time = true;
        }
      }
      if (abandon) {
        const std::string why = "not done when its communicator was destroyed after a wait on it timed out";
        for (const std::shared_ptr<Op>& o : abandoned) finish(*o, cancelled(*o, why));
        cancel(in_flight, why);
        return;
      }
      if (out_of_time) {  // no wait timed out, but Works that outlive the communicator never complete
        std::string list;
        for (const std::shared_ptr<Op>& o : in_flight) list += (list.empty() ? "" : "; ") + o->waited_for();
        std::fprintf(stderr,
                     "[scalelab] %s: destroyed with sends/recvs that did not complete within the wait timeout "
                     "(%g s): cancelled: %s\n",
                     who_->c_str(), wait_timeout(), list.c_str());
        note_wait_timed_out();
        cancel(in_flight, "not done within the wait timeout after its communicator was destroyed");
        return;
      }
      if (op) {
        start(op, in_flight);
        std::lock_guard<std::mutex> lock(queue_mu_);
        thread_busy_ = false;
      }
      poll(in_flight);
    }
  }

  // The error of an op that is given up: "[scalelab] recv from rank 0 (world rank 0) on rank 1 of ...".
  std::exception_ptr cancelled(const Op& op, const std::string& why) const {
    return std::make_exception_ptr(Error("[scalelab] " + op.waited_for() + " on " + *who_ + " was cancelled: " + why +
                                         "\n[scalelab]   during " + op.what()));
  }

  // Gives up the posted sends and recvs, so that nothing waits for them: MPI_Cancel every request, give
  // MPI a moment to complete the cancellations (a recv's completes at once; OpenMPI cannot cancel a
  // send already under way, which then completes only if the peer receives it), free what is left
  // (MPI_Request_free) and keep those ops alive for good, since MPI may still read or write their
  // buffers. Each op then finishes with an error. Return codes are ignored: this is a way out.
  void cancel(std::vector<std::shared_ptr<Op>>& in_flight, const std::string& why) {
    for (const std::shared_ptr<Op>& op : in_flight) {
      while (op->testing.exchange(true, std::memory_order_acquire)) std::this_thread::yield();  // a waiter's test
      op->finished = true;  // (kept: nobody tests the op again)
      for (MPI_Request& r : op->requests) {
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      }
    }
    const double until_ms = Communicator::now_ms() + kCancelGraceMs;
    for (bool all_done = false; !all_done && Communicator::now_ms() < until_ms;) {
      all_done = true;
      for (const std::shared_ptr<Op>& op : in_flight) {
        for (MPI_Request& r : op->requests) {
          int flag = 0;
          if (r != MPI_REQUEST_NULL) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);  // sets r to null once done
          if (r != MPI_REQUEST_NULL) all_done = false;
        }
      }
      if (!all_done) std::this_thread::sleep_for(kPollInterval);
    }
    for (const std::shared_ptr<Op>& op : in_flight) {
      for (MPI_Request& r : op->requests) {
        if (r == MPI_REQUEST_NULL) continue;
        MPI_Request_free(&r);
        op->leaked = true;
      }
      if (op->leaked) keep_forever(op);
      finish(*op, cancelled(*op, why));
    }
    in_flight.clear();
  }

  // An op whose requests were freed unfinished: its header and staged or delivered bytes stay valid
  // until the process ends (deliberately never freed; a few per timeout, and a timeout ends the run).
  static void keep_forever(const std::shared_ptr<Op>& op) {
    static std::mutex mu;
    static auto* kept = new std::vector<std::shared_ptr<Op>>();
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(op);
  }

  // Posts a send or recv (post_p2p), on the thread that calls it: the communication thread (start) or the
  // caller (submit). False when posting failed: the op is then finished with the error.
  bool post(Op& op, double start_ms = -1) {
    if (start_ms < 0) {  // posted by the caller: stamped here, as start() stamps what the thread starts
      start_ms = Communicator::now_ms();
      if (op.event_id != kNoEvent) log_->set_start(op.event_id, start_ms);
      op.not_before_ms = start_ms + op.modeled_ms;
    }
    try {
      if (op.with_header) op.header.send_start_host_ms = to_host_clock_ms(start_ms);  // when the send started
      post_p2p(op);
      op.posted.store(true, std::memory_order_release);  // a waiter may test the requests from now on
      return true;
    } catch (const std::exception& e) {
      op.finished = true;
      // (a caller-posted op is already on the thread's list: `posted` lets its advance() see it finished)
      op.posted.store(true, std::memory_order_release);
      finish(op, std::make_exception_ptr(Error(std::string(e.what()) + "\n[scalelab]   during " + op.what())));
      return false;
    }
  }

  // The MPI_Isend / MPI_Irecv of a send or recv: the header's (with_header) into requests[0], the payload's
  // into requests[1]. A CUDA tensor is staged here (a send's copied to pinned host memory first).
  void post_p2p(Op& op) {
    const bool send = op.kind == Op::Kind::Send;
    op.stage.emplace(op.buf, op.staging, /*copy_in=*/send);
    const int n = static_cast<int>(op.buf.numel());
    const MPI_Datatype type = mpi_type(op.buf.dtype());
    if (send) {
      if (op.with_header) {
        SL_MPI_CALL(MPI_Isend(&op.header, sizeof(MessageHeader), MPI_BYTE, op.peer, kHeaderTag, comm_,
                              &op.requests[0]));
      }
      SL_MPI_CALL(MPI_Isend(op.stage->ptr(), n, type, op.peer, kTag, comm_, &op.requests[1]));
      return;
    }
    void* dst = op.delivery ? op.delivery->data() : op.stage->ptr();
    if (op.with_header) {
      SL_MPI_CALL(MPI_Irecv(&op.header, sizeof(MessageHeader), MPI_BYTE, op.peer, kHeaderTag, comm_, &op.requests[0]));
    }
    SL_MPI_CALL(MPI_Irecv(dst, n, type, op.peer, kTag, comm_, &op.requests[1]));
  }

  // Ends a send or recv whose transfers are done (`status`: the payload's): a recv checks the count it got,
  // writes a CUDA tensor back, and takes its earliest end from the header; the staged bytes go.
  void complete_p2p(Op& op, const MPI_Status& status) {
    if (op.kind == Op::Kind::Recv) {
      check_received(status, op.buf, op.peer);
      if (!op.delivery) op.stage->copy_out();
      // The bytes cannot have crossed the link before the sender started plus the modelled time. Without a
      // link model there is no such bound (and the sim backend's transport runs under the virtual clock,
      // whose times are not comparable across processes: the sim backend sends its own).
      if (op.with_header && op.modeled_ms > 0) op.not_before_ms = recv_not_before_ms(op.header, op.modeled_ms);
    }
    op.stage.reset();
  }

  // A recv into `buf` from `peer` is done (`status`): throws unless it got buf's number of elements.
  void check_received(const MPI_Status& status, const Tensor& buf, int peer) const {
    int received = 0;
    SL_MPI_CALL(MPI_Get_count(&status, mpi_type(buf.dtype()), &received));
    SL_CHECK_HINT(received == buf.numel(), "send and recv the same number of elements",
                  "recv on rank %d of %d: expected %lld %s elements from rank %d, got %d", rank_, size_,
                  static_cast<long long>(buf.numel()), dtype_name(buf.dtype()), peer, received);
  }

  // Runs a collective to its end, or posts a send or recv into in_flight.
  void start(const std::shared_ptr<Op>& op, std::vector<std::shared_ptr<Op>>& in_flight) {
    const double start_ms = Communicator::now_ms();
    if (op->event_id != kNoEvent) log_->set_start(op->event_id, start_ms);
    // The link is busy with one op at a time: this thread sleeps out a collective's modelled time
    // before it picks up the next op. (Sends and recvs overlap other ops, like a full-duplex link.)
    op->not_before_ms = start_ms + op->modeled_ms;
    if (op->is_p2p()) {
      if (post(*op, start_ms)) in_flight.push_back(op);
      return;
    }
    try {
      set_running(op.get());
      op->run();
      set_running(nullptr);
      // The link model's remaining time (if any), keeping the sends and recvs moving meanwhile.
      for (double left_ms = op->modeled_ms > 0 ? op->not_before_ms - Communicator::now_ms() : 0; left_ms > 0;
           left_ms = op->not_before_ms - Communicator::now_ms()) {
        poll(in_flight);
        std::this_thread::sleep_for(std::min<std::chrono::duration<double, std::micro>>(
            kPollInterval, std::chrono::duration<double, std::milli>(left_ms)));
      }
      finish(*op, nullptr);
    } catch (const std::exception& e) {
      set_running(nullptr);
      finish(*op, std::make_exception_ptr(Error(std::string(e.what()) + "\n[scalelab]   during " + op->what())));
    }
  }

  // The collective the thread is inside (null between them), for the destructor's note after a timeout.
  void set_running(const Op* op) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      running_ = op;
    }
    if (!op) running_cv_.notify_all();  // a destructor after a timeout may wait for this (above)
  }

  // Completes the sends and recvs whose transfer is done and whose modelled time has passed; forgets
  // those finished (here, or by their waiters).
  void poll(std::vector<std::shared_ptr<Op>>& in_flight) {
    in_flight.erase(std::remove_if(in_flight.begin(), in_flight.end(),
                                   [this](const std::shared_ptr<Op>& op) { return advance(*op); }),
                    in_flight.end());  // one pass, however many finish
  }

  // One turn of a posted send or recv, on the communication thread (poll) or on a caller waiting for it
  // (Op::progress): tests its requests and finishes it once the transfer is done and its modelled time
  // has passed (a recv's: from its sender's start, set by its complete()). Two threads never test one
  // op at once: the one that finds it taken skips this turn. True when the op is finished.
  bool advance(Op& op) {
    if (!op.posted.load(std::memory_order_acquire)) return false;  // still queued for the communication thread
    if (op.testing.exchange(true, std::memory_order_acquire)) return false;
    if (!op.finished) {
      std::exception_ptr error;
      try {
        if (!op.transferred) {
          int flag = 0;
          SL_MPI_CALL(MPI_Testall(2, op.requests, &flag, op.statuses));
          if (flag) {
            op.transferred = true;
            complete_p2p(op, op.statuses[1]);  // the payload's status
          }
        }
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(std::string(e.what()) + "\n[scalelab]   during " + op.what()));
      }
      if (error || (op.transferred && (op.modeled_ms <= 0 || Communicator::now_ms() >= op.not_before_ms))) {
        op.finished = true;
        finish(op, error);
      }
    }
    const bool finished = op.finished;
    op.testing.store(false, std::memory_order_release);
    return finished;
  }

  void finish(Op& op, std::exception_ptr error) {
    if (op.event_id != kNoEvent) log_->set_end(op.event_id, Communicator::now_ms());
    // Done with MPI for this op: a blocking call issued after this may run on the caller's thread.
    pending_.fetch_sub(1, std::memory_order_release);
    if (op.pending) op.pending->remove(op.pending_id);
    // The closures hold the op's tensors: drop them BEFORE the caller wakes, so a caller that drops its
    // own references after wait() frees the bytes at once (the allocator's counts are exact). Not for an
    // op whose requests were freed unfinished (cancel): MPI may still use those bytes.
    if (!op.leaked) {
      op.run = nullptr;
      op.stage.reset();
      op.buf = Tensor();
      op.staging = Staging();
    }
    op.settled.store(true, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(op.mu);
      op.done = true;
      if (!op.abandoned) op.error = error;  // an abandoned op keeps its timeout error
    }
    op.cv.notify_all();
  }

  static constexpr std::chrono::microseconds kPollInterval{50};  // while sends/recvs are in flight
  static constexpr double kCancelGraceMs = 100;                  // how long cancel() lets MPI complete cancellations
  // A waiter's spin on a send or recv (Op::spin_ms): 0.1 ms covers a peer about to send (a small message
  // takes ~3 us here); 1 GB/s is well below this machine's shared-memory copy rate (~14 GB/s at 1 MiB), so
  // a transfer under way is not cut into sleeps; 5 ms caps what a wait for a huge message burns.
  static constexpr double kSpinMs = 0.1;
  static constexpr double kSpinBytesPerMs = 1e6;  // 1 GB/s
  static constexpr double kMaxSpinMs = 5;
  // A waiter's spin for a message of `payload_bytes`: kSpinMs, plus the payload at kSpinBytesPerMs, at most
  // kMaxSpinMs.
  static double spin_ms_for(int64_t payload_bytes) {
    return std::min(kMaxSpinMs, kSpinMs + static_cast<double>(payload_bytes) / kSpinBytesPerMs);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<EventLog> log_ = std::make_shared<EventLog>();  // shared with the Ops (wait_ms)

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Op>> queue_;    // issued, not yet started
  std::vector<std::shared_ptr<Op>> posted_;  // sends and recvs the caller posted (submit), for the thread to poll
  bool thread_busy_ = false;                 // the thread is starting or running an op it took from queue_ (queue_mu_)
  std::atomic<int> pending_{0};              // ops handed to the thread and not finished (queued, running or in flight)
  std::shared_ptr<PendingOps> pending_ops_ = std::make_shared<PendingOps>();  // the same ops, described
  std::shared_ptr<Roll> roll_;  // who has called which collective (groups of 2 or more ranks)
  // "rank 1 of group 'pp' (world rank 1)", for wait timeouts' messages (shared with the ops: no copy each)
  std::shared_ptr<const std::string> who_;
  const Op* running_ = nullptr;         // the collective the thread is inside, or null (queue_mu_)
  std::condition_variable running_cv_;  // notified when running_ becomes null (with queue_mu_)
  // How long the destructor, after a wait timed out, waits for the thread to leave a collective (seconds).
  static constexpr double kStuckCollectiveGraceS = 2.0;
  bool abandon_ = false;         // stop after a wait timed out: cancel, do not finish (queue_mu_)
  double stop_deadline_ms_ = 0;  // stop with a wait timeout: when in-flight ops are cancelled (queue_mu_)
  bool stop_ = false;
  bool deliver_at_wait_ = false;   // SL_COMM_DELIVER_AT_WAIT (file comment)
  bool moves_sim_memory_ = false;  // the sim backend's transport: SIM tensors too (staging_for)
  // CUDA tensors' staging (HostStage), made by the first call on one: shared with the calls in flight, so
  // the pinned buffers and the stream go when the communicator and the last such call are gone.
  std::mutex staging_mu_;
  std::shared_ptr<StagingPool> staging_pool_;
#ifdef SL_WITH_CUDA
  std::shared_ptr<CUstream_st> copy_stream_;
#endif
  std::thread thread_;  // the communication thread, started by the constructor's body
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(bool sim_transport) {
  mpi_init_once();
  // A duplicate of the world: this communicator's messages never mix with anyone else's (another
  // communicator, a library using MPI_COMM_WORLD), and it can be freed.
  MPI_Comm comm = MPI_COMM_NULL;
  SL_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  int world_size = 1;
  SL_MPI_CALL(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  return std::make_unique<MpiCommunicator>(comm, "world", default_topology(world_size), sim_transport);
}

}  // namespace scalelab::comm_detail
