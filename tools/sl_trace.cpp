// sl_trace.cpp — bin/sl_trace runs/<lab>/<run id>: every rank's `timeline` records (and lab 07's step
// `group_calls`; docs/log_schema.md) as one Chrome trace-event JSON, <run>/trace.json, that
// https://ui.perfetto.dev and chrome://tracing open: a process per rank ("rank N"), a thread per stream
// ("compute", "comm"; a second lane, "comm 2", where calls in flight overlap), one complete ("X") event per
// compute span or collective, ts and dur in microseconds. Says whether the times are virtual (a simulated
// run, docs/simulation.md) or the wall clock. Format: the Trace Event Format (Google, "Trace Event Format",
// docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). Test: tests/tools/check_trace.py
#include <CLI/CLI.hpp>        // defines: CLI::App (command line)
#include <nlohmann/json.hpp>  // defines: nlohmann::json (the JSONL records and the trace)

#include <algorithm>   // defines: std::sort
#include <cstdio>      // defines: std::printf, std::fprintf
#include <filesystem>  // defines: std::filesystem::directory_iterator (rank*.jsonl)
#include <fstream>     // defines: std::ifstream, std::ofstream
#include <map>
#include <string>
#include <vector>

#include "scalelab/core/error.h"  // defines: SL_CHECK_HINT, SL_FAIL, scalelab::Error

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One span of one rank's timeline, in ms on that rank's clock.
struct Span {
  std::string name;
  double start_ms = 0, end_ms = 0;
  json args;  // what the viewer shows on a click: step, and for a call its group, tag, bytes, wait
};

struct Rank {
  int rank = 0;
  std::vector<Span> compute, comm;
};

struct Run {
  std::vector<Rank> ranks;  // in rank order
  bool virtual_time = false;
  std::string gpu;  // "simulated H100 SXM" on the simulated GPU
  int pending = 0;  // calls still in flight when logged (end_ms null): not drawn
};

double num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// A communication call of a timeline's `events` or of a step's `group_calls` ("all_reduce grad norm").
void add_call(Rank& r, Run& run, const json& e, int64_t step) {
  const auto end = e.find("end_ms");
  if (end == e.end() || !end->is_number()) {
    ++run.pending;
    return;
  }
  Span s;
  const std::string tag = str(e, "tag");
  s.name = str(e, "op") + (tag.empty() ? "" : " " + tag);
  s.start_ms = num(e, "start_ms");
  s.end_ms = end->get<double>();
  s.args = {{"step", step}, {"group", str(e, "group")}, {"tag", tag}};
  for (const char* k : {"payload_bytes", "wait_ms", "modeled_ms"})
    if (e.contains(k)) s.args[k] = e[k];
  r.comm.push_back(s);
}

// Every rank<k>.jsonl of the run folder. Throws scalelab::Error naming the folder, the file and the line.
Run read_run(const std::string& dir) {
  SL_CHECK_HINT(fs::is_directory(dir), "give a run folder: runs/<lab>/<run id> (the --log-dir of the run)",
                "sl_trace: no run folder at '%s'", dir.c_str());
  std::map<int, fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank", 0) == 0 && entry.path().extension() == ".jsonl")
      files[std::atoi(name.c_str() + 4)] = entry.path();
  }
  SL_CHECK_HINT(!files.empty(), "give a run folder: runs/<lab>/<run id>, which holds rank0.jsonl, rank1.jsonl, ...",
                "sl_trace: no rank*.jsonl in '%s'", dir.c_str());
  Run run;
  int timelines = 0;
  for (const auto& [k, path] : files) {
    Rank r;
    r.rank = k;
    std::ifstream in(path);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      json rec;
      try {
        rec = json::parse(line);
      } catch (const json::exception& e) {
        SL_FAIL("each line of a rank*.jsonl is one JSON object (docs/log_schema.md)",
                "sl_trace: %s line %d is not JSON (%s)", path.string().c_str(), n, e.what());
      }
      const std::string type = str(rec, "type");
      if (type == "run" || type == "summary") {
        if (str(rec, "clock") == "virtual" || str(rec, "device") == "sim") run.virtual_time = true;
        if (!str(rec, "sim_gpu_name").empty()) run.gpu = str(rec, "sim_gpu_name");
      } else if (type == "timeline") {
        ++timelines;
        const int64_t step = static_cast<int64_t>(num(rec, "step"));
        for (const json& c : rec.value("compute", json::array()))
          r.compute.push_back({str(c, "name"), num(c, "start_ms"), num(c, "end_ms"), {{"step", step}}});
        for (const json& e : rec.value("events", json::array())) add_call(r, run, e, step);
      } else if (type == "step" && rec.contains("group_calls")) {  // lab 07: the pp, dp, embedding groups' calls
        for (const json& e : rec["group_calls"]) add_call(r, run, e, static_cast<int64_t>(num(rec, "step")));
      }
    }
    run.ranks.push_back(std::move(r));
  }
  SL_CHECK_HINT(timelines > 0, "run the lab with --timeline-steps N (N >= 1; labs 03, 04, 06 and 07 log them)",
                "sl_trace: no timeline records in '%s'", dir.c_str());
  return run;
}

// Lanes of one stream: a span goes to the first lane where it starts after every open span ended or nests
// inside the innermost one (the X events of one thread must nest); overlapping calls in flight get more lanes.
std::vector<int> lanes_of(std::vector<Span>& spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.start_ms != b.start_ms ? a.start_ms < b.start_ms : a.end_ms > b.end_ms;  // outer first
  });
  std::vector<std::vector<double>> open;  // per lane: the ends of its open spans, innermost last
  std::vector<int> lane;
  for (const Span& s : spans) {
    int l = 0;
    for (;; ++l) {
      if (l == static_cast<int>(open.size())) open.emplace_back();
      std::vector<double>& ends = open[l];
      while (!ends.empty() && ends.back() <= s.start_ms) ends.pop_back();
      if (ends.empty() || s.end_ms <= ends.back()) break;
    }
    open[l].push_back(s.end_ms);
    lane.push_back(l);
  }
  return lane;
}

json meta(const char* what, int pid, int tid, const json& args) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", args}};
}

// The trace: times in us. Virtual clocks start at 0 on every rank (shared zero); real ranks' clocks each
// have their own zero, so each rank is shifted to start at its first recorded instant.
json to_trace(Run& run, const std::string& clock) {
  json events = json::array();
  for (Rank& r : run.ranks) {
    double t0 = 0;
    if (!run.virtual_time) {
      bool first = true;
      for (const std::vector<Span>* v : {&r.compute, &r.comm})
        for (const Span& s : *v)
          if (first || s.start_ms < t0) t0 = s.start_ms, first = false;
    }
    events.push_back(meta("process_name", r.rank, 0, {{"name", "rank " + std::to_string(r.rank)}}));
    events.push_back(meta("process_sort_index", r.rank, 0, {{"sort_index", r.rank}}));
    const struct {
      std::vector<Span>* spans;
      const char* stream;
      int tid0;  // compute lanes are threads 1, 2, ...; comm lanes 101, 102, ...
    } streams[] = {{&r.compute, "compute", 1}, {&r.comm, "comm", 101}};
    for (const auto& st : streams) {
      const std::vector<int> lane = lanes_of(*st.spans);
      int lanes = 0;
      for (size_t i = 0; i < st.spans->size(); ++i) {
        const Span& s = (*st.spans)[i];
        lanes = std::max(lanes, lane[i] + 1);
        events.push_back({{"ph", "X"},
                          {"name", s.name},
                          {"cat", st.stream},
                          {"pid", r.rank},
                          {"tid", st.tid0 + lane[i]},
                          {"ts", 1e3 * (s.start_ms - t0)},
                          {"dur", 1e3 * std::max(0.0, s.end_ms - s.start_ms)},
                          {"args", s.args}});
      }
      for (int l = 0; l < std::max(lanes, 1); ++l) {
        const std::string name = std::string(st.stream) + (l == 0 ? "" : " " + std::to_string(l + 1));
        events.push_back(meta("thread_name", r.rank, st.tid0 + l, {{"name", name}}));
        events.push_back(meta("thread_sort_index", r.rank, st.tid0 + l, {{"sort_index", st.tid0 + l}}));
      }
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", {{"clock", clock}}}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A run's per-rank timelines as a Chrome trace (trace.json) for https://ui.perfetto.dev"};
  std::string dir, out;
  app.add_option("run", dir, "the run folder: runs/<lab>/<run id> (its rank*.jsonl)")->required();
  app.add_option("--out", out, "where to write the trace (default: <run>/trace.json)");
  CLI11_PARSE(app, argc, argv);
  try {
    Run run = read_run(dir);
    const std::string clock = run.virtual_time ? (run.gpu.empty() ? "simulated GPU" : run.gpu) + ", virtual time"
                                               : "real time (wall clock)";
    if (out.empty()) out = (fs::path(dir) / "trace.json").string();
    const json trace = to_trace(run, clock);
    std::ofstream f(out);
    SL_CHECK_HINT(f.good(), "give --out a writable path", "sl_trace: cannot write '%s'", out.c_str());
    f << trace.dump() << "\n";
    size_t spans = 0, calls = 0;
    for (const Rank& r : run.ranks) spans += r.compute.size(), calls += r.comm.size();
    std::printf("sl_trace: %zu rank(s), %zu compute spans, %zu communication calls; %s%s\n", run.ranks.size(), spans,
                calls, clock.c_str(),
                run.virtual_time ? " (every rank's clock starts at 0)"
                                 : " (each rank's own clock, shifted to start at its first recorded instant)");
    if (run.pending > 0) std::printf("sl_trace: %d call(s) still in flight when logged, not drawn\n", run.pending);
    std::printf("sl_trace: wrote %s: open it in https://ui.perfetto.dev or chrome://tracing\n", out.c_str());
    return 0;
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
