#!/usr/bin/env bash
# scripts/fsdp_fits.sh — lab 04 in one command: a model that does NOT fit on one device fits on four
# with ZeRO-3 (labs/04_fsdp/README.md "Does not fit, then fits").
#   model   d12 (GPT-2 124M shapes; 86M parameters with the byte vocabulary), fp32 + AdamW:
#           16 bytes per parameter = 1.3 GiB of model state on one device
#   device  a simulated 600 MiB per rank (--memory-cap-mb: the counting allocator refuses beyond it)
#   1. the estimator's prediction per rank for 1 rank and for 4 ranks (lab04_fsdp --estimate)
#   2. 1 rank, ZeRO-3: must fail with the out-of-memory report (checked: exit code and the report)
#   3. 4 ranks, ZeRO-3: a few steps, must succeed; measured memory per rank next to the cap
# Micro-batch 1 x 64 tokens keeps the activations at 46 MiB. About 15-30 s on 2 cores after the build (the 4-rank
# run is most of it: 4 ranks on 2 cores, each gathering the whole model twice per step).
#   scripts/fsdp_fits.sh [--build-dir DIR] [--cap-mb MiB] [--steps N] [--data DIR] [-- extra lab04 flags]
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cap_mb=600
steps=3
data=data/kjv
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --cap-mb) cap_mb="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "fsdp_fits.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

command -v mpirun >/dev/null || { echo "fsdp_fits.sh: mpirun not found; hint: scripts/install_deps.sh" >&2; exit 2; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun --oversubscribe --bind-to none)

echo "== build (CPU, reference track, $build_dir/)"
if [[ ! -f "$build_dir/build.ninja" && ! -f "$build_dir/Makefile" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSL_WITH_CUDA=OFF >/dev/null
fi
cmake --build "$build_dir" -j "$(nproc)" --target lab04_fsdp_ref sl_make_shards >/dev/null
lab04="$build_dir/bin/reference/lab04_fsdp"
if [[ ! -f "$data/train_000000.bin" ]]; then
  echo "== corpus"
  scripts/prepare_corpus.sh --build-dir "$build_dir" --out "$data"
fi

# The same run on 1 and on 4 ranks: only the number of ranks differs.
args=(--model d12 --stage 3 --micro-batch 1 --seq-len 64 --memory-cap-mb "$cap_mb" --data "$data"
      --steps "$steps" --warmup 1 --lr 6e-4 --val-every 0 --val-batches 1 --sample-tokens 0
      --loader-alone-batches 0 --timeline-steps 0 "${extra[@]}")
stamp=$(date -u +%Y%m%d-%H%M%S)

echo
echo "== 1. the estimator (common/include/scalelab/measure/memory_estimator.h), cap $cap_mb MiB per rank"
echo "-- 1 rank:"
"$lab04" "${args[@]}" --estimate | grep -E "^(stage|  |[0-3] |ZeRO)"
echo "-- 4 ranks:"
"${mpi[@]}" -np 4 "$lab04" "${args[@]}" --estimate | grep -E "^(stage|  |[0-3] |ZeRO)"

echo
echo "== 2. one rank: must run out of memory"
log1=$(mktemp)
set +e
"$lab04" "${args[@]}" --backend local --run-id "fits-$stamp-1rank" >"$log1" 2>&1
rc1=$?
set -e
grep -E "out of memory on|ran out of simulated|cap .* MiB per rank|estimator for this run|fits in this cap|hint: more ranks" "$log1" \
  | sed 's/^/   /'
if [[ $rc1 -eq 0 ]]; then
  echo "FAIL: one rank trained without running out of memory (cap $cap_mb MiB): the demo expects it not to fit" >&2
  exit 1
fi
if ! grep -q "ran out of simulated device memory" "$log1"; then
  echo "FAIL: one rank failed (exit $rc1), but not for lack of memory:" >&2
  tail -20 "$log1" >&2
  exit 1
fi
echo "-> one rank: out of memory, exit code $rc1 (as expected)"
rm -f "$log1"

echo
echo "== 3. four ranks, ZeRO-3: must fit"
log4=$(mktemp)
set +e
"${mpi[@]}" -np 4 "$lab04" "${args[@]}" --run-id "fits-$stamp-4ranks" 2>&1 | tee "$log4"
rc4=${PIPESTATUS[0]}
set -e
if [[ $rc4 -ne 0 ]] || ! grep -q "== summary ==" "$log4"; then
  echo "FAIL: four ranks did not finish (exit $rc4)" >&2
  exit 1
fi
peak=$(sed -n 's/^memory per rank: peak \([0-9.]*\) MiB.*/\1/p' "$log4")
rm -f "$log4"
echo
echo "OK: the model state of d12 (1.3 GiB) does not fit in $cap_mb MiB on one rank; with ZeRO-3 on four ranks"
echo "    rank 0 peaked at $peak MiB of $cap_mb MiB. Logs: runs/lab04/fits-$stamp-{1rank,4ranks}/"
