// metrics.cpp — JSONL run logs (metrics.h). Schema: docs/log_schema.md. Tests: tests/common/measure/test_metrics.cpp
#include "scalelab/measure/metrics.h"

#include <unistd.h>  // defines: gethostname

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "scalelab/core/error.h"    // defines: SL_CHECK_HINT
#include "scalelab/ops/ops.h"       // defines: cpu::bf16_matmul_backend, cpu::blas_kernel
#include "scalelab/core/threads.h"  // defines: num_threads

// Set on scalelab_common by common/CMakeLists.txt; the fallbacks keep other build systems working.
#ifndef SL_GIT_SHA
#define SL_GIT_SHA "unknown"
#endif
#ifndef SL_BLAS_BUILD
#define SL_BLAS_BUILD "unknown"
#endif

namespace scalelab {

// Records are built with ordered_json so keys appear in the order written ("type" first), which
// keeps a log readable with `head` or `jq -c`. Callers pass plain nlohmann::json; both convert.
using OrderedJson = nlohmann::ordered_json;

namespace {

// A number, or null when it was not measured (NaN) or is not finite. JSON has no NaN/Infinity, and
// null reads back in Python as None / pandas as NaN.
OrderedJson number_or_null(double v) { return std::isfinite(v) ? OrderedJson(v) : OrderedJson(nullptr); }

void merge(OrderedJson& into, const nlohmann::json& extra) {
  if (!extra.is_object()) return;
  for (auto it = extra.begin(); it != extra.end(); ++it) into[it.key()] = it.value();
}

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  // x86: "model name"; some ARM kernels: "Hardware" or "cpu model". First match wins.
  for (const char* key : {"model name", "Hardware", "cpu model"}) {
    in.clear();
    in.seekg(0);
    while (std::getline(in, line)) {
      if (line.compare(0, std::strlen(key), key) != 0) continue;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      v.erase(v.find_last_not_of(" \t\r") + 1);
      if (!v.empty()) return v;
    }
  }
  return "unknown";
}

}  // namespace

// ---------------------------------------------------------------------------------------------

SystemInfo system_info() {
  SystemInfo info;
  info.cpu_model = read_cpu_model();
  info.cores = static_cast<int>(std::thread::hardware_concurrency());
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) info.hostname = host;
  if (info.hostname.empty()) info.hostname = "unknown";
  return info;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string make_run_id() {
  if (const char* v = std::getenv("SL_RUN_ID"); v && *v) return v;
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
  std::random_device rd;  // suffix: two runs started in the same second get different ids
  char suffix[8];
  std::snprintf(suffix, sizeof(suffix), "%04x", static_cast<unsigned>(rd() & 0xffffu));
  return std::string(stamp) + "-" + suffix;
}

nlohmann::json memory_fields(const MemStats& stats) {
  nlohmann::json m = nlohmann::json::object();
  for (int c = 0; c < kNumMemCategories; ++c) {
    const std::string name = mem_category_name(static_cast<MemCategory>(c));
    m["memory_" + name + "_bytes"] = stats.current_bytes[c];
    m["memory_" + name + "_peak_bytes"] = stats.peak_bytes[c];
  }
  m["memory_current_bytes"] = stats.total_current_bytes;
  m["memory_peak_bytes"] = stats.total_peak_bytes;
  // Held from the system: in use (rounded to size classes) + cached; equals memory_current_bytes
  // without caching (CPU). On CUDA, what the process holds beyond it shows in nvidia-smi.
  m["memory_reserved_bytes"] = stats.reserved_bytes;
  m["memory_reserved_peak_bytes"] = stats.reserved_peak_bytes;
  return m;
}

// ---------------------------------------------------------------------------------------------
// RunLogger

RunLogger::RunLogger(const std::string& lab, const std::string& run_id, int rank, const std::string& dir)
    : lab_(lab), run_id_(run_id), rank_(rank), start_(std::chrono::steady_clock::now()) {
  SL_CHECK(!lab.empty() && !run_id.empty() && rank >= 0, "lab='%s' run_id='%s' rank=%d", lab.c_str(), run_id.c_str(),
           rank);
  namespace fs = std::filesystem;
  const fs::path run_dir = fs::path(dir) / lab / run_id;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  path_ = (run_dir / ("rank" + std::to_string(rank) + ".jsonl")).string();
  // Append: a resumed run (same run id) continues its file; its new `run` record marks the restart.
  file_ = std::fopen(path_.c_str(), "a");
  SL_CHECK_HINT(file_ != nullptr, "check that the directory is writable, or pass another --log-dir",
                "cannot open run log %s: %s", path_.c_str(), std::strerror(errno));
}

RunLogger::~RunLogger() {
  if (file_) std::fclose(file_);
}

void RunLogger::emit(const std::string& type, const nlohmann::ordered_json& fields) {
  OrderedJson out;
  out["type"] = type;
  out["rank"] = rank_;
  out["elapsed_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (auto it = fields.begin(); it != fields.end(); ++it) out[it.key()] = it.value();
  // Invalid UTF-8 (e.g. a sampled byte sequence that cuts a multi-byte character) is written as U+FFFD
  // instead of throwing: a log line must never end a run.
  const std::string line = out.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);  // one record per flush: a crash loses at most the record being written
}

void RunLogger::log(const std::string& type, const nlohmann::json& record) {
  OrderedJson fields;
  merge(fields, record);
  emit(type, fields);
}

void RunLogger::log_run(const RunRecord& r) {
  const SystemInfo sys = system_info();
  peak_flops_per_s_ = r.peak_flops_per_s;
  peak_source_ = r.peak_source;
  OrderedJson rec;
  rec["run_id"] = run_id_;
  rec["lab"] = lab_;
  rec["world_size"] = r.world_size;
  rec["track"] = r.track;
  rec["git_sha"] = SL_GIT_SHA;
  rec["device"] = r.device;
  rec["cpu_model"] = sys.cpu_model;
  rec["cpu_cores"] = sys.cores;
  rec["threads"] = r.threads > 0 ? r.threads : num_threads();
  rec["blas_build"] = SL_BLAS_BUILD;
  rec["blas_kernel"] = cpu::blas_kernel();  // the kernel set OpenBLAS's fp32 GEMMs run on (ops/cpu/blas_kernel.cpp)
  rec["cpu_bf16_matmul"] = cpu::bf16_matmul_backend();  // what bf16-compute's CPU matmuls run on (ops.h)
  rec["precision"] = r.precision;
  rec["peak_flops_per_s"] = number_or_null(r.peak_flops_per_s);
  rec["peak_source"] = r.peak_source;
  rec["calibration_id"] = r.calibration_id;
  rec["hostname"] = sys.hostname;
  rec["start_time"] = utc_now_iso8601();
  rec["config"] = r.config;
  merge(rec, r.extra);
  emit("run", rec);
}

void RunLogger::log_step(const StepRecord& s) {
  if (!warned_mfu_ && std::isfinite(s.mfu) && (s.mfu < 0.0 || s.mfu > 1.0)) {
    warned_mfu_ = true;
    std::fprintf(stderr,
                 "[scalelab] warning: step %lld logs mfu=%g, outside [0, 1]. mfu is a fraction, not a percentage;\n"
                 "[scalelab]   above 1, the peak is too low or the FLOP count too high. Most often on a CPU the peak\n"
                 "[scalelab]   (the run record's peak_source) was calibrated while other programs were running, so\n"
                 "[scalelab]   it is too low: measure it again with nothing else running,\n"
                 "[scalelab]   build/bin/sl_calibrate --threads <this run's threads per rank> --recalibrate\n"
                 "[scalelab]   On a GPU: the peak of another device or precision (run record: peak_source).\n",
                 static_cast<long long>(s.step), s.mfu);
  }
  OrderedJson rec;
  rec["step"] = s.step;
  rec["loss"] = number_or_null(s.loss);
  rec["lr"] = number_or_null(s.lr);
  rec["tokens"] = s.tokens;
  rec["step_ms"] = number_or_null(s.step_ms);
  rec["data_wait_ms"] = number_or_null(s.data_wait_ms);
  rec["comm_ms"] = number_or_null(s.comm_ms);
  rec["tokens_per_s"] = number_or_null(s.tokens_per_s);
  rec["mfu"] = number_or_null(s.mfu);
  rec["grad_norm"] = number_or_null(s.grad_norm);
  merge(rec, memory_fields(Allocator::get(memory_device_).stats()));
  merge(rec, s.extra);
  emit("step", rec);

  // Summary sums. The first step record is warm-up (allocations, page faults, BLAS thread start-up)
  // and is left out of the means, as every timing in the kit does (docs/style.md 32); it is kept apart for a
  // run of one step, whose summary has nothing else to time.
  std::lock_guard<std::mutex> lock(mu_);
  if (num_steps_ == 0) first_step_ = s;
  if (num_steps_ > 0 && std::isfinite(s.step_ms)) {
    ++timed_steps_;
    sum_step_ms_ += s.step_ms;
    timed_tokens_ += s.tokens;
    if (std::isfinite(s.mfu)) {
      sum_mfu_ += s.mfu;
      ++mfu_steps_;
    }
  }
  ++num_steps_;
  tokens_total_ += s.tokens;
  last_step_ = s.step;
  if (std::isfinite(s.loss)) last_loss_ = s.loss;
}

void RunLogger::log_eval(int64_t step, double val_loss, const nlohmann::json& extra) {
  OrderedJson rec;
  rec["step"] = step;
  rec["val_loss"] = number_or_null(val_loss);
  merge(rec, extra);
  emit("eval", rec);
  std::lock_guard<std::mutex> lock(mu_);
  if (std::isfinite(val_loss) && !(val_loss >= best_val_loss_)) best_val_loss_ = val_loss;  // NaN-safe min
}

void RunLogger::log_timeline(int64_t step, const std::vector<CommEvent>& events, const std::vector<TimeSpan>& compute) {
  OrderedJson comm_events = OrderedJson::array();
  for (const CommEvent& e : events) {
    OrderedJson ev;
    ev["op"] = e.op;
    ev["tag"] = e.tag;
    ev["count"] = e.count;
    ev["payload_bytes"] = e.payload_bytes;
    ev["bus_bytes"] = e.bus_bytes;
    ev["issue_ms"] = e.issue_ms;
    ev["start_ms"] = e.start_ms;
    ev["end_ms"] = e.end_ms > 0 ? OrderedJson(e.end_ms) : OrderedJson(nullptr);  // 0: still pending
    ev["modeled_ms"] = e.modeled_ms;
    ev["wait_ms"] = e.wait_ms;
    ev["async"] = e.async;
    ev["simulated"] = e.simulated;
    ev["group"] = e.group;              // which communicator carried it: "world", "tp", "pp", "dp", ...
    ev["world_ranks"] = e.world_ranks;  // that group's members (world ranks, in the group's rank order)
    comm_events.push_back(std::move(ev));
  }
  OrderedJson spans = OrderedJson::array();
  for (const TimeSpan& t : compute) spans.push_back({{"name", t.name}, {"start_ms", t.start_ms}, {"end_ms", t.end_ms}});
  OrderedJson rec;
  rec["step"] = step;
  rec["events"] = std::move(comm_events);
  rec["compute"] = std::move(spans);
  emit("timeline", rec);
}

void RunLogger::log_summary(const nlohmann::json& extra) {
  OrderedJson rec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double nan = kNotMeasured;
    rec["steps"] = num_steps_;
    rec["last_step"] = last_step_;
    rec["tokens"] = tokens_total_;
    if (num_steps_ == 1 && std::isfinite(first_step_.step_ms)) {
      // One step: the warm-up step is the only one there is, so it is the one timed (and the record says so).
      rec["timed_steps"] = 1;
      rec["warm_up_timed"] = true;
      rec["mean_step_ms"] = number_or_null(first_step_.step_ms);
      rec["tokens_per_s"] = number_or_null(
          first_step_.step_ms > 0 ? static_cast<double>(first_step_.tokens) / (first_step_.step_ms / 1000.0) : nan);
      rec["mean_mfu"] = number_or_null(first_step_.mfu);
    } else {
      rec["timed_steps"] = timed_steps_;
      rec["mean_step_ms"] = number_or_null(timed_steps_ > 0 ? sum_step_ms_ / timed_steps_ : nan);
      rec["tokens_per_s"] = number_or_null(sum_step_ms_ > 0 ? timed_tokens_ / (sum_step_ms_ / 1000.0) : nan);
      rec["mean_mfu"] = number_or_null(mfu_steps_ > 0 ? sum_mfu_ / mfu_steps_ : nan);
    }
    rec["peak_flops_per_s"] = number_or_null(peak_flops_per_s_);
    rec["peak_source"] = peak_source_;
    rec["final_loss"] = number_or_null(last_loss_);
    rec["best_val_loss"] = number_or_null(best_val_loss_);
  }
  const MemStats mem = Allocator::get(memory_device_).stats();
  rec["memory_peak_bytes"] = mem.total_peak_bytes;
  rec["memory_reserved_peak_bytes"] = mem.reserved_peak_bytes;
  rec["end_time"] = utc_now_iso8601();
  merge(rec, extra);
  emit("summary", rec);
}

}  // namespace scalelab
