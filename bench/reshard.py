#!/usr/bin/env python3
"""bench/reshard.py — a checkpoint of one layout loaded by others (lab 08, README "Resharding").

  python3 bench/reshard.py [--build-dir build] [--steps 20] [--model demo] [--seq-len 64] [--source "dp 2 x tp 2"]

The --source layout (one of the table's; default 4 ranks of dp 2 x tp 2) trains --steps steps and writes a
checkpoint. Each target layout then loads it
(`--resume latest --reshard`; the source layout itself without --reshard) and trains --steps more steps on
the same global batches (2 micro-batches of B x dp = 4 sequences: lab 02's loader gives the same windows to
any B x dp of 4). The table shows, per layout, the load time, the largest gap of a step's loss from the
source layout going on at its own layout, and the gap of the mean loss over those steps. Exit status 1
when a layout fails to load or a step's gap exceeds --bound. A minute or two on 2 cores.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = [
    ("dp 2 x tp 2", 4, ["--tp", "2", "--micro-batch", "2"]),
    ("pp 2", 2, ["--pp", "2", "--micro-batch", "4"]),
    ("tp 2", 2, ["--tp", "2", "--micro-batch", "4"]),
    ("dp 2, ZeRO-1", 2, ["--micro-batch", "2", "--zero1"]),
    ("dp 1", 1, ["--micro-batch", "4"]),
    ("tp 2 x pp 2", 4, ["--tp", "2", "--pp", "2", "--micro-batch", "4"]),
    ("pp 2 x dp 2, ZeRO-1", 4, ["--pp", "2", "--micro-batch", "2", "--zero1"]),
]


def run(args, ckpt, logs, np_, extra, steps):
    program = os.path.join(args.build_dir, "bin", "reference", "lab08_resilience")
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", program, "--model", args.model,
           "--seq-len", str(args.seq_len), "--micro-batches", "2", "--steps", str(steps), "--val-every", "0",
           "--val-batches", "1", "--spike-z", "0", "--straggler-window", "0", "--threads", "1",
           "--log-dir", logs, "--checkpoint-dir", ckpt, "--checkpoint-every", str(args.steps)] + extra
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, p.stdout
    losses = {}
    for path in glob.glob(os.path.join(logs, "lab08", "*", "rank0.jsonl")):
        for line in open(path):
            r = json.loads(line)
            if r.get("type") == "step":
                losses[r["step"]] = r["loss"]
    return losses, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=20, help="steps before the checkpoint, and after it")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--bound", type=float, default=1e-4, help="largest gap of a step's loss allowed (nats)")
    ap.add_argument("--source", default=TARGETS[0][0], choices=[t[0] for t in TARGETS], help="the layout that writes it")
    args = ap.parse_args()
    SOURCE = next(t for t in TARGETS if t[0] == args.source)
    targets = [SOURCE] + [t for t in TARGETS if t != SOURCE]
    work = tempfile.mkdtemp(prefix="sl_reshard_")
    name, np_, extra = SOURCE
    source = os.path.join(work, "source")
    if run(args, source, os.path.join(source, "logs"), np_, extra, args.steps)[0] is None:
        sys.exit("reshard: the source run failed")
    step_dir = f"step_{args.steps:08d}"
    rows, base, ok = [], None, True
    for name, np_, extra in targets:
        d = os.path.join(work, re.sub(r"\W+", "_", name))
        shutil.copytree(os.path.join(source, step_dir), os.path.join(d, step_dir))
        flags = ["--resume", "latest"] + ([] if (name, np_, extra) == SOURCE else ["--reshard"])
        losses, out = run(args, d, os.path.join(d, "logs"), np_, extra + flags, 2 * args.steps)
        if losses is None:
            print(f"reshard: {name} failed:\n{out[-2000:]}", file=sys.stderr)
            ok = False
            continue
        load_ms = re.search(r"loaded .* in (\d+) ms", out)
        after = [losses[s] for s in range(args.steps, 2 * args.steps)]
        if base is None:
            base = after
        gaps = [abs(a - b) for a, b in zip(after, base)]
        mean_gap = abs(sum(after) / len(after) - sum(base) / len(base))
        ok &= max(gaps) <= args.bound
        rows.append((name, np_, load_ms.group(1) if load_ms else "?", after[0], after[-1], max(gaps), mean_gap))
    print(f"model {args.model}, T {args.seq_len}, global batch 8 (2 micro-batches of 4 sequences); the checkpoint "
          f"of step {args.steps} written by {SOURCE[0]} on {SOURCE[1]} ranks; steps {args.steps}-{2 * args.steps - 1} "
          f"after the load\n")
    print(f"| layout loading it | ranks | load ms | loss at step {args.steps} | at step {2 * args.steps - 1} | "
          f"largest step gap | gap of the mean |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, np_, load, first, last, gap, mean_gap in rows:
        print(f"| {name} | {np_} | {load} | {first:.6f} | {last:.6f} | {gap:.1e} | {mean_gap:.1e} |")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
