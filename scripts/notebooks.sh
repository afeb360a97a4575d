#!/usr/bin/env bash
# notebooks.sh — execute the notebooks (notebooks/*.ipynb) headless, as CI does, and write their plots as PNG.
#   scripts/notebooks.sh                  the notebooks on your own runs (runs/lab01, runs/lab03, ...)
#   scripts/notebooks.sh --make-logs      first make short CPU runs in a temp dir (labs 01 and 02; labs 03 and 04 at
#                                         1 and 2 ranks with timelines; lab 05's quick link sweep; lab 06's bubble
#                                         sweep at 2 stages; lab 07's 2 x 2 x 2 grid in two orders at 8 ranks;
#                                         lab 08's poisoned run, rolled back)
#                                         and point the notebooks at them
# Options: --build-dir DIR (default build; holds bin/reference/lab01_single_device, lab02_data_pipeline, lab03_ddp,
#          lab04_fsdp, lab05_tensor_parallel, lab06_pipeline_parallel, lab07_parallel_3d, lab08_resilience),
#          --runs-root DIR (the logs to read; default runs), --out DIR (executed notebooks + plots; default a temp dir).
# The Python packages are pinned in notebooks/requirements.txt and installed into .venv-notebooks/ (made
# once, reinstalled when that file changes). Fails when a notebook is committed with outputs or a cell raises.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="build"
RUNS_ROOT="$ROOT/runs"
OUT=""
MAKE_LOGS=0
VENV="$ROOT/.venv-notebooks"

die() { echo "[scalelab] notebooks: $1" >&2; [[ $# -gt 1 ]] && echo "[scalelab]   hint: $2" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --make-logs) MAKE_LOGS=1; shift ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --runs-root) RUNS_ROOT="$(realpath -m "$2")"; shift 2 ;;
    --out) OUT="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" "see scripts/notebooks.sh --help" ;;
  esac
done
t_start=$SECONDS

# ---- the virtual environment (pinned requirements; scripts/lib/venv.sh) ----
source "$ROOT/scripts/lib/venv.sh"
sl_notebooks_venv "$VENV" notebooks
PY="$VENV/bin/python"

# ---- notebooks are committed without outputs ----
"$PY" notebooks/execute.py --check-clean || exit 1

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sl-notebooks.XXXXXX")"
[[ -n "$OUT" ]] || OUT="$tmp/out"

# ---- short CPU runs to plot ----
if [[ "$MAKE_LOGS" == 1 ]]; then
  t0=$SECONDS
  BIN="$BUILD/bin/reference"
  for prog in lab01_single_device lab02_data_pipeline lab03_ddp lab04_fsdp lab05_tensor_parallel \
              lab06_pipeline_parallel lab07_parallel_3d lab08_resilience; do
    [[ -x "$BIN/$prog" ]] || die "$BIN/$prog not found" "build first: cmake -S . -B $BUILD -G Ninja && cmake --build $BUILD (or pass --build-dir)"
  done
  [[ -f data/kjv/val_000000.bin ]] || scripts/prepare_corpus.sh --build-dir "$BUILD"
  RUNS_ROOT="$tmp/runs"
  # demo model, short sequences: loss curves that visibly fall in seconds. Lab 03 keeps the global batch
  # at 8 (1 rank: 2 micro-batches of 4) so the 1- and 2-rank runs compare like for like.
  common=(--data data/kjv --model demo --seq-len 64 --val-every 10 --val-batches 2 --sample-tokens 0 --quiet
          --log-dir "$RUNS_ROOT")
  echo "== notebooks: short CPU runs into $RUNS_ROOT"
  "$BIN/lab01_single_device" "${common[@]}" --batch 8 --steps 30 > "$tmp/lab01.out" 2>&1 \
    || { cat "$tmp/lab01.out"; die "lab 01 run failed"; }
  # Lab 02 (the starvation plots): the kit loader and the naive one under the tiny model, which eats tokens
  # as fast as the naive loader makes them; then the kit loader under the demo model with a simulated
  # 50 ms read per batch, prefetch off and on. A few seconds in all.
  lab02=(--data data/kjv --val-batches 1 --sample-tokens 0 --threads 1 --quiet --log-dir "$RUNS_ROOT")
  ( "$BIN/lab02_data_pipeline" "${lab02[@]}" --model tiny --seq-len 16 --batch 8 --steps 40 \
      --loader-alone-batches 500 --naive-alone-batches 20 --run-id starve-tiny &&
    for pf in off on; do
      "$BIN/lab02_data_pipeline" "${lab02[@]}" --model demo --seq-len 64 --batch 8 --steps 8 --loader kit \
        --read-delay-ms 50 --prefetch "$pf" --loader-alone-batches 10 --run-id "disk-$pf" || exit 1
    done ) > "$tmp/lab02.out" 2>&1 || { cat "$tmp/lab02.out"; die "lab 02 runs failed"; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for np in 1 2; do
    mpirun --oversubscribe --bind-to none -np "$np" "$BIN/lab03_ddp" "${common[@]}" --steps 20 --micro-batch 4 \
      --global-batch 8 --bucket-mb 0.25 --timeline-steps 3 > "$tmp/lab03_np$np.out" 2>&1 \
      || { cat "$tmp/lab03_np$np.out"; die "lab 03 run at $np ranks failed"; }
  done
  # Lab 04: ZeRO-3 at 1 and 2 ranks on the same global batch (memory per rank falls, the curve stays).
  for np in 1 2; do
    mpirun --oversubscribe --bind-to none -np "$np" "$BIN/lab04_fsdp" "${common[@]}" --steps 20 --micro-batch 4 \
      --global-batch 8 --stage 3 --loader-alone-batches 0 > "$tmp/lab04_np$np.out" 2>&1 \
      || { cat "$tmp/lab04_np$np.out"; die "lab 04 run at $np ranks failed"; }
  done
  # Lab 05: the link sweep's quick form (tp 1 and 2; no link and 100 Gb/s Ethernet; timelines).
  python3 bench/tp_link_sweep.py --quick --bin "$BIN/lab05_tensor_parallel" --seq-len 64 --micro-batch 4 \
    --steps 6 --log-dir "$RUNS_ROOT" > "$tmp/lab05_sweep.out" 2>&1 \
    || { cat "$tmp/lab05_sweep.out"; die "lab 05 sweep (bench/tp_link_sweep.py --quick) failed"; }
  # Lab 06: the bubble sweep at 2 stages (GPipe, 1F1B, interleaved x m 2, 4; uniform compute 5 ms; a timeline
  # at m 4): 6 runs. They read the CPU peak the runs above cached (1 thread) instead of each re-checking it
  # with a quick sgemm pass, which was 2/3 of a run's 5 s on 2 loaded cores (notebook 06 shows no MFU).
  t6=$SECONDS
  cal=(); [[ -f runs/calibration/cpu_1t.json ]] && cal=(--calibration runs/calibration/cpu_1t.json)
  python3 bench/pp_bubble_sweep.py --bin "$BIN/lab06_pipeline_parallel" --ranks 2 --micro-batches 2 4 \
    --uniform-compute-ms 5 --steps 3 --timeline-m 4 "${cal[@]}" --timeout-s 120 --log-dir "$RUNS_ROOT" \
    > "$tmp/lab06_sweep.out" 2>&1 \
    || { cat "$tmp/lab06_sweep.out"; die "lab 06 sweep (bench/pp_bubble_sweep.py) failed"; }
  echo "   lab 06 runs made in $((SECONDS - t6)) s"
  # Lab 07: tp 2 x pp 2 x dp 2 on 8 ranks as 2 simulated nodes of 4 (NVLink inside a node, InfiniBand across,
  # both 300x slower; uniform compute 20 ms a forward), 1F1B m 4, timelines of steps 1 and 2, in two orders:
  # tp-dp-pp keeps every tp group inside a node, pp-dp-tp puts every one across the nodes (notebook 07 draws
  # both). The same cached 1-thread peak as lab 06. Both runs: 16-17 s here (2 cores, nothing else running).
  t7=$SECONDS
  lab07=(--data data/kjv --model demo --tp 2 --pp 2 --ranks-per-node 4 --link nvlink --inter-link infiniband
         --link-slowdown 300 --uniform-compute-ms 20 --micro-batch 2 --seq-len 64 --micro-batches 4 --steps 3
         --warmup 1 --val-every 0 --val-batches 1 --timeline-steps 2 --threads 1 --wait-timeout-s 120 --quiet
         "${cal[@]}" --log-dir "$RUNS_ROOT")
  for order in tp-dp-pp pp-dp-tp; do
    mpirun --oversubscribe --bind-to none -np 8 "$BIN/lab07_parallel_3d" "${lab07[@]}" --order "$order" \
      --run-id "grid-$order" > "$tmp/lab07_$order.out" 2>&1 \
      || { cat "$tmp/lab07_$order.out"; die "lab 07 run (order $order, 8 ranks) failed"; }
  done
  echo "   lab 07 runs made in $((SECONDS - t7)) s"
  # Lab 08: a loss spike rolled back. Tiny model, 2 ranks, 60 steps, a checkpoint every 10; rank 1's windows of
  # step 45 have every target byte 0: the run rolls back to step 40 and skips them (notebook 08 plots it).
  t8=$SECONDS
  mpirun --oversubscribe --bind-to none -np 2 "$BIN/lab08_resilience" --data data/kjv --model tiny --seq-len 16 \
    --micro-batch 4 --micro-batches 2 --steps 60 --checkpoint-dir "$tmp/lab08_ckpt" --checkpoint-every 10 \
    --poison-at-step 45 --poison-rank 1 --spike-window 8 --val-every 0 --val-batches 1 --threads 1 \
    --straggler-window 0 --quiet "${cal[@]}" --log-dir "$RUNS_ROOT" --run-id spike > "$tmp/lab08.out" 2>&1 \
    || { cat "$tmp/lab08.out"; die "lab 08 run (a poisoned window) failed"; }
  grep -q "rollback at step 45" "$tmp/lab08.out" || { cat "$tmp/lab08.out"; die "lab 08's poisoned run did not roll back"; }
  echo "   lab 08 run made in $((SECONDS - t8)) s"
  # Lab 09: the validation's quick form (its two calibration runs and one row: GPipe on 2 ranks, uniform
  # compute) and the rankings of a 7B and a 70B model on 64 H100s (bin/sl_plan --json; the notebook's commands).
  t9=$SECONDS
  python3 bench/plan_validate.py --build-dir "$BUILD" --out "$RUNS_ROOT/plan_validate" --only "GPipe" --repeats 1 \
    --steps 3 "${cal[@]}" > "$tmp/lab09_validate.out" 2>&1 \
    || { cat "$tmp/lab09_validate.out"; die "lab 09 validation (bench/plan_validate.py --only GPipe) failed"; }
  mkdir -p "$RUNS_ROOT/plan"
  for model in "7b 32 4096 32" "70b 80 8192 64"; do
    read -r name layers hidden heads <<< "$model"
    "$BUILD/bin/sl_plan" --layers "$layers" --hidden "$hidden" --heads "$heads" --vocab 32000 --seq-len 2048 \
      --global-batch 512 --gpus 64 --gpus-per-node 8 --gpu h100 --top 12 --json > "$RUNS_ROOT/plan/${name}_64xh100.json" \
      || die "bin/sl_plan for the $name model failed"
  done
  echo "   lab 09 runs made in $((SECONDS - t9)) s"
  echo "   runs made in $((SECONDS - t0)) s"
fi

# ---- the plots' own test: a stacked memory bar is memory_current_bytes, on synthetic records and these runs ----
"$PY" notebooks/test_scalelab_logs.py --runs-root "$RUNS_ROOT" || die "notebooks/test_scalelab_logs.py failed (above)" \
  "a memory plot stacks a key that is not an allocator category (notebooks/scalelab_logs.py _MEMORY_TOTALS)"

# ---- execute every notebook ----
echo "== notebooks: executing notebooks/*.ipynb on $RUNS_ROOT"
t0=$SECONDS
"$PY" notebooks/execute.py --runs-root "$RUNS_ROOT" --out "$OUT" 2> >(grep -v "Kernel is running over TCP" >&2) \
  || die "a notebook failed (above); its executed copy is in $OUT" "open it in Jupyter to see the failing cell"
echo "   executed in $((SECONDS - t0)) s; notebooks and PNG plots in $OUT (total $((SECONDS - t_start)) s)"
