// main.cpp — lab 00: the probe you run first. It measures the numbers every later lab is relative to:
//   1. the device (CPU model, cores, threads per rank; GPUs the driver lists)
//   2. GEMM FLOP/s: the calibration that CPU MFU divides by, for 1 thread, for this run's threads per
//      rank and for all cores; written to runs/calibration/cpu_<threads>t.json, where the labs read it
//   3. memory copy bandwidth (memcpy of a large buffer, 1 thread and all cores)
//   4. a sweep of all_reduce, all_gather, reduce_scatter and broadcast over the communicator the labs
//      use: time, algbw and busbw per size, as nccl-tests defines them; with 2 or more ranks also
//      sendrecv (point to point, as nccl-tests' sendrecv_perf: labs 06 and 07 live on it), whose
//      plain-MPI twin is bench/mpi_sendrecv_plain.cpp
// The learner writes nothing here (docs/design.md, lab table). Lesson: labs/00_setup/README.md.
// Test: tests/lab00/ (a tiny sweep at 1 and 2 ranks; check_probe.py recomputes algbw and busbw).
//
//   build/bin/lab00_setup                                          # 1 rank
//   mpirun -np 2 build/bin/lab00_setup                             # 2 ranks over MPI
//   mpirun -np 2 build/bin/lab00_setup --link ethernet100          # ... over a simulated 100 Gb/s link
//   mpirun -np 2 build/bin/lab00_setup --device sim --skip-gemm    # 2 simulated H100s: the sweep in virtual time
#include <CLI/CLI.hpp>        // defines: CLI::App (command-line options)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (probe.json, log records)

#include <algorithm>
#include <chrono>  // defines: std::chrono::steady_clock (the sweep's own duration, real time)
#include <cctype>  // defines: std::isdigit, std::toupper
#include <cmath>   // defines: std::floor
#include <cstdio>  // defines: std::printf, popen
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>  // defines: std::thread::hardware_concurrency
#include <vector>

#include "scalelab/measure/calibration.h"  // defines: load_or_calibrate, calibration_cache_path, datasheet_peak,
                                           // memcpy_bytes_per_s
#include "scalelab/comm/comm.h"            // defines: Communicator, make_communicator, LinkModel, bus_factor
#include "scalelab/comm/host_values.h"     // defines: broadcast_string, all_reduce_value (the probe's own values)
#include "scalelab/core/clock.h"           // defines: clock_is_virtual (--device sim: the sweep in virtual time)
#include "scalelab/core/device.h"      // defines: cuda_device_count, _name, cuda_unavailable_reason, built_with_cuda
#include "scalelab/core/sim_gpu.h"     // defines: sim_gpu (--device sim: the modelled GPU's figures)
#include "scalelab/core/error.h"       // defines: scalelab::Error, SL_CHECK_HINT
#include "scalelab/measure/metrics.h"  // defines: RunLogger, system_info, make_run_id
#include "scalelab/core/tensor.h"      // defines: Tensor
#include "scalelab/core/threads.h"     // defines: set_num_threads, local_ranks_from_env
#include "scalelab/driver/option_checks.h"  // defines: positive_int, ..., require_checked_options, check_ranks_agree

using namespace scalelab;
using Clock = std::chrono::steady_clock;

const std::string kCalibrationDir = "runs/calibration";  // where the labs look (load_or_calibrate's default)

struct Options {
  std::string device = "cpu";    // cpu, or sim: every rank a simulated GPU (docs/simulation.md)
  std::string sim_gpu = "h100";  // --device sim: the GPU modelled (core/sim_gpu.h)
  std::string backend = "auto";
  std::string min_bytes = "8";  // sweep sizes, bytes; K, M, G suffixes are powers of 1024
  std::string max_bytes = "256M";
  int factor = 2;                 // each size is the previous one times this
  int iters = 50;                 // timed calls per size, at most (see seconds_per_size)
  int warmup = 5;                 // untimed calls per size before them, at most (at least 2)
  double seconds_per_size = 0.2;  // big sizes get fewer calls, so each size takes about this long
  std::string link = "none";      // simulated link model (comm.h LinkModel::preset)
  int threads = 0;                // CPU threads per rank (0: cores / ranks per node)
  bool skip_gemm = false;
  bool recalibrate = false;           // delete the calibration caches first, so they are measured again
  std::string memcpy_bytes = "256M";  // the buffer the memcpy bandwidth is measured on
  std::string log_dir = "runs";
  std::string run_id;
};

static double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// Seconds since t0_ms on the kit's clock (Communicator::now_ms): the wall clock, or with --device sim the
// virtual one, where a collective lasts what the link model says.
static double clock_seconds_since(double t0_ms) { return (Communicator::now_ms() - t0_ms) / 1e3; }

// The largest size the options take: 1024G (2^40 bytes), far above any buffer of this probe, so that
// a typo's digits never overflow the shift below.
constexpr int64_t kMaxSizeBytes = int64_t{1} << 40;

// "" when `s` is a size: digits, then optionally K, M or G (powers of 1024, as in nccl-tests' -b/-e), from
// 1 byte to 1024G; else why not, in words (CLI11 puts the option's name in front: "--min-bytes: ...").
static std::string size_error(const std::string& s) {
  const std::string want = "a size from 1 byte to 1024G: digits, then K, M or G (powers of 1024), e.g. 8, 64K, 256M";
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  const char unit = digits < s.size() ? static_cast<char>(std::toupper(static_cast<unsigned char>(s[digits]))) : 'B';
  if (digits == 0 || digits + 1 < s.size() || (unit != 'B' && unit != 'K' && unit != 'M' && unit != 'G'))
    return "'" + s + "' is not " + want;
  const int shift = unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
  // 13 digits or more are above 1024G whatever the unit; fewer fit in an int64_t
  if (digits > 12 || std::stoll(s.substr(0, digits)) > (kMaxSizeBytes >> shift) || std::stoll(s.substr(0, digits)) < 1)
    return s + " is out of range: " + want;
  return "";
}

// A size option's check, run by CLI11 on the text given: app.add_option("--min-bytes", ...)->check(size_bytes()).
static CLI::Validator size_bytes() {
  return CLI::Validator([](std::string& s) { return size_error(s); }, "SIZE");
}

// "8", "64K", "256M", "1G" -> bytes; `s` is a size that size_error passes (the options are checked at start).
static int64_t parse_bytes(const std::string& s) {
  const std::string why = size_error(s);
  SL_CHECK_HINT(why.empty(), "give a size such as 8, 64K, 256M or 1G", "%s", why.c_str());
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  int64_t v = std::stoll(s.substr(0, digits));
  if (digits < s.size()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(s[digits])));
    v <<= unit == 'K' ? 10 : unit == 'M' ? 20 : 30;
  }
  return v;
}

// "8 B", "64 KiB", "256 MiB": for headers; the tables print exact bytes.
static std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), v == std::floor(v) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// ------------------------------------------------------------------------------------------------
// Small collectives the probe itself needs (not measured)

// The largest value of x over all ranks (a time: a collective is as slow as its slowest rank).
// Travels as f32: 7 significant digits are plenty for a time.
static double max_over_ranks(Communicator& comm, double x) {
  return all_reduce_value(comm, static_cast<float>(x), ReduceOp::Max, "probe: max time");
}

static int64_t sum_over_ranks(Communicator& comm, int64_t x) {
  return all_reduce_value(comm, static_cast<int32_t>(x), ReduceOp::Sum, "probe: count");
}

// Rank 0 measures the CPU (GEMM, memcpy) while the other ranks wait here. Not in a barrier: MPI spins
// inside one and would take a core away from rank 0's measurement. A blocking recv waits on a
// condition variable while the mpi backend's thread checks for the message every 50 us.
static void others_wait_for_rank0(Communicator& comm, Device dev) {
  if (comm.size() == 1) return;
  Tensor token = Tensor::zeros({1}, DType::I32, dev);
  if (comm.rank() == 0) {
    for (int r = 1; r < comm.size(); ++r) comm.send(token, r, "probe: rank 0 done");
  } else {
    comm.recv(token, 0, "probe: rank 0 done");
  }
}

// ------------------------------------------------------------------------------------------------
// The device

// GPU names as the NVIDIA driver lists them (/proc/driver/nvidia/gpus/*/information, "Model:" line),
// so the probe names a GPU even in a build without CUDA. Empty without the driver.
static std::vector<std::string> nvidia_gpu_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& dir : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::ifstream in(dir.path() / "information");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Model:", 0) == 0) {
        const size_t start = line.find_first_not_of(" \t", 6);
        names.push_back(start == std::string::npos ? "unknown" : line.substr(start));
      }
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// ------------------------------------------------------------------------------------------------
// GEMM FLOP/s: the calibration (calibration.h)

// The cache file for `threads` if it was measured on this CPU model, without measuring anything
// (load_or_calibrate measures when the file is missing or stale).
static std::optional<Calibration> read_calibration_cache(const std::string& path, int threads) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    Calibration c = Calibration::from_json(nlohmann::json::parse(in));
    if (c.cpu_model == system_info().cpu_model && c.threads == threads) return c;
  } catch (const std::exception&) {  // unreadable: as if missing
  }
  return std::nullopt;
}

// Rank 0 calibrates each thread count it has the cores for (free_cores) and writes the cache the labs
// read; a count it has not the cores for is shown from the cache, if there is one. Measured on the
// 2-core machine: the 2-thread calibration of a 2-rank run came out 192-202 GFLOP/s instead of
// 247-256, because the waiting rank's communication thread took its share of a core.
static nlohmann::ordered_json gemm_section(const Options& o, std::vector<int> counts, int free_cores, RunLogger& log) {
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  const int cores = system_info().cores;
  std::printf("== GEMM FLOP/s: OpenBLAS sgemm at GPT-2 d12 shapes, the peak CPU MFU divides by ==\n");
  std::printf("%7s %13s %15s  %-32s %s\n", "threads", "peak GFLOP/s", "median GFLOP/s", "calibration id",
              "cache (used by)");
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (int t : counts) {
    const std::string path = calibration_cache_path(kCalibrationDir, t);
    const int ranks_like_this = std::max(1, cores / t);  // ranks per node that run with t threads each
    char used_by[160];
    std::snprintf(used_by, sizeof(used_by), "%s (%d rank%s per node, %d thread%s each)", path.c_str(), ranks_like_this,
                  ranks_like_this == 1 ? "" : "s", t, t == 1 ? "" : "s");
    std::optional<Calibration> c;
    const bool measure_now = t <= free_cores;
    if (measure_now) {
      if (o.recalibrate) std::filesystem::remove(path);
      c = load_or_calibrate(t, kCalibrationDir);
    } else {
      c = read_calibration_cache(path, t);
    }
    if (!c) {
      std::printf(
          "%7d %13s %15s  %-32s %s\n%7s   not measured: the other ranks of this node share the cores; run "
          "build/bin/lab00_setup with one rank\n",
          t, "-", "-", "-", used_by, "");
      out.push_back({{"threads", t}, {"calibration_id", nullptr}, {"measured_now", false}, {"cache", path}});
      continue;
    }
    std::printf("%7d %13.1f %15.1f  %-32s %s%s\n", t, c->flops_per_s / 1e9, c->median_flops_per_s / 1e9, c->id.c_str(),
                used_by, measure_now ? "" : "  [from the cache: the other ranks share the cores]");
    std::fflush(stdout);
    out.push_back({{"threads", t},
                   {"calibration_id", c->id},
                   {"flops_per_s", c->flops_per_s},
                   {"median_flops_per_s", c->median_flops_per_s},
                   {"source", c->source},
                   {"measured_now", measure_now},
                   {"cache", path}});
    log.log("calibration", {{"threads", t},
                            {"calibration_id", c->id},
                            {"flops_per_s", c->flops_per_s},
                            {"median_flops_per_s", c->median_flops_per_s},
                            {"source", c->source},
                            {"measured_now", measure_now}});
  }
  std::printf(
      "peak = the fastest of the five shapes (calibration.cpp says why); rerun with --recalibrate if the "
      "machine was busy\n");
  // t threads should give nearly t times one thread's rate (a GEMM is compute-bound). Far less means
  // another program took cores while it was measured, or the "cores" are hyperthreads of fewer
  // physical cores (then a little over half of t times is normal).
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[0]["threads"] != 1 || out[0]["calibration_id"].is_null() || out[i]["calibration_id"].is_null()) continue;
    const int t = out[i]["threads"];
    const double scaling = out[i]["flops_per_s"].get<double>() / out[0]["flops_per_s"].get<double>();
    if (scaling < 0.5 * t) {
      std::printf(
          "NOTE    %d threads reach only %.2fx of 1 thread (expected close to %dx): the machine was probably "
          "busy;\n        run `build/bin/lab00_setup --recalibrate` when it is quiet\n",
          t, scaling, t);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// The collective sweep

// One row of the table: one collective at one size.
struct SweepRow {
  std::string op;
  int64_t size_bytes = 0;  // S of nccl-tests: the buffer (all_reduce, broadcast); the TOTAL of n chunks
                           // (all_gather's output, reduce_scatter's input)
  int64_t elements = 0;    // S / 4 (f32)
  int warmup = 0;          // untimed calls, the checked one included (at least 2)
  int iters = 0;           // timed calls
  double rank_time_s = 0;  // mean time of one call on this rank
  double time_s = 0;       // the same, of the slowest rank: the number reported
  double modeled_s = 0;    // the link model's time of one call (0 without --link)
  double algbw = 0;        // bytes/s: S / time_s
  double busbw = 0;        // bytes/s: algbw * bus_factor(op, n); 0 (n/a) for one rank
  int64_t wrong = 0;       // elements of the checked call that differ from the exact result, all ranks
};

// Exact small integers (docs/style.md 27): element i of rank r holds (r + 1) + i % 7, so any sum over up to
// thousands of ranks is exact in fp32, whatever order the transport adds in.
static float pattern(int r, int64_t i) { return static_cast<float>((r + 1) + i % 7); }

// One collective of the sweep, as nccl-tests describes each of its tests (its src/*.cu: the counts of the
// buffers, the data, the call, the exact result, the bus factor): one entry per collective, one loop over
// them (run), one function that times any of them (measure). Sizes: `elements` is S / 4, S of SweepRow;
// chunk = elements / n, one rank's share.
struct Collective {
  const char* op;       // the name: Communicator's call, bus_factor's and the link model's
  const char* heading;  // what the table's heading says after the name
  bool chunked;         // the buffers split into n equal chunks: elements must be a multiple of n
  bool sums_in_place;   // its result replaces its input with a sum: the timed calls run on zeros (measure)
  // The buffers: in (in_n elements, initial values), out (out_n; 0: the result lands in `in`).
  int64_t (*in_n)(int64_t elements, int64_t chunk);
  int64_t (*out_n)(int64_t elements, int64_t chunk);
  float (*initial)(int rank, int64_t i);
  void (*call)(Communicator& comm, Tensor& in, Tensor& out);
  // The exact value of result element i on rank r (n ranks; sum_r = n (n + 1) / 2, the sum of r + 1).
  float (*expected)(int r, int n, int64_t i, int64_t chunk);
  int64_t (*payload_elements)(int64_t elements, int64_t chunk);  // this rank's contribution (link model)
};

// The op whose bus factor and link-model time a row of `op` takes: a sendrecv sends S bytes to one peer
// while it receives S from another, as a send does (factor 1, one hop: nccl-tests' sendrecv_perf).
static std::string model_op(const std::string& op) { return op == "sendrecv" ? "send" : op; }

static const Collective kCollectives[] = {
    {"all_reduce", " (sum)", false, true, [](int64_t e, int64_t) { return e; },
     [](int64_t, int64_t) { return int64_t{0}; }, pattern,
     [](Communicator& c, Tensor& in, Tensor&) { c.all_reduce(in, ReduceOp::Sum, "probe"); },
     [](int, int n, int64_t i, int64_t) { return static_cast<float>(n * (n + 1) / 2) + n * (i % 7); },
     [](int64_t e, int64_t) { return e; }},
    {"all_gather", "", true, false, [](int64_t, int64_t chunk) { return chunk; }, [](int64_t e, int64_t) { return e; },
     pattern, [](Communicator& c, Tensor& in, Tensor& out) { c.all_gather(in, out, "probe"); },
     [](int, int, int64_t i, int64_t chunk) { return pattern(static_cast<int>(i / chunk), i % chunk); },
     [](int64_t, int64_t chunk) { return chunk; }},
    {"reduce_scatter", " (sum)", true, false, [](int64_t e, int64_t) { return e; },
     [](int64_t, int64_t chunk) { return chunk; }, pattern,
     [](Communicator& c, Tensor& in, Tensor& out) { c.reduce_scatter(in, out, ReduceOp::Sum, "probe"); },
     [](int r, int n, int64_t i, int64_t chunk) {  // rank r gets the sum of chunk r
       return static_cast<float>(n * (n + 1) / 2) + n * ((r * chunk + i) % 7);
     },
     [](int64_t e, int64_t) { return e; }},
    {"broadcast", " (root 0)", false, false, [](int64_t e, int64_t) { return e; },
     [](int64_t, int64_t) { return int64_t{0}; }, [](int r, int64_t i) { return r != 0 ? -1.0f : pattern(r, i); },
     [](Communicator& c, Tensor& in, Tensor&) { c.broadcast(in, /*root=*/0, "probe"); },
     [](int, int, int64_t i, int64_t) { return pattern(0, i); }, [](int64_t e, int64_t) { return e; }},
    // Point to point: every rank sends its buffer to rank + 1 and receives rank - 1's (mod n), both at
    // once (Communicator::sendrecv, like MPI_Sendrecv). With one rank there is no peer: no rows.
    {"sendrecv", " (to rank+1, from rank-1)", false, false, [](int64_t e, int64_t) { return e; },
     [](int64_t e, int64_t) { return e; }, pattern,
     [](Communicator& c, Tensor& in, Tensor& out) {
       const int n = c.size(), r = c.rank();
       c.sendrecv(in, (r + 1) % n, out, (r + n - 1) % n, "probe");
     },
     [](int r, int n, int64_t i, int64_t) { return pattern((r + n - 1) % n, i); },
     [](int64_t e, int64_t) { return e; }},
};

// Runs collective `c` on `elements` f32 elements (S = 4 * elements bytes, see SweepRow): one checked call,
// one more untimed call, then warm-up and timed calls, as many as fit o.seconds_per_size (at most o.warmup
// and o.iters).
static SweepRow measure(Communicator& comm, Device dev, const Collective& c, int64_t elements, const Options& o) {
  const int n = comm.size(), r = comm.rank();
  const int64_t chunk = elements / n;  // all_gather / reduce_scatter: one rank's share
  SweepRow row;
  row.op = c.op;
  row.elements = elements;
  row.size_bytes = elements * static_cast<int64_t>(dtype_size(DType::F32));

  // h_in / h_out on the host; d_in / d_out where the communicator wants them (the GPU under nccl).
  const int64_t in_n = c.in_n(elements, chunk), out_n = c.out_n(elements, chunk);
  Tensor h_in = Tensor::empty({in_n}, DType::F32), h_out = Tensor::empty({out_n}, DType::F32);
  for (int64_t i = 0; i < in_n; ++i) h_in.data<float>()[i] = c.initial(r, i);
  for (int64_t i = 0; i < out_n; ++i) h_out.data<float>()[i] = -1.0f;  // never a correct value
  Tensor d_in = dev == Device::CPU ? h_in : Tensor::empty({in_n}, DType::F32, dev);
  Tensor d_out = dev == Device::CPU ? h_out : Tensor::empty({out_n}, DType::F32, dev);
  if (dev != Device::CPU) {
    d_in.copy_from(h_in);
    d_out.copy_from(h_out);
  }
  auto call = [&] { c.call(comm, d_in, d_out); };

  // 1. The first call is checked against the exact result.
  comm.barrier();
  double t0 = Communicator::now_ms();
  call();
  const double first_s = clock_seconds_since(t0);
  if (dev != Device::CPU) {
    h_in.copy_from(d_in);
    h_out.copy_from(d_out);
  }
  const Tensor& result = out_n > 0 ? h_out : h_in;
  int64_t wrong = 0;
  for (int64_t i = 0; i < result.numel(); ++i) wrong += result.data<float>()[i] != c.expected(r, n, i, chunk);
  row.wrong = sum_over_ranks(comm, wrong);
  // An in-place sum grows n-fold per call and would overflow to inf after ~100 calls: time zeros
  // instead (MPI's and NCCL's sums run at the same speed whatever the values).
  if (c.sums_in_place) d_in.zero_();

  // 2. A second call sizes the budget with the first (the first alone pays the page faults of fresh
  // buffers; one slow call on a busy machine should not decide alone). Every rank derives the counts
  // from the same reduced estimate, so all ranks make the same number of calls.
  t0 = Communicator::now_ms();
  call();
  const double estimate_s = max_over_ranks(comm, std::min(first_s, clock_seconds_since(t0)));
  const int fit = static_cast<int>(std::min(1e6, std::floor(o.seconds_per_size / std::max(estimate_s, 1e-9))));
  row.warmup = 2 + std::max(0, std::min(o.warmup - 2, fit / 4));  // the two calls above count
  row.iters = std::max(1, std::min(o.iters, fit));

  // 3. More warm-up, then the timed calls.
  for (int w = 2; w < row.warmup; ++w) call();
  comm.barrier();  // all ranks start the timed calls together
  t0 = Communicator::now_ms();
  for (int it = 0; it < row.iters; ++it) call();
  row.rank_time_s = clock_seconds_since(t0) / row.iters;
  row.time_s = max_over_ranks(comm, row.rank_time_s);

  // 4. Bandwidths as nccl-tests defines them (its doc/PERFORMANCE.md; comm.h bus_factor).
  row.algbw = static_cast<double>(row.size_bytes) / row.time_s;
  row.busbw = row.algbw * bus_factor(model_op(c.op), n);
  const int64_t payload_bytes = c.payload_elements(elements, chunk) * static_cast<int64_t>(dtype_size(DType::F32));
  row.modeled_s = comm.link_model().seconds(model_op(c.op), payload_bytes, n);
  return row;
}

// The element counts of the sweep for collective `c`: min..max bytes in x`factor` steps, f32. A chunked
// collective needs a multiple of n elements (equal chunks): rounded down, at least n. A size that rounds to
// the previous one's count is skipped.
static std::vector<int64_t> sweep_elements(const Collective& c, int64_t min_bytes, int64_t max_bytes, int factor,
                                           int n) {
  std::vector<int64_t> counts;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    int64_t e = std::max<int64_t>(1, bytes / static_cast<int64_t>(dtype_size(DType::F32)));
    if (c.chunked) e = std::max<int64_t>(n, e / n * n);
    if (counts.empty() || counts.back() != e) counts.push_back(e);
  }
  return counts;
}

// One row for probe.json and the log (keys with units, docs/log_schema.md). The log adds this rank's
// own time (rank_time_ms); probe.json keeps the numbers all ranks agree on.
static nlohmann::ordered_json row_json(const SweepRow& x, int n) {
  const bool has_bus = n > 1;
  return {{"op", x.op},
          {"size_bytes", x.size_bytes},
          {"elements", x.elements},
          {"warmup", x.warmup},
          {"iters", x.iters},
          {"time_ms", x.time_s * 1e3},
          {"modeled_ms", x.modeled_s > 0 ? nlohmann::ordered_json(x.modeled_s * 1e3) : nlohmann::ordered_json(nullptr)},
          {"time_over_model",
           x.modeled_s > 0 ? nlohmann::ordered_json(x.time_s / x.modeled_s) : nlohmann::ordered_json(nullptr)},
          {"algbw_bytes_per_s", x.algbw},
          {"bus_factor", bus_factor(model_op(x.op), n)},
          {"busbw_bytes_per_s", has_bus ? nlohmann::ordered_json(x.busbw) : nlohmann::ordered_json(nullptr)},
          {"wrong", x.wrong}};
}

// ------------------------------------------------------------------------------------------------

static int run(const Options& o, Communicator& comm) {
  const int rank = comm.rank(), n = comm.size();
  const bool root = rank == 0;
  // where the sweep's buffers live: the nccl backend's GPU, the simulated GPU (--device sim: the sim backend's,
  // or one rank's on the local backend, which takes any tensor), else the host
  const Device dev = o.device == "sim" ? Device::SIM : comm.device();
  const int threads = set_num_threads(o.threads);
  const SystemInfo sys = system_info();
  const int ranks_per_node = local_ranks_from_env();
  const int64_t min_bytes = parse_bytes(o.min_bytes), max_bytes = parse_bytes(o.max_bytes);
  SL_CHECK_HINT(min_bytes >= 1 && min_bytes <= max_bytes, "give 1 <= --min-bytes <= --max-bytes",
                "--min-bytes %lld --max-bytes %lld", static_cast<long long>(min_bytes),
                static_cast<long long>(max_bytes));
  SL_CHECK_HINT(o.factor >= 2, "use --factor 2 (every power of two) or 4", "--factor %d", o.factor);
  SL_CHECK_HINT(o.iters >= 1, "use --iters >= 1", "--iters %d", o.iters);
  // --link none on the sim backend keeps its own links (docs/simulation.md); elsewhere none is no model
  if (!(comm.backend() == "sim" && o.link == "none")) comm.set_link_model(LinkModel::preset(o.link));
  const LinkModel& link = comm.link_model();
  const bool simulated = dev == Device::SIM;  // --device sim: the collectives' times are virtual

  const std::string run_id =
      broadcast_string(comm, root ? (o.run_id.empty() ? make_run_id() : o.run_id) : "", 0, "run id", 511);
  RunLogger log("lab00", run_id, rank, o.log_dir);
  const std::string out_dir = (std::filesystem::path(o.log_dir) / "lab00" / run_id).string();
  const std::vector<std::string> gpus = nvidia_gpu_names();
  const int cuda_devices = cuda_device_count();

  RunRecord run_rec;
  run_rec.config = {{"backend", comm.backend()},
                    {"min_bytes", min_bytes},
                    {"max_bytes", max_bytes},
                    {"factor", o.factor},
                    {"iters", o.iters},
                    {"warmup", o.warmup},
                    {"seconds_per_size", o.seconds_per_size},
                    {"link", link.name},
                    {"skip_gemm", o.skip_gemm},
                    {"memcpy_bytes", parse_bytes(o.memcpy_bytes)}};
  run_rec.world_size = n;
  run_rec.track = "reference";  // lab 00 has no learner code: all of it is the kit's
  run_rec.device = dev == Device::CUDA ? cuda_device_name() : simulated ? "sim" : "cpu";
  if (simulated)
    run_rec.extra = {{"sim_gpu", sim_gpu().name},
                     {"sim_gpu_name", sim_gpu().display_name},
                     {"simulated", true},
                     {"clock", "virtual"}};
  run_rec.threads = threads;
  run_rec.precision = "fp32";
  log.log_run(run_rec);

  nlohmann::ordered_json probe = {{"run_id", run_id},
                                  {"world_size", n},
                                  {"backend", comm.backend()},
                                  {"ranks_per_node", ranks_per_node},
                                  {"threads_per_rank", threads}};
  if (root) {
    std::printf("== lab 00: setup probe ==\nrun %s | logs %s/rank<k>.jsonl | summary %s/probe.json\n\n", run_id.c_str(),
                out_dir.c_str(), out_dir.c_str());
    std::printf("== device ==\n");
    std::printf("CPU      %s, %d logical cores\n", sys.cpu_model.c_str(), sys.cores);
    std::printf("ranks    %d (%d on this node), backend %s, %d thread%s per rank (OpenMP and OpenBLAS)\n", n,
                ranks_per_node, comm.backend().c_str(), threads, threads == 1 ? "" : "s");
    if (cuda_devices > 0) {
      std::printf("GPU      %s (CUDA device 0 of %d)\n", cuda_device_name().c_str(), cuda_devices);
    } else if (gpus.empty()) {
      std::printf("GPU      none listed by the NVIDIA driver\n");
    } else {
      for (size_t g = 0; g < gpus.size(); ++g) std::printf("GPU %zu    %s\n", g, gpus[g].c_str());
      std::printf("         but the CUDA backend cannot use it: %s\n", cuda_unavailable_reason().c_str());
    }
    if (simulated) {
      const GpuModel& g = sim_gpu();
      std::printf(
          "SIM      %s (--device sim): %.0f TFLOP/s dense bf16, %.1f fp32, HBM %.2f TB/s, %.0f GB; every "
          "time below is virtual\n",
          g.display_name.c_str(), g.bf16_flops_per_s / 1e12, g.fp32_flops_per_s / 1e12, g.hbm_bytes_per_s / 1e12,
          g.memory_bytes / 1e9);
    }
    std::printf("link     %s\n\n", link.enabled() ? ("SIMULATED " + link.name +
                                                     ": every collective lasts at least "
                                                     "the link model's time (docs/communicator.md)")
                                                        .c_str()
                                                  : "none: collective times are this machine's real transport");
    std::fflush(stdout);
  }
  probe["device"] = {{"cpu_model", sys.cpu_model},
                     {"cpu_cores", sys.cores},
                     {"gpus", gpus},
                     {"cuda_backend", built_with_cuda()},
                     {"cuda_devices", cuda_devices},
                     {"cuda_device_name", cuda_devices > 0 ? cuda_device_name() : ""}};

  // ------------------------------------------------------------------------------------------------
  // GEMM FLOP/s and memory copy: rank 0 alone, the others wait without taking a core. Each of them
  // still keeps a communication thread that checks for messages every 50 us (~15 % of a core here), so
  // rank 0 measures only thread counts that leave one core to each other rank of its node.
  const int free_cores = std::max(0, sys.cores - (ranks_per_node - 1));
  nlohmann::ordered_json gemm_json = nullptr, memcpy_json = nlohmann::ordered_json::array();
  if (root) {
    if (o.skip_gemm || simulated) {
      std::printf("== GEMM == skipped (%s)\n", simulated ? "this CPU's: run without --device sim" : "--skip-gemm");
    } else {
      gemm_json = gemm_section(o, {1, threads, sys.cores}, free_cores, log);
    }
    // GPU GEMM (fp32 and bf16 against the datasheet) is measured by the CUDA backend, not here.
    std::printf("GPU GEMM: not measured (CUDA backend)");
    for (const auto& g : gpus) {
      if (auto p = datasheet_peak(g))
        std::printf("; %s datasheet: %.0f TFLOP/s dense bf16", p->device.c_str(), p->bf16_flops_per_s / 1e12);
    }
    std::printf("\n\n");

    const int64_t copy_bytes = parse_bytes(o.memcpy_bytes);
    std::printf("== memory copy: memcpy of %s, best of 5 ==\n%7s %10s\n", human_bytes(copy_bytes).c_str(), "threads",
                "GB/s");
    std::vector<int> copy_threads = {1, sys.cores};
    if (simulated) copy_threads.clear();  // the host's memcpy says nothing about the simulated GPU's HBM
    if (simulated) std::printf("not measured: this CPU's, not the simulated GPU's (run without --device sim)\n");
    copy_threads.erase(std::unique(copy_threads.begin(), copy_threads.end()), copy_threads.end());
    for (int t : copy_threads) {
      if (t > free_cores) {
        std::printf("%7d %10s  not measured: the other ranks share the cores (run with one rank)\n", t, "-");
        continue;
      }
      const double bw = memcpy_bytes_per_s(copy_bytes, t);
      std::printf("%7d %10.2f\n", t, bw / 1e9);
      memcpy_json.push_back({{"threads", t}, {"size_bytes", copy_bytes}, {"bytes_per_s", bw}});
      log.log("memcpy", {{"threads", t}, {"size_bytes", copy_bytes}, {"bytes_per_s", bw}});
    }
    std::printf("(bytes copied per second, GB = 1e9 bytes; STREAM's \"copy\" counts read + write, 2x these)\n\n");
    std::fflush(stdout);
  }
  others_wait_for_rank0(comm, dev);
  probe["gemm"] = gemm_json;
  probe["gpu_gemm"] = "not measured (CUDA backend)";
  probe["memcpy"] = memcpy_json;

  // ------------------------------------------------------------------------------------------------
  // The collective sweep: every rank takes part, rank 0 prints.
  if (root) {
    std::printf("== collectives: %s backend, %d rank%s, f32, %s .. %s in x%d steps%s ==\n", comm.backend().c_str(), n,
                n == 1 ? "" : "s", human_bytes(min_bytes).c_str(), human_bytes(max_bytes).c_str(), o.factor,
                simulated ? (", " + sim_gpu().display_name + ", virtual time").c_str() : "");
    std::printf(
        "time    mean of `iters` calls after `warmup` calls, of the SLOWEST rank (nccl-tests -a 3; its\n"
        "        default averages the ranks); the first call of each size is checked (`wrong` = 0)\n"
        "algbw   S / time, S = bytes: the buffer (all_reduce, broadcast, sendrecv: each way), the total of\n"
        "        n chunks (all_gather, reduce_scatter), as in nccl-tests; GB/s = 1e9 bytes/s\n"
        "busbw   algbw x 2(n-1)/n all_reduce, x (n-1)/n all_gather and reduce_scatter, x 1 broadcast and\n"
        "        sendrecv (its time_us is the time of one message each way: the point-to-point latency)%s\n",
        n == 1 ? "\n        n/a here: with one rank nothing travels (the calls are local copies)" : "");
    if (comm.backend() == "mpi") {
      std::printf(
          "NOTE    over MPI, busbw is a ring-model normalisation, not measured wire traffic: OpenMPI picks\n"
          "        its own algorithm and, on one machine, copies through shared memory\n");
    }
    if (link.enabled()) {
      std::printf(
          "NOTE    SIMULATED link '%s': each call lasts at least base %.1f us + hops x %.1f us + bus bytes /\n"
          "        %.0f GB/s (model_us). x_model = time / model_us: about 1 where the model decided the time;\n"
          "        above 1 where the real transport was slower than the simulated link (a model only slows\n"
          "        calls down) or the communication thread woke late from its sleep\n",
          link.name.c_str(), link.base_s * 1e6, link.alpha_s * 1e6, link.bandwidth_bytes_per_s / 1e9);
    }
    std::fflush(stdout);
  }
  std::vector<SweepRow> rows;
  const auto t_sweep = Clock::now();
  for (const Collective& c : kCollectives) {
    if (n == 1 && std::strcmp(c.op, "sendrecv") == 0) continue;  // no peer to send to
    if (root) {
      std::printf("\n%s%s\n%12s %11s %6s %6s %11s %11s %11s", c.op, c.heading, "bytes", "elements", "warmup", "iters",
                  "time_us", "algbw_GB/s", "busbw_GB/s");
      if (link.enabled()) std::printf(" %11s %7s", "model_us", "x_model");
      std::printf(" %6s\n", "wrong");
    }
    for (int64_t e : sweep_elements(c, min_bytes, max_bytes, o.factor, n)) {
      const SweepRow x = measure(comm, dev, c, e, o);
      rows.push_back(x);
      nlohmann::ordered_json rec = row_json(x, n);
      rec["rank_time_ms"] = x.rank_time_s * 1e3;
      rec["simulated"] = link.enabled();
      log.log("collective", nlohmann::json(rec));
      if (root) {
        std::printf("%12lld %11lld %6d %6d %11.1f %11.3f", static_cast<long long>(x.size_bytes),
                    static_cast<long long>(x.elements), x.warmup, x.iters, x.time_s * 1e6, x.algbw / 1e9);
        if (n > 1) std::printf(" %11.3f", x.busbw / 1e9);
        else std::printf(" %11s", "n/a");
        if (link.enabled()) std::printf(" %11.1f %7.2f", x.modeled_s * 1e6, x.time_s / x.modeled_s);
        std::printf(" %6lld%s\n", static_cast<long long>(x.wrong), x.wrong ? "  <-- WRONG RESULT" : "");
        std::fflush(stdout);
      }
    }
  }
  const double sweep_s = seconds_since(t_sweep);

  // ------------------------------------------------------------------------------------------------
  // At a glance, probe.json, the summary record
  int64_t wrong_total = 0;
  nlohmann::ordered_json rows_json = nlohmann::ordered_json::array();
  for (const auto& x : rows) {
    wrong_total += x.wrong;
    rows_json.push_back(row_json(x, n));
  }
  probe["sweep"] = {{"dtype", "f32"},
                    {"link", link.name},
                    {"simulated", link.enabled()},
                    {"time", "mean per call over iters timed calls, the slowest rank's"},
                    {"busbw", comm.backend() == "mpi" ? "ring-model normalisation of algbw, not measured wire traffic"
                                                      : "algbw x bus_factor (nccl-tests)"},
                    {"seconds", sweep_s},
                    {"rows", rows_json}};
  if (root && n > 1) {
    std::printf("\n== at a glance: busbw GB/s (%d ranks%s) ==\n%-15s %10s %10s %10s\n", n,
                link.enabled() ? (", SIMULATED " + link.name).c_str() : "", "op", "1 MiB", "64 MiB", "best");
    auto at = [&](const std::string& op, int64_t bytes) -> std::string {
      for (const auto& x : rows) {
        if (x.op == op && x.size_bytes == bytes) {
          char b[32];
          std::snprintf(b, sizeof(b), "%.3f", x.busbw / 1e9);
          return b;
        }
      }
      return "-";
    };
    for (const Collective& c : kCollectives) {  // (n > 1 here: every op has rows)
      const std::string op = c.op;
      double best = 0;
      for (const auto& x : rows)
        if (x.op == op) best = std::max(best, x.busbw);
      char b[32];
      std::snprintf(b, sizeof(b), "%.3f", best / 1e9);
      std::printf("%-15s %10s %10s %10s\n", op.c_str(), at(op, 1 << 20).c_str(), at(op, 64 << 20).c_str(), b);
    }
  }
  if (root) {
    std::printf("sweep took %.1f s%s\n", sweep_s, simulated ? " of real time (the times above are virtual)" : "");
    const std::string probe_path = out_dir + "/probe.json";
    std::ofstream(probe_path) << probe.dump(2) << "\n";
    std::printf("\nwrote %s\n", probe_path.c_str());
    if (wrong_total > 0) {
      std::printf("\nERROR: %lld elements came back wrong: the transport is broken (see `wrong` above)\n",
                  static_cast<long long>(wrong_total));
    }
  }
  log.log_summary({{"probe", out_dir + "/probe.json"}, {"sweep_s", sweep_s}, {"wrong", wrong_total}});
  return wrong_total == 0 ? 0 : 2;
}

int main(int argc, char** argv) {
  CLI::App app{"lab 00: probe this machine: device, GEMM FLOP/s, memory copy and collective bandwidth"};
  Options o;
  app.add_option("--device", o.device,
                 "cpu, or sim: every rank a simulated GPU, the sweep in virtual time (docs/simulation.md; the GEMM "
                 "and memcpy are this CPU's: not measured)")
      ->check(CLI::IsMember({"cpu", "sim"}))
      ->capture_default_str();
  app.add_option("--sim-gpu", o.sim_gpu, "with --device sim: the GPU modelled, h100, h200, a100 or rtx4090")
      ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "communicator: auto (under mpirun: sim with --device sim, else mpi; one process: local), local, "
                 "mpi, nccl, sim")
      ->check(CLI::IsMember({"auto", "local", "mpi", "nccl", "sim"}))
      ->capture_default_str();
  app.add_option("--min-bytes", o.min_bytes, "smallest collective size (K, M, G = powers of 1024)")
      ->check(size_bytes())
      ->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest collective size")->check(size_bytes())->capture_default_str();
  app.add_option("--factor", o.factor, "size step: each size is the previous one times this")
      ->check(driver::int_in_range(2, INT32_MAX))
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed calls per size, at most (big sizes get fewer, see --seconds-per-size)")
      ->check(driver::positive_int())
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed calls per size, at most (at least 2: the first is checked)")
      ->check(driver::non_negative_int())
      ->capture_default_str();
  app.add_option("--seconds-per-size", o.seconds_per_size, "time budget per size that limits the calls of big sizes")
      ->check(driver::finite_positive())
      ->capture_default_str();
  app.add_option("--link", o.link, "simulated link: none, nvlink, pcie, ethernet100, infiniband")
      ->check(CLI::IsMember({"none", "nvlink", "pcie", "ethernet100", "infiniband"}))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank (0: cores / ranks per node)")
      ->check(driver::int_in_range(0, driver::kMaxThreads))
      ->capture_default_str();
  app.add_flag("--skip-gemm", o.skip_gemm, "do not calibrate the GEMM (quick runs, tests)");
  app.add_flag("--recalibrate", o.recalibrate, "measure the GEMM again even if runs/calibration has it");
  app.add_option("--memcpy-bytes", o.memcpy_bytes, "buffer of the memcpy bandwidth test")
      ->check(size_bytes())
      ->capture_default_str();
  app.add_option("--log-dir", o.log_dir, "output goes to <log-dir>/lab00/<run-id>/")->capture_default_str();
  app.add_option("--run-id", o.run_id, "name of this run (default: time + random suffix)");
  driver::require_checked_options(app);  // a numeric option without a range check: a programming error
  CLI11_PARSE(app, argc, argv);

  return run_on_all_ranks(o.device, o.sim_gpu, o.backend, [&](Communicator& comm) {
    driver::check_ranks_agree(comm, app);  // the first collective: ranks started with other options stop here
    return run(o, comm);
  });
}
