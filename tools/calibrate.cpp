// calibrate.cpp — bin/sl_calibrate: measure sgemm FLOP/s at GPT-2 d12 training shapes, print the
// table and write the cache runs/calibration/cpu_<threads>t.json that CPU runs use as their MFU peak.
// Library: common/src/measure/calibration.cpp. Tests: tests/common/measure/test_calibration.cpp
//
//   bin/sl_calibrate                  # all cores
//   bin/sl_calibrate --threads 1      # what one rank of a 2-rank run on 2 cores gets
//   bin/sl_calibrate --threads 1 --recalibrate   # measure again and replace the cache (a busy-machine peak)
//   bin/sl_calibrate --datasheet      # the GPU datasheet table instead
#include <CLI/CLI.hpp>  // defines: CLI::App (command line)

#include <cstdio>   // defines: std::printf, std::remove
#include <cstdlib>  // defines: std::getenv
#include <string>
#include <thread>

#include "scalelab/measure/calibration.h"   // defines: calibrate_gemm, load_or_calibrate, datasheet_peaks
#include "scalelab/core/error.h"            // defines: scalelab::Error
#include "scalelab/driver/option_checks.h"  // defines: positive_int, finite_positive, require_checked_options
#include "scalelab/ops/twins.h"             // defines: cpu::blas_kernel_replaced

int main(int argc, char** argv) {
  CLI::App app{"Measure CPU sgemm FLOP/s at GPT-2 d12 shapes (the MFU peak of CPU runs)"};
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  double seconds = 3.0;
  std::string cache_dir = "runs/calibration";
  bool no_cache = false, datasheet = false, recalibrate = false, blas_env = false;
  app.add_option("--threads", threads, "BLAS/OpenMP threads (default: all cores)")
      ->check(scalelab::driver::positive_int(scalelab::driver::kMaxThreads));
  app.add_option("--seconds", seconds, "time budget for the timed calls, all shapes together (s)")
      ->check(scalelab::driver::finite_positive());
  app.add_option("--cache-dir", cache_dir, "where cpu_<threads>t.json is written");
  app.add_flag("--no-cache", no_cache, "measure even if a matching cache file exists, and do not write it");
  app.add_flag("--recalibrate", recalibrate,
               "measure again and replace the cache file, even if it matches this machine (do it with nothing "
               "else running: a peak measured on a busy machine is too low and makes every MFU too high)");
  app.add_flag("--datasheet", datasheet, "print the table of GPU datasheet peaks and exit");
  app.add_flag("--blas-env", blas_env,
               "print the shell exports that give OpenBLAS the kernels this CPU can run (nothing when its own "
               "choice stands) and exit: a script that starts many programs evals them once, so no program "
               "re-executes itself to ask for them (common/src/ops/cpu/blas_kernel.cpp)");
  scalelab::driver::require_checked_options(app);  // a numeric option without a range check: a programming error
  CLI11_PARSE(app, argc, argv);
  if (blas_env) {
    if (scalelab::cpu::blas_kernel_replaced())  // then both are set, to OpenBLAS names (letters, digits)
      for (const char* name : {"OPENBLAS_CORETYPE", "SL_BLAS_KERNEL_REPLACED"})
        std::printf("export %s=%s\n", name, std::getenv(name));
    return 0;
  }

  try {
    if (datasheet) {
      std::printf("%-26s %14s %14s %14s  %s\n", "device", "bf16 TFLOP/s", "tf32 TFLOP/s", "fp32 TFLOP/s", "source");
      for (const auto& p : scalelab::datasheet_peaks()) {
        std::printf("%-26s %14.1f %14.1f %14.1f  %s\n", p.device.c_str(), p.bf16_flops_per_s / 1e12,
                    p.tf32_flops_per_s / 1e12, p.fp32_flops_per_s / 1e12, p.source.c_str());
      }
      std::printf("(dense figures; 0 = not in the table)\n");
      return 0;
    }
    const std::string path = scalelab::calibration_cache_path(cache_dir, threads);
    if (recalibrate && !no_cache) std::remove(path.c_str());  // load_or_calibrate then measures and writes it
    const scalelab::Calibration c = no_cache ? scalelab::calibrate_gemm(threads, seconds)
                                             : scalelab::load_or_calibrate(threads, cache_dir, seconds);
    std::printf("%s\n%s, %s, %d thread(s)\n\n", c.id.c_str(), c.cpu_model.c_str(), c.blas_build.c_str(), c.threads);
    std::printf("%-20s %6s %6s %6s %4s %8s %10s %10s\n", "shape", "M", "N", "K", "op", "repeats", "median_ms",
                "GFLOP/s");
    for (const auto& s : c.shapes) {
      const char op[3] = {s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', '\0'};
      std::printf("%-20s %6d %6d %6d %4s %8d %10.2f %10.1f\n", s.name.c_str(), s.M, s.N, s.K, op, s.repeats,
                  s.median_ms, s.flops_per_s / 1e9);
    }
    std::printf("\npeak (best shape)   %10.1f GFLOP/s   <- the MFU denominator of CPU runs\n", c.flops_per_s / 1e9);
    std::printf("median over shapes  %10.1f GFLOP/s\n", c.median_flops_per_s / 1e9);
    std::printf("source: %s\n", c.source.c_str());
    if (!no_cache) std::printf("cache:  %s\n", path.c_str());
    return 0;
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
