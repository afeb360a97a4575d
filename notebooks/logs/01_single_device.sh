# notebooks/logs/01_single_device.sh — lab 01's runs for notebooks/01_single_device.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, COMMON, RUNS_ROOT, tmp, ...).
# One demo-model run of 30 steps: a loss curve that visibly falls in seconds.
"$PROGRAM" "${COMMON[@]}" --batch 8 --steps 30 > "$tmp/lab01.out" 2>&1 \
  || { cat "$tmp/lab01.out"; die "lab 01 run failed"; }
