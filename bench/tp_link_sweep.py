#!/usr/bin/env python3
"""tp_link_sweep.py — lab 05's link sweep: tensor parallelism at tp = 1, 2, 4 over simulated links.

Runs the reference lab05_tensor_parallel (one tensor-parallel group of tp ranks, no data parallelism, the
same global batch at every tp) once per (tp, link), and twice more at 4 ranks = 2 groups of tp = 2 on a
simulated cluster of nodes (--ranks-per-node): the tp groups inside a node (NVLink) and across nodes
(100 Gb/s Ethernet). From each run's log (runs/lab05/<run_id>/rank0.jsonl) it prints a Markdown table:

  tokens/s, step ms      measured (the timed steps; step 0 left out)
  waited ms              exposed communication: how long each step waited in its collectives (measured)
  link ms                what the simulated link charged per step (measured: the modelled times of the
                         step's collectives, which the communicator waited out)
  predicted ms           the alpha-beta arithmetic for the same step, from the README's collective count:
                         per micro-batch 2(2L+1) all-reduces of S = B*T*C*4 bytes (f and g, the embedding,
                         the head), the loss's two (B*T and 2*B*T floats) and the gradient norm's one float;
                         each costs base + 2(n-1) alpha + 2(n-1)/n * bytes / bandwidth (link_model.cpp);
                         with data parallelism also one all-reduce per unit of the shard's gradients

Then the same arithmetic for GPT-2 d12 on GPUs (an assumption, stated: H100 SXM bf16 989 TFLOP/s at 40 %
MFU, docs/references.md; bf16 activations; micro-batch 8 x 1024 tokens), where compute is ~1000x faster than
this CPU and the link's share shows what the lesson claims. That table is arithmetic, not a measurement.

  bench/tp_link_sweep.py                           # the sweep (about 3 minutes on 2 cores)
  bench/tp_link_sweep.py --quick --log-dir DIR     # tp 1, 2 x none, ethernet100 (the notebook's CI logs)
  bench/tp_link_sweep.py --from-logs DIR           # the tables again, from an earlier sweep's logs

Needs mpirun (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1) and the corpus
(scripts/prepare_corpus.sh). On 2 cores, 4 ranks share the cores: tokens/s at tp = 4 measures that too.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

LINKS = ["none", "nvlink", "pcie", "ethernet100"]


def all_reduce_s(link, nbytes, n):
    """The link model's seconds for one all_reduce of nbytes among n ranks (common/src/comm/link_model.cpp)."""
    if n <= 1 or link["bandwidth"] <= 0:
        return 0.0
    return link["base"] + 2 * (n - 1) * link["alpha"] + 2.0 * (n - 1) / n * nbytes / link["bandwidth"]


def predicted_step_s(link, n, L, B, T, C, micro_steps, act_bytes=4):
    """Alpha-beta seconds of one step's tensor-parallel collectives (no sequence parallelism)."""
    S = B * T * C * act_bytes
    per_micro = 2 * (2 * L + 1) * all_reduce_s(link, S, n)       # f and g in every block, embedding, head
    per_micro += all_reduce_s(link, B * T * 4, n) + all_reduce_s(link, 2 * B * T * 4, n)  # the loss
    return micro_steps * per_micro + all_reduce_s(link, 4, n)    # + the gradient norm's one float


def predicted_run_ms(cfg):
    """predicted_step_s for a run's logged config, plus its data-parallel all-reduces (one per owned unit
    of the shard's gradients, lab05::average_over_replicas), in ms."""
    tp_link = {"alpha": cfg["link_alpha_s"], "base": cfg["link_base_s"], "bandwidth": cfg["link_bandwidth_bytes_per_s"]}
    s = predicted_step_s(tp_link, cfg["tp"], cfg["n_layer"], cfg["micro_batch"], cfg["T"], cfg["n_embd"],
                         cfg["micro_steps"])
    dp = cfg.get("dp", 1)
    if dp > 1 and cfg.get("dp_link_bandwidth_bytes_per_s", 0) > 0:
        dp_link = {"alpha": cfg["dp_link_alpha_s"], "base": cfg["dp_link_base_s"],
                   "bandwidth": cfg["dp_link_bandwidth_bytes_per_s"]}
        units, grad_bytes = cfg["owned_units"], 4 * cfg["shard_params"]
        s += units * all_reduce_s(dp_link, 0, dp) + (all_reduce_s(dp_link, grad_bytes, dp) - all_reduce_s(dp_link, 0, dp))
    return 1e3 * s


def run(binary, np_, args, log_dir, run_id):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), binary] + args + \
        ["--log-dir", log_dir, "--run-id", run_id]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(log_dir, "lab05", run_id, "rank0.jsonl"))]
    cfg = next(r for r in records if r.get("type") == "run")["config"]
    summary = next(r for r in records if r.get("type") == "summary")
    return cfg, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin/reference/lab05_tensor_parallel")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--log-dir", default="", help="keep the runs' logs here (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="tp 1, 2 x none, ethernet100 only (seconds)")
    ap.add_argument("--from-logs", default="", help="no runs: print the tables of an earlier sweep's --log-dir")
    a = ap.parse_args()
    if not os.path.isfile(a.bin):
        sys.exit(f"{a.bin} not found: build it (cmake --build build --target lab05_tensor_parallel_ref)")

    if a.from_logs:
        return report(from_logs(a.from_logs), a.from_logs)
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="tp_sweep.")
    common = ["--model", a.model, "--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch), "--steps",
              str(a.steps), "--val-every", "0", "--val-batches", "1", "--quiet", "--threads", "1",
              "--warmup", "2"]
    tps, links = ([1, 2], ["none", "ethernet100"]) if a.quick else ([1, 2, 4], LINKS)
    stamp = time.strftime("%Y%m%dT%H%M%S")  # run ids: sweep-<stamp>-<layout>, new on every sweep
    runs = []  # (label, tp, ranks, link label, cfg, summary)
    for link in links:
        for tp in tps:
            if tp == 1 and link != links[0]:
                continue  # one rank never crosses a link
            cfg, s = run(a.bin, tp, common + ["--tp", str(tp), "--link", link, "--timeline-steps", "2"], log_dir,
                         f"sweep-{stamp}-tp{tp}-{link}")
            runs.append((label_of(cfg, tp), tp, tp, link if tp > 1 else "-", cfg, s))
    if not a.quick:  # 2 groups of tp = 2 on 4 ranks: each group inside one node, or across two
        for rpn in (2, 1):
            cfg, s = run(a.bin, 4, common + ["--tp", "2", "--link", "nvlink", "--inter-link", "ethernet100",
                                             "--ranks-per-node", str(rpn), "--timeline-steps", "0"], log_dir,
                         f"sweep-{stamp}-tp2dp2-rpn{rpn}")
            runs.append((label_of(cfg, 4), 2, 4, cfg["link"], cfg, s))
    report(runs, log_dir)


def label_of(cfg, ranks):
    if cfg.get("dp", 1) == 1:
        return f"tp {cfg['tp']}"
    rpn = cfg.get("ranks_per_node", 0)
    where = "inside a node" if rpn >= cfg["tp"] else "across nodes"
    return f"tp {cfg['tp']} x dp {cfg['dp']}, {rpn} rank(s)/node: tp {where}"


def from_logs(log_dir):
    """The runs of an earlier sweep (sweep-* run ids under <log_dir>/lab05), in the order they ran."""
    runs = []
    for path in sorted(glob.glob(os.path.join(log_dir, "lab05", "sweep-*", "rank0.jsonl")), key=os.path.getmtime):
        records = [json.loads(line) for line in open(path)]
        info = next(r for r in records if r.get("type") == "run")
        summary = next((r for r in records if r.get("type") == "summary"), None)
        if summary is None:
            continue  # a run that died
        cfg = info["config"]
        runs.append((label_of(cfg, info["world_size"]), cfg["tp"], info["world_size"],
                     cfg["link"] if cfg["tp"] > 1 else "-", cfg, summary))
    if not runs:
        sys.exit(f"no finished sweep-* runs under {log_dir}/lab05")
    return runs


def report(runs, log_dir):
    cfg0 = runs[0][4]
    print(f"lab 05 link sweep: model {cfg0['model']}, T={cfg0['T']}, micro-batch {cfg0['micro_batch']}, "
          f"{cfg0['steps']} steps, {cfg0['precision']}, 1 thread per rank, {os.cpu_count()} cores; logs in {log_dir}\n")
    print("| layout | ranks | tp link | tokens/s | MFU | step ms | waited ms (share) | link ms (share) | predicted ms |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for label, tp, ranks, link_name, cfg, s in runs:
        step, waited, link_ms = s["step_ms"], s.get("comm_ms") or 0.0, s.get("comm_modeled_ms", 0.0)
        print(f"| {label} | {ranks} | {link_name} | {s['tokens_per_s']:.0f} | {100 * s['mfu']:.1f} % | {step:.1f} | "
              f"{waited:.1f} ({100 * waited / step:.0f} %) | {link_ms:.2f} ({100 * link_ms / step:.1f} %) | "
              f"{predicted_run_ms(cfg):.2f} |")

    # The same arithmetic at GPU speed (assumptions in the docstring): where the lesson's claim shows.
    print("\nArithmetic, not a measurement: GPT-2 d12 (L=12, C=768, 124M params), micro-batch 8 x 1024 tokens per "
          "rank, bf16 activations, one H100 SXM per rank at 40 % of 989 TFLOP/s; link presets as above; no overlap.\n")
    print("| tp | compute ms | " + " | ".join(f"{k} comm ms (share)" for k in LINKS[1:]) + " |")
    print("|---:|---:|" + "---:|" * (len(LINKS) - 1))
    presets = {r[3]: {"alpha": r[4]["link_alpha_s"], "base": r[4]["link_base_s"],
                      "bandwidth": r[4]["link_bandwidth_bytes_per_s"]} for r in runs if r[1] > 1 and r[3] != "none"}
    for tp in (2, 4, 8):
        compute_s = 6 * 124e6 * 8 * 1024 / tp / (0.4 * 989e12)
        cells = []
        for k in LINKS[1:]:
            if k not in presets:
                cells.append("-")
                continue
            c = predicted_step_s(presets[k], tp, 12, 8, 1024, 768, 1, act_bytes=2)
            cells.append(f"{1e3 * c:.1f} ({100 * c / (c + compute_s):.0f} %)")
        print(f"| {tp} | {1e3 * compute_s:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
