#!/usr/bin/env python3
"""plan_cp_validate.py — lab 09's planner's cp axis against simulated lab 10 runs (docs/context_parallel.md,
"The planner's cp axis"). Lab 10's reference runs the zig-zag ring at cp 1, 2, 4 on simulated H100s
(--device sim --backend sim --timing-only: virtual time, the same numbers on any machine); bin/sl_plan predicts
each layout with the FLOP/s the cp 1 run sustained (its MFU as --efficiency of the simulated fp32 peak), so
what is compared is what cp adds: the attention share, the ring's exposed hand-overs, the gradient average.

  python3 bench/plan_cp_validate.py --build-dir build --data data/kjv [--model gpt2-124m --seq-len 1024]
  python3 bench/plan_cp_validate.py --model d12 --tps 1 2 --cps 1 2      # cp beside tp (lab 10's --tp)

Prints one row per tp x cp: the run's step and exposed communication (the largest of the ranks' summaries), the
planner's, and the errors. Exits 0 when every run and prediction completed (nothing is asserted: the numbers are
reported), 1 naming what failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM_PEAK_TFLOPS = 67.0  # the simulated H100's fp32 peak (the runs' summaries print it; checked below)


def run_lab10(args, cp, log_dir, tp=1):
    """(step_ms, exposed comm ms, peak FLOP/s, MFU) of tp x cp ranks: the largest over the ranks' summaries."""
    exe = os.path.join(args.build_dir, "bin", "reference", "lab10_context_parallel")
    run_id = f"tp{tp}cp{cp}"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(tp * cp), exe, "--tp", str(tp), "--cp",
           str(cp), "--zigzag",
           "--device", "sim", "--backend", "sim", "--sim-gpu", "h100", "--timing-only", "--model", args.model,
           "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch), "--steps", "3", "--threads", "1",
           "--precision", "fp32", "--quiet", "--data", args.data, "--log-dir", log_dir, "--run-id", run_id]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if done.returncode != 0:
        sys.exit(f"plan_cp_validate: lab 10 at tp {tp} x cp {cp} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = []
    for r in range(tp * cp):
        with open(os.path.join(log_dir, "lab10", run_id, f"rank{r}.jsonl")) as f:
            rows += [json.loads(line) for line in f if '"type":"summary"' in line]
    worst = max(rows, key=lambda s: s["step_ms"])
    return worst["step_ms"], max(s["comm_ms"] for s in rows), worst["peak_flops_per_s"], worst["mfu"]


def plan(args, cp, efficiency, tp=1):
    exe = os.path.join(args.build_dir, "bin", "sl_plan")
    cmd = [exe, "--model", args.model, "--seq-len", str(args.seq_len), "--global-batch", str(args.micro_batch),
           "--gpu", "cpu", "--peak-tflops", str(SIM_PEAK_TFLOPS), "--efficiency", f"{efficiency:.6f}",
           "--memory-gb", "80", "--intra", "nvlink", "--precision", "fp32", "--attention", "flash", "--tp", str(tp),
           "--pp", "1", "--dp", "1", "--cp", str(cp), "--micro-batch", str(args.micro_batch), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode not in (0, 1):
        sys.exit(f"plan_cp_validate: sl_plan at tp {tp} x cp {cp} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout)["time"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--data", default="data/kjv")
    p.add_argument("--model", default="gpt2-124m")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--cps", type=int, nargs="+", default=[2, 4])
    p.add_argument("--tps", type=int, nargs="+", default=[1],
                   help="tensor-parallel sizes beside each cp (lab 10's --tp; the model must split by them: "
                        "gpt2-124m's vocabulary does not, d12's does)")
    p.add_argument("--timeout-s", type=int, default=600)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as logs:
        step1, _, peak, mfu1 = run_lab10(args, 1, logs)
        if abs(peak / 1e12 - SIM_PEAK_TFLOPS) > 1e-6:
            sys.exit(f"plan_cp_validate: the simulated peak is {peak / 1e12} TFLOP/s, this script assumes "
                     f"{SIM_PEAK_TFLOPS}: update SIM_PEAK_TFLOPS")
        print(f"{args.model}, T {args.seq_len}, B {args.micro_batch}, fp32, simulated H100s (virtual time); "
              f"the planner at cp 1's sustained FLOP/s: MFU {100 * mfu1:.1f} % of {SIM_PEAK_TFLOPS} TFLOP/s")
        print(f"cp 1: run {step1:.2f} ms a step")
        print(f"{'tp':>3} {'cp':>3} | {'run step ms':>11} {'plan step ms':>12} {'error':>7} | {'run comm ms':>11} "
              f"{'plan comm ms':>12} {'error':>7}")
        for tp, cp in [(tp, cp) for tp in args.tps for cp in args.cps]:
            step, comm, _, _ = run_lab10(args, cp, logs, tp)
            t = plan(args, cp, mfu1, tp)
            plan_comm = t["cp_ms"] + t["dp_ms"] + t["tp_ms"]
            comm_error = f"{100 * (plan_comm / comm - 1):6.1f}%" if comm > 0 else "      -"
            print(f"{tp:>3} {cp:>3} | {step:11.2f} {t['step_ms']:12.2f} {100 * (t['step_ms'] / step - 1):6.1f}% | "
                  f"{comm:11.2f} {plan_comm:12.2f} {comm_error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
