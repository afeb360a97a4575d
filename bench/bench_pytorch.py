#!/usr/bin/env python3
"""bench_pytorch.py — the same GPT-2 training step in PyTorch, for a side-by-side with lab 01.

Runs bench_lab01 (our reference track) and a PyTorch model of the same shapes, precision and thread
count, and prints tokens/s, MFU and the ratio ours / PyTorch. On a GPU, torch.compile is a second
PyTorch column (on by default there; --no-compile turns it off). Nothing is asserted: these are
measurements.

PyTorch is optional (CI does not need it). Get it in a venv:
    python3 -m venv .venv && .venv/bin/pip install torch numpy
    .venv/bin/python bench/bench_pytorch.py --build-dir build --threads 2
On a GPU (a build with the CUDA backend; scripts/gpu_check.sh runs this):
    python3 bench/bench_pytorch.py --build-dir build-gpu --device cuda --dtype bf16-compute,fp32 \\
        --configs d24:8x1024,d12:16x1024

The PyTorch model mirrors common/src/model/gpt2.cpp: tied LM head, GELU (tanh), LayerNorm eps 1e-5, causal
attention computed with explicit matmuls + softmax, as ours does (F.scaled_dot_product_attention with
--sdpa), AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), gradient clipping at 1.0.
Precision: fp32 is true fp32 on both sides (torch.set_float32_matmul_precision("highest"): no TF32, as
our CUBLAS_COMPUTE_32F). The PyTorch side of both bf16 names is torch.autocast(bfloat16) over fp32
weights: bf16 matmul operands, fp32 accumulation, fp32 layernorm/softmax/loss. Its counterpart is our
bf16-compute (bf16 matmul operands from bf16 parameters, fp32 master weights and optimizer state): the
fair comparison. Our bf16 (= bf16-mixed) only STORES the parameters in bf16 and runs fp32 GEMMs on an fp32
copy; PyTorch has no such mode (the nearest is its fp32 column), so a bf16 row compares our fp32 GEMMs with
PyTorch's bf16 tensor cores and says how much bf16-compute is worth, not how close we are to PyTorch.
MFU uses the kit's convention (labs/01_single_device/README.md "Counting FLOPs") and the peak that
bench_lab01 reports for the same device and precision (CPU: our sgemm calibration, or the bf16 matmul's for
bf16-compute; GPU: the datasheet's dense figure), so every column divides by the same number. Ours runs the
materialized attention (bench_lab01's default) in every mode, --sdpa included.

Order of work, so a run cut short by a time limit keeps the most useful numbers: ours for every
precision, then PyTorch eager for every precision and case, then torch.compile. With --jsonl FILE every
measurement is appended to FILE as one JSON object the moment it exists (scripts/gpu_check.sh reads it).
A failing torch.compile (or an out-of-memory case) is recorded with its error and the run goes on.

On a shared machine one pass of each side is not a fair comparison: a neighbour's load may fall on one side
only. --pairs N measures each case as N alternating pairs (ours, then PyTorch eager, then ours ...) and prints
every pair's ratio and their median: the only ratio the kit quotes (labs/01_single_device/README.md).
    .venv/bin/python bench/bench_pytorch.py --threads 2 --pairs 3 --configs d12:4x256,demo:16x256

A ratio of whole steps mixes two questions: whose GEMM library is faster on this CPU, and whose other work
(attention, layernorm, GELU, the optimizer, copies) is cheaper. --breakdown (CPU, fp32) answers them apart: per
case, each side's step split into the linear layers' GEMMs and everything else, with each side's largest other ops.
    .venv/bin/python bench/bench_pytorch.py --threads 2 --breakdown --configs d12:4x256,demo:16x256
"""
import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time

PRESETS = {  # name: (maxT, V, L, NH, C) as GPTConfig::preset in common/src/model/gpt2_layout.cpp
    "tiny": (16, 64, 2, 2, 16),
    "demo": (256, 256, 4, 4, 192),
    "d12": (1024, 256, 12, 12, 768),
    "d24": (1024, 256, 24, 16, 1024),
}


def flops_per_token(maxT, V, L, NH, C, T):
    """6N + 12LTC, N without wpe (the kit's convention)."""
    n = V * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 12 * L * T * C


def emit(jsonl, record):
    """Prints a one-line progress note and appends the record to --jsonl (if given) at once."""
    if jsonl:
        with open(jsonl, "a") as f:
            f.write(json.dumps(record) + "\n")
    what = f"{record['impl']:13} {record['model']} {record['precision']} {record['B']}x{record['T']}"
    if "error" in record:
        print(f"[bench] {what}: FAILED: {record['error']}", flush=True)
    else:
        extra = f" (compile {record['compile_s']:.0f} s)" if "compile_s" in record else ""
        print(f"[bench] {what}: {record['tokens_per_s']:.0f} tok/s{extra}", flush=True)


def run_ours(build_dir, device, precision, threads, steps, cases, jsonl, breakdown=False):
    """Runs bench_lab01 for one precision; returns its records {(model, B, T): record} (with breakdown=True each
    record holds bench_lab01's per-op "breakdown" too)."""
    exe = os.path.join(build_dir, "bin", "bench_lab01")
    if not os.path.exists(exe):
        sys.exit(f"{exe} not found: build it (cmake --build {build_dir} --target bench_lab01) or pass --build-dir")
    spec = ",".join(f"{m}:{b}x{t}" for m, b, t in cases)
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as tmp:
        path = tmp.name
    try:
        cmd = [exe, "--device", device, "--precision", precision, "--threads", str(threads), "--steps", str(steps),
               "--configs", spec, "--jsonl", path] + (["--breakdown"] if breakdown else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    finally:
        os.unlink(path)
    result = {}
    for r in records:
        emit(jsonl, r)
        result[(r["model"], r["B"], r["T"])] = r
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[0]
        for m, b, t in cases:
            if (m, b, t) not in result:
                emit(jsonl, {"impl": "ours", "device": device, "precision": precision, "model": m, "B": b, "T": t,
                             "error": f"bench_lab01 failed: {err}"})
        print(proc.stdout + proc.stderr, file=sys.stderr)
    return result


def run_torch(model_name, B, T, steps, device, precision, compile_model, sdpa, profile=False):
    """One PyTorch training step, timed: returns (tokens_per_s, seconds of the first (compiling) step), and with
    profile=True a third item: `steps` more steps under torch.profiler, as (wall ms, {op name: self CPU ms}), both
    per step (means)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    maxT, V, L, NH, C = PRESETS[model_name]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            Bx, Tx, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(Bx, Tx, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
                mask = torch.ones(Tx, Tx, dtype=torch.bool, device=x.device).tril()
                att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
                y = att @ v
            x = x + self.c_proj(y.transpose(1, 2).reshape(Bx, Tx, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.h:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    torch.manual_seed(0)
    model = GPT().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    step_fn = torch.compile(model) if compile_model else model
    x = torch.randint(0, V, (B, T), device=device)
    y = torch.randint(0, V, (B, T), device=device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def one_step():
        opt.zero_grad(set_to_none=False)
        if precision in ("bf16", "bf16-compute"):  # autocast: bf16 matmul operands (our bf16-compute)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = step_fn(x, y)
        else:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()

    warmup = 2 if compile_model else 1  # compiling: the 1st step compiles, the 2nd may still specialise
    times = []
    for s in range(steps + warmup):
        sync()
        t0 = time.perf_counter()
        one_step()
        times.append(time.perf_counter() - t0)
    first_s = times[0]
    timed = sorted(times[warmup:])
    if not profile:
        return B * T / timed[len(timed) // 2], first_s
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            one_step()
        wall_ms = 1000 * (time.perf_counter() - t0) / steps
    self_ms = {e.key: e.self_cpu_time_total / 1000 / steps for e in prof.key_averages()}
    return B * T / timed[len(timed) // 2], first_s, (wall_ms, self_ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32",
                    help="fp32, bf16 (= bf16-mixed), bf16-compute, or a comma list (bf16-compute,fp32): ours "
                         "and PyTorch (autocast bf16 for both bf16 names)")
    ap.add_argument("--compile", dest="compile", action="store_true", default=None,
                    help="add a torch.compile column (default: on with --device cuda, off on the CPU)")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--compile-only", action="store_true",
                    help="torch.compile alone (scripts/gpu_check.sh's last, optional phase): ours and eager are already "
                         "in --jsonl, whose ours records give the peak FLOP/s for the MFU column")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--configs", default="demo:8x128,demo:16x256,d12:4x256", help="model:BxT,...")
    ap.add_argument("--sdpa", action="store_true", help="PyTorch attention via scaled_dot_product_attention")
    ap.add_argument("--jsonl", help="append every measurement to this file as one JSON object per line")
    ap.add_argument("--pairs", type=int, default=0,
                    help="N > 0: each case as N alternating pairs ours / PyTorch eager, the first --dtype only; "
                         "prints every pair's ratio and the median (needs PyTorch)")
    ap.add_argument("--breakdown", action="store_true",
                    help="CPU, fp32: where each side's step goes, the linear layers' GEMMs against everything "
                         "else (ours: bench_lab01 --breakdown; PyTorch: --steps steps under torch.profiler; needs "
                         "PyTorch)")
    args = ap.parse_args()
    precisions = [p.strip() for p in args.dtype.split(",") if p.strip()]
    for p in precisions:
        if p not in ("fp32", "bf16", "bf16-compute"):
            ap.error(f"--dtype {p}: use fp32, bf16 (bf16-mixed) or bf16-compute")
    use_compile = args.device == "cuda" if args.compile is None else args.compile
    cases = []
    for item in args.configs.split(","):
        m, bt = item.split(":")
        b, t = bt.split("x")
        if m not in PRESETS:
            ap.error(f"--configs: unknown model '{m}' (known: {', '.join(PRESETS)})")
        cases.append((m, int(b), int(t)))

    if args.breakdown:
        if args.device != "cpu":
            ap.error("--breakdown: CPU only (the profiler's CPU times are not a GPU's kernel times)")
        if precisions[0] != "fp32":
            ap.error(f"--breakdown: fp32 only (--dtype {precisions[0]}: the bf16 ops have other names on both sides)")
        return run_breakdown(args, precisions[0], cases)
    if args.pairs > 0:
        return run_pairs(args, precisions[0], cases)

    # 1. ours, every precision (the numbers this kit is about come first); --compile-only: ours from --jsonl
    ours = {}
    if args.compile_only:
        if not args.jsonl:
            ap.error("--compile-only reads ours' records from --jsonl: give it")
        use_compile = True
        with open(args.jsonl) as f:
            for line in f:
                r = json.loads(line) if line.strip() else {}
                if r.get("impl") == "ours" and "error" not in r:
                    ours[(r["model"], r["B"], r["T"], r["precision"])] = r
    else:
        for p in precisions:
            for key, r in run_ours(args.build_dir, args.device, p, args.threads, args.steps, cases, args.jsonl).items():
                ours[key + (p,)] = r

    try:
        import torch
    except ImportError:
        print_table(args, precisions, cases, ours, {}, {}, None, use_compile)
        sys.exit("PyTorch is not installed: only our column was measured. python3 -m venv .venv && "
                 ".venv/bin/pip install torch numpy, then run this script with .venv/bin/python")
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("highest")  # fp32 means fp32: no TF32 (ours uses CUBLAS_COMPUTE_32F)
    if args.device == "cuda" and not torch.cuda.is_available():
        print_table(args, precisions, cases, ours, {}, {}, torch, use_compile)
        sys.exit("--device cuda: this PyTorch sees no GPU (torch.cuda.is_available() is False)")

    def measure(impl, m, b, t, p, compile_model):
        base = {"impl": impl, "device": args.device, "precision": p, "model": m, "B": b, "T": t,
                "torch": torch.__version__, "sdpa": args.sdpa}
        try:
            tok_s, first_s = run_torch(m, b, t, args.steps, args.device, p, compile_model, args.sdpa)
            rec = dict(base, tokens_per_s=tok_s, flops_per_token=flops_per_token(*PRESETS[m], t))
            if compile_model:
                rec["compile_s"] = first_s
            peak = ours.get((m, b, t, p), {}).get("peak_flops_per_s", 0)
            if peak > 0:
                rec["mfu"] = tok_s * rec["flops_per_token"] / peak
        except Exception as e:  # torch.compile failing, out of memory, ...: record it and go on
            rec = dict(base, error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300])
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
            if compile_model:
                torch._dynamo.reset()  # drop compiled graphs (and any half-made state after a failure)
        emit(args.jsonl, rec)
        return rec

    # 2. PyTorch eager, every precision and case; 3. torch.compile, the same order
    eager, compiled = {}, {}
    for p in precisions:
        for m, b, t in cases:
            if not args.compile_only:
                eager[(m, b, t, p)] = measure("torch_eager", m, b, t, p, False)
    if use_compile:
        for p in precisions:
            for m, b, t in cases:
                compiled[(m, b, t, p)] = measure("torch_compile", m, b, t, p, True)
    print_table(args, precisions, cases, ours, eager, compiled, torch, use_compile)


def torch_for(args, option):
    """PyTorch, set to --threads threads and true fp32 matmuls; exits with the venv hint when it is missing."""
    try:
        import torch
    except ImportError:
        sys.exit(f"{option} needs PyTorch: python3 -m venv .venv && .venv/bin/pip install torch numpy, then run this "
                 "script with .venv/bin/python")
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("highest")
    return torch


def run_pairs(args, precision, cases):
    """--pairs N: per case, N rounds of (ours, PyTorch eager) back to back; each round's ratio, then the median."""
    torch = torch_for(args, "--pairs")
    print(f"{args.device.upper()} ({args.threads} threads), {precision}, PyTorch {torch.__version__} eager; "
          f"{args.pairs} alternating pairs per case, median step of {args.steps} each")
    for m, b, t in cases:
        ratios = []
        for i in range(args.pairs):
            ours = run_ours(args.build_dir, args.device, precision, args.threads, args.steps, [(m, b, t)],
                            args.jsonl).get((m, b, t), {})
            eager_tok_s, _ = run_torch(m, b, t, args.steps, args.device, precision, False, args.sdpa)
            gc.collect()
            emit(args.jsonl, {"impl": "torch_eager", "device": args.device, "precision": precision, "model": m,
                              "B": b, "T": t, "torch": torch.__version__, "pair": i, "tokens_per_s": eager_tok_s})
            if "tokens_per_s" not in ours:
                sys.exit(f"bench_lab01 failed on {m}:{b}x{t}")
            ratios.append(ours["tokens_per_s"] / eager_tok_s)
            print(f"  {m} {b}x{t} pair {i + 1}: ours {ours['tokens_per_s']:.0f} tok/s "
                  f"({1000 * b * t / ours['tokens_per_s']:.0f} ms/step), eager {eager_tok_s:.0f} tok/s "
                  f"({1000 * b * t / eager_tok_s:.0f} ms/step): {ratios[-1]:.2f}x", flush=True)
        print(f"{m} {b}x{t}: ours / eager = {sorted(ratios)[len(ratios) // 2]:.2f}x (median of "
              f"{', '.join(f'{r:.2f}' for r in ratios)})", flush=True)


# The ops that run the linear layers' (and the tied LM head's) GEMMs on each side; everything else is the rest of
# the step: attention (its two batched matmuls included), layernorm, GELU, the loss, the optimizer, copies.
# Ours include the bias add and the dbias sums; PyTorch's addmm includes the bias add, while its dbias is an
# aten::sum, counted in the rest.
OUR_GEMM_OPS = ("matmul_forward", "matmul_backward")  # bench_lab01 --breakdown
TORCH_GEMM_OPS = ("aten::addmm", "aten::mm")            # self CPU time: the BLAS call, not its children


def ours_per_op(record):
    """bench_lab01 --breakdown's record -> {op: ms per step}, each phase's time outside the ops as "other (phase)".
    The values add up to the step (the sum of the phases' means)."""
    ops = {}
    for row in record["breakdown"]:
        name = f"other ({row['phase']})" if row["op"].startswith("other") else row["op"]
        ops[name] = ops.get(name, 0.0) + row["ms_per_step"]
    return ops


def split_step(ops, gemm_ops, step_ms):
    """(GEMM ms, everything else ms, the 6 largest other ops as [(name, ms)]) of a step of step_ms whose ops
    took ops = {name: ms}; gemm_ops names the GEMM ops (OUR_GEMM_OPS, TORCH_GEMM_OPS)."""
    gemm = sum(ops.get(k, 0.0) for k in gemm_ops)
    largest = sorted(((k, v) for k, v in ops.items() if k not in gemm_ops), key=lambda kv: -kv[1])[:6]
    return gemm, step_ms - gemm, largest


def run_breakdown(args, precision, cases):
    """--breakdown: per case, our step and PyTorch eager's split into the linear layers' GEMMs and the rest.

    A ratio of whole steps mixes two things: whose GEMM library is faster on this CPU, and whose other work is
    cheaper. This split shows each. Ours: the means of bench_lab01 --breakdown's timed steps (every op timed),
    their sum the step. PyTorch: as many steps again after its timed ones, under torch.profiler; the means of
    each op's self CPU time and of the wall time, so its "everything else" also holds the profiler's and Python's
    own time (the unprofiled median step is printed beside it). The speed-up column is PyTorch's time / ours, as
    --pairs' ratio (ours / PyTorch in tokens/s): above 1, ours is faster."""
    torch = torch_for(args, "--breakdown")
    print(f"CPU ({args.threads} threads), {precision}, PyTorch {torch.__version__} eager; ms per step. Ours: means "
          f"of {args.steps} timed steps (bench_lab01 --breakdown). PyTorch: means of {args.steps} steps under "
          f"torch.profiler, self CPU time per op. GEMMs = {' + '.join(OUR_GEMM_OPS)} (ours), "
          f"{' + '.join(TORCH_GEMM_OPS)} (PyTorch); speed-up = PyTorch's ms / ours")
    for m, b, t in cases:
        ours = run_ours(args.build_dir, args.device, precision, args.threads, args.steps, [(m, b, t)], args.jsonl,
                        breakdown=True).get((m, b, t), {})
        if "breakdown" not in ours:
            sys.exit(f"bench_lab01 --breakdown failed on {m}:{b}x{t}")
        our_ops = ours_per_op(ours)
        torch_tok_s, _, (torch_step, torch_ops) = run_torch(m, b, t, args.steps, args.device, precision, False,
                                                            args.sdpa, profile=True)
        gc.collect()
        our_step = sum(our_ops.values())
        our_gemm, our_rest, our_largest = split_step(our_ops, OUR_GEMM_OPS, our_step)
        torch_gemm, torch_rest, torch_largest = split_step(torch_ops, TORCH_GEMM_OPS, torch_step)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps({"impl": "breakdown", "device": args.device, "precision": precision, "model": m,
                                    "B": b, "T": t, "torch": torch.__version__, "ours_step_ms": our_step,
                                    "ours_gemm_ms": our_gemm, "torch_step_ms": torch_step,
                                    "torch_gemm_ms": torch_gemm}) + "\n")
        print(f"{m} {b}x{t}:        {'ours':>9} {'share':>6} | {'PyTorch':>9} {'share':>6} | speed-up")
        for label, o, p in (("GEMMs", our_gemm, torch_gemm), ("everything else", our_rest, torch_rest),
                            ("step", our_step, torch_step)):
            print(f"  {label:15} {o:9.1f} {100 * o / our_step:5.1f}% | {p:9.1f} {100 * p / torch_step:5.1f}% | "
                  f"{p / o:.2f}x")
        print(f"  median step: ours {ours['step_ms']:.1f} ms (op timer on), "
              f"PyTorch {1000 * b * t / torch_tok_s:.1f} ms (no profiler)")
        print(f"  ours' largest others:     {', '.join(f'{k} {v:.1f}' for k, v in our_largest)}")
        print(f"  PyTorch's largest others: {', '.join(f'{k} {v:.1f}' for k, v in torch_largest)}", flush=True)


def print_table(args, precisions, cases, ours, eager, compiled, torch, use_compile):
    def cell(rec):
        if not rec:
            return f"{'-':>11} {'-':>6}"
        if "error" in rec:
            return f"{'failed':>11} {'':>6}"
        mfu = f"{100 * rec['mfu']:5.1f}%" if "mfu" in rec else f"{'n/a':>6}"
        return f"{rec['tokens_per_s']:11.0f} {mfu}"

    def ratio(a, b):
        if not a or not b or "error" in a or "error" in b:
            return f"{'-':>10}"
        return f"{a['tokens_per_s'] / b['tokens_per_s']:9.2f}x"

    print()
    any_ours = next(iter(ours.values()), {})
    where = f"{args.threads} threads" if args.device == "cpu" else "GPU"
    tv = f"PyTorch {torch.__version__}" if torch else "PyTorch not installed"
    print(f"{args.device.upper()} ({where}); {tv} eager{' + torch.compile' if use_compile else ''}"
          f"{' (SDPA attention)' if args.sdpa else ''}; MFU against the peak bench_lab01 reports")
    for p in precisions:
        r = next((v for k, v in ours.items() if k[3] == p and "peak_source" in v), any_ours)
        if r.get("peak_source"):
            print(f"  peak {p}: {r.get('peak_flops_per_s', 0) / 1e9:.1f} GFLOP/s ({r['peak_source']})")
    head = f"{'model':6} {'prec':4} {'B':>4} {'T':>5} | {'ours tok/s':>11} {'MFU':>6} | {'eager tok/s':>11} {'MFU':>6} |"
    if use_compile:
        head += f" {'compile tok/s':>13} {'MFU':>6} |"
    head += f" {'ours/eager':>10}"
    if use_compile:
        head += f" {'ours/compile':>12}"
    print(head)
    for p in precisions:
        for m, b, t in cases:
            k = (m, b, t, p)
            o, e, c = ours.get(k), eager.get(k), compiled.get(k)
            line = f"{m:6} {p:4} {b:4d} {t:5d} | {cell(o)} | {cell(e)} |"
            if use_compile:
                line += f"  {cell(c)} |"
            line += f" {ratio(o, e)}"
            if use_compile:
                line += f"   {ratio(o, c)}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
