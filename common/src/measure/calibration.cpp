// calibration.cpp — measured CPU GEMM peak and the datasheet table of GPU peaks (calibration.h).
// Program: tools/calibrate.cpp. Tests: tests/common/measure/test_calibration.cpp
//
// Why the best shape and not the median is the peak: a datasheet peak is the fastest the hardware
// goes on GEMMs that suit it, and MFU divides by it. The calibrated number plays the same role on a
// CPU, so we take the fastest of the step's GEMM shapes; the median over shapes is recorded beside it.
// On the 2-core AMD EPYC development machines the five shapes land within ~5 % of each other on one
// thread, so the choice moves MFU little (bin/sl_calibrate prints the per-shape table).
#include "scalelab/measure/calibration.h"

#include <cblas.h>   // defines: cblas_sgemm (OpenBLAS, OpenMP build)
#include <omp.h>     // defines: omp_get_thread_num (memcpy_bytes_per_s)
#include <unistd.h>  // defines: getpid

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "scalelab/core/bf16.h"        // defines: bf16, float_to_bf16
#include "scalelab/core/device.h"      // defines: cuda_device_name
#include "scalelab/core/error.h"       // defines: SL_CHECK, SL_FAIL
#include "scalelab/core/sim_gpu.h"     // defines: sim_gpu (the simulated GPU's peak)
#include "scalelab/measure/metrics.h"  // defines: system_info (CPU model)
#include "scalelab/measure/stats.h"    // defines: median
#include "scalelab/ops/ops.h"          // defines: cpu::matmul_forward_bf16, cpu::bf16_matmul_backend, cpu::blas_kernel
#include "scalelab/core/threads.h"     // defines: set_num_threads, num_threads

#ifndef SL_BLAS_BUILD
#define SL_BLAS_BUILD "unknown"
#endif

namespace scalelab {

namespace {

constexpr int kMaxRepeatsPerShape = 50;

// What the cached rate belongs to: the matmul library and, for sgemm, the kernel set OpenBLAS runs (first word
// of cpu::blas_kernel(), e.g. "SkylakeX"): the same library ran sgemm 4x slower on a
// generic set (blas_kernel.cpp).
std::string gemm_build(GemmKind kind) {
  if (kind == GemmKind::Bf16) return cpu::bf16_matmul_backend();
  const std::string kernel = cpu::blas_kernel();
  return std::string(SL_BLAS_BUILD) + ", " + kernel.substr(0, kernel.find(' ')) + " kernels";
}

// 32-bit FNV-1a, only to make a short stable tag of the CPU model for the calibration id.
uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

std::string utc_date(const char* fmt) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), fmt, &tm);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::vector<GemmShapeResult> d12_gemm_shapes() {
  // GPT-2 d12: C = 768, 4C = 3072, 3C = 2304; one micro-batch of B*T = 1024 tokens.
  // Linear layers compute out(BT, OC) = inp(BT, C) @ W(OC, C)^T, so the forward GEMM is "NT".
  constexpr int BT = 1024, C = 768;
  auto shape = [](const char* name, int M, int N, int K, bool ta, bool tb) {
    GemmShapeResult s;
    s.name = name;
    s.M = M;
    s.N = N;
    s.K = K;
    s.trans_a = ta;
    s.trans_b = tb;
    return s;
  };
  return {
      shape("qkv_forward", BT, 3 * C, C, false, true),          // (BT, C) @ (3C, C)^T
      shape("fc_forward", BT, 4 * C, C, false, true),           // (BT, C) @ (4C, C)^T
      shape("fcproj_forward", BT, C, 4 * C, false, true),       // (BT, 4C) @ (C, 4C)^T
      shape("fc_backward_dinp", BT, C, 4 * C, false, false),    // dinp (BT, C) = dout (BT, 4C) @ W (4C, C)
      shape("fc_backward_dweight", 4 * C, C, BT, true, false),  // dW (4C, C) = dout^T (4C, BT) @ inp (BT, C)
  };
}

Calibration calibrate_gemm(int threads, double seconds_budget, GemmKind kind, const std::string& only_shape) {
  SL_CHECK(threads >= 1, "threads=%d must be >= 1", threads);
  SL_CHECK(seconds_budget >= 0, "seconds_budget=%g must be >= 0", seconds_budget);

  std::vector<GemmShapeResult> shapes = d12_gemm_shapes();
  if (kind == GemmKind::Bf16)  // cpu::matmul_forward_bf16 computes the forward layout only: out = inp @ W^T
    shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [](const auto& s) { return s.trans_a || !s.trans_b; }),
                 shapes.end());
  if (!only_shape.empty()) {
    std::string names;
    for (const auto& s : shapes) names += (names.empty() ? "" : ", ") + s.name;
    shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [&](const auto& s) { return s.name != only_shape; }),
                 shapes.end());
    SL_CHECK_HINT(!shapes.empty(), ("one of: " + names).c_str(), "no GEMM shape '%s' to calibrate", only_shape.c_str());
  }
  const int previous_threads = num_threads();
  set_num_threads(threads);
  size_t max_a = 0, max_b = 0, max_c = 0;  // elements
  for (const auto& s : shapes) {
    max_a = std::max(max_a, static_cast<size_t>(s.M) * s.K);
    max_b = std::max(max_b, static_cast<size_t>(s.K) * s.N);
    max_c = std::max(max_c, static_cast<size_t>(s.M) * s.N);
  }
  // Values in [-0.5, 0.5): no denormals, no overflow (denormals would make the timing meaningless).
  std::vector<float> A(max_a), B(max_b), Cout(max_c, 0.0f);
  uint32_t state = 12345u;
  auto next = [&state]() {
    state = state * 1664525u + 1013904223u;  // LCG, Numerical Recipes
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  for (float& x : A) x = next();
  for (float& x : B) x = next();
  std::vector<bf16> A16(kind == GemmKind::Bf16 ? max_a : 0), B16(kind == GemmKind::Bf16 ? max_b : 0);
  for (size_t i = 0; i < A16.size(); ++i) A16[i] = float_to_bf16(A[i]);
  for (size_t i = 0; i < B16.size(); ++i) B16[i] = float_to_bf16(B[i]);

  const double budget_per_shape_s = seconds_budget / static_cast<double>(shapes.size());
  for (auto& s : shapes) {
    const int lda = s.trans_a ? s.M : s.K;  // row-major: leading dimension = stored row length
    const int ldb = s.trans_b ? s.K : s.N;
    auto call = [&]() {
      if (kind == GemmKind::Bf16) {  // out (M, N) = inp (M, K) @ weight (N, K)^T, bf16 operands, fp32 out
        cpu::matmul_forward_bf16(Cout.data(), A16.data(), B16.data(), nullptr, s.M, s.K, s.N);
        return;
      }
      cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans, s.M, s.N,
                  s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, Cout.data(), s.N);
    };
    call();  // warm-up: BLAS threads start, pages fault in, caches fill. Not timed.
    std::vector<double> times_ms;
    double spent_s = 0;
    while (times_ms.empty() ||
           (spent_s < budget_per_shape_s && static_cast<int>(times_ms.size()) < kMaxRepeatsPerShape)) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      times_ms.push_back(ms);
      spent_s += ms / 1000.0;
    }
    s.repeats = static_cast<int>(times_ms.size());
    s.median_ms = median(times_ms);
    // The rate of the FASTEST repeat: other processes on the machine can only slow a GEMM down, so
    // the minimum time is the best estimate of what the hardware does (the median is kept beside it).
    const double best_ms = *std::min_element(times_ms.begin(), times_ms.end());
    const double flops = 2.0 * s.M * s.N * s.K;  // one multiply and one add per (m, n, k)
    s.flops_per_s = flops / (best_ms / 1000.0);
  }
  set_num_threads(previous_threads);

  Calibration c;
  c.cpu_model = system_info().cpu_model;
  c.blas_build = gemm_build(kind);
  c.threads = threads;
  c.shapes = shapes;
  std::vector<double> rates;
  for (const auto& s : shapes) rates.push_back(s.flops_per_s);
  c.flops_per_s = *std::max_element(rates.begin(), rates.end());
  c.median_flops_per_s = median(rates);
  c.date = utc_date("%Y-%m-%d");
  char id[96];
  std::snprintf(id, sizeof(id), "cpu-%s-%08x-%dt-%s", kind == GemmKind::Bf16 ? "bf16gemm" : "gemm",
                fnv1a32(c.cpu_model), threads, utc_date("%Y%m%d").c_str());
  c.id = id;
  c.source = std::string(kind == GemmKind::Bf16 ? "calibrated bf16 matmul (" + c.blas_build + "), d12 forward shapes, "
                                                : "calibrated sgemm, d12 shapes, ") +
             std::to_string(threads) + (threads == 1 ? " thread, " : " threads, ") + c.date;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Cache file

nlohmann::json Calibration::to_json() const {
  nlohmann::json j;
  j["id"] = id;
  j["cpu_model"] = cpu_model;
  j["blas_build"] = blas_build;
  j["threads"] = threads;
  j["flops_per_s"] = flops_per_s;
  j["median_flops_per_s"] = median_flops_per_s;
  j["source"] = source;
  j["date"] = date;
  j["shapes"] = nlohmann::json::array();
  for (const auto& s : shapes) {
    j["shapes"].push_back({{"name", s.name},
                           {"M", s.M},
                           {"N", s.N},
                           {"K", s.K},
                           {"trans_a", s.trans_a},
                           {"trans_b", s.trans_b},
                           {"repeats", s.repeats},
                           {"median_ms", s.median_ms},
                           {"flops_per_s", s.flops_per_s}});
  }
  return j;
}

Calibration Calibration::from_json(const nlohmann::json& j) {
  try {
    Calibration c;
    c.id = j.at("id").get<std::string>();
    c.cpu_model = j.at("cpu_model").get<std::string>();
    c.blas_build = j.at("blas_build").get<std::string>();
    c.threads = j.at("threads").get<int>();
    c.flops_per_s = j.at("flops_per_s").get<double>();
    c.median_flops_per_s = j.at("median_flops_per_s").get<double>();
    c.source = j.at("source").get<std::string>();
    c.date = j.at("date").get<std::string>();
    for (const auto& js : j.at("shapes")) {
      GemmShapeResult s;
      s.name = js.at("name").get<std::string>();
      s.M = js.at("M").get<int>();
      s.N = js.at("N").get<int>();
      s.K = js.at("K").get<int>();
      s.trans_a = js.at("trans_a").get<bool>();
      s.trans_b = js.at("trans_b").get<bool>();
      s.repeats = js.at("repeats").get<int>();
      s.median_ms = js.at("median_ms").get<double>();
      s.flops_per_s = js.at("flops_per_s").get<double>();
      c.shapes.push_back(s);
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    SL_FAIL("delete the calibration file; the next run measures again", "calibration JSON is incomplete: %s", e.what());
  }
}

std::string calibration_cache_path(const std::string& cache_dir, int threads, GemmKind kind) {
  const std::string stem = kind == GemmKind::Bf16 ? "cpu_bf16_" : "cpu_";
  return (std::filesystem::path(cache_dir) / (stem + std::to_string(threads) + "t.json")).string();
}

// A quick check this much faster than the cached peak means the cache was measured under load.
constexpr double kStaleCacheFactor = 1.5;  // well above run-to-run noise (a busy machine gave 2.5x)

namespace {

// What this process already checked: a cache file that passed its quick check (or was just written), by
// its path, modification time and size. A driver asks twice (every rank's peak, then the run record's);
// within one process the machine is the same, so the second ask reads the answer instead of spending
// another quick check (one GEMM and its warm-up). A file rewritten since is checked again.
struct Checked {
  std::filesystem::file_time_type mtime;
  std::uintmax_t size = 0;
  Calibration calibration;
};
std::mutex checked_mutex;
std::map<std::string, Checked> checked_files;

const Calibration* already_checked(const std::string& path) {
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return nullptr;
  std::lock_guard<std::mutex> lock(checked_mutex);
  const auto it = checked_files.find(path);
  return it != checked_files.end() && it->second.mtime == mtime && it->second.size == size ? &it->second.calibration
                                                                                           : nullptr;
}

void remember_checked(const std::string& path, const Calibration& c) {
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return;
  std::lock_guard<std::mutex> lock(checked_mutex);
  checked_files[path] = {mtime, size, c};
}

}  // namespace

Calibration load_or_calibrate(int threads, const std::string& cache_dir, double seconds_budget, GemmKind kind) {
  namespace fs = std::filesystem;
  const std::string path = calibration_cache_path(cache_dir, threads, kind);
  if (const Calibration* known = already_checked(path)) return *known;
  const std::string build = gemm_build(kind);
  const std::string cpu_model = system_info().cpu_model;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    try {
      std::ifstream in(path);
      const Calibration c = Calibration::from_json(nlohmann::json::parse(in));
      if (c.cpu_model == cpu_model && c.threads == threads && c.blas_build == build && c.flops_per_s > 0) {
        // A cache measured while the machine was busy is too low and would make every MFU too high.
        // One quick call of the shape that set the cached peak catches it: if the hardware is now clearly
        // faster than that peak, measure again. (One shape, not all five: every rank of every run pays
        // for this check, 2-5 s a run on a slow 2-core machine when it timed them all.)
        std::string best;  // the fastest shape of the cache ("": none recorded, then all of them)
        double best_rate = 0;
        for (const auto& s : c.shapes)
          if (s.flops_per_s > best_rate) best = s.name, best_rate = s.flops_per_s;
        const Calibration quick = calibrate_gemm(threads, /*seconds_budget=*/0.0, kind, best);
        if (quick.flops_per_s <= kStaleCacheFactor * c.flops_per_s) {
          remember_checked(path, c);
          return c;
        }
        std::fprintf(stderr,
                     "[scalelab] calibration %s (%.1f GFLOP/s) is below a quick check (%.1f GFLOP/s): it was "
                     "probably measured on a busy machine; measuring again\n",
                     path.c_str(), c.flops_per_s / 1e9, quick.flops_per_s / 1e9);
      } else {
        std::fprintf(stderr,
                     "[scalelab] calibration %s is for '%s', %d threads, %s; measuring again for this machine\n",
                     path.c_str(), c.cpu_model.c_str(), c.threads, c.blas_build.c_str());
      }
    } catch (const std::exception& e) {  // unreadable or incomplete: measure again
      std::fprintf(stderr, "[scalelab] warning: ignoring calibration file %s: %s\n", path.c_str(), e.what());
    }
  }
  const Calibration c = calibrate_gemm(threads, seconds_budget, kind);
  // Write "<path>.tmp.<pid>" then rename: a reader in another process never sees a half-written file.
  fs::create_directories(cache_dir, ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << c.to_json().dump(2) << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    std::fprintf(stderr, "[scalelab] warning: could not write calibration cache %s (measured value still used)\n",
                 path.c_str());
  } else {
    remember_checked(path, c);
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// Datasheet peaks. Dense figures: NVIDIA/AMD datasheets print the 2:4-sparse tensor numbers with an
// asterisk; these are half of those. bf16 column as in the kit's REFERENCES (vendor datasheets via the
// torchtitan and nanochat peak tables); tf32/fp32 from the same vendor datasheets.

namespace {

struct PeakPattern {
  PeakEntry entry;
  std::vector<std::string> all_of;   // every one of these substrings (lowercase) must appear
  std::vector<std::string> any_of;   // and one of these, if the list is not empty
  std::vector<std::string> none_of;  // and none of these (variants with other peaks)
};

const std::vector<PeakPattern>& peak_patterns() {
  constexpr double T = 1e12;  // FLOP/s per TFLOP/s
  static const std::vector<PeakPattern> table = {
      // CUDA names the SXM part "NVIDIA H100 80GB HBM3"; the PCIe and NVL parts have lower peaks.
      {{"NVIDIA H100 SXM", 989 * T, 494.5 * T, 67 * T, "NVIDIA H100 Tensor Core GPU datasheet, SXM5, dense"},
       {"h100"},
       {"sxm", "hbm3"},
       {"pcie", "nvl"}},
      {{"NVIDIA H100 PCIe", 756 * T, 378 * T, 51 * T, "NVIDIA H100 Tensor Core GPU datasheet, PCIe, dense"},
       {"h100", "pcie"},
       {},
       {}},
      {{"NVIDIA H200 SXM", 989 * T, 494.5 * T, 67 * T, "NVIDIA H200 Tensor Core GPU datasheet, SXM, dense"},
       {"h200"},
       {},
       {"nvl"}},
      // A100 SXM and PCIe, 40 and 80 GB, share the tensor peak.
      {{"NVIDIA A100", 312 * T, 156 * T, 19.5 * T, "NVIDIA A100 Tensor Core GPU datasheet, dense"}, {"a100"}, {}, {}},
      {{"NVIDIA B200", 2250 * T, 0, 0, "NVIDIA HGX B200 datasheet (per GPU, dense bf16; tf32/fp32 not tabled here)"},
       {"b200"},
       {},
       {}},
      {{"AMD Instinct MI300X", 1307 * T, 653.7 * T, 163.4 * T, "AMD Instinct MI300X datasheet, dense (fp32: matrix)"},
       {"mi300x"},
       {},
       {}},
      {{"NVIDIA L4", 121 * T, 60 * T, 30.3 * T, "NVIDIA L4 datasheet, dense"}, {"l4"}, {}, {"l40"}},
      {{"NVIDIA GeForce RTX 4090", 165 * T, 82.6 * T, 82.6 * T,
        "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, fp32 accumulate, dense"},
       {"4090"},
       {},
       {"4090 d"}},
  };
  return table;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::optional<PeakEntry> datasheet_peak(const std::string& device_name) {
  const std::string name = lower(device_name);
  auto has = [&name](const std::string& sub) { return name.find(sub) != std::string::npos; };
  for (const auto& p : peak_patterns()) {
    if (!std::all_of(p.all_of.begin(), p.all_of.end(), has)) continue;
    if (!p.any_of.empty() && !std::any_of(p.any_of.begin(), p.any_of.end(), has)) continue;
    if (std::any_of(p.none_of.begin(), p.none_of.end(), has)) continue;
    return p.entry;
  }
  return std::nullopt;
}

const std::vector<PeakEntry>& datasheet_peaks() {
  static const std::vector<PeakEntry> entries = [] {
    std::vector<PeakEntry> v;
    for (const auto& p : peak_patterns()) v.push_back(p.entry);
    return v;
  }();
  return entries;
}

// ---------------------------------------------------------------------------------------------

Peak device_peak(Device device, const PrecisionPolicy& policy, int threads) {
  const bool bf16 = policy.matmul_dtype == DType::BF16;  // the GEMMs' operands; bf16-mixed's are fp32 copies
  if (device == Device::CPU) {
    const Calibration c = load_or_calibrate(threads, "runs/calibration", 3.0, bf16 ? GemmKind::Bf16 : GemmKind::Fp32);
    return {c.flops_per_s, c.source, c.id};
  }
  if (device == Device::SIM) {  // the active simulated GPU's datasheet figure: MFU in that GPU's terms
    const GpuModel& gpu = sim_gpu();
    return {gpu.peak_flops_per_s(bf16 ? DType::BF16 : DType::F32),
            "datasheet: " + gpu.display_name + (bf16 ? " dense bf16" : " fp32") + ", virtual time", ""};
  }
  const std::string name = cuda_device_name();
  const auto entry = datasheet_peak(name);
  const double flops = !entry ? 0.0 : bf16 ? entry->bf16_flops_per_s : entry->fp32_flops_per_s;
  if (flops <= 0) return {0.0, "no datasheet peak for '" + name + "': MFU not reported", ""};
  return {flops, "datasheet: " + entry->device + (bf16 ? " dense bf16; " : " fp32; ") + entry->source, ""};
}

double memcpy_bytes_per_s(int64_t nbytes, int threads) {
  SL_CHECK(nbytes >= 1 && threads >= 1, "memcpy_bytes_per_s: nbytes %lld and threads %d must be >= 1",
           static_cast<long long>(nbytes), threads);
  // Both buffers written once before timing, so no page fault falls inside a timed copy.
  std::vector<unsigned char> src(static_cast<size_t>(nbytes), 1), dst(static_cast<size_t>(nbytes), 0);
  double best_s = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t begin = nbytes * t / nt, end = nbytes * (t + 1) / nt;
      std::memcpy(dst.data() + begin, src.data() + begin, static_cast<size_t>(end - begin));
    }
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  SL_CHECK(dst[static_cast<size_t>(nbytes) - 1] == 1, "memcpy did not copy");  // nor was it optimised away
  return static_cast<double>(nbytes) / best_s;
}

}  // namespace scalelab
