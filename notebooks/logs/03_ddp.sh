# notebooks/logs/03_ddp.sh — lab 03's runs for notebooks/03_ddp.ipynb (its manifest's "notebook_logs"; sourced
# by scripts/notebooks.sh --make-logs, which sets PROGRAM, COMMON, RUNS_ROOT, tmp, ...).
# 1 and 2 ranks with timelines; the global batch stays 8 (1 rank: 2 micro-batches of 4), so the two runs
# compare like for like.
for np in 1 2; do
  mpirun --oversubscribe --bind-to none -np "$np" "$PROGRAM" "${COMMON[@]}" --steps 20 --micro-batch 4 \
    --global-batch 8 --bucket-mb 0.25 --timeline-steps 3 > "$tmp/lab03_np$np.out" 2>&1 \
    || { cat "$tmp/lab03_np$np.out"; die "lab 03 run at $np ranks failed"; }
done
