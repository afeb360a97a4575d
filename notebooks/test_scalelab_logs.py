#!/usr/bin/env python3
"""test_scalelab_logs.py — the notebooks' memory plots stack what the allocator holds, nothing more; lab 06's
readers align the stages, parse the spans and take the bubble as the notebook says.

  .venv-notebooks/bin/python notebooks/test_scalelab_logs.py [--runs-root DIR]

A stacked memory bar (plot_memory: one bar per rank; plot_memory_by_world_size: one bar per run) must
be exactly memory_current_bytes of the step it shows: the sum of the allocator's categories. Before
the fix, memory_reserved_bytes (what the caching allocator holds from the system, docs/log_schema.md)
was stacked as one more category, and every bar showed about twice the memory held. Checked on
synthetic records shaped like a CUDA run's (reserved > current) and, with --runs-root, on every run
found there (scripts/notebooks.sh --make-logs passes its fresh runs). Needs pandas and matplotlib:
scripts/notebooks.sh runs it in .venv-notebooks; the ctest notebooks.memory_stack skips without them.

Lab 06 (PipelineLogsTest): on synthetic records of a 2-stage pipeline whose ranks have different clocks,
pipeline_timeline puts every stage's spans on the time since its "step" span began; parse_action reads
"F3", "B3.1"; pp_bubble takes the median over the timed steps (step 0 left out) and the stages;
latest_lab06_runs keeps the newest finished run of each layout; the timeline plot draws one box per span.
With --runs-root, on every lab 06 run there: bubble_formula agrees with the logged one, and each timeline
holds the step's `ran` actions in order, m x v forwards and backwards per stage, inside the step's window.

Lab 10 (ContextParallelLogsTest): on synthetic records of a 2-rank ring with different clocks per rank,
cp_timeline aligns the ranks on their "step" span, keeps the attention calls and the sends and receives (not
the gradients' all_reduce) and calls a transfer issued after the last forward call the backward's;
cp_activation_memory takes the largest rank of the latest run of each (cp, T), tp 1 runs only. With --runs-root, on every lab 10
run with a timeline: one forward and one backward call per block on every rank inside the step's window, cp - 1
forward sends per block; and activation memory falls as cp grows at every T.

Lab 07 (Grid3dLogsTest): on synthetic records of a 2 x 2 x 1 grid on 2 simulated nodes of 2, in two orders,
with different clocks per rank: grid_3d reads every rank's layout and node, a tp group across nodes gets the
dashed frame, timeline_3d aligns the ranks on their "step" span and puts "pp gradients" in the pp lane,
group_costs takes the median over the timed steps then the mean over ranks, order_comparison keeps one run
per order of one layout. With --runs-root, on every lab 07 run there: the grid holds every coordinate once,
every rank is in its groups and their members agree, a group crossing nodes took --inter-link, and each
timeline holds exactly the calls the step record's `groups` counted, inside the step's window.
"""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RUNS_ROOT = None  # --runs-root


class LogsTestCase(unittest.TestCase):
    """The notebooks' module under test, imported once per test class with matplotlib drawing off-screen."""

    @classmethod
    def setUpClass(cls):
        import matplotlib
        matplotlib.use("Agg")
        import scalelab_logs  # noqa: E402  the module under test
        cls.sl = scalelab_logs


def step(rank, step_no, cats, reserved):
    rec = {"type": "step", "rank": rank, "step": step_no, "loss": 3.0, "tokens": 1024, "step_ms": 10.0,
           "mfu": 0.4, "memory_peak_bytes": sum(cats.values()) + 4096,
           "memory_current_bytes": sum(cats.values()), "memory_reserved_bytes": reserved,
           "memory_reserved_peak_bytes": reserved + 8192}
    for name, value in cats.items():
        rec[f"memory_{name}_bytes"] = value
        rec[f"memory_{name}_peak_bytes"] = value + 512
    return rec


class MemoryStackTest(LogsTestCase):
    def write_run(self, root, run_id, world, cats_of_rank):
        d = os.path.join(root, "lab04", run_id)
        os.makedirs(d)
        for rank in range(world):
            with open(os.path.join(d, f"rank{rank}.jsonl"), "w") as f:
                f.write(json.dumps({"type": "run", "rank": rank, "run_id": run_id, "world_size": world,
                                    "config": {"model": "demo", "stage": 3}}) + "\n")
                for s in range(3):
                    cats = cats_of_rank(rank, s)
                    # a caching allocator holds more than the tensors use: reserved > current
                    f.write(json.dumps(step(rank, s, cats, reserved=2 * sum(cats.values()) + 65536)) + "\n")
        return d

    def assert_bars_are_current(self, run):
        """Every stacked bar of plot_memory ends at memory_current_bytes of the rank's last step."""
        import matplotlib.pyplot as plt
        fig = self.sl.plot_memory(run)
        tops = {}
        for patch in fig.axes[0].patches:
            x = round(patch.get_x() + patch.get_width() / 2, 6)
            tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
        last = run.steps.sort_values("step").groupby("rank").tail(1).sort_values("rank")
        want = (last["memory_current_bytes"] / 2**20).tolist()
        self.assertEqual(len(tops), len(want), "one bar per rank")
        for got, expected in zip([tops[x] for x in sorted(tops)], want):
            self.assertAlmostEqual(got, expected, places=6, msg=f"{run.run_id}: a bar is {got} MiB, held {expected}")
        plt.close(fig)

    def test_synthetic_run_stacks_equal_current(self):
        with tempfile.TemporaryDirectory() as root:
            cats = lambda rank, s: {"params": 3 << 20, "grads": (1 + rank) << 20, "optimizer_state": 6 << 20,  # noqa: E731
                                    "activations": (10 + s) << 20, "comm": 1 << 19}
            d = self.write_run(root, "synthetic", 2, cats)
            run = self.sl.read_run(d)
            table = self.sl.memory_by_category(run)
            self.assertNotIn("reserved", table.columns)
            self.assertEqual(sorted(table.columns), ["activations", "comm", "grads", "optimizer_state", "params"])
            self.assertEqual(table.sum(axis=1).tolist(), [sum(cats(r, 2).values()) for r in range(2)])
            self.assert_bars_are_current(run)
            fig = self.sl.plot_memory_by_world_size([run])
            top = max(p.get_y() + p.get_height() for p in fig.axes[0].patches)
            self.assertAlmostEqual(top, sum(sum(cats(r, 2).values()) for r in range(2)) / 2 / 2**20, places=6)

    def test_a_total_read_as_a_category_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            d = self.write_run(root, "extra", 1, lambda rank, s: {"params": 1 << 20, "grads": 1 << 20})
            path = os.path.join(d, "rank0.jsonl")
            with open(path) as f:
                lines = [json.loads(x) for x in f]
            for rec in lines:
                if rec["type"] == "step":
                    rec["memory_pinned_bytes"] = 1 << 20  # a new total the reader does not know
            with open(path, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in lines))
            with self.assertRaisesRegex(ValueError, "memory_current_bytes"):
                self.sl.memory_by_category(self.sl.read_run(d))

    def test_real_runs_stack_equal_current(self):
        if not RUNS_ROOT:
            self.skipTest("no --runs-root given")
        checked = 0
        for lab in ("lab01", "lab03", "lab04", "lab06"):
            for d in self.sl.find_runs(lab, RUNS_ROOT):
                run = self.sl.read_run(d)
                if run.steps.empty or "memory_current_bytes" not in run.steps.columns:
                    continue
                self.assert_bars_are_current(run)
                checked += 1
        if checked == 0:
            self.skipTest(f"no run with memory records under {RUNS_ROOT}")


def pp_run(root, run_id, schedule="gpipe", m=2, v=1, spans=None, finished=True, bubbles=None):
    """A synthetic lab 06 run of 2 stages: rank k's clock is offset by 1000 * (k + 1) ms, its timeline of step 1
    holds `spans` ({rank: [(name, start, end)]}, ms since the step began) and a "step" span of 10 ms."""
    spans = spans or {0: [("F0", 0, 1), ("F1", 1, 2), ("B0", 5, 7), ("B1", 7, 9)],
                      1: [("F0", 1, 2), ("F1", 2, 3), ("B0", 3, 5), ("B1", 5, 7)]}
    bubbles = bubbles or {0: [0.9, 0.4, 0.3], 1: [0.9, 0.5, 0.45]}  # steps 0, 1, 2; step 0 is warm-up
    d = os.path.join(root, "lab06", run_id)
    os.makedirs(d)
    cfg = {"model": "demo", "pp": 2, "schedule": schedule, "chunks": v, "micro_batches": m, "micro_batch": 2,
           "T": 32, "uniform_compute_ms": 1.0, "link": "none", "bubble_formula": 1 / (v * m + 1)}
    for rank in range(2):
        t0 = 1000.0 * (rank + 1)
        with open(os.path.join(d, f"rank{rank}.jsonl"), "w") as f:
            out = lambda rec: f.write(json.dumps(dict(rec, rank=rank)) + "\n")  # noqa: E731
            out({"type": "run", "run_id": run_id, "world_size": 2, "config": cfg})
            for s, b in enumerate(bubbles[rank]):
                if s == 1:
                    out({"type": "timeline", "step": 1, "events": [],
                         "compute": [{"name": n, "start_ms": t0 + a, "end_ms": t0 + e} for n, a, e in spans[rank]]
                         + [{"name": "step", "start_ms": t0, "end_ms": t0 + 10.0}]})
                out({"type": "step", "step": s, "loss": 3.0, "tokens": 128, "step_ms": 10.0, "mfu": 0.1,
                     "bubble": b, "bubble_formula": cfg["bubble_formula"], "compute_ms": 6.0, "pipeline_ms": 10.0,
                     "ran": " ".join(n for n, _, _ in spans[rank])})
            if finished or rank == 0:
                out({"type": "summary", "tokens_per_s": 12800.0, "step_ms": 10.0,
                     "memory_activations_peak_bytes": (2 - rank) << 20})
    return d


class PipelineLogsTest(LogsTestCase):
    def test_parse_action_reads_micro_batch_and_chunk(self):
        self.assertEqual(self.sl.parse_action("F3"), ("F", 3, 0))
        self.assertEqual(self.sl.parse_action("B12.1"), ("B", 12, 1))
        self.assertEqual(self.sl.parse_action("I2"), ("I", 2, 0))   # ZB-H1: a split backward's two halves
        self.assertEqual(self.sl.parse_action("W0.1"), ("W", 0, 1))
        for other in ("step", "F", "X1", "F1.", "forward"):
            self.assertIsNone(self.sl.parse_action(other), other)

    def test_bubble_formula_is_narayanans(self):
        self.assertAlmostEqual(self.sl.bubble_formula(4, 4), 3 / 7)       # README: GPipe and 1F1B, p 4, m 4
        self.assertAlmostEqual(self.sl.bubble_formula(4, 4, 2), 3 / 11)   # interleaved, v 2
        self.assertAlmostEqual(self.sl.bubble_formula(2, 1), 0.5)
        self.assertEqual(self.sl.bubble_formula(1, 8), 0.0)               # one stage: no bubble
        self.assertAlmostEqual(self.sl.bubble_formula(4, 4, schedule="zb-h1"), 3 / 15)  # ZB-H1: (p-1)/(3m+p-1)

    def test_timeline_aligns_stages_on_their_step_span(self):
        with tempfile.TemporaryDirectory() as root:
            spans = {0: [("F0", 0, 1), ("F0.1", 2, 2.5), ("B0.1", 6, 7), ("B0", 8, 9)],
                     1: [("F0", 1, 2), ("F0.1", 2.5, 3), ("B0.1", 3, 4), ("B0", 4, 6)]}
            run = self.sl.read_run(pp_run(root, "tl", schedule="interleaved", m=1, v=2, spans=spans))
            tl = self.sl.pipeline_timeline(run)
            self.assertEqual(tl.attrs["step"], 1)
            self.assertEqual(tl.attrs["window_ms"], {0: 10.0, 1: 10.0})
            self.assertNotIn("step", set(tl["name"]))
            got = {(r.stage, r.name): (r.kind, r.micro_batch, r.chunk, r.start_ms, r.end_ms) for r in tl.itertuples()}
            self.assertEqual(got[(1, "F0")], ("F", 0, 0, 1.0, 2.0))  # 5001 ms on rank 1's clock: 1 ms into its step
            self.assertEqual(got[(0, "B0.1")], ("B", 0, 1, 6.0, 7.0))
            self.assertEqual(len(tl), 8)

    def test_bubble_is_the_median_of_the_timed_steps_and_stages(self):
        with tempfile.TemporaryDirectory() as root:
            run = self.sl.read_run(pp_run(root, "b"))
            df = self.sl.pp_bubble([run])
            self.assertEqual(len(df), 1)
            row = df.iloc[0]
            self.assertAlmostEqual(row["bubble"], 0.425)  # median of 0.4, 0.3, 0.5, 0.45: step 0's 0.9 left out
            self.assertAlmostEqual(row["bubble_formula"], 1 / 3)
            self.assertEqual((row["p"], row["schedule"], row["v"], row["m"]), (2, "gpipe", 1, 2))
            self.assertEqual(row["act_peak_bytes"], 2 << 20)
            peaks = self.sl.pp_activation_peaks([run])
            self.assertEqual(peaks.sort_values("stage")["act_peak_bytes"].tolist(), [2 << 20, 1 << 20])

    def test_latest_runs_keep_the_newest_finished_run_of_each_layout(self):
        with tempfile.TemporaryDirectory() as root:
            made = [pp_run(root, "old-m2"), pp_run(root, "m4", m=4), pp_run(root, "new-m2"),
                    pp_run(root, "died-m8", m=8, finished=False)]
            for age, d in enumerate(made):  # oldest first, whatever the file system's clock resolution
                for f in os.listdir(d):
                    os.utime(os.path.join(d, f), (1e9 + age, 1e9 + age))
            got = [os.path.basename(p) for p in self.sl.latest_lab06_runs(root)]
            self.assertEqual(got, ["m4", "new-m2"])

    def test_timeline_plot_draws_one_box_per_span(self):
        import matplotlib.pyplot as plt
        with tempfile.TemporaryDirectory() as root:
            run = self.sl.read_run(pp_run(root, "plot"))
            fig = self.sl.plot_pipeline_timelines([run])
            ax = fig.axes[0]
            self.assertEqual(len(ax.patches), 2 + 8)  # a window frame per stage and a box per span
            self.assertEqual(sorted(t.get_text() for t in ax.texts), ["0"] * 4 + ["1"] * 4)  # micro-batches
            plt.close(fig)
            for fig in (self.sl.plot_bubble_vs_m(self.sl.pp_bubble([run])),
                        self.sl.plot_pp_memory(self.sl.pp_activation_peaks([run]))):
                self.assertIsNotNone(fig)
                plt.close(fig)

    def test_zb_h1_picture_colours_i_and_w_apart(self):
        import matplotlib.pyplot as plt
        from matplotlib.colors import to_hex
        spans = {0: [("F0", 0, 1), ("F1", 1, 2), ("I0", 4, 5), ("W0", 5, 6), ("I1", 6, 7), ("W1", 7, 8)],
                 1: [("F0", 1, 2), ("I0", 2, 3), ("F1", 3, 4), ("I1", 4, 5), ("W0", 5, 6), ("W1", 6, 7)]}
        with tempfile.TemporaryDirectory() as root:
            run = self.sl.read_run(pp_run(root, "zb", schedule="zb-h1", spans=spans))
            tl = self.sl.pipeline_timeline(run)
            self.assertEqual(sorted(tl["kind"].value_counts().items()), [("F", 4), ("I", 4), ("W", 4)])
            fig = self.sl.plot_pipeline_timelines([run])
            ax = fig.axes[0]
            boxes = ax.patches[2:]  # after a window frame per stage: one box per span, in the frame's row order
            self.assertEqual(len(boxes), len(tl))
            colour = {}  # kind -> the face colours of its boxes
            for box, kind in zip(boxes, tl["kind"]):
                colour.setdefault(kind, set()).add(to_hex(box.get_facecolor()))
            self.assertEqual({k: len(c) for k, c in colour.items()}, {"F": 1, "I": 1, "W": 1})  # one colour a kind
            self.assertEqual(len(set().union(*colour.values())), 3, colour)  # F, I and W each their own
            legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
            self.assertEqual(legend, ["forward", "input gradient (I)", "weight gradient (W)",
                                      "step window (white: bubble)"])
            legend_colour = {t.get_text(): to_hex(h.get_facecolor())
                             for t, h in zip(fig.axes[0].get_legend().get_texts(),
                                             fig.axes[0].get_legend().legend_handles)}
            self.assertEqual(legend_colour["input gradient (I)"], colour["I"].pop())
            self.assertEqual(legend_colour["weight gradient (W)"], colour["W"].pop())
            plt.close(fig)

    def test_real_lab06_runs(self):
        if not RUNS_ROOT:
            self.skipTest("no --runs-root given")
        checked = 0
        for d in self.sl.find_runs("lab06", RUNS_ROOT):
            run = self.sl.read_run(d)
            cfg = run.config
            p, m, v = run.world_size, int(cfg["micro_batches"]), int(cfg.get("chunks", 1))
            self.assertAlmostEqual(self.sl.bubble_formula(p, m, v, cfg["schedule"]), cfg["bubble_formula"], places=12,
                                   msg=run.run_id)
            tl = self.sl.pipeline_timeline(run)
            if tl.empty:
                continue
            step = run.steps[run.steps["step"] == tl.attrs["step"]].set_index("rank")
            for stage, g in tl.groupby("stage"):
                g = g.sort_values("start_ms")
                self.assertEqual(" ".join(g["name"]), step.loc[stage, "ran"], f"{run.run_id} stage {stage}")
                kinds = "FIW" if cfg["schedule"] == "zb-h1" else "FB"  # ZB-H1 splits each backward: I, then W
                self.assertEqual(dict(g["kind"].value_counts()), {k: m * v for k in kinds}, f"{run.run_id} {stage}")
                self.assertGreaterEqual(g["start_ms"].min(), 0.0)
                self.assertLessEqual(g["end_ms"].max(), tl.attrs["window_ms"][stage] + 1e-6)
            checked += 1
        if checked == 0:
            self.skipTest(f"no lab 06 run with a timeline under {RUNS_ROOT}")


def coords_3d(rank, sizes, order):
    """{"tp": .., "pp": .., "dp": ..} of a rank: the digits of its number, the order's first axis fastest."""
    out = {}
    for axis in order.split("-"):
        out[axis] = rank % sizes[axis]
        rank //= sizes[axis]
    return out


def grid_run(root, run_id, order="tp-pp-dp", per_node=2, groups_of_step=None):
    """A synthetic lab 07 run of tp 2 x pp 2 x dp 1 on 4 ranks (`per_node` a node): rank k's clock is offset by
    1000 * (k + 1) ms; step 1 has a timeline (F0 on [0, 2] ms, a tp all-reduce on [1, 1.5], a 10 ms step span)
    and group_calls (a pp send on [2, 3], a "pp gradients" recv on [4, 6], an embedding all-reduce on [8, 9])."""
    sizes = {"tp": 2, "pp": 2, "dp": 1}
    groups_of_step = groups_of_step or (lambda rank, s: {g: {"wait_ms": 10.0 * s + rank, "modeled_ms": 1.0 * s,
                                                             "calls": 3, "payload_bytes": 64, "busy_ms": 1.0}
                                                         for g in ("tp", "pp", "dp", "embedding")})
    ranks = range(4)
    coords = {r: coords_3d(r, sizes, order) for r in ranks}
    members = lambda r, axis: sorted(q for q in ranks if all(coords[q][a] == coords[r][a]  # noqa: E731
                                                              for a in sizes if a != axis))
    node = lambda r: r // per_node  # noqa: E731
    link = lambda ms: "nvlink/300" if len({node(q) for q in ms}) == 1 else "infiniband/300"  # noqa: E731
    d = os.path.join(root, "lab07", run_id)
    os.makedirs(d)
    for rank in ranks:
        c, t0 = coords[rank], 1000.0 * (rank + 1)
        cfg = {"model": "demo", "tp": 2, "pp": 2, "dp": 1, "order": order, "schedule": "1f1b", "chunks": 1,
               "micro_batches": 1, "micro_batch": 2, "T": 16, "ranks_per_node": per_node, "link": "nvlink",
               "inter_link": "infiniband", "link_slowdown": 300.0, "uniform_compute_ms": 1.0, "bubble_formula": 0.5,
               "tp_link": link(members(rank, "tp")), "pp_link": link(members(rank, "pp")), "dp_link": "nvlink/300",
               "embedding_link": link(members(rank, "pp"))}
        layout = {"tp_rank": c["tp"], "pp_rank": c["pp"], "dp_rank": c["dp"], "tp_group": members(rank, "tp"),
                  "pp_group": members(rank, "pp"), "dp_group": [rank], "embedding_group": members(rank, "pp"),
                  "stage_layers": f"tp {c['tp']}/2 | layers {2 * c['pp']}-{2 * c['pp'] + 1} | "
                                  + ("embedding" if c["pp"] == 0 else "head")}
        with open(os.path.join(d, f"rank{rank}.jsonl"), "w") as f:
            out = lambda rec: f.write(json.dumps(dict(rec, rank=rank)) + "\n")  # noqa: E731
            out({"type": "run", "run_id": run_id, "world_size": 4, "config": cfg, "layout": layout})
            for s in range(3):
                rec = {"type": "step", "step": s, "loss": 3.0, "tokens": 64, "step_ms": 10.0, "bubble": 0.5,
                       "groups": groups_of_step(rank, s)}
                if s == 1:
                    out({"type": "timeline", "step": 1, "compute": [
                        {"name": "F0", "start_ms": t0, "end_ms": t0 + 2}, {"name": "step", "start_ms": t0,
                                                                            "end_ms": t0 + 10}],
                         "events": [{"op": "all_reduce", "tag": "g forward", "group": "tp", "issue_ms": t0 + 1,
                                     "start_ms": t0 + 1, "end_ms": t0 + 1.5, "wait_ms": 0.5, "payload_bytes": 64}]})
                    rec["group_calls"] = [
                        {"group": "pp", "op": "send", "tag": "", "start_ms": t0 + 2, "end_ms": t0 + 3, "wait_ms": 0.1,
                         "payload_bytes": 64},
                        {"group": "pp gradients", "op": "recv", "tag": "", "start_ms": t0 + 4, "end_ms": t0 + 6,
                         "wait_ms": 2.0, "payload_bytes": 64},
                        {"group": "embedding", "op": "all_reduce", "tag": "", "start_ms": t0 + 8, "end_ms": t0 + 9,
                         "wait_ms": 1.0, "payload_bytes": 64}]
                out(rec)
            out({"type": "summary", "tokens_per_s": 640.0, "step_ms": 10.0})
    return d


class Grid3dLogsTest(LogsTestCase):
    def test_grid_is_read_from_every_ranks_run_record(self):
        with tempfile.TemporaryDirectory() as root:
            g = self.sl.grid_3d(self.sl.read_run(grid_run(root, "g", order="pp-tp-dp")))
            self.assertEqual(g["rank"].tolist(), [0, 1, 2, 3])
            self.assertEqual(g["node"].tolist(), [0, 0, 1, 1])
            self.assertEqual(list(zip(g["tp_rank"], g["pp_rank"])), [(0, 0), (0, 1), (1, 0), (1, 1)])  # pp fastest
            self.assertEqual(g["tp_group"].tolist(), [[0, 2], [1, 3], [0, 2], [1, 3]])
            self.assertEqual(g.loc[1, "stage"], "layers 2-3, head")
            self.assertEqual(set(g["tp_link"]), {"infiniband/300"})

    def test_grid_plot_frames_a_tp_group_across_nodes_dashed(self):
        import matplotlib.pyplot as plt
        with tempfile.TemporaryDirectory() as root:
            inside = self.sl.read_run(grid_run(root, "in", order="tp-pp-dp"))
            across = self.sl.read_run(grid_run(root, "across", order="pp-tp-dp"))
            fig = self.sl.plot_grid_3d([inside, across])
            dashed = lambda ax: [p for p in ax.patches if p.get_linestyle() == "--"]  # noqa: E731
            self.assertEqual(len(dashed(fig.axes[0])), 0)  # tp-pp-dp: both tp groups inside a node
            self.assertEqual(len(dashed(fig.axes[2])), 2)  # pp-tp-dp: both across
            plt.close(fig)

    def test_timeline_aligns_ranks_on_their_step_span(self):
        with tempfile.TemporaryDirectory() as root:
            tl = self.sl.timeline_3d(self.sl.read_run(grid_run(root, "t")))
            self.assertEqual(tl.attrs["step"], 1)
            self.assertEqual(tl.attrs["window_ms"], {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0})
            for rank, d in tl.groupby("rank"):  # every rank's clock differs; the frame is its own step span
                got = {(r.lane, r.group): (r.start_ms, r.end_ms) for r in d.itertuples()}
                self.assertEqual(got, {("compute", ""): (0.0, 2.0), ("tp", "tp"): (1.0, 1.5), ("pp", "pp"): (2.0, 3.0),
                                       ("pp", "pp gradients"): (4.0, 6.0), ("embedding", "embedding"): (8.0, 9.0)},
                                 f"rank {rank}")
            fig = self.sl.plot_timeline_3d(self.sl.read_run(grid_run(root, "t2")))
            self.assertIsNotNone(fig)

    def test_group_costs_are_the_median_of_timed_steps_then_the_mean_over_ranks(self):
        with tempfile.TemporaryDirectory() as root:
            df = self.sl.group_costs([self.sl.read_run(grid_run(root, "c"))]).set_index("group")
            # rank k's wait: 10 s + k at steps 1, 2 (step 0 left out): median 15 + k; mean over 4 ranks 16.5
            self.assertAlmostEqual(df.loc["tp", "wait_ms"], 16.5)
            self.assertAlmostEqual(df.loc["dp", "modeled_ms"], 1.5)
            self.assertEqual(df.loc["tp", "link"], "nvlink/300")  # tp-pp-dp, 2 a node: tp {0, 1}, {2, 3} inside,
            self.assertEqual(df.loc["pp", "link"], "infiniband/300")  # pp {0, 2}, {1, 3} across
            fig = self.sl.plot_group_costs(df.reset_index())
            self.assertIsNotNone(fig)

    def test_order_comparison_keeps_the_latest_run_of_each_order_of_one_layout(self):
        with tempfile.TemporaryDirectory() as root:
            made = [grid_run(root, "a-tp", order="tp-pp-dp"), grid_run(root, "b-pp", order="pp-tp-dp"),
                    grid_run(root, "c-tp", order="tp-pp-dp"), grid_run(root, "d-other", order="pp-tp-dp", per_node=4)]
            for age, d in enumerate(made):
                for f in os.listdir(d):
                    os.utime(os.path.join(d, f), (1e9 + age, 1e9 + age))
            runs = self.sl.load_runs(self.sl.latest_lab07_runs(root))
            self.assertEqual([r.run_id for r in runs], ["b-pp", "c-tp", "d-other"])
            self.assertEqual([r.run_id for r in self.sl.order_comparison(runs[:2])], ["b-pp", "c-tp"])
            self.assertEqual([r.run_id for r in self.sl.order_comparison(runs)], ["d-other"])  # 4 a node: another layout

    def test_real_lab07_runs(self):
        if not RUNS_ROOT:
            self.skipTest("no --runs-root given")
        checked = 0
        for d in self.sl.find_runs("lab07", RUNS_ROOT):
            run = self.sl.read_run(d)
            cfg, g = run.config, self.sl.grid_3d(run)
            sizes = {"tp": cfg["tp"], "pp": cfg["pp"], "dp": cfg["dp"]}
            self.assertEqual(len(g), run.world_size, run.run_id)
            self.assertEqual(len(set(zip(g["tp_rank"], g["pp_rank"], g["dp_rank"]))), run.world_size, run.run_id)
            by_rank = g.set_index("rank")
            for row in g.itertuples():
                for axis in ("tp", "pp", "dp"):
                    members = getattr(row, f"{axis}_group")
                    self.assertIn(row.rank, members, f"{run.run_id} rank {row.rank} {axis}")
                    self.assertEqual(len(members), sizes[axis], f"{run.run_id} rank {row.rank} {axis}")
                    for m in members:  # every member lists the same members, and differs only along the axis
                        self.assertEqual(by_rank.loc[m, f"{axis}_group"], members, f"{run.run_id} {axis} {members}")
                        for other in ("tp", "pp", "dp"):
                            if other != axis:
                                self.assertEqual(by_rank.loc[m, f"{other}_rank"], getattr(row, f"{other}_rank"))
                    if cfg.get("ranks_per_node") and sizes[axis] > 1:
                        across = len({by_rank.loc[m, "node"] for m in members}) > 1
                        want = cfg["inter_link"] if across else cfg["link"]
                        self.assertEqual(getattr(row, f"{axis}_link").split("/")[0], want, f"{run.run_id} {axis}")
            tl = self.sl.timeline_3d(run)
            if tl.empty:
                continue
            step = run.steps[run.steps["step"] == tl.attrs["step"]].set_index("rank")
            for rank, mine in tl.groupby("rank"):
                for grp in self.sl.GROUPS_3D:
                    self.assertEqual(int((mine["lane"] == grp).sum()), step.loc[rank, "groups"][grp]["calls"],
                                     f"{run.run_id} rank {rank} {grp}: the timeline's calls are the step's")
                self.assertGreaterEqual(mine["start_ms"].min(), 0.0, f"{run.run_id} rank {rank}")
                self.assertLessEqual(mine["end_ms"].max(), tl.attrs["window_ms"][rank] + 1e-6, f"{run.run_id} {rank}")
            checked += 1
        if checked == 0:
            self.skipTest(f"no lab 07 run with a timeline under {RUNS_ROOT}")


class RollbackLogsTest(LogsTestCase):
    """Lab 08: a run that rolled back at step 7 to step 5 logs steps 0-6, a rollback record, then 5-9 again."""

    def write_spike_run(self, root):
        d = os.path.join(root, "lab08", "spike")
        os.makedirs(d)
        for rank in range(2):
            with open(os.path.join(d, f"rank{rank}.jsonl"), "w") as f:
                f.write(json.dumps({"type": "run", "rank": rank, "run_id": "spike", "world_size": 2,
                                    "config": {"model": "tiny"}}) + "\n")
                for s in list(range(7)) + [None] + list(range(5, 10)):
                    if s is None:
                        f.write(json.dumps({"type": "rollback", "rank": rank, "step": 7, "loss": 9.0, "to_step": 5,
                                            "reason": "rank 0: loss 9.0", "skipped_windows": 2}) + "\n")
                    else:
                        f.write(json.dumps({"type": "step", "rank": rank, "step": s, "loss": 5.0 - 0.1 * s,
                                            "tokens": 64}) + "\n")
                f.write(json.dumps({"type": "summary", "rank": rank}) + "\n")
        return d

    def test_passes_and_undone_steps(self):
        with tempfile.TemporaryDirectory() as root:
            self.write_spike_run(root)
            self.assertEqual(len(self.sl.latest_lab08_spike_runs(root)), 1)
            run = self.sl.read_run(self.sl.latest_lab08_spike_runs(root)[0])
            p = self.sl.rollback_passes(run)
            self.assertEqual(list(p["pass"]), [0] * 7 + [1] * 5)
            undone = p[~p["kept"]]
            self.assertEqual(list(undone["step"]), [5, 6], "the first pass's steps 5 and 6 were run again")
            self.assertEqual(sorted(p[p["kept"]]["step"]), list(range(10)), "every step kept once")
            fig = self.sl.plot_rollback(run)
            self.assertIsNotNone(fig)
            spikes = [ln for ln in fig.axes[0].lines if ln.get_marker() == "x"]
            self.assertEqual(len(spikes), 1, "the spike's loss, from the rollback record, is marked")
            self.assertEqual(list(spikes[0].get_ydata()), [9.0])


class PlanLogsTest(LogsTestCase):
    """Lab 09: bench/plan_validate.py's results and bin/sl_plan --json's ranking, read and drawn."""

    def test_validation_errors_are_predicted_over_measured(self):
        with tempfile.TemporaryDirectory() as root:
            path = os.path.join(root, "results.json")
            rows = [dict(name="a", kind="real", ranks=1, measured_step_ms=100.0, predicted_step_ms=110.0,
                         measured_model_bytes=1000, predicted_bytes=1000),
                    dict(name="b", kind="uniform", ranks=4, measured_step_ms=200.0, predicted_step_ms=190.0,
                         measured_model_bytes=2000, predicted_bytes=2100)]
            with open(path, "w") as f:
                json.dump({"rows": rows, "efficiency": {"1": 0.9}}, f)
            df = self.sl.load_plan_validation(path)
            self.assertEqual(list(df["name"]), ["a", "b"])
            self.assertAlmostEqual(df["time_error"][0], 0.10)
            self.assertAlmostEqual(df["time_error"][1], -0.05)
            self.assertAlmostEqual(df["memory_error"][1], 0.05)
            fig = self.sl.plot_plan_validation(df)
            points = [ln for ln in fig.axes[0].lines if ln.get_marker() in ("o", "s")]
            self.assertEqual(sorted(len(ln.get_xdata()) for ln in points), [1, 1], "one point a layout")
            self.assertTrue(self.sl.load_plan_validation(os.path.join(root, "missing.json")).empty)

    def test_ranking_bars_split_the_step(self):
        row = dict(tp=2, pp=1, dp=4, micro_batch=1, micro_batches=8, zero_stage=1, sequence_parallel=False,
                   recompute="none", memory={"total_bytes": 60e9},
                   time={"step_ms": 100.0, "tokens_per_s": 1000.0, "mfu": 0.4, "bubble_ms": 10.0, "dp_ms": 20.0})
        doc = {"model": "m", "candidates": 3, "rows": [row], "refused": {"needs": 2}}
        df = self.sl.plan_ranking(doc)
        self.assertAlmostEqual(df["bubble"][0], 0.1)
        self.assertAlmostEqual(df["dp_share"][0], 0.2)
        fig = self.sl.plot_plan_ranking(doc, "t")
        widths = [p.get_width() for p in fig.axes[0].patches]
        self.assertEqual([round(w) for w in widths], [700, 100, 200], "compute, bubble, dp shares of 1000 tokens/s")
        self.assertIsNone(self.sl.plot_plan_ranking({"rows": []}, "none"))


def cp_run(root, run_id, cp=2, T=64, overlap=True, act_bytes=None, timeline=True, tp=1):
    """A synthetic lab 10 run of `cp` ranks: rank k's clock is offset by 1000 * (k + 1) ms; step 1's timeline holds
    a "step" span of 10 ms, one block's "attention forward 0" (1-3 ms) and "attention backward 0" (5-8 ms), a
    send and a receive issued in each (the forward's at 1 ms, the backward's at 5 ms, 0.5 ms blocked each) and
    the gradients' all_reduce; act_bytes {rank: memory_activations_peak_bytes of its summary}."""
    d = os.path.join(root, "lab10", run_id)
    os.makedirs(d)
    cfg = {"model": "demo", "tp": tp, "cp": cp, "dp": 1, "T": T, "T_local": T // cp, "zigzag": True, "variant": "ring",
           "overlap": overlap, "link": "pcie", "micro_batch": 2}
    act_bytes = act_bytes or {k: (1 << 20) // cp for k in range(cp)}
    for rank in range(cp):
        t0 = 1000.0 * (rank + 1)
        ev = lambda op, tag, a, e: {"op": op, "tag": tag, "issue_ms": t0 + a, "start_ms": t0 + a,  # noqa: E731
                                    "end_ms": t0 + e, "wait_ms": 0.5}
        with open(os.path.join(d, f"rank{rank}.jsonl"), "w") as f:
            out = lambda rec: f.write(json.dumps(dict(rec, rank=rank)) + "\n")  # noqa: E731
            out({"type": "run", "run_id": run_id, "world_size": cp, "config": cfg})
            for s in range(3):
                if s == 1 and timeline:
                    out({"type": "timeline", "step": 1,
                         "events": [ev("send", "ring kv", 1, 2), ev("recv", "ring kv", 1, 2.5),
                                    ev("send", "ring dkv", 5, 6), ev("recv", "ring dkv", 5, 6.5),
                                    ev("all_reduce", "cp grads", 8, 9)],
                         "compute": [{"name": "attention forward 0", "start_ms": t0 + 1, "end_ms": t0 + 3},
                                     {"name": "attention backward 0", "start_ms": t0 + 5, "end_ms": t0 + 8},
                                     {"name": "step", "start_ms": t0, "end_ms": t0 + 10.0}]})
                out({"type": "step", "step": s, "loss": 3.0, "tokens": 128, "step_ms": 10.0, "mfu": 0.1})
            out({"type": "summary", "tokens_per_s": 12800.0, "memory_activations_peak_bytes": act_bytes[rank]})
    return d


class ContextParallelLogsTest(LogsTestCase):
    def test_timeline_aligns_ranks_and_splits_forward_from_backward(self):
        with tempfile.TemporaryDirectory() as root:
            tl = self.sl.cp_timeline(self.sl.read_run(cp_run(root, "tl")))
            self.assertEqual(tl.attrs["step"], 1)
            self.assertEqual(tl.attrs["window_ms"], {0: 10.0, 1: 10.0})
            self.assertEqual(len(tl), 2 * (2 + 4))  # per rank: two attention calls, four transfers (no all_reduce)
            got = {(r.rank, r.name): (r.lane, r.phase, r.start_ms, r.end_ms) for r in tl.itertuples()}
            self.assertEqual(got[(1, "attention forward 0")], ("attention", "forward", 1.0, 3.0))  # 2001 ms on rank 1
            self.assertEqual(got[(0, "recv ring kv")], ("recv", "forward", 1.0, 2.5))
            self.assertEqual(got[(0, "send ring dkv")], ("send", "backward", 5.0, 6.0))  # issued after the forward
            self.assertAlmostEqual(tl[tl["lane"] != "attention"]["wait_ms"].sum(), 2 * 4 * 0.5)

    def test_timeline_plot_draws_the_lanes_and_every_span(self):
        import matplotlib.pyplot as plt
        with tempfile.TemporaryDirectory() as root:
            fig = self.sl.plot_cp_timeline([self.sl.read_run(cp_run(root, "plot"))])
            self.assertEqual(len(fig.axes[0].patches), 2 * 2 + 2 * 6)  # two lane frames and six boxes per rank
            self.assertIn("transfers blocked 2.000 ms per rank", fig.axes[0].get_title())
            plt.close(fig)
            self.assertIsNone(self.sl.plot_cp_timeline([self.sl.read_run(cp_run(root, "none", timeline=False))]))

    def test_activation_memory_takes_each_runs_largest_rank_and_the_latest_run(self):
        with tempfile.TemporaryDirectory() as root:
            cp_run(root, "a-old", cp=2, T=64, act_bytes={0: 5, 1: 6})
            cp_run(root, "b-new", cp=2, T=64, act_bytes={0: 7, 1: 3})  # the same (cp, T), later: it wins
            cp_run(root, "c", cp=1, T=64, act_bytes={0: 20})
            cp_run(root, "d", cp=1, T=128, act_bytes={0: 40})
            cp_run(root, "e-tp", cp=2, T=64, act_bytes={0: 1, 1: 1}, tp=2)  # tp 2: another layout, left out
            runs = self.sl.load_runs(self.sl.latest_lab10_runs(root))
            mem = self.sl.cp_activation_memory(runs)
            self.assertEqual([(r.cp, r.T, r.act_peak_bytes) for r in mem.itertuples()],
                             [(1, 64, 20), (1, 128, 40), (2, 64, 7)])
            import matplotlib.pyplot as plt
            fig = self.sl.plot_cp_memory(mem)
            self.assertEqual(len(fig.axes[0].lines), 2)  # one line per cp
            plt.close(fig)

    def test_real_lab10_runs(self):
        if not RUNS_ROOT:
            self.skipTest("no --runs-root")
        runs = self.sl.load_runs(self.sl.latest_lab10_runs(RUNS_ROOT))
        timelines = [r for r in runs if not self.sl.cp_timeline(r).empty]
        if not timelines:
            self.skipTest(f"no lab 10 run with a timeline under {RUNS_ROOT}")
        for r in timelines:
            tl = self.sl.cp_timeline(r)
            n_layer, cp = int(r.config["n_layer"]), int(r.config["cp"])
            for rank, window in tl.attrs["window_ms"].items():
                mine = tl[tl["rank"] == rank]
                calls = mine[mine["lane"] == "attention"]
                # one forward and one backward call per block, inside the step's window
                self.assertEqual(sorted(calls["name"]), sorted([f"attention forward {b}" for b in range(n_layer)] +
                                                               [f"attention backward {b}" for b in range(n_layer)]))
                self.assertTrue(((mine["start_ms"] >= 0) & (mine["end_ms"] <= window + 1e-9)).all(), r.run_id)
                sends = mine[mine["lane"] == "send"]
                # the ring: cp - 1 kv hand-overs per forward call; the backward's kv and dkv after the forward's
                self.assertEqual((sends["phase"] == "forward").sum(), n_layer * (cp - 1), r.run_id)
                self.assertGreater((sends["phase"] == "backward").sum(), 0, r.run_id)
        mem = self.sl.cp_activation_memory(runs)
        for T, g in mem.groupby("T"):
            by_cp = g.sort_values("cp")
            self.assertTrue(by_cp["act_peak_bytes"].is_monotonic_decreasing, f"T {T}: {by_cp.to_dict('records')}")


if __name__ == "__main__":
    if "--runs-root" in sys.argv:
        i = sys.argv.index("--runs-root")
        RUNS_ROOT = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (scripts/notebooks.sh makes .venv-notebooks with the notebooks' packages)")
        sys.exit(77)
    unittest.main()
