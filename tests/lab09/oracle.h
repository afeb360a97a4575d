// oracle.h — "the model" the graded checks of lab 09 compare a track with: the repository's reference
// solutions/09_planner/planner.cpp built in its own namespace (tests/lab09/CMakeLists.txt explains why).
// The types are planner.h's, shared by every track; these functions call the oracle's build of each
// function of the same name.
#pragma once

#include <vector>

#include "planner.h"  // defines: lab09::Layout, Workload, Cluster, DeviceMemory, StageFlops, StageComm, StepTime

namespace scalelab::lab09::oracle_model {

int activation_sets(const Layout& x, int stage);
DeviceMemory stage_memory(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w);
DeviceMemory device_memory(const GPTConfig& cfg, const Layout& x, const Workload& w);
StageFlops stage_flops(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w);
StageComm stage_comm(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w);
double dp_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w);
StepTime step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c);
std::vector<Candidate> plan(const GPTConfig& cfg, const Workload& w, const Cluster& c);

}  // namespace scalelab::lab09::oracle_model
