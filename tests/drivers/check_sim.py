#!/usr/bin/env python3
"""check_sim.py — the lab programs on the simulated GPU cluster (--device sim, docs/simulation.md): CI's stand-in
for the GPU path.

  python3 tests/drivers/check_sim.py --build-dir build --lab 03      one lab's run (its manifest's "sim" field)
  python3 tests/drivers/check_sim.py --build-dir build --determinism the same run three times, bit for bit
  python3 tests/drivers/check_sim.py --build-dir build --refusals    bad device/backend pairs stop every rank

--lab NN runs lab NN's reference program with the manifest's "sim" ranks and arguments (labs/NN_name/lab.json),
a training program on a tiny model for a few steps (lab 00's probe: its collective sweep), with --device sim (and --backend sim on more than one rank), and checks from its
output and every rank's log that the run says what it ran on: the run record (device "sim", sim_gpu h100,
simulated, clock "virtual"), every step record (simulated, clock "virtual", a step time, tokens/s and MFU), the
summary record and the printed summary ("simulated H100 SXM, virtual time"), and the step records' memory counts
are the simulated GPU's (not the host allocator's, which holds none of the model).
--determinism runs lab 03 on 2 simulated ranks twice, then again with two busy loops (`yes > /dev/null`) beside
it, and compares every rank's step times, tokens/s, MFU, HFU and exposed communication, and the summaries' tokens/s
and MFU: equal as JSON values (bit for bit). --device cpu makes the same comparison on real time, which fails:
that is how the check was shown able to fail.
--refusals: --backend sim without --device sim and --device sim with --backend mpi end both ranks of a 2-rank run
with a non-zero exit and a message naming the option to change; --device sim alone (--backend auto) on 2 ranks
runs on the sim backend.
Exit 0 when all hold, 1 naming each failure. Each case prints its wall time (CI's cost).
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import labs  # noqa: E402  (scripts/lib/labs.py: the manifests)

TINY = ["--model", "tiny", "--seq-len", "16", "--steps", "4", "--val-every", "0", "--val-batches", "1",
        "--sample-tokens", "0", "--threads", "1", "--quiet"]
LABEL = "simulated H100 SXM, virtual time"
TIMED = ("step_ms", "tokens_per_s", "mfu", "hfu", "comm_ms", "data_wait_ms")  # what must repeat bit for bit


def launch(build, program, ranks, args, timeout=240, every_rank=False, exe=None):
    """The reference program on `ranks` ranks (mpirun unless 1): (exit code, stdout + stderr, wall seconds).
    every_rank: mpirun lets every rank run to its own end after one fails (each rank's refusal is then seen;
    mpirun's own exit is 0 that way, so the exit code comes from a run without it)."""
    exe = exe or os.path.join(build, "bin", "reference", program)
    cmd = [exe] + args
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + (
            ["--mca", "orte_abort_on_non_zero_status", "0"] if every_rank else []) + cmd
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout, time.monotonic() - t0


def records(logs, lab, run_id, rank):
    with open(os.path.join(logs, lab, run_id, f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def program_of(lab):
    return f"lab{lab['number']}_{lab['name']}"


def run_says_so(recs, where):
    """The problems with one rank's run record of a simulated run (lab 00's probe: no steps)."""
    run = next((r for r in recs if r["type"] == "run"), None)
    if run is None:
        return [f"{where}: no run record"]
    want = {"device": "sim", "sim_gpu": "h100", "sim_gpu_name": "simulated H100 SXM", "simulated": True,
            "clock": "virtual"}
    return [f"{where}: the run record's {k} is {run.get(k)!r}, not {v!r}" for k, v in want.items() if run.get(k) != v]


def says_so(recs, where):
    """The problems with one rank's records of a simulated run (empty: it says so everywhere)."""
    problems = []
    run = next((r for r in recs if r["type"] == "run"), None)
    steps = [r for r in recs if r["type"] == "step"]
    summary = next((r for r in recs if r["type"] == "summary"), None)
    if run is None or summary is None or not steps:
        return [f"{where}: no run, step or summary record"]
    problems += run_says_so(recs, where)
    if "virtual time" not in run.get("peak_source", ""):
        problems.append(f"{where}: peak_source {run.get('peak_source')!r} does not say virtual time")
    for s in steps:
        if s.get("simulated") is not True or s.get("clock") != "virtual":
            problems.append(f"{where}: step {s['step']} says simulated {s.get('simulated')}, clock {s.get('clock')}")
            break
        if not all(isinstance(s.get(k), (int, float)) and math.isfinite(s[k]) and s[k] > 0
                   for k in ("step_ms", "tokens_per_s", "mfu")):
            problems.append(f"{where}: step {s['step']}: step_ms {s.get('step_ms')}, tokens_per_s "
                            f"{s.get('tokens_per_s')}, mfu {s.get('mfu')}: not all > 0")
            break
        if "host_data_wait_ms" not in s:
            problems.append(f"{where}: step {s['step']} has no host_data_wait_ms (the loader's real wait)")
            break
        if not s.get("memory_current_bytes"):  # the simulated GPU's allocator, not the host's (empty there)
            problems.append(f"{where}: step {s['step']}: memory_current_bytes {s.get('memory_current_bytes')}, "
                            f"not the simulated GPU's bytes")
            break
    if summary.get("simulated") is not True or summary.get("clock") != "virtual":
        problems.append(f"{where}: the summary says simulated {summary.get('simulated')}, clock "
                        f"{summary.get('clock')}")
    return problems


def check_lab(a, number, logs):
    lab = labs.find(number, ROOT, a.build_dir)
    if lab is None or not lab["sim"]:
        return [f"lab {number}: no \"sim\" field in its lab.json"]
    ranks, extra = lab["sim"]["ranks"], lab["sim"].get("args", [])
    run_id = f"sim-{number}"
    backend = ["--backend", "sim"] if ranks > 1 else []
    training = lab["corpus"]  # a training program (01-08); lab 00's probe sweeps collectives only
    common = TINY + ["--data", a.data] if training else []
    exe = ((lab.get("programs") or {}).get("reference") or {}).get("path")  # <build>/labs.json (lab 00: bin/)
    rc, out, wall = launch(a.build_dir, program_of(lab), ranks, common + extra + ["--device", "sim"] + backend + [
        "--log-dir", logs, "--run-id", run_id], exe=exe)
    print(f"lab {number} on {ranks} simulated rank(s): exit {rc}, {wall:.1f} s")
    if rc != 0:
        return [f"lab {number}: exit {rc}\n{out[-2000:]}"]
    problems = [] if LABEL in out else [f"lab {number}: the output does not say '{LABEL}'"]
    # One log per rank; lab 02 logs each loader's run apart (<run id>-kit, <run id>-naive).
    runs = sorted(glob.glob(os.path.join(logs, f"lab{number}", run_id + "*")))
    if not runs:
        problems.append(f"lab {number}: no log under {logs}/lab{number}/{run_id}*")
    for run_dir in runs:
        for rank in range(ranks):
            where = f"lab {number} {os.path.basename(run_dir)} rank {rank}"
            recs = records(logs, f"lab{number}", os.path.basename(run_dir), rank)
            problems += says_so(recs, where) if training else run_says_so(recs, where)
            link = recs[0].get("config", {}).get("link") if recs else None
            if ranks > 1 and link == "none":  # --link none must keep the sim backend's own links (nvlink)
                problems.append(f"{where}: config.link is 'none': the sim backend's default links were wiped")
    return problems


def timed_figures(logs, run_id, ranks):
    """Every rank's step figures and summary tokens/s and MFU, as the logs hold them (JSON values)."""
    out = {}
    for rank in range(ranks):
        recs = records(logs, "lab03", run_id, rank)
        out[rank] = {"steps": [[s["step"]] + [s.get(k) for k in TIMED] for s in recs if s["type"] == "step"],
                     "summary": [(r.get("tokens_per_s"), r.get("mfu")) for r in recs if r["type"] == "summary"]}
    return out


def check_determinism(a, logs):
    ranks, problems, seen = 2, [], {}
    args = TINY + ["--micro-batch", "2", "--mode", "overlap", "--timeline-steps", "2", "--device", a.device,
                   "--data", a.data, "--log-dir", logs]
    if a.device == "sim":
        args += ["--backend", "sim"]
    for name in ("first", "second", "busy"):
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)] if name == "busy" else []
        try:
            rc, out, wall = launch(a.build_dir, "lab03_ddp", ranks, args + ["--run-id", f"det-{name}"])
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        print(f"determinism: lab 03 on {ranks} ranks ({a.device}), {name} run"
              f"{' beside two busy loops' if hogs else ''}: exit {rc}, {wall:.1f} s")
        if rc != 0:
            return [f"determinism, {name} run: exit {rc}\n{out[-2000:]}"]
        seen[name] = timed_figures(logs, f"det-{name}", ranks)
    for name in ("second", "busy"):
        for rank in range(ranks):
            for part in ("steps", "summary"):
                if seen[name][rank][part] != seen["first"][rank][part]:
                    problems.append(f"determinism: rank {rank}'s {part} differ between the first and the {name} "
                                    f"run ([step, {', '.join(TIMED)}]):\n  first  {seen['first'][rank][part]}\n"
                                    f"  {name:<6} {seen[name][rank][part]}")
    if not problems:
        steps = seen["first"][0]["steps"]
        print(f"determinism: equal bit for bit, e.g. rank 0 step {steps[-1][0]}: step_ms {steps[-1][1]!r}, "
              f"mfu {steps[-1][3]!r}")
    return problems


def check_refusals(a, logs):
    problems = []
    cases = (("--backend sim without --device sim", ["--backend", "sim"], "add --device sim"),
             ("--device sim with --backend mpi", ["--device", "sim", "--backend", "mpi"], "use --backend sim"))
    for name, extra, hint in cases:
        args = TINY + extra + ["--data", a.data, "--log-dir", logs]
        rc, _, _ = launch(a.build_dir, "lab03_ddp", 2, args)
        _, out, wall = launch(a.build_dir, "lab03_ddp", 2, args, every_rank=True)
        ranks_said = out.count(hint)
        print(f"refused: {name}: exit {rc}, the hint '{hint}' on {ranks_said} of 2 ranks, {wall:.1f} s")
        if rc == 0 or ranks_said != 2:
            problems.append(f"{name}: exit {rc}, hint '{hint}' printed {ranks_said} times (want 2):\n{out[-1500:]}")
    # ... and the pair that needs no --backend: auto under mpirun with --device sim is the sim backend
    rc, out, wall = launch(a.build_dir, "lab03_ddp", 2, TINY + ["--device", "sim", "--data", a.data, "--log-dir",
                                                                logs, "--run-id", "auto"])
    backend = records(logs, "lab03", "auto", 0)[0]["config"].get("backend") if rc == 0 else None
    print(f"--device sim, --backend auto on 2 ranks: exit {rc}, backend {backend!r}, {wall:.1f} s")
    if backend != "sim":
        problems.append(f"--device sim with --backend auto on 2 ranks: exit {rc}, backend {backend!r}, not 'sim'"
                        f"\n{out[-1500:]}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--lab", action="append", default=[], help="a lab number (repeatable)")
    ap.add_argument("--determinism", action="store_true")
    ap.add_argument("--refusals", action="store_true")
    ap.add_argument("--device", default="sim", help="--determinism's device (cpu: shows the check failing)")
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="sl-sim-") as logs:
        for number in a.lab:
            failures += check_lab(a, number, logs)
        if a.determinism:
            failures += check_determinism(a, logs)
        if a.refusals:
            failures += check_refusals(a, logs)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
