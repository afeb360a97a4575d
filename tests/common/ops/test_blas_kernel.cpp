// test_blas_kernel.cpp — common/src/ops/cpu/blas_kernel.cpp: OpenBLAS runs the GEMM kernels this CPU can run.
// Found by bench_lab01: Debian 12's OpenBLAS 0.3.21 took an AVX-512 Xeon (model 207) for a 2004 "Prescott" and
// ran every fp32 GEMM about 6x slower. Before blas_kernel.cpp this test failed on that machine.
#include <cblas.h>  // defines: openblas_get_corename, openblas_get_config
#include <gtest/gtest.h>

#include <strings.h>  // defines: strcasecmp
#include <unistd.h>   // defines: readlink

#include <cstdlib>
#include <cstring>
#include <string>

#include "scalelab/ops/twins.h"  // defines: scalelab::cpu::blas_kernel

namespace {

bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

TEST(BlasKernel, OpenBlasRunsKernelsThisCpuCanRun) {
  if (std::strstr(openblas_get_config(), "DYNAMIC_ARCH") == nullptr)
    GTEST_SKIP() << "OpenBLAS built for one CPU (" << openblas_get_config() << "): its kernels are fixed";
  if (!cpu_has_avx2_fma()) GTEST_SKIP() << "a CPU without AVX2+FMA: no better kernel set to ask for";
  if (std::getenv("SL_KEEP_BLAS_KERNEL") != nullptr) GTEST_SKIP() << "SL_KEEP_BLAS_KERNEL is set";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr && std::getenv("SL_BLAS_KERNEL_REPLACED") == nullptr)
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << std::getenv("OPENBLAS_CORETYPE") << " was set by the user";
  const std::string name = openblas_get_corename();
  EXPECT_TRUE(name == "Haswell" || name == "Zen" || name == "SkylakeX" || name == "Cooperlake" ||
              name == "SapphireRapids")
      << "OpenBLAS runs its '" << name << "' kernels on a CPU with AVX2+FMA (" << openblas_get_config() << ")";
}

TEST(BlasKernel, SaysWhichKernelsAndWhoChoseThem) {
  const std::string said = scalelab::cpu::blas_kernel();
  EXPECT_EQ(said.rfind(openblas_get_corename(), 0), 0u) << said;  // starts with OpenBLAS's own name
  // Replaced: the kit's two variables are set and OpenBLAS runs the set they ask for (a stale
  // SL_BLAS_KERNEL_REPLACED beside another OPENBLAS_CORETYPE claims nothing).
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  const char* replaced = std::getenv("SL_BLAS_KERNEL_REPLACED");
  const bool expect_replaced = asked != nullptr && replaced != nullptr &&
                               strcasecmp(asked, openblas_get_corename()) == 0;
  EXPECT_EQ(scalelab::cpu::blas_kernel_replaced(), expect_replaced);
  if (expect_replaced) EXPECT_NE(said.find(std::string("took this CPU for ") + replaced), std::string::npos) << said;
  else EXPECT_EQ(said, openblas_get_corename());
}

// The re-execution itself, in a child of this test started without the variables (a script's export, as
// scripts/test.sh makes, would otherwise mean no test here ever ran it): the child must come up on kernels
// this CPU can run and say who chose them.
TEST(BlasKernel, AChildStartedWithoutTheVariablesChoosesForItself) {
  if (std::strstr(openblas_get_config(), "DYNAMIC_ARCH") == nullptr) GTEST_SKIP() << "kernels fixed at build";
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string cmd = std::string("env -u OPENBLAS_CORETYPE -u SL_BLAS_KERNEL_REPLACED -u SL_KEEP_BLAS_KERNEL '") +
                          self + "' --gtest_filter='BlasKernel.OpenBlas*:BlasKernel.Says*' > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n(run it without the redirection to see which check failed)";
}

}  // namespace
