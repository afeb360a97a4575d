// scaling_report.cpp — the logs of a 1-device run, an N-device run and a batch sweep -> ScalingEvidence
// and the "why not 2x?" table (scaling_report.h). Record keys: docs/log_schema.md. The verdict itself:
// common/src/measure/bottleneck.cpp. Tests: tests/lab04_scaling/test_scaling_report.cpp
#include "scaling_report.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::json (the JSONL records)

#include <algorithm>   // defines: std::sort, std::min_element, std::max_element
#include <cmath>       // defines: std::isfinite
#include <cstdarg>     // defines: va_list (fmt)
#include <cstdio>      // defines: std::vsnprintf
#include <filesystem>  // defines: std::filesystem::directory_iterator (rank*.jsonl)
#include <fstream>     // defines: std::ifstream
#include <map>
#include <sstream>  // defines: std::istringstream, std::ostringstream
#include <string>
#include <vector>

#include "scalelab/core/error.h"     // defines: SL_CHECK_HINT, SL_FAIL
#include "scalelab/measure/stats.h"  // defines: median

namespace scalelab::scaling {

namespace {

using nlohmann::json;

bool measured(double x) { return std::isfinite(x); }

// A number under `key`, kNotMeasured when the key is missing, null or not a number.
double num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return kNotMeasured;
  return it->get<double>();
}

std::string str(const json& j, const char* key, const std::string& fallback = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// Mean of the measured values (kNotMeasured if none).
double mean_measured(const std::vector<double>& xs) {
  double sum = 0;
  int n = 0;
  for (double x : xs)
    if (measured(x)) sum += x, ++n;
  return n > 0 ? sum / n : kNotMeasured;
}

// Median of the measured values (kNotMeasured if none).
double median_measured(std::vector<double> xs) {
  xs.erase(std::remove_if(xs.begin(), xs.end(), [](double x) { return !measured(x); }), xs.end());
  return median(xs);
}

std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list args;
  va_start(args, f);
  std::vsnprintf(buf, sizeof(buf), f, args);
  va_end(args);
  return buf;
}

// Rates: "9.8k", "50.6M"; "n/a" when not measured.
std::string rate(double x) {
  if (!measured(x)) return "n/a";
  if (x >= 1e9) return fmt("%.3gG", x / 1e9);
  if (x >= 1e6) return fmt("%.3gM", x / 1e6);
  if (x >= 1e4) return fmt("%.3gk", x / 1e3);
  return fmt("%.0f", x);
}
std::string pct(double fraction) { return measured(fraction) ? fmt("%.1f %%", 100.0 * fraction) : "n/a"; }
std::string ms(double x) { return measured(x) ? fmt("%.1f", x) : "n/a"; }
std::string mib(double bytes) { return measured(bytes) ? fmt("%.1f", bytes / (1024.0 * 1024.0)) : "n/a"; }

struct RankRecords {
  json run;                 // the run record (null if none)
  std::vector<json> steps;  // step records
  json summary;             // the summary record (null if none)
  double loader_alone = kNotMeasured;
};

RankSummary summarize_rank(int rank, const RankRecords& r) {
  RankSummary s;
  s.rank = rank;
  // Step 0 allocates and warms caches (docs/style.md 32): left out unless it is all there is.
  std::vector<const json*> timed;
  for (const json& st : r.steps)
    if (num(st, "step") >= 1) timed.push_back(&st);
  if (timed.empty())
    for (const json& st : r.steps) timed.push_back(&st);
  s.timed_steps = static_cast<int>(timed.size());
  std::vector<double> step, wait, comm, compute, busy, tokens;
  double peak = kNotMeasured;
  for (const json* st : timed) {
    const double step_ms = num(*st, "step_ms"), wait_ms = num(*st, "data_wait_ms"), comm_ms = num(*st, "comm_ms");
    step.push_back(step_ms);
    wait.push_back(wait_ms);
    comm.push_back(comm_ms);
    double c = num(*st, "compute_ms");
    if (!measured(c) && measured(step_ms))  // what is left of the step when nothing was waited for
      c = step_ms - (measured(wait_ms) ? wait_ms : 0.0) - (measured(comm_ms) ? comm_ms : 0.0);
    compute.push_back(c);
    busy.push_back(num(*st, "comm_busy_ms"));
    tokens.push_back(num(*st, "tokens"));
  }
  for (const json& st : r.steps) {
    const double p = num(st, "memory_peak_bytes");
    if (measured(p) && !(p <= peak)) peak = p;
  }
  if (!r.summary.is_null()) {
    const double p = num(r.summary, "memory_peak_bytes");
    if (measured(p) && !(p <= peak)) peak = p;
  }
  s.step_ms = mean_measured(step);
  s.median_step_ms = median_measured(step);
  s.data_wait_ms = mean_measured(wait);
  s.comm_ms = mean_measured(comm);
  s.compute_ms = mean_measured(compute);
  s.comm_busy_ms = mean_measured(busy);
  s.tokens_per_step = mean_measured(tokens);
  s.peak_bytes = peak;
  s.loader_alone_tokens_per_s = r.loader_alone;
  if (!measured(s.loader_alone_tokens_per_s) && !r.summary.is_null())
    s.loader_alone_tokens_per_s = num(r.summary, "loader_alone_tokens_per_s");
  return s;
}

// fraction part / step on each rank, averaged over ranks.
double mean_share(const std::vector<RankSummary>& ranks, double RankSummary::*part) {
  std::vector<double> shares;
  for (const RankSummary& r : ranks)
    if (measured(r.*part) && measured(r.step_ms) && r.step_ms > 0) shares.push_back(r.*part / r.step_ms);
  return mean_measured(shares);
}

}  // namespace

int cause_order_from_name(const std::string& name) {
  if (name == "loader") return 1;
  if (name == "comm") return 2;
  if (name == "batch") return 3;
  if (name == "straggler") return 4;
  return 0;
}

RunSummary parse_run(const std::string& name, const std::vector<std::string>& rank_jsonl) {
  std::map<int, RankRecords> by_rank;
  for (size_t f = 0; f < rank_jsonl.size(); ++f) {
    std::istringstream in(rank_jsonl[f]);
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json rec;
      try {
        rec = json::parse(line);
      } catch (const json::exception& e) {
        SL_FAIL("each line of rank<k>.jsonl is one JSON object (docs/log_schema.md); was the run cut short?",
                "run '%s', file %zu, line %d is not JSON: %s", name.c_str(), f, line_no, e.what());
      }
      if (!rec.is_object()) continue;
      const double rank_field = num(rec, "rank");
      const int rank = measured(rank_field) ? static_cast<int>(rank_field) : static_cast<int>(f);
      RankRecords& r = by_rank[rank];
      const std::string type = str(rec, "type");
      if (type == "run") r.run = rec;
      else if (type == "step") r.steps.push_back(rec);
      else if (type == "summary") r.summary = rec;
      else if (type == "loader_alone") r.loader_alone = num(rec, "tokens_per_s");
    }
  }
  SL_CHECK_HINT(!by_rank.empty(), "pass the folder <log-dir>/lab04/<run-id> of a finished run", "run '%s': no records",
                name.c_str());

  RunSummary s;
  s.name = name;
  for (const auto& [rank, r] : by_rank) {
    SL_CHECK_HINT(!r.steps.empty(), "did the run fail before its first step? read its output",
                  "run '%s': rank %d logged no step record", name.c_str(), rank);
    s.ranks.push_back(summarize_rank(rank, r));
  }
  const RankRecords& r0 = by_rank.begin()->second;
  const json config = !r0.run.is_null() && r0.run.contains("config") ? r0.run["config"] : json::object();
  const double world = !r0.run.is_null() ? num(r0.run, "world_size") : kNotMeasured;
  s.world_size = measured(world) ? static_cast<int>(world) : static_cast<int>(by_rank.size());
  double b = num(config, "micro_batch");
  if (!measured(b)) b = num(config, "B");  // lab 03's key
  s.micro_batch = measured(b) ? static_cast<int>(b) : 0;
  const double t = num(config, "T");
  s.seq_len = measured(t) ? static_cast<int>(t) : 0;
  const double stage = num(config, "stage");
  s.stage = measured(stage) ? static_cast<int>(stage) : -1;
  const double prefetch = num(config, "prefetch");
  s.prefetch = measured(prefetch) ? static_cast<int>(prefetch) : -1;
  s.model = str(config, "model");
  s.link = str(config, "link", "none");
  s.overlap = str(config, "overlap") == "on" || str(config, "mode") == "overlap";

  // Throughput of the whole run: rank 0's summary (timed tokens / timed seconds, all ranks together);
  // without one, rank 0's timed steps.
  if (!r0.summary.is_null()) {
    s.tokens_per_s = num(r0.summary, "tokens_per_s");
    s.mfu = num(r0.summary, "mfu");
    if (!measured(s.mfu)) s.mfu = num(r0.summary, "mean_mfu");
  }
  if (!measured(s.tokens_per_s) || !measured(s.mfu)) {
    double tokens = 0, seconds = 0;
    std::vector<double> mfus;
    for (const json& st : r0.steps) {
      if (num(st, "step") < 1 && r0.steps.size() > 1) continue;
      const double tk = num(st, "tokens"), step_ms = num(st, "step_ms");
      if (measured(tk) && measured(step_ms)) tokens += tk, seconds += step_ms / 1e3;
      mfus.push_back(num(st, "mfu"));
    }
    if (!measured(s.tokens_per_s) && seconds > 0) s.tokens_per_s = tokens / seconds;
    if (!measured(s.mfu)) s.mfu = mean_measured(mfus);
  }
  return s;
}

RunSummary read_run(const std::string& dir) {
  namespace fs = std::filesystem;
  SL_CHECK_HINT(fs::is_directory(dir), "pass <log-dir>/lab04/<run-id> (the driver prints it as 'logs: ...')",
                "no such run folder: %s", dir.c_str());
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("rank", 0) == 0 && entry.path().extension() == ".jsonl") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  SL_CHECK_HINT(!files.empty(), "a run writes one rank<k>.jsonl per rank (docs/log_schema.md)", "no rank*.jsonl in %s",
                dir.c_str());
  std::vector<std::string> texts;
  for (const std::string& path : files) {
    std::ifstream in(path);
    std::ostringstream text;
    text << in.rdbuf();
    texts.push_back(text.str());
  }
  return parse_run(dir, texts);
}

ScalingEvidence make_evidence(const RunSummary& single, const RunSummary& multi, const std::vector<RunSummary>& sweep,
                              std::vector<std::string>* notes) {
  auto note = [&](const std::string& n) {
    if (notes) notes->push_back(n);
  };
  ScalingEvidence ev;
  ev.world_size = multi.world_size;
  ev.single_tokens_per_s = single.tokens_per_s;
  ev.multi_tokens_per_s = multi.tokens_per_s;
  if (single.world_size != 1) note(fmt("the 1-device run '%s' has %d ranks", single.name.c_str(), single.world_size));
  if (single.model != multi.model || single.seq_len != multi.seq_len)
    note(fmt("the two runs differ: model %s vs %s, T %d vs %d; scaling efficiency compares different work",
             single.model.c_str(), multi.model.c_str(), single.seq_len, multi.seq_len));
  if (single.micro_batch != multi.micro_batch)
    note(
        fmt("per-device batch differs: B=%d on 1 device, B=%d on each of %d (same global batch?); that alone can "
            "be cause 3",
            single.micro_batch, multi.micro_batch, multi.world_size));

  // Cause 1: the loader timed alone vs what each rank's model eats when it never waits.
  std::vector<double> alone, consumption;
  for (const RankSummary& r : multi.ranks) {
    alone.push_back(r.loader_alone_tokens_per_s);
    if (measured(r.tokens_per_step) && measured(r.step_ms) && multi.world_size > 0) {
      const double busy_ms = r.step_ms - (measured(r.data_wait_ms) ? r.data_wait_ms : 0.0);
      if (busy_ms > 0) consumption.push_back(r.tokens_per_step / multi.world_size / (busy_ms / 1e3));
    }
  }
  ev.loader_alone_tokens_per_s = mean_measured(alone);
  ev.consumption_tokens_per_s = mean_measured(consumption);
  ev.data_wait_share = mean_share(multi.ranks, &RankSummary::data_wait_ms);

  // Cause 2: exposed communication (comm_ms, the caller's waits) and the time collectives were in flight.
  ev.exposed_comm_share = mean_share(multi.ranks, &RankSummary::comm_ms);
  ev.comm_busy_share = mean_share(multi.ranks, &RankSummary::comm_busy_ms);
  ev.overlap_enabled = multi.overlap;
  ev.link_name = multi.link;
  ev.link_simulated = !multi.link.empty() && multi.link != "none";

  // Cause 3: one device, same T, several B. The 1-device run is one of the points.
  std::vector<const RunSummary*> points = {&single};
  for (const RunSummary& r : sweep) points.push_back(&r);
  for (const RunSummary* r : points) {
    if (r->world_size != 1) {
      note(fmt("sweep run '%s' left out: %d ranks (the sweep is on one device)", r->name.c_str(), r->world_size));
      continue;
    }
    if (multi.seq_len > 0 && r->seq_len != multi.seq_len) {
      note(fmt("sweep run '%s' left out: T=%d, the N-device run has T=%d", r->name.c_str(), r->seq_len, multi.seq_len));
      continue;
    }
    const bool seen = std::any_of(ev.batch_sweep.begin(), ev.batch_sweep.end(),
                                  [&](const BatchPoint& p) { return p.micro_batch == r->micro_batch; });
    const RankSummary& r0 = r->ranks.front();
    const double tok_s = measured(r0.tokens_per_step) && r0.median_step_ms > 0
                             ? r0.tokens_per_step / (r0.median_step_ms / 1e3)
                             : r->tokens_per_s;
    if (!seen && r->micro_batch > 0) ev.batch_sweep.push_back({r->micro_batch, tok_s});
  }
  std::sort(ev.batch_sweep.begin(), ev.batch_sweep.end(),
            [](const BatchPoint& a, const BatchPoint& b) { return a.micro_batch < b.micro_batch; });
  ev.micro_batch = multi.micro_batch;

  // Cause 4: per-rank compute time (a slow rank hides inside the others' communication wait).
  for (const RankSummary& r : multi.ranks) {
    RankTiming t;
    t.rank = r.rank;
    t.step_ms = r.step_ms;
    t.compute_ms = r.compute_ms;
    t.data_wait_ms = r.data_wait_ms;
    t.exposed_comm_ms = r.comm_ms;
    ev.ranks.push_back(t);
  }
  return ev;
}

namespace {

// "spread x %" of one per-rank field: max / min - 1 ("" for fewer than two ranks).
std::string spread(const std::vector<RankSummary>& ranks, double RankSummary::*field) {
  std::vector<double> xs;
  for (const RankSummary& r : ranks)
    if (measured(r.*field)) xs.push_back(r.*field);
  if (xs.size() < 2) return "";
  const double lo = *std::min_element(xs.begin(), xs.end()), hi = *std::max_element(xs.begin(), xs.end());
  return lo > 0 ? fmt("spread %.1f %%", 100.0 * (hi / lo - 1.0)) : "";
}

double mean_field(const std::vector<RankSummary>& ranks, double RankSummary::*field) {
  std::vector<double> xs;
  for (const RankSummary& r : ranks) xs.push_back(r.*field);
  return mean_measured(xs);
}

// "rank 0 12.0, rank 1 30.5" of a per-rank value, formatted by f.
template <class F>
std::string per_rank_list(const std::vector<RankSummary>& ranks, F f) {
  std::string s;
  for (const RankSummary& r : ranks) s += fmt("%srank %d %s", s.empty() ? "" : ", ", r.rank, f(r).c_str());
  return s;
}

double max_peak(const RunSummary& run) {
  double peak = kNotMeasured;
  for (const RankSummary& r : run.ranks)
    if (measured(r.peak_bytes) && !(r.peak_bytes <= peak)) peak = r.peak_bytes;
  return peak;
}

}  // namespace

std::string format_report(const RunSummary& single, const RunSummary& multi, const ScalingEvidence& ev,
                          const Verdict& v, const std::vector<std::string>& notes, bool with_verdict,
                          bool show_options) {
  const int n = multi.world_size;
  std::string out;
  const std::string model = fmt("model %s%s", multi.model.empty() ? "?" : multi.model.c_str(),
                                multi.stage > 0 ? fmt(", ZeRO-%d", multi.stage).c_str() : "");
  if (show_options)
    out += fmt("Why not %dx? %s, T=%d | 1 device: B=%d | %d devices: B=%d each, overlap %s%s, link %s%s\n", n,
               model.c_str(), multi.seq_len, single.micro_batch, n, multi.micro_batch, multi.overlap ? "on" : "off",
               multi.prefetch >= 0 ? fmt(" (prefetch %d)", multi.prefetch).c_str() : "", multi.link.c_str(),
               ev.link_simulated ? " (simulated)" : "");
  else  // blind: the same header whichever cause was provoked
    out += fmt("Why not %dx? %s | 1 device vs %d devices; the runs' B, T, overlap and link are not shown\n", n,
               model.c_str(), n);
  const std::string col_n = fmt("%d devices", n);
  out += fmt("  %-32s %14s %16s\n", "", "1 device", col_n.c_str());
  auto row = [&](const char* what, const std::string& a, const std::string& b, const std::string& extra = "") {
    out += fmt("  %-32s %14s %16s%s%s\n", what, a.c_str(), b.c_str(), extra.empty() ? "" : "   ", extra.c_str());
  };
  const RankSummary& s0 = single.ranks.front();
  row("tokens/s (all devices)", rate(single.tokens_per_s), rate(multi.tokens_per_s));
  row("tokens/s per device", rate(single.tokens_per_s),
      rate(measured(multi.tokens_per_s) && n > 0 ? multi.tokens_per_s / n : kNotMeasured));
  row("MFU", pct(single.mfu), pct(multi.mfu));
  row("peak memory per rank (MiB)", mib(s0.peak_bytes), mib(max_peak(multi)),
      n > 1 ? "largest; " + per_rank_list(multi.ranks, [](const RankSummary& r) { return mib(r.peak_bytes); }) : "");
  row("data wait (% of step)", pct(s0.data_wait_ms / s0.step_ms), pct(ev.data_wait_share),
      n > 1
          ? "mean; " + per_rank_list(multi.ranks, [](const RankSummary& r) { return pct(r.data_wait_ms / r.step_ms); })
          : "");
  row("exposed comm (% of step)", pct(s0.comm_ms / s0.step_ms), pct(ev.exposed_comm_share),
      n > 1 ? "mean; " + per_rank_list(multi.ranks, [](const RankSummary& r) { return pct(r.comm_ms / r.step_ms); })
            : "");
  row("comm in flight (% of step)", pct(s0.comm_busy_ms / s0.step_ms), pct(ev.comm_busy_share));
  row("step time (ms)", ms(s0.step_ms), ms(mean_field(multi.ranks, &RankSummary::step_ms)),
      n > 1 ? "mean; " + per_rank_list(multi.ranks, [](const RankSummary& r) { return ms(r.step_ms); }) + ", " +
                  spread(multi.ranks, &RankSummary::step_ms)
            : "");
  row("compute time (ms)", ms(s0.compute_ms), ms(mean_field(multi.ranks, &RankSummary::compute_ms)),
      n > 1 ? "mean; " + per_rank_list(multi.ranks, [](const RankSummary& r) { return ms(r.compute_ms); }) + ", " +
                  spread(multi.ranks, &RankSummary::compute_ms)
            : "");
  row("loader alone (tok/s per rank)", rate(s0.loader_alone_tokens_per_s), rate(ev.loader_alone_tokens_per_s));
  row("model eats (tok/s per rank)", "", rate(ev.consumption_tokens_per_s), "tokens per rank / (step - data wait)");
  row("timed steps", fmt("%d", s0.timed_steps), fmt("%d", multi.ranks.front().timed_steps), "step 0 is warm-up");
  if (!ev.batch_sweep.empty()) {
    std::string sweep;
    for (const BatchPoint& p : ev.batch_sweep)
      sweep += fmt("%sB=%d %s", sweep.empty() ? "" : " | ", p.micro_batch, rate(p.tokens_per_s_per_device).c_str());
    const std::string same_t = show_options ? fmt("T=%d", multi.seq_len) : "the runs' T";
    out += fmt("  batch sweep, 1 device, %s (tokens/s at the median step): %s\n", same_t.c_str(), sweep.c_str());
  }
  if (show_options)  // a blind run's notes would name its options ("per-device batch differs")
    for (const std::string& note : notes) out += "  note: " + note + "\n";
  const double eff = v.scaling_efficiency;
  if (measured(eff))
    out += fmt("Scaling efficiency: %.0f %% (%.2fx on %d devices, %dx would be perfect)\n", 100.0 * eff, eff * n, n, n);
  else out += "Scaling efficiency: not measured\n";
  if (with_verdict) out += "\n" + format_verdict(v);
  return out;
}

nlohmann::json report_json(const RunSummary& single, const RunSummary& multi, const Verdict& v) {
  const auto num = [](double x) { return measured(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json causes = nlohmann::json::array();
  for (const CauseFinding& f : v.findings)
    causes.push_back({{"order", f.order},
                      {"cause", f.cause},
                      {"culprit", f.culprit},
                      {"measured", num(f.measured)},
                      {"threshold", num(f.threshold)},
                      {"has_evidence", f.has_evidence}});
  return {{"world_size", multi.world_size},
          {"single_tokens_per_s", num(single.tokens_per_s)},
          {"multi_tokens_per_s", num(multi.tokens_per_s)},
          {"single_mfu", num(single.mfu)},
          {"multi_mfu", num(multi.mfu)},
          {"scaling_efficiency", num(v.scaling_efficiency)},
          {"causes", causes}};
}

}  // namespace scalelab::scaling
