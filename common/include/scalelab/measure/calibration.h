// calibration.h — the peak FLOP/s that MFU divides by (docs/design.md "MFU").
//   GPUs we know: the vendor's dense datasheet figure (datasheet_peak).
//   CPUs and unknown devices: a measurement, sgemm at GPT-2 d12 training shapes, for the same thread
//   count the run uses (calibrate_gemm / load_or_calibrate). Never another device's number.
//   device_peak: the one call a driver or benchmark makes, picking between the two.
// Program: tools/calibrate.cpp (bin/sl_calibrate). Tests: tests/common/measure/test_calibration.cpp
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (the cache file)

#include "scalelab/core/allocator.h"  // defines: Device
#include "scalelab/core/precision.h"  // defines: PrecisionPolicy

namespace scalelab {

// One timed GEMM shape: C(M, N) = op(A) @ op(B), row-major, 2*M*N*K FLOPs.
struct GemmShapeResult {
  std::string name;  // "fc_forward", "fc_backward_dinp", ...
  int M = 0, N = 0, K = 0;
  bool trans_a = false;    // A stored (K, M) and transposed
  bool trans_b = false;    // B stored (N, K) and transposed
  int repeats = 0;         // timed calls (after one untimed warm-up call)
  double median_ms = 0;    // median wall time of one call (for reading the spread)
  double flops_per_s = 0;  // 2*M*N*K / time of the FASTEST call: other processes only ever slow a GEMM
};

struct Calibration {
  std::string id;                 // "cpu-gemm-<8 hex of cpu model>-<threads>t-<yyyymmdd>"
  std::string cpu_model;          // /proc/cpuinfo "model name"; the cache is valid only on the same model
  std::string blas_build;         // e.g. "OpenBLAS (OpenMP)"
  int threads = 0;                // BLAS/OpenMP threads during the measurement
  double flops_per_s = 0;         // the peak for MFU: the best shape's rate (see calibration.cpp for why)
  double median_flops_per_s = 0;  // median over shapes of the per-shape rates
  std::string source;             // "calibrated sgemm, d12 shapes, 2 threads, 2026-11-29" (goes in the run log)
  std::string date;               // "2026-11-29" (UTC)
  std::vector<GemmShapeResult> shapes;

  nlohmann::json to_json() const;
  static Calibration from_json(const nlohmann::json& j);  // throws scalelab::Error on missing keys
};

// The GEMMs of one GPT-2 d12 training step at B*T = 1024 tokens (C = 768): forward qkv, fc and
// fc-projection, and the two backward layouts of the fc layer (dinp = dout @ W, dW = dout^T @ inp).
std::vector<GemmShapeResult> d12_gemm_shapes();

// What a calibration times: fp32 sgemm (OpenBLAS; the peak of fp32 and bf16-mixed runs, which compute in
// fp32), or the CPU's bf16 matmul (cpu::matmul_forward_bf16: oneDNN's bf16 GEMM where built and supported,
// else fp32 sgemm on bf16-rounded operands; the peak of bf16-compute runs), at the forward ("NT") shapes of
// d12_gemm_shapes(), the layout that op computes.
enum class GemmKind { Fp32, Bf16 };

// Measures cblas_sgemm at d12_gemm_shapes() with `threads` threads (set through set_num_threads; the
// previous count is restored). Per shape: one warm-up call, then timed calls until its share of
// seconds_budget is spent (at least one, at most 50); the shape's rate is its fastest call. A tiny
// budget still times every shape once (~0.5 s on one core).
// kind = Bf16: the bf16 matmul instead, at the forward shapes only.
// only_shape: that shape of d12_gemm_shapes() alone (the cache's quick check), else all; throws, naming
// them, for a name that is none of them.
Calibration calibrate_gemm(int threads, double seconds_budget, GemmKind kind = GemmKind::Fp32,
                           const std::string& only_shape = "");

// Reads <cache_dir>/cpu_<threads>t.json when it was measured on this CPU model with this thread
// count and a quick check (one call of the cache's fastest shape, after its warm-up) is not 1.5x faster
// than the cached peak (a cache measured on a busy machine would make every MFU too high); otherwise measures (calibrate_gemm) and writes that
// file (tmp file + rename, so concurrent readers never see half a file). Measure with nothing else
// running: several ranks calibrating at once measure each other. Run bin/sl_calibrate once before
// multi-rank runs.
Calibration load_or_calibrate(int threads, const std::string& cache_dir = "runs/calibration",
                              double seconds_budget = 3.0, GemmKind kind = GemmKind::Fp32);
// <dir>/cpu_<threads>t.json (Fp32) or <dir>/cpu_bf16_<threads>t.json (Bf16)
std::string calibration_cache_path(const std::string& cache_dir, int threads, GemmKind kind = GemmKind::Fp32);

// ---------------------------------------------------------------------------------------------
// Datasheet peaks of known accelerators, dense (vendors headline the 2:4-sparse figure, 2x these).
struct PeakEntry {
  std::string device;           // canonical name, e.g. "NVIDIA H200 SXM"
  double bf16_flops_per_s = 0;  // dense bf16 tensor core, fp32 accumulate
  double tf32_flops_per_s = 0;  // dense tf32 tensor core; 0 = not in our table
  double fp32_flops_per_s = 0;  // plain fp32 (no tensor cores); 0 = not in our table
  std::string source;           // where the numbers come from
};

// The table entry whose name patterns match `device_name` (case-insensitive), e.g. the CUDA name
// "NVIDIA H100 80GB HBM3" -> H100 SXM. Variants with a different peak (H100 NVL, H200 NVL) do not
// match the SXM entries: nullopt, and the caller must calibrate instead of borrowing a number.
std::optional<PeakEntry> datasheet_peak(const std::string& device_name);
const std::vector<PeakEntry>& datasheet_peaks();  // the whole table, for printing

// ---------------------------------------------------------------------------------------------
// The denominator of MFU for one run, as every driver and benchmark computes it:
//   CPU   the calibration for the same thread count (load_or_calibrate(threads, ...)) of the GEMM the run's
//         matmuls use: the bf16 matmul for bf16-compute, sgemm otherwise (bf16-mixed computes in fp32);
//   CUDA  the current device's datasheet figure at the run's matmul precision: dense bf16 for
//         bf16-compute, plain fp32 otherwise (bf16-mixed's matmuls are fp32 GEMMs on fp32 copies). A GPU missing from the table gets no borrowed number:
//         flops_per_s = 0, the source says why, and the caller reports MFU as not measured.
//   SIM   the active simulated GPU's (core/sim_gpu.h) figure at the same precision; its source names the
//         simulated GPU and says "virtual time". Throws when no simulated GPU is active.
// Used by labs/01_single_device/main.cpp and bench/bench_lab01.cpp.
struct Peak {
  double flops_per_s = 0;      // per device, FLOP/s; 0 = unknown (MFU not reported)
  std::string source;          // goes into every log record, e.g. "datasheet: NVIDIA H200 SXM dense bf16; ..."
  std::string calibration_id;  // the CPU calibration's id; "" for datasheet peaks
};
Peak device_peak(Device device, const PrecisionPolicy& policy, int threads);

// Bytes copied per second by memcpy of `nbytes` (>= 1) with `threads` threads (each copies one slice), the
// best of 5 repeats: the memory bandwidth a streaming loop can expect (lab 00 prints it; bench_lab01
// --breakdown sets AdamW's beside it). Counted once per byte: STREAM's "copy" counts the read and the
// write (2x this). Allocates 2 * nbytes for the call.
double memcpy_bytes_per_s(int64_t nbytes, int threads);

}  // namespace scalelab
