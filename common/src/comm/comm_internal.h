// comm_internal.h — what the communicator backends share (not a public header; the interface is
// common/include/scalelab/comm/comm.h). Implemented in common/src/comm/comm.cpp.
//   EventLog         the per-communicator record of calls (thread-safe: the caller adds, the
//                    communication thread stamps start and end)
//   make_event       fills a CommEvent: payload and bus bytes, issue time, the link model's time,
//                    the group's name and members
//   MessageHeader    what travels ahead of a point-to-point message with a link model: the send's start time
//   check_*          argument checks shared by every backend; errors name the rank, the op, the sizes
//                    (check_on_device: the device backends' rule, device tensors only)
//   make_*_communicator  the backend factories behind make_communicator()
// Tests: tests/common/comm/test_comm.cpp (local), tests/common/comm/test_comm_mpi.cpp (mpi)
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"

namespace scalelab::comm_detail {

// ---------------------------------------------------------------------------------------------
// The event log of one communicator. Events are addressed by an id that stays valid across
// clear(): an op issued before clear() and finished after it simply no longer appears.
class EventLog {
 public:
  uint64_t add(const CommEvent& event);  // returns the event's id
  uint64_t add(CommEvent&& event);
  void add(CommEvent&& first, CommEvent&& second);  // both, in this order, under one lock (a sendrecv's)
  void set_start(uint64_t id, double start_ms);
  void set_end(uint64_t id, double end_ms);
  void add_wait(uint64_t id, double wait_ms);  // CommEvent::wait_ms += wait_ms (a Work's wait blocked)
  std::vector<CommEvent> snapshot() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<CommEvent> events_;
  uint64_t first_id_ = 0;  // id of events_[0]; smaller ids were cleared
};

// A CommEvent for a call issued now on `comm`: payload_bytes = count * dtype size, bus_bytes and the
// link model's time from the op name and comm's size and link, group and world_ranks from comm.
// start_ms/end_ms are left 0.
CommEvent make_event(const Communicator& comm, const std::string& op, const std::string& tag, int64_t count,
                     DType dtype, bool async, int peer);

// nccl-tests bus bytes of a call whose CommEvent has payload_bytes (see CommEvent::bus_bytes).
int64_t bus_bytes(const std::string& op, int64_t payload_bytes, int n);

// Latency hops of a call in the ring model (LinkModel: all_reduce 2(n-1), send 1, ...).
int latency_hops(const std::string& op, int n);

// A Work that is already complete (one object shared by every call that finished before returning).
WorkPtr finished_work();

// Blocks the calling thread until Communicator::now_ms() >= t_ms.
void sleep_until_ms(double t_ms);

// ---------------------------------------------------------------------------------------------
// Wait timeouts (comm.h set_wait_timeout): the words every backend's message uses.
//   "<describe_rank> waited 2.0 s for <describe_wait>: <wait_timeout_reason>. Still pending ..."
// Sets the flag comm_wait_timed_out() reads (comm.h); every backend calls it when a wait times out.
void note_wait_timed_out();
// "rank 1 of group 'pp' (world rank 1)"
std::string describe_rank(const Communicator& comm);
// "recv from rank 0 (world rank 0), tag 'activation mb 3'", "send to rank 1 (world rank 3)",
// "broadcast from root 0 (world rank 0)", "all_reduce, tag 'bucket 3'" (peer -1: none).
std::string describe_wait(const Communicator& comm, const std::string& op, int peer, const std::string& tag);
// The same words from the peer's world rank (peer_world_rank < 0: no peer named), for a backend that
// formats them only when a timeout or an error needs them (mpi.cpp keeps the fields, not the text).
std::string describe_wait(const std::string& op, int peer, int peer_world_rank, const std::string& tag);
// What a timeout of that wait most likely means: "it never arrived (a deadlock: ...)".
const char* wait_timeout_reason(const std::string& waited_for);
// The hint line of a timeout's error (what to compare, how to lengthen the timeout).
std::string wait_timeout_hint(double timeout_s);
// The hint of a collective's timeout when the backend knows who has called it (mpi.cpp Roll): `stopped`
// when the ranks named have not got there (a stopped or slow rank), else mismatched calls.
std::string wait_timeout_hint_collective(double timeout_s, bool stopped);

// ---------------------------------------------------------------------------------------------
// Honest point-to-point times. A recv completes no earlier than the matching send's START plus the
// modelled time of the message, so the sender's start must travel with the message: the backends send
// this header ahead of every payload (same peers, same order). The time is on the host's steady clock
// (CLOCK_MONOTONIC on Linux), which every process of one machine shares, unlike now_ms(), whose zero
// is per process. All ranks of a CPU run sit on one host. Across hosts the steady clocks are
// unrelated: one would need each peer's clock offset (estimated by a ping-pong, Cristian's algorithm,
// as MPI implementations do for MPI_WTIME_IS_GLOBAL) or clocks synchronised by PTP, and would add
// the offset here.
struct MessageHeader {
  double send_start_host_ms = 0;  // the send's start_ms, on the host clock
};
double to_host_clock_ms(double now_ms);     // a now_ms() time on the host clock
double from_host_clock_ms(double host_ms);  // and back
// When a recv may complete: the header's send start + the modelled time, as a now_ms() time.
double recv_not_before_ms(const MessageHeader& header, double modeled_ms);

// The topology a world of world_size ranks starts with: ranks_per_node from the launcher (or all
// on one node), no links.
Topology default_topology(int world_size);

// ---------------------------------------------------------------------------------------------
// Argument checks, run by the caller before anything is sent, so a bad call fails on every rank
// alike instead of leaving a peer waiting. They throw scalelab::Error naming rank, op and sizes.
void check_reduce_dtype(const char* op, int rank, int size, DType dtype, ReduceOp reduce);
void check_reduce_scatter(int rank, int size, const Tensor& in, const Tensor& out);
void check_all_gather(int rank, int size, const Tensor& in, const Tensor& out);
void check_root(const char* op, int rank, int size, int root);
void check_peer(const char* op, int rank, int size, int peer);
// split's color: >= 0, or Communicator::kNoColor (no group for this rank).
void check_color(int rank, int size, int color);
// sendrecv: both peers valid and the two buffers apart (checked before either is posted).
void check_sendrecv(int rank, int size, const Tensor& send_buf, int dst, const Tensor& recv_buf, int src);
// NCCL's contract, kept by the nccl and sim backends: the tensors live on the backend's device
// (comm.device(): CUDA, SIM); an empty one may live anywhere. A host tensor is refused with the same words
// by both, with the way out: copy it to the device, stage a host value through comm/host_values.h, or
// use --backend mpi.
void check_on_device(const Communicator& comm, const char* op, const Tensor& t);
// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes);
// MPI and NCCL counts are C ints: at most 2^31 - 1 elements per call.
void check_count_fits_int(const char* op, int rank, int64_t count);

// "all_reduce of 1000 f32 elements on rank 1 of 4 (tag 'bucket 3')": for error messages.
std::string describe_call(const std::string& op, int64_t count, DType dtype, int rank, int size,
                          const std::string& tag);

// The same call on every rank (check_same_call of mpi.cpp and nccl.cpp): a collective as the 4 int64 the
// ranks compare, {op, count, dtype, root} (op: all_reduce 0, reduce_scatter 1, all_gather 2, broadcast 3,
// barrier 4); and, when they differ, the error every rank throws: `calls` holds each of the `size` ranks'
// 4 values in rank order, `who` is describe_rank's words.
void call_signature(const std::string& op, int64_t count, DType dtype, int root, int64_t out[4]);
// One MAX all-reduce of call_range's 8 int64 tells every rank whether all made the same call: field f at 2f,
// its negation at 2f + 1, so after the reduction 2f holds the largest value and -(2f + 1) the smallest;
// call_range_agrees reads that (true: every field's largest equals its smallest).
void call_range(const int64_t call[4], int64_t range[8]);
bool call_range_agrees(const int64_t range[8]);
[[noreturn]] void fail_different_calls(const std::string& who, const int64_t* calls, int size);

// ---------------------------------------------------------------------------------------------
// Launch detection: the world size the launcher announced (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
// SLURM_NTASKS), 1 when the program was started directly.
int launcher_world_size();

// Backend factories (make_communicator in comm.cpp picks one).
std::unique_ptr<Communicator> make_local_communicator();  // local.cpp
#ifdef SL_WITH_MPI
// sim_transport: the sim backend's transport, which also moves SIM tensors (their memory is host memory);
// otherwise SIM tensors are refused (they go through --backend sim).
std::unique_ptr<Communicator> make_mpi_communicator(bool sim_transport = false);  // mpi.cpp
void mpi_init_once();  // MPI_Init_thread(MPI_THREAD_MULTIPLE) once; MPI_Finalize at exit
#endif
// The sim backend (sim.cpp): NCCL's contract, virtual time, over two transports of the same members (in
// comm.cpp two make_mpi_communicator(true)): `bytes` moves the payloads, `clock` the virtual times.
std::unique_ptr<Communicator> make_sim_communicator(std::unique_ptr<Communicator> bytes,
                                                    std::unique_ptr<Communicator> clock);
#ifdef SL_WITH_NCCL
std::unique_ptr<Communicator> make_nccl_communicator();  // nccl.cpp
#endif

}  // namespace scalelab::comm_detail
