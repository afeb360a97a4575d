// comm.h — the communicator: one interface for every way ranks talk (docs/design.md "Communicator").
// Backends (make_communicator):
//   local  world size 1; collectives are copies; no MPI needed
//   mpi    OpenMPI; CPU tensors directly, CUDA tensors staged through pinned host memory (Debian's
//          OpenMPI is not CUDA-aware). Operations run in order on one communication thread per
//          communicator, so asynchronous calls progress while the caller computes.
//   nccl   one GPU per rank; the unique id is broadcast over MPI; a communication stream ordered
//          against the compute stream with events (verified only where several GPUs exist)
//   sim    a simulated GPU per rank (Device::SIM, docs/simulation.md): NCCL's contract, the bytes moved
//          over MPI, every call timed in virtual time on this rank's communication stream (core/clock.h)
// nccl and sim take device tensors only (device()); a host value (a norm, a loss, a flag, a run id)
// travels through one of the helpers of comm/host_values.h, which stage it through that device.
// Counts are ELEMENTS, never bytes (docs/style.md 22). Every call appends a CommEvent (op, elements,
// payload and bus bytes, issue/start/end times, the caller's wait_ms, the tag of the layer or bucket
// that issued it), so labs and tests can check communication volume, overlap and exposed time.
// A LinkModel makes a CPU run show what a cluster link would: a call completes no earlier than its
// alpha-beta modelled time (Hockney; ring collectives as in Thakur, Rabenseifner & Gropp 2005), and
// its event says simulated. A Topology says which ranks share a (simulated) node and gives each group
// the link it would use: the intra-node one when all its members sit on one node, else the inter-node one.
// Every communicator is a named group ("world", "tp", "pp", "dp", ...) that knows the world ranks of
// its members; every event records both, so logs and tests can say which group carried what.
// Layouts of groups for tensor, pipeline and data parallelism: rank_grid.h (RankGrid).
// Errors: scalelab::Error naming the rank, the operation and the sizes.
// A wait timeout (set_wait_timeout, SL_COMM_WAIT_TIMEOUT_S) turns a wait that never ends into one of
// those errors: a deadlocked schedule says what each rank waited for instead of hanging.
// Tests: tests/common/comm/test_comm.cpp (local), tests/common/comm/test_comm_mpi.cpp (2 and 4 ranks),
// tests/common/comm/test_sim_comm_mpi.cpp (sim)
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/core/tensor.h"

namespace scalelab {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// The alpha-beta cost of one call over a simulated link (docs/references.md "Collectives", the
// alpha-beta model). S = payload bytes per rank, n = ranks, every call also pays base_s (NCCL's tuner has a
// base latency per collective and a latency per ring hop):
//   all_reduce     base + 2(n-1) alpha + 2(n-1)/n S / B
//   reduce_scatter base +  (n-1) alpha +  (n-1)/n S / B          (S = the input, n chunks)
//   all_gather     base +  (n-1) alpha +  (n-1)/n (n S) / B      (S = one rank's input, n S the output)
//   broadcast      base +  (n-1) alpha +  S / B
//   send, recv     base +        alpha +  S / B
//   barrier        base + 2(n-1) alpha
// i.e. base + hops * alpha + bus_bytes / B: B is a bus bandwidth (a measured busbw plugs in as B).
struct LinkModel {
  // "none" (real transport only), "free" (modelled, costing 0 s), "nvlink", "pcie", "ethernet100", "infiniband"
  std::string name = "none";
  double alpha_s = 0.0;                // seconds per message hop (latency)
  double bandwidth_bytes_per_s = 0.0;  // busbw the link sustains, bytes/s
  double base_s = 0.0;                 // seconds every call pays once (launch/protocol latency)
  bool enabled() const { return name != "none"; }
  // Presets; the figures and their sources are listed in common/src/comm/link_model.cpp.
  // "none" gives the default (disabled) model. Throws with the accepted names otherwise.
  static LinkModel preset(const std::string& name);
  // Modelled seconds of one call ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send",
  // "recv", "barrier") whose CommEvent has payload_bytes, among n ranks. 0 when !enabled() or n == 1.
  double seconds(const std::string& op, int64_t payload_bytes, int n) const;
};

// The simulated cluster: ranks_per_node ranks per node, filled in world-rank order (mpirun's default
// --map-by slot, Slurm's block distribution), so node = world_rank / ranks_per_node; and two links.
// A group (communicator) whose world ranks all sit on one node uses `intra`, one that crosses nodes
// uses `inter`: on a real cluster a tensor-parallel group inside a node rides NVLink, a pipeline
// group across nodes the network. Communicator::set_topology applies it; split() passes it on and
// each new group picks its link from its own members.
//   Topology t;  t.ranks_per_node = 4;  t.intra = LinkModel::preset("nvlink");
//   t.inter = LinkModel::preset("infiniband");  world.set_topology(t);
struct Topology {
  int ranks_per_node = 0;  // ranks per node; 0: keep the communicator's (from ranks_per_node_from_env)
  LinkModel intra;         // link of a group inside one node (default: none)
  LinkModel inter;         // link of a group that spans nodes (default: none)

  // The node of a world rank: world_rank / ranks_per_node. Throws scalelab::Error when
  // ranks_per_node < 1 (0 means "keep" only inside set_topology).
  int node_of(int world_rank) const;
  // True when every rank of world_ranks sits on one node (an empty or one-rank group does).
  bool within_one_node(const std::vector<int>& world_ranks) const;
  // The link a group of these world ranks uses: intra within one node, else inter.
  const LinkModel& link_for(const std::vector<int>& world_ranks) const;
};

// Ranks per node as the launcher announced them: OMPI_COMM_WORLD_LOCAL_SIZE (OpenMPI's mpirun),
// MPI_LOCALNRANKS (MPICH's Hydra), SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE (srun; "4(x2)" or
// "4,3" give the first node's 4); else world_size (a program started directly: one node). Simulating
// several nodes on one machine therefore needs an explicit Topology::ranks_per_node.
int ranks_per_node_from_env(int world_size);

// One record per call, in issue order (per communicator). Times are ms on the process's
// communication clock (Communicator::now_ms(); shared by every communicator of the process, so the
// events of a sub-communicator line up with the world's and with the caller's own now_ms() stamps).
struct CommEvent {
  std::string op;     // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"
  std::string tag;    // who issued it: "bucket 3", "layer h.5", "" when not given
  int64_t count = 0;  // elements of this rank's input: all_reduce/broadcast/send/recv the buffer,
                      // reduce_scatter the whole input (size() chunks), all_gather one rank's chunk
  DType dtype = DType::F32;
  int64_t payload_bytes = 0;  // count * dtype size
  int64_t bus_bytes = 0;      // nccl-tests bus bytes: all_reduce 2(n-1)/n payload; reduce_scatter (n-1)/n
                              // payload; all_gather (n-1)/n of the TOTAL output = (n-1) payload;
                              // broadcast/send/recv 1 payload; barrier 0; 0 for n == 1
  double issue_ms = 0;        // when the caller issued it
  double start_ms = 0;        // when the transport started it (the communication thread, or the caller's
                              // thread for a blocking collective run there, picked it up)
  double end_ms = 0;          // when it completed; 0 while pending. With a link model no earlier than
                              // start + modelled, and a recv no earlier than the matching SEND's start +
                              // modelled (the message cannot arrive before it has crossed the link)
  double modeled_ms = 0;      // the link model's time for it (0 without a model)
  double wait_ms = 0;         // exposed time: how long the CALLER was blocked in Work::wait() (or in a
                              // blocking form, barrier, or the destructor of a Work never waited for)
                              // for this op, summed over its waits; 0 when it had finished before the
                              // first wait (fully hidden) or nobody has waited yet. The part of
                              // end_ms - issue_ms that the caller's step actually paid for.
  bool async = false;
  bool simulated = false;        // a link model decided (part of) its duration (modeled_ms > 0)
  int peer = -1;                 // send/recv: the other rank; broadcast: the root (ranks of this group)
  std::string group;             // the communicator's name: "world", "tp", "pp", "dp", "embedding", ...
  std::vector<int> world_ranks;  // the group's members as world ranks, in the group's rank order
};

// A pending asynchronous operation (like torch.distributed's Work). wait() blocks until the result is
// in the output tensor and rethrows the operation's error, if any; test() polls (true once finished,
// successfully or not). Destroying an unfinished Work waits for it. The time wait() (or that
// destructor) blocks is added to the op's CommEvent::wait_ms; test() never adds any.
// With a wait timeout (Communicator::set_wait_timeout) wait() throws scalelab::Error once it has
// waited that long, and the op is abandoned: a second wait() rethrows that error at once, the
// destructor does not wait again, and the output tensor is never written by it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl", "sim"
  // Where this backend's tensors live: CPU (local, mpi: they also take CUDA tensors, staged), CUDA (nccl),
  // SIM (sim). nccl and sim refuse any other tensor. comm/host_values.h stages host values through it.
  virtual Device device() const = 0;

  // The group this communicator is: its name ("world" for make_communicator's, the third argument of
  // split for the others) and the world ranks of its members in this communicator's rank order, so
  // world_ranks()[rank()] is this rank's world rank. Every event carries both (CommEvent::group,
  // CommEvent::world_ranks).
  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // Asynchronous collectives. Tensors must stay alive and untouched until wait() returns. Every rank
  // passes the same n and dtype (f32, bf16 or i32; bf16 is reduced in fp32 by the mpi backend; Avg of
  // i32 is refused). Tensors on device() (nccl: CUDA, sim: SIM; local and mpi take CPU and CUDA ones, the mpi
  // backend staging CUDA ones through pinned host memory).
  // all_reduce: in place, buf (n) on every rank; Avg divides the sum by size().
  virtual WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag = "") = 0;
  // reduce_scatter: in (size()*n) -> out (n): rank r receives the reduction of chunk r.
  // Uneven sizes are refused with a hint to pad (in.numel() must equal size() * out.numel()).
  virtual WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag = "") = 0;
  // all_gather: in (n) -> out (size()*n), rank r's chunk at [r*n, (r+1)*n). in may be a view of
  // out's own chunk r (in place, as NCCL allows).
  virtual WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag = "") = 0;
  // broadcast: buf (n) from root to every rank, in place.
  virtual WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag = "") = 0;
  // Point to point: buf (n) to / from rank peer (!= rank()); the recv's n must equal the send's.
  // Messages between two ranks arrive in the order they were sent. In the mpi backend a send or recv
  // does not hold up the calls issued after it, so "send to next, recv from previous" around a ring
  // does not deadlock. With a link model a recv completes no earlier than the matching send's start
  // plus the modelled time of the message (the sender's start travels with it), a send no earlier
  // than its own start plus that time.
  virtual WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag = "") = 0;
  virtual WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag = "") = 0;
  // A paired exchange, like MPI_Sendrecv: send_buf (n) to rank dst and recv_buf (m, the n of src's
  // matching send) from rank src (dst may equal src), both posted before either is waited for, so two
  // neighbours exchanging at once never deadlock (a pipeline stage passing activations to the next and
  // receiving gradients from it). Records two events, a send and a recv, both with `tag`; the Work
  // waits for both. Both peers are checked before anything is posted; the two buffers must not overlap
  // (throws scalelab::Error naming the rank, the peers and the sizes).
  WorkPtr sendrecv_async(const Tensor& send_buf, int dst, Tensor& recv_buf, int src, const std::string& tag = "");

  // Blocking forms: the async call, then wait(). Their events say async = false. In the mpi backend a
  // blocking collective issued while nothing else is pending on this communicator runs on the
  // caller's own thread (no hand-off to the communication thread, whose wake-up costs more than a
  // small all_reduce itself); otherwise it queues behind the pending calls, so the order of issue is
  // kept either way (docs/communicator.md "Progress").
  void all_reduce(Tensor& buf, ReduceOp op, const std::string& tag = "") {
    BlockingCall b(*this);
    all_reduce_async(buf, op, tag)->wait();
  }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag = "") {
    BlockingCall b(*this);
    reduce_scatter_async(in, out, op, tag)->wait();
  }
  void all_gather(const Tensor& in, Tensor& out, const std::string& tag = "") {
    BlockingCall b(*this);
    all_gather_async(in, out, tag)->wait();
  }
  void broadcast(Tensor& buf, int root, const std::string& tag = "") {
    BlockingCall b(*this);
    broadcast_async(buf, root, tag)->wait();
  }
  // The blocking point to point forms may take a backend's shortcut (blocking_p2p below: the mpi backend's
  // posts and tests the messages on the caller's thread, with no Work); the result, the events and the
  // errors are those of the async call and its wait().
  void send(const Tensor& buf, int peer, const std::string& tag = "") {
    BlockingCall b(*this);
    if (blocking_p2p(&buf, peer, nullptr, -1, tag)) return;
    send_async(buf, peer, tag)->wait();
  }
  void recv(Tensor& buf, int peer, const std::string& tag = "") {
    BlockingCall b(*this);
    if (blocking_p2p(nullptr, -1, &buf, peer, tag)) return;
    recv_async(buf, peer, tag)->wait();
  }
  void sendrecv(const Tensor& send_buf, int dst, Tensor& recv_buf, int src, const std::string& tag = "") {
    BlockingCall b(*this);
    if (blocking_p2p(&send_buf, dst, &recv_buf, src, tag)) return;
    sendrecv_async(send_buf, dst, recv_buf, src, tag)->wait();
  }
  // Returns when every rank has called it (after this rank's earlier collectives have completed).
  virtual void barrier() = 0;

  // A new communicator named `name` of the ranks that pass the same color, ordered by key (then by
  // old rank), like MPI_Comm_split. color >= 0, or kNoColor for a rank that joins no group: it gets
  // nullptr (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR). Collective: every rank of this communicator must call
  // it. The new communicator starts with this one's topology (its link chosen from its own members:
  // Topology::link_for) and an empty event log. Throws scalelab::Error for a negative color.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
  // The same, keeping this communicator's name (a copy of the world is still "world").
  std::unique_ptr<Communicator> split(int color, int key) { return split(color, key, name_); }
  static constexpr int kNoColor = std::numeric_limits<int>::min();

  // Ends the whole job (every rank), so a failing rank does not leave the others waiting forever.
  [[noreturn]] virtual void abort(int exit_code, const std::string& why) = 0;

  // Wait timeout, seconds (0: wait forever; make_communicator sets SL_COMM_WAIT_TIMEOUT_S, or
  // kDefaultWaitTimeoutS when it is unset, wait_timeout_from_env). Why: a deadlocked schedule (a
  // pipeline whose recv has no matching send) becomes an error naming what each rank waited for,
  // instead of a job that hangs until the cluster's limit kills it without a word.
  // Applies to the ops issued after it is set: their Work::wait(), the blocking forms (send, recv,
  // sendrecv, and collectives that queue behind pending calls), and the destructor of a Work never
  // waited for (which prints the error instead of throwing it). split() children start with this
  // communicator's timeout. Throws scalelab::Error for a negative or non-finite value.
  // mpi backend: the error names this rank in the group and its world rank, the group, the op, the
  // peer (group and world rank) of a send or recv, its tag, how long it waited, and every other op
  // still pending on this communicator (op, peer, tag); for a collective, the ranks of the group that
  // have not called it (or called another one in its place), from what each rank announced. After a timeout the communicator refuses new
  // calls (its message order is lost): destroy it, which cancels its posted sends and recvs
  // (MPI_Cancel) and returns; a Work still held fails. Not covered: a blocking collective run on the
  // caller's thread (nothing pending before it) and a collective the communication thread is already
  // inside: MPI cannot cancel a collective, so the wait throws but that thread stays in MPI_Allreduce
  // (or the like), and the destructor waits for it; only the job's own timeout (ctest's, mpirun's
  // --timeout, Slurm's) ends a rank stuck there.
  // local backend: every call completes before it returns, so the timeout never fires.
  // nccl backend: wait() polls the op's CUDA event (and its MPI header) against the deadline; the error
  // names the rank, group, op, peer and tag, but not the other pending ops; after a timeout the
  // communicator's destructor aborts the NCCL communicator (ncclCommAbort) instead of waiting for it.
  void set_wait_timeout(double seconds);
  double wait_timeout() const { return wait_timeout_s_; }

  // Simulated link (default: none). Applies to calls issued after it is set.
  // set_link_model: one link for every group, this one and those split from it later (its topology
  // gets intra = inter = link; ranks_per_node is kept).
  void set_link_model(const LinkModel& link);
  // The link this group's calls are modelled on (set_link_model's, or the topology's choice).
  const LinkModel& link_model() const { return link_; }
  // set_topology: ranks per node and the intra-/inter-node links; this group takes
  // topology.link_for(world_ranks()). ranks_per_node 0 keeps the current value (the launcher's, see
  // ranks_per_node_from_env). Throws scalelab::Error for ranks_per_node < 0.
  void set_topology(const Topology& topology);
  const Topology& topology() const { return topology_; }

  // The event log (calls completed or pending, in issue order) and a way to start afresh per step.
  virtual std::vector<CommEvent> events() const = 0;
  virtual void clear_events() = 0;

  // Milliseconds on the clock the events use (steady; 0 at its first use, at the latest when the
  // process made its first communicator). Stamp your own phases with it to compare them with
  // events, e.g. "bucket 3 was issued before the backward of layer 2 started".
  static double now_ms();

 protected:
  // True while a blocking form above is issuing its async call: backends record async = !this.
  bool issuing_blocking_call() const { return blocking_call_; }
  // A backend's shortcut for the blocking send (recv_buf null), recv (send_buf null) and sendrecv: either it
  // completes the whole call, as the async call followed by wait() would (the same checks and errors, one
  // event per message, async = false), and returns true; or it does nothing and returns false, and the
  // async call and its wait() run. Default: false. The mpi backend's: docs/communicator.md "Point to
  // point without thread hand-offs".
  virtual bool blocking_p2p(const Tensor* send_buf, int dst, Tensor* recv_buf, int src, const std::string& tag) {
    (void)send_buf, (void)dst, (void)recv_buf, (void)src, (void)tag;
    return false;
  }
  // Each backend's constructor says which group it is: its name, the world ranks of its members in
  // rank order, and the topology it inherits (whose ranks_per_node is >= 1); the link follows from them.
  void init_group(const std::string& name, std::vector<int> world_ranks, const Topology& topology);

 private:
  struct BlockingCall {  // sets blocking_call_ for the duration of one blocking form's issue
    explicit BlockingCall(Communicator& c) : comm(c) { comm.blocking_call_ = true; }
    ~BlockingCall() { comm.blocking_call_ = false; }
    Communicator& comm;
  };
  bool blocking_call_ = false;
  // The group. Read and written by the caller's thread only (each op keeps its own modelled time).
  std::string name_ = "world";
  std::vector<int> world_ranks_;
  Topology topology_;
  LinkModel link_;               // topology_.link_for(world_ranks_)
  double wait_timeout_s_ = 0.0;  // seconds; 0 = wait forever (set_wait_timeout)
};

// The wait timeout of every communicator make_communicator makes when SL_COMM_WAIT_TIMEOUT_S is unset:
// a rank that stops or a schedule that deadlocks ends the job with the ranks named after 5 minutes,
// instead of never (the driver's --wait-timeout-s has the same default). Seconds.
constexpr double kDefaultWaitTimeoutS = 300.0;

// SL_COMM_WAIT_TIMEOUT_S as a wait timeout in seconds: unset or empty give kDefaultWaitTimeoutS; "0" gives
// 0 (wait forever); a positive number ("30", "2.5") gives that. make_communicator applies it to the communicator it makes
// (split() children inherit it). Anything else ("-1", "2s", "inf") throws scalelab::Error naming the
// value, before any backend (or MPI) starts, so every rank refuses alike.
double wait_timeout_from_env();

// True once any wait of any communicator in this process has timed out (a process-wide flag, never
// reset). A program's main() reads it to end without MPI_Finalize, which could wait for peers that are
// still stuck: tests/grading/graded_main.cpp.
bool comm_wait_timed_out();

// backend: "auto" (when launched by mpirun/srun with more than one rank: OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// SLURM_STEP_NUM_TASKS > 1, sim while the virtual clock is on, else mpi; one process: local), "local",
// "mpi", "nccl", "sim" (needs the virtual clock on: VirtualClock::start, as --device sim does; without a
// link model set its groups use the active GPU model's intra_node_link inside a node, nvlink without one,
// and infiniband across nodes). The MPI, NCCL and sim
// backends initialise MPI on first use (MPI_THREAD_MULTIPLE) and finalise it at exit. Throws with a hint when a backend is not built or not usable (e.g. two ranks
// on one GPU with nccl: "use --backend mpi").
std::unique_ptr<Communicator> make_communicator(const std::string& backend = "auto");

// The body of a multi-rank program's main(): makes the communicator for `backend`, runs body(comm) and
// returns its exit code. Any exception is printed with the rank and ends the WHOLE job (comm.abort),
// since a rank that just returned would leave its peers waiting in their next collective forever.
// Exit code 3 for a learner's TODO not written yet (scalelab::NotImplemented), 1 for other errors.
int run_on_all_ranks(const std::string& backend, const std::function<int(Communicator&)>& body);

// A program's --device and --backend together, before its communicator and before any tensor. Device "sim"
// makes GpuModel::preset(sim_gpu) active (core/sim_gpu.h sim_gpu_set: the virtual clock starts at 0, the SIM
// allocator's capacity is the GPU's memory; a later --memory-cap-mb overrides it); "cpu" and "cuda" need
// nothing here. Refused with the option to change (scalelab::Error): backend "sim" without device "sim";
// device "sim" with backend "mpi" or "nccl"; an unknown sim_gpu. Every rank checks its own options, so a
// refusal ends every rank alike. (auto with device "sim": make_communicator picks sim under a launcher.)
void start_device(const std::string& device, const std::string& sim_gpu, const std::string& backend);
// run_on_all_ranks(backend, body) after start_device(device, sim_gpu, backend); a refusal is printed to
// stderr and returns 1 (no communicator yet: nothing to abort).
int run_on_all_ranks(const std::string& device, const std::string& sim_gpu, const std::string& backend,
                     const std::function<int(Communicator&)>& body);

// Its twin for a program of one process (labs 01, 02 and 09, bin/sl_plan): runs body() and returns its exit
// code. An exception is printed to stderr after what the program printed so far: exit code 3 for a learner's
// TODO not written yet (scalelab::NotImplemented), `error_exit` for any other error.
int run_single_process(const std::function<int()>& body, int error_exit = 1);

// nccl-tests' bus-bandwidth factor for an op among n ranks (docs/references.md "Collectives"):
// 2(n-1)/n all_reduce, (n-1)/n all_gather and reduce_scatter, 1 broadcast/send/recv; 0 for n == 1.
double bus_factor(const std::string& op, int n);

}  // namespace scalelab
