#!/usr/bin/env python3
"""compare_runs.py — do two builds train bit for bit alike? For refactors that must not change behaviour.

Runs a fixed set of short, deterministic CPU runs (1 thread per rank, fixed seeds) of labs 01, 03 and
04 with the reference programs of two build folders, and compares their logs (docs/log_schema.md):
every step's loss, learning rate, tokens, gradient norm and allocator bytes, every validation loss,
and the summary's losses, sample text and memory numbers, as the exact JSON values the programs
wrote (float32 losses printed with all their digits, so equal text is equal bits). Timings are not
compared: they differ run to run.

  scripts/compare_runs.py --before build-before --after build            # both builds must exist
  scripts/compare_runs.py --before build-before --after build --only lab04
  scripts/compare_runs.py --record build-before --out runs-before        # keep one build's logs

Exit 0 when every run agrees, 1 naming the first differing record and key of each run that does not.
Needs data/kjv (scripts/prepare_corpus.sh) and, for the multi-rank runs, mpirun.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name, lab program, ranks, arguments. Short, but each exercises a distinct path of its lab.
COMMON = ["--data", "data/kjv", "--model", "demo", "--seq-len", "64", "--threads", "1", "--val-batches", "2",
          "--sample-tokens", "24", "--quiet"]
RUNS = [
    ("lab01-fp32", "lab01_single_device", 1, ["--batch", "4", "--steps", "6", "--val-every", "3"]),
    ("lab01-bf16", "lab01_single_device", 1, ["--batch", "4", "--steps", "4", "--precision", "bf16"]),
    ("lab01-bf16-compute", "lab01_single_device", 1, ["--batch", "4", "--steps", "4", "--precision", "bf16-compute"]),
    ("lab01-flash-sgd", "lab01_single_device", 1, ["--batch", "4", "--steps", "4", "--attention", "flash",
                                                   "--optimizer", "sgd", "--lr", "0.05"]),
    # Two commands, one log: 6 steps with checkpoints at 3 and 6, then a resume from step 3 to 6 (appends).
    ("lab01-resume", "lab01_single_device", 1, [["--batch", "4", "--steps", "6", "--checkpoint-dir", "{dir}/ckpt",
                                                 "--checkpoint-every", "3"],
                                                ["--batch", "4", "--steps", "6", "--checkpoint-dir", "{dir}/ckpt",
                                                 "--resume", "{dir}/ckpt/ckpt_3.bin"]]),
    ("lab03-np1-overlap", "lab03_ddp", 1, ["--micro-batch", "4", "--global-batch", "8", "--steps", "4"]),
    ("lab03-np2-naive", "lab03_ddp", 2, ["--micro-batch", "2", "--steps", "4", "--mode", "naive"]),
    ("lab03-np2-bucketed", "lab03_ddp", 2, ["--micro-batch", "2", "--steps", "4", "--mode", "bucketed",
                                            "--bucket-mb", "0.25"]),
    ("lab03-np2-overlap-accum", "lab03_ddp", 2, ["--micro-batch", "2", "--global-batch", "8", "--steps", "4",
                                                 "--mode", "overlap", "--bucket-mb", "0.5"]),
    ("lab04-np2-z1", "lab04_fsdp", 2, ["--micro-batch", "2", "--steps", "4", "--stage", "1"]),
    ("lab04-np2-z2-accum", "lab04_fsdp", 2, ["--micro-batch", "2", "--global-batch", "8", "--steps", "4",
                                             "--stage", "2"]),
    ("lab04-np2-z3", "lab04_fsdp", 2, ["--micro-batch", "2", "--steps", "4", "--stage", "3"]),
    ("lab04-np2-z3-bf16-nooverlap", "lab04_fsdp", 2, ["--micro-batch", "2", "--steps", "4", "--stage", "3",
                                                      "--precision", "bf16", "--overlap", "off"]),
    ("lab04-np2-z3-sgd-prefetch2", "lab04_fsdp", 2, ["--micro-batch", "2", "--steps", "4", "--stage", "3",
                                                     "--prefetch", "2", "--optimizer", "sgd", "--lr", "0.05"]),
]

STEP_KEYS = ("step", "loss", "lr", "tokens", "grad_norm")
SUMMARY_KEYS = ("final_loss", "val_loss_start", "val_loss_end", "sample", "steps")


def compared(rec):
    """The part of one log record that must not change: values, not timings."""
    t = rec.get("type")
    if t == "step":
        keep = {k: rec.get(k) for k in STEP_KEYS}
        keep.update({k: v for k, v in rec.items() if k.startswith("memory_") and k.endswith("_bytes")})
    elif t == "eval":
        keep = {k: v for k, v in rec.items() if k in ("step", "val_loss")}
    elif t == "summary":
        keep = {k: rec.get(k) for k in SUMMARY_KEYS if k in rec}
        keep.update({k: v for k, v in rec.items() if k.startswith("memory_") and k.endswith("_bytes")})
    else:
        return None
    return {"type": t, **keep}


def run_one(build, name, program, ranks, args, out_dir):
    exe = Path(build) / "bin" / "reference" / program
    if not exe.is_file():
        sys.exit(f"[scalelab] compare_runs: {exe} not found\n[scalelab]   hint: cmake --build {build}")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               SL_RUN_ID=name)
    work = Path(out_dir) / "work" / name
    work.mkdir(parents=True, exist_ok=True)
    for cmd_args in (args if args and isinstance(args[0], list) else [args]):
        cmd_args = [a.replace("{dir}", str(work)) for a in cmd_args]
        cmd = [str(exe)] + COMMON + cmd_args + ["--log-dir", str(out_dir), "--run-id", name]
        if ranks > 1 or program != "lab01_single_device":
            cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"[scalelab] compare_runs: {name} failed with {build} (exit {p.returncode}):\n{p.stdout[-3000:]}")
    lab = program.split("_")[0]
    logs = {}
    for f in sorted((Path(out_dir) / lab / name).glob("rank*.jsonl")):
        recs = [compared(json.loads(line)) for line in f.read_text().splitlines() if line.strip()]
        logs[f.name] = [r for r in recs if r is not None]
    if not logs:
        sys.exit(f"[scalelab] compare_runs: {name} wrote no logs under {out_dir}/{lab}/{name}")
    return logs


def first_difference(a, b):
    for fname in sorted(set(a) | set(b)):
        ra, rb = a.get(fname), b.get(fname)
        if ra is None or rb is None:
            return f"{fname}: only in {'after' if ra is None else 'before'}"
        for i, (x, y) in enumerate(zip(ra, rb)):
            if x != y:
                keys = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
                k = keys[0]
                return f"{fname} record {i} ({x.get('type')} {x.get('step', '')}): {k} before {x.get(k)!r}, after {y.get(k)!r}"
        if len(ra) != len(rb):
            return f"{fname}: {len(ra)} records before, {len(rb)} after"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="build folder of the code before the change")
    ap.add_argument("--after", help="build folder of the code after the change")
    ap.add_argument("--record", help="only run this build folder's programs and keep the logs (with --out)")
    ap.add_argument("--out", help="with --record: where the logs go")
    ap.add_argument("--only", help="only runs whose name starts with this (lab01, lab03, lab04, ...)")
    args = ap.parse_args()
    runs = [r for r in RUNS if not args.only or r[0].startswith(args.only)]
    if args.record:
        out = Path(args.out or tempfile.mkdtemp(prefix="compare_runs_"))
        for name, program, ranks, rargs in runs:
            run_one(args.record, name, program, ranks, rargs, out)
        print(f"[scalelab] compare_runs: {len(runs)} runs of {args.record} logged under {out}")
        return 0
    if not (args.before and args.after):
        ap.error("give --before and --after (or --record)")
    tmp = Path(tempfile.mkdtemp(prefix="compare_runs_"))
    bad = 0
    try:
        for name, program, ranks, rargs in runs:
            a = run_one(args.before, name, program, ranks, rargs, tmp / "before")
            b = run_one(args.after, name, program, ranks, rargs, tmp / "after")
            diff = first_difference(a, b)
            n = sum(len(v) for v in a.values())
            if diff:
                bad += 1
                print(f"DIFFERS  {name}: {diff}")
            else:
                print(f"same     {name}: {n} records on {len(a)} rank(s), bit for bit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[scalelab] compare_runs: {len(runs) - bad} of {len(runs)} runs identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
