#!/usr/bin/env python3
"""check_per_op_plan.py — lab 09's planner against the simulated GPU cluster: layouts of labs 03-07, each run by
its lab's reference program (--device sim --backend sim --sim-gpu h100 --timing-only, the tiny model or demo,
fp32), each predicted by bin/sl_plan --per-op --no-clip for the same layout on the same GPU model (common's
per-op cost model: labs/09_planner/README.md#per-op-pricing). --timing-only: every op, copy and collective is
charged and none computes; its gradient norm reads 0, so nothing is clipped (hence --no-clip).

  python3 tests/lab09/check_per_op_plan.py --build-dir build [--data data/kjv] [--tolerance 0.02] [--only lab05]

Prints one row per layout: the simulated step (the largest of the ranks' summaries' mean_step_ms: virtual time,
so the same bits on any machine), the prediction and the error. A layout marked `bound` must be within --tolerance; the others
are layouts whose communication or schedule the planner models differently from the lab (the reason is printed
with them) and are reported, not asserted. Exit 0 when every bound layout is within, 1 naming each that is not.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--model", "tiny", "--seq-len", "16", "--steps", "3", "--val-every", "0", "--val-batches", "1",
        "--sample-tokens", "0", "--threads", "1", "--quiet", "--precision", "fp32"]
SIM = ["--device", "sim", "--backend", "sim", "--sim-gpu", "h100", "--timing-only"]
PLAN = ["--model", "tiny", "--seq-len", "16", "--precision", "fp32", "--gpu", "h100", "--per-op", "--no-clip", "--json"]

# Why the pipeline rows are reported, not asserted: the planner's schedule (step_time, lab 06's formula) paces
# every slot of the fill and the drain at the slowest stage's, (m + (p - 1) / v) slots; the tiny model's last
# stage (ln_f, the head, the loss, the received gradient's copy) is about 15 % slower than its first, so the
# bubble is priced 2-4 % of the step too long. The op terms of each stage agree (the tp and dp rows below).
BUBBLE = ("the bubble is priced at the slowest stage's slot, (p - 1) / v slots of it; the tiny model's stages differ "
          "by about 15 %, which the schedule's formula does not see")

# (name, lab program, ranks, its options, sl_plan's options for the same layout, bound, why not bound)
LAYOUTS = [
    ("lab03 dp2 naive", "lab03_ddp", 2, ["--micro-batch", "2", "--mode", "naive"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2"], False,
     "one all-reduce per parameter tensor (28 calls); the planner prices one per unit (4)"),
    ("lab03 dp2 bucketed", "lab03_ddp", 2, ["--micro-batch", "2", "--mode", "bucketed"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2"], True, ""),
    ("lab03 dp2 overlap", "lab03_ddp", 2, ["--micro-batch", "2", "--mode", "overlap"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--overlap-dp"], False,
     "one bucket (--bucket-mb 1) holds the tiny model's gradients: its all-reduce starts after the last backward "
     "op, so nothing overlaps; the planner hides dp behind the backward"),
    ("lab03 dp2 bucketed B4", "lab03_ddp", 2, ["--micro-batch", "4", "--mode", "bucketed"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "4"], True, ""),
    ("lab04 dp2 zero1", "lab04_fsdp", 2, ["--micro-batch", "2", "--stage", "1", "--loader-alone-batches", "0"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--zero", "1"], True, ""),
    ("lab04 dp2 zero2", "lab04_fsdp", 2, ["--micro-batch", "2", "--stage", "2", "--loader-alone-batches", "0"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--zero", "2"], True, ""),
    ("lab04 dp2 zero3", "lab04_fsdp", 2, ["--micro-batch", "2", "--stage", "3", "--loader-alone-batches", "0"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--zero", "3"], False,
     "the planner adds ZeRO-3's gathers and reduce-scatters to the step whole; the lab overlaps them with "
     "compute (--overlap on, --prefetch 1), so it is shorter (not traced op by op)"),
    ("lab04 dp2 zero1 B4", "lab04_fsdp", 2, ["--micro-batch", "4", "--stage", "1", "--loader-alone-batches", "0"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "4", "--zero", "1"], True, ""),
    ("lab06 pp2 gpipe m2", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "2", "--schedule", "gpipe"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "2", "--schedule", "gpipe"],
     False, BUBBLE),
    ("lab06 pp2 gpipe m4", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "4", "--schedule", "gpipe"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "4", "--schedule", "gpipe"],
     False, BUBBLE),
    ("lab06 pp2 1f1b m2", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "2", "--schedule", "1f1b"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "2"], False, BUBBLE),
    ("lab06 pp2 1f1b m4", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "4", "--schedule", "1f1b"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "4"], False, BUBBLE),
    ("lab07 dp2 pp2", "lab07_parallel_3d", 4, ["--tp", "1", "--pp", "2", "--micro-batch", "2", "--micro-batches", "2"],
     ["--tp", "1", "--pp", "2", "--dp", "2", "--micro-batch", "2", "--micro-batches", "2"], False,
     "lab 07 also all-reduces the loss as a one-float host value over pp and over dp (all_reduce_value, one "
     "link latency each), which the planner does not price; and the pipeline's bubble, as below"),
    ("lab07 pp2 dp1", "lab07_parallel_3d", 2, ["--tp", "1", "--pp", "2", "--micro-batch", "2", "--micro-batches", "2"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "2"], False, BUBBLE),
    ("lab07 pp2 dp1 m4", "lab07_parallel_3d", 2, ["--tp", "1", "--pp", "2", "--micro-batch", "2", "--micro-batches", "4"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "4"], False, BUBBLE),
    # recompute, tensor parallelism (lab 05's split: the per-op pricing's tp terms), interleaving
    ("lab03 dp2 full recomp", "lab03_ddp", 2, ["--micro-batch", "2", "--mode", "bucketed", "--recompute", "full"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--recompute", "full"], True, ""),
    ("lab06 pp2 1f1b sel", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "4", "--schedule", "1f1b", "--recompute", "selective"],
     ["--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "4", "--recompute", "selective"],
     False, BUBBLE),
    ("lab05 tp2", "lab05_tensor_parallel", 2, ["--tp", "2", "--micro-batch", "2"],
     ["--tp", "2", "--pp", "1", "--dp", "1", "--micro-batch", "2"], True, ""),
    ("lab05 tp2 sp", "lab05_tensor_parallel", 2, ["--tp", "2", "--micro-batch", "2", "--sequence-parallel"],
     ["--tp", "2", "--pp", "1", "--dp", "1", "--micro-batch", "2", "--sp"], True, ""),
    ("lab05 tp2 full recomp", "lab05_tensor_parallel", 2, ["--tp", "2", "--micro-batch", "2", "--recompute", "full"],
     ["--tp", "2", "--pp", "1", "--dp", "1", "--micro-batch", "2", "--recompute", "full"], True, ""),
    ("lab07 tp2 pp2", "lab07_parallel_3d", 4, ["--tp", "2", "--pp", "2", "--micro-batch", "2", "--micro-batches", "2"],
     ["--tp", "2", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "2"], False, BUBBLE),
    ("lab03 dp2 sel recomp", "lab03_ddp", 2, ["--micro-batch", "2", "--mode", "bucketed", "--recompute", "selective"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--recompute", "selective"], True, ""),
    ("lab04 dp2 zero2 full", "lab04_fsdp", 2,
     ["--micro-batch", "2", "--stage", "2", "--loader-alone-batches", "0", "--recompute", "full"],
     ["--tp", "1", "--pp", "1", "--dp", "2", "--micro-batch", "2", "--zero", "2", "--recompute", "full"], True, ""),
    ("lab05 tp2 sp sel", "lab05_tensor_parallel", 2,
     ["--tp", "2", "--micro-batch", "2", "--sequence-parallel", "--recompute", "selective"],
     ["--tp", "2", "--pp", "1", "--dp", "1", "--micro-batch", "2", "--recompute", "selective", "--sp"], True, ""),
    ("lab05 tp2 m2", "lab05_tensor_parallel", 2, ["--tp", "2", "--micro-batch", "2", "--global-batch", "4"],
     ["--tp", "2", "--pp", "1", "--dp", "1", "--micro-batch", "2", "--micro-batches", "2"], True, ""),
    ("lab05 tp2 dp2", "lab05_tensor_parallel", 4, ["--tp", "2", "--micro-batch", "2"],
     ["--tp", "2", "--pp", "1", "--dp", "2", "--micro-batch", "2"], True, ""),
    ("lab06 demo pp2 interl v2", "lab06_pipeline_parallel", 2,
     ["--model", "demo", "--micro-batch", "2", "--micro-batches", "4", "--schedule", "interleaved", "--chunks", "2"],
     ["--model", "demo", "--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--micro-batches", "4",
      "--schedule", "interleaved", "--chunks", "2"], False, BUBBLE),
]


def with_model(defaults, args):
    """defaults, less their --model pair when args name their own model (the interleaved row: demo's 4 layers)."""
    if "--model" not in args:
        return defaults
    i = defaults.index("--model")
    return defaults[:i] + defaults[i + 2:]


def simulated_step_ms(build, program, ranks, args, logs, data):
    cmd = [os.path.join(build, "bin", "reference", program)] + with_model(TINY, args) + SIM + args + ["--log-dir", logs, "--data", data]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}")
    m = re.search(r"logs: (\S+)/rank0\.jsonl", p.stdout)
    if not m:
        raise RuntimeError(f"no 'logs:' line in the output of {' '.join(cmd)}")
    step_ms = 0.0
    for rank in range(ranks):  # the job's step is its slowest rank's (a pipeline's stages differ a little)
        with open(os.path.join(ROOT, m.group(1), f"rank{rank}.jsonl")) as f:
            summary = [r for r in map(json.loads, f) if r["type"] == "summary"][-1]
        if summary.get("clock") != "virtual":
            raise RuntimeError(f"{program}: rank {rank}'s summary's clock is {summary.get('clock')!r}, not virtual")
        step_ms = max(step_ms, summary["mean_step_ms"])
    return step_ms


def predicted_step_ms(build, args):
    opt = dict(zip(args[::2], args[1::2]))  # the layout's sizes (no flags among them but the last)
    batch = int(opt["--dp"]) * int(opt["--micro-batch"]) * int(opt.get("--micro-batches", "1"))
    cmd = [os.path.join(build, "bin", "sl_plan")] + with_model(PLAN, args) + ["--global-batch", str(batch)] + args
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}")
    return json.loads(p.stdout)["time"]["step_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--tolerance", type=float, default=0.02, help="relative error a bound layout may have")
    ap.add_argument("--only", default="", help="run only the layouts whose name contains this text")
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    failures, bound = [], 0
    print(f"{'layout':22s} {'sim ms':>9s} {'plan ms':>9s} {'error':>8s}")
    with tempfile.TemporaryDirectory(prefix="per_op_plan_") as logs:
        for name, program, ranks, lab_args, plan_args, is_bound, why in LAYOUTS:
            if args.only not in name:
                continue
            t0 = time.monotonic()
            sim = simulated_step_ms(build, program, ranks, lab_args, logs, args.data)
            plan = predicted_step_ms(build, plan_args)
            err = (plan - sim) / sim
            ok = abs(err) <= args.tolerance
            bound += is_bound
            note = "" if is_bound else f"  (reported, not asserted: {why})"
            print(f"{name:22s} {sim:9.4f} {plan:9.4f} {100 * err:+7.2f}%{'' if ok or not is_bound else '  FAIL'}"
                  f"{note}  [{time.monotonic() - t0:.1f} s]", flush=True)
            if is_bound and not ok:
                failures.append(f"{name}: planned {plan:.4f} ms vs simulated {sim:.4f} ms ({100 * err:+.2f} %)")
    if failures:
        print(f"\n{len(failures)} of {bound} asserted layouts off by more than {100 * args.tolerance:g} %:")
        for f in failures:
            print("  " + f)
        return 1
    print(f"\nall {bound} asserted layouts within {100 * args.tolerance:g} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
