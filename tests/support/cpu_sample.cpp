// cpu_sample.cpp — see cpu_sample.h.
#include "cpu_sample.h"

#include <sched.h>         // defines: sched_getaffinity, CPU_ISSET
#include <sys/resource.h>  // defines: getrusage (CPU time of this process and its finished children)
#include <unistd.h>        // defines: sysconf

#include <algorithm>  // defines: std::max
#include <cctype>     // defines: std::isdigit
#include <chrono>     // defines: std::chrono::steady_clock
#include <fstream>    // defines: std::ifstream
#include <sstream>    // defines: std::istringstream
#include <string>

namespace scalelab::test {

using Clock = std::chrono::steady_clock;

double load_1min() {
  std::ifstream f("/proc/loadavg");
  double load = 0;
  f >> load;
  return load;
}

// ---------------------------------------------------------------------------------------------
// How much of this process's cores OTHER processes used: the busy time of those cores (/proc/stat, the
// cpuN lines of this process's affinity mask; steal counts as busy: a hypervisor took it) minus the CPU
// time of this process and of its finished children (the runs: mpiexec and its ranks are waited for).

CpuSample sample_cpu() {
  CpuSample s;
  s.t_s = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool have_mask = sched_getaffinity(0, sizeof(set), &set) == 0;
  const double tick_s = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream f("/proc/stat");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line.substr(3));
    int cpu = -1;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (cpu < 0 || (have_mask && (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)))) continue;
    s.busy_s += (user + nice + system + irq + softirq + steal) * tick_s;
  }
  auto cpu_s = [](int who) {
    rusage u{};
    getrusage(who, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  s.own_s = cpu_s(RUSAGE_SELF) + cpu_s(RUSAGE_CHILDREN);
  return s;
}

double other_cores(const CpuSample& a, const CpuSample& b, double own_extra_s) {
  const double wall_s = b.t_s - a.t_s;
  if (wall_s <= 0) return 0;
  return std::max(0.0, ((b.busy_s - a.busy_s) - (b.own_s - a.own_s) - own_extra_s) / wall_s);
}

}  // namespace scalelab::test
