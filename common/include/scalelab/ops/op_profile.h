// op_profile.h — where a step's time goes, op by op. While the profile is on, every Tensor-level op of
// ops.h (the dispatch point, dispatch.cpp) adds its wall time to a table, under the phase named last
// ("forward", "backward", "optimizer": whatever the caller is timing). What a phase spends outside the ops
// (the model's glue, allocations, hooks, communication) is its own total minus its ops' sum: a caller that
// times the phase shows it as "other". bench_lab01 --breakdown prints the table per phase.
//
// Timing: on the CPU each op's own wall time (the ops are synchronous). On a GPU a launch returns before
// the kernel ends, so a profiled op synchronizes the device after it: each op's time is then its own, and
// the step is slower by the synchronizations (a few microseconds each). On the simulated GPU
// (Device::SIM) each op's modelled time (ops/op_cost.h), the time it adds to the virtual clock. An op called inside another (none
// of ops.h does today) counts toward the outer one only. Off (the default), the cost is one relaxed load
// per op. Thread-safe: ops of several threads (the pipeline's ranks of a local communicator) add to one
// table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace scalelab {

struct OpTime {
  std::string phase;  // op_profile_phase's name when the op ran ("" before any)
  std::string op;     // the ops.h function: "matmul_forward", "layernorm_backward", ...
  int64_t calls = 0;
  double ms = 0;  // time of all its calls, milliseconds: wall time, or modelled time on SIM
};

// Turns the profile on (the table is emptied) or off (the table is kept for op_profile_table).
void op_profile_enable(bool on);
bool op_profile_enabled();
// The phase the following ops count under, until the next call; "" : none.
void op_profile_phase(const std::string& phase);
// Adds one call of `op` taking `ms` to the current phase (dispatch.cpp calls it; a caller may add its own
// entries, e.g. a communication step it times). Does nothing while the profile is off.
void op_profile_add(const char* op, double ms);
// Every (phase, op) seen since the profile was turned on: phases in the order they were first set, and
// inside a phase the ops by time, the longest first.
std::vector<OpTime> op_profile_table();

}  // namespace scalelab
