#!/usr/bin/env python3
"""bench_pytorch.py — the same GPT-2 training step in PyTorch, for a side-by-side with lab 01.

Runs bench_lab01 (our reference track) and a PyTorch eager model of the same shapes, precision and
thread count, and prints tokens/s, MFU and the ratio ours / PyTorch. On a GPU, torch.compile is a
second PyTorch column. Nothing is asserted: these are measurements.

PyTorch is optional (CI does not need it). Get it in a venv:
    python3 -m venv .venv && .venv/bin/pip install torch numpy
    .venv/bin/python bench/bench_pytorch.py --build-dir build --threads 2

The PyTorch model mirrors common/src/gpt2.cpp: tied LM head, GELU (tanh), LayerNorm eps 1e-5, causal
attention computed with explicit matmuls + softmax (F.scaled_dot_product_attention is used with
--sdpa), AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), gradient clipping at 1.0.
MFU uses the kit's convention (labs/01_single_device/README.md "Counting FLOPs") and the calibrated
CPU sgemm peak that bench_lab01 prints, so both columns divide by the same number.
"""
import argparse
import math
import os
import re
import subprocess
import sys
import time

PRESETS = {  # name: (maxT, V, L, NH, C) as GPTConfig::preset in common/src/gpt2.cpp
    "tiny": (16, 64, 2, 2, 16),
    "demo": (256, 256, 4, 4, 192),
    "d12": (1024, 256, 12, 12, 768),
    "d24": (1024, 256, 24, 16, 1024),
}


def flops_per_token(maxT, V, L, NH, C, T):
    """6N + 12LTC, N without wpe (the kit's convention)."""
    n = V * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 12 * L * T * C


def run_ours(build_dir, threads, steps, cases):
    """Runs bench_lab01 and parses its table: {(model, B, T): tokens_per_s}, peak FLOP/s."""
    exe = os.path.join(build_dir, "bin", "bench_lab01")
    spec = ",".join(f"{m}:{b}x{t}" for m, b, t in cases)
    out = subprocess.run([exe, "--threads", str(threads), "--steps", str(steps), "--configs", spec],
                         check=True, capture_output=True, text=True).stdout
    peak = float(re.search(r"peak: ([0-9.]+) GFLOP/s", out).group(1)) * 1e9
    result = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) > 10 and f[0] in PRESETS and f[4] == "|":
            result[(f[0], int(f[1]), int(f[2]))] = float(f[10])
    return result, peak, out


def run_torch(model_name, B, T, steps, device, dtype, compile_model, sdpa):
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
    autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dtype == "bf16" else None
    times = []
    for s in range(steps + 1):  # step 0 is warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        if autocast:
            with autocast:
                loss = step_fn(x, y)
        else:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if s > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    return B * T / times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--configs", default="demo:8x128,demo:16x256,d12:4x256", help="model:BxT,...")
    ap.add_argument("--sdpa", action="store_true", help="PyTorch attention via scaled_dot_product_attention")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("PyTorch is not installed. python3 -m venv .venv && .venv/bin/pip install torch numpy, "
                 "then run this script with .venv/bin/python")
    torch.set_num_threads(args.threads)
    cases = []
    for item in args.configs.split(","):
        m, bt = item.split(":")
        b, t = bt.split("x")
        cases.append((m, int(b), int(t)))

    ours, peak, _ = run_ours(args.build_dir, args.threads, args.steps, cases)
    print(f"CPU, {args.threads} threads, fp32; PyTorch {torch.__version__} eager"
          f"{' (SDPA attention)' if args.sdpa else ''}; peak {peak / 1e9:.1f} GFLOP/s (our calibration)")
    print(f"{'model':6} {'B':>4} {'T':>5} | {'ours tok/s':>10} {'MFU':>6} | {'torch tok/s':>11} {'MFU':>6} | {'ours/torch':>10}")
    for m, b, t in cases:
        fpt = flops_per_token(*PRESETS[m], t)
        tt = run_torch(m, b, t, args.steps, "cpu", "fp32", False, args.sdpa)
        o = ours[(m, b, t)]
        print(f"{m:6} {b:4d} {t:5d} | {o:10.0f} {100 * o * fpt / peak:5.1f}% | {tt:11.0f} {100 * tt * fpt / peak:5.1f}% |"
              f" {o / tt:9.2f}x", flush=True)


if __name__ == "__main__":
    main()
