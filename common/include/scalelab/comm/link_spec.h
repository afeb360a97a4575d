// link_spec.h — a simulated link (comm.h LinkModel) from text: a preset's name or measured figures.
// The driver's --link and --inter-link take this text (common/src/driver/driver.cpp make_link); lab 00's
// alpha-beta fit gives the figures (docs/communicator.md "A measured link"). Defined in
// common/src/comm/link_model.cpp. Tests: tests/common/comm/test_comm.cpp (CommLinkModel).
#pragma once

#include <string>

#include "scalelab/comm/comm.h"  // defines: LinkModel

namespace scalelab {

// A preset's name (LinkModel::preset: none, free, nvlink, pcie, ethernet100, infiniband), or a measured
// link "alpha=25us,bw=118MB/s" with an optional ",base=5us"; fields in any order, each once, alpha and bw
// required. Times take s, ms, us or ns (>= 0); bandwidths B/s, kB/s, MB/s, GB/s (decimal, as nccl-tests
// and lab 00 report) or Mbit/s, Gbit/s (> 0). alpha is the latency of one hop, base what every call pays
// once, bw the bus bandwidth: the alpha-beta model of LinkModel::seconds (Hockney; docs/references.md
// "Collectives"). A measured link's name is the text itself. Throws scalelab::Error naming the field that
// cannot be read and showing the accepted forms.
LinkModel parse_link(const std::string& spec);

}  // namespace scalelab
