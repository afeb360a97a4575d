#!/usr/bin/env python3
"""bench/drift.py — silent numerical drift: the same training at 1, 2 and 4 ranks and under tp 2 (lab 08).

  python3 bench/drift.py [--build-dir build] [--steps 60] [--window 20] [--seeds 4] [--model demo] [--seq-len 64]

Every run trains the same global batches (8 sequences a step: dp 1 with micro-batch 8, dp 2 with 4, dp 4 with
2, and tp 2 with 8; lab 02's loader gives dp ranks of B windows exactly the windows of one rank of B x dp), so
the runs are the same computation and differ only in the order of their floating-point sums. The table shows
(1) whether the final parameters are bit-identical to the one-rank run's (the data-parallel runs: each rank
holds the whole model), and (2) the mean and standard deviation of the loss over the last --window steps,
with the difference of the mean from the one-rank run's beside the bound: 3 x the standard deviation, over
--seeds one-rank runs with different seeds, of that same window mean (the run-to-run spread at one world
size). Exit status 1 when a difference exceeds its bound. About a minute on 2 cores.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH = 8


def run(args, work, name, np_, extra, seed):
    logs = os.path.join(work, name, "logs")
    ckpt = os.path.join(work, name, "ckpt")
    program = os.path.join(args.build_dir, "bin", "reference", "lab08_resilience")
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", program, "--model", args.model,
           "--seq-len", str(args.seq_len), "--micro-batches", "1", "--steps", str(args.steps), "--val-every", "0",
           "--val-batches", "1", "--spike-z", "0", "--straggler-window", "0", "--seed", str(seed), "--quiet",
           "--log-dir", logs, "--checkpoint-dir", ckpt, "--checkpoint-every", str(args.steps),
           "--threads", "1", "--calibration", args.calibration] + extra
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"drift: {name} failed:\n{p.stdout[-3000:]}")
    losses = {}
    for line in open(glob.glob(os.path.join(logs, "lab08", "*", "rank0.jsonl"))[0]):
        r = json.loads(line)
        if r.get("type") == "step":
            losses[r["step"]] = r["loss"]
    tail = [losses[s] for s in sorted(losses)][-args.window:]
    shard = os.path.join(ckpt, f"step_{args.steps:08d}", "rank_0.bin")
    return statistics.mean(tail), statistics.pstdev(tail), shard


def params_bytes(path):
    """The bytes of the parameter sections of a shard file (checkpoint.h's layout: header, then a table)."""
    data = open(path, "rb").read()
    count = int.from_bytes(data[12:16], "little")
    at, out = 32, []
    for _ in range(count):
        n = int.from_bytes(data[at:at + 4], "little")
        name = data[at + 4:at + 4 + n].decode()
        offset = int.from_bytes(data[at + 4 + n:at + 12 + n], "little")
        size = int.from_bytes(data[at + 12 + n:at + 20 + n], "little")
        at += 4 + n + 8 + 8 + 4
        if "/params/" in name:
            out.append(data[offset:offset + size])
    return b"".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=4, help="one-rank runs whose spread makes the bound")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--seq-len", type=int, default=64)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sl_drift_")
    # One thread a rank and one CPU peak file for every run (MFU is not what is measured here): without
    # --calibration each rank of each run re-checks the cached peak with a quick sgemm pass, most of a short
    # run's time on 2 cores.
    subprocess.run([os.path.join(args.build_dir, "bin", "sl_calibrate"), "--threads", "1", "--seconds", "0.2",
                    "--cache-dir", work], stdout=subprocess.DEVNULL, check=True)
    args.calibration = os.path.join(work, "cpu_1t.json")
    spread = [run(args, work, f"seed{k}", 1, ["--micro-batch", str(GLOBAL_BATCH)], 1337 + k)[0]
              for k in range(1, args.seeds + 1)]
    bound = 3 * statistics.stdev(spread)
    layouts = [("dp 1", 1, ["--micro-batch", "8"]), ("dp 2", 2, ["--micro-batch", "4"]),
               ("dp 4", 4, ["--micro-batch", "2"]), ("tp 2", 2, ["--micro-batch", "8", "--tp", "2"])]
    rows, base_mean, base_params, ok = [], None, None, True
    for name, np_, extra in layouts:
        mean, std, shard = run(args, work, name.replace(" ", ""), np_, extra, 1337)
        params = params_bytes(shard) if name.startswith("dp") else None
        if base_mean is None:
            base_mean, base_params = mean, params
        diff = abs(mean - base_mean)
        ok &= diff <= bound
        same = "-" if params is None else ("yes" if params == base_params else "no")
        rows.append((name, np_, mean, std, diff, same))
    print(f"model {args.model}, T {args.seq_len}, global batch {GLOBAL_BATCH}, {args.steps} steps; loss over the last "
          f"{args.window}; bound = 3 x the std of that mean over {args.seeds} one-rank seeds = {bound:.5f}\n")
    print("| layout | ranks | loss mean | loss std | |mean - dp 1's| | within bound | params bit-equal to dp 1 |")
    print("|---|---:|---:|---:|---:|---|---|")
    for name, np_, mean, std, diff, same in rows:
        print(f"| {name} | {np_} | {mean:.5f} | {std:.5f} | {diff:.2e} | {'yes' if diff <= bound else 'NO'} | {same} |")
    print(f"\nseed spread of the window mean: {', '.join(f'{m:.5f}' for m in spread)}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
