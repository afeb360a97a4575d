# notebooks/logs/08_resilience.sh — lab 08's run for notebooks/08_resilience.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, RUNS_ROOT, tmp, ...).
# A loss spike rolled back. Tiny model, 2 ranks, 60 steps, a checkpoint every 10; rank 1's windows of step 45
# have every target byte 0: the run rolls back to step 40 and skips them (notebook 08 plots it).
cached_calibration
mpirun --oversubscribe --bind-to none -np 2 "$PROGRAM" --data data/kjv --model tiny --seq-len 16 \
  --micro-batch 4 --micro-batches 2 --steps 60 --checkpoint-dir "$tmp/lab08_ckpt" --checkpoint-every 10 \
  --poison-at-step 45 --poison-rank 1 --spike-window 8 --val-every 0 --val-batches 1 --threads 1 \
  --straggler-window 0 --quiet "${CAL[@]}" --log-dir "$RUNS_ROOT" --run-id spike > "$tmp/lab08.out" 2>&1 \
  || { cat "$tmp/lab08.out"; die "lab 08 run (a poisoned window) failed"; }
grep -q "rollback at step 45" "$tmp/lab08.out" \
  || { cat "$tmp/lab08.out"; die "lab 08's poisoned run did not roll back"; }
