#!/usr/bin/env bash
# notebooks.sh — execute the notebooks (notebooks/*.ipynb) headless, as CI does, and write their plots as PNG.
#   scripts/notebooks.sh                  the notebooks on your own runs (runs/lab01, runs/lab03, ...)
#   scripts/notebooks.sh --make-logs      first make short CPU runs in a temp dir and point the notebooks at them:
#                                         each lab's "notebook_logs" snippet (labs/NN_name/lab.json), e.g.
#                                         notebooks/logs/03_ddp.sh (labs 03 and 04 at 1 and 2 ranks with
#                                         timelines, lab 05's quick link sweep, lab 06's bubble sweep at 2 stages,
#                                         lab 07's 2 x 2 x 2 grid in two orders at 8 ranks, lab 08's poisoned run)
#   scripts/notebooks.sh --list           the labs, their notebooks and log snippets (from the manifests); no runs
# Options: --build-dir DIR (default build; holds the reference programs of the labs with notebooks: its labs.json),
#          --runs-root DIR (the logs to read; default runs), --out DIR (executed notebooks + plots; default a temp dir).
# The notebooks are those the labs' manifests name ("notebooks"), in lab order. The Python packages are pinned
# in notebooks/requirements.txt and installed into .venv-notebooks/ (made once, reinstalled when that file
# changes). Fails when a notebook is committed with outputs or a cell raises.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="build"
RUNS_ROOT="$ROOT/runs"
OUT=""
MAKE_LOGS=0
LIST=0
VENV="$ROOT/.venv-notebooks"

die() { echo "[scalelab] notebooks: $1" >&2; [[ $# -gt 1 ]] && echo "[scalelab]   hint: $2" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --make-logs) MAKE_LOGS=1; shift ;;
    --list) LIST=1; shift ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --runs-root) RUNS_ROOT="$(realpath -m "$2")"; shift 2 ;;
    --out) OUT="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" "see scripts/notebooks.sh --help" ;;
  esac
done
t_start=$SECONDS

# ---- the labs with notebooks, from their manifests (the build's labs.json where it has one) ----
labs_py() { python3 "$ROOT/scripts/lib/labs.py" --build-dir "$BUILD" "$@"; }
LABS=$(labs_py list --notebooks) || die "reading the labs' manifests failed (above)" "python3 scripts/lib/labs.py check"
NOTEBOOKS=()
for lab in $LABS; do
  eval "$(labs_py shell "$lab")"
  read -r -a nbs <<< "$lab_notebooks"
  NOTEBOOKS+=("${nbs[@]}")
  [[ "$LIST" == 0 ]] || echo "lab $lab ($lab_title): ${nbs[*]}; runs for --make-logs: ${lab_notebook_logs:-none}"
done
[[ "$LIST" == 0 ]] || exit 0

# ---- the virtual environment (pinned requirements; scripts/lib/venv.sh) ----
source "$ROOT/scripts/lib/venv.sh"
sl_notebooks_venv "$VENV" notebooks
PY="$VENV/bin/python"

# ---- notebooks are committed without outputs ----
"$PY" notebooks/execute.py --check-clean "${NOTEBOOKS[@]}" || exit 1

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sl-notebooks.XXXXXX")"
[[ -n "$OUT" ]] || OUT="$tmp/out"

# ---- short CPU runs to plot ----
if [[ "$MAKE_LOGS" == 1 ]]; then
  t0=$SECONDS
  for lab in $LABS; do  # the reference programs the runs need
    eval "$(labs_py shell "$lab")"
    [[ -z "$lab_notebook_logs" || -x "$lab_exe" ]] || die "lab $lab's reference program ${lab_exe:-?} not found" \
      "build first: cmake -S . -B $BUILD -G Ninja && cmake --build $BUILD (or pass --build-dir)"
  done
  [[ -f data/kjv/val_000000.bin ]] || scripts/prepare_corpus.sh --build-dir "$BUILD"
  RUNS_ROOT="$tmp/runs"
  # What every snippet may use: PROGRAM (the lab's reference program), BUILD, RUNS_ROOT, tmp, die, and
  # COMMON: the demo model on short sequences, loss curves that visibly fall in seconds.
  COMMON=(--data data/kjv --model demo --seq-len 64 --val-every 10 --val-batches 2 --sample-tokens 0 --quiet
          --log-dir "$RUNS_ROOT")
  # cached_calibration sets CAL to the CPU peak the runs before it cached (1 thread), where there is one.
  cached_calibration() {
    CAL=()
    if [[ -f runs/calibration/cpu_1t.json ]]; then CAL=(--calibration runs/calibration/cpu_1t.json); fi
  }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  echo "== notebooks: short CPU runs into $RUNS_ROOT"
  for lab in $LABS; do
    eval "$(labs_py shell "$lab")"
    [[ -n "$lab_notebook_logs" ]] || continue
    PROGRAM="$lab_exe"
    t_lab=$SECONDS
    source "$ROOT/$lab_notebook_logs"
    echo "   lab $lab runs made in $((SECONDS - t_lab)) s ($lab_notebook_logs)"
  done
  echo "   runs made in $((SECONDS - t0)) s"
fi

# ---- the plots' own test: a stacked memory bar is memory_current_bytes, on synthetic records and these runs ----
"$PY" notebooks/test_scalelab_logs.py --runs-root "$RUNS_ROOT" || die "notebooks/test_scalelab_logs.py failed (above)" \
  "a memory plot stacks a key that is not an allocator category (notebooks/scalelab_logs.py _MEMORY_TOTALS)"

# ---- execute every notebook ----
echo "== notebooks: executing ${NOTEBOOKS[*]} on $RUNS_ROOT"
t0=$SECONDS
"$PY" notebooks/execute.py --runs-root "$RUNS_ROOT" --out "$OUT" "${NOTEBOOKS[@]}" \
  2> >(grep -v "Kernel is running over TCP" >&2) \
  || die "a notebook failed (above); its executed copy is in $OUT" "open it in Jupyter to see the failing cell"
echo "   executed in $((SECONDS - t0)) s; notebooks and PNG plots in $OUT (total $((SECONDS - t_start)) s)"
