# notebooks/logs/09_planner.sh — lab 09's runs for notebooks/09_planner.ipynb (its manifest's "notebook_logs";
# sourced by scripts/notebooks.sh --make-logs, which sets BUILD, RUNS_ROOT, tmp, ...).
# The validation's quick form (its two calibration runs and one row: GPipe on 2 ranks, uniform compute) and
# the rankings of a 7B and a 70B model on 64 H100s (bin/sl_plan --json; the notebook's commands).
cached_calibration
python3 bench/plan_validate.py --build-dir "$BUILD" --out "$RUNS_ROOT/plan_validate" --only "GPipe" --repeats 1 \
  --steps 3 "${CAL[@]}" > "$tmp/lab09_validate.out" 2>&1 \
  || { cat "$tmp/lab09_validate.out"; die "lab 09 validation (bench/plan_validate.py --only GPipe) failed"; }
mkdir -p "$RUNS_ROOT/plan"
for model in "7b 32 4096 32" "70b 80 8192 64"; do
  read -r name layers hidden heads <<< "$model"
  "$BUILD/bin/sl_plan" --layers "$layers" --hidden "$hidden" --heads "$heads" --vocab 32000 --seq-len 2048 \
    --global-batch 512 --gpus 64 --gpus-per-node 8 --gpu h100 --top 12 --json > "$RUNS_ROOT/plan/${name}_64xh100.json" \
    || die "bin/sl_plan for the $name model failed"
done
