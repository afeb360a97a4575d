#!/usr/bin/env python3
"""test_scalelab_logs.py — the notebooks' memory plots stack what the allocator holds, nothing more.

  .venv-notebooks/bin/python notebooks/test_scalelab_logs.py [--runs-root DIR]

A stacked memory bar (plot_memory: one bar per rank; plot_memory_by_world_size: one bar per run) must
be exactly memory_current_bytes of the step it shows: the sum of the allocator's categories. Before
the fix, memory_reserved_bytes (what the caching allocator holds from the system, docs/log_schema.md)
was stacked as one more category, and every bar showed about twice the memory held. Checked on
synthetic records shaped like a CUDA run's (reserved > current) and, with --runs-root, on every run
found there (scripts/notebooks.sh --make-logs passes its fresh runs). Needs pandas and matplotlib:
scripts/notebooks.sh runs it in .venv-notebooks; the ctest notebooks.memory_stack skips without them.
"""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RUNS_ROOT = None  # --runs-root


def step(rank, step_no, cats, reserved):
    rec = {"type": "step", "rank": rank, "step": step_no, "loss": 3.0, "tokens": 1024, "step_ms": 10.0,
           "mfu": 0.4, "memory_peak_bytes": sum(cats.values()) + 4096,
           "memory_current_bytes": sum(cats.values()), "memory_reserved_bytes": reserved,
           "memory_reserved_peak_bytes": reserved + 8192}
    for name, value in cats.items():
        rec[f"memory_{name}_bytes"] = value
        rec[f"memory_{name}_peak_bytes"] = value + 512
    return rec


class MemoryStackTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import matplotlib
        matplotlib.use("Agg")
        import scalelab_logs  # noqa: E402  the module under test
        cls.sl = scalelab_logs

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
        for lab in ("lab01", "lab03", "lab04"):
            for d in self.sl.find_runs(lab, RUNS_ROOT):
                run = self.sl.read_run(d)
                if run.steps.empty or "memory_current_bytes" not in run.steps.columns:
                    continue
                self.assert_bars_are_current(run)
                checked += 1
        if checked == 0:
            self.skipTest(f"no run with memory records under {RUNS_ROOT}")


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
