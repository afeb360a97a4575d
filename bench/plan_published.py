#!/usr/bin/env python3
"""bench/plan_published.py — lab 09's model against published tables: ZeRO's memory per device, Megatron-LM's
throughput per GPU, and Korthikanti et al.'s iteration times with full and with selective recompute.

  python3 bench/plan_published.py [--build-dir build] [--efficiency 0.8] [--out runs/plan_published]

The cluster is the papers' (NVIDIA Selene: DGX A100 80 GB, 8 a node, 312 TFLOP/s dense bf16/fp16 each,
NVLink/NVSwitch inside a node, 8 HDR InfiniBand 200 Gb/s NICs a node) as alpha-beta links: NVLink at 230 GB/s
busbw (nccl-tests all_reduce on 8 x A100, published), InfiniBand at 23 GB/s per GPU (one 200 Gb/s NIC a GPU:
half the infiniband preset's 400 Gb/s figure), the presets' latencies; 16-bit activations on the wire, AdamW,
no overlap of data-parallel communication, and Megatron-LM's pipeline scatter/gather (--pp-scatter-gather,
Narayanan et al. 2021, Sec. 4.1, on by default in Megatron-LM): without sequence parallelism each of the 8
tp ranks sends 1/8 of the (B, T, C) boundary over its own NIC, and the receiving stage all-gathers it over
NVLink. Each row is predicted three ways:
  before   the FLOPs at ONE efficiency for every row (--efficiency, default 0.8: an assumed share of the
           datasheet peak for a large bf16 GEMM, not a measurement): only the matmuls and attention are priced,
           and the gradients are reduced in fp32 (the kit's). Optimistic.
  per-op   sl_plan --per-op on the simulated A100 (common's per-op cost model at the preset's efficiencies:
           matmul 0.75, attention 0.50, memory 0.85, 5 us a launch), priced as a 16-bit framework runs
           (--activation-bytes 2: bf16 matmuls and attention, memory-bound traffic at 2 bytes an element):
           every op of a step, the layernorms, GELU, residuals, biases, attention's T x T scores, the
           vocabulary-parallel cross-entropy, the embedding, the optimizer's pass (AdamW on fp32 master weights
           and their 16-bit copy) and the launches; the gradients reduced in 16 bits (--reduce-dtype bf16:
           the papers trained in fp16, and Megatron-LM all-reduces fp16 gradients unless told
           --accumulate-allreduce-grads-in-fp32). Nothing fitted. Dropout is not priced (the kit has no
           dropout op; Megatron fuses it with the bias and the residual add).
  fitted   per-op with eff_matmul fitted on two rows (fit(): Korthikanti's 22B, the only one-node rows), the
           error reported on the others.

  ZeRO (Rajbhandari et al. 2019, Table 1): bin/sl_memory --paper (common's zero_model_state_bytes) beside the
      table, GB per device for 7.5B, 128B and 1T parameters on 1..1024 devices.
  Megatron-LM (Narayanan et al. 2021, Table 1): per-GPU teraFLOP/s of GPT models from 1.7B to 1T, full
      recompute, sequence 2048, vocabulary 51200. The paper counts FLOPs with its Eq. 3 (recompute included):
      the prediction is Eq. 3's FLOPs over the predicted step time. Not in the paper: the micro-batch and the
      interleaving; assumed here B = 1 and 1F1B (v = 1). --megatron-layouts sc21 takes them instead from
      Megatron-LM's reproduction script of the table (examples/sc21/run_table_1.sh: B 16 down to 1,
      interleaving on 76B-530B), SC21 below.
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
# Megatron-LM's examples/sc21/run_table_1.sh, per model of MEGATRON: (micro-batch, chunks v), v = the layers
# of a stage over --num-layers-per-virtual-pipeline-stage
SC21 = {1.7: (16, 1), 3.6: (16, 1), 7.5: (16, 1), 18.4: (8, 1), 39.1: (4, 1), 76.1: (2, 3), 145.6: (2, 2),
        310.1: (1, 2), 529.6: (1, 3), 1008.0: (1, 1)}
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


def plan(a, heads, hidden, layers, tp, pp, dp, B, m, recompute, sp=False, v=1, per_op=None):
    """sl_plan's prediction of one layout: FLOPs at --efficiency (per_op None: before), or op by op on the
    simulated A100 (per_op: {} for the preset's efficiencies, or {"matmul": e} for a fitted one)."""
    cmd = [os.path.join(a.build_dir, "bin", "sl_plan"), "--layers", str(layers), "--hidden", str(hidden),
           "--heads", str(heads), "--vocab", str(V), "--seq-len", str(S), "--gpu", "a100", "--memory-gb", "1000",
           "--efficiency", str(a.efficiency), "--intra", "nvlink", "--intra-gbs", "230", "--inter", "infiniband",
           "--inter-gbs", "23", "--activation-bytes", "2", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp),
           "--micro-batch", str(B), "--micro-batches", str(m), "--global-batch", str(dp * B * m),
           "--recompute", recompute, "--pp-scatter-gather", "--json"]
    cmd += ["--sp"] if sp else []
    cmd += ["--schedule", "interleaved", "--chunks", str(v)] if v > 1 else []
    if per_op is not None:  # the published runs' gradients: fp16, all-reduced in 16 bits (see the docstring)
        cmd += ["--per-op", "--reduce-dtype", "bf16"] + [x for k, e in per_op.items() for x in (f"--eff-{k}", f"{e:.6f}")]
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


# The three predictions of every row: FLOPs at --efficiency (the model before the per-op pricing), the per-op
# pricing at the simulated A100's efficiencies, and at the efficiencies fitted on FIT_ROWS (fit()).
VARIANTS = ("before", "per-op", "fitted")


def predictions(a, fitted, *layout, **options):
    """step_ms of one layout under each variant, in VARIANTS' order."""
    return [plan(a, *layout, **options, per_op=e)["step_ms"] for e in (None, {}, fitted)]


def megatron_table(a, fitted):
    lines = ["| model | tp x pp x dp | batch | B x m (v) | published TFLOP/s per GPU | before | error | per-op | error | "
             "fitted | error | bubble | tp | dp | optimizer |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errors = {v: [] for v in VARIANTS}
    for params, heads, hidden, layers, tp, pp, gpus, batch, tflops, pct in MEGATRON:
        dp = gpus // (tp * pp)
        B, v = SC21[params] if a.megatron_layouts == "sc21" else (1, 1)
        m = batch // (dp * B)
        flops = 96 * batch * S * layers * hidden ** 2 * (1 + S / (6 * hidden) + V / (16 * layers * hidden))  # Eq. 3
        cells = []
        for variant, step_ms in zip(VARIANTS, predictions(a, fitted, heads, hidden, layers, tp, pp, dp, B, m, "full",
                                                                v=v)):
            predicted = flops / (step_ms / 1e3) / gpus / 1e12
            errors[variant].append(predicted / tflops - 1)
            cells += [f"{predicted:.0f}", f"{100 * errors[variant][-1]:+.1f} %"]
        t = plan(a, heads, hidden, layers, tp, pp, dp, B, m, "full", v=v, per_op=fitted)  # the fitted step's shares
        lines.append(f"| {params}B | {tp} x {pp} x {dp} | {batch} | {B} x {m} ({v}) | {tflops} ({pct} %) | " + " | ".join(cells) +
                     f" | {100 * t['bubble_ms'] / t['step_ms']:.0f} % | {100 * t['tp_ms'] * m / t['step_ms']:.0f} % | "
                     f"{100 * t['dp_ms'] / t['step_ms']:.0f} % | {100 * t['optimizer_ms'] / t['step_ms']:.1f} % |")
    return lines, errors


def korthikanti_rows():
    """(label, the plan's layout and options, the paper's seconds) of every Table 5 row."""
    for name, heads, hidden, layers, tp, pp, gpus, batch, B, v, full_s, sel_s in KORTHIKANTI:
        for mode, sp, paper_s in (("full", False, full_s), ("selective", True, sel_s)):
            yield ((name, tp, pp, v, batch, B, "full" if mode == "full" else "sp + selective"),
                   (heads, hidden, layers, tp, pp, 1, B, batch // B, mode), {"sp": sp, "v": v}, paper_s)


def korthikanti_table(a, fitted):
    lines = ["| model | tp x pp (v) | batch (B) | recompute | paper s | before | error | per-op | error | fitted | "
             "error |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    errors = {v: [] for v in VARIANTS}
    for (name, tp, pp, v, batch, B, label), layout, options, paper_s in korthikanti_rows():
        cells = []
        for variant, step_ms in zip(VARIANTS, predictions(a, fitted, *layout, **options)):
            errors[variant].append(step_ms / 1e3 / paper_s - 1)
            cells += [f"{step_ms / 1e3:.2f}", f"{100 * errors[variant][-1]:+.1f} %"]
        fit_mark = " (fitted)" if name in FIT_MODEL else ""
        lines.append(f"| {name}{fit_mark} | {tp} x {pp} ({v}) | {batch} ({B}) | {label} | {paper_s} | " + " | ".join(cells) + " |")
    return lines, errors


# The rows the efficiency is fitted on: Korthikanti's 22B model, full recompute and sp + selective, the only
# rows of either table on one node (tp 8, pp 1, dp 1): their step is the device's ops and NVLink, none of the
# assumed InfiniBand figures, pipeline bubble or data-parallel sync. One unknown, the matmuls' share of the
# peak (eff_matmul); attention's and the memory-bound ops' stay the simulated A100's. (Two unknowns do not
# separate on these two rows: eff_memory moves both rows' errors together, and attention at T = 2048, its
# T x T scores in memory, is bound by its bytes, so eff_attention does not move them at all.)
FIT_MODEL = ("22B",)


def fit(a):
    """The eff_matmul at which the two FIT_MODEL rows' signed errors average zero (bisection: a larger
    efficiency, a shorter step)."""
    rows = [(layout, options, paper_s) for (name, *_), layout, options, paper_s in korthikanti_rows() if name in FIT_MODEL]

    def mean_error(e):
        return sum(plan(a, *lay, **opt, per_op={"matmul": e})["step_ms"] / 1e3 / paper_s - 1
                   for lay, opt, paper_s in rows) / len(rows)

    lo, hi = 0.05, 1.0
    if mean_error(hi) > 0:
        return {"matmul": hi}  # too slow even at the peak: the closest there is
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_error(mid) > 0 else (lo, mid)
    return {"matmul": round((lo + hi) / 2, 4)}


def summary(name, errors, fitted_rows=0):
    """One line per variant: the mean and the largest |error| of a table (the fitted rows left out of 'fitted')."""
    out = []
    for variant in VARIANTS:
        errs = [abs(x) for x in errors[variant]][fitted_rows:] if variant == "fitted" else [abs(x) for x in errors[variant]]
        out.append(f"- {name}, {variant}: mean |error| {100 * sum(errs) / len(errs):.1f} %, largest "
                   f"{100 * max(errs):.1f} %, {len(errs)} rows{' (the fitted rows left out)' if fitted_rows and variant == 'fitted' else ''}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--efficiency", type=float, default=0.8, help="one efficiency for every row")
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "plan_published"))
    ap.add_argument("--megatron-layouts", choices=("assumed", "sc21"), default="assumed",
                    help="Megatron-LM's micro-batch and interleaving: assumed (B = 1, v = 1) or sc21 (Megatron-LM's "
                         "examples/sc21/run_table_1.sh)")
    ap.add_argument("--max-mean-error", type=float, default=0,
                    help="exit 1 when a table's per-op mean |error| exceeds this fraction (0: never; ctest "
                         "lab09.published_tables)")
    a = ap.parse_args()
    missing = [p for p in ("sl_plan", "sl_memory") if not os.access(os.path.join(a.build_dir, "bin", p), os.X_OK)]
    if missing:
        raise SystemExit(f"plan_published: {', '.join('bin/' + p for p in missing)} not built in {a.build_dir}\n"
                         f"  hint: cmake --build {shown_dir(a.build_dir)} --target sl_plan sl_memory")
    fitted = fit(a)
    mega, mega_err = megatron_table(a, fitted)
    kort, kort_err = korthikanti_table(a, fitted)
    effs = f"eff_matmul {fitted['matmul']:.3f}"
    text = ["## ZeRO, Table 1: GB per device (paper policy: 16-bit params and grads, K = 12)", ""] + zero_table(a) + [
        "", f"## Megatron-LM, Table 1 ({'B and v of run_table_1.sh' if a.megatron_layouts == 'sc21' else 'B = 1, 1F1B assumed'}; before: FLOPs at efficiency {a.efficiency}; per-op: the "
        f"simulated A100; fitted: per-op at {effs})", ""] + mega + [""] + summary("Megatron-LM", mega_err) + [
        "", f"## Korthikanti et al. 2022, Table 5 (before: FLOPs at efficiency {a.efficiency}; per-op: the simulated "
        f"A100; fitted: per-op at {effs}, fitted on the 22B rows)", ""] + kort + [""] + \
        summary("Korthikanti et al.", kort_err, fitted_rows=2)
    os.makedirs(a.out, exist_ok=True)
    open(os.path.join(a.out, "published.md"), "w").write("\n".join(text) + "\n")
    print("\n".join(text))
    if a.max_mean_error > 0:
        over = [f"{name}: per-op mean |error| {100 * sum(map(abs, e['per-op'])) / len(e['per-op']):.1f} %"
                for name, e in (("Megatron-LM", mega_err), ("Korthikanti et al.", kort_err))
                if sum(map(abs, e["per-op"])) / len(e["per-op"]) > a.max_mean_error]
        if over:
            raise SystemExit("plan_published: above --max-mean-error " + f"{100 * a.max_mean_error:g} %: " + "; ".join(over))


if __name__ == "__main__":
    main()
