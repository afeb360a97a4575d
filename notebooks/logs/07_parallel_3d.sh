# notebooks/logs/07_parallel_3d.sh — lab 07's runs for notebooks/07_parallel_3d.ipynb (its manifest's
# "notebook_logs"; sourced by scripts/notebooks.sh --make-logs, which sets PROGRAM, RUNS_ROOT, tmp, ...).
# tp 2 x pp 2 x dp 2 on 8 ranks as 2 simulated nodes of 4 (NVLink inside a node, InfiniBand across, both 300x
# slower; uniform compute 20 ms a forward), 1F1B m 4, timelines of steps 1 and 2, in two orders: tp-dp-pp keeps
# every tp group inside a node, pp-dp-tp puts every one across the nodes (notebook 07 draws both). The cached
# 1-thread peak, as lab 06's. Both runs: 16-17 s on 2 cores with nothing else running.
cached_calibration
lab07=(--data data/kjv --model demo --tp 2 --pp 2 --ranks-per-node 4 --link nvlink --inter-link infiniband
       --link-slowdown 300 --uniform-compute-ms 20 --micro-batch 2 --seq-len 64 --micro-batches 4 --steps 3
       --warmup 1 --val-every 0 --val-batches 1 --timeline-steps 2 --threads 1 --wait-timeout-s 120 --quiet
       "${CAL[@]}" --log-dir "$RUNS_ROOT")
for order in tp-dp-pp pp-dp-tp; do
  mpirun --oversubscribe --bind-to none -np 8 "$PROGRAM" "${lab07[@]}" --order "$order" \
    --run-id "grid-$order" > "$tmp/lab07_$order.out" 2>&1 \
    || { cat "$tmp/lab07_$order.out"; die "lab 07 run (order $order, 8 ranks) failed"; }
done
