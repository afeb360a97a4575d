#!/usr/bin/env python3
"""pp_bubble_sweep.py — lab 06's bubble sweep: GPipe, 1F1B and interleaved 1F1B against the bubble formula.

Runs the reference lab06_pipeline_parallel once per (p, schedule, m): p = 2 and 4 stages (mpirun -np p),
GPipe, 1F1B and interleaved 1F1B (v = 2 chunks per rank; only the m that are multiples of p), m micro-batches
per optimizer step, with --uniform-compute-ms F: every stage's forward of a micro-batch takes F ms and its
backward 2F ms (per chunk F/v and 2F/v), which is what the bubble formula assumes. From each run's logs
(<log-dir>/lab06/<run id>/rank<k>.jsonl, one per stage) it prints a Markdown table:

  bubble           measured: the step record's `bubble` = 1 - (the stage's time inside its forwards and
                   backwards) / (the step's window, barrier to barrier); the median over the timed steps
                   (step 0 is warm-up) and over the stages. It sits above the formula by "extra ms"
  formula          (p - 1)/(v m + p - 1) (Narayanan et al. 2021, Sec. 2.2; lab06::bubble_formula, logged)
  extra ms         the step's window minus the ideal schedule's length, compute_ms / (1 - formula) (median
                   over steps and stages): the optimizer step, the clipping norm's all-reduce and the tied
                   embedding's sync after the last backward, message latency, any overrun. About constant in m,
                   so the measured bubble approaches the formula as m (and F) grow
  tokens/s         rank 0's summary (timed steps; all stages together, one global batch per step)
  act. peak MiB    per stage, stage 0 first: the allocator's peak of category activations over the run
                   (summary memory_activations_peak_bytes). GPipe holds all m micro-batches on every stage,
                   1F1B min(m, p - s) on stage s: the memory 1F1B saves
  step ms          mean of the timed steps (rank 0's summary)
  note             "compute overran F: stage k N %" when a stage's real compute took longer than the uniform
                   time (its median compute_ms above 1.05 x 3 F m): its bubble no longer measures the schedule alone

With --links, a second table: the same 4-stage 1F1B pipeline (m = 8, no uniform compute) over --link nvlink and
--link ethernet100 (simulated links on every stage boundary), beside lab 05's tensor parallelism on the same 4
ranks (lab05_tensor_parallel --tp 4: same model, the same global batch as 8 micro-steps of --micro-batch, same
T) over the same two links:

  step ms          mean of the timed steps (rank 0's summary)
  waited ms        exposed communication per step, the mean over ranks of the summary's comm_ms: the time a
                   rank sat in a blocking call. A pipeline stage waits in its receives, so this holds the
                   bubble too; a tensor-parallel rank waits in its all-reduces
  link ms          what the simulated link charged per step (comm_modeled_ms, mean over ranks): the pipeline's
                   sends are asynchronous and overlap the sender's compute, the all-reduces block
  calls, KiB/step  per rank and step: point-to-point messages (p2p_calls, p2p_payload_bytes) against
                   collectives (tp_calls, tp_payload_bytes)
  vs nvlink        step ms over ethernet100 minus over nvlink: what the slow link cost the step
The lesson: a pipeline only sends each micro-batch's (B, T, C) activation across a stage boundary, once each
way, and overlaps it; tensor parallelism all-reduces that much 2(2L+1) times per micro-batch and waits for each.
The pipeline tolerates a slow link, tensor parallelism does not. On this CPU the compute is ~1000x slower than
a GPU's, so at --link-slowdown 1 either link is a small share of the step, the step times differ by noise, and
only the link ms column shows it; --link-slowdown 100 (both programs) brings the link-to-compute ratio nearer a
GPU's (measured on 2 loaded cores: tp 4 +1104 ms per step from NVLink to Ethernet, the pipeline -4 ms, noise).

  bench/pp_bubble_sweep.py                              # p 2, 4 x 3 schedules x m 1 2 4 8 16: 24 runs
  bench/pp_bubble_sweep.py --quick --links --out bubble.md   # m 1 4 8, and the link table; both into bubble.md
  bench/pp_bubble_sweep.py --quick --calibration runs/calibration/cpu_1t.json  # the same, ~2-3x faster (below)
  bench/pp_bubble_sweep.py --ranks 2 --micro-batches 2 4 --uniform-compute-ms 5 --steps 3 --timeline-m 4 \\
      --log-dir DIR                                     # scripts/notebooks.sh --make-logs (the notebook's CI logs)
  bench/pp_bubble_sweep.py --links --no-bubble --link-slowdown 100   # only the link table, links 100x slower
  bench/pp_bubble_sweep.py --from-logs DIR              # the tables again from an earlier sweep's --log-dir

Time: a run costs 1-3 s here, or 4-6 s without --calibration, when each run re-checks the cached CPU peak with
a quick d12-shape sgemm pass on every rank (the tables show no MFU, so nothing is lost); --quick --links made
18 runs in 37 s with --calibration on 2 cores at load average 4.6.

Runs with m = --timeline-m (default 8) also log a timeline of step 1 (notebooks/06_pipeline_parallel.ipynb
draws it as the pipeline picture). Every run has a timeout (--timeout-s); a failed or timed-out run is reported
with its command and the end of its output, marked FAILED in the table, and the sweep exits 1 at the end.
The demo model has L = 4 layers: interleaved at p = 4 with v = 2 needs L divisible by 8 and is left out
(--interleaved-model d24 runs those rows on GPT-2 350M shapes: heavy, and its compute overruns F on a CPU).

Needs mpirun (as root it sets OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 itself) and the corpus
(scripts/prepare_corpus.sh). On 2 cores, 4 ranks share the cores (mpirun --oversubscribe, 1 thread per rank):
tokens/s and step ms of oversubscribed ranks are not meaningful, and with uniform compute they measure the
uniform time anyway; the bubble with uniform compute is meaningful, since every stage's forward and backward
take the same fixed time whatever the cores do (the note column says when that failed).
"""
import argparse
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

SCHEDULES = ["gpipe", "1f1b", "interleaved"]  # the default sweep
# --schedules may also name ZB-H1 (its bubble: (p - 1)/(3 m + p - 1), logged as config.bubble_formula):
# notebooks/logs/06_pipeline_parallel.sh runs it once, for the notebook's pipeline picture of I and W.
ALL_SCHEDULES = SCHEDULES + ["zb-h1"]
LINKS = ["nvlink", "ethernet100"]
# n_layer of the model presets (common/src/model/gpt2_layout.cpp GPTConfig::preset): which layouts are possible.
N_LAYER = {"tiny": 2, "demo": 4, "d12": 12, "d24": 24, "d36": 36, "d48": 48}
MIB = 2**20


# ------------------------------------------------------------------------------------------------
# Running one program


class RunFailed(Exception):
    pass


def mpirun(binary, np_, args, log_dir, lab, run_id, timeout_s):
    """Runs binary on np_ ranks; returns the run's rank records {rank: [records]}. Raises RunFailed with the
    command, the reason and the end of the output when it exits non-zero, times out or logs no summary."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), binary] + args + \
        ["--log-dir", log_dir, "--run-id", run_id]
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # its own session: on a timeout mpirun and its ranks are ended together, by this process group's id
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # mpirun forwards SIGTERM to its ranks
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out = ""
        raise RunFailed(failure(cmd, f"timed out after {timeout_s} s (--timeout-s)", out or ""))
    if proc.returncode != 0:
        raise RunFailed(failure(cmd, f"exited with status {proc.returncode}", out))
    ranks = read_rank_logs(os.path.join(log_dir, lab, run_id))
    missing = [k for k in range(np_) if not any(r.get("type") == "summary" for r in ranks.get(k, []))]
    if missing:
        raise RunFailed(failure(cmd, f"exited 0 but rank(s) {missing} wrote no summary record", out))
    return ranks


def failure(cmd, why, out):
    tail = "\n".join("     | " + line for line in out.strip().splitlines()[-25:])
    return f"[scalelab] pp_bubble_sweep: a run {why}\n[scalelab]   cmd: {' '.join(cmd)}\n{tail}"


def read_rank_logs(run_dir):
    """{rank: [records]} of every rank<k>.jsonl in run_dir; a half-written last line is skipped."""
    ranks = {}
    for path in glob.glob(os.path.join(run_dir, "rank*.jsonl")):
        m = re.search(r"rank(\d+)\.jsonl$", path)
        if not m:
            continue
        records = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        ranks[int(m.group(1))] = records
    return ranks


# ------------------------------------------------------------------------------------------------
# What a run's logs say


def last(records, kind):
    found = [r for r in records if r.get("type") == kind]
    return found[-1] if found else None


def run_info(ranks):
    """Rank 0's (last) run record, or None."""
    return last(ranks.get(0, []), "run")


def timed_steps(records):
    steps = [r for r in records if r.get("type") == "step"]
    later = [r for r in steps if r.get("step", 0) >= 1]  # step 0 is warm-up
    return later or steps


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def link_preset(cfg):
    """The run's --link preset: the logged link name less a slowdown's "/100" suffix (driver::make_link)."""
    return str(cfg.get("link", "none")).split("/")[0]


def pipeline_row(ranks):
    """The numbers of one lab 06 run (ranks: {rank: records})."""
    info = run_info(ranks)
    cfg = info["config"]
    world = int(info["world_size"])
    summaries = [last(ranks.get(k, []), "summary") for k in range(world)]
    steps = [s for k in range(world) for s in timed_steps(ranks.get(k, []))]
    bubbles = [s["bubble"] for s in steps if s.get("bubble") is not None]
    compute = [s["compute_ms"] for s in steps if s.get("compute_ms") is not None]
    s0 = summaries[0] or {}
    formula = float(cfg.get("bubble_formula", float("nan")))
    # the window beyond the ideal schedule's length (its compute / (1 - formula)): what the formula leaves out
    extra = [s["pipeline_ms"] - s["compute_ms"] / (1 - formula) for s in steps
             if s.get("pipeline_ms") is not None and s.get("compute_ms") is not None and formula < 1]
    f_ms = float(cfg.get("uniform_compute_ms", 0))
    ideal_ms = 3 * f_ms * int(cfg["micro_batches"])  # m forwards of F and backwards of 2F (v chunks of F/v, 2F/v)
    overran = []
    for k in range(world):
        c = [s["compute_ms"] for s in timed_steps(ranks.get(k, [])) if s.get("compute_ms") is not None]
        if f_ms > 0 and c and statistics.median(c) > 1.05 * ideal_ms:
            overran.append(f"stage {k} {100 * (statistics.median(c) / ideal_ms - 1):.0f} %")
    return {
        "p": world, "schedule": cfg["schedule"], "v": int(cfg.get("chunks", 1)), "m": int(cfg["micro_batches"]),
        "model": cfg.get("model"), "link": link_preset(cfg), "uniform_compute_ms": f_ms,
        "bubble": statistics.median(bubbles) if bubbles else float("nan"), "formula": formula,
        "extra_ms": statistics.median(extra) if extra else float("nan"),
        "tokens_per_s": s0.get("tokens_per_s"), "step_ms": s0.get("step_ms", s0.get("mean_step_ms")),
        "act_peak_mib": [(s or {}).get("memory_activations_peak_bytes", float("nan")) / MIB for s in summaries],
        "waited_ms": mean([(s or {}).get("comm_ms") for s in summaries]),
        "link_ms": mean([(s or {}).get("comm_modeled_ms", 0.0) for s in summaries]),
        "calls": mean([s.get("p2p_calls") for s in steps]),
        "payload_kib": mean([s.get("p2p_payload_bytes") for s in steps]) / 1024,
        "note": "compute overran F: " + ", ".join(overran) if overran else "",
        "cfg": cfg, "steps": int(cfg.get("steps", 0)),
    }


def tensor_row(ranks):
    """The numbers of one lab 05 run (the --links comparison)."""
    info = run_info(ranks)
    cfg = info["config"]
    world = int(info["world_size"])
    summaries = [last(ranks.get(k, []), "summary") or {} for k in range(world)]
    steps = [s for k in range(world) for s in timed_steps(ranks.get(k, []))]
    return {"p": world, "tp": int(cfg.get("tp", world)), "link": link_preset(cfg), "model": cfg.get("model"),
            "step_ms": summaries[0].get("step_ms", summaries[0].get("mean_step_ms")),
            "tokens_per_s": summaries[0].get("tokens_per_s"),
            "waited_ms": mean([s.get("comm_ms") for s in summaries]),
            "link_ms": mean([s.get("comm_modeled_ms", 0.0) for s in summaries]),
            "calls": mean([s.get("tp_calls") for s in steps]),
            "payload_kib": mean([s.get("tp_payload_bytes") for s in steps]) / 1024, "cfg": cfg}


# ------------------------------------------------------------------------------------------------
# The sweep


def skip_reason(model, p, schedule, v, m):
    """Why lab 06 would refuse this layout (lab06::make_layout's rules), or "" if it can run."""
    L = N_LAYER.get(model)
    if L is not None and p > L:
        return f"{model} has L = {L} layers: at most {L} stages"
    if schedule == "zb-h1" and m < p:
        return f"m = {m} < p = {p}: ZB-H1's formula assumes m >= p"
    if schedule == "interleaved":
        if m % p:
            return f"m = {m} not a multiple of p = {p}"
        if L is not None and L % (p * v):
            return f"{model} has L = {L} layers, not divisible by p x v = {p * v}"
    return ""


def sweep(a, log_dir, stamp):
    """Runs table 1's configurations; returns (rows, failures, notes)."""
    rows, failures, notes = [], [], []
    common = ["--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch), "--steps", str(a.steps),
              "--val-every", "0", "--val-batches", "1", "--quiet", "--threads", "1", "--data", a.data,
              "--uniform-compute-ms", f"{a.uniform_compute_ms:g}"] + a.extra
    for p in a.ranks:
        for schedule in a.schedules:
            v = 2 if schedule == "interleaved" else 1
            model = (a.interleaved_model or a.model) if schedule == "interleaved" else a.model
            for m in a.micro_batches:
                why = skip_reason(model, p, schedule, v, m)
                if why:
                    notes.append(f"p = {p} {schedule} m = {m} left out: {why}")
                    continue
                run_id = f"bubble-{stamp}-p{p}-{schedule}-v{v}-m{m}"
                args = common + ["--model", model, "--schedule", schedule, "--micro-batches", str(m),
                                 "--chunks", str(v), "--timeline-steps", "1" if m == a.timeline_m else "0"]
                label = f"p {p} {schedule} v {v} m {m}"
                rows.append(run_one(a.bin, p, args, log_dir, "lab06", run_id, a.timeout_s, label, pipeline_row,
                                    failures, {"p": p, "schedule": schedule, "v": v, "m": m}))
    return rows, failures, notes


def link_sweep(a, log_dir, stamp):
    """Table 2: the 4-stage 1F1B pipeline and tp = 4 over nvlink and ethernet100; returns (pp, tp, failures)."""
    pp_rows, tp_rows, failures = [], [], []
    m = 8
    common = ["--model", a.model, "--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch), "--steps",
              str(a.steps), "--val-every", "0", "--val-batches", "1", "--quiet", "--threads", "1", "--data", a.data,
              "--timeline-steps", "0", "--link-slowdown", f"{a.link_slowdown:g}"] + a.extra
    for link in LINKS:
        pp_rows.append(run_one(a.bin, 4, common + ["--schedule", "1f1b", "--micro-batches", str(m), "--link", link],
                               log_dir, "lab06", f"links-{stamp}-pp4-{link}", a.timeout_s, f"pipeline 4 stages {link}",
                               pipeline_row, failures, {"p": 4, "link": link}))
        tp_rows.append(run_one(a.tp_bin, 4, common + ["--tp", "4", "--global-batch", str(m * a.micro_batch),
                                                      "--link", link],
                               log_dir, "lab05", f"links-{stamp}-tp4-{link}", a.timeout_s, f"tensor parallel 4 {link}",
                               tensor_row, failures, {"p": 4, "link": link}))
    return pp_rows, tp_rows, failures


def run_one(binary, np_, args, log_dir, lab, run_id, timeout_s, label, reader, failures, key):
    t0 = time.monotonic()
    try:
        row = reader(mpirun(binary, np_, args, log_dir, lab, run_id, timeout_s))
        print(f"   {label}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
        return row
    except RunFailed as e:
        print(f"   {label}: FAILED after {time.monotonic() - t0:.1f} s\n{e}", file=sys.stderr)
        failures.append(label)
        return dict(key, failed=True, run_id=run_id)


def from_logs(log_dir):
    """Table 1's and table 2's rows from an earlier sweep's logs: the newest finished run of each configuration."""
    def newest(pattern, reader, key_of):
        chosen = {}
        for d in sorted(glob.glob(os.path.join(log_dir, pattern)), key=os.path.getmtime):  # oldest first
            ranks = read_rank_logs(d)
            info = run_info(ranks)
            if info is None or any(last(ranks.get(k, []), "summary") is None for k in range(int(info["world_size"]))):
                print(f"skipped {d}: not finished (a rank has no summary record)", file=sys.stderr)
                continue
            row = reader(ranks)
            chosen.pop(key_of(row), None)
            chosen[key_of(row)] = row  # a later run of the same configuration replaces an earlier one
        return list(chosen.values())

    rows = newest("lab06/bubble-*", pipeline_row, lambda r: (r["p"], r["schedule"], r["v"], r["m"]))
    order = {s: i for i, s in enumerate(ALL_SCHEDULES)}
    rows.sort(key=lambda r: (r["p"], order.get(r["schedule"], 9), r["m"]))
    pp = newest("lab06/links-*", pipeline_row, lambda r: r["link"])
    tp = newest("lab05/links-*", tensor_row, lambda r: r["link"])
    return rows, pp, tp


# ------------------------------------------------------------------------------------------------
# The tables


def num(v, spec):
    return "-" if v is None or v != v else f"{v:{spec}}"


def bubble_table(rows):
    lines = ["| p | schedule | v | m | bubble (measured) | formula | extra ms | tokens/s | act. peak MiB per stage "
             "| step ms | note |", "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        if r.get("failed"):
            lines.append(f"| {r['p']} | {r['schedule']} | {r['v']} | {r['m']} | - | - | - | - | - | - | "
                         f"FAILED ({r['run_id']}) |")
            continue
        mem = " / ".join(num(x, ".2f") for x in r["act_peak_mib"])
        lines.append(f"| {r['p']} | {r['schedule']} | {r['v']} | {r['m']} | {num(r['bubble'], '.3f')} | "
                     f"{num(r['formula'], '.3f')} | {num(r['extra_ms'], '.1f')} | {num(r['tokens_per_s'], ',.0f')} | "
                     f"{mem} | "
                     f"{num(r['step_ms'], '.1f')} | {r['note']} |")
    return "\n".join(lines)


def link_table(pp, tp):
    lines = ["| parallelism (4 ranks) | link | step ms | waited ms (share) | link ms | calls, KiB per rank per step "
             "| vs nvlink |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, rows in (("pipeline, 1F1B, m 8", pp), ("tensor parallel, tp 4", tp)):
        base = next((r for r in rows if not r.get("failed") and r["link"] == "nvlink"), None)
        for r in sorted(rows, key=lambda r: LINKS.index(r["link"]) if r["link"] in LINKS else 9):
            if r.get("failed"):
                lines.append(f"| {name} | {r['link']} | FAILED ({r['run_id']}) | | | | |")
                continue
            share = 100 * r["waited_ms"] / r["step_ms"] if r["step_ms"] else float("nan")
            delta = "-" if base is None or r is base else f"{r['step_ms'] - base['step_ms']:+.1f} ms"
            lines.append(f"| {name} | {r['link']} | {num(r['step_ms'], '.1f')} | {num(r['waited_ms'], '.1f')} "
                         f"({num(share, '.0f')} %) | {num(r['link_ms'], '.2f')} | {num(r['calls'], '.0f')}, "
                         f"{num(r['payload_kib'], ',.0f')} | {delta} |")
    return "\n".join(lines)


def report(rows, pp, tp, log_dir, notes, out_path, load=""):
    """Prints the tables (and writes them to out_path). load: the load average when the runs began ("" from logs)."""
    ok = [r for r in rows + pp if not r.get("failed")]
    cfg = ok[0]["cfg"] if ok else {}
    load = f", load average {load}" if load else ""
    parts = []
    if rows and not any(not r.get("failed") for r in rows):
        parts.append(f"lab 06 bubble sweep: no run finished; logs in {log_dir}\n\n" + bubble_table(rows))
    elif rows:
        f = ok[0]["uniform_compute_ms"]
        parts.append(f"lab 06 bubble sweep: model {cfg.get('model', '?')}, T={cfg.get('T', '?')}, micro-batch "
                     f"{cfg.get('micro_batch', '?')}, uniform compute {f:g} ms forward / {2 * f:g} ms backward per "
                     f"micro-batch, {cfg.get('steps', '?')} steps (step 0 untimed), 1 thread per rank, "
                     f"{os.cpu_count()} cores{load}; logs in {log_dir}\n\n" + bubble_table(rows))
        if notes:
            parts.append("\n".join(f"- {n}" for n in notes))
        if (os.cpu_count() or 1) < max(r["p"] for r in rows):
            parts.append(f"{os.cpu_count()} cores: the ranks are oversubscribed, tokens/s and step ms are not "
                         "meaningful; the bubble with uniform compute is.")
    if pp or tp:
        c = (next((r for r in pp + tp if not r.get("failed")), None) or {}).get("cfg", {})
        parts.append(f"Links: model {c.get('model', '?')}, T={c.get('T', '?')}, global batch "
                     f"{c.get('global_batch', '?')} = 8 x micro-batch {c.get('micro_batch', '?')}, no uniform "
                     f"compute, link slowdown {c.get('link_slowdown', 1):g}, 4 ranks on {os.cpu_count()} cores{load}\n\n"
                     + link_table(pp, tp))
        if float(c.get("link_slowdown", 1)) == 1:
            parts.append("On CPU ranks the compute is ~1000x slower than a GPU's, so either link is a small share of "
                         "the step and the step times differ by noise; the link ms column is the modelled cost. "
                         "--link-slowdown 100 shows a GPU's proportions.")
    text = "\n\n".join(parts) + "\n"
    print("\n" + text)
    if out_path:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {out_path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin/reference/lab06_pipeline_parallel")
    ap.add_argument("--tp-bin", default="build/bin/reference/lab05_tensor_parallel", help="--links: lab 05")
    ap.add_argument("--data", default="data/kjv")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--interleaved-model", default="", help="the interleaved rows' model (default: --model)")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="per run; step 0 is warm-up (at least 2)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="pipeline stages p (default 2 4)")
    ap.add_argument("--schedules", nargs="+", default=SCHEDULES, choices=ALL_SCHEDULES)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=None, help="m (default 1 2 4 8 16)")
    ap.add_argument("--quick", action="store_true", help="m 1 4 8")
    ap.add_argument("--uniform-compute-ms", type=float, default=10.0, help="F: forward F ms, backward 2F ms")
    ap.add_argument("--timeline-m", type=int, default=8, help="runs with this m log a timeline of step 1 (0: none)")
    ap.add_argument("--links", action="store_true", help="also the link table: pipeline vs tensor parallel")
    ap.add_argument("--no-bubble", action="store_true", help="with --links: only the link table")
    ap.add_argument("--link-slowdown", type=float, default=1.0, help="--links: both programs' --link-slowdown")
    ap.add_argument("--calibration", default="", help="passed to every run: its CPU peak from this file (e.g. "
                    "runs/calibration/cpu_1t.json) instead of a quick re-check of the cached one (~1-2 s per run "
                    "on 2 loaded cores; the tables show no MFU)")
    ap.add_argument("--timeout-s", type=int, default=300, help="per run")
    ap.add_argument("--log-dir", default="", help="keep the runs' logs here (default: a temp dir)")
    ap.add_argument("--from-logs", default="", help="no runs: the tables (bubble, links: those it holds) of an "
                    "earlier sweep's --log-dir")
    ap.add_argument("--out", default="", help="also write the tables to this Markdown file")
    a = ap.parse_args()
    a.micro_batches = a.micro_batches or ([1, 4, 8] if a.quick else [1, 2, 4, 8, 16])

    if a.from_logs:
        rows, pp, tp = from_logs(a.from_logs)
        if not rows and not pp and not tp:
            sys.exit(f"[scalelab] pp_bubble_sweep: no finished bubble-* or links-* runs under {a.from_logs}/lab06")
        return report(rows, pp, tp, a.from_logs, [], a.out)  # both tables where the logs have them

    if a.steps < 2:
        ap.error(f"--steps {a.steps}: need at least 2 (step 0 is warm-up and not timed)")
    if min(a.micro_batches) < 1 or min(a.ranks) < 1:
        ap.error("--micro-batches and --ranks are whole numbers >= 1")
    if a.no_bubble and not a.links:
        ap.error("--no-bubble only with --links")
    need = [(a.bin, "lab06_pipeline_parallel_ref")] + ([(a.tp_bin, "lab05_tensor_parallel_ref")] if a.links else [])
    for path, target in need:
        if not os.access(path, os.X_OK):
            sys.exit(f"[scalelab] pp_bubble_sweep: {path} not found\n[scalelab]   hint: cmake --build build --target "
                     f"{target} (or pass --bin / --tp-bin)")
    if not os.path.isfile(os.path.join(a.data, "val_000000.bin")):
        sys.exit(f"[scalelab] pp_bubble_sweep: {a.data} holds no token shards\n[scalelab]   hint: "
                 "scripts/prepare_corpus.sh")
    if subprocess.run(["sh", "-c", "command -v mpirun"], capture_output=True).returncode != 0:
        sys.exit("[scalelab] pp_bubble_sweep: mpirun not found\n[scalelab]   hint: scripts/install_deps.sh (OpenMPI)")

    if a.calibration and not os.path.isfile(a.calibration):
        sys.exit(f"[scalelab] pp_bubble_sweep: --calibration {a.calibration} not found\n[scalelab]   hint: "
                 "build/bin/sl_calibrate --threads 1 writes runs/calibration/cpu_1t.json (or leave --calibration out)")
    a.extra = ["--calibration", a.calibration] if a.calibration else []
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="pp_sweep.")
    stamp = time.strftime("%Y%m%dT%H%M%S")  # run ids: bubble-<stamp>-<layout>, new on every sweep
    load = f"{os.getloadavg()[0]:.1f} at the start" if hasattr(os, "getloadavg") else ""  # other work slows every run
    t0 = time.monotonic()
    rows, failures, notes = ([], [], []) if a.no_bubble else sweep(a, log_dir, stamp)
    pp, tp = [], []
    if a.links:
        pp, tp, link_failures = link_sweep(a, log_dir, stamp)
        failures += link_failures
    print(f"   {len(rows) + len(pp) + len(tp)} runs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    report(rows, pp, tp, log_dir, notes, a.out, load)
    if failures:
        sys.exit(f"[scalelab] pp_bubble_sweep: {len(failures)} run(s) failed: {', '.join(failures)} (above)")


if __name__ == "__main__":
    main()
