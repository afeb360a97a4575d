# notebooks/logs/04_fsdp.sh — lab 04's runs for notebooks/04_fsdp.ipynb (its manifest's "notebook_logs"; sourced
# by scripts/notebooks.sh --make-logs, which sets PROGRAM, COMMON, RUNS_ROOT, tmp, ...).
# ZeRO-3 at 1 and 2 ranks on the same global batch (memory per rank falls, the curve stays).
for np in 1 2; do
  mpirun --oversubscribe --bind-to none -np "$np" "$PROGRAM" "${COMMON[@]}" --steps 20 --micro-batch 4 \
    --global-batch 8 --stage 3 --loader-alone-batches 0 > "$tmp/lab04_np$np.out" 2>&1 \
    || { cat "$tmp/lab04_np$np.out"; die "lab 04 run at $np ranks failed"; }
done
