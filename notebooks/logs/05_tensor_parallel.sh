# notebooks/logs/05_tensor_parallel.sh — lab 05's runs for notebooks/05_tensor_parallel.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, RUNS_ROOT, tmp, ...).
# The link sweep's quick form (tp 1 and 2; no link and 100 Gb/s Ethernet; timelines).
python3 bench/tp_link_sweep.py --quick --bin "$PROGRAM" --seq-len 64 --micro-batch 4 \
  --steps 6 --log-dir "$RUNS_ROOT" > "$tmp/lab05_sweep.out" 2>&1 \
  || { cat "$tmp/lab05_sweep.out"; die "lab 05 sweep (bench/tp_link_sweep.py --quick) failed"; }
