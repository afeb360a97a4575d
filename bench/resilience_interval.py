#!/usr/bin/env python3
"""bench/resilience_interval.py — effective training time against the checkpoint interval (lab 08).

  python3 bench/resilience_interval.py [--build-dir build] [--track reference] [--np 2] [--steps 400]
                                       [--intervals 10 50 200] [--mtbf-s 10] [--uniform-compute-ms 15]
                                       [--model tiny] [--seed 1337]

For each checkpoint interval, runs the lab 08 program under scripts/supervise with failures as a Poisson
process in wall time (--fail-mtbf-s: every attempt is killed after an exponential time of mean MTBF), until
--steps steps are done, and prints one table: the supervisor's wall time, the time of the steps that count,
the effective training time (their ratio), restarts and repeated steps, the measured cost of one checkpoint
(C, the median of the program's "checkpoint ... in X ms" lines) and of one restart (R: from an attempt's
start to its first heartbeat), beside Young's optimal interval sqrt(2 C M) (Young 1974; Daly 2006 refines it
to sqrt(2 C M) - C) and the first-order model of the efficiency, 1 / (1 + C/tau + (tau/2 + R)/M), for an
interval of tau seconds of steps. Steps take a fixed time (--uniform-compute-ms per micro-batch forward,
twice that backward), so the intervals compare alike. A few minutes on 2 cores.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_interval(args, interval, work):
    ckpt = os.path.join(work, f"ckpt_{interval}")
    hb = os.path.join(work, f"hb_{interval}")
    report = os.path.join(work, f"report_{interval}.json")
    program = os.path.join(args.build_dir, "bin", args.track, "lab08_resilience")
    job = ["mpirun", "-np", str(args.np), "--oversubscribe", "--bind-to", "none", program, "--model", args.model,
           "--seq-len", "16", "--micro-batch", "2", "--micro-batches", "1", "--steps", str(args.steps),
           "--checkpoint-every", str(interval), "--keep-last", "2", "--resume", "latest", "--val-every", "0",
           "--val-batches", "1", "--spike-z", "0", "--straggler-window", "0", "--uniform-compute-ms",
           str(args.uniform_compute_ms), "--fail-mtbf-s", str(args.mtbf_s), "--fail-rank", str(args.np - 1),
           "--seed", str(args.seed), "--checkpoint-dir", ckpt, "--log-dir", os.path.join(work, "logs")]
    cmd = [os.path.join(REPO, "scripts", "supervise"), "--max-restarts", "1000", "--backoff-s", "0",
           "--heartbeat-timeout-s", "60", "--heartbeat-dir", hb, "--report", report, "--"] + job
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    with open(report) as f:
        rep = json.load(f)
    if not rep["finished"]:
        sys.exit(f"interval {interval}: the job did not finish:\n{out[-3000:]}")
    ckpt_ms = [float(m) for m in re.findall(r"checkpoint \S+ in (\d+) ms", out)]
    # Restart cost: each attempt's start to its first heartbeat (rank 0's beats carry the attempt number).
    first = {}
    with open(os.path.join(hb, "rank_0.beats")) as f:
        for line in f:
            b = json.loads(line)
            first.setdefault(b["attempt"], b["wall_ms"] / 1e3 - b["step_ms"] / 1e3)
    starts = {a["attempt"]: rep["started_unix"] + a["start_s"] for a in rep["attempts"]}
    restart_s = [first[a] - starts[a] for a in first if a in starts]
    return rep, (statistics.median(ckpt_ms) / 1e3 if ckpt_ms else 0.0), (statistics.median(restart_s) if restart_s else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--track", choices=["reference", "learner"], default="reference")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--intervals", type=int, nargs="+", default=[10, 50, 200])
    ap.add_argument("--mtbf-s", type=float, default=10.0, help="mean time between failures of the job, seconds")
    ap.add_argument("--uniform-compute-ms", type=float, default=15.0)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    if shutil.which("mpirun") is None:
        sys.exit("resilience_interval: needs mpirun (scripts/install_deps.sh)")
    work = tempfile.mkdtemp(prefix="sl_interval_")
    rows = []
    for interval in args.intervals:
        rep, c_s, r_s = run_interval(args, interval, work)
        step_s = rep["useful_s"] / max(1, rep["steps_counted"])
        tau = interval * step_s
        model = 1.0 / (1.0 + c_s / tau + (tau / 2 + r_s) / args.mtbf_s)
        rows.append((interval, rep, c_s, r_s, step_s, model))
        print(f"interval {interval}: {100 * rep['effective_training_time']:.1f} % effective, "
              f"{rep['restarts']} restarts, {rep['steps_repeated']} steps repeated", flush=True)
    c_med = statistics.median(r[2] for r in rows)
    r_med = statistics.median(r[3] for r in rows)
    step_med = statistics.median(r[4] for r in rows)
    young = math.sqrt(2 * c_med * args.mtbf_s)
    print(f"\n{args.np} ranks, model {args.model}, {args.steps} steps of {1e3 * step_med:.0f} ms, failures with MTBF "
          f"{args.mtbf_s:g} s; checkpoint C = {1e3 * c_med:.0f} ms, restart R = {r_med:.2f} s\n")
    print("| interval (steps) | interval (s) | wall s | steps counted | repeated | restarts | effective | model |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for interval, rep, c_s, r_s, step_s, model in rows:
        print(f"| {interval} | {interval * step_s:.2f} | {rep['wall_s']:.1f} | {rep['steps_counted']} | "
              f"{rep['steps_repeated']} | {rep['restarts']} | {100 * rep['effective_training_time']:.1f} % | "
              f"{100 * model:.1f} % |")
    print(f"\nYoung: sqrt(2 C M) = {young:.2f} s = {young / step_med:.0f} steps (Daly: {young - c_med:.2f} s); "
          f"model = 1 / (1 + C/tau + (tau/2 + R)/M)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
