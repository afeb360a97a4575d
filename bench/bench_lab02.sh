#!/usr/bin/env bash
# bench/bench_lab02.sh — lab 02 reference: the starvation experiment of labs/02_data_pipeline/README.md.
# For each configuration it runs build/bin/reference/lab02_data_pipeline --repeats times and prints one
# table row per loader: the loader alone (no model), what the model eats, tokens/s of training and the
# share of each step spent waiting for data. Measured numbers only: nothing here is asserted.
#
#   bench/bench_lab02.sh [--build-dir build] [--repeats 3] [--only tiny|demo|d12|big-batch|disk]
#
# Configurations (one line each below): tiny (a model so small that it eats tokens faster than the naive
# loader makes them: it stands in for a fast GPU), demo, d12 (GPT-2 124M shapes, a few steps: a step takes
# seconds on a CPU), big-batch (the demo model at 64 x 256 = 16,384 tokens per batch, a GPU run's batch
# size: what the loaders make alone when their cost per batch is spread over that many tokens), and disk
# (only the kit loader, on the demo model, with a simulated 20 ms read per batch, --prefetch off and on). Repeats outermost, so a burst of load from elsewhere slows one repeat of
# several configurations rather than every repeat of one; each number is the median over the repeats of
# the runs' summary records (means over their timed steps, docs/log_schema.md "Lab 02's records").
# Every run uses 1 BLAS/OpenMP thread: the other core is left to the prefetch thread, and a 1-thread step
# does not collapse when other processes share the cores (a 2-thread step waits at every OpenMP barrier
# for whichever thread was preempted). Writes runs/bench_lab02/<date>/table.md (and the runs' logs beside
# it); prints the table, the machine and its load average (the development machines are shared: the load
# says how quiet it was).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
repeats=3
only=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done

exe="$build_dir/bin/reference/lab02_data_pipeline"
[[ -x "$exe" ]] || { echo "no $exe: cmake --build $build_dir --target lab02_data_pipeline_ref" >&2; exit 2; }
[[ -f data/kjv/kjv.txt ]] || { echo "no data/kjv: run scripts/prepare_corpus.sh (or scripts/demo.sh) first" >&2; exit 2; }
out_dir="runs/bench_lab02/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out_dir"

# name | arguments (after the common ones)
configs=(
  "tiny|--model tiny --seq-len 16 --batch 8 --steps 40"
  "demo|--model demo --seq-len 128 --batch 8 --steps 20"
  "d12|--model d12 --seq-len 256 --batch 4 --steps 4 --naive-alone-batches 50"
  "big-batch|--model demo --seq-len 256 --batch 64 --steps 2 --loader-alone-batches 1000 --naive-alone-batches 20"
  "disk-off|--model demo --seq-len 128 --batch 8 --steps 20 --loader kit --read-delay-ms 20 --prefetch off --loader-alone-batches 50"
  "disk-on|--model demo --seq-len 128 --batch 8 --steps 20 --loader kit --read-delay-ms 20 --prefetch on --loader-alone-batches 50"
)
common=(--data data/kjv --threads 1 --val-batches 1 --quiet --log-dir "$out_dir")

echo "lab02 bench: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average" \
     "at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
for (( rep = 1; rep <= repeats; rep++ )); do
  for entry in "${configs[@]}"; do
    name=${entry%%|*}
    [[ -z "$only" || "$name" == "$only"* ]] || continue
    read -r -a args <<< "${entry#*|}"
    run_id="$name-r$rep"
    echo "  $run_id ..." >&2
    "$exe" "${common[@]}" "${args[@]}" --run-id "$run_id" > "$out_dir/$run_id.out" 2>&1 ||
      { echo "FAILED: $run_id (see $out_dir/$run_id.out)" >&2; tail -5 "$out_dir/$run_id.out" >&2; exit 1; }
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out_dir" <<'EOF'
import json, pathlib, re, statistics, sys
out = pathlib.Path(sys.argv[1])
rows = {}  # (config, loader, model, B, T, threads) -> the summary records of its repeats
for f in sorted(out.glob("lab02/*/rank0.jsonl")):
    m = re.fullmatch(r"(?P<name>.+)-r\d+-(?P<loader>kit|naive)", f.parent.name)  # run id <name>-r<rep>, then -<loader>
    recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    run = next(r for r in recs if r.get("type") == "run")
    summ = [r for r in recs if r.get("type") == "summary"]
    if not m or not summ:
        continue
    cfg = run["config"]
    rows.setdefault((m["name"], m["loader"], cfg["model"], cfg["B"], cfg["T"], run.get("threads")), []).append(summ[-1])
med = lambda xs: statistics.median(xs)
lines = ["| config | model | B x T | threads | loader | loader alone tokens/s | model eats tokens/s | alone / eats "
         "| train tokens/s | step ms | data wait ms | wait share | runs |",
         "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
order = ["tiny", "demo", "d12", "big-batch", "disk-off", "disk-on"]  # the configurations' order above
for (name, loader, model, B, T, threads), s in sorted(rows.items(), key=lambda kv: (order.index(kv[0][0])
                                                       if kv[0][0] in order else len(order), kv[0][1])):
    alone = med([r["loader_alone_tokens_per_s"] for r in s])
    eats = med([r["consumption_tokens_per_s"] for r in s])
    lines.append(f"| {name} | {model} | {B} x {T} | {threads} | {loader} | {alone:,.0f} | {eats:,.0f} | "
                 f"{med([r['loader_alone_tokens_per_s'] / r['consumption_tokens_per_s'] for r in s]):,.1f}x | "
                 f"{med([r['tokens_per_s'] for r in s]):,.0f} | {med([r['step_ms'] for r in s]):,.2f} | "
                 f"{med([r['data_wait_ms'] for r in s]):,.3f} | {100 * med([r['data_wait_share'] for r in s]):.1f} % | "
                 f"{len(s)} |")
table = "\n".join(lines) + "\n"
(out / "table.md").write_text(table)
print(table)
print(f"(medians over the runs; logs and table in {out})")
EOF
