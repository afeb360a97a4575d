// local.cpp — the `local` communicator: a world of one rank (comm.h). Collectives over one rank
// are copies (or nothing), so single-device programs use the same code as multi-rank ones. Calls are
// recorded like in the other backends; they finish before the call returns. A link model has no
// effect here (LinkModel::seconds is 0 for n == 1), nor does a wait timeout (nothing waits).
// Tests: tests/common/comm/test_comm.cpp
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "comm_internal.h"  // defines: EventLog, make_event, finished_work, check_*
#include "scalelab/comm/comm.h"
#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT

namespace scalelab::comm_detail {

namespace {

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(const std::string& name, const Topology& topology) { init_group(name, {0}, topology); }
  using Communicator::split;  // the two-argument form

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  Device device() const override { return Device::CPU; }  // (any tensor works: collectives are copies)

  WorkPtr all_reduce_async(Tensor& buf, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("all_reduce", 0, 1, buf.dtype(), op);
    // Sum, Max and Avg (sum / 1) of one rank's values are those values: nothing to do.
    return record("all_reduce", tag, buf.numel(), buf.dtype());
  }

  WorkPtr reduce_scatter_async(const Tensor& in, Tensor& out, ReduceOp op, const std::string& tag) override {
    check_reduce_dtype("reduce_scatter", 0, 1, in.dtype(), op);
    check_reduce_scatter(0, 1, in, out);
    if (out.raw() != in.raw()) out.copy_from(in);  // the one chunk is the whole input
    return record("reduce_scatter", tag, in.numel(), in.dtype());
  }

  WorkPtr all_gather_async(const Tensor& in, Tensor& out, const std::string& tag) override {
    check_all_gather(0, 1, in, out);
    if (out.raw() != in.raw()) out.copy_from(in);
    return record("all_gather", tag, in.numel(), in.dtype());
  }

  WorkPtr broadcast_async(Tensor& buf, int root, const std::string& tag) override {
    check_root("broadcast", 0, 1, root);
    return record("broadcast", tag, buf.numel(), buf.dtype(), root);
  }

  WorkPtr send_async(const Tensor& buf, int peer, const std::string& tag) override {
    check_peer("send", 0, 1, peer);  // always throws: there is no other rank
    return nullptr;
  }

  WorkPtr recv_async(Tensor& buf, int peer, const std::string& tag) override {
    check_peer("recv", 0, 1, peer);
    return nullptr;
  }

  void barrier() override { record("barrier", "", 0, DType::F32); }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_color(0, 1, color);
    if (color == kNoColor) return nullptr;
    auto child = std::make_unique<LocalCommunicator>(name, topology());
    child->set_wait_timeout(wait_timeout());  // kept, though nothing here ever waits (comm.h)
    return child;
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    std::fprintf(stderr, "[scalelab] rank 0 of 1 aborts: %s\n", why.c_str());
    std::fflush(stderr);
    std::exit(exit_code);
  }

  std::vector<CommEvent> events() const override { return log_.snapshot(); }
  void clear_events() override { log_.clear(); }

 private:
  // Records a call that has already completed (issue = start = end).
  WorkPtr record(const std::string& op, const std::string& tag, int64_t count, DType dtype, int peer = -1) {
    CommEvent e = make_event(*this, op, tag, count, dtype, /*async=*/!issuing_blocking_call(), peer);
    e.start_ms = e.issue_ms;
    e.end_ms = Communicator::now_ms();
    log_.add(std::move(e));
    return finished_work();
  }

  EventLog log_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>("world", default_topology(/*world_size=*/1));
}

}  // namespace scalelab::comm_detail
