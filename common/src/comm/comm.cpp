// comm.cpp — what every communicator backend shares (comm.h, comm_internal.h): make_communicator,
// bus_factor, reduce_op_name, the communication clock, the group (name, members, topology, link),
// sendrecv, the event log and the argument checks.
// Backends: local.cpp (world size 1), mpi.cpp (OpenMPI), nccl.cpp (NCCL), sim.cpp (a simulated GPU cluster).
// The link model: link_model.cpp. Tests: tests/common/comm/test_comm.cpp, tests/common/comm/test_comm_mpi.cpp
#include "scalelab/comm/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "comm_internal.h"          // defines: EventLog, make_event, check_*, backend factories
#include "scalelab/core/error.h"    // defines: SL_CHECK_HINT, SL_FAIL
#include "scalelab/core/clock.h"    // defines: clock_now_ms, clock_wall_origin_steady_ms, VirtualClock
#include "scalelab/core/sim_gpu.h"  // defines: GpuModel, sim_gpu_set (start_device)

namespace scalelab {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

// nccl-tests, doc/PERFORMANCE.md: busbw = algbw * factor, where the factor makes the number
// comparable to the link's bandwidth for a ring algorithm. For all_gather / reduce_scatter algbw is
// taken on the TOTAL size (n chunks), so the factor is (n-1)/n of that.
double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 0.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return static_cast<double>(n - 1) / n;
  if (op == "broadcast" || op == "send" || op == "recv" || op == "reduce") return 1.0;
  if (op == "barrier") return 0.0;
  SL_FAIL("use all_reduce, all_gather, reduce_scatter, broadcast, send, recv or barrier", "bus_factor: unknown op '%s'",
          op.c_str());
}

// The communication clock is the kit's clock (core/clock.h): steady ms, 0 at its first use (make_communicator
// calls it first), or the virtual compute stream's time on a simulated GPU.
namespace {
double origin_host_ms() { return clock_wall_origin_steady_ms(); }  // that 0 on the host's steady clock
}  // namespace

double Communicator::now_ms() { return clock_now_ms(); }

// ---------------------------------------------------------------------------------------------
// The group and its link

int Topology::node_of(int world_rank) const {
  SL_CHECK_HINT(ranks_per_node >= 1, "set Topology::ranks_per_node >= 1 (or 0 in set_topology to keep the launcher's)",
                "Topology::node_of(%d): ranks_per_node is %d", world_rank, ranks_per_node);
  return world_rank / ranks_per_node;
}

bool Topology::within_one_node(const std::vector<int>& world_ranks) const {
  for (int r : world_ranks) {
    if (node_of(r) != node_of(world_ranks.front())) return false;
  }
  return true;
}

const LinkModel& Topology::link_for(const std::vector<int>& world_ranks) const {
  return within_one_node(world_ranks) ? intra : inter;
}

// The launcher's count of ranks on this node; "4(x2),3" (Slurm's compressed list) gives 4.
int ranks_per_node_from_env(int world_size) {
  for (const char* var :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);  // atoi stops at '('
  }
  return std::max(1, world_size);
}

void Communicator::init_group(const std::string& name, std::vector<int> world_ranks, const Topology& topology) {
  name_ = name;
  world_ranks_ = std::move(world_ranks);
  topology_ = topology;
  link_ = topology_.link_for(world_ranks_);
}

void Communicator::set_link_model(const LinkModel& link) {
  topology_.intra = link;
  topology_.inter = link;
  link_ = link;
}

void Communicator::set_topology(const Topology& topology) {
  SL_CHECK_HINT(topology.ranks_per_node >= 0, "give the ranks per node (e.g. 4), or 0 to keep the launcher's count",
                "set_topology on rank %d of %d ('%s'): ranks_per_node %d", rank(), size(), name_.c_str(),
                topology.ranks_per_node);
  const int ranks_per_node = topology.ranks_per_node > 0 ? topology.ranks_per_node : topology_.ranks_per_node;
  topology_ = topology;
  topology_.ranks_per_node = ranks_per_node;
  link_ = topology_.link_for(world_ranks_);
}

// ---------------------------------------------------------------------------------------------
// The wait timeout (comm.h set_wait_timeout): the value here, the waits in each backend.

void Communicator::set_wait_timeout(double seconds) {
  SL_CHECK_HINT(std::isfinite(seconds) && seconds >= 0.0, "give seconds >= 0 (0 waits forever)",
                "set_wait_timeout on rank %d of %d ('%s'): %g seconds", rank(), size(), name_.c_str(), seconds);
  wait_timeout_s_ = seconds;
}

double wait_timeout_from_env() {
  const char* v = std::getenv("SL_COMM_WAIT_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return kDefaultWaitTimeoutS;  // no multi-rank program waits for ever
  char* end = nullptr;
  const double seconds = std::strtod(v, &end);
  const bool number = end != v && *end == '\0';  // the whole value, nothing after it ("2s" is refused)
  SL_CHECK_HINT(number && std::isfinite(seconds) && seconds >= 0.0,
                "seconds as a plain number, e.g. SL_COMM_WAIT_TIMEOUT_S=30 or 2.5 (0: wait forever; unset: 300)",
                "SL_COMM_WAIT_TIMEOUT_S='%s' is not a number of seconds >= 0", v);
  return seconds;
}

namespace {
std::atomic<bool> g_wait_timed_out{false};  // comm_wait_timed_out()
}  // namespace

bool comm_wait_timed_out() { return g_wait_timed_out.load(); }

namespace comm_detail {
void note_wait_timed_out() { g_wait_timed_out.store(true); }

std::string describe_rank(const Communicator& comm) {
  const int r = comm.rank();
  const int world_rank = r < static_cast<int>(comm.world_ranks().size()) ? comm.world_ranks()[r] : r;
  return "rank " + std::to_string(r) + " of group '" + comm.name() + "' (world rank " + std::to_string(world_rank) +
         ")";
}

std::string describe_wait(const Communicator& comm, const std::string& op, int peer, const std::string& tag) {
  const bool named = peer >= 0 && peer < static_cast<int>(comm.world_ranks().size());
  return describe_wait(op, peer, named ? comm.world_ranks()[peer] : -1, tag);
}

std::string describe_wait(const std::string& op, int peer, int peer_world_rank, const std::string& tag) {
  std::string s = op;
  if (peer >= 0 && peer_world_rank >= 0) {
    const char* dir = op == "send" ? " to rank " : op == "recv" ? " from rank " : " from root ";
    s += dir + std::to_string(peer) + " (world rank " + std::to_string(peer_world_rank) + ")";
  }
  if (!tag.empty()) s += ", tag '" + tag + "'";
  return s;
}

const char* wait_timeout_reason(const std::string& waited_for) {
  if (waited_for.rfind("recv", 0) == 0) {
    return "it never arrived (a deadlock: every rank waits for a message nobody sends, or a send is missing)";
  }
  if (waited_for.rfind("send", 0) == 0) {
    return "the peer never received it (a deadlock: the peer waits for something else first, or its recv is "
           "missing)";
  }
  return "it did not complete (a rank of the group has not called it: it waits for something else first, or "
         "calls the collectives in another order)";
}

std::string wait_timeout_hint(double timeout_s) {
  return detail::format(
      "match every rank's message: each recv needs the peer's send, issued in the same order "
      "(the tags say which); a slow but correct step needs a longer timeout (this one %g s: "
      "set_wait_timeout, SL_COMM_WAIT_TIMEOUT_S; 0 waits forever). This communicator takes "
      "no new calls: destroy it",
      timeout_s);
}

std::string wait_timeout_hint_collective(double timeout_s, bool stopped) {
  if (!stopped) {
    return "call the collectives in the same order, with the same sizes, on every rank of the group (the ranks "
           "named called another one in its place). This communicator takes no new calls: destroy it";
  }
  return detail::format(
      "the ranks named have stopped or are slow: read their own output first (an error, a crash, a fault "
      "injected, a rank that waits for something else); a slow but correct step needs a longer timeout (this one "
      "%g s: set_wait_timeout, SL_COMM_WAIT_TIMEOUT_S; 0 waits forever). This communicator takes no new calls: "
      "destroy it",
      timeout_s);
}
}  // namespace comm_detail

// ---------------------------------------------------------------------------------------------
// sendrecv: a send and a recv posted together, one Work for both.
namespace {
class BothWork : public Work {
 public:
  BothWork(WorkPtr first, WorkPtr second) : first_(std::move(first)), second_(std::move(second)) {}
  void wait() override {
    first_->wait();
    second_->wait();
  }
  bool test() override { return first_->test() && second_->test(); }

 private:
  WorkPtr first_, second_;
};
}  // namespace

WorkPtr Communicator::sendrecv_async(const Tensor& send_buf, int dst, Tensor& recv_buf, int src,
                                     const std::string& tag) {
  comm_detail::check_sendrecv(rank(), size(), send_buf, dst, recv_buf, src);
  WorkPtr sent = send_async(send_buf, dst, tag);  // posted first, as MPI_Sendrecv does
  WorkPtr received = recv_async(recv_buf, src, tag);
  return std::make_shared<BothWork>(std::move(sent), std::move(received));
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend) {
  (void)Communicator::now_ms();  // starts the communication clock
  const int launched = comm_detail::launcher_world_size();
  std::string chosen = backend;
  // auto: under a launcher, the simulated GPUs' backend while the virtual clock is on (--device sim), else mpi
  if (backend == "auto") chosen = launched <= 1 ? "local" : VirtualClock::get().on() ? "sim" : "mpi";
  // Read before any backend starts: a bad value fails on every rank alike, before MPI_Init.
  const double wait_timeout_s = wait_timeout_from_env();
  auto with_timeout = [wait_timeout_s](std::unique_ptr<Communicator> c) {
    c->set_wait_timeout(wait_timeout_s);
    return c;
  };

  if (chosen == "local") {
    SL_CHECK_HINT(launched <= 1, "use --backend mpi (or auto) under mpirun: with 'local' every rank would train alone",
                  "backend 'local' has world size 1, but the launcher started %d ranks", launched);
    return with_timeout(comm_detail::make_local_communicator());
  }
  if (chosen == "mpi") {
#ifdef SL_WITH_MPI
    return with_timeout(comm_detail::make_mpi_communicator());
#else
    SL_FAIL("apt-get install libopenmpi-dev openmpi-bin, then reconfigure (cmake prints 'MPI on')",
            "backend 'mpi' requested (launcher world size %d) but this build has no MPI", launched);
#endif
  }
  if (chosen == "sim") {
    // Checked before MPI starts, so every rank refuses alike.
    SL_CHECK_HINT(VirtualClock::get().on(),
                  "run with --device sim (it starts the virtual clock); a test starts it with "
                  "VirtualClock::get().start()",
                  "backend 'sim' times every call in virtual time (docs/simulation.md), but the virtual clock is off");
#ifdef SL_WITH_MPI
    std::unique_ptr<Communicator> bytes = comm_detail::make_mpi_communicator(/*sim_transport=*/true);
    std::unique_ptr<Communicator> clock = comm_detail::make_mpi_communicator(/*sim_transport=*/true);
    return with_timeout(comm_detail::make_sim_communicator(std::move(bytes), std::move(clock)));
#else
    SL_FAIL("apt-get install libopenmpi-dev openmpi-bin, then reconfigure (cmake prints 'MPI on')",
            "backend 'sim' moves its bytes over MPI, but this build has no MPI");
#endif
  }
  if (chosen == "nccl") {
#ifdef SL_WITH_NCCL
    return with_timeout(comm_detail::make_nccl_communicator());
#else
    SL_FAIL(
        "the nccl backend needs CUDA, NCCL (nccl.h, libnccl) and MPI at configure time; on a CPU "
        "machine use --backend mpi",
        "backend 'nccl' requested but this build has no NCCL backend");
#endif
  }
  SL_FAIL("use auto, local, mpi, nccl or sim", "unknown communicator backend '%s'", backend.c_str());
}

namespace comm_detail {

// ---------------------------------------------------------------------------------------------
// Event log
uint64_t EventLog::add(const CommEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
  return first_id_ + events_.size() - 1;
}

uint64_t EventLog::add(CommEvent&& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
  return first_id_ + events_.size() - 1;
}

void EventLog::add(CommEvent&& first, CommEvent&& second) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(first));
  events_.push_back(std::move(second));
}

void EventLog::set_start(uint64_t id, double start_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= first_id_) events_[id - first_id_].start_ms = start_ms;
}

void EventLog::set_end(uint64_t id, double end_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= first_id_) events_[id - first_id_].end_ms = end_ms;
}

void EventLog::add_wait(uint64_t id, double wait_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= first_id_ && id - first_id_ < events_.size()) events_[id - first_id_].wait_ms += wait_ms;
}

std::vector<CommEvent> EventLog::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void EventLog::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  first_id_ += events_.size();
  events_.clear();
}

// ---------------------------------------------------------------------------------------------
// Event fields
int64_t bus_bytes(const std::string& op, int64_t payload_bytes, int n) {
  if (n <= 1) return 0;
  // all_gather: payload is one rank's chunk, the nccl-tests size is the whole output (n chunks).
  const double size_bytes = op == "all_gather" ? static_cast<double>(payload_bytes) * n
                                               : static_cast<double>(payload_bytes);
  return static_cast<int64_t>(size_bytes * bus_factor(op, n) + 0.5);
}

int latency_hops(const std::string& op, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce" || op == "barrier") return 2 * (n - 1);  // reduce-scatter + all-gather rings
  if (op == "reduce_scatter" || op == "all_gather" || op == "broadcast") return n - 1;
  if (op == "send" || op == "recv") return 1;
  SL_FAIL("use all_reduce, all_gather, reduce_scatter, broadcast, send, recv or barrier",
          "latency_hops: unknown op '%s'", op.c_str());
}

CommEvent make_event(const Communicator& comm, const std::string& op, const std::string& tag, int64_t count,
                     DType dtype, bool async, int peer) {
  const int n = comm.size();
  CommEvent e;
  e.op = op;
  e.tag = tag;
  e.count = count;
  e.dtype = dtype;
  e.payload_bytes = count * static_cast<int64_t>(dtype_size(dtype));
  e.bus_bytes = bus_bytes(op, e.payload_bytes, n);
  e.issue_ms = Communicator::now_ms();
  e.modeled_ms = 1e3 * comm.link_model().seconds(op, e.payload_bytes, n);
  e.simulated = e.modeled_ms > 0.0;
  e.async = async;
  e.peer = peer;
  e.group = comm.name();
  e.world_ranks = comm.world_ranks();
  return e;
}

namespace {
class FinishedWork : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

WorkPtr finished_work() {
  static const WorkPtr done = std::make_shared<FinishedWork>();
  return done;
}

void sleep_until_ms(double t_ms) {
  const double wait_ms = t_ms - Communicator::now_ms();
  if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(wait_ms));
}

double to_host_clock_ms(double now_ms) { return now_ms + origin_host_ms(); }
double from_host_clock_ms(double host_ms) { return host_ms - origin_host_ms(); }

double recv_not_before_ms(const MessageHeader& header, double modeled_ms) {
  return from_host_clock_ms(header.send_start_host_ms) + modeled_ms;
}

Topology default_topology(int world_size) {
  Topology t;
  t.ranks_per_node = ranks_per_node_from_env(world_size);
  return t;
}

std::string describe_call(const std::string& op, int64_t count, DType dtype, int rank, int size,
                          const std::string& tag) {
  std::string s = op + " of " + std::to_string(count) + " " + dtype_name(dtype) + " elements on rank " +
                  std::to_string(rank) + " of " + std::to_string(size);
  if (!tag.empty()) s += " (tag '" + tag + "')";
  return s;
}

static constexpr const char* kCallOps[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};

void call_signature(const std::string& op, int64_t count, DType dtype, int root, int64_t out[4]) {
  int64_t i = 0;
  while (i < 4 && op != kCallOps[i]) ++i;
  out[0] = i;
  out[1] = count;
  out[2] = static_cast<int64_t>(dtype);
  out[3] = root;
}

void call_range(const int64_t call[4], int64_t range[8]) {
  for (int f = 0; f < 4; ++f) {
    range[2 * f] = call[f];
    range[2 * f + 1] = -call[f];
  }
}

bool call_range_agrees(const int64_t range[8]) {
  for (int f = 0; f < 4; ++f)
    if (range[2 * f] != -range[2 * f + 1]) return false;
  return true;
}

void fail_different_calls(const std::string& who, const int64_t* calls, int size) {
  std::string list;
  for (int r = 0; r < size; ++r) {
    const int64_t* c = &calls[static_cast<size_t>(4 * r)];
    list += detail::format("%srank %d: %s of %lld %s elements%s", r == 0 ? "" : "; ", r, kCallOps[c[0]],
                           static_cast<long long>(c[1]), dtype_name(static_cast<DType>(c[2])),
                           c[0] == 3 ? detail::format(" from root %lld", static_cast<long long>(c[3])).c_str() : "");
  }
  SL_FAIL(
      "every rank of a group must make the same collectives, with the same sizes, in the same order: ranks "
      "started with other options, or a collective inside an `if` that only some ranks take",
      "%s: the ranks of the group called different collectives (refused before any data moved): %s", who.c_str(),
      list.c_str());
}

// ---------------------------------------------------------------------------------------------
// Argument checks
void check_reduce_dtype(const char* op, int rank, int size, DType dtype, ReduceOp reduce) {
  SL_CHECK_HINT(!(dtype == DType::I32 && reduce == ReduceOp::Avg),
                "reduce integers with Sum and divide yourself (the average of integers is not an integer)",
                "%s on rank %d of %d: ReduceOp avg of i32 elements is refused", op, rank, size);
}

void check_reduce_scatter(int rank, int size, const Tensor& in, const Tensor& out) {
  const int64_t n_in = in.numel(), n_out = out.numel();
  SL_CHECK_HINT(in.dtype() == out.dtype(), "give in and out the same dtype",
                "reduce_scatter on rank %d of %d: in is %s, out is %s", rank, size, dtype_name(in.dtype()),
                dtype_name(out.dtype()));
  if (n_in % size != 0) {
    const int64_t padded = (n_in / size + 1) * size;
    SL_FAIL(detail::format("pad to a multiple of %d elements (here %lld, with zeros), so every rank gets "
                           "an equal chunk",
                           size, static_cast<long long>(padded)),
            "reduce_scatter of %lld elements over %d ranks on rank %d: %lld is not a multiple of %d",
            static_cast<long long>(n_in), size, rank, static_cast<long long>(n_in), size);
  }
  SL_CHECK_HINT(n_in == static_cast<int64_t>(size) * n_out, "out holds one chunk: in.numel() / size() elements",
                "reduce_scatter of %lld elements over %d ranks on rank %d: out has %lld elements, expected %lld",
                static_cast<long long>(n_in), size, rank, static_cast<long long>(n_out),
                static_cast<long long>(n_in / size));
}

void check_all_gather(int rank, int size, const Tensor& in, const Tensor& out) {
  const int64_t n_in = in.numel(), n_out = out.numel();
  SL_CHECK_HINT(in.dtype() == out.dtype(), "give in and out the same dtype",
                "all_gather on rank %d of %d: in is %s, out is %s", rank, size, dtype_name(in.dtype()),
                dtype_name(out.dtype()));
  SL_CHECK_HINT(n_out == static_cast<int64_t>(size) * n_in,
                "out holds every rank's chunk: size() * in.numel() elements (pad the chunks to equal size)",
                "all_gather of %lld elements per rank over %d ranks on rank %d: out has %lld elements, "
                "expected %lld",
                static_cast<long long>(n_in), size, rank, static_cast<long long>(n_out),
                static_cast<long long>(n_in) * size);
}

void check_root(const char* op, int rank, int size, int root) {
  SL_CHECK_HINT(root >= 0 && root < size, "the root is a rank of this communicator: 0 .. size()-1",
                "%s on rank %d of %d: root %d is out of range", op, rank, size, root);
}

void check_peer(const char* op, int rank, int size, int peer) {
  SL_CHECK_HINT(peer >= 0 && peer < size && peer != rank,
                size == 1 ? "a world of one rank has no one to talk to: run under mpirun -np 2 or more"
                          : "the peer is another rank of this communicator: 0 .. size()-1, not rank()",
                "%s on rank %d of %d: peer %d is not another rank", op, rank, size, peer);
}

void check_color(int rank, int size, int color) {
  SL_CHECK_HINT(color >= 0 || color == Communicator::kNoColor,
                "colors are >= 0 (as in MPI_Comm_split), or Communicator::kNoColor for a rank that joins no group",
                "split on rank %d of %d: color %d", rank, size, color);
}

void check_sendrecv(int rank, int size, const Tensor& send_buf, int dst, const Tensor& recv_buf, int src) {
  check_peer("sendrecv (its send)", rank, size, dst);
  check_peer("sendrecv (its recv)", rank, size, src);
  SL_CHECK_HINT(!overlaps(send_buf.raw(), send_buf.nbytes(), recv_buf.raw(), recv_buf.nbytes()),
                "give the send and the receive two separate buffers (the recv overwrites its buffer while "
                "the send may still read its own)",
                "sendrecv on rank %d of %d: the send buffer (%lld %s elements, to rank %d) and the recv buffer "
                "(%lld %s elements, from rank %d) overlap",
                rank, size, static_cast<long long>(send_buf.numel()), dtype_name(send_buf.dtype()), dst,
                static_cast<long long>(recv_buf.numel()), dtype_name(recv_buf.dtype()), src);
}

void check_on_device(const Communicator& comm, const char* op, const Tensor& t) {
  const Device device = comm.device();
  SL_CHECK_HINT(t.device() == device || t.numel() == 0,
                detail::format("the %s backend moves %s tensors only, as NCCL does: copy the data to one first (a "
                               "host value: the helpers of comm/host_values.h), or use --backend mpi for CPU tensors",
                               comm.backend().c_str(), device_name(device)),
                "%s on rank %d: the tensor lives on the %s", op, comm.rank(), device_name(t.device()));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

void check_count_fits_int(const char* op, int rank, int64_t count) {
  SL_CHECK_HINT(count <= 2147483647LL, "split the buffer into calls (buckets) of at most 2^31 - 1 elements",
                "%s on rank %d: %lld elements do not fit a C int count (MPI and NCCL take int)", op, rank,
                static_cast<long long>(count));
}

// OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE, MPICH/Hydra PMI_SIZE, srun SLURM_STEP_NUM_TASKS for
// the tasks of its step. (Not SLURM_NTASKS: a batch script's own shell has it too, so a program
// started there directly, without srun, would believe it had peers.)
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    if (const char* v = std::getenv(var); v && *v) return std::max(1, std::atoi(v));
  }
  return 1;
}

}  // namespace comm_detail
int run_on_all_ranks(const std::string& backend, const std::function<int(Communicator&)>& body) {
  std::unique_ptr<Communicator> comm;
  try {
    comm = make_communicator(backend);
  } catch (const std::exception& e) {  // no communicator, so nothing to abort: this process just ends
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  try {
    return body(*comm);
  } catch (const std::exception& e) {
    // A TODO not written yet throws on every rank alike; exit code 3 says so.
    const bool todo = dynamic_cast<const NotImplemented*>(&e) != nullptr;
    std::fflush(stdout);
    std::fprintf(stderr, "[rank %d] %s\n", comm->rank(), e.what());
    std::fflush(stderr);
    if (comm->size() == 1) return todo ? 3 : 1;
    comm->abort(todo ? 3 : 1, todo ? "a TODO is not implemented yet" : "an error on this rank");
  }
  return 1;  // not reached: abort() ends the job (some compilers cannot see that through the virtual call)
}

void start_device(const std::string& device, const std::string& sim_gpu, const std::string& backend) {
  if (device != "sim") {
    SL_CHECK_HINT(backend != "sim", "add --device sim (every rank a simulated GPU), or use --backend auto or mpi",
                  "--backend sim runs simulated GPUs in virtual time, but --device is '%s'", device.c_str());
    return;
  }
  SL_CHECK_HINT(backend != "mpi" && backend != "nccl",
                "use --backend sim (or auto) with --device sim, or --device cpu with --backend " + backend,
                "--backend %s cannot move simulated GPU memory (--device sim)", backend.c_str());
  sim_gpu_set(GpuModel::preset(sim_gpu));  // throws, naming the presets, for another --sim-gpu
}

int run_on_all_ranks(const std::string& device, const std::string& sim_gpu, const std::string& backend,
                     const std::function<int(Communicator&)>& body) {
  try {
    start_device(device, sim_gpu, backend);
  } catch (const std::exception& e) {  // every rank checks the same options: each ends with the same message
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return run_on_all_ranks(backend, body);
}

int run_single_process(const std::function<int()>& body, int error_exit) {
  try {
    return body();
  } catch (const std::exception& e) {
    const bool todo = dynamic_cast<const NotImplemented*>(&e) != nullptr;
    std::fflush(stdout);  // what was printed so far comes before the error
    std::fprintf(stderr, "%s\n", e.what());
    return todo ? 3 : error_exit;
  }
}

}  // namespace scalelab
