// oracle.cpp — tests/lab09/oracle.h: compiled with SL_TRACK_LAB09=oracle, so planner.h declares the oracle's
// build of the reference (scalelab::lab09::oracle::...), which these forward to.
#include "oracle.h"

namespace scalelab::lab09::oracle_model {

int activation_sets(const Layout& x, int stage) { return oracle::activation_sets(x, stage); }
DeviceMemory stage_memory(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w) {
  return oracle::stage_memory(cfg, x, stage, w);
}
DeviceMemory device_memory(const GPTConfig& cfg, const Layout& x, const Workload& w) {
  return oracle::device_memory(cfg, x, w);
}
StageFlops stage_flops(const GPTConfig& cfg, const Layout& x, int stage, const Workload& w) {
  return oracle::stage_flops(cfg, x, stage, w);
}
StageComm stage_comm(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  return oracle::stage_comm(cfg, x, stage, links, w);
}
double dp_seconds(const GPTConfig& cfg, const Layout& x, int stage, const GroupLinks& links, const Workload& w) {
  return oracle::dp_seconds(cfg, x, stage, links, w);
}
StepTime step_time(const GPTConfig& cfg, const Layout& x, const Workload& w, const Cluster& c) {
  return oracle::step_time(cfg, x, w, c);
}
std::vector<Candidate> plan(const GPTConfig& cfg, const Workload& w, const Cluster& c) {
  return oracle::plan(cfg, w, c);
}

}  // namespace scalelab::lab09::oracle_model
