#!/usr/bin/env python3
"""bench/recompute.py — the FAQ "does gradient checkpointing help?", measured (docs/memory.md "Activation recompute").

  python3 bench/recompute.py [--build-dir build] [--model demo] [--seq-len 256] [--batch 16] [--steps 5]
                             [--repeats 3] [--threads 2] [--cap-batch 8]

Part 1, the cost. Lab 01's reference program trains --steps steps (the first is the untimed warm-up) at
--batch x --seq-len with --recompute none, selective and full, the three modes alternating, --repeats times.
The table shows the median tokens/s (and the range), each mode's time per step against none, MFU (the
model's FLOPs) and HFU (with the recompute's FLOPs), and the allocator's peak activation and total bytes.

Part 2, the trade under a memory cap. Without recompute, --cap-batch sequences fit under a cap set just
above that run's peak (measured); each mode then gets the largest batch of a ladder (x1, x1.5, x2, x3, x4,
x6, x8 of --cap-batch) that fits, found by running it under the cap (a batch that does not fit stops with
lab 01's out-of-memory report). Then each mode trains at its batch, alternating, and the table says whether
the bigger batch came out ahead in tokens/s.

Every number is read from the runs' own logs (summary and step records). Exit status 1 if a run fails other
than by running out of memory in part 2's search, or if the modes' losses differ (recompute must give the
same training, bit for bit). About 2 minutes on 2 cores with the defaults.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["none", "selective", "full"]
MIB = 1024.0 * 1024.0


def run(args, logs, run_id, mode, batch, cap_mb=0, steps=None):
    """One lab 01 run; returns (records, output) or (None, output) when it stopped."""
    program = os.path.join(args.build_dir, "bin", "reference", "lab01_single_device")
    cmd = [program, "--model", args.model, "--seq-len", str(args.seq_len), "--batch", str(batch),
           "--steps", str(steps or args.steps), "--val-every", "0", "--val-batches", "1", "--sample-tokens", "0",
           "--threads", str(args.threads), "--attention", "materialized", "--recompute", mode, "--log-dir", logs, "--run-id", run_id, "--quiet",
           "--data", args.data]
    if cap_mb:
        cmd += ["--memory-cap-mb", str(cap_mb)]
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return None, p.stdout
    with open(os.path.join(logs, "lab01", run_id, "rank0.jsonl")) as f:
        return [json.loads(line) for line in f], p.stdout


def measure(records):
    steps = [r for r in records if r["type"] == "step"]
    summary = [r for r in records if r["type"] == "summary"][-1]
    return {
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary.get("mfu"),
        "hfu": summary.get("hfu"),
        "act_peak": max(s.get("memory_activations_peak_bytes", 0) for s in steps),
        "peak": max(s.get("memory_peak_bytes", 0) for s in steps),
        "losses": [s["loss"] for s in steps],
    }


def pct(x):
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def timed(args, logs, cases, tag):
    """cases: [(mode, batch, cap_mb)]; runs them alternating --repeats times; returns {mode: [measure]}."""
    out = {c[0]: [] for c in cases}
    for rep in range(args.repeats):
        for mode, batch, cap in cases:
            recs, text = run(args, logs, f"{tag}-{mode}-b{batch}-{rep}", mode, batch, cap)
            if recs is None:
                sys.exit(f"recompute.py: {mode} at batch {batch} failed:\n{text[-2000:]}")
            out[mode].append(measure(recs))
    return out


def median_tps(ms):
    v = [m["tokens_per_s"] for m in ms]
    return statistics.median(v), min(v), max(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--data", default=os.path.join(REPO, "data", "kjv"))
    ap.add_argument("--model", default="demo")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap-batch", type=int, default=8)
    ap.add_argument("--skip-cap", action="store_true", help="part 1 only")
    args = ap.parse_args()
    logs = tempfile.mkdtemp(prefix="sl-recompute-")
    try:
        print(f"== part 1: the cost of recompute ({args.model}, B={args.batch}, T={args.seq_len}, "
              f"{args.threads} threads, {args.steps - 1} timed steps, {args.repeats} alternating repeats)")
        res = timed(args, logs, [(m, args.batch, 0) for m in MODES], "cost")
        base_losses = res["none"][0]["losses"]
        bad = [m for m in MODES for r in res[m] if r["losses"] != base_losses]
        base = median_tps(res["none"])[0]
        print(f"{'recompute':<10} {'tokens/s':>9} {'(min-max)':>17} {'step time':>10} {'MFU':>7} {'HFU':>7} "
              f"{'activ. MiB':>11} {'peak MiB':>9}")
        for m in MODES:
            med, lo, hi = median_tps(res[m])
            r0 = res[m][0]
            mfu = statistics.median([r["mfu"] for r in res[m]]) if r0["mfu"] is not None else None
            hfu = statistics.median([r["hfu"] for r in res[m]]) if r0["hfu"] is not None else None
            print(f"{m:<10} {med:9.0f} {f'({lo:.0f}-{hi:.0f})':>17} {base / med:9.2f}x {pct(mfu):>7} {pct(hfu):>7} "
                  f"{r0['act_peak'] / MIB:11.1f} {r0['peak'] / MIB:9.1f}")
        print("step time: each mode's median time per step over none's (1.00x = no extra time)")
        if bad:
            print(f"FAIL: losses differ from --recompute none in: {sorted(set(bad))}")
            return 1
        print("losses: identical in every run and mode (bit for bit, as logged)")
        if args.skip_cap:
            return 0

        b = args.cap_batch
        recs, text = run(args, logs, "cap-probe", "none", b, steps=2)
        if recs is None:
            sys.exit(f"recompute.py: the probe at batch {b} failed:\n{text[-2000:]}")
        cap_mb = int(measure(recs)["peak"] / MIB) + 1
        ladder = sorted({max(1, int(round(b * f))) for f in (1, 1.5, 2, 3, 4, 6, 8)})
        print(f"\n== part 2: under a cap of {cap_mb} MiB (just above --recompute none's peak at B={b})")
        chosen = {}
        for m in MODES:
            fits = []
            for batch in ladder:
                r, text = run(args, logs, f"fit-{m}-{batch}", m, batch, cap_mb, steps=2)
                if r is None:
                    if "out of memory" not in text.lower() and "OutOfMemory" not in text:
                        sys.exit(f"recompute.py: {m} at batch {batch} failed, not by memory:\n{text[-2000:]}")
                    break
                fits.append(batch)
            if not fits:
                sys.exit(f"recompute.py: --recompute {m} fits no batch of {ladder} under {cap_mb} MiB")
            chosen[m] = fits[-1]
            tried = ladder[:len(fits) + 1]
            print(f"  {m:<10} fits B = {', '.join(map(str, fits))}" +
                  (f"; B = {tried[-1]} does not" if len(tried) > len(fits) else "; (the ladder's largest)"))
        res = timed(args, logs, [(m, chosen[m], cap_mb) for m in MODES], "cap")
        base = median_tps(res["none"])[0]
        print(f"{'recompute':<10} {'B':>4} {'tokens/s':>9} {'(min-max)':>17} {'vs none':>8} {'peak MiB':>9}")
        for m in MODES:
            med, lo, hi = median_tps(res[m])
            print(f"{m:<10} {chosen[m]:4d} {med:9.0f} {f'({lo:.0f}-{hi:.0f})':>17} {med / base:7.2f}x "
                  f"{res[m][0]['peak'] / MIB:9.1f}")
        print("vs none: tokens/s over none's at its own largest batch (above 1.00x: recompute came out ahead)")
        return 0
    finally:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
