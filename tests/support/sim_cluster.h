// sim_cluster.h — the simulated cluster of a multi-rank check, for the length of that check: an H100 per rank
// with the virtual clock on (at 0), undone at the end so the checks after it run on the CPU and the wall clock
// again; and host tokens copied onto a device, as a GPU program copies a batch in. Shared by the pipeline
// (tests/lab06) and context-parallel (tests/lab10) checks. The simulated device: docs/simulation.md.
#pragma once

#include <memory>

#include "scalelab/comm/comm.h"       // defines: Communicator, make_communicator, LinkModel
#include "scalelab/core/sim_gpu.h"    // defines: GpuModel, sim_gpu_set, sim_gpu_clear
#include "scalelab/core/tensor.h"     // defines: Tensor, Device

namespace scalelab::test {

class SimulatedCluster {
 public:
  SimulatedCluster() { sim_gpu_set(GpuModel::preset("h100")); }
  ~SimulatedCluster() { sim_gpu_clear(); }
  SimulatedCluster(const SimulatedCluster&) = delete;
  SimulatedCluster& operator=(const SimulatedCluster&) = delete;
  // Collective over all ranks: a sim world whose groups (and those split from it) cost 0 s a message.
  static std::unique_ptr<Communicator> free_world() {
    std::unique_ptr<Communicator> w = make_communicator("sim");
    w->set_link_model(LinkModel::preset("free"));
    return w;
  }
};

// A copy of the host tensor on `device` (same shape and dtype).
inline Tensor on_device(const Tensor& host, Device device) {
  Tensor t = Tensor::empty(host.shape(), host.dtype(), device);
  t.copy_from(host);
  return t;
}

}  // namespace scalelab::test
