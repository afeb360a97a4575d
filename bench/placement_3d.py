#!/usr/bin/env python3
"""bench/placement_3d.py — lab 07 on a simulated cluster: the placement rule measured, and a layout search.

  bench/placement_3d.py [--bin build/bin/reference/lab07_parallel_3d] [--out runs/placement_3d]
                        [--placement] [--search] [--quick] [--slowdown 300] [--compute-ms 100] ...
  bench/placement_3d.py --sim-search [--sim-model gpt-7b] [--sim-ranks 64] [--only 8x4x2] ...

Both parts run the lab 07 program on 8 CPU ranks (mpirun --oversubscribe) as 2 simulated nodes of 4 ranks:
groups inside a node get --intra (nvlink), groups across nodes --inter (infiniband). A 2-core machine cannot
time 8 ranks' compute, so every stage's compute is UNIFORM (--uniform-compute-ms: the time a device would
take; the real compute must fit inside it, and every row says how often it did not) and both links are the
alpha-beta models of docs/communicator.md slowed by one factor (--slowdown), so that the simulated times
dominate the real MPI latency of this machine (0.3-2 ms a message). What is measured is therefore the
schedule: who waits for whom, over which link, and the bubble, with real messages and real dependencies.

  --placement  the 2 x 2 x 2 grid (1F1B, m 4) in each of the 6 orders of the axes: step time, tokens/s, the
               exposed wait per group, and the link time the alpha-beta model charged per group (with the tp
               group's charge computed here by hand from its calls and bytes, to check the arithmetic).
  --search     every (tp, pp, dp, m) of 8 ranks the model allows (tp | heads, pp <= layers), the global batch
               fixed: ranked by tokens/s; each stage's uniform compute scaled by its share of the work
               (compute-ms x 32 / (tp pp dp m)), so that the device count, not the layout, sets the work.
  --sim-search the layout search at the lesson's sizes on a simulated cluster (docs/simulation.md): lab 07
               with --device sim --timing-only --backend sim, --sim-model (gpt-7b) on --sim-ranks (64) simulated
               H100s in nodes of 8 (NVLink inside, InfiniBand across: the sim backend's own links), bf16, T 2048,
               1F1B, order tp-dp-pp; no uniform compute and no slowdown: every op and call is charged its modelled
               time. Pruned: tp in 1, 2, 4, 8 (inside a node, dividing the heads), pp a power of two up to the layers,
               dp the rest, micro-batch 1 and the global batch fixed (--sim-global-batch 64 sequences), so one m
               = 64 / dp per (tp, pp). Each layout is first priced by lab 09's planner (bin/sl_plan --json: compute
               as the model's FLOPs at half the fp32 peak, which the kit's bf16 policy multiplies at; not op by
               op: --per-op does not price that policy yet); a layout it says does not fit is listed with its
               figure and not run. Each run: its step time, tokens/s and
               MFU (virtual time, the slowest rank's step), the planner's beside them, memory per rank (the
               fullest rank's params + grads + optimizer state + activations peaks, and whether they equal the
               planner's to the byte), and the run's wall time and peak host memory (bench/host_memory.py).
               The planner's best layouts run first; --sim-budget-s S starts no run after S seconds (the rest are
               listed with the planner's figures, "not run"). Writes <out>/sim_search.md and sim_results.json;
               --sim-replan remakes them from sim_results.json, asking the planner again, without running.
Writes <out>/placement.md, <out>/search.md and <out>/results.json; prints the tables.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import host_memory  # bench/host_memory.py: wall time and peak host memory of a command's process tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDERS = ["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-tp-dp", "dp-pp-tp", "pp-dp-tp"]
# The presets of common/src/comm/link_model.cpp (docs/communicator.md "The simulated link"): base, alpha, B.
PRESETS = {"nvlink": (8.4e-6, 3.4e-6, 370e9), "pcie": (8.4e-6, 5.7e-6, 25e9),
           "ethernet100": (8.4e-6, 14e-6, 12e9), "infiniband": (8.4e-6, 14e-6, 46e9)}


def run_one(a, tp, pp, dp, m, order, compute_ms, run_id):
    micro_batch = a.global_batch // (dp * m)
    cmd = ["mpirun", "-np", str(tp * pp * dp), "--oversubscribe", "--bind-to", "none", a.bin,
           "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--order", order, "--micro-batches", str(m),
           "--micro-batch", str(micro_batch), "--seq-len", str(a.seq_len), "--model", a.model,
           "--ranks-per-node", str(a.ranks_per_node), "--link", a.intra, "--inter-link", a.inter,
           "--link-slowdown", str(a.slowdown), "--uniform-compute-ms", f"{compute_ms:.3f}",
           "--steps", str(a.steps), "--warmup", "1", "--val-every", "0", "--val-batches", "1", "--timeline-steps", "0",
           "--log-dir", a.log_dir, "--run-id", run_id, "--wait-timeout-s", "120", "--quiet"]
    if a.calibration:
        cmd += ["--calibration", a.calibration]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
        return {"ok": False, "why": " / ".join(tail), "wall_s": wall}
    return dict(read_run(os.path.join(a.log_dir, "lab07", run_id)), ok=True, wall_s=wall)


def read_run(run_dir):
    """Per rank: the timed steps' (step >= 1) medians; then the worst rank's step and each group's mean wait."""
    ranks = []
    for path in sorted(glob.glob(os.path.join(run_dir, "rank*.jsonl"))):
        steps, summary, config = [], {}, {}
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "step" and r["step"] >= 1:
                    steps.append(r)
                elif r.get("type") == "summary":
                    summary = r
                elif r.get("type") == "run":
                    config = r.get("config", {})
        ranks.append((steps, summary, config))
    out = {"step_ms": max(statistics.median(s["step_ms"] for s in st) for st, _, _ in ranks),
           "tokens_per_s": ranks[0][1].get("tokens_per_s", 0.0),
           "overruns": sum(s.get("uniform_overruns", 0) for st, _, _ in ranks for s in st),
           "memory_peak_mib": max(sm.get("memory_peak_bytes", 0) for _, sm, _ in ranks) / 2**20,
           "bubble_formula": ranks[0][1].get("bubble_formula", 0.0),
           "links": {g: ranks[0][2].get(g + "_link", "") for g in ("tp", "pp", "dp", "embedding")}}
    for g in ("tp", "pp", "dp", "embedding"):
        for key in ("wait_ms", "modeled_ms", "calls", "payload_bytes"):
            # the mean over ranks of each rank's median over its timed steps
            vals = [statistics.median(s["groups"][g][key] for s in st) for st, _, _ in ranks]
            out[f"{g}_{key}"] = sum(vals) / len(vals)
    return out


def tp_by_hand(r, tp, slowdown):
    """The alpha-beta charge of the tp group, computed here: every call is an all_reduce of n = tp ranks:
    base + 2 (n - 1) alpha + 2 (n - 1) / n S / B, S its bytes; latencies x slowdown, bandwidth / slowdown."""
    if tp == 1:
        return 0.0
    base, alpha, bw = PRESETS[r["links"]["tp"].split("/")[0]]
    n = tp
    latency = r["tp_calls"] * (base + 2 * (n - 1) * alpha)
    return 1e3 * slowdown * (latency + 2 * (n - 1) / n * r["tp_payload_bytes"] / bw)


def fmt_row(cells):
    return "| " + " | ".join(cells) + " |"


def placement(a):
    rows, results = [], []
    for order in ORDERS:
        r = run_one(a, 2, 2, 2, a.m, order, a.compute_ms, f"placement-{order}-{int(time.time())}")
        results.append(dict(r, order=order))
        if not r["ok"]:
            rows.append(fmt_row([order, "failed: " + r["why"]] + [""] * 9))
            continue
        print(f"  {order}: step {r['step_ms']:.0f} ms, {r['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
        rows.append(fmt_row([
            f"`{order}`", f"{r['links']['tp']} / {r['links']['pp']} / {r['links']['dp']}",
            f"{r['step_ms']:.0f}", f"{r['tokens_per_s']:.0f}",
            f"{r['tp_wait_ms']:.0f} ({r['tp_modeled_ms']:.0f}; {tp_by_hand(r, 2, a.slowdown):.0f})",
            f"{r['pp_wait_ms']:.0f} ({r['pp_modeled_ms']:.0f})", f"{r['dp_wait_ms']:.0f} ({r['dp_modeled_ms']:.0f})",
            f"{r['embedding_wait_ms']:.0f} ({r['embedding_modeled_ms']:.0f})", str(r["overruns"])]))
    head = ("| order | link of tp / pp / dp | step ms | tokens/s | tp wait (charged; by hand) ms | pp wait (charged) "
            "| dp wait (charged) | embedding wait (charged) | overruns |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    text = head + "\n" + "\n".join(rows)
    return text, results


def search(a):
    layouts = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if a.ranks % (tp * pp) or a.heads % tp or pp > a.layers:
                continue
            dp = a.ranks // (tp * pp)
            for m in (1, 2, 4, 8):
                if a.global_batch % (dp * m) == 0:
                    layouts.append((tp, pp, dp, m))
    if a.quick:
        layouts = [l for l in layouts if l[3] in (1, 4)]
    results = []
    for i, (tp, pp, dp, m) in enumerate(layouts):
        f_ms = a.compute_ms * 32.0 / (tp * pp * dp * m)  # the 2x2x2 m 4 stage's F, scaled by the work
        r = run_one(a, tp, pp, dp, m, "tp-dp-pp", f_ms, f"search-{tp}-{pp}-{dp}-{m}-{int(time.time())}")
        r.update(tp=tp, pp=pp, dp=dp, m=m, compute_ms=f_ms)
        results.append(r)
        print(f"  [{i + 1}/{len(layouts)}] tp {tp} pp {pp} dp {dp} m {m}: "
              + (f"{r['tokens_per_s']:.0f} tokens/s" if r["ok"] else "failed"), file=sys.stderr)
    ok = sorted([r for r in results if r["ok"]], key=lambda r: -r["tokens_per_s"])
    rows = []
    for rank, r in enumerate(ok, 1):
        rows.append(fmt_row([str(rank), f"{r['tp']} x {r['pp']} x {r['dp']}", str(r["m"]),
                             str(a.global_batch // (r["dp"] * r["m"])), f"{r['compute_ms']:.0f}",
                             f"{r['tokens_per_s']:.0f}", f"{r['step_ms']:.0f}", f"{r['bubble_formula']:.3f}",
                             f"{r['tp_wait_ms']:.0f}", f"{r['pp_wait_ms']:.0f}", f"{r['dp_wait_ms']:.0f}",
                             f"{r['memory_peak_mib']:.1f}", str(r["overruns"])]))
    for r in results:
        if not r["ok"]:
            rows.append(fmt_row(["-", f"{r['tp']} x {r['pp']} x {r['dp']}", str(r["m"]), "", "", "failed: " + r["why"]]
                                + [""] * 7))
    head = ("| rank | tp x pp x dp | m | micro-batch | F ms | tokens/s | step ms | bubble formula | tp wait ms | "
            "pp wait ms | dp wait ms | peak MiB per rank | overruns |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    return head + "\n" + "\n".join(rows), results


# The simulated search's presets: (heads, layers), as GPTConfig::preset (docs/simulation.md "Presets").
SIM_MODELS = {"gpt-7b": (32, 32), "gpt-70b": (64, 80)}
CATEGORIES = ("params", "grads", "optimizer_state", "activations")  # what the planner counts
SIM_FP32_PEAK_TFLOPS = 67  # H100 SXM dense fp32 (docs/simulation.md "GPU models")


def sim_layouts(a):
    """The pruned set of --sim-search: (tp, pp, dp, m) with tp | heads inside a node, pp <= layers, B = 1."""
    heads, layers = SIM_MODELS[a.sim_model]
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16, 32, 64):
            if a.sim_ranks % (tp * pp) or heads % tp or pp > layers or tp > a.sim_ranks_per_node:
                continue
            dp = a.sim_ranks // (tp * pp)
            if a.sim_global_batch % dp == 0:
                out.append((tp, pp, dp, a.sim_global_batch // dp))
    if a.only:
        out = [l for l in out if f"{l[0]}x{l[1]}x{l[2]}" in a.only]
    return out


def sim_plan(a, tp, pp, dp, m):
    """bin/sl_plan --json for one layout: the parsed object. Its default pricing (the model's FLOPs at the peak x
    --efficiency 0.5; its op-by-op pricing, --per-op, does not cover the kit's bf16 policy yet), at the fp32
    peak: the kit's --precision bf16 stores bf16 and multiplies in fp32 (docs/cuda_backend.md), and the
    simulated GPU charges its GEMMs at the fp32 peak, which the runs' MFU divides by too."""
    cmd = [os.path.join(a.build_dir, "bin", "sl_plan"), "--model", a.sim_model, "--gpu", "h100", "--gpus",
           str(a.sim_ranks), "--gpus-per-node", str(a.sim_ranks_per_node), "--seq-len", str(a.sim_seq_len),
           "--global-batch", str(a.sim_global_batch), "--precision", "bf16", "--tp", str(tp), "--pp", str(pp),
           "--dp", str(dp), "--micro-batch", "1", "--micro-batches", str(m), "--schedule", "1f1b", "--zero", "0",
           "--peak-tflops", str(SIM_FP32_PEAK_TFLOPS), "--json"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if "{" not in p.stdout:  # a layout that does not fit exits 1 with its JSON; anything else is a failure
        sys.exit(f"sl_plan failed:\n  {' '.join(cmd)}\n{(p.stdout + p.stderr)[-2000:]}")
    return json.loads(p.stdout[p.stdout.index("{"):])


def sim_run(a, tp, pp, dp, m):
    """One timing-only run of lab 07 on the simulated cluster: its figures, wall time and host memory."""
    run_id = f"sim-{tp}-{pp}-{dp}-{m}-{int(time.time())}"
    cmd = ["mpirun", "-np", str(a.sim_ranks), "--oversubscribe", "--bind-to", "none", a.bin, "--device", "sim",
           "--timing-only", "--backend", "sim", "--model", a.sim_model, "--seq-len", str(a.sim_seq_len),
           "--ranks-per-node", str(a.sim_ranks_per_node), "--precision", "bf16", "--tp", str(tp), "--pp", str(pp),
           "--dp", str(dp), "--micro-batch", "1", "--micro-batches", str(m), "--order", "tp-dp-pp", "--schedule",
           "1f1b", "--steps", "2", "--warmup", "1", "--val-every", "0", "--val-batches", "1", "--sample-tokens", "0",
           "--threads", "1", "--timeline-steps", "0", "--quiet", "--log-dir", a.log_dir, "--run-id", run_id]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = host_memory.run_sampled(cmd, cwd=REPO, env=env, timeout=a.sim_timeout_s)
    done = {"wall_s": r["wall_s"], "host_gib": r["peak_pss_bytes"] / 2**30, "processes": r["peak_processes"]}
    if r["rc"] != 0:
        tail = r["output"].strip().splitlines()[-4:]
        return dict(done, ok=False, why=("ran past --sim-timeout-s; " if r["rc"] == 124 else "") + " / ".join(tail))
    run_dir = os.path.join(a.log_dir, "lab07", run_id)
    per_rank = []  # (sum of the four categories' peaks, mfu of the timed step) per rank
    for path in sorted(glob.glob(os.path.join(run_dir, "rank*.jsonl"))):
        with open(path) as f:
            steps = [x for x in map(json.loads, f) if x.get("type") == "step"]
        last = steps[-1]
        per_rank.append((sum(last[f"memory_{c}_peak_bytes"] for c in CATEGORIES), last.get("mfu") or 0.0))
    got = read_run(run_dir)
    return dict(done, ok=True, step_ms=got["step_ms"], tokens_per_s=got["tokens_per_s"],
                mfu=min(x[1] for x in per_rank), memory_bytes=max(x[0] for x in per_rank),
                memory_peak_mib=got["memory_peak_mib"])


def sim_planned(a, r):
    """r (a layout's record: tp, pp, dp, m) with the planner's figures added (plan_*)."""
    plan = sim_plan(a, r["tp"], r["pp"], r["dp"], r["m"])
    t, mem = plan["time"], plan["memory"]
    r.update(plan_fits=plan["fits"], plan_why_not=plan["why_not"], plan_step_ms=t["step_ms"],
             plan_tokens_per_s=t["tokens_per_s"], plan_mfu=t["mfu"], plan_memory_bytes=mem["total_bytes"],
             plan_stage=mem["stage"])
    return r


def sim_search(a):
    results = [sim_planned(a, {"tp": tp, "pp": pp, "dp": dp, "m": m}) for tp, pp, dp, m in sim_layouts(a)]
    # The planner's best first: with --sim-budget-s, the layouts it ranks lowest are the ones left out.
    results.sort(key=lambda r: -r["plan_tokens_per_s"])
    t0 = time.time()
    for i, r in enumerate(results):
        tp, pp, dp, m = r["tp"], r["pp"], r["dp"], r["m"]
        if r["plan_fits"] and a.sim_budget_s and time.time() - t0 > a.sim_budget_s:
            r["left_out"] = True
            continue
        if r["plan_fits"]:
            r.update(sim_run(a, tp, pp, dp, m))
        print(f"  [{i + 1}/{len(results)}] tp {tp} pp {pp} dp {dp} m {m}: " + (
            "planner: does not fit" if not r["plan_fits"] else
            f"{r['tokens_per_s']:.0f} tokens/s (virtual), {r['wall_s']:.0f} s wall, {r['host_gib']:.1f} GiB host"
            if r["ok"] else "failed: " + r["why"]), file=sys.stderr)
    return sim_table(results), results


def sim_table(results):
    rows = []
    ran = sorted([r for r in results if r.get("ok")], key=lambda r: -r["tokens_per_s"])
    for rank, r in enumerate(ran, 1):
        gap = r["memory_bytes"] - r["plan_memory_bytes"]
        same = "yes" if gap == 0 else f"no ({gap:+d} B)"
        rows.append(fmt_row([str(rank), f"{r['tp']} x {r['pp']} x {r['dp']}", str(r["m"]),
                             f"{r['step_ms']:.0f} ({r['plan_step_ms']:.0f})",
                             f"{r['tokens_per_s']:,.0f} ({r['plan_tokens_per_s']:,.0f})",
                             f"{100 * r['mfu']:.1f} ({100 * r['plan_mfu']:.1f})",
                             f"{r['memory_bytes'] / 1e9:.2f} ({r['plan_memory_bytes'] / 1e9:.2f})", same,
                             f"{r['wall_s']:.0f}", f"{r['host_gib']:.1f}"]))
    for r in results:
        if not r["plan_fits"]:
            rows.append(fmt_row(["-", f"{r['tp']} x {r['pp']} x {r['dp']}", str(r["m"]), "", "", "",
                                 f"- ({r['plan_memory_bytes'] / 1e9:.1f})", "planner: does not fit, not run", "", ""]))
        elif r.get("left_out"):
            rows.append(fmt_row(["-", f"{r['tp']} x {r['pp']} x {r['dp']}", str(r["m"]),
                                 f"- ({r['plan_step_ms']:.0f})", f"- ({r['plan_tokens_per_s']:,.0f})",
                                 f"- ({100 * r['plan_mfu']:.1f})", f"- ({r['plan_memory_bytes'] / 1e9:.2f})",
                                 "not run: past --sim-budget-s", "", ""]))
        elif not r.get("ok"):
            rows.append(fmt_row(["-", f"{r['tp']} x {r['pp']} x {r['dp']}", str(r["m"]), "", "", "", "",
                                 "failed: " + r["why"].replace("|", "/"), f"{r['wall_s']:.0f}", ""]))
    head = ("| rank | tp x pp x dp | m | step ms (planner) | tokens/s (planner) | MFU % (planner) | "
            "GB per rank (planner) | equal to the byte | wall s | host GiB |\n"
            "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|")
    return head + "\n" + "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/reference/lab07_parallel_3d"),
                    help="the lab 07 program (default: the reference)")
    ap.add_argument("--out", default=os.path.join(REPO, "runs/placement_3d"),
                    help="where placement.md, search.md and results.json go")
    ap.add_argument("--log-dir", default=None, help="the runs' logs (default <out>/logs)")
    ap.add_argument("--placement", action="store_true", help="the 6 orders of the 2 x 2 x 2 grid")
    ap.add_argument("--search", action="store_true", help="every (tp, pp, dp, m) of 8 ranks")
    ap.add_argument("--quick", action="store_true", help="search only m 1 and 4")
    ap.add_argument("--sim-search", action="store_true", help="the layout search on a simulated cluster, timing-only")
    ap.add_argument("--sim-model", default="gpt-7b", choices=sorted(SIM_MODELS), help="--sim-search's model")
    ap.add_argument("--sim-ranks", type=int, default=64, help="--sim-search's simulated GPUs")
    ap.add_argument("--sim-ranks-per-node", type=int, default=8, help="--sim-search's GPUs per node")
    ap.add_argument("--sim-seq-len", type=int, default=2048, help="--sim-search's T")
    ap.add_argument("--sim-global-batch", type=int, default=64, help="--sim-search's sequences per step")
    ap.add_argument("--sim-timeout-s", type=float, default=600, help="--sim-search: a run's wall-time limit")
    ap.add_argument("--sim-budget-s", type=float, default=0,
                    help="--sim-search: start no run after this many seconds (0: run every layout that fits)")
    ap.add_argument("--sim-replan", action="store_true",
                    help="--sim-search: no runs; the planner's figures and the table again, from "
                         "<out>/sim_results.json")
    ap.add_argument("--only", action="append", default=[], help="--sim-search: only this layout, e.g. 8x4x2")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"), help="where bin/sl_plan is")
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the search (the placement runs use 8)")
    ap.add_argument("--ranks-per-node", type=int, default=4, help="simulated node size")
    ap.add_argument("--intra", default="nvlink", help="the link inside a node (a --link preset)")
    ap.add_argument("--inter", default="infiniband", help="the link across nodes (a --link preset)")
    ap.add_argument("--slowdown", type=float, default=300.0, help="both links this many times slower (latencies x, bandwidths /); compute is --compute-ms")
    ap.add_argument("--compute-ms", type=float, default=100.0,
                    help="uniform forward of one micro-batch on one stage of the 2x2x2 m 4 layout (backward: twice)")
    ap.add_argument("--m", type=int, default=4, help="micro-batches of the placement runs")
    ap.add_argument("--model", default="demo", help="the model preset (--heads and --layers must match it)")
    ap.add_argument("--heads", type=int, default=4, help="the model's heads (tp must divide them)")
    ap.add_argument("--layers", type=int, default=4, help="the model's layers (pp at most)")
    ap.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step, all replicas")
    ap.add_argument("--seq-len", type=int, default=64, help="T")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is not timed)")
    ap.add_argument("--calibration", default=os.path.join(REPO, "runs/calibration/cpu_1t.json"),
                    help="the MFU peak file (skips the sgemm check of every run; '' to measure)")
    a = ap.parse_args()
    if not (a.placement or a.search or a.sim_search):
        a.placement = a.search = True
    if a.calibration and not os.path.exists(a.calibration):
        a.calibration = ""
    a.log_dir = a.log_dir or os.path.join(a.out, "logs")
    os.makedirs(a.out, exist_ok=True)
    setup = (f"{a.ranks} ranks as {a.ranks // a.ranks_per_node} nodes x {a.ranks_per_node}; links {a.intra} inside "
             f"a node, {a.inter} across, both x{a.slowdown:g} slower; model {a.model}, global batch {a.global_batch} x "
             f"T {a.seq_len}; uniform compute F = {a.compute_ms:g} ms forward (2F backward) per micro-batch per stage "
             f"of the 2x2x2 m {a.m} layout; {a.steps - 1} timed steps per run (medians; the slowest rank's step)")
    results = {"setup": setup}
    if a.placement:
        print("placement (2 x 2 x 2, 1F1B, m %d): %s" % (a.m, setup), file=sys.stderr)
        text, results["placement"] = placement(a)
        with open(os.path.join(a.out, "placement.md"), "w") as f:
            f.write(setup + "\n\n" + text + "\n")
        print(text)
    if a.search:
        print("layout search: " + setup, file=sys.stderr)
        text, results["search"] = search(a)
        with open(os.path.join(a.out, "search.md"), "w") as f:
            f.write(setup + "\n\n" + text + "\n")
        print(text)
    if a.sim_search:
        setup = (f"lab 07, {a.sim_model}, {a.sim_ranks} simulated H100 in nodes of {a.sim_ranks_per_node} (NVLink "
                 f"inside, InfiniBand across), timing-only, bf16, global batch {a.sim_global_batch} x T "
                 f"{a.sim_seq_len}, micro-batch 1, 1F1B, order tp-dp-pp, 1 timed step (virtual time)")
        print("simulated layout search: " + setup, file=sys.stderr)
        t0 = time.time()
        if a.sim_replan:  # the runs of an earlier search, the planner asked again
            with open(os.path.join(a.out, "sim_results.json")) as f:
                earlier = json.load(f)
            found, wall = [sim_planned(a, r) for r in earlier["search"]], earlier["wall_s"]
            text = sim_table(found)
        else:
            text, found = sim_search(a)
            wall = time.time() - t0
        load = open("/proc/loadavg").read().split()[0]
        text += (f"\n\nThe search took {wall:.0f} s of wall time on {os.cpu_count()} cores (load average {load} at "
                 "its end).")
        with open(os.path.join(a.out, "sim_search.md"), "w") as f:
            f.write(setup + "\n\n" + text + "\n")
        with open(os.path.join(a.out, "sim_results.json"), "w") as f:
            json.dump({"setup": setup, "wall_s": wall, "search": found}, f, indent=1)
        print(text)
    if a.placement or a.search:
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
