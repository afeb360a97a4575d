// link_model.cpp — the simulated link (comm.h LinkModel): presets, measured links from text (link_spec.h)
// and the alpha-beta cost.
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
#include <algorithm>  // defines: std::min
#include <cmath>
#include <cstdlib>    // defines: std::strtod
#include <limits>  // defines: std::numeric_limits (the free link's bandwidth)
#include <string>

#include "comm_internal.h"        // defines: bus_bytes, latency_hops
#include "scalelab/comm/comm.h"   // defines: LinkModel
#include "scalelab/comm/link_spec.h"  // defines: parse_link
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

namespace {
// "25us" -> 25e-6 (seconds); false when the text is not a number >= 0 followed by s, ms, us or ns.
bool parse_seconds(const std::string& text, double& seconds) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(v) || v < 0) return false;
  const std::string unit(end);
  const double scale = unit == "s" ? 1.0 : unit == "ms" ? 1e-3 : unit == "us" ? 1e-6 : unit == "ns" ? 1e-9 : -1.0;
  seconds = v * scale;
  return scale > 0;
}

// "118MB/s" -> 118e6 (bytes/s); false when the text is not a number > 0 followed by B/s, kB/s, MB/s, GB/s,
// Mbit/s or Gbit/s.
bool parse_bytes_per_s(const std::string& text, double& bytes_per_s) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(v) || v <= 0) return false;
  const std::string unit(end);
  const double scale = unit == "B/s"      ? 1.0
                       : unit == "kB/s"   ? 1e3
                       : unit == "MB/s"   ? 1e6
                       : unit == "GB/s"   ? 1e9
                       : unit == "Mbit/s" ? 1e6 / 8
                       : unit == "Gbit/s" ? 1e9 / 8
                                          : -1.0;
  bytes_per_s = v * scale;
  return scale > 0;
}
}  // namespace

LinkModel parse_link(const std::string& spec) {
  if (spec.find('=') == std::string::npos) return LinkModel::preset(spec);
  const char* kForm =
      "a preset (none, free, nvlink, pcie, ethernet100, infiniband) or measured figures "
      "alpha=<time>,bw=<bandwidth>[,base=<time>], e.g. alpha=25us,bw=118MB/s (time: s, ms, us, ns; "
      "bandwidth: B/s, kB/s, MB/s, GB/s, Mbit/s, Gbit/s)";
  LinkModel m;
  m.name = spec;
  bool has_alpha = false, has_bw = false;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string field = spec.substr(begin, comma - begin);
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (ok && key == "alpha") {
      ok = !has_alpha && parse_seconds(value, m.alpha_s);
      has_alpha = true;
    } else if (ok && key == "base") {
      ok = parse_seconds(value, m.base_s);
    } else if (ok && key == "bw") {
      ok = !has_bw && parse_bytes_per_s(value, m.bandwidth_bytes_per_s);
      has_bw = true;
    } else {
      ok = false;
    }
    SL_CHECK_HINT(ok, kForm, "link '%s': cannot read '%s' (fields alpha, bw and base, each once, with units)",
                  spec.c_str(), field.c_str());
    begin = comma + 1;
  }
  SL_CHECK_HINT(has_alpha && has_bw, kForm, "link '%s': needs both alpha (latency per hop) and bw (bandwidth)",
                spec.c_str());
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
