# notebooks/logs/02_data_pipeline.sh — lab 02's runs for notebooks/02_data_pipeline.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, RUNS_ROOT, tmp, ...).
# The starvation plots: the kit loader and the naive one under the tiny model, which eats tokens as fast as
# the naive loader makes them; then the kit loader under the demo model with a simulated 50 ms read per
# batch, prefetch off and on. A few seconds in all.
lab02=(--data data/kjv --val-batches 1 --sample-tokens 0 --threads 1 --quiet --log-dir "$RUNS_ROOT")
( "$PROGRAM" "${lab02[@]}" --model tiny --seq-len 16 --batch 8 --steps 40 \
    --loader-alone-batches 500 --naive-alone-batches 20 --run-id starve-tiny &&
  for pf in off on; do
    "$PROGRAM" "${lab02[@]}" --model demo --seq-len 64 --batch 8 --steps 8 --loader kit \
      --read-delay-ms 50 --prefetch "$pf" --loader-alone-batches 10 --run-id "disk-$pf" || exit 1
  done ) > "$tmp/lab02.out" 2>&1 || { cat "$tmp/lab02.out"; die "lab 02 runs failed"; }
