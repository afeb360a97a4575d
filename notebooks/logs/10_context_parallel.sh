# notebooks/logs/10_context_parallel.sh — lab 10's runs for notebooks/10_context_parallel.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, RUNS_ROOT, tmp, die, ...).
# All on simulated H100s (--device sim --timing-only; the sim backend under mpirun): virtual time, no
# arithmetic, the allocator counting every byte as a real run would; seconds, the same picture on every machine:
#   the ring's timeline: cp 4, zig-zag, over pcie, with the transfers overlapped and with --no-overlap (one
#   timeline step each, step 1);
#   activation memory against T: cp 1, 2 and 4 (ranks = cp) at T 64, 128, 256, one step each.
CP_COMMON=(--device sim --timing-only --data data/kjv --model demo --micro-batch 2 --val-batches 1
           --sample-tokens 0 --threads 1 --quiet --log-dir "$RUNS_ROOT")
cp_run() {  # cp_run RANKS ARGS...: one run, its output kept apart and shown if it fails
  local ranks="$1"
  shift
  mpirun -np "$ranks" --oversubscribe --bind-to none "$PROGRAM" "${CP_COMMON[@]}" "$@" > "$tmp/lab10.out" 2>&1 \
    || { cat "$tmp/lab10.out"; die "lab 10 run (-np $ranks $*) failed"; }
}
for overlap in "" "--no-overlap"; do
  cp_run 4 --cp 4 --zigzag --link pcie --seq-len 256 --steps 2 --timeline-steps 1 $overlap
done
for T in 64 128 256; do
  for cp in 1 2 4; do
    cp_run "$cp" --cp "$cp" --zigzag --seq-len "$T" --steps 1 --timeline-steps 0
  done
done
