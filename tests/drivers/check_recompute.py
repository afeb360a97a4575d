#!/usr/bin/env python3
"""check_recompute.py — --recompute through the lab drivers (gpt2.h Recompute; docs/memory.md "Activation recompute").

  python3 tests/drivers/check_recompute.py --build-dir build [--only lab05]

For each case (a data-parallel, ZeRO-3, tensor- and sequence-parallel, pipeline and 3D run of the reference
programs) it trains 3 steps with --recompute none, selective and full and checks, from the logs:
  - every step's loss and gradient norm are the same JSON values (bit for bit) in the three modes: the
    backward's re-run, with its tensor-parallel collectives and under ZeRO-3's gathered parameters, computes
    exactly what the forward did;
  - rank 0's peak activation bytes fall: full < selective < none;
  - the run record's config says the mode, and the step records carry an `hfu` at least the `mfu`.
Then an unknown mode must stop every rank of a 2-rank run with the accepted names and a non-zero exit.
Exit 0 when all hold, 1 naming each failure. About 15 s on 2 cores (66 s before the runs shared one
CPU peak file: --calibration).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON = ["--model", "tiny", "--seq-len", "16", "--steps", "3", "--val-every", "0", "--val-batches", "1",
          "--sample-tokens", "0", "--threads", "1", "--quiet"]
# name, program, ranks, arguments
CASES = [
    ("lab03 dp 2 overlap", "lab03_ddp", 2, ["--micro-batch", "2", "--mode", "overlap"]),
    ("lab04 ZeRO-3", "lab04_fsdp", 2, ["--micro-batch", "2", "--stage", "3"]),
    ("lab05 tp 2 + sequence parallel", "lab05_tensor_parallel", 2, ["--tp", "2", "--micro-batch", "2",
                                                                    "--sequence-parallel"]),
    ("lab06 pp 2 1f1b", "lab06_pipeline_parallel", 2, ["--micro-batch", "2", "--micro-batches", "4"]),
    ("lab07 tp 2 x pp 2", "lab07_parallel_3d", 4, ["--tp", "2", "--pp", "2", "--micro-batch", "2",
                                                   "--micro-batches", "2"]),
]
MODES = ["none", "selective", "full"]


def launch(build, program, ranks, args):
    exe = os.path.join(build, "bin", "reference", program)
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", exe] + args
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)


def records(logs, lab, run_id, rank=0):
    with open(os.path.join(logs, lab, run_id, f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--only", default="", help="cases whose name contains this")
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="sl-recompute-") as logs:
        # One CPU peak for every run (its MFU is not what is checked here): without a --calibration file each
        # rank of each run re-checks the cached peak with a quick sgemm call (it was 5 of a 4-rank run's 6 s on 2
        # cores when that check timed every shape).
        peak = os.path.join(logs, "calibration")
        subprocess.run([os.path.join(a.build_dir, "bin", "sl_calibrate"), "--threads", "1", "--seconds", "0.2",
                        "--cache-dir", peak], cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        calibration = ["--calibration", os.path.join(peak, "cpu_1t.json")]
        for name, program, ranks, extra in CASES:
            if a.only not in name:
                continue
            lab = program.split("_")[0]
            seen = {}
            for mode in MODES:
                run_id = f"{lab}-{mode}"
                p = launch(a.build_dir, program, ranks, COMMON + extra + calibration + [
                    "--data", a.data, "--log-dir", logs, "--run-id", run_id, "--recompute", mode])
                if p.returncode != 0:
                    failures.append(f"{name}, --recompute {mode}: exit {p.returncode}\n{p.stdout[-1500:]}")
                    break
                recs = records(logs, lab, run_id)
                run = [r for r in recs if r["type"] == "run"][0]
                steps = [r for r in recs if r["type"] == "step"]
                if run["config"].get("recompute") != mode:
                    failures.append(f"{name}: the run record's config.recompute is {run['config'].get('recompute')!r}, "
                                    f"not {mode!r}")
                for s in steps:
                    if s.get("mfu") is not None and not (s.get("hfu") is not None and s["hfu"] >= s["mfu"]):
                        failures.append(f"{name}, {mode}: step {s['step']} hfu {s.get('hfu')} below mfu {s['mfu']}")
                        break
                seen[mode] = {
                    "training": [(s["step"], s["loss"], s.get("grad_norm")) for s in steps],
                    "activations": max(s.get("memory_activations_peak_bytes", 0) for s in steps),
                }
            if len(seen) < len(MODES):
                continue
            for mode in ("selective", "full"):
                if seen[mode]["training"] != seen["none"]["training"]:
                    failures.append(f"{name}: --recompute {mode} trains differently from none:\n"
                                    f"  none {seen['none']['training']}\n  {mode} {seen[mode]['training']}")
            act = [seen[m]["activations"] for m in MODES]
            print(f"{name:<32} losses equal: {all(seen[m]['training'] == seen['none']['training'] for m in MODES)}; "
                  f"rank 0 activation peak none {act[0]}, selective {act[1]}, full {act[2]} bytes")
            if not act[2] < act[1] < act[0]:
                failures.append(f"{name}: activation peaks not full < selective < none: {act}")

        if not a.only or "unknown" in a.only:
            p = launch(a.build_dir, "lab05_tensor_parallel", 2, COMMON + ["--tp", "2", "--micro-batch", "2", "--data",
                                                                          a.data, "--log-dir", logs, "--recompute",
                                                                          "some"])
            ok = p.returncode != 0 and "'some'" in p.stdout and "selective" in p.stdout and "full" in p.stdout
            print(f"{'unknown --recompute':<32} exit {p.returncode}, names the accepted values: {ok}")
            if not ok:
                failures.append(f"--recompute some: exit {p.returncode}, output:\n{p.stdout[-1500:]}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
