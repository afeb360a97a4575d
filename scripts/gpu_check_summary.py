#!/usr/bin/env python3
"""gpu_check_summary.py — the table of scripts/gpu_check.sh (its phase 6), and the row for docs/gpu_runs.md.

gpu_check.sh runs it with the phases' results in SLG_* environment variables and their files in SLG_OUT
(lab01.jsonl, lab04.jsonl, bench.jsonl, flash.jsonl). Every value read from those files may be null (a NaN
or an infinity is written as null) or absent (a run that crashed): the table prints "null" or "-" for it
and still comes out, since the run that most needs its table is the one that went wrong.
Verdict: FAIL (something failed: the lines "problem" say what), PARTIAL (nothing failed; the budget cut
what the lines "skipped" name), PASS; optional phases left out are "skipped ... [optional]".
Exit status as gpu_check.sh's: 0 passed, 1 failed, 3 no GPU, 4 cut by the budget.
Tested by tests/lint/test_gpu_check_summary.py (null values, a failed bench, a cut phase).
"""
import datetime, json, math, os, sys

E = os.environ
out, work = E["SLG_OUT"], E["SLG_WORK"]
has_gpu = bool(E["SLG_GPU_NAME"])
build_only = E["SLG_BUILD_ONLY"] == "1"
rehearse = E["SLG_REHEARSE"] == "1"
problems, notes = [], []
# phases the budget skipped or cut; the bench phases are judged by what they measured (below), not by their cut
cut = [s for s in E.get("SLG_SKIPPED", "").splitlines()
       if s.strip() and not s.startswith(("bench ", "bench_compile "))]

def is_num(v):  # a finite number (not None, not a bool, not NaN)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

def fmt(v, spec, width=0):  # v formatted with spec; "null" where the file had no number
    return f"{v:{width}{spec}}" if is_num(v) else f"{'null' if v is None else str(v):>{width}}"

def load(path):
    records = []  # a line cut short (a phase killed mid-write) is skipped, not fatal
    try:
        with open(path) as f:
            for l in f:
                try:
                    r = json.loads(l) if l.strip() else None
                except ValueError:
                    r = None
                if isinstance(r, dict):
                    records.append(r)
    except OSError:
        pass
    return records

# ---- verdict pieces --------------------------------------------------------------------------
if E["SLG_BUILD_STATUS"] == "failed":
    problems.append("configure/build failed (see gpu_check.log)")
tot, passed = int(E["SLG_TESTS_TOTAL"]), int(E["SLG_TESTS_PASSED"])
failed, skipped = int(E["SLG_TESTS_FAILED"]), int(E["SLG_TESTS_SKIPPED"])
tests = f"ctest -L gpu: {passed} passed, {failed} failed, {skipped} skipped"
if E["SLG_SYNC_RERUN"]:
    tests += f" ({E['SLG_SYNC_RERUN']})"
if E["SLG_BUILD_OK"] == "1":
    if E["SLG_TESTS_STATUS"] == "cut":
        tests += " (cut by the budget)"
    elif tot == 0:
        problems.append("ctest -L gpu ran no test")
    elif failed:
        problems.append(f"{failed} GPU test(s) failed")
    elif has_gpu and skipped:
        problems.append(f"{skipped} GPU test(s) skipped on a machine with a GPU")

lab01_cells = []
summaries = {(r["model"], r["precision"]): r for r in load(os.path.join(out, "lab01.jsonl"))}
for line in E.get("SLG_LAB01", "").splitlines():
    if not line.strip():
        continue
    model, prec, B, T, rc, run_id = line.split()
    s = summaries.get((model, prec))
    if rc in ("124", "125"):
        lab01_cells.append(f"{model} {prec} cut")
    elif rc != "0" or not s:
        lab01_cells.append(f"{model} {prec} FAILED")
        problems.append(f"lab01 {model} {prec} exited {rc}")
    else:
        v0, v1 = s.get("val_loss_start"), s.get("val_loss_end")
        ok = all(is_num(v) for v in (v0, v1, s.get("final_loss"))) and v1 < v0
        lab01_cells.append(f"{model} {prec} {'ok' if ok else 'BAD'} {fmt(v0, '.2f')}->{fmt(v1, '.2f')}")
        if not ok:
            problems.append(f"lab01 {model} {prec}: validation loss did not fall ({v0} -> {v1})")

# Lab 04 on lab 01's d12 bf16 case (ZeRO-3): every rank's summary, keyed by (ranks, rank).
l4_model, l4_prec, l4_B, l4_T, l1_prec = (E.get("SLG_LAB04_CASE", "").split() + ["?"] * 5)[:5]
l4_summaries = {(r["ranks"], r.get("rank", 0)): r for r in load(os.path.join(out, "lab04.jsonl"))}
lab04_runs = []  # (ranks, backend, micro-batch, status, [summary of each rank or None])
for line in E.get("SLG_LAB04", "").splitlines():
    if not line.strip():
        continue
    n, backend, mb, rc, run_id = line.split()
    n = int(n)
    per_rank = [l4_summaries.get((n, k)) for k in range(n)]
    what = f"lab04 {l4_model} {l4_prec} ZeRO-3 on {n} rank{'s' if n > 1 else ''} ({backend})"
    if rc in ("124", "125"):
        status = "cut"
    elif rc != "0" or not all(per_rank):
        status = "FAILED"
        problems.append(f"{what} exited {rc}" + (", with no summary on some rank" if rc == "0" else ""))
    else:
        v0, v1 = per_rank[0].get("val_loss_start"), per_rank[0].get("val_loss_end")
        ok = all(is_num(v) for v in (v0, v1)) and v1 < v0
        status = f"ok {fmt(v0, '.2f')}->{fmt(v1, '.2f')}" if ok else f"BAD {fmt(v0, '.2f')}->{fmt(v1, '.2f')}"
        if not ok:
            problems.append(f"{what}: validation loss did not fall ({v0} -> {v1})")
    lab04_runs.append((n, backend, int(mb), status, per_rank))

bench = load(os.path.join(out, "bench.jsonl"))
rows = {}
torch_version = ""
for r in bench:
    key = (r["model"], r["precision"], r["B"], r["T"])
    rows.setdefault(key, {})[r["impl"]] = r
    torch_version = r.get("torch", torch_version)
    if r["impl"] == "ours" and "error" in r:
        problems.append(f"bench_lab01 {r['model']} {r['precision']}: {r['error']}")
if E.get("SLG_FLASH_RC", "") not in ("", "0", "124", "125"):  # 124/125: cut by the budget (listed as skipped)
    problems.append(f"bench_lab01 --attention flash exited {E['SLG_FLASH_RC']} (see bench_flash in gpu_check.log)")
want = []  # (model, precision, B, T) in the bench's order
for p in ("bf16-compute", "fp32"):
    for item in E["SLG_BENCH_CONFIGS"].split(","):
        m, bt = item.split(":")
        want.append((m, p, int(bt.split("x")[0]), int(bt.split("x")[1])))
# The bench (ours and PyTorch eager: a main phase) and torch.compile (optional, last). "cut" is the budget;
# "failed" is a failure and makes the verdict FAIL; "no_torch": the interpreter has no PyTorch.
bench_status, compile_status = E["SLG_BENCH_STATUS"], E.get("SLG_COMPILE_STATUS", "not_run")
if bench_status == "failed":
    problems.append("the bench (ours vs PyTorch eager) failed: " + (E.get("SLG_BENCH_TAIL", "") or "see gpu_check.log"))
if compile_status == "failed":
    notes.append("torch.compile (the bench's compile phase failed: " + (E.get("SLG_COMPILE_TAIL", "") or "see gpu_check.log") + ")")
if (has_gpu or rehearse) and not build_only and bench_status != "not_run":
    why = {"cut": "the budget", "failed": "the bench failed", "no_torch": f"no PyTorch in {E.get('SLG_PY', 'python3')}"}
    missing, optional = {}, []
    for key in want:
        for impl in ("ours", "torch_eager", "torch_compile"):
            if impl in rows.get(key, {}):
                continue
            what = f"{impl.replace('torch_', '')} {key[0]} {key[1]}"
            if impl == "torch_compile":  # optional: never makes the run PARTIAL or FAIL
                optional.append(what)
            else:
                missing.setdefault(why.get(bench_status, bench_status), []).append(what)
    for reason, items in missing.items():
        line = f"not measured ({reason}): " + ", ".join(items)
        if bench_status == "cut" or (bench_status == "no_torch" and has_gpu):
            cut.append(line)
        elif bench_status == "failed":
            problems.append(line)
        else:
            notes.append(line)
    if optional:
        cwhy = {"cut": "the budget", "failed": "it failed", "not_run": "not run: --no-compile, or the budget",
                "no_torch": why["no_torch"]}.get(compile_status, compile_status)
        notes.append(f"not measured ({cwhy}): " + ", ".join(optional))

# ---- the table -------------------------------------------------------------------------------
if problems:
    verdict = "FAIL"
elif rehearse:
    verdict = "REHEARSAL ON THE CPU (no GPU; toy sizes; the numbers mean nothing)"
elif not has_gpu:
    verdict = "NO GPU (build rehearsal only)"
elif build_only:
    verdict = "BUILD + TESTS ONLY"
elif cut:
    verdict = "PARTIAL (nothing failed; the budget cut what 'skipped' lists)"
else:
    verdict = "PASS"
now = datetime.datetime.now(datetime.timezone.utc)
arch = E["SLG_ARCH"]
lines = [f"== scalelab GPU check: {verdict} ==  {now:%Y-%m-%d %H:%M} UTC | git {E['SLG_GIT_SHA']} | "
         f"{E['SLG_ELAPSED']} s of a {E['SLG_BUDGET']} s budget"]
gpu = (f"{E['SLG_GPU_NAME']} (cc {E['SLG_GPU_CC'] or '?'}) | driver {E['SLG_DRIVER'] or '?'} "
       f"(CUDA {E['SLG_DRIVER_CUDA'] or '?'})") if has_gpu else "none visible"
lines.append(f"GPU      {gpu} | nvcc {E['SLG_NVCC_CUDA'] or '?'}, built for sm {arch}"
             + (f" | torch {torch_version}" if torch_version else ""))
lines.append(f"tests    {tests}")
if lab01_cells:
    lines.append("lab01    " + " | ".join(lab01_cells) + "  (val loss, 8 steps)")

def cell(r, w):
    if not r:
        return f"{'-':>{w}} {'-':>6}"
    if "error" in r:
        return f"{'failed':>{w}} {'':>6}"
    mfu = f"{fmt(100 * r['mfu'] if is_num(r.get('mfu')) else r.get('mfu'), '.1f', 5)}%" if "mfu" in r else f"{'n/a':>6}"
    return f"{fmt(r.get('tokens_per_s'), '.0f', w)} {mfu}"

def ratio(a, b):
    if not a or not b or not is_num(a.get("tokens_per_s")) or not is_num(b.get("tokens_per_s")) or b["tokens_per_s"] <= 0:
        return "-"
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x"

if rows:
    short = {"bf16-compute": "bf16c", "bf16-mixed": "bf16m"}  # the prec column: bf16c = bf16-compute
    lines.append(f"{'model':5} {'prec':5} {'B':>3} {'T':>5} | {'ours tok/s':>10} {'MFU':>6} | {'eager tok/s':>11} {'MFU':>6} |"
                 f" {'compile tok/s':>13} {'MFU':>6} | {'ours/eager':>10} {'ours/compile':>12}")
    for key in want + sorted(k for k in rows if k not in want):
        if key not in rows:
            continue
        r = rows[key]
        o, e, c = r.get("ours"), r.get("torch_eager"), r.get("torch_compile")
        lines.append(f"{key[0]:5} {short.get(key[1], key[1]):5} {key[2]:3d} {key[3]:5d} | {cell(o, 10)} | {cell(e, 11)} | {cell(c, 13)} |"
                     f" {ratio(o, e):>10} {ratio(o, c):>12}")
    peaks = {}  # the peak bench_lab01 divided by, per precision: "989 TFLOP/s (datasheet: NVIDIA H200 SXM dense bf16)"
    for r in bench:
        if r["impl"] == "ours" and r.get("peak_source"):
            f = r.get("peak_flops_per_s")
            if not is_num(f):
                continue
            v = f"{f / 1e12:.0f} TFLOP/s" if f >= 1e12 else f"{f / 1e9:.0f} GFLOP/s"
            peaks[r["precision"]] = f"{r['precision']} {v} ({r['peak_source'].split(';')[0]})"
    if peaks:
        lines.append("MFU of " + ", ".join(peaks[p] for p in sorted(peaks)) + "; ours/x > 1: ours is faster")
    for r in load(os.path.join(out, "flash.jsonl")):  # bench_flash: ours with --attention flash
        key = (r["model"], r["precision"], r["B"], r["T"])
        mat = rows.get(key, {}).get("ours")
        lines.append(f"{key[0]:5} {short.get(key[1], key[1]):5} {key[2]:3d} {key[3]:5d} | {cell(r, 10)} | flash attention;"
                     f" flash/materialized {ratio(r, mat)}")
    errs = [f"{r['impl']} {r['model']} {r['precision']}: {r['error']}" for r in bench if "error" in r]
    for e in errs:
        lines.append(f"error    {e}")

def mib(b):
    if not is_num(b):
        return "-"
    x = b / 1048576
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"

def measured_peak(s):  # what the estimator bounds: the four categories' peaks, summed
    parts = [s.get(f"memory_{c}_peak_bytes") for c in ("params", "grads", "optimizer_state", "activations")]
    return sum(parts) if all(is_num(p) for p in parts) else None

def device_mfu(s, ranks):
    # lab 04's `mfu` divides by world_size times each rank's peak; on the GPU that peak is the rank's share
    # of the one GPU the ranks share (driver.h shared_gpu_peak), so it is that GPU's MFU as logged; on the
    # CPU (rehearsal) each rank's peak is calibrated on its share of the cores: as logged too.
    m = s.get("mfu") if s else None
    return m if is_num(m) else None

if lab04_runs:
    lines.append(f"lab04 next to lab01: {l4_model}, lab04 {l4_prec} (bf16-mixed), lab01 {l1_prec}, global batch B={l4_B}, T={l4_T}, 8 steps, lab04 ZeRO-3,"
                 + (" on the same GPU" if has_gpu else " on the CPU"))
    lines.append(f"{'run':30} {'status':14} | {'tok/s':>9} {'MFU':>6} | {'rank':>4} {'peak MiB':>9} {'all MiB':>8} "
                 f"{'est. MiB':>8}")
    def l4_line(name, status, s0, mfu, k, s):
        rate = fmt(s0.get("tokens_per_s"), ".0f", 9) if s0 else f"{'-':>9}"
        m = f"{100 * mfu:5.1f}%" if is_num(mfu) else f"{'n/a' if s0 else '-':>6}"
        if k > 0:  # the run's numbers are on rank 0's line
            name, status, rate, m = "", "", f"{'':>9}", f"{'':>6}"
        peak = mib(measured_peak(s)) if s else "-"
        return (f"{name:30} {status:14} | {rate} {m} | {k:4d} {peak:>9} {mib(s.get('memory_peak_bytes') if s else None):>8} "
                f"{mib(s.get('memory_estimated_peak_bytes') if s else None):>8}")
    s1 = summaries.get((l4_model, l1_prec))
    st1 = next((c[len(f"{l4_model} {l1_prec} "):] for c in lab01_cells if c.startswith(f"{l4_model} {l1_prec} ")),
               "not run")
    lines.append(l4_line("lab01 1 device", st1, s1, s1.get("mfu") if s1 else None, 0, s1))
    for n, backend, mb, status, per_rank in lab04_runs:
        name = f"lab04 {n} rank{'s' if n > 1 else ''} ({backend}" + (f", B {mb}/rank)" if n > 1 else ")")
        for k, s in enumerate(per_rank):
            lines.append(l4_line(name, status, per_rank[0], device_mfu(per_rank[0], n), k, s))
    lines.append("peak: sum of memory_{params,grads,optimizer_state,activations}_peak_bytes (what the estimator bounds); "
                 "all: the allocator's peak (memory_peak_bytes: + data, comm, workspace); est.: "
                 "memory_estimated_peak_bytes; MFU of " + ("the one GPU the ranks share" if has_gpu else
                 "the CPU (each rank's peak on its share of the cores)"))
    notes.extend(s for s in E.get("SLG_NOTES", "").splitlines() if s.strip())
for p in problems:
    lines.append(f"problem  {p}")
for s in cut:
    lines.append(f"skipped  {s}")
for s in notes:
    lines.append(f"skipped  {s} [optional]")
table = "\n".join(lines)
print("\n" + table)
with open(os.path.join(out, "summary.txt"), "w") as f:
    f.write(table + "\n")

# ---- the row for docs/gpu_runs.md: only runs that used a GPU count ----------------------------
if has_gpu and not build_only and not rehearse:
    nums = []
    for key in want:
        r = rows.get(key, {})
        o = r.get("ours")
        if not o or "error" in o or not is_num(o.get("tokens_per_s")):
            continue
        s = f"{key[0]} {key[1]} {key[2]}x{key[3]}: {o['tokens_per_s'] / 1e3:.1f}k tok/s"
        if is_num(o.get("mfu")):
            s += f", MFU {100 * o['mfu']:.1f}%"
        for impl, name in (("torch_eager", "eager"), ("torch_compile", "compile")):
            x = ratio(o, r.get(impl))
            if x != "-":
                s += f", {x} {name}"
        nums.append(s)
    for r in load(os.path.join(out, "flash.jsonl")):
        if "error" not in r and is_num(r.get("tokens_per_s")):
            mat = rows.get((r["model"], r["precision"], r["B"], r["T"]), {}).get("ours")
            nums.append(f"{r['model']} {r['precision']} {r['B']}x{r['T']} flash attention: "
                        f"{r['tokens_per_s'] / 1e3:.1f}k tok/s, {ratio(r, mat)} materialized")
    for n, backend, mb, status, per_rank in lab04_runs:
        s0 = per_rank[0]
        if not status.startswith("ok") or not is_num(s0.get("tokens_per_s")):
            continue
        s = f"lab04 ZeRO-3 {l4_model} {l4_prec} {n} rank{'s' if n > 1 else ''}: {s0['tokens_per_s'] / 1e3:.1f}k tok/s"
        m = device_mfu(s0, n)
        if m is not None:
            s += f", MFU {100 * m:.1f}%"
        s += f", peak {'/'.join(mib(measured_peak(r)) for r in per_rank)} MiB per rank (est. " \
             f"{mib(s0.get('memory_estimated_peak_bytes'))})"
        nums.append(s)
    result = f"{verdict.split(' ')[0]}: {passed}/{tot} GPU tests" + (f", {failed} failed" if failed else "") + \
             (f", {skipped} skipped" if skipped else "") + \
             f"; lab01 {sum(1 for c in lab01_cells if ' ok ' in c)}/{len(lab01_cells)} ok" + \
             (f"; lab04 {sum(1 for r in lab04_runs if r[3].startswith('ok'))}/{len(lab04_runs)} ok" if lab04_runs else "") + \
             f"; git {E['SLG_GIT_SHA']}"
    row = (f"| {now:%Y-%m-%d} | {E['SLG_GPU_NAME']} (sm {arch}) | {E['SLG_DRIVER']} | "
           f"{E['SLG_NVCC_CUDA']} (driver {E['SLG_DRIVER_CUDA']}) | {result} | {'; '.join(nums) or '-'} |")
    with open(os.path.join(out, "gpu_runs_row.md"), "w") as f:
        f.write(row + "\n")
    docs = E["SLG_DOCS"]
    try:
        text = open(docs).read() if os.path.exists(docs) else ""
        text = "\n".join(l for l in text.splitlines() if not l.startswith("no verified run yet")) + "\n"
        with open(docs, "w") as f:
            f.write(text + row + "\n")
        print(f"\nrow appended to {docs} (and in {out}/gpu_runs_row.md: copy it into your checkout's "
              "docs/gpu_runs.md if this tree is a copy)")
    except OSError as e:
        print(f"\ncould not append to {docs}: {e}; the row is in {out}/gpu_runs_row.md")

code = 1 if problems else 3 if not has_gpu else 0 if build_only else 4 if cut else 0
sys.exit(code)
