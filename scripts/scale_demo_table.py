#!/usr/bin/env python3
"""scale_demo_table.py — the table and plot of scripts/scale_demo.sh, made from its runs' logs.

Reads the manifest scale_demo.sh wrote (one line per run: lab, ranks, threads per rank, oversubscribed,
status, run directory, output file), reads each run with notebooks/scalelab_logs.py (the notebooks'
reader: tokens/s and MFU from ``throughput``, efficiency from ``scaling``), prints ONE table and writes
scale_table.csv, scale_table.md and scale_plot.png into --out. Runs in .venv-notebooks/ (pandas, matplotlib).

    .venv-notebooks/bin/python scripts/scale_demo_table.py --manifest OUT/manifest.tsv --out OUT --cores 2

Columns (per run; "per rank" values are the largest over its ranks):
  tokens/s        all ranks together, timed steps (step 0 is warm-up); a step lasts as long as its slowest rank
  MFU             mean of the logged per-step mfu; the peak it divides by is the run record's peak_source
  mem/rank        memory_peak_bytes: the peak of the total of all allocator categories (not a sum of peaks)
  exposed comm    comm_ms / step_ms over the timed steps: the part of the step spent waiting for communication
  efficiency      tokens/s at N ranks / (N x tokens/s of the same lab at 1 rank); 1.0 is linear scaling (lab 07
                  has no 1-rank run: "-")
  note            oversubscribed, a simulated link, a failed run, "skipped:" and why (the lab's manifest), "does
                  not fit:" (a simulated GPU's out-of-memory: what would have been in use, and its memory); then
                  as the manifest's "table_note" says: "batch" (lab 01) the batch per step; "pipeline" (lab 06)
                  its schedule, m and measured bubble beside the formula (a stage idle in a receive also counts as
                  exposed comm); "grid" (lab 07) its grid (tp x pp x dp, order), then as "pipeline"
The row labels ("03 DDP") are each lab's number and title, from its manifest (scripts/lib/labs.py).
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "notebooks"))
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # headless: the plot goes to a file
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import labs as lab_manifests  # noqa: E402  scripts/lib/labs.py: each lab's title and table_note
import scalelab_logs as sl  # noqa: E402  the notebooks' reader: one reader for every plot of the logs

LABS = {lab["number"]: lab for lab in lab_manifests.load(str(ROOT))}
# The row labels of one-process programs (lab 01): their exposed comm reads "- (1 device)".
ONE_DEVICE = {f"{n} {lab['title']}" for n, lab in LABS.items() if lab["single_process"]}
OVERSUBSCRIBED = "oversubscribed: timings not meaningful"


def timed_steps(run: sl.Run) -> pd.DataFrame:
    s = run.steps
    if s.empty:
        return s
    later = s[s["step"] > s["step"].min()]  # step 0 is warm-up, as in the summaries and throughput()
    return later if not later.empty else s


def comm_share(run: sl.Run) -> float:
    """Exposed communication / step time over the timed steps, the largest over ranks; NaN when the
    lab does not measure it (lab 01: one device, comm_ms null)."""
    s = timed_steps(run)
    if s.empty or "comm_ms" not in s or s["comm_ms"].isna().all():
        return math.nan
    per_rank = s.groupby("rank").agg(comm=("comm_ms", "sum"), step=("step_ms", "sum"))
    return float((per_rank["comm"] / per_rank["step"]).max())


def memory_peak_bytes(run: sl.Run) -> float:
    """Peak of the total allocator bytes on the rank that held the most: the summary's figure (lab 01
    counts the device it trained on there), else the step records'."""
    for frame in (run.summaries, run.steps):
        if not frame.empty and "memory_peak_bytes" in frame and frame["memory_peak_bytes"].notna().any():
            return float(frame["memory_peak_bytes"].max())
    return math.nan


OOM_LINE = re.compile(r"out of memory on \S+: \d+ bytes for (\w+) would make (\d+) bytes in use, cap is (\d+) bytes")


def oom_note(output: Path) -> str:
    """The row of a run that did not fit its simulated GPU (scale_demo.sh's status "oom"): which allocation
    failed and how much would have been in use, from the run's output."""
    text = output.read_text(encoding="utf-8", errors="replace") if output.is_file() else ""
    m = OOM_LINE.search(text)
    if not m:
        return "does not fit the simulated GPU's memory"
    category, want, cap = m.group(1), int(m.group(2)), int(m.group(3))
    return f"does not fit: {category} would make {want / 1e9:.1f} GB in use of the simulated GPU's {cap / 1e9:.0f} GB"


def last_of_rank0(frame: pd.DataFrame, key: str) -> float:
    if frame.empty or key not in frame:
        return math.nan
    v = frame[frame["rank"] == frame["rank"].min()][key].dropna()
    return float(v.iloc[-1]) if not v.empty else math.nan


def pipeline_note(run: sl.Run) -> str:
    """A pipeline (table_note "pipeline", lab 06): the schedule, m, and the measured bubble (median over the timed
    steps and stages) beside the formula. A stage's idle time before a receive returns is also in the row's exposed comm."""
    cfg, s = run.config, timed_steps(run)
    bubble = float(s["bubble"].median()) if not s.empty and "bubble" in s else math.nan
    # Without uniform compute the idle share is the bubble plus every message and the optimizer step: far
    # above the formula when a stage's compute is as short as a message (the tiny model).
    uniform = float(cfg.get("uniform_compute_ms") or 0) > 0
    what = "bubble" if uniform else "idle share"
    assumes = "" if uniform else ", which assumes compute >> messages"
    return (f"{cfg.get('schedule')}, m = {cfg.get('micro_batches')}: {what} {fmt(bubble, '.2f')} (formula "
            f"{fmt(cfg.get('bubble_formula', math.nan), '.2f')}{assumes})")


def build_table(manifest: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    rows, peaks = [], []  # peaks: distinct "value FLOP/s per rank: source" strings, footnoted [1], [2], ...
    for lab, group in manifest.groupby("lab", sort=True):
        label = f"{lab} {LABS[lab]['title']}" if lab in LABS else lab
        table_note = (LABS[lab]["scale_demo"] or {}).get("table_note") if lab in LABS else None
        ok = group[group["status"] == "ok"]
        runs = {int(m.ranks): r for m in ok.itertuples() for r in sl.load_runs([m.run_dir])}
        eff = sl.scaling(list(runs.values()))  # empty when this lab has only one rank count
        eff_by_n = dict(zip(eff["world_size"], eff["efficiency"])) if not eff.empty else {}
        tput = sl.throughput(list(runs.values()))
        tput_by_n = {int(r.world_size): r for r in tput.itertuples()}
        for m in group.itertuples():
            n = int(m.ranks)
            row = {"lab": label, "ranks": n,
                   "threads_per_rank": "" if pd.isna(m.threads) else int(m.threads),
                   "tokens_per_s": math.nan, "mfu": math.nan, "peak": "", "memory_per_rank_mib": math.nan,
                   "exposed_comm_share": math.nan, "efficiency": math.nan, "final_loss": math.nan,
                   "val_loss_end": math.nan, "note": ""}
            run = runs.get(n)
            if m.status == "skipped":  # scale_demo.sh wrote why into the output file (the manifest's "skip": lab
                # 06, more ranks than layers; lab 07, fewer than 4 ranks)
                out = Path(m.output)
                row["note"] = out.read_text(encoding="utf-8").strip() if out.is_file() else "skipped"
                rows.append(row)
                continue
            if m.status == "oom":  # a simulated GPU too small for this layout: a result, not a failure
                row["note"] = oom_note(Path(m.output))
                rows.append(row)
                continue
            if m.status != "ok" or run is None:
                row["note"] = f"FAILED: see {Path(m.output).name}"
                rows.append(row)
                continue
            t = tput_by_n.get(n)
            if t is not None:
                row["tokens_per_s"], row["mfu"] = t.tokens_per_s, t.mfu
            peak = f"{run.info.get('peak_flops_per_s') or 0:.3g} FLOP/s per rank: {run.info.get('peak_source', '?')}"
            if peak not in peaks:
                peaks.append(peak)
            row["peak"] = f"[{peaks.index(peak) + 1}]"
            row["memory_per_rank_mib"] = memory_peak_bytes(run) / 2**20
            row["exposed_comm_share"] = comm_share(run)
            row["efficiency"] = eff_by_n.get(n, 1.0 if n == 1 else math.nan)
            row["final_loss"] = last_of_rank0(run.summaries, "final_loss")
            row["val_loss_end"] = last_of_rank0(run.summaries, "val_loss_end")
            if table_note == "batch" and run.config.get("B") is not None:  # no accumulation: one micro-batch a step
                row["note"] = f"batch {run.config['B']} per step (one device)"
            if table_note == "pipeline" and n > 1:  # a pipeline's exposed comm holds its bubble: the stages' idle time
                row["note"] = pipeline_note(run)
            if table_note == "grid":  # the grid, then its pipelines' bubble (all four groups' waits are exposed comm)
                cfg = run.config
                row["note"] = (f"tp {cfg.get('tp')} x pp {cfg.get('pp')} x dp {cfg.get('dp')} ({cfg.get('order')}), "
                               + pipeline_note(run))
            sim_default_links = run.info.get("device") == "sim" and run.config.get("link", "none") == "none"
            if (run.info.get("simulated") or run.config.get("link", "none") != "none") and not sim_default_links:
                link = f"simulated link {run.config.get('link')}"
                if run.info.get("device") == "sim" and run.config.get("ranks_per_node"):  # --ranks-per-node
                    inter = run.config.get("inter_link")  # lab 05's record names only the link inside
                    link = (f"nodes of {run.config['ranks_per_node']}: {run.config.get('link')} inside"
                            + (f", {inter} across" if inter else ""))
                elif run.info.get("device") == "sim" and n > 1:  # the launcher's ranks: one machine, one node
                    link = f"one node: {run.config.get('link')}"
                row["note"] = f"{row['note']}; {link}" if row["note"] else link
            if int(m.oversubscribed):
                row["note"] = f"{row['note']}; {OVERSUBSCRIBED}" if row["note"] else OVERSUBSCRIBED
            rows.append(row)
    return pd.DataFrame(rows), peaks


def fmt(v, spec: str, unit: str = "") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{unit}"


def markdown(table: pd.DataFrame) -> str:
    head = ["lab", "ranks", "threads/rank", "tokens/s", "MFU (peak)", "memory/rank, peak MiB",
            "exposed comm / step", "efficiency vs 1 rank", "final loss", "val loss", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["--:"] * 8 + ["---"]) + "|"]
    for r in table.itertuples():
        cells = [r.lab, str(r.ranks), str(r.threads_per_rank) or "-", fmt(r.tokens_per_s, ",.0f"),
                 f"{fmt(100 * r.mfu, '.2f', ' %')} {r.peak}".strip(), fmt(r.memory_per_rank_mib, ".1f"),
                 fmt(100 * r.exposed_comm_share, ".1f", " %") if not math.isnan(r.exposed_comm_share)
                 else ("- (1 device)" if r.lab in ONE_DEVICE and not r.note.startswith("FAILED") else "-"),
                 fmt(r.efficiency, ".2f"), fmt(r.final_loss, ".4f"), fmt(r.val_loss_end, ".4f"), r.note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    fig, (ax_tps, ax_eff, ax_mem) = plt.subplots(1, 3, figsize=(15, 4))
    ok = table[table["tokens_per_s"].notna()]
    for lab, g in ok.groupby("lab", sort=True):
        g = g.sort_values("ranks")
        (line,) = ax_tps.plot(g["ranks"], g["tokens_per_s"], "o-", label=lab)
        ax_eff.plot(g["ranks"], g["efficiency"], "o-", color=line.get_color(), label=lab)
        ax_mem.plot(g["ranks"], g["memory_per_rank_mib"] / 1024, "o-", color=line.get_color(), label=lab)
        one = g[g["ranks"] == 1]["tokens_per_s"]
        if len(g) > 1 and not one.empty:  # linear scaling from this lab's 1-rank run
            ax_tps.plot(g["ranks"], one.iloc[0] * g["ranks"], "--", lw=0.8, color=line.get_color())
    bad = ok[ok["note"].str.contains("oversubscribed")]
    if not bad.empty:  # a cross over every row whose timings mean nothing
        ax_tps.plot(bad["ranks"], bad["tokens_per_s"], "x", ms=11, color="red")
        ax_eff.plot(bad["ranks"], bad["efficiency"], "x", ms=11, color="red", label="oversubscribed: not meaningful")
    ranks = sorted(table["ranks"].unique())
    ax_tps.set(xlabel="ranks", ylabel="tokens/s (all ranks)", title="throughput (dashed: linear)", xticks=ranks)
    ax_eff.axhline(1.0, color="k", ls="--", lw=0.8)
    top = max(1.2, float(ok["efficiency"].max()) * 1.1) if ok["efficiency"].notna().any() else 1.2
    ax_eff.set(xlabel="ranks", ylabel="tokens/s / (N x 1-rank tokens/s)", title="scaling efficiency",
               xticks=ranks, ylim=(0, top))
    ax_mem.set(xlabel="ranks", ylabel="GiB (peak, the fullest rank)", title="memory per rank", xticks=ranks,
               ylim=(0, None))
    if max(ranks) > 8:  # 1 to 64 ranks: powers of two evenly spaced
        for ax in (ax_tps, ax_eff, ax_mem):
            ax.set_xscale("log", base=2)
            ax.set_xlim(min(ranks) / 1.4, max(ranks) * 1.4)  # an axis with no point (efficiency without a
            ax.set_xticks(ranks, [str(n) for n in ranks])     # 1-rank run) still has a range to scale
            ax.minorticks_off()
    ax_tps.legend(fontsize=8)
    ax_eff.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--manifest", required=True, help="manifest.tsv written by scripts/scale_demo.sh")
    p.add_argument("--out", required=True, help="directory for scale_table.csv/.md and scale_plot.png")
    p.add_argument("--cores", type=int, default=0, help="logical CPUs of the machine (for the header)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--command", default="", help="the command line, repeated in the markdown")
    p.add_argument("--load", default="", help="the machine's load average when the runs started")
    p.add_argument("--wall-s", type=float, default=None, help="the runs' wall time on this machine, seconds")
    a = p.parse_args()
    manifest = pd.read_csv(a.manifest, sep="\t", dtype={"lab": str})
    table, peaks = build_table(manifest)
    out = Path(a.out)
    table.to_csv(out / "scale_table.csv", index=False, quoting=csv.QUOTE_MINIMAL)

    finished = [r for d in manifest[manifest["status"] == "ok"]["run_dir"] for r in sl.load_runs([d])]
    # the header describes a multi-rank lab's run where there is one (lab 01's batch is one micro-batch)
    first = next((r for r in finished if "global_batch" in r.config), finished[0] if finished else None)
    cfg = first.config if first else {}
    info = first.info if first else {}
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = info.get("git_sha", "unknown")
    global_batch = cfg.get("global_batch", cfg.get("B"))
    device = info.get("device", a.device)
    if device == "sim":  # every figure of the table is the simulated GPU's, in virtual time
        device = info.get("sim_gpu_name", "simulated GPU") + ", virtual time"
    header = "no run finished" if first is None else (f"model {cfg.get('model', '?')} ({cfg.get('n_params', '?')} params), global batch {global_batch} x "
              f"T={cfg.get('T', '?')}, {cfg.get('steps', '?')} steps, {device}"
              + (f", {a.cores} cores ({info.get('cpu_model', '')})" if a.device == "cpu" else "")
              + (", timing only (no arithmetic; memory per rank as the simulated GPU counts it)"
                 if info.get("timing_only") else ", the arithmetic on this machine's CPU" if a.device == "sim" else "")
              + (f", load average {a.load} at the start" if a.load else "")
              + f", commit {sha}, {info.get('start_time', '')}"
              + (f"; the runs took {a.wall_s:.0f} s of wall time on this machine" if a.wall_s is not None else ""))
    peak_notes = "\n".join(f"[{i + 1}] peak {s}" for i, s in enumerate(peaks))
    md = markdown(table)
    text = f"{header}\n\n{md}\n\n{peak_notes}\n"
    (out / "scale_table.md").write_text((f"`{a.command}`\n\n" if a.command else "") + text, encoding="utf-8")
    print("\n== scaling table\n" + text)
    if not table["tokens_per_s"].notna().any():
        print("no run finished: no plot")
    else:
        plot(table, out / "scale_plot.png", header)
    print(f"   wrote {out / 'scale_table.csv'}, scale_table.md" +
          (", scale_plot.png" if table["tokens_per_s"].notna().any() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
