#!/usr/bin/env python3
"""check_timing_only.py — timing-only runs at the lesson's sizes (--device sim --timing-only, docs/simulation.md
"Timing-only runs"): the memory a rank holds equals the planner's and the estimator's to the byte.

  python3 tests/drivers/check_timing_only.py --build-dir build --case lab03     lab 03 (DDP), GPT-2 124M, 8 ranks
  python3 tests/drivers/check_timing_only.py --build-dir build --case lab04     lab 04 ZeRO-3, the same
  python3 tests/drivers/check_timing_only.py --build-dir build --case lab04-bf16  the same, --activations bf16
  python3 tests/drivers/check_timing_only.py --build-dir build --case lab07-7b  lab 07, 7B, tp 8 x pp 4 x dp 2 (slow)
  python3 tests/drivers/check_timing_only.py --build-dir build --case lab07-7b-16  lab 07, 7B, tp 4 x pp 2 x dp 2
  python3 tests/drivers/check_timing_only.py --build-dir build --case same-time the times of a real simulated run
  python3 tests/drivers/check_timing_only.py --build-dir build --case refusals  the refused option pairs

--case lab03|lab04 runs the lab's reference program on 8 simulated H100 (mpirun, --backend sim) with GPT-2 124M
(--model gpt2-124m), T 1024, micro-batch 4, bf16 mixed precision, two steps, timing-only; then, on every rank,
sets the SIM allocator's peaks of the four categories the planner counts (the last step record's
memory_<category>_peak_bytes: params, grads, optimizer_state, activations) beside
  - lab 09's planner: bin/sl_plan --json for the same layout (tp 1, pp 1, dp 8, the lab's ZeRO stage), and
  - lab 04's estimator: bin/sl_memory --bytes (estimate_memory: stage 0 for DDP, 3 for ZeRO-3),
and asks them equal to the byte. It also checks that the run says what it was: the run record and the summary
have timing_only true, every loss, val_loss and grad_norm is null, and the printed lines say "not computed".
--case lab04-bf16 runs lab 04's case with --activations bf16 (the activations kept in 16 bits), and the planner and
the estimator are asked with --activations bf16 too. The check can fail: the same comparison against the
planner's figure for a neighbouring layout (micro-batch 3, the next ZeRO stage, the other activation dtype) must
find differences, or the case fails ("the comparison cannot tell").
--case lab07-7b: lab 07 with gpt-7b as tp 8 x pp 4 x dp 2 on 64 simulated H100 (nodes of 8), T 2048, micro-batch 1,
m 8: it finishes, and the 16 ranks of the fullest stage (stage 0) equal the planner to the byte. 64 processes:
15-90 s on 2 cores, with their load (label slow).
--case lab07-7b-16: the same on 16 simulated H100 (2 nodes of 8) as tp 4 x pp 2 x dp 2, m 4: every rank of the
planner's fullest stage equals it to the byte, and the planner's figure for micro-batch 2 must differ from the
run's (the comparison can fail). 16 processes: a few seconds on 2 cores.
--case same-time: lab 04 ZeRO-3 on the demo model, 2 ranks, with and without --timing-only: the same step times,
tokens/s, MFU and exposed communication (relative 1e-9; --grad-clip 0, since a timing-only run clips nothing).
--case refusals: --timing-only with --device cpu ends both ranks of a 2-rank run with a message naming
--device sim, and --model gpt-70b without --timing-only is refused naming --timing-only.
Exit 0 when all hold, 1 naming each failure. Each case prints its wall time (about 10 s on 2 cores).
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
CATEGORIES = ("params", "grads", "optimizer_state", "activations")  # what the planner and the estimator count
RANKS, B, T = 8, 4, 1024
MODEL = "gpt2-124m"
CASES = {  # case: (lab program, its extra arguments, ZeRO stage for the planner and the estimator, activations)
    "lab03": ("lab03_ddp", ["--mode", "overlap"], 0, "fp32"),
    "lab04": ("lab04_fsdp", ["--stage", "3", "--prefetch", "1"], 3, "fp32"),
    "lab04-bf16": ("lab04_fsdp", ["--stage", "3", "--prefetch", "1"], 3, "bf16"),
}


def run(cmd, timeout=600):
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout, time.monotonic() - t0


def mpirun(ranks, every_rank=False):
    return ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + (
        ["--mca", "orte_abort_on_non_zero_status", "0"] if every_rank else [])


def planned(a, zero, activations, micro_batch=B):
    """sl_plan's memory of the layout tp 1 x pp 1 x dp 8: {category: bytes}."""
    cmd = [os.path.join(a.build_dir, "bin", "sl_plan"), "--model", MODEL, "--gpu", "h100", "--gpus", str(RANKS),
           "--seq-len", str(T), "--global-batch", str(micro_batch * RANKS), "--precision", "bf16", "--tp", "1",
           "--pp", "1", "--dp", str(RANKS), "--micro-batch", str(micro_batch), "--micro-batches", "1", "--zero",
           str(zero), "--activations", activations, "--json"]
    rc, out, _ = run(cmd)
    if rc != 0:
        sys.exit(f"sl_plan failed:\n  {' '.join(cmd)}\n{out[-2000:]}")
    m = json.loads(out[out.index("{"):])["memory"]
    return {c: m[f"{c}_bytes"] for c in CATEGORIES}


def estimated(a, stage, activations):
    """sl_memory --bytes (lab 04's estimate_memory) for one rank of 8: {category: peak bytes}."""
    cmd = [os.path.join(a.build_dir, "bin", "sl_memory"), "--model", MODEL, "--ranks", str(RANKS), "--stage",
           str(stage), "--precision", "bf16", "--optimizer", "adamw", "--micro-batch", str(B), "--seq-len", str(T),
           "--prefetch", "1", "--activations", activations, "--bytes"]
    rc, out, _ = run(cmd)
    if rc != 0:
        sys.exit(f"sl_memory failed:\n  {' '.join(cmd)}\n{out[-2000:]}")
    # The row of the stage: "<stage> <name> <ranks> | params pers peak | grads pers peak | optim | state | activ | ..."
    for line in out.splitlines():
        cells = [c.split() for c in line.split("|")]
        if len(cells) >= 6 and cells[0][:1] == [str(stage)] and cells[0][-1] == str(RANKS):
            return {"params": int(cells[1][1]), "grads": int(cells[2][1]), "optimizer_state": int(cells[3][0]),
                    "activations": int(cells[5][0])}
    sys.exit(f"sl_memory: no row for stage {stage} at {RANKS} ranks in:\n{out}")


def differences(measured, expected, what):
    return [f"{what}: {c} {measured[c]} bytes measured, {expected[c]} expected ({measured[c] - expected[c]:+d})"
            for c in CATEGORIES if measured[c] != expected[c]]


def rank_records(logs, lab, run_id, rank):
    with open(os.path.join(logs, lab, run_id, f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def check_case(a, case, logs):
    program, extra, zero, activations = CASES[case]
    run_id = f"timing-{case}"
    cmd = mpirun(RANKS) + [os.path.join(a.build_dir, "bin", "reference", program), "--device", "sim", "--timing-only",
                           "--backend", "sim", "--model", MODEL, "--seq-len", str(T), "--micro-batch", str(B),
                           "--precision", "bf16", "--steps", "2", "--warmup", "1", "--val-every", "0",
                           "--val-batches", "1", "--sample-tokens", "0", "--threads", "1", "--data", a.data,
                           "--log-dir", logs, "--run-id", run_id, "--activations", activations] + extra
    rc, out, wall = run(cmd)
    print(f"{case}: {MODEL} on {RANKS} simulated H100, timing-only: exit {rc}, {wall:.1f} s wall")
    if rc != 0:
        return [f"{case}: exit {rc}\n  {' '.join(cmd)}\n{out[-3000:]}"]
    problems = []
    if "val loss not computed" not in out:
        problems.append(f"{case}: the printed lines do not say 'val loss not computed'")
    plan, estimate = planned(a, zero, activations), estimated(a, zero, activations)
    for rank in range(RANKS):
        where = f"{case} rank {rank}"
        recs = rank_records(logs, program[:5], run_id, rank)
        run_rec = next(r for r in recs if r["type"] == "run")
        summary = next(r for r in recs if r["type"] == "summary")
        steps = [r for r in recs if r["type"] == "step"]
        evals = [r for r in recs if r["type"] == "eval"]
        if run_rec.get("timing_only") is not True or summary.get("timing_only") is not True:
            problems.append(f"{where}: timing_only is {run_rec.get('timing_only')} in the run record, "
                            f"{summary.get('timing_only')} in the summary, not true")
        numbers = [(s["type"], k, s.get(k)) for s in steps for k in ("loss", "grad_norm") if k in s]
        numbers += [("eval", "val_loss", e.get("val_loss")) for e in evals]
        numbers += [("summary", k, summary.get(k)) for k in ("final_loss", "val_loss_start", "val_loss_end")
                    if k in summary]
        problems += [f"{where}: {t} {k} is {v!r}, not null (not computed)" for t, k, v in numbers if v is not None]
        measured = {c: steps[-1][f"memory_{c}_peak_bytes"] for c in CATEGORIES}
        problems += differences(measured, plan, f"{where} vs the planner (sl_plan)")
        problems += differences(measured, estimate, f"{where} vs the estimator (sl_memory)")
        if rank == 0:
            print(f"{case} rank 0: " + ", ".join(f"{c} {measured[c]}" for c in CATEGORIES) + " bytes; planner and "
                  f"estimator: {'equal' if not problems else 'see below'}")
    # The comparison can fail: a neighbouring layout's figures must differ from this run's.
    measured = {c: steps[-1][f"memory_{c}_peak_bytes"] for c in CATEGORIES}
    other_activations = "fp32" if activations == "bf16" else "bf16"
    for other, why in ((planned(a, zero, activations, micro_batch=B - 1), "micro-batch 3"),
                       (planned(a, zero + 1 if zero < 3 else 2, activations), "another ZeRO stage"),
                       (planned(a, zero, other_activations), f"{other_activations} activations")):
        if not differences(measured, other, ""):
            problems.append(f"{case}: the planner's figure for {why} equals this run's too: the comparison cannot tell")
    return problems


LAB07_7B = {  # case: (tp, pp, dp, m) of gpt-7b, micro-batch 1, T 2048, nodes of 8
    "lab07-7b": (8, 4, 2, 8),
    "lab07-7b-16": (4, 2, 2, 4),
}


def layout_args(tp, pp, dp, micro_batch, micro_batches):
    return ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--micro-batch", str(micro_batch), "--micro-batches",
            str(micro_batches)]


def plan_7b(a, ranks, layout, global_batch):
    """sl_plan --json's memory of a gpt-7b layout on `ranks` H100 in nodes of 8: (fullest stage, {category: bytes}),
    or the failure's text."""
    plan_cmd = [os.path.join(a.build_dir, "bin", "sl_plan"), "--model", "gpt-7b", "--gpu", "h100", "--gpus",
                str(ranks), "--gpus-per-node", "8", "--seq-len", "2048", "--global-batch", str(global_batch),
                "--precision", "bf16", "--zero", "0", "--json"] + layout
    prc, pout, _ = run(plan_cmd)
    if prc != 0:
        return None, f"sl_plan failed:\n  {' '.join(plan_cmd)}\n{pout[-2000:]}"
    m = json.loads(pout[pout.index("{"):])["memory"]
    return m["stage"], {c: m[f"{c}_bytes"] for c in CATEGORIES}


def check_lab07_7b(a, logs, case):
    """Lab 07, gpt-7b as tp x pp x dp (LAB07_7B) on simulated H100 in nodes of 8, T 2048, micro-batch 1, 1F1B,
    bf16, timing-only: it finishes its steps, and the ranks of the planner's fullest stage hold its figure to
    the byte (without ZeRO-1: lab 07's ZeRO-1 peaks during its setup, which the planner does not model); the
    planner's figure for micro-batch 2 must differ (the comparison can tell). 64 processes on the machine's
    cores: 15-90 s on 2, with the load of the machine; 16: a few seconds."""
    tp, pp, dp, micro_batches = LAB07_7B[case]
    ranks = tp * pp * dp
    run_id = f"timing-{case}"
    layout = layout_args(tp, pp, dp, 1, micro_batches)
    cmd = mpirun(ranks) + [os.path.join(a.build_dir, "bin", "reference", "lab07_parallel_3d"), "--device", "sim",
                        "--timing-only", "--model", "gpt-7b", "--seq-len", "2048", "--ranks-per-node", "8",
                        "--precision", "bf16", "--steps", "2", "--warmup", "1", "--val-every", "0", "--val-batches",
                        "1", "--sample-tokens", "0", "--threads", "1", "--quiet", "--data", a.data, "--log-dir", logs,
                        "--run-id", run_id] + layout
    rc, out, wall = run(cmd)
    print(f"{case}: gpt-7b, tp {tp} x pp {pp} x dp {dp} on {ranks} simulated H100, timing-only: exit {rc}, "
          f"{wall:.1f} s wall")
    if rc != 0:
        return [f"{case}: exit {rc}\n  {' '.join(cmd)}\n{out[-3000:]}"]
    stage, plan = plan_7b(a, ranks, layout, dp * micro_batches)
    if stage is None:
        return [plan]
    problems = []
    # The stage's ranks: order tp-dp-pp puts the tp x dp ranks of one stage next to each other.
    for rank in range(stage * tp * dp, (stage + 1) * tp * dp):
        steps = [r for r in rank_records(logs, "lab07", run_id, rank) if r["type"] == "step"]
        measured = {c: steps[-1][f"memory_{c}_peak_bytes"] for c in CATEGORIES}
        problems += differences(measured, plan, f"{case} rank {rank} (stage {stage}) vs the planner (sl_plan)")
    print(f"{case}: stage {stage}'s {tp * dp} ranks: " + ", ".join(f"{c} {measured[c]}" for c in CATEGORIES)
          + f" bytes (last rank); planner: {'equal' if not problems else 'see below'}")
    _, other = plan_7b(a, ranks, layout_args(tp, pp, dp, 2, micro_batches), 2 * dp * micro_batches)
    if isinstance(other, str) or not differences(measured, other, ""):
        problems.append(f"{case}: the planner's figure for micro-batch 2 equals this run's too (or failed): the "
                        "comparison cannot tell")
    return problems


def check_same_time(a, logs):
    """Lab 04 ZeRO-3 on the demo model, 2 ranks: a timing-only run's step times, tokens/s, MFU and exposed
    communication equal a real simulated run's (relative 1e-9: the real run's clock has also charged the initial
    weights' copies, so the differences of its larger times round differently). --grad-clip 0: a real run clips
    (one more pass over the gradients), a timing-only one reads the norm as 0 and does not."""
    steps = {}
    for mode in ("real", "timing"):
        run_id = f"same-{mode}"
        cmd = mpirun(2) + [os.path.join(a.build_dir, "bin", "reference", "lab04_fsdp"), "--device", "sim",
                           "--backend", "sim", "--model", "demo", "--seq-len", "64", "--stage", "3", "--grad-clip",
                           "0", "--steps", "3", "--val-every", "0", "--val-batches", "1", "--sample-tokens", "0",
                           "--threads", "1", "--quiet", "--data", a.data, "--log-dir", logs, "--run-id", run_id] + (
                               ["--timing-only"] if mode == "timing" else [])
        rc, out, wall = run(cmd)
        print(f"same-time: lab 04 ZeRO-3 demo, 2 ranks, {mode}: exit {rc}, {wall:.1f} s")
        if rc != 0:
            return [f"same-time {mode}: exit {rc}\n{out[-2000:]}"]
        steps[mode] = [[r for r in rank_records(logs, "lab04", run_id, k) if r["type"] == "step"] for k in (0, 1)]
    problems = []
    for k in (0, 1):
        for real, timing in zip(steps["real"][k], steps["timing"][k]):
            for key in ("step_ms", "tokens_per_s", "mfu", "comm_ms"):
                x, y = real[key], timing[key]
                if abs(x - y) > 1e-9 * abs(x):
                    problems.append(f"same-time rank {k} step {real['step']}: {key} {x!r} real, {y!r} timing-only")
    return problems


def check_refusals(a, logs):
    problems = []
    exe = os.path.join(a.build_dir, "bin", "reference", "lab03_ddp")
    base = ["--steps", "1", "--val-batches", "1", "--sample-tokens", "0", "--threads", "1", "--data", a.data,
            "--log-dir", logs, "--quiet"]
    rc, out, wall = run([exe, "--timing-only", "--device", "cpu"] + base)
    print(f"refusals: --timing-only --device cpu: exit {rc}, {wall:.1f} s")
    if rc == 0 or "--timing-only needs the simulated GPU" not in out or "--device sim" not in out:
        problems.append(f"--timing-only with --device cpu was not refused naming --device sim (exit {rc}):\n{out[-1500:]}")
    _, out2, _ = run(mpirun(2, every_rank=True) + [exe, "--timing-only", "--device", "cpu"] + base)
    if out2.count("--timing-only needs the simulated GPU") != 2:
        problems.append(f"--timing-only with --device cpu on 2 ranks: not refused on both:\n{out2[-1500:]}")
    rc, out, wall = run([exe, "--model", "gpt-70b", "--device", "sim"] + base)
    print(f"refusals: --model gpt-70b without --timing-only: exit {rc}, {wall:.1f} s")
    if rc == 0 or not re.search(r"--model gpt-70b: its model state alone", out) or "--timing-only" not in out:
        problems.append(f"--model gpt-70b without --timing-only was not refused naming --timing-only (exit {rc}):\n"
                        f"{out[-1500:]}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"))
    ap.add_argument("--case", action="append", default=[],
                    choices=sorted(CASES) + sorted(LAB07_7B) + ["same-time", "refusals"])
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory(prefix="sl-timing-") as logs:
        for case in a.case:
            check = {"refusals": check_refusals, "same-time": check_same_time}.get(case)
            if case in LAB07_7B:
                failures += check_lab07_7b(a, logs, case)
            else:
                failures += check(a, logs) if check else check_case(a, case, logs)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
