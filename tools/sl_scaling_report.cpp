// sl_scaling_report.cpp — bin/sl_scaling_report: "two devices give 1.4x instead of 2x: why?" from the
// logs of three kinds of runs (scripts/why_not_2x.sh makes them):
//   --single DIR   the model on 1 device (lab04_fsdp on 1 rank)          <log-dir>/lab04/<run-id>
//   --multi DIR    the same model on N devices with FSDP (N ranks)
//   --sweep DIR... 1-device runs at other micro-batches, same T (the batch sweep)
//   --json FILE    also write the figures and the verdict as JSON (scripts/quiz reads it)
//   --no-verdict   print the table only: the reader finds the cause
//   --blind        --no-verdict, and the header, sweep and notes without the runs' options (why_not_2x.sh --blind)
// Prints tokens/s, MFU, peak memory per rank, data-wait and exposed-comm shares, per-rank step and
// compute times for both, the scaling efficiency and the verdict of diagnose_scaling (bottleneck.h).
// Code: tools/scaling_report.cpp. Lesson: labs/04_fsdp/WHY_NOT_2X.md. Tests: tests/lab04_scaling/
#include <CLI/CLI.hpp>  // defines: CLI::App (command line)

#include <cstdio>
#include <fstream>  // defines: std::ofstream (--json)
#include <string>
#include <vector>

#include "scalelab/measure/bottleneck.h"  // defines: diagnose_scaling, format_verdict
#include "scalelab/core/error.h"          // defines: scalelab::Error, SL_CHECK_HINT
#include "scaling_report.h"               // defines: read_run, make_evidence, format_report

int main(int argc, char** argv) {
  CLI::App app{"Why not 2x? The 1-device run, the N-device run and a batch sweep -> the table and the verdict"};
  std::string single_dir, multi_dir, expect, json_path;
  bool no_verdict = false, blind = false;
  std::vector<std::string> sweep_dirs;
  app.add_option("--single", single_dir, "run folder of the 1-device run (<log-dir>/lab04/<run-id>)")->required();
  app.add_option("--multi", multi_dir, "run folder of the N-device run")->required();
  app.add_option("--sweep", sweep_dirs, "run folders of 1-device runs at other micro-batches (same T)");
  app.add_option("--expect-culprit", expect,
                 "exit 1 unless this cause is marked CULPRIT: loader, comm, batch, "
                 "straggler (the end-to-end checks)")
      ->check(CLI::IsMember({"loader", "comm", "batch", "straggler"}));
  app.add_option("--json", json_path, "also write the figures and the verdict to this JSON file");
  app.add_flag("--no-verdict", no_verdict, "print the table without the verdict (find the cause yourself)");
  app.add_flag("--blind", blind,
               "--no-verdict, and leave out the runs' B, T, overlap, link and notes (the same header for every "
               "provoked cause)");
  CLI11_PARSE(app, argc, argv);

  try {
    using namespace scalelab;
    const scaling::RunSummary single = scaling::read_run(single_dir);
    const scaling::RunSummary multi = scaling::read_run(multi_dir);
    std::vector<scaling::RunSummary> sweep;
    for (const std::string& d : sweep_dirs) sweep.push_back(scaling::read_run(d));
    std::vector<std::string> notes;
    const ScalingEvidence ev = scaling::make_evidence(single, multi, sweep, &notes);
    const Verdict v = diagnose_scaling(ev);
    std::printf("%s", scaling::format_report(single, multi, ev, v, notes, !no_verdict && !blind, !blind).c_str());
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << scaling::report_json(single, multi, v).dump(2) << "\n";
      SL_CHECK_HINT(f.good(), "check that its folder exists and is writable", "cannot write %s", json_path.c_str());
    }
    if (!expect.empty()) {
      const CauseFinding& f = v.findings.at(scaling::cause_order_from_name(expect) - 1);
      std::printf("check: provoked '%s' -> cause %d (%s) %s\n", expect.c_str(), f.order, f.cause.c_str(),
                  f.culprit ? "is marked CULPRIT: PASS" : "is NOT marked culprit: FAIL");
      return f.culprit ? 0 : 1;
    }
    return 0;
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
