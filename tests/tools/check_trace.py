#!/usr/bin/env python3
"""check_trace.py — bin/sl_trace on the 2-rank fixture run tests/fixtures/trace_run (ctest tools.sl_trace).
Passes when
  - the trace is Chrome trace-event JSON: a traceEvents list of "M" (metadata) and "X" (complete) events,
    every X with a name, a pid (the rank), a tid, ts and dur in microseconds (dur >= 0);
  - processes are named "rank 0", "rank 1", threads "compute" and "comm", and the two all-reduces of rank 0
    in flight at once take two comm lanes ("comm", "comm 2");
  - rank 0's "all_reduce bucket 0" sits at 3000 us for 1250 us (virtual times are not shifted), the call
    still in flight (end_ms null) is not drawn, and lab 07's step group_calls are drawn (rank 1's "loss (dp)");
  - the output says "simulated H100 SXM, virtual time"; without the run's clock it says "real time" and each
    rank starts at 0;
  - a folder that is not there, or has no rank*.jsonl, exits non-zero naming it.
  check_trace.py --sl-trace build/bin/sl_trace
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "trace_run")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(tool, *args):
    r = subprocess.run([tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return r.returncode, r.stdout, r.stderr


def shape(trace):
    """Every event of a Chrome trace as the viewers need it; returns the X events."""
    events = trace.get("traceEvents")
    check(isinstance(events, list) and events, "traceEvents is a non-empty list")
    xs = []
    for e in events or []:
        check(e.get("ph") in ("M", "X"), f"ph is M or X: {e}")
        check(isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), f"pid and tid are ints: {e}")
        check(isinstance(e.get("name"), str) and e["name"], f"a name: {e}")
        if e.get("ph") == "X":
            check(isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0,
                  f"ts and dur are numbers, dur >= 0: {e}")
            xs.append(e)
    return xs


def names(trace, what):
    """{(pid, tid): name} of the metadata records `what` (process_name, thread_name)."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == what}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sl-trace", required=True, help="the tool: <build>/bin/sl_trace")
    tool = ap.parse_args().sl_trace
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trace.json")
        rc, stdout, stderr = run(tool, FIXTURE, "--out", out)
        check(rc == 0, f"exit 0 on the fixture (got {rc}: {stderr.strip()})")
        check("simulated H100 SXM, virtual time" in stdout, f"says virtual time: {stdout!r}")
        check("1 call(s) still in flight" in stdout, f"says the pending call is not drawn: {stdout!r}")
        trace = json.load(open(out))
        xs = shape(trace)
        procs = names(trace, "process_name")
        check(sorted(set(procs.values())) == ["rank 0", "rank 1"], f"processes rank 0 and rank 1: {procs}")
        threads = names(trace, "thread_name")
        rank0 = sorted(n for (pid, _), n in threads.items() if pid == 0)
        check(rank0 == ["comm", "comm 2", "compute"], f"rank 0's threads compute, comm, comm 2: {rank0}")
        by = {(e["pid"], e["name"]): e for e in xs}
        b0 = by.get((0, "all_reduce bucket 0"), {})
        check(b0.get("ts") == 3000 and b0.get("dur") == 1250, f"bucket 0 at 3000 us for 1250 us: {b0}")
        check(b0.get("args", {}).get("wait_ms") == 0.25 and b0.get("cat") == "comm", f"its args and cat: {b0}")
        b1 = by.get((0, "all_reduce bucket 1"), {})
        check(b1.get("tid") != b0.get("tid"), "the two overlapping calls on different lanes")
        check((0, "all_reduce grad norm") not in by, "the call in flight is not drawn")
        check((1, "all_reduce loss (dp)") in by, "lab 07's group_calls are drawn")
        check(by.get((0, "backward"), {}).get("cat") == "compute", "compute spans in cat compute")
        check(len(xs) == 8, f"8 complete events (4 compute, 4 calls): {len(xs)}")

        # The same run without its clock: real time, each rank from its first instant.
        real = os.path.join(tmp, "real")
        os.mkdir(real)
        for f in ("rank0.jsonl", "rank1.jsonl"):
            lines = [json.loads(x) for x in open(os.path.join(FIXTURE, f)) if x.strip()]
            for rec in lines:
                for k in ("clock", "device", "sim_gpu_name"):
                    rec.pop(k, None)
            open(os.path.join(real, f), "w").write("".join(json.dumps(r) + "\n" for r in lines))
        rc, stdout, _ = run(tool, real)
        check(rc == 0 and "real time" in stdout, f"says real time: {stdout!r}")
        xs = shape(json.load(open(os.path.join(real, "trace.json"))))
        for pid in (0, 1):
            check(min(e["ts"] for e in xs if e["pid"] == pid) == 0, f"rank {pid} starts at 0 in real time")

        rc, _, stderr = run(tool, os.path.join(tmp, "no-such-run"))
        check(rc != 0 and "no run folder" in stderr, f"a missing folder: non-zero and named ({rc}, {stderr!r})")
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        rc, _, stderr = run(tool, empty)
        check(rc != 0 and "no rank*.jsonl" in stderr, f"a folder without logs: non-zero and named ({rc}, {stderr!r})")
        shutil.rmtree(real)
    for f in failures:
        print("FAIL:", f)
    print("check_trace: %s" % ("ok" if not failures else f"{len(failures)} failure(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
