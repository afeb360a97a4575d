#!/usr/bin/env python3
"""bench/plan_validate.py — lab 09's planner against the kit's own runs: every layout labs 01 and 03-07 can run
on CPU ranks, its measured step time and memory per rank beside what bin/sl_plan predicts for it.

  python3 bench/plan_validate.py [--build-dir build] [--out runs/plan_validate] [--steps 6] [--only NAME]...

Each row runs one lab program (mpirun for several ranks) on the demo model (L 4, C 192, T 64, fp32, AdamW),
reads every rank's log (docs/log_schema.md), and asks `bin/sl_plan --json` for the same layout on a CPU
cluster: the peak of runs/calibration/cpu_1t.json (bin/sl_calibrate --threads 1), the efficiency below,
the simulated links the run used (--link, --inter-link, --link-slowdown, --ranks-per-node). Two kinds of rows:
  real      one or two ranks, one thread each, on the 2 cores: compute is this CPU's; the model prices it
            as the FLOPs of the GEMMs at the sgemm calibration times an efficiency measured here on two
            calibration runs, lab 01 alone and lab 03 on 2 ranks without a link (their compute against their
            FLOPs: one number for one busy rank, one for two), plus the optimizer's pass at --bandwidth-gbs;
  uniform   labs 06 and 07 with --uniform-compute-ms: a stage's forward takes the given time, its backward
            twice (as on a simulated device), so the row tests the schedule, the bubble and the links.
Measured: the slowest rank's mean step (the summary's mean_step_ms, the warm-up step not counted); memory:
the largest rank's peaks of the four categories the planner counts (params, grads, optimizer state,
activations: the allocator's memory_<category>_peak_bytes, summed) and its whole peak (memory_peak_bytes,
which adds the ops' workspace and the communication buffers). Writes <out>/validation.md and results.json.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import statistics
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shown_dir(path):
    """A build directory as the user would type it: relative to the repository when inside it."""
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel
DEMO = ["--model", "demo", "--seq-len", "64", "--precision", "fp32", "--optimizer", "adamw"]
LINK = ["--link", "ethernet100", "--link-slowdown", "100"]                     # labs 03-06, one link for all
NODES = ["--ranks-per-node", "2", "--link", "nvlink", "--inter-link", "infiniband", "--link-slowdown", "300"]


CALIBRATION_ROWS = ("lab01 one device B 8", "lab03 dp 2, no link")  # the CPU's efficiency, with 1 and 2 ranks busy


def plan(tp=1, pp=1, dp=1, B=8, m=1, zero=0, sp=False, schedule="1f1b", chunks=1, overlap=False, uniform=0):
    return dict(tp=tp, pp=pp, dp=dp, B=B, m=m, zero=zero, sp=sp, schedule=schedule, chunks=chunks,
                overlap=overlap, uniform=uniform)


# (name, kind, lab program, ranks, its arguments, the layout for sl_plan, the links for sl_plan)
ROWS = [
    ("lab01 one device B 8", "real", "lab01_single_device", 1, ["--batch", "8"], plan(), []),
    ("lab03 dp 2, no link", "real", "lab03_ddp", 2, ["--micro-batch", "8", "--mode", "bucketed"], plan(dp=2), []),
    ("lab03 dp 2 naive (a call a tensor)", "real", "lab03_ddp", 2, ["--micro-batch", "8", "--mode", "naive"] + LINK,
     plan(dp=2), LINK),
    ("lab03 dp 2 bucketed 2 MB", "real", "lab03_ddp", 2,
     ["--micro-batch", "8", "--mode", "bucketed", "--bucket-mb", "2"] + LINK, plan(dp=2), LINK),
    ("lab03 dp 2 overlap 2 MB", "real", "lab03_ddp", 2,
     ["--micro-batch", "8", "--mode", "overlap", "--bucket-mb", "2"] + LINK, plan(dp=2, overlap=True), LINK),
    ("lab04 ZeRO-1 dp 2", "real", "lab04_fsdp", 2, ["--micro-batch", "8", "--stage", "1"] + LINK,
     plan(dp=2, zero=1), LINK),
    ("lab04 ZeRO-3 dp 2", "real", "lab04_fsdp", 2, ["--micro-batch", "8", "--stage", "3", "--prefetch", "1"] + LINK,
     plan(dp=2, zero=3), LINK),
    ("lab05 tp 2", "real", "lab05_tensor_parallel", 2, ["--micro-batch", "8", "--tp", "2"] + LINK,
     plan(tp=2), LINK),
    ("lab05 tp 2 sp", "real", "lab05_tensor_parallel", 2, ["--micro-batch", "8", "--tp", "2", "--sequence-parallel"]
     + LINK, plan(tp=2, sp=True), LINK),
    ("lab06 pp 2 1F1B m 4, real", "real", "lab06_pipeline_parallel", 2, ["--micro-batch", "2", "--micro-batches", "4"]
     + LINK, plan(pp=2, B=2, m=4), LINK),
    ("lab06 pp 2 1F1B m 4, uniform", "uniform", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "4", "--uniform-compute-ms", "40"] + LINK,
     plan(pp=2, B=2, m=4, uniform=40), LINK),
    ("lab06 pp 2 GPipe m 4", "uniform", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "4", "--schedule", "gpipe", "--uniform-compute-ms", "40"] + LINK,
     plan(pp=2, B=2, m=4, schedule="gpipe", uniform=40), LINK),
    ("lab06 pp 2 interleaved v 2 m 4", "uniform", "lab06_pipeline_parallel", 2,
     ["--micro-batch", "2", "--micro-batches", "4", "--schedule", "interleaved", "--chunks", "2",
      "--uniform-compute-ms", "40"] + LINK, plan(pp=2, B=2, m=4, schedule="interleaved", chunks=2, uniform=40), LINK),
    ("lab06 pp 4 1F1B m 8", "uniform", "lab06_pipeline_parallel", 4,
     ["--micro-batch", "1", "--micro-batches", "8", "--uniform-compute-ms", "40"] + LINK,
     plan(pp=4, B=1, m=8, uniform=40), LINK),
    ("lab07 tp 2 x pp 2", "uniform", "lab07_parallel_3d", 4,
     ["--tp", "2", "--pp", "2", "--micro-batch", "2", "--micro-batches", "4", "--uniform-compute-ms", "40"] + NODES,
     plan(tp=2, pp=2, B=2, m=4, uniform=40), NODES),
    ("lab07 pp 2 x dp 2 ZeRO-1", "uniform", "lab07_parallel_3d", 4,
     ["--tp", "1", "--pp", "2", "--zero1", "--micro-batch", "2", "--micro-batches", "4", "--uniform-compute-ms", "40"]
     + NODES, plan(pp=2, dp=2, B=2, m=4, zero=1, uniform=40), NODES),
    ("lab07 tp 2 x pp 2 x dp 2", "uniform", "lab07_parallel_3d", 8,
     ["--tp", "2", "--pp", "2", "--micro-batch", "2", "--micro-batches", "4", "--uniform-compute-ms", "40"]
     + ["--ranks-per-node", "4"] + NODES[2:], plan(tp=2, pp=2, dp=2, B=2, m=4, uniform=40),
     ["--ranks-per-node", "4"] + NODES[2:]),
]


def run_lab(a, name, program, ranks, args):
    run_id = f"v{abs(hash(name)) % 10**6}-{time.time_ns() % 10**9}"
    cmd = [os.path.join(a.build_dir, "bin", "reference", program)] + DEMO + args + [
        "--steps", str(a.steps), "--warmup", "1", "--val-every", "0", "--val-batches", "1", "--sample-tokens", "0",
        "--threads", "1", "--log-dir", a.log_dir, "--run-id", run_id, "--quiet", "--calibration", a.calibration]
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"plan_validate: {name}: the run failed:\n  {' '.join(cmd)}\n" + (p.stdout + p.stderr)[-3000:])
    lab = program[:5]
    step_ms, model_bytes, total_bytes = 0.0, 0, 0
    for f in glob.glob(os.path.join(a.log_dir, lab, run_id, "rank*.jsonl")):
        recs = [json.loads(line) for line in open(f)]
        summary = [r for r in recs if r.get("type") == "summary"][-1]
        last = [r for r in recs if r.get("type") == "step"][-1]
        step_ms = max(step_ms, summary["mean_step_ms"])
        model_bytes = max(model_bytes, sum(last[f"memory_{c}_peak_bytes"]
                                           for c in ("params", "grads", "optimizer_state", "activations")))
        total_bytes = max(total_bytes, last["memory_peak_bytes"])
    return step_ms, model_bytes, total_bytes


def predict(a, layout, links, peak_tflops, efficiency):
    x = layout
    cmd = [os.path.join(a.build_dir, "bin", "sl_plan"), "--model", "demo", "--seq-len", "64", "--precision", "fp32",
           "--gpu", "cpu", "--peak-tflops", repr(peak_tflops), "--efficiency", repr(efficiency), "--memory-gb", "1",
           "--memory-bandwidth-gbs", str(a.bandwidth_gbs), "--tp", str(x["tp"]), "--pp", str(x["pp"]),
           "--dp", str(x["dp"]), "--micro-batch", str(x["B"]), "--micro-batches", str(x["m"]),
           "--global-batch", str(x["dp"] * x["B"] * x["m"]), "--zero", str(x["zero"]), "--schedule", x["schedule"],
           "--chunks", str(x["chunks"]), "--uniform-compute-ms", str(x["uniform"]), "--json"]
    cmd += ["--sp"] if x["sp"] else []
    cmd += ["--overlap-dp"] if x["overlap"] else []
    # the run's links: --link L (one link; inside a node) or the simulated nodes; --link-slowdown F
    link = links[links.index("--link") + 1] if "--link" in links else "none"
    inter = links[links.index("--inter-link") + 1] if "--inter-link" in links else link
    per_node = links[links.index("--ranks-per-node") + 1] if "--ranks-per-node" in links else "1024"
    slowdown = links[links.index("--link-slowdown") + 1] if "--link-slowdown" in links else "1"
    cmd += ["--intra", link, "--inter", inter, "--gpus-per-node", per_node, "--link-slowdown", slowdown]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"plan_validate: sl_plan failed:\n  {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "plan_validate"))
    ap.add_argument("--steps", type=int, default=6, help="steps per run (the first is the warm-up, not timed)")
    ap.add_argument("--bandwidth-gbs", type=float, default=10.0,
                    help="memory bandwidth for the optimizer's pass, GB/s (lab 00's memcpy figure)")
    ap.add_argument("--calibration", default=os.path.join(REPO, "runs", "calibration", "cpu_1t.json"))
    ap.add_argument("--repeats", type=int, default=3, help="runs of each row (round and round); the median is kept")
    ap.add_argument("--only", action="append", default=[], help="rows whose name contains this (repeatable)")
    a = ap.parse_args()
    a.log_dir = os.path.join(a.out, "logs")
    programs = [os.path.join("bin", "sl_plan"), os.path.join("bin", "sl_calibrate")] + sorted(
        {os.path.join("bin", "reference", r[2]) for r in ROWS})
    missing = [p for p in programs if not os.access(os.path.join(a.build_dir, p), os.X_OK)]
    if missing:
        sys.exit(f"plan_validate: {', '.join(missing)} not built in {a.build_dir}\n"
                 f"  hint: cmake --build {shown_dir(a.build_dir)} (every program), then run this again")
    if not os.path.isdir(os.path.join(REPO, "data", "kjv")):
        sys.exit("plan_validate: data/kjv does not exist (the lab programs train on it)\n"
                 "  hint: scripts/prepare_corpus.sh")
    if not os.path.exists(a.calibration):
        subprocess.run([os.path.join(a.build_dir, "bin", "sl_calibrate"), "--threads", "1"], cwd=REPO, check=True)
    peak = json.load(open(a.calibration))["flops_per_s"]
    print(f"peak: {peak / 1e9:.1f} GFLOP/s a rank ({a.calibration}); optimizer at {a.bandwidth_gbs} GB/s", flush=True)
    # Every row a.repeats times, round and round (a noisy machine slows neighbours alike), the median kept.
    todo = [r for r in ROWS if not a.only or any(o in r[0] for o in a.only) or r[0] in CALIBRATION_ROWS]
    assert len({r[0] for r in ROWS}) == len(ROWS), "row names are keys: make them unique"
    measured = {r[0]: [] for r in todo}
    for k in range(a.repeats):
        for name, kind, program, ranks, args, layout, links in todo:
            measured[name].append(run_lab(a, name, program, ranks, args))
            print(f"  run {k + 1}/{a.repeats} {name}: {measured[name][-1][0]:.1f} ms", flush=True)
    median = {n: statistics.median(v[0] for v in runs) for n, runs in measured.items()}
    # The CPU's efficiency, measured on the two calibration rows: their compute (the step less the optimizer's
    # predicted pass; no link) against their GEMM FLOPs at the calibrated peak, with one and with two ranks
    # busy on the machine. Every real row then uses the one for its rank count: one number per count.
    efficiency = {}
    for ranks, name in ((1, CALIBRATION_ROWS[0]), (2, CALIBRATION_ROWS[1])):
        row = next(r for r in ROWS if r[0] == name)
        at_peak = predict(a, row[5], row[6], peak / 1e12, 1.0)["time"]
        efficiency[ranks] = at_peak["compute_ms"] / (median[name] - at_peak["optimizer_ms"])
        print(f"efficiency with {ranks} rank(s) busy: {efficiency[ranks]:.3f} ({name}: {median[name]:.1f} ms a "
              f"step, {at_peak['compute_ms']:.1f} ms of GEMM FLOPs at the peak, {at_peak['optimizer_ms']:.1f} ms "
              f"of optimizer)", flush=True)
    results = []
    for name, kind, program, ranks, args, layout, links in todo:
        if name in CALIBRATION_ROWS:
            continue
        step_ms = median[name]
        model_bytes = max(v[1] for v in measured[name])
        total_bytes = max(v[2] for v in measured[name])
        pred = predict(a, layout, links, peak / 1e12, efficiency[min(ranks, 2)])
        r = dict(name=name, kind=kind, ranks=ranks, layout=pred["layout"], measured_step_ms=step_ms,
                 measured_runs_ms=[v[0] for v in measured[name]], predicted_step_ms=pred["time"]["step_ms"],
                 measured_model_bytes=model_bytes, measured_total_bytes=total_bytes,
                 predicted_bytes=pred["memory"]["total_bytes"], predicted=pred["time"])
        results.append(r)
        print(f"{name:34s} {kind:7s} step {step_ms:8.1f} ms, predicted {r['predicted_step_ms']:8.1f} "
              f"({100 * (r['predicted_step_ms'] / step_ms - 1):+.1f} %) | memory {model_bytes / 2**20:7.3f} MiB, "
              f"predicted {r['predicted_bytes'] / 2**20:7.3f} ({100 * (r['predicted_bytes'] / model_bytes - 1):+.2f} %),"
              f" whole peak {total_bytes / 2**20:7.3f}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    json.dump(dict(peak_flops_per_s=peak, efficiency=efficiency, repeats=a.repeats, rows=results),
              open(os.path.join(a.out, "results.json"), "w"), indent=1)
    lines = [f"CPU: {peak / 1e9:.1f} GFLOP/s a rank (sgemm calibration), efficiency {efficiency[1]:.3f} with one rank "
             f"busy, {efficiency[2]:.3f} with two; step times are medians of {a.repeats} runs", "",
             "| layout (lab) | compute | ranks | step ms measured | predicted | error | memory MiB measured "
             "(4 categories) | predicted | error | whole peak MiB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['kind']} | {r['ranks']} | {r['measured_step_ms']:.1f} | "
                     f"{r['predicted_step_ms']:.1f} | {100 * (r['predicted_step_ms'] / r['measured_step_ms'] - 1):+.1f} % | "
                     f"{r['measured_model_bytes'] / 2**20:.3f} | {r['predicted_bytes'] / 2**20:.3f} | "
                     f"{100 * (r['predicted_bytes'] / r['measured_model_bytes'] - 1):+.2f} % | "
                     f"{r['measured_total_bytes'] / 2**20:.3f} |")
    open(os.path.join(a.out, "validation.md"), "w").write("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
