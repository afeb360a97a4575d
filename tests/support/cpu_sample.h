// cpu_sample.h — how much of this machine's cores OTHER processes used while a measurement ran: what
// decides whether a timing-based check measured the code or the neighbours (tests/perf/perf_compare.h,
// the speed checks). Implementation: cpu_sample.cpp (sl_test_support).
#pragma once

namespace scalelab::test {

double load_1min();  // /proc/loadavg's first field; 0 when unreadable

// Other processes' share of this process's cores (CPU runs): /proc/stat's busy time of the cores in the
// affinity mask minus the CPU time of this process and its finished children, per wall second.
// (The 1-minute load average says the same more slowly, and counts our own previous runs.)
struct CpuSample {
  double t_s = 0;     // s, wall clock
  double busy_s = 0;  // s, busy time summed over the cores of the affinity mask
  double own_s = 0;   // s, CPU time of this process + its waited-for children
};
CpuSample sample_cpu();
// Cores others kept busy between a and b. own_extra_s: CPU seconds of processes that are not others
// either (the other ranks of this job), subtracted too.
double other_cores(const CpuSample& a, const CpuSample& b, double own_extra_s = 0);

}  // namespace scalelab::test
