#!/usr/bin/env python3
"""test_gpu_check_summary.py — scripts/gpu_check_summary.py (the GPU check's table) on runs that went wrong,
written to a temp dir as gpu_check.sh would leave them: a null value (a NaN written by the logger) in a
lab 01 summary and in a bench record, a line cut short, a failed bench, a phase cut by the budget. The table
must come out every time (no traceback), and the verdict must tell "failed" (FAIL, exit 1) from "cut"
(PARTIAL, exit 4); torch.compile is optional and never makes a run PARTIAL.

  python3 tests/lint/test_gpu_check_summary.py        (registered as ctest lint.gpu_check_summary_selftest)
  SUMMARY=/path/to/other_summary.py python3 ...        the same cases against another copy of the script
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY = os.environ.get("SUMMARY", os.path.join(ROOT, "scripts", "gpu_check_summary.py"))
CONFIGS = "d24:8x1024,d12:16x1024"


def ours(model, prec, B, T, tok_s, mfu=0.4):
    return {"impl": "ours", "model": model, "precision": prec, "B": B, "T": T, "tokens_per_s": tok_s, "mfu": mfu,
            "peak_flops_per_s": 989e12, "peak_source": "datasheet: NVIDIA H200 SXM dense bf16"}


def torch_rec(impl, model, prec, B, T, tok_s):
    return {"impl": impl, "model": model, "precision": prec, "B": B, "T": T, "tokens_per_s": tok_s, "mfu": 0.3,
            "torch": "2.11.0"}


def lab01_summary(model, prec, B, T, v0=5.5, v1=4.0):
    return {"type": "summary", "model": model, "precision": prec, "B": B, "T": T, "val_loss_start": v0,
            "val_loss_end": v1, "final_loss": v1, "tokens_per_s": 1e5, "mfu": 0.3, "memory_peak_bytes": 2 ** 30}


def lab04_summary(rank=0, v1=4.1):
    s = {"type": "summary", "ranks": 1, "backend": "local", "micro_batch": 16, "rank": rank, "val_loss_start": 5.5,
         "val_loss_end": v1, "tokens_per_s": 9e4, "mfu": 0.25, "memory_estimated_peak_bytes": 2 ** 30}
    for c in ("params", "grads", "optimizer_state", "activations"):
        s[f"memory_{c}_peak_bytes"] = 2 ** 28
    return s


def write_jsonl(path, records, tail=""):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")  # json.dumps writes None as null: what a NaN becomes in the logs
        f.write(tail)


def all_bench(compile_too):
    recs = []
    for prec in ("bf16-compute", "fp32"):
        for model, B, T in (("d24", 8, 1024), ("d12", 16, 1024)):
            recs.append(ours(model, prec, B, T, 2e5))
            recs.append(torch_rec("torch_eager", model, prec, B, T, 1e5))
            if compile_too:
                recs.append(torch_rec("torch_compile", model, prec, B, T, 2.5e5))
    return recs


class Summary(unittest.TestCase):
    def run_summary(self, *, gpu=True, rehearse=False, bench_status="ok", compile_status="ok", skipped="",
                    lab01=None, lab04=None, bench=None, bench_tail="", bench_cut_line=""):
        out = tempfile.mkdtemp(prefix="gpu_check_summary_")
        docs = os.path.join(out, "gpu_runs.md")
        with open(docs, "w") as f:
            f.write("| date | GPU | driver | CUDA | result | numbers |\n|---|---|---|---|---|---|\n")
        lab01 = lab01 if lab01 is not None else [lab01_summary("d12", "bf16-compute", 16, 1024),
                                                  lab01_summary("d24", "bf16-compute", 8, 1024)]
        write_jsonl(os.path.join(out, "lab01.jsonl"), lab01)
        write_jsonl(os.path.join(out, "lab04.jsonl"), lab04 if lab04 is not None else [lab04_summary()])
        write_jsonl(os.path.join(out, "bench.jsonl"), bench if bench is not None else all_bench(True), bench_cut_line)
        env = dict(os.environ, SLG_GPU_NAME="NVIDIA H200" if gpu else "", SLG_GPU_CC="9.0", SLG_ARCH="90",
                   SLG_DRIVER="580", SLG_DRIVER_CUDA="13.0", SLG_NVCC_CUDA="13.0", SLG_GIT_SHA="abc1234",
                   SLG_ELAPSED="300", SLG_BUDGET="330", SLG_BUILD_OK="1", SLG_BUILD_STATUS="ok", SLG_BUILD_ONLY="0",
                   SLG_TESTS_STATUS="ok", SLG_TESTS_TOTAL="40", SLG_TESTS_PASSED="40" if gpu else "0",
                   SLG_TESTS_FAILED="0", SLG_TESTS_SKIPPED="0" if gpu else "40", SLG_SYNC_RERUN="",
                   SLG_BENCH_STATUS=bench_status, SLG_COMPILE_STATUS=compile_status, SLG_PY="python3",
                   SLG_FLASH_RC="0", SLG_OUT=out, SLG_WORK=out, SLG_DOCS=docs, SLG_REHEARSE="1" if rehearse else "0",
                   SLG_BENCH_CONFIGS=CONFIGS, SLG_BENCH_TAIL=bench_tail, SLG_COMPILE_TAIL="",
                   SLG_LAB01="\n".join(f"{r['model']} {r['precision']} {r['B']} {r['T']} 0 id" for r in lab01),
                   SLG_SKIPPED=skipped, SLG_LAB04="1 local 16 0 id", SLG_NOTES="",
                   SLG_LAB04_CASE="d12 bf16 16 1024 bf16-compute")
        p = subprocess.run([sys.executable, SUMMARY], env=env, capture_output=True, text=True, timeout=60)
        self.assertNotIn("Traceback", p.stderr + p.stdout, p.stderr)
        with open(os.path.join(out, "summary.txt")) as f:
            table = f.read()
        return p.returncode, table

    def test_everything_measured_passes_and_writes_the_row(self):
        rc, table = self.run_summary()
        self.assertEqual(rc, 0, table)
        self.assertIn("== scalelab GPU check: PASS ==", table)

    def test_a_null_value_and_a_failed_bench_still_give_the_table_and_fail(self):
        lab01 = [lab01_summary("d12", "bf16-compute", 16, 1024, v1=None), lab01_summary("d24", "bf16-compute", 8, 1024)]
        bench = [ours("d24", "bf16-compute", 8, 1024, None, mfu=None), ours("d12", "bf16-compute", 16, 1024, 2e5)]
        rc, table = self.run_summary(lab01=lab01, bench=bench, bench_status="failed", compile_status="not_run",
                                     bench_tail="RuntimeError: CUDA error: an illegal memory access")
        self.assertEqual(rc, 1, table)
        self.assertIn("== scalelab GPU check: FAIL ==", table)
        self.assertIn("problem  the bench (ours vs PyTorch eager) failed: RuntimeError: CUDA error", table)
        self.assertIn("d12 bf16-compute BAD 5.50->null", table)  # the null value, printed as such
        self.assertNotIn("budget cut", table)  # a failure is not reported as a cut

    def test_a_cut_bench_is_partial_not_failed(self):
        bench = [r for r in all_bench(False) if not (r["impl"] == "torch_eager" and r["precision"] == "fp32")]
        rc, table = self.run_summary(bench=bench, bench_status="cut", compile_status="not_run",
                                     skipped="bench (cut by its 150 s timeout)")
        self.assertEqual(rc, 4, table)
        self.assertIn("PARTIAL (nothing failed; the budget cut", table)
        self.assertIn("skipped  not measured (the budget): eager d24 fp32, eager d12 fp32", table)
        self.assertNotIn("problem", table)

    def test_torch_compile_is_optional(self):
        rc, table = self.run_summary(bench=all_bench(False), compile_status="cut",
                                     skipped="bench_compile (cut by its 40 s timeout)")
        self.assertEqual(rc, 0, table)
        self.assertIn("PASS", table)
        self.assertIn("[optional]", table)

    def test_a_line_cut_short_and_null_values_in_a_rehearsal(self):
        bench = all_bench(False)
        bench[1]["tokens_per_s"] = None  # an eager rate that was NaN
        rc, table = self.run_summary(gpu=False, rehearse=True, bench=bench, compile_status="no_torch",
                                     lab04=[lab04_summary(v1=None)], bench_cut_line='{"impl": "torch_eager", "mod')
        self.assertEqual(rc, 1, table)  # lab 04's validation loss is null: it did not fall
        self.assertIn("== scalelab GPU check: FAIL ==", table)
        self.assertIn("BAD 5.50->null", table)
        self.assertIn("null", [w for line in table.splitlines() if line.startswith("d24") for w in line.split()])

if __name__ == "__main__":
    unittest.main()
