// comm.h — the communicator: one interface for every way ranks talk (DESIGN.md "Communicator").
// Backends (make_communicator):
//   local  world size 1; collectives are copies; no MPI needed
//   mpi    OpenMPI; CPU tensors directly, CUDA tensors staged through pinned host memory (Debian's
//          OpenMPI is not CUDA-aware). Operations run in order on one communication thread per
//          communicator, so asynchronous calls progress while the caller computes.
//   nccl   one GPU per rank; the unique id is broadcast over MPI; a communication stream ordered
//          against the compute stream with events (verified only where several GPUs exist)
// Counts are ELEMENTS, never bytes (STYLE.md 22). Every call appends a CommEvent (op, elements,
// payload and bus bytes, issue/start/end times, the tag of the layer or bucket that issued it), so
// labs and tests can check communication volume and overlap.
// A LinkModel makes a CPU run show what a cluster link would: a call completes no earlier than its
// alpha-beta modelled time (Hockney; ring collectives as in Thakur, Rabenseifner & Gropp 2005), and
// its event says simulated.
// Errors: scalelab::Error naming the rank, the operation and the sizes.
// Tests: tests/common/test_comm.cpp (local), tests/mpi/test_comm_mpi.cpp (2 and 4 ranks)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scalelab/tensor.h"

namespace scalelab {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// The alpha-beta cost of one call over a simulated link (REFERENCES.md "A cost model for simulated
// links"). S = payload bytes per rank, n = ranks:
//   all_reduce 2(n-1) alpha + 2(n-1)/n S/B;  reduce_scatter, all_gather (n-1) alpha + (n-1)/n S_total/B;
//   broadcast (n-1) alpha + S/B;  send/recv alpha + S/B;  barrier 2(n-1) alpha.
struct LinkModel {
  std::string name = "none";  // "none" (real transport only), "nvlink", "pcie", "ethernet100", "infiniband"
  double alpha_s = 0.0;       // seconds per message hop (latency)
  double bandwidth_bytes_per_s = 0.0;  // busbw the link sustains, bytes/s
  bool enabled() const { return name != "none"; }
  // Presets; the figures and their sources are listed in common/src/comm_link_model.cpp.
  // Throws with the accepted names otherwise.
  static LinkModel preset(const std::string& name);
  // Modelled seconds of one call ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send",
  // "recv", "barrier") moving payload_bytes per rank among n ranks. 0 when !enabled() or n == 1.
  double seconds(const std::string& op, int64_t payload_bytes, int n) const;
};

// One record per call, in issue order (per communicator).
struct CommEvent {
  std::string op;            // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"
  std::string tag;           // who issued it: "bucket 3", "layer h.5", "" when not given
  int64_t count = 0;         // elements this rank contributes (all_gather: elements per rank)
  DType dtype = DType::F32;
  int64_t payload_bytes = 0; // count * dtype size
  int64_t bus_bytes = 0;     // payload_bytes * nccl-tests bus factor: 2(n-1)/n all_reduce, (n-1)/n per
                             // rank... of the TOTAL for all_gather/reduce_scatter, 1 broadcast/send/recv
  double issue_ms = 0;       // when the caller issued it, ms since the communicator was created
  double start_ms = 0;       // when the transport started it
  double end_ms = 0;         // when it completed (with a link model: no earlier than start + modelled)
  double modeled_ms = 0;     // the link model's time for it (0 without a model)
  bool async = false;
  bool simulated = false;    // a link model decided (part of) its duration
  int peer = -1;             // send/recv: the other rank
};

// A pending asynchronous operation (like torch.distributed's Work). wait() blocks until the result is
// in the output tensor; test() polls. Destroying an unfinished Work waits for it.
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
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"

  // Asynchronous collectives. Tensors must stay alive and untouched until wait() returns.
  // all_reduce: in place, buf (n) on every rank; Avg divides the sum by size().
  virtual WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag = "") = 0;
  // reduce_scatter: in (size()*n) -> out (n): rank r receives the reduction of chunk r.
  // Uneven sizes are refused with a hint to pad (in.numel() must equal size() * out.numel()).
  virtual WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag = "") = 0;
  // all_gather: in (n) -> out (size()*n), rank r's chunk at [r*n, (r+1)*n).
  virtual WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag = "") = 0;
  // broadcast: buf (n) from root to every rank, in place.
  virtual WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag = "") = 0;
  virtual WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag = "") = 0;
  virtual WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag = "") = 0;

  // Blocking forms: the async call, then wait().
  void all_reduce(Tensor& buf, ReduceOp op, const std::string& tag = "") { all_reduce_async(buf, op, tag)->wait(); }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag = "") {
    reduce_scatter_async(in, out, op, tag)->wait();
  }
  void all_gather(const Tensor& in, Tensor& out, const std::string& tag = "") { all_gather_async(in, out, tag)->wait(); }
  void broadcast(Tensor& buf, int root, const std::string& tag = "") { broadcast_async(buf, root, tag)->wait(); }
  void send(const Tensor& buf, int peer, const std::string& tag = "") { send_async(buf, peer, tag)->wait(); }
  void recv(Tensor& buf, int peer, const std::string& tag = "") { recv_async(buf, peer, tag)->wait(); }
  virtual void barrier() = 0;

  // A new communicator of the ranks that pass the same color, ordered by key (then by old rank),
  // like MPI_Comm_split. Collective: every rank of this communicator must call it.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Ends the whole job (every rank), so a failing rank does not leave the others waiting forever.
  [[noreturn]] virtual void abort(int exit_code, const std::string& why) = 0;

  // Simulated link (default: none). Applies to calls issued after it is set.
  virtual void set_link_model(const LinkModel& link) = 0;
  virtual const LinkModel& link_model() const = 0;

  // The event log (calls completed or pending, in issue order) and a way to start afresh per step.
  virtual std::vector<CommEvent> events() const = 0;
  virtual void clear_events() = 0;
};

// backend: "auto" (mpi when launched by mpirun/srun with more than one rank, else local), "local",
// "mpi", "nccl". The MPI/NCCL backends initialise MPI on first use (MPI_THREAD_MULTIPLE) and
// finalise it at exit. Throws with a hint when a backend is not built or not usable (e.g. two ranks
// on one GPU with nccl: "use --backend mpi").
std::unique_ptr<Communicator> make_communicator(const std::string& backend = "auto");

// nccl-tests' bus-bandwidth factor for an op among n ranks (REFERENCES.md "Collectives"):
// 2(n-1)/n all_reduce, (n-1)/n all_gather and reduce_scatter, 1 broadcast/send/recv; 0 for n == 1.
double bus_factor(const std::string& op, int n);

}  // namespace scalelab
