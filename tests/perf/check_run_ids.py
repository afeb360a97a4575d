#!/usr/bin/env python3
"""tests/perf/check_run_ids.py — a lab's two speed checks, run at once, keep their runs apart.

  python3 tests/perf/check_run_ids.py --build-dir build

The grader runs checks in parallel (scripts/grade --jobs), and lab 03 (like labs 04 and 07) has two speed checks
whose simulated runs once shared one run id: one run's remove_all and .out file could be the other's, and a
learner's "not implemented" record then lost the file it names (seen in CI: "lab03-? ... tests/perf/
perf_compare.cpp"). Runs lab 03's two reference speed checks at the same time and asserts both pass and each left
its own run directories (<build>/perf-runs/reference/lab03/lab03-sim-{track,ref}-<check>/, perf_compare.cpp
run_sim), each with a rank 0 log. ctest perf.run_ids_per_check.
"""
import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = ("ThroughputVsReference", "MfuAtGpt2Small")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    build = os.path.abspath(ap.parse_args().build_dir)
    program = os.path.join(build, "tests", "bin", "reference", "test_lab03_perf")
    env = dict(os.environ, SL_SOURCE_DIR=REPO)
    procs = [subprocess.Popen([program, f"--gtest_filter=Lab03Perf.{name}"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for name in CHECKS]
    problems = []
    for name, proc in zip(CHECKS, procs):
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            problems.append(f"Lab03Perf.{name} exited {proc.returncode}:\n{out[-2000:]}")
    for name in CHECKS:
        for kind in ("track", "ref"):
            log = os.path.join(build, "perf-runs", "reference", "lab03", f"lab03-sim-{kind}-{name}", "rank0.jsonl")
            if not os.path.isfile(log):
                problems.append(f"no run directory of its own for Lab03Perf.{name} ({kind}): {log} is missing")
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"PASS: {', '.join(CHECKS)} ran at once, each in its own run directories")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
