// comm.cpp — what every communicator backend shares (comm.h, comm_internal.h): make_communicator,
// bus_factor, reduce_op_name, the communication clock, the event log and the argument checks.
// Backends: local.cpp (world size 1), mpi.cpp (OpenMPI), nccl.cpp (NCCL).
// The link model: link_model.cpp. Tests: tests/common/comm/test_comm.cpp, tests/common/comm/test_comm_mpi.cpp
#include "scalelab/comm/comm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm_internal.h"    // defines: EventLog, make_event, check_*, backend factories
#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT, SL_FAIL

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
  SL_FAIL("use all_reduce, all_gather, reduce_scatter, broadcast, send, recv or barrier",
          "bus_factor: unknown op '%s'", op.c_str());
}

// The communication clock: steady, in ms, 0 at the first call (make_communicator calls it first).
double Communicator::now_ms() {
  using clock = std::chrono::steady_clock;
  static const clock::time_point origin = clock::now();
  return std::chrono::duration<double, std::milli>(clock::now() - origin).count();
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend) {
  (void)Communicator::now_ms();  // starts the communication clock
  const int launched = comm_detail::launcher_world_size();
  std::string chosen = backend;
  if (backend == "auto") chosen = launched > 1 ? "mpi" : "local";

  if (chosen == "local") {
    SL_CHECK_HINT(launched <= 1,
                  "use --backend mpi (or auto) under mpirun: with 'local' every rank would train alone",
                  "backend 'local' has world size 1, but the launcher started %d ranks", launched);
    return comm_detail::make_local_communicator();
  }
  if (chosen == "mpi") {
#ifdef SL_WITH_MPI
    return comm_detail::make_mpi_communicator();
#else
    SL_FAIL("apt-get install libopenmpi-dev openmpi-bin, then reconfigure (cmake prints 'MPI on')",
            "backend 'mpi' requested (launcher world size %d) but this build has no MPI", launched);
#endif
  }
  if (chosen == "nccl") {
#ifdef SL_WITH_NCCL
    return comm_detail::make_nccl_communicator();
#else
    SL_FAIL("the nccl backend needs CUDA, NCCL (nccl.h, libnccl) and MPI at configure time; on a CPU "
            "machine use --backend mpi",
            "backend 'nccl' requested but this build has no NCCL backend");
#endif
  }
  SL_FAIL("use auto, local, mpi or nccl", "unknown communicator backend '%s'", backend.c_str());
}

namespace comm_detail {

// ---------------------------------------------------------------------------------------------
// Event log
uint64_t EventLog::add(const CommEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
  return first_id_ + events_.size() - 1;
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

CommEvent make_event(const std::string& op, const std::string& tag, int64_t count, DType dtype, int n,
                     bool async, int peer, const LinkModel& link) {
  CommEvent e;
  e.op = op;
  e.tag = tag;
  e.count = count;
  e.dtype = dtype;
  e.payload_bytes = count * static_cast<int64_t>(dtype_size(dtype));
  e.bus_bytes = bus_bytes(op, e.payload_bytes, n);
  e.issue_ms = Communicator::now_ms();
  e.modeled_ms = 1e3 * link.seconds(op, e.payload_bytes, n);
  e.simulated = e.modeled_ms > 0.0;
  e.async = async;
  e.peer = peer;
  return e;
}

void sleep_until_ms(double t_ms) {
  const double wait_ms = t_ms - Communicator::now_ms();
  if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(wait_ms));
}

std::string describe_call(const std::string& op, int64_t count, DType dtype, int rank, int size,
                          const std::string& tag) {
  std::string s = op + " of " + std::to_string(count) + " " + dtype_name(dtype) + " elements on rank " +
                  std::to_string(rank) + " of " + std::to_string(size);
  if (!tag.empty()) s += " (tag '" + tag + "')";
  return s;
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
  SL_CHECK_HINT(n_in == static_cast<int64_t>(size) * n_out,
                "out holds one chunk: in.numel() / size() elements",
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

}  // namespace scalelab
