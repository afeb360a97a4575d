#!/usr/bin/env python3
"""bench/plan_published.py — lab 09's model against published tables: ZeRO's memory per device, Megatron-LM's
throughput per GPU, and Korthikanti et al.'s iteration times with full and with selective recompute.

  python3 bench/plan_published.py [--build-dir build] [--efficiency 0.8] [--out runs/plan_published]

Nothing here is fitted to a row. The cluster is the papers' (NVIDIA Selene: DGX A100 80 GB, 8 a node, 312
TFLOP/s dense bf16/fp16 each, NVLink/NVSwitch inside a node, 8 HDR InfiniBand 200 Gb/s NICs a node) as
alpha-beta links: NVLink at 230 GB/s busbw (nccl-tests all_reduce on 8 x A100, published), InfiniBand at
23 GB/s per GPU (one 200 Gb/s NIC a GPU: half the infiniband preset's 400 Gb/s figure), the presets'
latencies. ONE efficiency for every row (--efficiency, default 0.8: an assumed share of the datasheet peak
for a large bf16 GEMM, not a measurement), 16-bit activations on the wire, the kit's AdamW with fp32
gradient reduction, no overlap of data-parallel communication. The model leaves out every op but the
matmuls and attention's (layernorm, softmax, dropout, GELU, the optimizer's pass), so it is optimistic.

  ZeRO (Rajbhandari et al. 2019, Table 1): bin/sl_memory --paper (common's zero_model_state_bytes) beside the
      table, GB per device for 7.5B, 128B and 1T parameters on 1..1024 devices.
  Megatron-LM (Narayanan et al. 2021, Table 1): per-GPU teraFLOP/s of GPT models from 1.7B to 1T, full
      recompute, sequence 2048, vocabulary 51200. The paper counts FLOPs with its Eq. 3 (recompute included):
      the prediction is Eq. 3's FLOPs over the predicted step time. Not published per row: the micro-batch
      and the interleaving; assumed here B = 1 and 1F1B (v = 1).
  Korthikanti et al. 2022 (Tables 3 and 5): iteration time of the 22B, 175B, 530B and 1T models with full
      recompute and with sequence parallelism + selective recompute (interleaved v = 3 for 175B and 530B).
Writes <out>/published.md and prints it.
"""
import argparse
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shown_dir(path):
    """A build directory as the user would type it: relative to the repository when inside it."""
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel
S, V = 2048, 51200  # sequence, vocabulary of both Megatron papers

# Narayanan et al. 2021, Table 1: params (B), heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU, % peak
MEGATRON = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
            (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
            (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
            (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
            (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52)]
# Korthikanti et al. 2022, Table 3 (config) and Table 5 (seconds per iteration): name, heads, hidden, layers,
# tp, pp, GPUs, global batch, micro-batch, chunks v, full recompute s, sequence parallel + selective s
KORTHIKANTI = [("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10), ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
               ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
               ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49)]
# Rajbhandari et al. 2019, Table 1: GB per device for P_os, P_os+g, P_os+g+p at N_d = 1, 4, 16, 64, 256, 1024
ZERO = {7.5e9: [(120, 120, 120), (52.5, 41.3, 30), (35.6, 21.6, 7.5), (31.4, 16.6, 1.88), (30.4, 15.4, 0.47),
                (30.1, 15.1, 0.12)],
        128e9: [(2048, 2048, 2048), (896, 704, 512), (608, 368, 128), (536, 284, 32), (518, 263, 8), (513, 257, 2)],
        1e12: [(16000, 16000, 16000), (7000, 5500, 4000), (4750, 2875, 1000), (4187, 2218, 250), (4046, 2054, 62.5),
               (4011, 2013, 15.6)]}
NS = [1, 4, 16, 64, 256, 1024]


def plan(a, heads, hidden, layers, tp, pp, dp, B, m, recompute, sp=False, v=1):
    cmd = [os.path.join(a.build_dir, "bin", "sl_plan"), "--layers", str(layers), "--hidden", str(hidden),
           "--heads", str(heads), "--vocab", str(V), "--seq-len", str(S), "--gpu", "a100", "--memory-gb", "1000",
           "--efficiency", str(a.efficiency), "--intra", "nvlink", "--intra-gbs", "230", "--inter", "infiniband",
           "--inter-gbs", "23", "--activation-bytes", "2", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp),
           "--micro-batch", str(B), "--micro-batches", str(m), "--global-batch", str(dp * B * m),
           "--recompute", recompute, "--json"]
    cmd += ["--sp"] if sp else []
    cmd += ["--schedule", "interleaved", "--chunks", str(v)] if v > 1 else []
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"plan_published: sl_plan failed:\n  {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout)["time"]


def zero_table(a):
    lines = ["| Psi | N | P_os paper | kit | P_os+g paper | kit | P_os+g+p paper | kit |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for psi, rows in ZERO.items():
        out = subprocess.run([os.path.join(a.build_dir, "bin", "sl_memory"), "--psi", repr(psi), "--ranks",
                              ",".join(map(str, NS)), "--paper"], capture_output=True, text=True, check=True).stdout
        kit = {}
        for line in out.splitlines():
            for stage in (1, 2, 3):
                if line.startswith(f"{stage} P_os"):
                    cells = line.split("Psi")[-1].replace("(", " ").replace(")", " ").split()
                    numbers = [float(x) for x in cells if x.replace(".", "").isdigit()]
                    kit[stage] = numbers[::2]  # GB (1e9 bytes), then GiB in parentheses
        for i, n in enumerate(NS):
            cells = []
            for stage in (1, 2, 3):
                cells += [f"{rows[i][stage - 1]:g}", f"{kit[stage][i]:g}"]
            lines.append(f"| {psi:.3g} | {n} | " + " | ".join(cells) + " |")
    return lines


def megatron_table(a):
    lines = ["| model | tp x pp x dp | batch | m | published TFLOP/s per GPU | predicted | error | bubble | tp | dp |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errors = []
    for params, heads, hidden, layers, tp, pp, gpus, batch, tflops, pct in MEGATRON:
        dp = gpus // (tp * pp)
        m = batch // dp
        t = plan(a, heads, hidden, layers, tp, pp, dp, 1, m, "full")
        flops = 96 * batch * S * layers * hidden ** 2 * (1 + S / (6 * hidden) + V / (16 * layers * hidden))  # Eq. 3
        predicted = flops / (t["step_ms"] / 1e3) / gpus / 1e12
        err = predicted / tflops - 1
        errors.append(abs(err))
        lines.append(f"| {params}B | {tp} x {pp} x {dp} | {batch} | {m} | {tflops} ({pct} %) | {predicted:.0f} | "
                     f"{100 * err:+.0f} % | {100 * t['bubble_ms'] / t['step_ms']:.0f} % | "
                     f"{100 * t['tp_ms'] * m / t['step_ms']:.0f} % | {100 * t['dp_ms'] / t['step_ms']:.0f} % |")
    return lines, errors


def korthikanti_table(a):
    lines = ["| model | tp x pp (v) | batch (B) | full recompute: paper s | predicted | error | sp + selective: paper s | "
             "predicted | error | speed-up paper | predicted |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errors = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, B, v, full_s, sel_s in KORTHIKANTI:
        m = batch // B
        full = plan(a, heads, hidden, layers, tp, pp, 1, B, m, "full", v=v)["step_ms"] / 1e3
        sel = plan(a, heads, hidden, layers, tp, pp, 1, B, m, "selective", sp=True, v=v)["step_ms"] / 1e3
        errors += [abs(full / full_s - 1), abs(sel / sel_s - 1)]
        lines.append(f"| {name} | {tp} x {pp} ({v}) | {batch} ({B}) | {full_s} | {full:.2f} | {100 * (full / full_s - 1):+.0f} % | "
                     f"{sel_s} | {sel:.2f} | {100 * (sel / sel_s - 1):+.0f} % | {100 * (full_s / sel_s - 1):.1f} % | "
                     f"{100 * (full / sel - 1):.1f} % |")
    return lines, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--efficiency", type=float, default=0.8, help="one efficiency for every row")
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "plan_published"))
    a = ap.parse_args()
    missing = [p for p in ("sl_plan", "sl_memory") if not os.access(os.path.join(a.build_dir, "bin", p), os.X_OK)]
    if missing:
        raise SystemExit(f"plan_published: {', '.join('bin/' + p for p in missing)} not built in {a.build_dir}\n"
                         f"  hint: cmake --build {shown_dir(a.build_dir)} --target sl_plan sl_memory")
    mega, mega_err = megatron_table(a)
    kort, kort_err = korthikanti_table(a)
    text = ["## ZeRO, Table 1: GB per device (paper policy: 16-bit params and grads, K = 12)", ""] + zero_table(a) + [
        "", f"## Megatron-LM, Table 1 (efficiency {a.efficiency}; B = 1, 1F1B assumed)", ""] + mega + [
        "", f"mean |error| {100 * sum(mega_err) / len(mega_err):.0f} %, largest {100 * max(mega_err):.0f} %", "",
        f"## Korthikanti et al. 2022, Table 5 (efficiency {a.efficiency})", ""] + kort + [
        "", f"mean |error| {100 * sum(kort_err) / len(kort_err):.0f} %, largest {100 * max(kort_err):.0f} %"]
    os.makedirs(a.out, exist_ok=True)
    open(os.path.join(a.out, "published.md"), "w").write("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
