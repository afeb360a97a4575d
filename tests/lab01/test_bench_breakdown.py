#!/usr/bin/env python3
"""test_bench_breakdown.py — bench/bench_pytorch.py --breakdown's arithmetic, without PyTorch or a run.

The split of a step into the linear layers' GEMMs and everything else is what the comparison with PyTorch
rests on (labs/01_single_device/README.md), so it is checked on a made-up bench_lab01 record: each phase's
time outside the ops stays its own row, the rows add up to the step, and the GEMMs are neither lost nor
counted among the other ops."""
import importlib.util
import os
import sys
import unittest

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree's bench/
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("bench_pytorch", os.path.join(ROOT, "bench", "bench_pytorch.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)  # defines only functions and constants: imports no PyTorch, runs nothing

RECORD = {"breakdown": [  # as bench_lab01 --breakdown --jsonl writes it, ms per step
    {"phase": "forward", "op": "matmul_forward", "calls_per_step": 49, "ms_per_step": 500.0},
    {"phase": "forward", "op": "attention_forward", "calls_per_step": 12, "ms_per_step": 50.0},
    {"phase": "forward", "op": "other (outside the ops)", "calls_per_step": 0, "ms_per_step": 10.0},
    {"phase": "backward", "op": "matmul_backward", "calls_per_step": 49, "ms_per_step": 1000.0},
    {"phase": "backward", "op": "attention_backward", "calls_per_step": 12, "ms_per_step": 80.0},
    {"phase": "backward", "op": "other (outside the ops)", "calls_per_step": 0, "ms_per_step": 20.0},
    {"phase": "optimizer", "op": "adamw_update", "calls_per_step": 148, "ms_per_step": 40.0},
    {"phase": "optimizer", "op": "sum_squares", "calls_per_step": 14, "ms_per_step": 8.0},
    {"phase": "optimizer", "op": "scale_", "calls_per_step": 14, "ms_per_step": 9.0},
    {"phase": "optimizer", "op": "other (outside the ops)", "calls_per_step": 0, "ms_per_step": 1.0},
]}


class BreakdownSplit(unittest.TestCase):
    def test_each_phase_keeps_its_own_other_row_and_the_rows_add_up(self):
        ops = bench.ours_per_op(RECORD)
        self.assertEqual(ops["other (forward)"], 10.0)
        self.assertEqual(ops["other (backward)"], 20.0)
        self.assertEqual(ops["other (optimizer)"], 1.0)
        self.assertAlmostEqual(sum(ops.values()), sum(r["ms_per_step"] for r in RECORD["breakdown"]))

    def test_ours_gemms_and_the_rest(self):
        ops = bench.ours_per_op(RECORD)
        gemm, rest, largest = bench.split_step(ops, bench.OUR_GEMM_OPS, sum(ops.values()))
        self.assertEqual(gemm, 1500.0)
        self.assertEqual(rest, 218.0)
        self.assertEqual(largest[:3], [("attention_backward", 80.0), ("attention_forward", 50.0),
                                       ("adamw_update", 40.0)])
        self.assertEqual(len(largest), 6)
        self.assertTrue(all(name not in bench.OUR_GEMM_OPS for name, _ in largest))

    def test_pytorch_gemms_are_addmm_and_mm_and_the_rest_is_the_wall_time_left(self):
        torch_ops = {"aten::addmm": 900.0, "aten::mm": 1200.0, "aten::bmm": 200.0, "aten::copy_": 80.0,
                     "aten::linear": 0.5}
        gemm, rest, largest = bench.split_step(torch_ops, bench.TORCH_GEMM_OPS, 2600.0)
        self.assertEqual(gemm, 2100.0)
        self.assertEqual(rest, 500.0)  # the wall time outside the GEMMs, profiled ops or not
        self.assertEqual(largest, [("aten::bmm", 200.0), ("aten::copy_", 80.0), ("aten::linear", 0.5)])


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
