// blas_kernel.cpp — makes OpenBLAS run the GEMM kernels this CPU can run, and says which it runs.
//
// Why this file exists. A DYNAMIC_ARCH OpenBLAS (Debian's, and most distributions') picks its kernels once,
// when it is loaded, from the CPU's family and model numbers. A CPU newer than the library is not in its
// table, and it falls back to "Prescott": SSE3 kernels from 2004. On the Intel Xeon (model 207, AVX-512)
// this kit was developed on, Debian 12's OpenBLAS 0.3.21 did exactly that: sgemm ran at 47 GFLOP/s on 2
// threads where the SkylakeX kernels reach 199-216, and a d12 4x256 step of bench_lab01 took 23.5 s instead
// of 3.5 s. The documented way to override the choice is the environment variable OPENBLAS_CORETYPE, read
// only while the library loads: too late for a program that is already running.
//
// So, before main(): if OpenBLAS chose a pre-AVX2 kernel set and the CPU reports AVX2+FMA or AVX-512, this
// sets OPENBLAS_CORETYPE to the best set the CPU supports (and SL_BLAS_KERNEL_REPLACED to the set it
// replaces, for blas_kernel()) and executes the same program again: same pid, arguments and environment
// plus those two variables; under mpirun every rank does it before MPI_Init. The second start finds
// OPENBLAS_CORETYPE set and leaves everything alone. Nothing changes when OpenBLAS already chose an AVX2 or
// AVX-512 set, when the library was built for one CPU (no DYNAMIC_ARCH), when the user set
// OPENBLAS_CORETYPE, or with SL_KEEP_BLAS_KERNEL=1: set it under valgrind (which does not follow the
// second start) or when starting the program through ld.so. Results do not depend on the kernels beyond
// the order of fp32 sums; speed does. The second start costs one more load of the program's libraries
// (~0.1 s with cuBLAS): a script that starts many programs runs `eval "$(build/bin/sl_calibrate
// --blas-env)"` once, and they all inherit the variables (scripts/test.sh).
// tests: tests/common/ops/test_blas_kernel.cpp
#include <cblas.h>    // defines: openblas_get_corename, openblas_get_config (OpenBLAS's extensions)
#include <strings.h>  // defines: strcasecmp
#include <unistd.h>   // defines: execv

#include <cstdlib>  // defines: getenv, setenv
#include <cstring>  // defines: strstr, strcmp
#include <string>

#include "scalelab/ops/twins.h"  // declares: cpu::blas_kernel

namespace {

// The kernel set for this CPU's instruction sets, in OpenBLAS's OPENBLAS_CORETYPE names; nullptr when the
// CPU has neither AVX2+FMA nor AVX-512 (then OpenBLAS's own choice is as good as any).
// __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV).
const char* best_kernel_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

// OpenBLAS's x86 kernel sets older than AVX2 (its names): its fallbacks for a CPU it does not know. Any
// other name (Haswell, Zen, SkylakeX, ..., or one a newer OpenBLAS adds) is left alone, and so is
// "Unknown", what a statically linked OpenBLAS reports before its own set-up has run.
bool is_pre_avx2_kernel(const char* name) {
  for (const char* k : {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn",
                        "Dunnington", "Nehalem", "Sandybridge", "Opteron", "Opteron(SSE3)", "Barcelona", "Bobcat",
                        "Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    if (std::strcmp(name, k) == 0) return true;
  return false;
}

// An environment variable that is set to something other than "" or "0".
bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// The set OpenBLAS first chose, when this file replaced it (nullptr otherwise). A plain pointer into the
// environment: a std::string here could be constructed after the constructor below has run, and emptied.
const char* g_replaced = nullptr;

// Runs before main() (glibc passes argc, argv and envp to constructors); see the file comment.
__attribute__((constructor)) void choose_openblas_kernel(int /*argc*/, char** argv, char** /*envp*/) {
  // The second start (or a script's export): believed only if OpenBLAS now runs the set asked for, so a
  // stale SL_BLAS_KERNEL_REPLACED beside the user's own OPENBLAS_CORETYPE claims nothing.
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked != nullptr && std::getenv("SL_BLAS_KERNEL_REPLACED") != nullptr &&
      strcasecmp(asked, openblas_get_corename()) == 0)
    g_replaced = std::getenv("SL_BLAS_KERNEL_REPLACED");
  if (asked != nullptr || env_on("SL_KEEP_BLAS_KERNEL")) return;
  if (argv == nullptr || std::strstr(openblas_get_config(), "DYNAMIC_ARCH") == nullptr) return;
  const char* chosen = openblas_get_corename();
  const char* best = best_kernel_for_this_cpu();
  if (best == nullptr || !is_pre_avx2_kernel(chosen)) return;
  setenv("OPENBLAS_CORETYPE", best, /*overwrite=*/1);
  setenv("SL_BLAS_KERNEL_REPLACED", chosen, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run on with OpenBLAS's own choice
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("SL_BLAS_KERNEL_REPLACED");
}

}  // namespace

// Referenced by the link line of every program (common/CMakeLists.txt), so the constructor above is always
// linked in from the static library, even into a program that never calls blas_kernel().
extern "C" const char scalelab_blas_kernel_choice = 1;

namespace scalelab::cpu {

bool blas_kernel_replaced() { return g_replaced != nullptr; }

std::string blas_kernel() {
  std::string name = openblas_get_corename();
  if (g_replaced == nullptr) return name;
  const std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  const std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));  // "OpenBLAS 0.3.21"
  return name + " (set by scalelab: " + version + " took this CPU for " + std::string(g_replaced) + ")";
}

}  // namespace scalelab::cpu
