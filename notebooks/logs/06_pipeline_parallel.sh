# notebooks/logs/06_pipeline_parallel.sh — lab 06's runs for notebooks/06_pipeline_parallel.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, RUNS_ROOT, tmp, ...).
# The bubble sweep at 2 stages (GPipe, 1F1B, interleaved x m 2, 4; uniform compute 5 ms; a timeline at m 4):
# 6 runs; then one ZB-H1 run at m 4 with a timeline, for the picture of its split backwards (I and W).
# They read the CPU peak the earlier labs' runs cached (1 thread; CAL, set by cached_calibration)
# instead of each re-checking it with a quick sgemm pass, which was 2/3 of a run's 5 s on 2 loaded cores
# (notebook 06 shows no MFU).
cached_calibration
python3 bench/pp_bubble_sweep.py --bin "$PROGRAM" --ranks 2 --micro-batches 2 4 \
  --uniform-compute-ms 5 --steps 3 --timeline-m 4 "${CAL[@]}" --timeout-s 120 --log-dir "$RUNS_ROOT" \
  > "$tmp/lab06_sweep.out" 2>&1 \
  || { cat "$tmp/lab06_sweep.out"; die "lab 06 sweep (bench/pp_bubble_sweep.py) failed"; }
python3 bench/pp_bubble_sweep.py --bin "$PROGRAM" --ranks 2 --schedules zb-h1 --micro-batches 4 \
  --uniform-compute-ms 5 --steps 3 --timeline-m 4 "${CAL[@]}" --timeout-s 120 --log-dir "$RUNS_ROOT" \
  > "$tmp/lab06_zb.out" 2>&1 \
  || { cat "$tmp/lab06_zb.out"; die "lab 06 ZB-H1 run (bench/pp_bubble_sweep.py --schedules zb-h1) failed"; }
