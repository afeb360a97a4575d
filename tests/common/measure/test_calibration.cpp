// test_calibration.cpp — the MFU peak (common/include/scalelab/measure/calibration.h): the sgemm calibration
// returns a usable number, its cache is reused only on the same CPU and thread count, and datasheet
// lookups never lend one device's peak to another. Measured values are printed, never asserted.
#include <gtest/gtest.h>

#include <unistd.h>  // defines: getpid

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "scalelab/measure/calibration.h"
#include "scalelab/core/error.h"
#include "scalelab/ops/ops.h"         // defines: cpu::bf16_matmul_backend
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy
#include "scalelab/core/threads.h"

namespace fs = std::filesystem;

namespace {

constexpr double kTinyBudgetS = 0.01;  // seconds: every shape is still timed once (after warm-up)

std::string temp_dir(const char* tag) {
  const std::string d =
      (fs::temp_directory_path() / (std::string("sl_test_calib_") + tag + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST(Calibration, TinyBudgetGivesPositiveFiniteFlopsForEveryShape) {
  scalelab::set_num_threads(2);
  const scalelab::Calibration c = scalelab::calibrate_gemm(/*threads=*/1, kTinyBudgetS);
  EXPECT_EQ(scalelab::num_threads(), 2) << "calibration must restore the caller's thread count";
  EXPECT_EQ(c.threads, 1);
  ASSERT_EQ(c.shapes.size(), scalelab::d12_gemm_shapes().size());
  for (const auto& s : c.shapes) {
    EXPECT_GE(s.repeats, 1) << s.name;
    EXPECT_TRUE(std::isfinite(s.flops_per_s) && s.flops_per_s > 0) << s.name << ": " << s.flops_per_s;
    std::printf("  %-20s %6d x %5d x %5d  %8.1f GFLOP/s\n", s.name.c_str(), s.M, s.N, s.K, s.flops_per_s / 1e9);
  }
  EXPECT_TRUE(std::isfinite(c.flops_per_s) && c.flops_per_s > 0);
  EXPECT_GE(c.flops_per_s, c.median_flops_per_s) << "the peak is the best shape";
  EXPECT_EQ(c.id.rfind("cpu-gemm-", 0), 0u) << c.id;
  EXPECT_NE(c.id.find("-1t-"), std::string::npos) << c.id;
  EXPECT_NE(c.source.find("calibrated sgemm, d12 shapes, 1 thread"), std::string::npos) << c.source;
  std::printf("  peak %.1f GFLOP/s (1 thread, tiny budget: indicative only)\n", c.flops_per_s / 1e9);
}

// bf16-compute runs divide by the bf16 matmul's own rate (regression: on oneDNN's bf16 GEMM, lab 01 in
// bf16-compute reported MFU of 106-204 % against the sgemm peak). The calibration times cpu::matmul_forward_bf16
// at the forward shapes, names the backend, and keeps its own cache file beside sgemm's.
TEST(Calibration, Bf16CalibrationTimesTheBf16MatmulAtTheForwardShapesWithItsOwnCache) {
  const scalelab::Calibration c = scalelab::calibrate_gemm(/*threads=*/1, kTinyBudgetS, scalelab::GemmKind::Bf16);
  ASSERT_EQ(c.shapes.size(), 3u) << "qkv, fc and fcproj forward: the layout the bf16 op computes";
  for (const auto& s : c.shapes) {
    EXPECT_TRUE(s.trans_b && !s.trans_a) << s.name;
    EXPECT_TRUE(std::isfinite(s.flops_per_s) && s.flops_per_s > 0) << s.name;
  }
  EXPECT_EQ(c.blas_build, scalelab::cpu::bf16_matmul_backend());
  EXPECT_EQ(c.id.rfind("cpu-bf16gemm-", 0), 0u) << c.id;
  EXPECT_NE(c.source.find("calibrated bf16 matmul (" + c.blas_build + "), d12 forward shapes, 1 thread"),
            std::string::npos)
      << c.source;
  std::printf("  bf16 matmul peak %.1f GFLOP/s (1 thread, tiny budget: indicative only), %s\n", c.flops_per_s / 1e9,
              c.blas_build.c_str());

  const std::string dir = temp_dir("bf16");
  scalelab::load_or_calibrate(1, dir, kTinyBudgetS, scalelab::GemmKind::Bf16);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "cpu_bf16_1t.json"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "cpu_1t.json")) << "the sgemm cache is another file";
  fs::remove_all(dir);

  // The denominator each policy gets on the CPU: bf16-compute the bf16 matmul, fp32 and bf16-mixed sgemm.
  EXPECT_NE(scalelab::device_peak(scalelab::Device::CPU, scalelab::PrecisionPolicy::bf16_compute(), 1)
                .source.find("calibrated bf16 matmul"),
            std::string::npos);
  EXPECT_NE(scalelab::device_peak(scalelab::Device::CPU, scalelab::PrecisionPolicy::bf16_mixed(), 1)
                .source.find("calibrated sgemm"),
            std::string::npos);
}

TEST(Calibration, D12ShapesAreTheTrainingStepLayouts) {
  const auto shapes = scalelab::d12_gemm_shapes();
  ASSERT_EQ(shapes.size(), 5u);
  // fc forward: (1024, 768) @ (3072, 768)^T; the backward layouts are NN and TN.
  EXPECT_EQ(shapes[1].name, "fc_forward");
  EXPECT_EQ(int64_t{shapes[1].M} * shapes[1].N * shapes[1].K, int64_t{1024} * 3072 * 768);
  EXPECT_TRUE(shapes[1].trans_b);
  EXPECT_FALSE(shapes[3].trans_a || shapes[3].trans_b);
  EXPECT_TRUE(shapes[4].trans_a);
}

TEST(Calibration, CacheIsWrittenThenReusedOnTheSameCpuAndThreads) {
  const std::string dir = temp_dir("cache");
  const scalelab::Calibration first = scalelab::load_or_calibrate(1, dir, kTinyBudgetS);
  const std::string path = scalelab::calibration_cache_path(dir, 1);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(path, (fs::path(dir) / "cpu_1t.json").string());

  const scalelab::Calibration second = scalelab::load_or_calibrate(1, dir, kTinyBudgetS);
  EXPECT_EQ(second.id, first.id);
  EXPECT_EQ(second.flops_per_s, first.flops_per_s) << "a matching cache must be read, not re-measured";
  EXPECT_EQ(second.shapes.size(), first.shapes.size());
  EXPECT_EQ(second.to_json(), first.to_json());

  // A cache from another CPU model is not used: it is measured again and overwritten.
  nlohmann::json other = first.to_json();
  other["cpu_model"] = "Some Other CPU";
  other["flops_per_s"] = 1.0;
  std::ofstream(path) << other.dump();
  ::testing::internal::CaptureStderr();
  const scalelab::Calibration third = scalelab::load_or_calibrate(1, dir, kTinyBudgetS);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(third.cpu_model, first.cpu_model);
  EXPECT_GT(third.flops_per_s, 1.0);
  EXPECT_NE(err.find("Some Other CPU"), std::string::npos) << err;

  // A damaged cache file is ignored with a warning.
  std::ofstream(path) << "{\"id\": ";
  ::testing::internal::CaptureStderr();
  EXPECT_GT(scalelab::load_or_calibrate(1, dir, kTinyBudgetS).flops_per_s, 0.0);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("ignoring calibration file"), std::string::npos);
  fs::remove_all(dir);
}

// Regression: a cache measured while other processes used the cores (99 instead of 247 GFLOP/s)
// made every later run report MFU above 100 %. A cache far below a quick check is measured again.
TEST(Calibration, CacheMeasuredOnABusyMachineIsMeasuredAgain) {
  const std::string dir = temp_dir("stale");
  const scalelab::Calibration first = scalelab::load_or_calibrate(1, dir, kTinyBudgetS);
  nlohmann::json stale = first.to_json();
  stale["flops_per_s"] = first.flops_per_s / 100.0;  // as if measured while the machine was 100x busier
  std::ofstream(scalelab::calibration_cache_path(dir, 1)) << stale.dump();
  ::testing::internal::CaptureStderr();
  const scalelab::Calibration again = scalelab::load_or_calibrate(1, dir, kTinyBudgetS);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_GT(again.flops_per_s, first.flops_per_s / 10.0) << "the stale cache was used";
  EXPECT_NE(err.find("busy machine"), std::string::npos) << err;
  fs::remove_all(dir);
}

// The cache's quick check times one shape (calibrate_gemm's only_shape): every rank of every run pays for it.
TEST(Calibration, OneShapeAloneIsTimedAndAnUnknownOneIsRefused) {
  const scalelab::Calibration c =
      scalelab::calibrate_gemm(/*threads=*/1, kTinyBudgetS, scalelab::GemmKind::Fp32, "fc_forward");
  ASSERT_EQ(c.shapes.size(), 1u);
  EXPECT_EQ(c.shapes[0].name, "fc_forward");
  EXPECT_EQ(c.flops_per_s, c.shapes[0].flops_per_s);
  EXPECT_GT(c.flops_per_s, 0.0);
  try {
    scalelab::calibrate_gemm(1, kTinyBudgetS, scalelab::GemmKind::Fp32, "no_such_shape");
    ADD_FAILURE() << "an unknown shape was accepted";
  } catch (const scalelab::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc_forward"), std::string::npos) << e.what();
  }
}

TEST(Calibration, JsonRoundTrip) {
  scalelab::Calibration c;
  c.id = "cpu-gemm-deadbeef-2t-20261129";
  c.cpu_model = "AMD EPYC";
  c.blas_build = "OpenBLAS (OpenMP)";
  c.threads = 2;
  c.flops_per_s = 180e9;
  c.median_flops_per_s = 170e9;
  c.source = "calibrated sgemm, d12 shapes, 2 threads, 2026-11-29";
  c.date = "2026-11-29";
  c.shapes = scalelab::d12_gemm_shapes();
  c.shapes[0].repeats = 3;
  c.shapes[0].median_ms = 12.5;
  c.shapes[0].flops_per_s = 180e9;
  const scalelab::Calibration back = scalelab::Calibration::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_THROW(scalelab::Calibration::from_json({{"id", "x"}}), scalelab::Error);
}

TEST(DatasheetPeak, H200AndH100SxmAre989DenseBf16) {
  const auto h200 = scalelab::datasheet_peak("NVIDIA H200");
  ASSERT_TRUE(h200.has_value());
  EXPECT_EQ(h200->bf16_flops_per_s, 989e12);
  EXPECT_NE(h200->source.find("datasheet"), std::string::npos);
  const auto h100 = scalelab::datasheet_peak("NVIDIA H100 80GB HBM3");  // what CUDA calls the SXM part
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(h100->device, "NVIDIA H100 SXM");
  EXPECT_EQ(h100->bf16_flops_per_s, 989e12);
  EXPECT_EQ(scalelab::datasheet_peak("NVIDIA A100-SXM4-80GB")->bf16_flops_per_s, 312e12);
  EXPECT_EQ(scalelab::datasheet_peak("nvidia h100 pcie")->bf16_flops_per_s, 756e12);
  EXPECT_EQ(scalelab::datasheet_peak("NVIDIA L4")->bf16_flops_per_s, 121e12);
}

TEST(DatasheetPeak, VariantsAndUnknownDevicesGetNoBorrowedNumber) {
  // Other parts with other peaks must not match a neighbour's entry: the caller calibrates instead.
  for (const char* name : {"NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA H100", "NVIDIA L40S", "AMD EPYC", "cpu", ""}) {
    EXPECT_FALSE(scalelab::datasheet_peak(name).has_value()) << name;
  }
  for (const auto& p : scalelab::datasheet_peaks()) {
    EXPECT_GT(p.bf16_flops_per_s, 0) << p.device;
    EXPECT_FALSE(p.source.empty()) << p.device;
  }
}

// memcpy_bytes_per_s (lab 00's memory figure, bench_lab01's AdamW comparison): a positive rate for any
// size and thread count, including sizes that do not split evenly; a size or thread count below 1 refused.
TEST(MemcpyBandwidth, MeasuresAnySizeAndRefusesNonsense) {
  for (int threads : {1, 2}) {
    for (int64_t bytes : {int64_t{1}, int64_t{4097}, int64_t{1} << 20}) {
      const double rate = scalelab::memcpy_bytes_per_s(bytes, threads);
      EXPECT_TRUE(std::isfinite(rate) && rate > 0) << bytes << " bytes, " << threads << " threads: " << rate;
    }
  }
  EXPECT_THROW(scalelab::memcpy_bytes_per_s(0, 1), scalelab::Error);
  EXPECT_THROW(scalelab::memcpy_bytes_per_s(1024, 0), scalelab::Error);
}
