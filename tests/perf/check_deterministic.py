#!/usr/bin/env python3
"""tests/perf/check_deterministic.py — the graded speed checks measure the same bits every time, busy or not.

  python3 tests/perf/check_deterministic.py --build-dir build [--all]

Runs reference-track speed checks (tests/bin/reference/test_labNN_perf, each one simulated run of the "track"
and one of the reference) twice: by default three, one of each kind the virtual clock times (lab 03's
throughput check: real arithmetic on 2 simulated GPUs; lab 04's and lab 06's MFU checks: timing-only, FSDP and
a pipeline), about 25 s on 2 cores; with --all every speed check of labs 03-07 (eight, about 100 s, lab 07's
16-rank check the longest). Each runs the second time beside two busy loops
(`yes > /dev/null`, on 2 cores: a machine with no core to spare), then compares between the rounds every check's
measured text (its record's check_measured) and the figures it was computed from: tokens_per_s, mfu, comm_ms,
comm_busy_ms and mean_step_ms of every rank's summary (JSON numbers as the programs wrote them, so equal means
equal bits). Exit 0 only if all are equal. ctest perf.sim_checks_deterministic (tests/perf/CMakeLists.txt).
To see it fail: add --device cpu (the same checks' figures in real time differ between runs; the MFU checks'
timing-only runs refuse --device cpu, which fails the round too).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (lab, test program, gtest filter): the speed checks, not lab 04's memory check (no timing in it); the MFU
# checks at the lesson's sizes run timing only (--timing-only: a --device cpu round is refused, and fails).
CHECKS = [("lab03", "test_lab03_perf", "Lab03Perf.ThroughputVsReference"),  # default: this one, lab 04's and lab 06's MFU
          ("lab03", "test_lab03_perf", "Lab03Perf.MfuAtGpt2Small"),
          ("lab04", "test_lab04_perf", "Lab04Perf.ThroughputVsReference"),
          ("lab04", "test_lab04_perf", "Lab04Perf.MfuAtGpt2Xl"),
          ("lab05", "test_lab05_perf", "Lab05Perf.MfuAtGpt7b"),
          ("lab06", "test_lab06_perf", "Lab06Perf.MfuAtGpt7b"),
          ("lab07", "test_lab07_perf", "Lab07Perf.ThroughputVsReference"),
          ("lab07", "test_lab07_perf", "Lab07Perf.MfuAtGpt7b")]
DEFAULT = {"Lab03Perf.ThroughputVsReference", "Lab04Perf.MfuAtGpt2Xl", "Lab06Perf.MfuAtGpt7b"}
FIGURES = ("tokens_per_s", "mfu", "comm_ms", "comm_busy_ms", "mean_step_ms")


def run_round(build, name, out_dir, extra_env, checks):
    """{"lab03 TestName": (measured text, {run: [per-rank figures]})} of one run of every check in `checks`."""
    seen = {}
    for lab, program, gtest_filter in checks:
        key = f"{lab} {gtest_filter.split('.')[1]}"
        record = os.path.join(out_dir, f"{name}-{lab}-{gtest_filter.split('.')[1]}.json")
        env = dict(os.environ, SL_SOURCE_DIR=REPO, **extra_env)
        t0 = time.monotonic()
        proc = subprocess.run([os.path.join(build, "tests", "bin", "reference", program),
                               f"--gtest_filter={gtest_filter}", f"--gtest_output=json:{record}"],
                              env=env, capture_output=True, text=True)
        print(f"{name}: {key} exit {proc.returncode}, {time.monotonic() - t0:.1f} s", flush=True)
        if proc.returncode != 0:
            sys.exit(f"check_deterministic: {program} failed in the {name} round:\n{proc.stdout[-3000:]}")
        with open(record) as f:
            suite = json.load(f)["testsuites"][0]["testsuite"][0]
        runs = {}
        for kind in ("track", "ref"):
            run_dir = f"{lab}-sim-{kind}-{gtest_filter.split('.')[1]}"  # perf_compare.cpp run_sim's id
            ranks = sorted(glob.glob(os.path.join(build, "perf-runs", "reference", lab, run_dir, "rank*.jsonl")))
            figures = []
            for path in ranks:
                with open(path) as f:
                    summary = [json.loads(line) for line in f if '"summary"' in line][-1]
                figures.append([summary.get(k) for k in FIGURES])
            runs[kind] = figures
        seen[key] = (suite.get("check_measured", ""), runs)
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--all", action="store_true", help="every speed check of labs 03-07, not the three defaults")
    ap.add_argument("--device", default="", help="cpu: run the checks' programs on CPU (shows this check failing)")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    out_dir = os.path.join(build, "perf-runs", "deterministic")
    os.makedirs(out_dir, exist_ok=True)
    env = {"SL_PERF_TRACK_ARGS": f"--device {a.device}"} if a.device else {}
    checks = [c for c in CHECKS if a.all or c[2] in DEFAULT]
    rounds = {"first": run_round(build, "first", out_dir, env, checks)}
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        rounds["busy"] = run_round(build, "busy", out_dir, env, checks)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    problems = []
    for name in ("busy",):
        for lab in rounds["first"]:
            if rounds[name][lab] != rounds["first"][lab]:
                problems.append(f"{lab}: the {name} round differs from the first:\n  first  {rounds['first'][lab]}\n"
                                f"  {name:<6} {rounds[name][lab]}")
    for p in problems:
        print(p)
    if not problems:
        for lab, (text, runs) in rounds["first"].items():
            print(f"{lab}: equal in both rounds: {text}; rank 0's [{', '.join(FIGURES)}] {runs['track'][0]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
