"""scalelab_logs — read scalelab run logs into pandas DataFrames and draw the notebooks' plots.

A run is a directory ``runs/<lab>/<run_id>/`` holding one ``rank<k>.jsonl`` per rank, one JSON
object per line (docs/log_schema.md). The notebooks in this folder (01_single_device, 02_data_pipeline,
03_ddp, 04_fsdp, 05_tensor_parallel, 06_pipeline_parallel, 07_parallel_3d, 10_context_parallel) call only
the functions below, so a plot looks the same in every lab. Tests: notebooks/test_scalelab_logs.py.

    runs = load_runs(latest_runs("lab03", runs_root="../runs", per_config=True))
    plot_loss(runs)

Run it headless: scripts/notebooks.sh (executes every notebook, fails on a cell error).
"""
from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

# memory_<category>_bytes: the bytes held now in one allocator category (docs/log_schema.md). Not a
# category: the _peak_ keys and the totals, memory_current_bytes (the sum of the categories),
# memory_peak_bytes and memory_reserved_bytes (held from the system: in use plus what the caching
# allocator keeps; stacked as a category it would count every byte twice). memory_by_category checks
# that its categories add up to memory_current_bytes, so a new total key cannot slip in unnoticed.
_MEMORY_TOTALS = ("current", "peak", "reserved")
_MEMORY_KEY = re.compile(r"^memory_(?!(?:" + "|".join(_MEMORY_TOTALS) + r")_bytes$)(?P<cat>.+?)(?<!_peak)_bytes$")


# ------------------------------------------------------------------------------------------------
# Finding and reading runs


def find_runs(lab: str, runs_root: str | Path = "../runs") -> list[Path]:
    """Run directories under ``<runs_root>/<lab>/`` that hold at least one rank log, oldest first.

    Order is by the newest modification time of a run's rank files (run ids pinned with SL_RUN_ID
    need not sort by time).
    """
    lab_dir = Path(runs_root) / lab
    if not lab_dir.is_dir():
        return []
    runs = [d for d in lab_dir.iterdir() if d.is_dir() and any(d.glob("rank*.jsonl"))]
    return sorted(runs, key=lambda d: max(f.stat().st_mtime for f in d.glob("rank*.jsonl")))


def read_records(path: str | Path) -> list[dict]:
    """Every record of one rank<k>.jsonl file. A half-written last line (a run still going, or a
    crash mid-write) is skipped, not an error."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


@dataclass
class Run:
    """One run: every rank's records, split by type. DataFrames carry a ``rank`` column."""

    path: Path
    info: dict  # rank 0's `run` record (the last one, if the run was resumed)
    steps: pd.DataFrame  # `step` records of all ranks
    evals: pd.DataFrame  # `eval` records of all ranks
    summaries: pd.DataFrame  # `summary` records (one per rank that finished)
    timelines: list[dict] = field(default_factory=list)  # `timeline` records, all ranks
    rank_infos: list[dict] = field(default_factory=list)  # every rank's `run` record (its last), by rank
    rollbacks: pd.DataFrame = field(default_factory=pd.DataFrame)  # lab 08's `rollback` records, all ranks

    @property
    def run_id(self) -> str:
        return self.info.get("run_id", self.path.name)

    @property
    def world_size(self) -> int:
        return int(self.info.get("world_size", 1))

    @property
    def config(self) -> dict:
        return self.info.get("config", {})

    @property
    def finished(self) -> bool:
        """True when every rank wrote its `summary` record (a log without one is a run that died)."""
        return len(self.summaries) >= self.world_size

    @property
    def label(self) -> str:
        """What distinguishes this run in a legend: ranks, and mode / ZeRO stage / precision if set."""
        ranks = f"{self.world_size} rank" + ("s" if self.world_size != 1 else "")
        return f"{ranks}, {self.config_label}" if self.config_label else ranks

    @property
    def config_label(self) -> str:
        """The configuration apart from the world size: mode / ZeRO stage / precision, and "simulated H100 SXM,
        virtual time" for a run on the simulated GPU (--device sim); "" if none set."""
        parts = []
        cfg = self.config
        if "loader" in cfg:  # lab 02: which loader fed the run, and how the kit loader was set
            loader = str(cfg["loader"])
            if cfg["loader"] == "kit" and not cfg.get("prefetch", True):
                loader += ", no prefetch"
            if cfg.get("read_delay_ms"):
                loader += f", reads {cfg['read_delay_ms']:g} ms"
            parts.append(loader)
        if "order" in cfg:  # lab 07: the 3D grid and its order, fastest axis first
            parts.append(f"tp {cfg.get('tp')} x pp {cfg.get('pp')} x dp {cfg.get('dp')} ({cfg['order']})")
        if "mode" in cfg:
            parts.append(str(cfg["mode"]))
        if "stage" in cfg:
            parts.append(f"ZeRO-{cfg['stage']}")
        if "schedule" in cfg:  # lab 06: the pipeline's schedule, chunks per rank and micro-batches per step
            v = int(cfg.get("chunks", 1))
            parts.append(f"{cfg['schedule']}{f' v {v}' if v > 1 else ''}, m {cfg.get('micro_batches')}")
        precision = cfg.get("precision", self.info.get("precision"))
        if precision and precision != "fp32":
            parts.append(str(precision))
        if self.info.get("device") == "sim":  # --device sim: every time of the run is the simulated GPU's
            parts.append(f"{self.info.get('sim_gpu_name', 'simulated GPU')}, virtual time")
        return ", ".join(parts)


def read_run(run_dir: str | Path) -> Run:
    """All rank logs of one run directory as a Run."""
    run_dir = Path(run_dir)
    by_type: dict[str, list[dict]] = {}
    for rank_file in sorted(run_dir.glob("rank*.jsonl")):
        for rec in read_records(rank_file):
            by_type.setdefault(rec.get("type", "?"), []).append(rec)
    run_records = sorted(by_type.get("run", []), key=lambda r: r.get("rank", 0))
    if not run_records:
        raise ValueError(f"{run_dir}: no `run` record in any rank*.jsonl (is this a scalelab run directory?)")
    info = [r for r in run_records if r.get("rank", 0) == run_records[0].get("rank", 0)][-1]
    last_of_rank = {r.get("rank", 0): r for r in run_records}  # sorted by rank; a resumed run's last record wins
    frame = lambda t: pd.DataFrame(by_type.get(t, []))  # noqa: E731
    return Run(run_dir, info, frame("step"), frame("eval"), frame("summary"), by_type.get("timeline", []),
               list(last_of_rank.values()), frame("rollback"))


def load_runs(run_dirs) -> list[Run]:
    """Run objects for a list of run directories (missing or unreadable ones are reported and skipped)."""
    runs = []
    for d in run_dirs:
        try:
            runs.append(read_run(d))
        except (OSError, ValueError) as e:
            print(f"skipped {d}: {e}")
    return runs


def latest_runs(lab: str, runs_root: str | Path = "../runs", per_config: bool = False, limit: int = 8) -> list[Path]:
    """The most recent run under ``<runs_root>/<lab>``, or with ``per_config`` the most recent run of
    each configuration (world size, mode, ZeRO stage, precision; tp, link, ranks per node) that used the same model as the most
    recent run, at most ``limit`` of them: a scaling comparison after running the lab at 1, 2, 4 ranks."""
    dirs = find_runs(lab, runs_root)
    if not dirs:
        return []
    if not per_config:
        return dirs[-1:]
    runs = load_runs(dirs)
    model = runs[-1].config.get("model")
    chosen: dict[tuple, Path] = {}
    for r in runs:  # oldest first: a later run of the same configuration replaces an earlier one
        if r.config.get("model") != model or r.steps.empty:
            continue
        cfg = r.config
        chosen[(r.world_size, cfg.get("mode"), cfg.get("stage"), cfg.get("precision"),  # lab 05 also: the layout
                 cfg.get("tp"), cfg.get("link"), cfg.get("ranks_per_node"), cfg.get("sequence_parallel"))] = r.path
    return sorted(chosen.values(), key=lambda p: dirs.index(p))[-limit:]


def latest_lab02_runs(runs_root: str | Path = "../runs", limit: int = 8) -> list[Path]:
    """Lab 02: the most recent finished run of each loader setup (model, B, T, loader, prefetch, read
    delay) under ``<runs_root>/lab02``, oldest first, at most ``limit``: one experiment's kit and naive
    runs, and beside them those of other models or of a simulated slow disk (--read-delay-ms) if made."""
    dirs = find_runs("lab02", runs_root)
    chosen: dict[tuple, Path] = {}
    for r in load_runs(dirs):  # oldest first: a later run of the same setup replaces an earlier one
        cfg = r.config
        if not r.finished or "loader" not in cfg:
            continue
        key = (cfg.get("model"), cfg.get("B"), cfg.get("T"), cfg.get("loader"), cfg.get("prefetch"),
               cfg.get("read_delay_ms"))
        chosen.pop(key, None)  # re-inserted last: the order is that of the latest runs
        chosen[key] = r.path
    return list(chosen.values())[-limit:]


def describe(runs: list[Run]) -> pd.DataFrame:
    """One row per run: id, label, model, steps logged, whether it finished, device."""
    return pd.DataFrame(
        [
            {
                "run_id": r.run_id,
                "label": r.label,
                "model": r.config.get("model"),
                "world_size": r.world_size,
                "steps": int(r.steps["step"].nunique()) if not r.steps.empty else 0,
                "finished": r.finished,
                "device": r.info.get("device"),
                "track": r.info.get("track"),
            }
            for r in runs
        ]
    )


# ------------------------------------------------------------------------------------------------
# Derived tables


def loss_curve(run: Run) -> pd.DataFrame:
    """Rank 0's steps with ``tokens_seen`` (cumulative tokens of all ranks) beside ``loss``."""
    s = run.steps
    if s.empty:
        return s
    s = s[s["rank"] == s["rank"].min()].sort_values("step").copy()
    s["tokens_seen"] = s["tokens"].cumsum()
    return s


def throughput(runs: list[Run]) -> pd.DataFrame:
    """tokens/s and MFU of each run over its timed steps (all but step 0, the warm-up).

    A step takes as long as its slowest rank, so per step the largest ``step_ms`` over ranks counts.
    ``mfu`` is the mean of the logged per-step MFU (a fraction; shown in percent by the plots).
    """
    rows = []
    for r in runs:
        s = r.steps
        if s.empty:
            continue
        timed = s[s["step"] > s["step"].min()]
        if timed.empty:
            timed = s
        per_step = timed.groupby("step").agg(step_ms=("step_ms", "max"), tokens=("tokens", "first"), mfu=("mfu", "mean"))
        tokens_per_s = per_step["tokens"].sum() / (per_step["step_ms"].sum() / 1000.0)
        rows.append(
            {
                "label": r.label,
                "config": r.config_label,
                "run_id": r.run_id,
                "world_size": r.world_size,
                "mode": r.config.get("mode"),
                "stage": r.config.get("stage"),
                "precision": r.config.get("precision", r.info.get("precision")),
                "tokens_per_s": tokens_per_s,
                "mfu": per_step["mfu"].mean(),
                "step_ms": per_step["step_ms"].mean(),
            }
        )
    return pd.DataFrame(rows)


def starvation(runs: list[Run]) -> pd.DataFrame:
    """Lab 02: per run, the loader alone against what the model eats, and what it cost the steps. From the
    `summary` record (labs/02_data_pipeline/main.cpp): loader_alone_tokens_per_s, consumption_tokens_per_s
    (tokens per step / (step_ms - data_wait_ms)), tokens_per_s, step_ms, data_wait_ms, data_wait_share."""
    keys = ["loader_alone_tokens_per_s", "consumption_tokens_per_s", "tokens_per_s", "step_ms", "data_wait_ms",
            "data_wait_share"]
    rows = []
    for r in runs:
        if r.summaries.empty or "loader_alone_tokens_per_s" not in r.summaries:
            continue
        last = r.summaries.iloc[-1]
        row = {"label": r.config_label, "model": r.config.get("model"), "run_id": r.run_id}
        row.update({k: float(last[k]) for k in keys})
        row["headroom"] = row["loader_alone_tokens_per_s"] / row["consumption_tokens_per_s"]
        rows.append(row)
    return pd.DataFrame(rows)


def memory_by_category(run: Run) -> pd.DataFrame:
    """Bytes held per allocator category (memory_<category>_bytes) on each rank at its last step:
    one row per rank, one column per category."""
    s = run.steps
    if s.empty:
        return pd.DataFrame()
    last = s.sort_values("step").groupby("rank").tail(1).set_index("rank").sort_index()
    cats = {k: m.group("cat") for k in last.columns if (m := _MEMORY_KEY.match(k))}
    table = last[list(cats)].rename(columns=cats).fillna(0).astype("int64")
    if "memory_current_bytes" in last.columns:
        current = last["memory_current_bytes"].fillna(0).astype("int64")
        if not (table.sum(axis=1) == current).all():
            raise ValueError(f"{run.run_id}: the categories {sorted(cats.values())} add up to {table.sum(axis=1).tolist()} "
                             f"bytes, memory_current_bytes says {current.tolist()}: a key that is not an allocator "
                             "category (docs/log_schema.md) is read as one, or one is missing")
    return table


def scaling(runs: list[Run]) -> pd.DataFrame:
    """Scaling efficiency: tokens/s at N ranks / (N x tokens/s at 1 rank), per configuration
    (mode, stage, precision). Empty when no configuration has a 1-rank run and a larger one."""
    t = throughput(runs)
    if t.empty:
        return t
    rows = []
    one = t[t["world_size"] == 1]
    for _, row in t.iterrows():
        # the 1-rank run of the same configuration if there is one (the last), else any 1-rank run
        base = one[one["config"] == row["config"]] if (one["config"] == row["config"]).any() else one
        if base.empty:
            continue
        rows.append({**row.to_dict(), "efficiency": row["tokens_per_s"] / (row["world_size"] * base["tokens_per_s"].iloc[-1])})
    out = pd.DataFrame(rows)
    if out.empty or out["world_size"].nunique() < 2:
        return pd.DataFrame()
    return out.sort_values(["config", "world_size"])


def timeline_frame(run: Run, step: int | None = None) -> pd.DataFrame:
    """One row per compute span or communication call of one step (default: the last step with a
    timeline record), all ranks: rank, kind ("compute" or "comm"), name, issue_ms, start_ms, end_ms.
    Times are ms since that rank's step began (its first compute span): every rank has its own clock."""
    tl = run.timelines
    if not tl:
        return pd.DataFrame()
    if step is None:
        step = max(r["step"] for r in tl)
    rows = []
    for rec in (r for r in tl if r["step"] == step):
        spans = rec.get("compute", [])
        t0 = min([c["start_ms"] for c in spans] + [e["issue_ms"] for e in rec.get("events", [])] or [0.0])
        for c in spans:
            rows.append({"rank": rec["rank"], "kind": "compute", "name": c["name"], "issue_ms": c["start_ms"] - t0,
                         "start_ms": c["start_ms"] - t0, "end_ms": c["end_ms"] - t0})
        for e in rec.get("events", []):
            end = e["end_ms"] if e.get("end_ms") is not None else math.nan
            rows.append({"rank": rec["rank"], "kind": "comm", "name": f"{e['op']} {e['tag']}".strip(),
                         "op": e["op"], "issue_ms": e["issue_ms"] - t0, "start_ms": e["start_ms"] - t0,
                         "end_ms": end - t0, "payload_bytes": e.get("payload_bytes")})
    df = pd.DataFrame(rows)
    df.attrs["step"] = step
    return df


# ------------------------------------------------------------------------------------------------
# Plots. Each returns the figure (None and a printed reason when there is nothing to draw) and, when
# plot_dir is given, also writes it there as <name>.png.


def _save(fig, name: str, plot_dir: str | Path | None):
    fig.tight_layout()
    if plot_dir:
        Path(plot_dir).mkdir(parents=True, exist_ok=True)
        fig.savefig(Path(plot_dir) / f"{name}.png", dpi=100)
    return fig


def _nothing(what: str):
    print(f"nothing to plot: {what}")
    return None


def plot_loss(runs: list[Run], plot_dir=None, name="loss"):
    """Training loss against optimizer steps (left) and against tokens seen (right), plus the
    validation loss as dots; one line per run."""
    runs = [r for r in runs if not r.steps.empty]
    if not runs:
        return _nothing("no step records")
    fig, (ax_step, ax_tok) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for r in runs:
        c = loss_curve(r)
        (line,) = ax_step.plot(c["step"], c["loss"], label=r.label)
        ax_tok.plot(c["tokens_seen"], c["loss"], color=line.get_color(), label=r.label)
        if not r.evals.empty:
            ev = r.evals[r.evals["rank"] == r.evals["rank"].min()]
            ax_step.plot(ev["step"], ev["val_loss"], "o", color=line.get_color(), label=f"{r.label} (val)")
    ax_step.set(xlabel="optimizer step", ylabel="loss (nats/token)", title="loss vs step")
    ax_tok.set(xlabel="tokens seen (all ranks)", title="loss vs tokens")
    ax_step.legend(fontsize=8)
    return _save(fig, name, plot_dir)


def plot_throughput(runs: list[Run], plot_dir=None, name="throughput"):
    """tokens/s and MFU (%), one bar per run."""
    t = throughput(runs)
    if t.empty:
        return _nothing("no step records")
    fig, (ax_tps, ax_mfu) = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [f"{lbl}\n{rid[-4:]}" for lbl, rid in zip(t["label"], t["run_id"])]
    ax_tps.bar(labels, t["tokens_per_s"], color="tab:blue")
    ax_tps.set(ylabel="tokens/s (all ranks)", title="throughput")
    ax_mfu.bar(labels, 100 * t["mfu"], color="tab:orange")
    ax_mfu.set(ylabel="MFU (%)", title="model FLOPs utilization")
    for ax in (ax_tps, ax_mfu):
        ax.tick_params(axis="x", labelsize=8)
    return _save(fig, name, plot_dir)


def plot_memory(run: Run, plot_dir=None, name="memory"):
    """Stacked bars: bytes per allocator category on each rank at the last step (MiB)."""
    m = memory_by_category(run)
    if m.empty:
        return _nothing(f"no step records in {run.run_id}")
    m = m.loc[:, (m != 0).any()] / 2**20
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(m), 3.8))
    bottom = pd.Series(0.0, index=m.index)
    for cat in m.columns:
        ax.bar([f"rank {k}" for k in m.index], m[cat], bottom=bottom, label=cat)
        bottom += m[cat]
    ax.set(ylabel="MiB", title=f"memory per rank: {run.label}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


def plot_memory_by_world_size(runs: list[Run], plot_dir=None, name="memory_by_world_size"):
    """Stacked bars: bytes per category held by one rank (the mean over ranks) for each run, ordered
    by world size; what sharding (ZeRO stage) takes off each rank as the world grows."""
    runs = sorted((r for r in runs if not r.steps.empty), key=lambda r: (str(r.config.get("stage")), r.world_size))
    if not runs:
        return _nothing("no step records")
    table = pd.DataFrame({r.label: memory_by_category(r).mean() for r in runs}).T.fillna(0) / 2**20
    table = table.loc[:, (table != 0).any()]
    fig, ax = plt.subplots(figsize=(4.5 + 1.3 * len(table), 4))
    table.plot.bar(stacked=True, ax=ax, rot=20)
    ax.set(ylabel="MiB per rank (mean over ranks)", title="memory per rank by category and configuration")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


_SPAN_COLORS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:green", "sync + optimizer": "tab:purple"}


def plot_timeline(run: Run, step: int | None = None, plot_dir=None, name="timeline"):
    """Per rank, two lanes: compute spans (top) and communication calls (bottom; the pale part is
    the wait between issue and the transport starting it, the solid part the call in flight)."""
    df = timeline_frame(run, step)
    if df.empty:
        return _nothing(f"no timeline records in {run.run_id} (lab 03: --timeline-steps N)")
    ranks = sorted(df["rank"].unique())
    fig, ax = plt.subplots(figsize=(11, 1 + 1.1 * len(ranks)))
    seen = set()
    for i, rank in enumerate(ranks):
        y = 2 * (len(ranks) - 1 - i)
        d = df[df["rank"] == rank]
        for _, c in d[d["kind"] == "compute"].iterrows():
            lbl = c["name"] if c["name"] not in seen else None
            seen.add(c["name"])
            ax.barh(y + 1, c["end_ms"] - c["start_ms"], left=c["start_ms"], height=0.8,
                    color=_SPAN_COLORS.get(c["name"], "tab:olive"), label=lbl)
        for _, e in d[d["kind"] == "comm"].iterrows():
            ax.barh(y, e["start_ms"] - e["issue_ms"], left=e["issue_ms"], height=0.5, color="tab:red", alpha=0.2)
            lbl = "communication" if "comm" not in seen else None
            seen.add("comm")
            ax.barh(y, e["end_ms"] - e["start_ms"], left=e["start_ms"], height=0.8, color="tab:red",
                    edgecolor="white", linewidth=0.5, label=lbl)
    ax.set_yticks([t for i in range(len(ranks)) for t in (2 * i, 2 * i + 1)])
    ax.set_yticklabels([s for rank in reversed(ranks) for s in (f"rank {rank} comm", f"rank {rank} compute")])
    ax.set(xlabel="ms since the step began (each rank's own clock)",
           title=f"step {df.attrs['step']} timeline: {run.label}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


def plot_scaling(runs: list[Run], plot_dir=None, name="scaling"):
    """Scaling efficiency per configuration: tokens/s at N ranks / (N x tokens/s at 1 rank); 1.0 is
    perfect linear scaling."""
    s = scaling(runs)
    if s.empty:
        return _nothing("scaling needs a 1-rank run and a run at more ranks (run the lab at -np 1 and -np 2)")
    fig, (ax_tps, ax_eff) = plt.subplots(1, 2, figsize=(11, 3.8))
    for cfg, g in s.groupby("config"):
        g = g.sort_values("world_size")
        label = cfg or "runs"
        ax_tps.plot(g["world_size"], g["tokens_per_s"], "o-", label=label)
        ax_eff.plot(g["world_size"], g["efficiency"], "o-", label=label)
    ws = sorted(s["world_size"].unique())
    base = s[s["world_size"] == 1]["tokens_per_s"].max()
    ax_tps.plot(ws, [base * n for n in ws], "k--", lw=0.8, label="linear")
    ax_tps.set(xlabel="ranks", ylabel="tokens/s (all ranks)", title="throughput vs ranks", xticks=ws)
    ax_eff.axhline(1.0, color="k", ls="--", lw=0.8)
    ax_eff.set(xlabel="ranks", ylabel="efficiency", title="scaling efficiency", xticks=ws, ylim=(0, 1.2))
    ax_tps.legend(fontsize=8)
    return _save(fig, name, plot_dir)


# ------------------------------------------------------------------------------------------------
# Lab 05: the link sweep (bench/tp_link_sweep.py writes the runs; the prediction is its alpha-beta
# arithmetic, passed in as `predict` so the formula lives in one place)


def tp_sweep(runs: list[Run], predict=None) -> pd.DataFrame:
    """One row per finished lab 05 run: tp, ranks, the tp group's link, ranks_per_node, tokens/s,
    step_ms, waited_ms (exposed communication per step), link_ms (what the simulated link charged per
    step) and, with predict(run config) -> ms per step (bench/tp_link_sweep.py predicted_run_ms),
    predicted_ms."""
    rows = []
    for r in runs:
        cfg = r.config
        if "tp" not in cfg or r.summaries.empty:
            continue
        s = r.summaries[r.summaries["rank"] == 0].iloc[-1] if "rank" in r.summaries else r.summaries.iloc[-1]
        row = {"run_id": r.run_id, "tp": int(cfg["tp"]), "ranks": r.world_size, "link": cfg.get("link", "none"),
               "ranks_per_node": int(cfg.get("ranks_per_node", 0)), "tokens_per_s": s.get("tokens_per_s"),
               "step_ms": s.get("step_ms", math.nan), "waited_ms": s.get("comm_ms", math.nan),
               "link_ms": s.get("comm_modeled_ms", 0.0)}
        if predict is not None and "link_alpha_s" in cfg:
            row["predicted_ms"] = predict(cfg)
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["ranks_per_node", "link", "tp"]) if rows else pd.DataFrame()


def plot_tp_sweep(df: pd.DataFrame, plot_dir=None, name="tp_link_sweep"):
    """Left: tokens/s against tp, one line per link (one group, no data parallelism). Right: what the
    simulated link charged per step, measured (dots) and predicted by the alpha-beta arithmetic (x)."""
    if df.empty:
        return _nothing("no lab 05 runs with a tp in their config (bench/tp_link_sweep.py makes them)")
    one_group = df[(df["ranks"] == df["tp"]) & (df["ranks_per_node"] == 0)]
    fig, (ax_tps, ax_link) = plt.subplots(1, 2, figsize=(11, 3.8))
    base = one_group[one_group["tp"] == 1]
    for link, g in one_group[one_group["tp"] > 1].groupby("link"):
        g = pd.concat([base, g]).sort_values("tp")
        ax_tps.plot(g["tp"], g["tokens_per_s"], "o-", label=link)
        ax_link.plot(g["tp"], g["link_ms"], "o-", label=f"{link} measured")
        if "predicted_ms" in g:
            ax_link.plot(g["tp"], g["predicted_ms"], "kx", ms=8)
    tps = sorted(one_group["tp"].unique())
    ax_tps.set(xlabel="tp (ranks in the group)", ylabel="tokens/s", title="throughput per link", xticks=tps)
    ax_link.set(xlabel="tp", ylabel="ms per step", title="link time per step (x: alpha-beta prediction)", xticks=tps)
    ax_tps.legend(fontsize=8)
    ax_link.legend(fontsize=8)
    return _save(fig, name, plot_dir)


def plot_starvation(runs: list[Run], plot_dir=None, name="starvation"):
    """Lab 02. Left: each loader alone (no model) beside what the model eats, tokens/s on a log scale.
    Right: the share of each training step spent waiting for data, per loader."""
    t = starvation(runs)
    if t.empty:
        return _nothing("no lab 02 summary records (run bin/reference/lab02_data_pipeline)")
    fig, (ax_rate, ax_wait) = plt.subplots(1, 2, figsize=(max(11, 2.2 * len(t)), 4.2))
    labels = [textwrap.fill(f"{m}: {lbl}", 16) for lbl, m in zip(t["label"], t["model"])]  # long labels wrap
    x = range(len(t))
    ax_rate.bar([i - 0.2 for i in x], t["loader_alone_tokens_per_s"], width=0.4, label="loader alone")
    ax_rate.bar([i + 0.2 for i in x], t["consumption_tokens_per_s"], width=0.4, label="model eats")
    ax_rate.set(yscale="log", ylabel="tokens/s", title="the loader alone vs the model's appetite", xticks=list(x))
    ax_rate.set_xticklabels(labels, fontsize=8)
    ax_rate.legend(fontsize=8)
    ax_wait.bar(list(x), 100 * t["data_wait_share"], color="tab:red")
    ax_wait.set(ylabel="data wait (% of the step)", title="time the model waited for data", xticks=list(x), ylim=(0, 100))
    ax_wait.set_xticklabels(labels, fontsize=8)
    return _save(fig, name, plot_dir)


def plot_step_time(runs: list[Run], plot_dir=None, name="step_time"):
    """Lab 02: per step, the time spent waiting for data (hatched) on top of the rest of the step, one panel
    per run: the naive loader's wait is paid every step, the prefetching loader's is not."""
    runs = [r for r in runs if not r.steps.empty]
    if not runs:
        return _nothing("no step records")
    ncols = min(3, len(runs))
    nrows = (len(runs) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.4 * nrows), squeeze=False)
    for k, r in enumerate(runs):  # each panel its own scale: the models' step times differ by orders
        ax = axes[k // ncols][k % ncols]
        s = r.steps.sort_values("step")
        compute = s["step_ms"] - s["data_wait_ms"]
        ax.bar(s["step"], compute, color="tab:blue", label="model (forward, backward, optimizer)")
        ax.bar(s["step"], s["data_wait_ms"], bottom=compute, color="tab:red", hatch="//", label="waiting for data")
        ax.set(xlabel="step", ylabel="ms", title=f"{r.config.get('model')}: {r.config_label}")
    for k in range(len(runs), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, name, plot_dir)


# ------------------------------------------------------------------------------------------------
# Lab 06: the pipeline (bench/pp_bubble_sweep.py writes the runs). A step's compute spans are named by
# lab06::to_string: "F3" (forward of micro-batch 3, chunk 0), "B3.1" (backward, chunk 1); one more span,
# "step", covers the step's window from the barrier every stage leaves together to the one after its last
# action (labs/06_pipeline_parallel/main.cpp).

_ACTION = re.compile(r"^(?P<kind>[FBIW])(?P<mb>\d+)(?:\.(?P<chunk>\d+))?$")


def parse_action(name: str) -> tuple[str, int, int] | None:
    """("F", 3, 0) for "F3", ("B", 3, 1) for "B3.1", ("I", 2, 0) and ("W", 2, 0) for a split backward's two
    halves (ZB-H1: the input gradient, the weight gradient); None for any other span name ("step", ...)."""
    m = _ACTION.match(name)
    return (m.group("kind"), int(m.group("mb")), int(m.group("chunk") or 0)) if m else None


def bubble_formula(p: int, m, v: int = 1, schedule: str = ""):
    """(p - 1) / (v m + p - 1): the bubble's share of a step when every micro-batch takes the same time on
    every stage (Narayanan et al. 2021, Sec. 2.2; GPipe and 1F1B: v = 1); schedule "zb-h1": (p - 1) /
    (3 m + p - 1) (Qi et al. 2024, Sec. 3.1, with the forward, I and W equally long). The same as
    lab06::bubble_formula, which every lab 06 run logs as config.bubble_formula (test_scalelab_logs.py
    checks they agree). m may be an array (a curve)."""
    if schedule == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (v * m + p - 1)


def _pp_layout(cfg: dict) -> tuple:
    return (cfg.get("model"), cfg.get("pp"), cfg.get("schedule"), cfg.get("chunks", 1), cfg.get("micro_batches"),
            cfg.get("uniform_compute_ms", 0), cfg.get("link", "none"), cfg.get("micro_batch"), cfg.get("T"))


def latest_lab06_runs(runs_root: str | Path = "../runs", limit: int = 64) -> list[Path]:
    """Lab 06: the most recent finished run of each layout (model, p, schedule, v, m, uniform compute, link,
    micro-batch, T) under ``<runs_root>/lab06``, oldest first, at most ``limit``: one sweep's runs
    (bench/pp_bubble_sweep.py), a later sweep's replacing an earlier one's."""
    return _latest_by_layout("lab06", runs_root, limit, "schedule", _pp_layout)


def _latest_by_layout(lab: str, runs_root: str | Path, limit: int, needed: str, layout_key) -> list[Path]:
    """The most recent finished run of ``lab`` per ``layout_key(config)`` among runs whose config has
    ``needed``, oldest first, at most ``limit``."""
    chosen: dict[tuple, Path] = {}
    for r in load_runs(find_runs(lab, runs_root)):  # oldest first
        if not r.finished or needed not in r.config:
            continue
        key = layout_key(r.config)
        chosen.pop(key, None)  # re-inserted last: the order is that of the latest runs
        chosen[key] = r.path
    return list(chosen.values())[-limit:]


def pipeline_timeline(run: Run, step: int | None = None) -> pd.DataFrame:
    """One row per forward or backward of one step (default: the last step with a timeline record), every
    stage: stage, name ("F3.1"), kind ("F", "B", or a split backward's "I" and "W"), micro_batch, chunk,
    start_ms, end_ms. Times are ms since the stage's "step" span began: every stage leaves the barrier at the
    step's start together, so the stages line up although each rank has its own clock. attrs: step,
    window_ms {stage: the step span's length}. Empty when the run has no timeline (lab 06: --timeline-steps N logs steps 1..N)."""
    tl = [r for r in run.timelines if any(c.get("name") == "step" for c in r.get("compute", []))]
    if not tl:
        return pd.DataFrame()
    if step is None:
        step = max(r["step"] for r in tl)
    rows, window = [], {}
    for rec in (r for r in tl if r["step"] == step):
        spans = rec["compute"]
        frame = next(c for c in spans if c["name"] == "step")
        t0 = frame["start_ms"]
        window[int(rec["rank"])] = frame["end_ms"] - t0
        for c in spans:
            action = parse_action(c["name"])
            if action is None:
                continue
            kind, mb, chunk = action
            rows.append({"stage": int(rec["rank"]), "name": c["name"], "kind": kind, "micro_batch": mb,
                         "chunk": chunk, "start_ms": c["start_ms"] - t0, "end_ms": c["end_ms"] - t0})
    df = pd.DataFrame(rows, columns=["stage", "name", "kind", "micro_batch", "chunk", "start_ms", "end_ms"])
    df.attrs["step"] = step
    df.attrs["window_ms"] = window
    return df


def pp_bubble(runs: list[Run]) -> pd.DataFrame:
    """One row per finished lab 06 run: run_id, model, p, schedule, v, m, uniform_compute_ms, link, bubble
    (the step records' measured `bubble`, the median over the timed steps, step 0 left out, and over the
    stages), bubble_formula (logged), tokens_per_s and step_ms (rank 0's summary), act_peak_bytes (the
    largest memory_activations_peak_bytes over the stages' summaries)."""
    rows = []
    for r in runs:
        cfg, s = r.config, r.steps
        if "schedule" not in cfg or not r.finished or s.empty or "bubble" not in s:
            continue
        timed = s[s["step"] > s["step"].min()]
        timed = timed if not timed.empty else s
        summ = r.summaries.sort_values("rank")
        first = summ.iloc[0]
        rows.append({"run_id": r.run_id, "model": cfg.get("model"), "p": r.world_size, "schedule": cfg["schedule"],
                     "v": int(cfg.get("chunks", 1)), "m": int(cfg["micro_batches"]),
                     "uniform_compute_ms": float(cfg.get("uniform_compute_ms", 0)), "link": cfg.get("link", "none"),
                     "bubble": float(timed["bubble"].median()), "bubble_formula": float(cfg["bubble_formula"]),
                     "tokens_per_s": first.get("tokens_per_s"), "step_ms": first.get("step_ms", math.nan),
                     "act_peak_bytes": summ["memory_activations_peak_bytes"].max()
                     if "memory_activations_peak_bytes" in summ else math.nan})
    if not rows:
        return pd.DataFrame()
    order = {"gpipe": 0, "1f1b": 1, "interleaved": 2, "zb-h1": 3}
    df = pd.DataFrame(rows)
    return df.sort_values(by=["p", "schedule", "m"], key=lambda c: c.map(order) if c.name == "schedule" else c,
                          ignore_index=True)


def pp_activation_peaks(runs: list[Run]) -> pd.DataFrame:
    """One row per stage of each finished lab 06 run: run_id, p, schedule, v, m, stage, act_peak_bytes (the
    stage's summary memory_activations_peak_bytes: the allocator's peak of category activations)."""
    rows = []
    for r in runs:
        cfg = r.config
        if "schedule" not in cfg or not r.finished or "memory_activations_peak_bytes" not in r.summaries:
            continue
        for _, s in r.summaries.sort_values("rank").iterrows():
            rows.append({"run_id": r.run_id, "p": r.world_size, "schedule": cfg["schedule"],
                         "v": int(cfg.get("chunks", 1)), "m": int(cfg["micro_batches"]), "stage": int(s["rank"]),
                         "act_peak_bytes": int(s["memory_activations_peak_bytes"])})
    return pd.DataFrame(rows)


# forward / backward, and a split backward's input gradient (I) and weight gradient (W), each its own colour
# (ZB-H1's picture shows where the held-back W's fill the bubble); a lighter shade per later chunk.
_PP_COLORS = {"F": plt.cm.Blues, "B": plt.cm.Greens, "I": plt.cm.Oranges, "W": plt.cm.Purples}
_PP_KIND_NAMES = {"F": "forward", "B": "backward", "I": "input gradient (I)", "W": "weight gradient (W)"}


def _pp_color(kind: str, chunk: int, v: int):
    return _PP_COLORS[kind](0.85 - (0.45 * chunk / (v - 1) if v > 1 else 0.0))


def plot_pipeline_timelines(runs: list[Run], step: int | None = None, plot_dir=None, name="pipeline_timeline"):
    """The textbook pipeline picture of one step, one panel per run (runs with a timeline only): stages on
    the y axis (stage 0 on top), ms since the step began on the x axis (the stages aligned on their "step"
    span), one box per forward (blue) or backward (green), or a split backward's input gradient I (orange)
    and weight gradient W (purple), labelled with its micro-batch, a lighter shade for a later chunk; the
    legend names the kinds the runs hold. The grey frame is each stage's step window, the white inside it
    the bubble."""
    runs = [r for r in runs if not pipeline_timeline(r, step).empty]
    if not runs:
        return _nothing("no lab 06 run with a timeline (bench/pp_bubble_sweep.py logs one at --timeline-m; or "
                        "--timeline-steps 1)")
    p_max = max(r.world_size for r in runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 0.6 + (0.45 * p_max + 0.5) * len(runs)), sharex=True,
                             squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        df = pipeline_timeline(r, step)
        p, v = r.world_size, int(r.config.get("chunks", 1))
        for stage, length in df.attrs["window_ms"].items():
            ax.barh(stage, length, left=0, height=0.9, color="none", edgecolor="0.6", linewidth=0.8)
        for _, c in df.iterrows():
            width = c["end_ms"] - c["start_ms"]
            ax.barh(c["stage"], width, left=c["start_ms"], height=0.8, color=_pp_color(c["kind"], c["chunk"], v),
                    edgecolor="white", linewidth=0.5)
            ax.text(c["start_ms"] + width / 2, c["stage"], str(c["micro_batch"]), ha="center", va="center",
                    fontsize=7, color="white" if c["chunk"] == 0 else "black", clip_on=True)
        s = r.steps
        measured = s[s["step"] == df.attrs["step"]]["bubble"].median() if "bubble" in s else math.nan
        ax.set_yticks(range(p))
        ax.set_yticklabels([f"stage {k}" for k in range(p)], fontsize=8)
        ax.set_ylim(p - 0.5, -0.5)  # stage 0 on top, as in the README's picture
        ax.set_title(f"{r.config.get('schedule')}" + (f", v = {v}" if v > 1 else "") +
                     f", p = {p}, m = {r.config.get('micro_batches')}: step {df.attrs['step']}, bubble "
                     f"{measured:.2f} (formula {r.config.get('bubble_formula', math.nan):.2f})", fontsize=9)
    axes[-1, 0].set_xlabel("ms since the step began (every stage leaves a barrier together)")
    from matplotlib.patches import Patch
    v_max = max(int(r.config.get("chunks", 1)) for r in runs)
    kinds = set().union(*(set(pipeline_timeline(r, step)["kind"]) for r in runs))
    handles = [Patch(color=_pp_color(k, c, v_max), label=_PP_KIND_NAMES[k] + (f", chunk {c}" if v_max > 1 else ""))
               for k in "FBIW" if k in kinds for c in range(v_max)]
    handles.append(Patch(facecolor="none", edgecolor="0.6", label="step window (white: bubble)"))
    axes[0, 0].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


def plot_bubble_vs_m(df: pd.DataFrame, plot_dir=None, name="bubble_vs_m"):
    """One panel per p: the measured bubble against m for each schedule (dots, from pp_bubble) beside the
    formula's curve (p - 1)/(v m + p - 1) for v = 1 (GPipe and 1F1B) and each interleaved v, and ZB-H1's
    (p - 1)/(3 m + p - 1) where it ran (dashed)."""
    if df.empty:
        return _nothing("no finished lab 06 runs (bench/pp_bubble_sweep.py makes them)")
    ps = sorted(df["p"].unique())
    fig, axes = plt.subplots(1, len(ps), figsize=(5.5 * len(ps), 3.8), squeeze=False, sharey=True)
    colors = {"gpipe": "tab:orange", "1f1b": "tab:blue", "interleaved": "tab:purple", "zb-h1": "tab:red"}
    for ax, p in zip(axes[0], ps):
        d = df[df["p"] == p]
        ms = sorted(d["m"].unique())
        curve_m = [ms[0] + (ms[-1] - ms[0]) * i / 200 for i in range(201)]
        for v in sorted(d[d["schedule"] != "zb-h1"]["v"].unique()):
            ax.plot(curve_m, [bubble_formula(p, m, v) for m in curve_m], "--", color="k" if v == 1 else "tab:purple",
                    lw=0.9, label=f"formula, v = {v}" + (" (GPipe, 1F1B)" if v == 1 else ""))
        if (d["schedule"] == "zb-h1").any():
            ax.plot(curve_m, [bubble_formula(p, m, schedule="zb-h1") for m in curve_m], "--", color="tab:red",
                    lw=0.9, label="formula, ZB-H1")
        for (schedule, v), g in d.groupby(["schedule", "v"], sort=False):
            g = g.sort_values("m")
            ax.plot(g["m"], g["bubble"], "o-", color=colors.get(schedule), ms=5, lw=1,
                    label=f"{schedule}" + (f", v = {v}" if v > 1 else "") + " (measured)")
        ax.set(xscale="log", xlabel="m (micro-batches per step)", title=f"p = {p} stages", ylim=(0, 1))
        ax.set_xticks(ms)
        ax.set_xticklabels([str(m) for m in ms])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel("bubble (share of the step)")
    return _save(fig, name, plot_dir)


def plot_pp_memory(peaks: pd.DataFrame, p: int | None = None, m: int | None = None, plot_dir=None,
                   name="pp_activation_memory"):
    """Peak activation memory (from pp_activation_peaks), GPipe against 1F1B (and interleaved where run).
    Left: per stage, at p stages and m micro-batches (default: the largest p, and the largest m that GPipe
    and 1F1B both ran at it). Right: stage 0's peak against m: GPipe's grows with m, 1F1B's stops at p."""
    if peaks.empty:
        return _nothing("no finished lab 06 runs with memory_activations_peak_bytes")
    p = p or int(peaks["p"].max())
    d = peaks[peaks["p"] == p]
    both = set(d[d["schedule"] == "gpipe"]["m"]) & set(d[d["schedule"] == "1f1b"]["m"])
    m = m or (max(both) if both else int(d["m"].max()))
    at = d[d["m"] == m]
    if at.empty:
        return _nothing(f"no lab 06 run at p = {p}, m = {m}")
    fig, (ax_stage, ax_m) = plt.subplots(1, 2, figsize=(11, 3.8))
    colors = {"gpipe": "tab:orange", "1f1b": "tab:blue", "interleaved": "tab:purple", "zb-h1": "tab:red"}
    groups = list(at.groupby(["schedule", "v"], sort=False))
    width = 0.8 / len(groups)
    for i, ((schedule, v), g) in enumerate(groups):
        g = g.sort_values("stage")
        ax_stage.bar(g["stage"] + (i - (len(groups) - 1) / 2) * width, g["act_peak_bytes"] / 2**20, width=width,
                     color=colors.get(schedule), label=schedule + (f", v = {v}" if v > 1 else ""))
    ax_stage.set(xlabel="stage", ylabel="peak activations (MiB)", xticks=range(p),
                 title=f"peak activation memory per stage, p = {p}, m = {m}")
    ax_stage.legend(fontsize=8)
    for (schedule, v), g in d[d["stage"] == 0].groupby(["schedule", "v"], sort=False):
        g = g.sort_values("m")
        ax_m.plot(g["m"], g["act_peak_bytes"] / 2**20, "o-", color=colors.get(schedule),
                  label=schedule + (f", v = {v}" if v > 1 else ""))
    ax_m.set(xlabel="m (micro-batches per step)", ylabel="peak activations (MiB)", xscale="log", ylim=(0, None),
             title=f"stage 0's peak against m, p = {p}")
    ms = sorted(d["m"].unique())
    ax_m.set_xticks(ms)
    ax_m.set_xticklabels([str(x) for x in ms])
    ax_m.minorticks_off()
    ax_m.legend(fontsize=8)
    return _save(fig, name, plot_dir)


# ------------------------------------------------------------------------------------------------
# Lab 07: 3D parallelism (labs/07_parallel_3d/main.cpp; docs/log_schema.md "Lab 07's records"). Every rank's
# `run` record holds its `layout`: coordinates (tp_rank, pp_rank, dp_rank), its groups' world ranks and
# stage_layers; its config the simulated cluster (ranks_per_node: node = rank / it) and each group's link.
# A step record holds `groups` (per group: wait_ms, modeled_ms, calls, payload_bytes) and, on timeline steps,
# `group_calls` (the pp, "pp gradients", dp and embedding groups' calls); the `timeline` record the tp
# group's calls (`events`) and the stage's spans (`compute`, plus "step").

GROUPS_3D = ("tp", "pp", "dp", "embedding")
GROUP_COLORS = {"tp": "tab:red", "pp": "tab:blue", "dp": "tab:green", "embedding": "tab:purple"}


def _grid_layout(cfg: dict) -> tuple:
    return (cfg.get("model"), cfg.get("tp"), cfg.get("pp"), cfg.get("dp"), cfg.get("order"), cfg.get("schedule"),
            cfg.get("chunks", 1), cfg.get("micro_batches"), cfg.get("micro_batch"), cfg.get("T"),
            cfg.get("ranks_per_node", 0), cfg.get("link", "none"), cfg.get("inter_link"), cfg.get("link_slowdown"),
            cfg.get("uniform_compute_ms", 0))


def latest_lab07_runs(runs_root: str | Path = "../runs", limit: int = 16) -> list[Path]:
    """Lab 07: the most recent finished run of each layout (model, tp, pp, dp, order, schedule, v, m, micro-batch,
    T, cluster, links, uniform compute) under ``<runs_root>/lab07``, oldest first, at most ``limit``."""
    return _latest_by_layout("lab07", runs_root, limit, "order", _grid_layout)


def order_comparison(runs: list[Run]) -> list[Run]:
    """The runs that differ from the most recent one in the order of the axes only (the same grid, model,
    schedule, cluster and links), one per order, the most recent one of each; the most recent run alone if
    no other order was run with its layout."""
    if not runs:
        return []
    without_order = lambda r: _grid_layout(r.config)[:4] + _grid_layout(r.config)[5:]  # noqa: E731
    want = without_order(runs[-1])
    by_order: dict[str, Run] = {}
    for r in runs:  # oldest first: a later run of an order replaces an earlier one
        if "order" in r.config and without_order(r) == want:
            by_order[r.config["order"]] = r
    return list(by_order.values())


def _stage_text(shard: str) -> str:
    """"layers 0-1, embedding" from a ModelShard::str() such as "tp 0/2 | layers 0-1 | embedding"."""
    return ", ".join(p.strip() for p in shard.split("|") if p.strip() and not re.match(r"^tp \d+/\d+$", p.strip()))


def grid_3d(run: Run) -> pd.DataFrame:
    """One row per rank, from every rank's `run` record: rank, node (rank // config.ranks_per_node; 0 for all
    ranks without a simulated cluster), tp_rank, pp_rank, dp_rank, the groups' world ranks (tp_group, pp_group,
    dp_group, embedding_group: None on a middle stage), stage (stage_layers without its tp part), and the link
    each group took (tp_link, ...; "-" for none). Read, never computed: the grid is what the program built."""
    rows = []
    for rec in run.rank_infos:
        lay, cfg = rec.get("layout") or {}, rec.get("config", {})
        if "tp_rank" not in lay:
            continue
        rank, per_node = int(rec.get("rank", 0)), int(cfg.get("ranks_per_node") or 0)
        row = {"rank": rank, "node": rank // per_node if per_node > 0 else 0}
        row.update({k: int(lay[k]) for k in ("tp_rank", "pp_rank", "dp_rank")})
        row.update({f"{g}_group": lay.get(f"{g}_group") for g in GROUPS_3D})
        row["stage"] = _stage_text(str(lay.get("stage_layers", "")))
        row.update({f"{g}_link": cfg.get(f"{g}_link", "-") for g in GROUPS_3D})
        rows.append(row)
    return pd.DataFrame(rows).sort_values("rank", ignore_index=True) if rows else pd.DataFrame()


def _node_color(node: int):
    return plt.cm.Pastel2(node % 8)


def plot_grid_3d(runs: list[Run], plot_dir=None, name="grid_3d"):
    """Where every rank sits, one row of two panels per run (lab 07 runs only). Left, by coordinates: a row per
    pipeline stage (stage 0 on top, its layers beside it), a block per replica (dp), a cell per tp slice, each
    cell named by its rank and filled with its node's colour; each tp group framed, solid when its ranks share
    a node, dashed red when it crosses nodes. Right, by node: the nodes as the launcher fills them (consecutive
    ranks), each rank with its coordinates."""
    grids = [(r, grid_3d(r)) for r in runs]
    grids = [(r, g) for r, g in grids if not g.empty]
    if not grids:
        return _nothing("no lab 07 run with a `layout` in its run records")
    from matplotlib.patches import Patch, Rectangle
    tall = max(int(g["pp_rank"].max()) + 1 for _, g in grids)
    fig, axes = plt.subplots(len(grids), 2, figsize=(13, (1.0 * tall + 1.4) * len(grids)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.15, 1]})
    for (r, g), (ax, ax_node) in zip(grids, axes):
        tp, pp, dp = (int(g[f"{a}_rank"].max()) + 1 for a in ("tp", "pp", "dp"))
        node_of = dict(zip(g["rank"], g["node"]))
        x_of = lambda t, d: d * (tp + 0.5) + t  # noqa: E731  a gap between the replicas' blocks
        for row in g.itertuples():
            x, y = x_of(row.tp_rank, row.dp_rank), row.pp_rank
            ax.add_patch(Rectangle((x, y - 0.4), 0.96, 0.8, facecolor=_node_color(row.node), edgecolor="0.5", lw=0.6))
            ax.text(x + 0.48, y, f"r{row.rank}\ntp {row.tp_rank}", ha="center", va="center", fontsize=8)
        seen = set()
        for row in g.itertuples():  # frame each tp group once, around its members' cells
            members = tuple(row.tp_group or [row.rank])
            if members in seen:
                continue
            seen.add(members)
            cells = g[g["rank"].isin(members)]
            x0 = min(x_of(c.tp_rank, c.dp_rank) for c in cells.itertuples())
            x1 = max(x_of(c.tp_rank, c.dp_rank) for c in cells.itertuples()) + 0.96
            across = len({node_of[m] for m in members}) > 1
            ax.add_patch(Rectangle((x0 - 0.05, row.pp_rank - 0.46), x1 - x0 + 0.1, 0.92, facecolor="none",
                                   edgecolor="tab:red" if across else "k", lw=1.6 if across else 1.0,
                                   ls="--" if across else "-"))
        for d in range(dp):
            ax.text(x_of((tp - 1) / 2, d) + 0.48, -0.62, f"replica dp {d}", ha="center", va="bottom", fontsize=8)
        stage_names = {int(s.pp_rank): s.stage for s in g[g["tp_rank"] == 0].itertuples()}
        ax.set_yticks(range(pp))
        ax.set_yticklabels([f"stage {s}\n{stage_names.get(s, '')}" for s in range(pp)], fontsize=8)
        ax.set(xlim=(-0.2, x_of(tp - 1, dp - 1) + 1.2), ylim=(pp - 0.5, -0.9), xticks=[])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        first = g.iloc[0]
        ax.set_title(f"{r.config.get('order')}: tp {tp} x pp {pp} x dp {dp} by coordinates; links of rank 0: tp "
                     f"{first['tp_link']}, pp {first['pp_link']}, dp {first['dp_link']}", fontsize=9)
        # By node: consecutive ranks, as mpirun --map-by slot and Slurm's block distribution fill nodes.
        nodes = sorted(g["node"].unique())
        per_node = int(g.groupby("node").size().max())
        for row in g.itertuples():
            slot = int((g[g["node"] == row.node]["rank"] < row.rank).sum())
            x, y = slot, nodes.index(row.node)
            ax_node.add_patch(Rectangle((x, y - 0.4), 0.96, 0.8, facecolor=_node_color(row.node), edgecolor="0.5",
                                        lw=0.6))
            ax_node.text(x + 0.48, y, f"r{row.rank}\ntp {row.tp_rank}\nstage {row.pp_rank}\ndp {row.dp_rank}",
                         ha="center", va="center", fontsize=7)
        for y in range(len(nodes)):
            ax_node.add_patch(Rectangle((-0.08, y - 0.47), per_node + 0.12, 0.94, facecolor="none", edgecolor="k",
                                        lw=1.2))
        ax_node.set_yticks(range(len(nodes)))
        ax_node.set_yticklabels([f"node {n}" for n in nodes], fontsize=8)
        ax_node.set(xlim=(-0.2, per_node + 0.2), ylim=(len(nodes) - 0.5, -0.6), xticks=[])
        for side in ("top", "right", "bottom"):
            ax_node.spines[side].set_visible(False)
        ax_node.set_title(f"by node ({per_node} ranks a node)", fontsize=9)
        handles = [Patch(facecolor=_node_color(n), edgecolor="0.5", label=f"node {n}") for n in nodes]
        handles += [Patch(facecolor="none", edgecolor="k", label="tp group inside a node"),
                    Patch(facecolor="none", edgecolor="tab:red", ls="--", label="tp group across nodes")]
        ax_node.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


def _step_records(run: Run, step: int | None):
    """(step, [(rank, timeline record, its "step" span)]) of one step of the run's timelines that carry a "step"
    span (the latest such step when step is None); (None, []) when no timeline has one."""
    tl = [r for r in run.timelines if any(c.get("name") == "step" for c in r.get("compute", []))]
    if not tl:
        return None, []
    if step is None:
        step = max(r["step"] for r in tl)
    return step, [(int(r["rank"]), r, next(c for c in r["compute"] if c["name"] == "step"))
                  for r in tl if r["step"] == step]


def timeline_3d(run: Run, step: int | None = None) -> pd.DataFrame:
    """One row per compute span and per call of every group in one step (default: the last step with a
    timeline record), every rank: rank, lane ("compute", "tp", "pp", "dp", "embedding"), group (the
    communicator's name: "pp gradients" is the pp lane's second channel), name ("F3", "all_reduce g forward",
    "send"), start_ms, end_ms, wait_ms, payload_bytes. The compute spans and the tp calls come from the
    `timeline` record, the other groups' calls from the step record's `group_calls`. Times are ms since the
    rank's "step" span began: every rank leaves a barrier at the step's start together, so the ranks line up
    although each has its own clock. attrs: step, window_ms {rank: the step span's length}."""
    step, records = _step_records(run, step)
    cols = ["rank", "lane", "group", "name", "start_ms", "end_ms", "wait_ms", "payload_bytes"]
    if step is None:
        return pd.DataFrame(columns=cols)
    steps = run.steps
    rows, window = [], {}
    for rank, rec, frame in records:
        t0 = frame["start_ms"]
        window[rank] = frame["end_ms"] - t0
        for c in rec["compute"]:
            if c["name"] != "step":
                rows.append([rank, "compute", "", c["name"], c["start_ms"] - t0, c["end_ms"] - t0, 0.0, 0])
        calls = list(rec.get("events", []))
        if not steps.empty and "group_calls" in steps:
            mine = steps[(steps["rank"] == rank) & (steps["step"] == step)]["group_calls"]
            calls += [c for c in (mine.iloc[-1] if not mine.empty and isinstance(mine.iloc[-1], list) else [])]
        for e in calls:
            group = str(e.get("group", "tp"))
            end = e["end_ms"] if e.get("end_ms") is not None else frame["end_ms"]
            rows.append([rank, group.split()[0], group, f"{e['op']} {e.get('tag', '')}".strip(), e["start_ms"] - t0,
                         end - t0, float(e.get("wait_ms") or 0.0), int(e.get("payload_bytes") or 0)])
    df = pd.DataFrame(rows, columns=cols)
    df.attrs["step"] = step
    df.attrs["window_ms"] = window
    return df


def plot_timeline_3d(run: Run, step: int | None = None, plot_dir=None, name="timeline_3d"):
    """One step of a lab 07 run: per rank (rank 0 on top, labelled with its coordinates) a compute lane (each
    forward light grey, each backward dark grey, labelled with its micro-batch) and under it one thin lane per
    group (tp red, pp blue, dp green, embedding purple), a bar per call from its start to its end; the grey
    frame is the rank's step window. Aligned on the ranks' "step" spans."""
    df = timeline_3d(run, step)
    if df.empty:
        return _nothing(f"no lab 07 timeline in {run.run_id} (--timeline-steps N logs steps 1..N)")
    g = grid_3d(run).set_index("rank")
    ranks = sorted(df.attrs["window_ms"])
    lanes = [x for x in GROUPS_3D]
    block = 1.3 + 0.28 * len(lanes)  # a rank's height: its compute lane, then its group lanes
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.62 * block * len(ranks)))
    ticks, labels = [], []
    for i, rank in enumerate(ranks):
        top = i * block
        ax.add_patch(plt.Rectangle((0, top - 0.1), df.attrs["window_ms"][rank], block - 0.2, facecolor="none",
                                   edgecolor="0.7", lw=0.8))
        d = df[df["rank"] == rank]
        for c in d[d["lane"] == "compute"].itertuples():
            action = parse_action(c.name)
            kind, mb = (action[0], action[1]) if action else ("F", "")
            ax.barh(top + 0.45, c.end_ms - c.start_ms, left=c.start_ms, height=0.8,
                    color="0.78" if kind == "F" else "0.5", edgecolor="white", lw=0.5)
            ax.text((c.start_ms + c.end_ms) / 2, top + 0.45, str(mb), ha="center", va="center", fontsize=6,
                    color="black" if kind == "F" else "white", clip_on=True)
        ticks.append(top + 0.45)
        coords = g.loc[rank] if rank in g.index else None
        labels.append(f"rank {rank}" + (f": tp {coords.tp_rank}, stage {coords.pp_rank}, dp {coords.dp_rank}"
                                        if coords is not None else ""))
        for k, lane in enumerate(lanes):
            y = top + 1.05 + 0.28 * k
            calls = d[d["lane"] == lane]
            ax.barh([y] * len(calls), calls["end_ms"] - calls["start_ms"], left=calls["start_ms"], height=0.22,
                    color=GROUP_COLORS[lane], alpha=0.85, lw=0)
            ticks.append(y)
            labels.append(lane if coords is None else f"{lane} ({coords[f'{lane}_link']})")
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(block * len(ranks), -0.3)
    ax.set_xlim(0, max(df.attrs["window_ms"].values()) * 1.01)
    ax.set_xlabel("ms since the step began (every rank leaves a barrier together)")
    s = run.steps
    step_ms = s[s["step"] == df.attrs["step"]]["step_ms"].max() if not s.empty else math.nan
    ax.set_title(f"{run.config.get('order')}: tp {run.config.get('tp')} x pp {run.config.get('pp')} x dp "
                 f"{run.config.get('dp')}, {run.config.get('schedule')} m {run.config.get('micro_batches')}: step "
                 f"{df.attrs['step']} ({step_ms:.0f} ms)", fontsize=9)
    from matplotlib.patches import Patch
    handles = [Patch(color="0.78", label="forward (micro-batch)"), Patch(color="0.5", label="backward")]
    handles += [Patch(color=GROUP_COLORS[x], label=f"{x} call") for x in lanes]
    handles.append(Patch(facecolor="none", edgecolor="0.7", label="step window"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


def group_costs(runs: list[Run]) -> pd.DataFrame:
    """One row per lab 07 run and group: run_id, order, group, link (the group's links over the ranks, "-"
    where a rank has none, joined by " + " when they differ), wait_ms (exposed: how long the rank was blocked
    in the group's calls), modeled_ms (what the link model charged for them), calls, payload_bytes: per step,
    the mean over the ranks of each rank's median over its timed steps (step 0 left out), as
    bench/placement_3d.py takes them."""
    rows = []
    for r in runs:
        s = r.steps
        if "order" not in r.config or s.empty or "groups" not in s:
            continue
        timed = s[s["step"] > s["step"].min()]
        timed = timed if not timed.empty else s
        grid = grid_3d(r)
        for grp in GROUPS_3D:
            per_rank = {k: [] for k in ("wait_ms", "modeled_ms", "calls", "payload_bytes")}
            for _, mine in timed.groupby("rank"):
                for k in per_rank:
                    per_rank[k].append(float(pd.Series([gr[grp][k] for gr in mine["groups"]]).median()))
            links = sorted(set(grid[f"{grp}_link"])) if not grid.empty else ["?"]
            row = {"run_id": r.run_id, "order": r.config["order"], "group": grp, "link": " + ".join(links)}
            row.update({k: sum(v) / len(v) for k, v in per_rank.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def plot_group_costs(df: pd.DataFrame, plot_dir=None, name="group_costs"):
    """One small panel per group: for each order (run), the group's exposed wait per step (solid) beside what
    the link model charged for its calls (hatched), the group's link under the order's name."""
    if df.empty:
        return _nothing("no lab 07 step records with `groups`")
    groups = [x for x in GROUPS_3D if x in set(df["group"])]
    run_ids = list(dict.fromkeys(df["run_id"]))  # a bar pair per run, named by its order
    orders = df.drop_duplicates("run_id").set_index("run_id")["order"].reindex(run_ids).tolist()
    fig, axes = plt.subplots(1, len(groups), figsize=(2.2 + 1.4 * len(run_ids) * len(groups), 3.6), squeeze=False)
    for ax, grp in zip(axes[0], groups):
        d = df[df["group"] == grp].set_index("run_id").reindex(run_ids)
        x = range(len(run_ids))
        ax.bar([i - 0.2 for i in x], d["wait_ms"], width=0.4, color=GROUP_COLORS[grp], label="exposed wait")
        ax.bar([i + 0.2 for i in x], d["modeled_ms"], width=0.4, color="white", edgecolor=GROUP_COLORS[grp],
               hatch="///", label="link charge")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{o}\n{lnk}" for o, lnk in zip(orders, d["link"])], fontsize=7)
        calls = d["calls"].max()
        ax.set_title(f"{grp}: {calls:.0f} call{'' if round(calls) == 1 else 's'}, "
                     f"{d['payload_bytes'].max() / 2**20:.2f} MiB a step", fontsize=9)
        top = max(d["wait_ms"].max(), d["modeled_ms"].max())
        ax.set_ylim(0, 1.3 * top if top > 0 else 1.0)  # room for the legend above the bars
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    axes[0][0].set_ylabel("ms per step (mean over ranks)")
    return _save(fig, name, plot_dir)


# ------------------------------------------------------------------------------------------------
# Lab 08: a loss spike rolled back (labs/08_resilience/README.md, "Loss spikes: roll back and skip")


def latest_lab08_spike_runs(runs_root: str | Path = "../runs", limit: int = 1) -> list[Path]:
    """The most recent finished lab 08 runs that rolled back at least once (a `rollback` record)."""
    chosen = [r.path for r in load_runs(find_runs("lab08", runs_root)) if r.finished and not r.rollbacks.empty]
    return chosen[-limit:]


def rollback_passes(run: Run) -> pd.DataFrame:
    """Rank 0's step records in the order they were logged, with ``pass``: 0 until the first rollback, 1
    after it, ... (a rollback logs the same steps again from its ``to_step``), and ``kept``: whether the
    step's result survived (False for the steps a later rollback undid)."""
    s = run.steps
    if s.empty:
        return s
    s = s[s["rank"] == s["rank"].min()].reset_index(drop=True).copy()
    s["pass"] = (s["step"].diff() <= 0).cumsum()
    last_pass_of_step = s.groupby("step")["pass"].transform("max")
    s["kept"] = s["pass"] == last_pass_of_step
    return s


def plot_rollback(run: Run, zoom: int = 15, plot_dir=None, name="rollback"):
    """The loss of a run with rollbacks: the whole run (left) and the steps around the first rollback
    (right). The steps a rollback undid are grey, the spike (the rollback record's loss, never a step
    record) a red cross, the step rolled back to a dotted line; the kept steps are blue."""
    p = rollback_passes(run)
    if p.empty or run.rollbacks.empty:
        return _nothing("no lab 08 run with a rollback")
    rb = run.rollbacks[run.rollbacks["rank"] == run.rollbacks["rank"].min()]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    first = rb.iloc[0]
    for ax, lo, hi in ((axes[0], p["step"].min(), p["step"].max()),
                       (axes[1], first["to_step"] - zoom, first["step"] + zoom)):
        w = p[(p["step"] >= lo) & (p["step"] <= hi)]
        kept = w[w["kept"]].sort_values("step")  # one run of each step: a single curve across the rollback
        ax.plot(kept["step"], kept["loss"], "-", color="tab:blue", lw=1.2, zorder=3, label="accepted steps")
        for i, (_, undone) in enumerate(w[~w["kept"]].groupby("pass")):
            ax.plot(undone["step"], undone["loss"], "-", color="grey", lw=4, alpha=0.5, zorder=2,
                    label="steps the rollback undid (run again)" if i == 0 else None)
        for i, (_, r) in enumerate(rb.iterrows()):
            if not lo <= r["step"] <= hi:
                continue
            spike = r.get("loss")
            if pd.notna(spike) and math.isfinite(float(spike)):
                ax.plot([r["step"]], [spike], "x", color="tab:red", ms=10, mew=2,
                        label="spike (rolled back)" if i == 0 else None)
            ax.axvline(r["to_step"], color="tab:red", ls=":", lw=1,
                       label="rolled back to (checkpoint)" if i == 0 else None)
        ax.set(xlabel="optimizer step", ylabel="loss (nats/token)")
    axes[0].set_title(f"{run.label}: the whole run")
    axes[1].set_title(f"around the rollback at step {int(first['step'])}")
    axes[1].legend(fontsize=8)
    return _save(fig, name, plot_dir)


# ---------------------------------------------------------------------------------------------
# Lab 09: the planner against the kit's runs (bench/plan_validate.py's results.json) and its rankings
# (bin/sl_plan --json, without --tp: the top rows that fit and the refusals by reason).

def load_plan_validation(path: str | Path) -> pd.DataFrame:
    """One row per layout of bench/plan_validate.py's results.json: name, kind (real / uniform), ranks, the
    measured and predicted step (ms) and memory (bytes: the four categories the planner counts), their
    errors (predicted / measured - 1). Empty when the file is missing."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame()
    doc = json.loads(path.read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    df = pd.DataFrame([{k: r[k] for k in ("name", "kind", "ranks", "measured_step_ms", "predicted_step_ms",
                                          "measured_model_bytes", "predicted_bytes")} for r in rows])
    if not df.empty:
        df["time_error"] = df["predicted_step_ms"] / df["measured_step_ms"] - 1
        df["memory_error"] = df["predicted_bytes"] / df["measured_model_bytes"] - 1
    return df


def plot_plan_validation(df: pd.DataFrame, plot_dir=None, name="plan_validation"):
    """Predicted against measured, step time (left) and memory per rank (right), one point a layout: on the
    diagonal the model is exact; the grey band is +-10 % (time) and +-5 % (memory), the issue's goals."""
    if df.empty:
        return _nothing("no bench/plan_validate.py results")
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, (mx, py, band, unit, scale) in zip(axes, (("measured_step_ms", "predicted_step_ms", 0.10, "ms", 1.0),
                                                      ("measured_model_bytes", "predicted_bytes", 0.05, "MiB", 2**20))):
        lo = min(df[mx].min(), df[py].min()) / scale * 0.8
        hi = max(df[mx].max(), df[py].max()) / scale * 1.2
        xs = [lo, hi]
        ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="0.9",
                        label=f"within {band:.0%}")
        ax.plot(xs, xs, "k:", lw=1)
        for kind, marker in (("real", "o"), ("uniform", "s")):
            d = df[df["kind"] == kind]
            ax.plot(d[mx] / scale, d[py] / scale, marker, ls="", label=f"{kind} compute")
        ax.set(xscale="log", yscale="log", xlim=xs, ylim=xs, xlabel=f"measured ({unit})", ylabel=f"predicted ({unit})")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers on the log axes, not powers of ten
            axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            axis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.legend(fontsize=8)
    axes[0].set_title("step time: slowest rank, median of runs")
    axes[1].set_title("memory per rank: params + grads + optimizer + activations")
    return _save(fig, name, plot_dir)


def load_plan_rankings(folder: str | Path) -> dict[str, dict]:
    """{file stem: the object bin/sl_plan --json printed} for every <folder>/*.json; {} when none."""
    folder = Path(folder)
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def plan_ranking(doc: dict) -> pd.DataFrame:
    """The ranking's rows: layout fields, GB a device, predicted step ms, tokens/s, MFU, bubble and dp shares."""
    rows = []
    for r in doc.get("rows", []):
        t, m = r["time"], r["memory"]
        rows.append(dict(tp=r["tp"], pp=r["pp"], dp=r["dp"], B=r["micro_batch"], m=r["micro_batches"],
                         zero=r["zero_stage"], sp=r["sequence_parallel"], recompute=r["recompute"],
                         gb=m["total_bytes"] / 1e9, step_ms=t["step_ms"], tokens_per_s=t["tokens_per_s"],
                         mfu=t["mfu"], bubble=t["bubble_ms"] / t["step_ms"], dp_share=t["dp_ms"] / t["step_ms"]))
    return pd.DataFrame(rows)


def plot_plan_ranking(doc: dict, title: str, plot_dir=None, name="plan_ranking"):
    """The best layouts of one plan as bars of predicted tokens/s, each labelled with its split and options and
    coloured by where its step goes (compute, bubble, dp)."""
    df = plan_ranking(doc)
    if df.empty:
        return _nothing(f"{title}: no layout fits")
    df = df.iloc[::-1]  # the best on top
    labels = [f"tp {r.tp} pp {r.pp} dp {r.dp} | B {r.B} x {r.m} | z{r.zero}{' sp' if r.sp else ''} {r.recompute}"
              for r in df.itertuples()]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(df) + 1.5))
    rest = 1 - df["bubble"] - df["dp_share"]
    left = 0 * df["tokens_per_s"]
    for share, color, label in ((rest, "tab:blue", "compute + tp + pp"), (df["bubble"], "tab:orange", "bubble"),
                                (df["dp_share"], "tab:red", "dp")):
        ax.barh(labels, df["tokens_per_s"] * share, left=left, color=color, label=label)
        left = left + df["tokens_per_s"] * share
    for y, r in enumerate(df.itertuples()):
        ax.text(r.tokens_per_s, y, f" {r.gb:.0f} GB, MFU {r.mfu:.0%}", va="center", fontsize=8)
    ax.set(xlabel="predicted tokens/s (the bar split by where the step's time goes)", title=title)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, name, plot_dir)


# ------------------------------------------------------------------------------------------------
# Lab 10: context parallel (the ring's timeline, activation memory against the sequence length)


def _cp_layout(cfg: dict) -> tuple:
    return (cfg.get("model"), cfg.get("tp", 1), cfg.get("cp"), cfg.get("dp"), cfg.get("T"), cfg.get("zigzag"),
            cfg.get("variant"), cfg.get("overlap"), cfg.get("link", "none"), cfg.get("micro_batch"))


def latest_lab10_runs(runs_root: str | Path = "../runs", limit: int = 64) -> list[Path]:
    """Lab 10: the most recent finished run of each layout (model, tp, cp, dp, T, zig-zag, variant, overlap,
    link, micro-batch) under ``<runs_root>/lab10``, oldest first, at most ``limit``."""
    return _latest_by_layout("lab10", runs_root, limit, "cp", _cp_layout)


def cp_timeline(run: Run, step: int | None = None) -> pd.DataFrame:
    """One row per attention call and per send or receive of one step (default: the last step with a
    timeline record), every rank: rank, lane ("attention", "send" or "recv"), name, phase ("forward" or
    "backward"; a call of neither, such as the gradients' all-reduce, is left out), start_ms, end_ms, and for
    the transfers wait_ms (how long the rank was blocked in it). An attention span is the whole call of the
    ring (its block ops and its waits), logged by lab 10's program ("attention forward L"); a transfer is in
    flight from its start_ms to its end_ms. Times are ms since the rank's "step" span began. attrs: step,
    window_ms {rank: the step span's length}. Empty without a timeline (lab 10: --timeline-steps N)."""
    step, records = _step_records(run, step)
    cols = ["rank", "lane", "name", "phase", "start_ms", "end_ms", "wait_ms"]
    if step is None:
        return pd.DataFrame(columns=cols)
    rows, window = [], {}
    for rank, rec, frame in records:
        t0 = frame["start_ms"]
        window[rank] = frame["end_ms"] - t0
        for c in rec["compute"]:
            m = re.match(r"attention (forward|backward) (\d+)$", c["name"])
            if m:
                rows.append({"rank": rank, "lane": "attention", "name": c["name"], "phase": m.group(1),
                             "start_ms": c["start_ms"] - t0, "end_ms": c["end_ms"] - t0, "wait_ms": 0.0})
        # a transfer issued after the last forward call returned is the backward's
        forward_end = max([c["end_ms"] - t0 for c in rec["compute"] if c["name"].startswith("attention forward")],
                          default=math.inf)
        for e in rec.get("events", []):
            if e["op"] not in ("send", "recv") or e.get("end_ms") is None:
                continue
            phase = "backward" if e["issue_ms"] - t0 >= forward_end else "forward"
            rows.append({"rank": rank, "lane": e["op"], "name": f"{e['op']} {e.get('tag', '')}".strip(),
                         "phase": phase, "start_ms": e["start_ms"] - t0, "end_ms": e["end_ms"] - t0,
                         "wait_ms": float(e.get("wait_ms", 0.0))})
    df = pd.DataFrame(rows, columns=cols)
    df.attrs["step"] = step
    df.attrs["window_ms"] = window
    return df


_CP_COLORS = {("attention", "forward"): "tab:blue", ("attention", "backward"): "tab:green",
              ("send", "forward"): "tab:orange", ("send", "backward"): "tab:orange",
              ("recv", "forward"): "tab:red", ("recv", "backward"): "tab:red"}


def plot_cp_timeline(runs: list[Run], step: int | None = None, plot_dir=None, name="cp_timeline"):
    """The ring per rank over one step, one panel per run (runs with a timeline only): for every rank two
    lanes, its attention calls (forward blue, backward green; a call spans its block ops and its waits) and its
    transfers (sends orange, receives red, drawn while in flight), ms since the rank's step began on the x axis.
    With the overlap, the transfers run under the attention calls; with --no-overlap, each call stretches by
    the transfers it waits for. The title gives the step time and the exposed (blocked) transfer time."""
    timelines = [(r, df) for r, df in ((r, cp_timeline(r, step)) for r in runs) if not df.empty]
    if not timelines:
        return _nothing("no lab 10 run with a timeline (scripts/run 10 ... --timeline-steps 1)")
    cp_max = max(int(r.config.get("cp", r.world_size)) for r, _ in timelines)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 0.8 + (0.7 * cp_max + 0.6) * len(timelines)),
                             sharex=True, squeeze=False)
    for ax, (r, df) in zip(axes[:, 0], timelines):
        ranks = sorted(df.attrs["window_ms"])
        for rank in ranks:
            y = 2 * rank
            ax.barh([y, y + 0.8], df.attrs["window_ms"][rank], left=0, height=0.75, color="none", edgecolor="0.8",
                    linewidth=0.6)
            for _, c in df[df["rank"] == rank].iterrows():
                lane_y = y if c["lane"] == "attention" else y + 0.8
                ax.barh(lane_y, max(c["end_ms"] - c["start_ms"], 1e-6), left=c["start_ms"],
                        height=0.7 if c["lane"] == "attention" else 0.35,
                        color=_CP_COLORS[(c["lane"], c["phase"])], alpha=0.9 if c["lane"] == "attention" else 0.6,
                        edgecolor="white", linewidth=0.3)
        ax.set_yticks([2 * k for k in ranks] + [2 * k + 0.8 for k in ranks])
        ax.set_yticklabels([f"rank {k} attention" for k in ranks] + [f"rank {k} transfers" for k in ranks],
                           fontsize=7)
        ax.set_ylim(2 * max(ranks) + 1.4, -0.6)
        exposed = df[df["lane"] != "attention"]["wait_ms"].sum() / max(len(ranks), 1)
        steps = r.steps[r.steps["step"] == df.attrs["step"]]
        step_ms = steps["step_ms"].max() if not steps.empty else math.nan
        cfg = r.config
        ax.set_title(f"cp {cfg.get('cp')}, T {cfg.get('T')}{', zig-zag' if cfg.get('zigzag') else ''}, "
                     f"{cfg.get('variant')}, {'overlapped' if cfg.get('overlap') else 'no overlap'}, link "
                     f"{cfg.get('link', 'none')}: step {df.attrs['step']} {step_ms:.3f} ms, transfers blocked "
                     f"{exposed:.3f} ms per rank" + (" (virtual time)" if r.info.get("device") == "sim" else ""),
                     fontsize=9)
    axes[-1, 0].set_xlabel("ms since the rank's step began")
    from matplotlib.patches import Patch
    handles = [Patch(color="tab:blue", label="attention forward (compute + waits)"),
               Patch(color="tab:green", label="attention backward (compute + waits)"),
               Patch(color="tab:orange", alpha=0.6, label="send in flight"),
               Patch(color="tab:red", alpha=0.6, label="receive in flight")]
    axes[0, 0].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, name, plot_dir)


def cp_activation_memory(runs: list[Run]) -> pd.DataFrame:
    """One row per finished lab 10 run without tensor parallelism (tp 1: the memory against cp alone): run_id, cp,
    T, T_local, zigzag, act_peak_bytes (the largest memory_activations_peak_bytes over the ranks' summaries: the
    allocator's peak of category activations), sorted by cp then T. A later run of the same (cp, T) replaces an
    earlier one."""
    rows = {}
    for r in runs:
        cfg = r.config
        if "cp" not in cfg or int(cfg.get("tp", 1)) != 1 or not r.finished or \
                "memory_activations_peak_bytes" not in r.summaries:
            continue
        rows[(int(cfg["cp"]), int(cfg["T"]))] = {
            "run_id": r.run_id, "cp": int(cfg["cp"]), "T": int(cfg["T"]), "T_local": int(cfg.get("T_local", 0)),
            "zigzag": bool(cfg.get("zigzag")), "act_peak_bytes": int(r.summaries["memory_activations_peak_bytes"].max())}
    df = pd.DataFrame(list(rows.values()), columns=["run_id", "cp", "T", "T_local", "zigzag", "act_peak_bytes"])
    return df.sort_values(["cp", "T"], ignore_index=True)


def plot_cp_memory(df: pd.DataFrame, plot_dir=None, name="cp_activation_memory"):
    """Activation memory per rank (MiB, the allocator's peak) against the sequence length T, one line per cp:
    each rank holds T / cp tokens of every sequence, so at a given T the cp lines sit 1/cp of the cp 1 line."""
    if df.empty:
        return _nothing("no finished lab 10 run with memory_activations_peak_bytes in its summary")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for cp, g in df.groupby("cp"):
        ax.plot(g["T"], g["act_peak_bytes"] / 2**20, "o-", label=f"cp {cp}")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)  # a halving per doubling of cp: one tick apart
    ax.set(xlabel="T (tokens per sequence)", ylabel="activations per rank (MiB, peak)",
           title="activation memory against the sequence length")
    ts = sorted(df["T"].unique())
    ax.set_xticks(ts)
    ax.set_xticklabels([str(t) for t in ts])
    ax.minorticks_off()
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.legend(fontsize=8)
    return _save(fig, name, plot_dir)
