// link_model.cpp — the simulated link (comm.h LinkModel): presets and the alpha-beta cost.
// The communicator backends apply it: a call completes no earlier than start + seconds(...).
// Formulas: docs/references.md "Collectives" (Hockney's alpha-beta model; ring
// collectives as in Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1)). Tests: tests/common/comm/test_comm.cpp
//
// The figures of the presets and where they come from:
//   base_s  8.4 us per call: NCCL's tuner base latency per collective, Simple protocol
//           (NCCL src/graph/tuning.cc, as quoted in docs/references.md). Used by every preset.
//   alpha_s per ring hop, the same tuner table (Simple protocol): 3.4 us over NVLink, 5.7 us over
//           PCIe, 14 us over the network (Ethernet and InfiniBand alike: the table has one network row).
//   B       the bus bandwidth (busbw) a ring sustains, bytes/s:
//     nvlink       370 GB/s  nccl-tests all_reduce busbw on 8x H100 NVLink (docs/references.md "Collectives":
//                            ~370-480 GB/s; the ring figure, the low end)
//     pcie          25 GB/s  PCIe Gen4 x16, achievable (32 GB/s theoretical per direction)
//     ethernet100   12 GB/s  100 Gb/s Ethernet = 12.5 GB/s line rate, a little less achieved
//     infiniband    46 GB/s  400 Gb/s InfiniBand, nccl-tests across nodes ~46-49 GB/s per NIC (low end)
//   free    0 s, 0 s, infinite bandwidth: every call costs nothing, on any backend (on the sim backend,
//           where "none" keeps the backend's own links, the way to ask for free messages)
// They are round figures for teaching, not a calibration of any machine: lab 00 measures yours.
#include <cmath>
#include <limits>  // defines: std::numeric_limits (the free link's bandwidth)
#include <string>

#include "comm_internal.h"        // defines: bus_bytes, latency_hops
#include "scalelab/comm/comm.h"   // defines: LinkModel
#include "scalelab/core/error.h"  // defines: SL_FAIL, SL_CHECK_HINT

namespace scalelab {

namespace {
constexpr double kUs = 1e-6;                     // seconds per microsecond
constexpr double kGB = 1e9;                      // bytes per GB (decimal, as nccl-tests reports)
constexpr double kNcclBaseLatencyS = 8.4 * kUs;  // per collective, Simple protocol
}  // namespace

LinkModel LinkModel::preset(const std::string& name) {
  LinkModel m;
  m.name = name;
  m.base_s = kNcclBaseLatencyS;
  if (name == "none") return LinkModel{};
  if (name == "free") {  // messages cost nothing: what the bubble formula assumes (lab 06)
    m.base_s = 0.0;
    m.bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
    return m;
  }
  if (name == "nvlink") {
    m.alpha_s = 3.4 * kUs;
    m.bandwidth_bytes_per_s = 370 * kGB;
  } else if (name == "pcie") {
    m.alpha_s = 5.7 * kUs;
    m.bandwidth_bytes_per_s = 25 * kGB;
  } else if (name == "ethernet100") {
    m.alpha_s = 14 * kUs;
    m.bandwidth_bytes_per_s = 12 * kGB;
  } else if (name == "infiniband") {
    m.alpha_s = 14 * kUs;
    m.bandwidth_bytes_per_s = 46 * kGB;
  } else {
    SL_FAIL("use one of: none, free, nvlink, pcie, ethernet100, infiniband", "unknown link model preset '%s'",
            name.c_str());
  }
  return m;
}

// base + hops * alpha + bus_bytes / B. bus_bytes carries the ring's (n-1)/n factors (comm_internal.h),
// e.g. all_reduce of S bytes: base + 2(n-1) alpha + 2(n-1)/n S / B, as in comm.h.
double LinkModel::seconds(const std::string& op, int64_t payload_bytes, int n) const {
  if (!enabled() || n <= 1) return 0.0;
  SL_CHECK_HINT(bandwidth_bytes_per_s > 0, "set bandwidth_bytes_per_s > 0 or use LinkModel::preset",
                "link model '%s' has bandwidth %g bytes/s", name.c_str(), bandwidth_bytes_per_s);
  const double hops = comm_detail::latency_hops(op, n);
  const double bytes = static_cast<double>(comm_detail::bus_bytes(op, payload_bytes, n));
  return base_s + hops * alpha_s + bytes / bandwidth_bytes_per_s;
}

}  // namespace scalelab
