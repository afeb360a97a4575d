#!/usr/bin/env bash
# bench/bench_lab03.sh — lab 03 reference: tokens/s and MFU of data-parallel training at 1, 2 and 4
# ranks for each gradient all-reduce (naive, bucketed, overlap), over the real MPI transport and over
# simulated links, plus how much of the all-reduce overlap mode hides behind backward. Prints a table
# and logs it (one JSON object per configuration). Measured numbers only: nothing here is asserted.
#
#   bench/bench_lab03.sh [--build-dir build] [--steps 8] [--repeats 3] [--model demo] [--micro-batch 8]
#                        [--seq-len 128] [--bucket-mb 1] [--links "none ethernet100 ethernet100x100"]
#                        [--ranks "1 2 4"]
#
# Each configuration is --repeats runs of build/bin/reference/lab03_ddp under mpirun (weak scaling: every
# rank processes --micro-batch sequences per step, so the global batch grows with the ranks). Its
# numbers come from rank 0's step records (docs/log_schema.md): the median over the steps after the
# first, of the repeat with the fastest median step (a shared machine slows some runs down; the
# fastest is the one least disturbed, as the GEMM calibration does). A link "NAMExF" is the
# preset NAME made F times slower (lab03_ddp --link NAME --link-slowdown F; labs/03_ddp/README.md
# "Measured" says why). Writes runs/bench_lab03/<date>/table.jsonl and table.md; the runs' own logs
# stay under runs/bench_lab03/<date>/lab03/.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
steps=8
repeats=3
model=demo
micro_batch=8
seq_len=128
bucket_mb=1
links="none ethernet100 ethernet100x100"
ranks="1 2 4"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --micro-batch) micro_batch="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --bucket-mb) bucket_mb="$2"; shift 2 ;;
    --links) links="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    *) sed -n '2,19p' "$0" >&2; exit 2 ;;
  esac
done

exe="$build_dir/bin/reference/lab03_ddp"
[[ -x "$exe" ]] || { echo "no $exe: cmake --build $build_dir --target lab03_ddp_ref" >&2; exit 2; }
[[ -d data/kjv ]] || { echo "no data/kjv: run scripts/prepare_corpus.sh (or scripts/demo.sh) first" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # harmless when not root
cores=$(nproc)
out_dir="runs/bench_lab03/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out_dir"

# The MFU peaks: one calibration per thread count the runs use (cores / ranks, at least 1), measured
# now, alone, so no rank measures while others compute (scalelab/measure/calibration.h).
for n in $ranks; do
  t=$(( cores / n )); (( t >= 1 )) || t=1
  "$build_dir/bin/sl_calibrate" --threads "$t" > /dev/null
done

echo "lab03 bench: model $model, micro-batch $micro_batch x T $seq_len per rank, $steps steps, buckets of" \
     "$bucket_mb MiB, $cores cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
# Repeats outermost: a burst of load from elsewhere then slows one repeat of several configurations,
# not every repeat of one.
for (( rep = 1; rep <= repeats; rep++ )); do
  for link in $links; do
    name=${link%x*}
    slowdown=1
    [[ "$link" == *x* ]] && slowdown=${link##*x}
    for n in $ranks; do
      if [[ "$name" != none && "$n" == 1 ]]; then continue; fi  # a link costs nothing with one rank
      for mode in naive bucketed overlap; do
        run_id="$link-np$n-$mode-r$rep"
        echo "  $run_id ..." >&2
        mpirun -np "$n" --oversubscribe --bind-to none "$exe" --model "$model" --micro-batch "$micro_batch" \
          --seq-len "$seq_len" --steps "$steps" --warmup 0 --val-every 0 --val-batches 1 --sample-tokens 0 --quiet \
          --mode "$mode" --bucket-mb "$bucket_mb" --link "$name" --link-slowdown "$slowdown" \
          --log-dir "$out_dir" --run-id "$run_id" > "$out_dir/$run_id.out" 2>&1 ||
          { echo "FAILED: $run_id (see $out_dir/$run_id.out)" >&2; tail -5 "$out_dir/$run_id.out" >&2; exit 1; }
      done
    done
  done
done

# The table, from the runs' summary records (docs/log_schema.md).
python3 - "$out_dir" "$links" "$ranks" "$repeats" <<'EOF'
import json, os, statistics, sys
out_dir, links, ranks, repeats = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])

def measure(run_id):
    """Medians over rank 0's timed steps (all but the first) of one run, and its run record."""
    recs = [json.loads(l) for l in open(os.path.join(out_dir, "lab03", run_id, "rank0.jsonl"))]
    run = next(r for r in recs if r["type"] == "run")
    steps = [r for r in recs if r["type"] == "step"][1:]
    med = lambda key: statistics.median(r[key] for r in steps)
    m = {"step_ms": med("step_ms"), "comm_exposed_ms": med("comm_ms"), "tokens": steps[0]["tokens"],
         "comm_modeled_ms": med("comm_modeled_ms") if "comm_modeled_ms" in steps[0] else None}
    m["tokens_per_s"] = m["tokens"] / (m["step_ms"] / 1e3)
    m["mfu"] = m["tokens_per_s"] * run["config"]["flops_per_token"] / (run["peak_flops_per_s"] * run["world_size"])
    return run, m

rows, records = [], []
for link in links:
    for n in ranks:
        if link.split("x")[0] != "none" and n == "1":
            continue
        exposed_bucketed = None
        for mode in ("naive", "bucketed", "overlap"):
            run, m = min((measure(f"{link}-np{n}-{mode}-r{rep}") for rep in range(1, repeats + 1)),
                         key=lambda rm: rm[1]["step_ms"])
            exposed = m["comm_exposed_ms"]
            if mode == "bucketed":
                exposed_bucketed = exposed
            # Overlap hides what the same buckets cost when sent after backward (bucketed mode).
            hidden = (1.0 - exposed / exposed_bucketed if mode == "overlap" and n != "1" and exposed_bucketed
                      else None)
            rec = dict(link=link, ranks=int(n), mode=mode, threads=run["threads"],
                       buckets=run["config"]["num_buckets"], hidden_share=hidden,
                       peak_flops_per_s=run["peak_flops_per_s"], peak_source=run["peak_source"],
                       simulated=link.split("x")[0] != "none", **m)
            records.append(rec)
            modeled = m["comm_modeled_ms"]
            rows.append(f"| {link} | {n} x {run['threads']} | {mode} | {m['step_ms']:.0f} | "
                        f"{m['tokens_per_s']:,.0f} | {100 * m['mfu']:.1f} % | {exposed:.1f} | "
                        + (f"{modeled:.1f}" if modeled is not None else "-") + " | "
                        + (f"{100 * hidden:.0f} %" if hidden is not None else "-") + " |")
head = ("| link | ranks x threads | mode | step ms | tokens/s | MFU | all-reduce exposed ms | link model ms | "
        "hidden by overlap |\n|---|---|---|---:|---:|---:|---:|---:|---:|")
table = head + "\n" + "\n".join(rows)
print(table)
with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(table + "\n")
with open(os.path.join(out_dir, "table.jsonl"), "w") as f:
    for r in records:
        f.write(json.dumps(r) + "\n")
print(f"\n(medians over steps 2..N, fastest of {repeats} runs; MFU = tokens/s x flops_per_token / (ranks x "
      f"calibrated sgemm peak at the rank's threads); 'exposed' = time the step waited for its gradient "
      f"all-reduces; 'link model' = what the simulated link alone charges per step; 'hidden by overlap' = 1 - "
      f"exposed(overlap) / exposed(bucketed), the same buckets sent after backward; logged: {out_dir}/table.jsonl)")
EOF
