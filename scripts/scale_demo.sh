#!/usr/bin/env bash
# scale_demo.sh — the instructor's scaling demonstration: the reference of every lab with scale-demo rows (its
# manifest's "scale_demo", labs/NN_name/lab.json: labs 01, 03, 04, 05, 06, 07 and 10) at 1, 2, 4, 8 ranks (as the
# hardware allows), same model and global batch at every rank count (lab 01, one device: one micro-batch per
# step; lab 05: one tensor-parallel group of all ranks, or of the largest power of two that divides the model's
# heads, the rest data-parallel replicas; lab 06: a 1F1B pipeline of one stage per rank, the global batch as
# micro-batches of --micro-batch, skipped above the model's layer count; lab 07: from 4 ranks, tp 2 x pp 2 x dp
# N/4, 1F1B over each replica's share of the global batch; lab 10: one zig-zag context-parallel group of all
# ranks, or of the largest power of two that cuts T into 2 cp chunks, CPU ranks or --sim only), ONE table.
#   scripts/scale_demo.sh                                   GPUs if present (one rank each), else CPU ranks
#   scripts/scale_demo.sh --max-ranks 2 --steps 5 --model tiny --oversubscribe-ok   (what CI runs)
#   scripts/scale_demo.sh --link infiniband --link-slowdown 1000     CPU ranks over a simulated link
#   scripts/scale_demo.sh --sim --max-ranks 4               a simulated cluster: H100s in virtual time (the
#                                                           same table on any machine, bit for bit)
#   scripts/scale_demo.sh --dry-run --labs "03 07"          each run's command line (or why it is skipped), no runs
# Options: --build-dir DIR (default build)   --data DIR (default data/kjv)   --steps N (default 20)
#   --out DIR (default runs/scale_demo/<utc time>)   --labs "03 04" (default: every lab with scale-demo rows)
#   --device auto|cpu|cuda|sim   --sim (= --device sim)   --timing-only (with --sim)
#   --sim-gpu h100|h200|a100|rtx4090 (default h100)
#   --max-ranks N (default: the GPUs, else the cores; at most 8; timing-only: 64)
#   --oversubscribe-ok (CPU: more ranks x threads than cores; those rows are marked "oversubscribed: timings not meaningful")   --threads-per-rank N (CPU;
#   default cores / max-ranks)   --model NAME, --micro-batch B, --seq-len T (defaults CPU: demo, 4, 64 (tiny: 16);
#   GPU: d12, 8, 1024)   --precision fp32|bf16   --stage S (lab 04; default 3)   --link PRESET, --link-slowdown F
#   (CPU ranks, labs 03-07; sim: replaces the sim backend's own links)   --launcher "CMD" (default "mpirun --oversubscribe --bind-to none"; a cluster:
#   "mpirun --hostfile FILE", "srun --mpi=pmix")   --timeout-s S (per run; default none)
# Writes to --out: scale_table.csv, scale_table.md, scale_plot.png, logs/<lab>/<run id>/rank<k>.jsonl and each
# run's output (lab<NN>_np<N>.out). scripts/scale_demo_table.py makes the table from the logs with the
# notebooks' reader (notebooks/scalelab_logs.py) in .venv-notebooks/, made as scripts/notebooks.sh makes it.
# A lab's rows: its program's own arguments, "args" of the manifest's "scale_demo", with {expressions} of the
# run's numbers (N ranks, B micro-batch, G global batch, S stage, heads, layers, model), and "skip" conditions
# (scripts/lib/labs.py scale_row); a one-process program (lab 01) runs at 1 rank only, without --link/--backend.
# --sim: every rank a simulated GPU (--device sim --backend sim, docs/simulation.md): times, tokens/s and MFU
# are virtual, the simulated GPU's, whatever the machine's cores and load (no rank count is oversubscribed);
# the arithmetic is real and runs on the CPU, so the defaults stay the CPU's small model.
# --sim with a model at the lesson's sizes (gpt2-124m, gpt2-350m, gpt2-1.5b, gpt-7b, gpt-70b; or --timing-only):
# timing-only runs (docs/simulation.md "Timing-only runs": time and memory, no arithmetic), up to 64 ranks
# (the default --max-ranks), bf16, micro-batch 4 x T 1024 (gpt2-*) or 1 x T 2048 (gpt-7b, gpt-70b). Nodes of
# 8 simulated GPUs: labs 05 and 07 get --ranks-per-node 8 (NVLink inside a node, InfiniBand across); labs 03,
# 04 and 06 have no such option and their ranks share one node's links. Lab 05: tp = gcd(N, heads, 8), within
# a node, the rest dp. Lab 07 (the 3D rule): tp fills a node, tp = gcd(min(8, N/2), heads) (at most N/2, so
# that pp >= 2), pp = min(4, N/tp), dp the rest: 4 ranks 2x2x1, 8 4x2x1, 16 8x2x1, 32 8x4x1, 64 8x4x2 (tp x pp
# x dp). On CPU ranks (and GPUs) lab 07 stays tp 2 x pp 2 x dp N/4. A run that does not fit the simulated
# GPU's memory is a row "does not fit" (its out-of-memory line), not a failure: gpt-7b's 105 GB of model state
# fits no single 80 GB H100, so labs 01 and 03 (one full copy per rank) show where sharding starts to matter.
#   scripts/scale_demo.sh --sim --model gpt-7b --steps 2    1 to 64 simulated H100 (docs/simulation.md, "The
#   scale demo at 64 simulated GPUs": the table, and 1330 s of wall time on 2 busy cores)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="build"
DATA="data/kjv"
MODEL=""
STEPS=20
OUT=""
LABS=""
DRY_RUN=0
MAX_RANKS=""
OVERSUB_OK=0
DEVICE="auto"
MICRO_BATCH=""
SEQ_LEN=""
PRECISION=""
TIMING_ONLY=0
STAGE=3
THREADS=""
LINK="none"
LINK_SLOWDOWN=1
SIM_GPU=h100
LAUNCHER="mpirun --oversubscribe --bind-to none"
TIMEOUT_S=0
VENV="$ROOT/.venv-notebooks"

die() { echo "[scalelab] scale_demo: $1" >&2; [[ $# -gt 1 ]] && echo "[scalelab]   hint: $2" >&2; exit 1; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value" "see scripts/scale_demo.sh --help"; }

args_given=("$@")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir|--data|--model|--steps|--out|--labs|--max-ranks|--device|--micro-batch|--seq-len|--stage|\
    --threads-per-rank|--link|--link-slowdown|--launcher|--timeout-s|--precision) need_value "$@" ;;&
    --build-dir) BUILD="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --labs) LABS="$2"; shift 2 ;;
    --max-ranks) MAX_RANKS="$2"; shift 2 ;;
    --oversubscribe-ok) OVERSUB_OK=1; shift ;;
    --device) DEVICE="$2"; shift 2 ;;
    --micro-batch) MICRO_BATCH="$2"; shift 2 ;;
    --seq-len) SEQ_LEN="$2"; shift 2 ;;
    --stage) STAGE="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --threads-per-rank) THREADS="$2"; shift 2 ;;
    --link) LINK="$2"; shift 2 ;;
    --link-slowdown) LINK_SLOWDOWN="$2"; shift 2 ;;
    --launcher) LAUNCHER="$2"; shift 2 ;;
    --timeout-s) TIMEOUT_S="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --sim) DEVICE=sim; shift ;;
    --timing-only) TIMING_ONLY=1; shift ;;
    --sim-gpu) need_value "$@"; SIM_GPU="$2"; DEVICE=sim; shift 2 ;;
    -h|--help) sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" "see scripts/scale_demo.sh --help" ;;
  esac
done
t_start=$SECONDS

is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }
for kv in "--steps $STEPS" "--timeout-s $TIMEOUT_S"; do
  is_int "${kv#* }" || die "${kv% *} '${kv#* }' is not a whole number"
done
(( STEPS >= 2 )) || die "--steps $STEPS: need at least 2 (step 0 is warm-up and not timed)"
# The labs with scale-demo rows, from their manifests (the build's labs.json where it has one).
labs_py() { python3 "$ROOT/scripts/lib/labs.py" --build-dir "$BUILD" "$@"; }
all_labs=$(labs_py list --scale-demo | tr '\n' ' ') || die "reading the labs' manifests failed (above)" \
  "python3 scripts/lib/labs.py check names what is wrong"
all_labs="${all_labs% }"
[[ -n "$LABS" ]] || LABS="$all_labs"
for lab in $LABS; do
  [[ " $all_labs " == *" $lab "* ]] || die "--labs: lab '$lab' has no scale-demo rows" "use any of \"$all_labs\""
done

# ---- device, rank counts, threads per rank ----
cores=$(nproc)
gpus=0
if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then  # the GPUs this job may use, not all the machine has
  IFS=, read -r -a visible <<< "$CUDA_VISIBLE_DEVICES"; gpus=${#visible[@]}
elif command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
build_has_cuda=0
if grep -Eq '^CMAKE_CUDA_COMPILER:[A-Z]+=/' "$BUILD/CMakeCache.txt" 2>/dev/null; then build_has_cuda=1; fi
case "$DEVICE" in
  auto)
    DEVICE=cpu
    if (( gpus > 0 )); then
      if (( build_has_cuda )); then DEVICE=cuda
      else echo "[scalelab] scale_demo: $gpus GPU(s) present but $BUILD was built without CUDA: running on CPU ranks" \
                "(rebuild with -DSL_WITH_CUDA=ON for the GPU table)" >&2; fi
    fi ;;
  cpu|sim) ;;
  cuda) (( build_has_cuda )) || die "--device cuda: $BUILD was built without CUDA" \
          "cmake -S . -B $BUILD -G Ninja -DSL_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=<sm, e.g. 90> && cmake --build $BUILD" ;;
  *) die "--device '$DEVICE'" "use auto, cpu, cuda or sim" ;;
esac
# A model at the lesson's sizes on the simulated cluster: timing-only (its arithmetic would not fit this machine).
LESSON_SIZES="gpt2-124m gpt2-350m gpt2-1.5b gpt-7b gpt-70b"
[[ "$DEVICE" == sim && " $LESSON_SIZES " == *" $MODEL "* ]] && TIMING_ONLY=1
if (( TIMING_ONLY )) && [[ "$DEVICE" != sim ]]; then
  die "--timing-only times a simulated GPU" "add --sim (--device sim)"
fi
if [[ -z "$MAX_RANKS" ]]; then
  if [[ "$DEVICE" == cuda ]]; then MAX_RANKS=$(( gpus > 0 ? gpus : 1 )); else MAX_RANKS=$cores; fi
  (( MAX_RANKS <= 8 )) || MAX_RANKS=8
  (( ! TIMING_ONLY )) || MAX_RANKS=64  # virtual time, no arithmetic: 64 ranks fit 2 cores
fi
is_int "$MAX_RANKS" && (( MAX_RANKS >= 1 )) || die "--max-ranks '$MAX_RANKS' is not a whole number >= 1"
if [[ "$DEVICE" == cuda && "$LINK" != none ]]; then
  die "--link $LINK simulates a link between CPU ranks" "drop --link on GPUs: the real interconnect is measured"
fi
if [[ "$DEVICE" == cuda && $gpus -gt 0 && $MAX_RANKS -gt $gpus && "$LAUNCHER" == mpirun\ --oversubscribe* ]]; then
  die "--max-ranks $MAX_RANKS but this machine has $gpus GPU(s) (one rank per GPU)" \
      "on a cluster pass --launcher \"mpirun --hostfile FILE\" or --launcher \"srun --mpi=pmix\""
fi
# Defaults by device: a CPU rank trains the ~1.9M-parameter demo model on short sequences; a GPU needs
# GPT-2 124M shapes (d12) at T=1024 to have enough work per step for its time to mean anything.
if [[ "$DEVICE" == cuda ]]; then
  : "${MODEL:=d12}" "${MICRO_BATCH:=8}" "${SEQ_LEN:=1024}"
elif (( TIMING_ONLY )); then  # the lesson's sizes: GPT-2's context, or 2048 tokens of a 7B/70B sequence
  : "${MODEL:=gpt2-124m}" "${PRECISION:=bf16}"
  case "$MODEL" in
    gpt-7b|gpt-70b) : "${MICRO_BATCH:=1}" "${SEQ_LEN:=2048}" ;;
    *) : "${MICRO_BATCH:=4}" "${SEQ_LEN:=1024}" ;;
  esac
else
  : "${MODEL:=demo}" "${MICRO_BATCH:=4}"
  [[ -n "$SEQ_LEN" ]] || { SEQ_LEN=64; [[ "$MODEL" == tiny ]] && SEQ_LEN=16; }  # tiny: max_seq_len 16
fi
: "${PRECISION:=fp32}"
for kv in "--micro-batch $MICRO_BATCH" "--seq-len $SEQ_LEN"; do
  is_int "${kv#* }" && (( ${kv#* } >= 1 )) || die "${kv% *} '${kv#* }' is not a whole number >= 1"
done
ranks=()
for n in 1 2 4 8 16 32 64; do (( n <= MAX_RANKS )) && ranks+=("$n"); done
largest=${ranks[-1]}
if [[ "$DEVICE" == sim ]]; then  # virtual time: the cores only decide how long the arithmetic takes
  [[ -n "$THREADS" ]] || THREADS=$(( cores / largest > 0 ? cores / largest : 1 ))
  is_int "$THREADS" && (( THREADS >= 1 )) || die "--threads-per-rank '$THREADS' is not a whole number >= 1"
fi
if [[ "$DEVICE" == cpu ]]; then
  # Every rank gets the same threads at every rank count: a rank is a fixed-size "device" (cores/max-ranks
  # of them), so N ranks have N times the compute of one and linear scaling means efficiency 1.0.
  [[ -n "$THREADS" ]] || THREADS=$(( cores / largest > 0 ? cores / largest : 1 ))
  is_int "$THREADS" && (( THREADS >= 1 )) || die "--threads-per-rank '$THREADS' is not a whole number >= 1"
  if (( largest * THREADS > cores && ! OVERSUB_OK )); then
    die "$largest ranks x $THREADS thread(s) > $cores cores: timings would not be meaningful" \
        "use --max-ranks $(( cores / THREADS > 0 ? cores / THREADS : 1 )), or add --oversubscribe-ok (those rows are marked)"
  fi
fi
GLOBAL_BATCH=$(( MICRO_BATCH * largest ))  # sequences per optimizer step at every rank count

# ---- what the runs need ----
# Lab 05 splits the heads: tp must divide n_head; lab 06 the layers: at most n_layer stages; lab 07 both
# (common/src/model/gpt2_layout.cpp presets). A lab's "skip" conditions and arguments read them.
declare -A HEADS=([tiny]=2 [demo]=4 [d12]=12 [d24]=16 [d36]=20 [d48]=25
                  [gpt2-124m]=12 [gpt2-350m]=16 [gpt2-1.5b]=25 [gpt-7b]=32 [gpt-70b]=64)
declare -A LAYERS=([tiny]=2 [demo]=4 [d12]=12 [d24]=24 [d36]=36 [d48]=48
                   [gpt2-124m]=12 [gpt2-350m]=24 [gpt2-1.5b]=48 [gpt-7b]=32 [gpt-70b]=80)
# Nodes, and lab 07's grid at N ranks (the rows' "node", "grid_tp", "grid_pp"; the rule in the header): on
# the simulated cluster nodes of 8 GPUs, tensor parallelism inside one; elsewhere the ranks of one machine.
NODE=$largest
(( TIMING_ONLY )) && NODE=8
[[ "$DEVICE" == sim ]] && (( NODE > 8 )) && NODE=8
gcd() { local a=$1 b=$2 t; while (( b )); do t=$((a % b)); a=$b; b=$t; done; echo "$a"; }
grid_of() {  # "tp pp" of lab 07's row at $1 ranks
  local n=$1 tp
  if (( ! TIMING_ONLY || n < 4 )); then echo "2 2"; return; fi
  tp=$(( n / 2 < 8 ? n / 2 : 8 )); tp=$(gcd "$tp" "${HEADS[$MODEL]:-1}")
  echo "$tp $(( n / tp < 4 ? n / tp : 4 ))"
}
[[ -n "${HEADS[$MODEL]:-}" ]] || die "--model '$MODEL' is not a preset" "use one of: ${!HEADS[*]}"
# per lab: its reference program; 1 for a one-process program; 1 if it takes --ranks-per-node
declare -A PROG SINGLE NODES
for lab in $LABS; do
  eval "$(labs_py shell "$lab" --track reference)"
  PROG[$lab]="$lab_exe"; SINGLE[$lab]="$lab_single_process"
  target="${lab_target:-lab${lab}_${lab_name}_ref}"
  [[ -n "$lab_exe" && -x "$lab_exe" ]] || die "lab $lab's reference program ${lab_exe:-(not in $BUILD/labs.json)} not found" \
    "build first: cmake -S . -B $BUILD -G Ninja && cmake --build $BUILD --target $target (or pass --build-dir)"
  NODES[$lab]=0
  [[ "$("$lab_exe" --help 2>/dev/null || true)" == *--ranks-per-node* ]] && NODES[$lab]=1
done
read -r -a launcher <<< "$LAUNCHER"
command -v "${launcher[0]}" >/dev/null 2>&1 || die "launcher '${launcher[0]}' not found" \
  "install OpenMPI (scripts/install_deps.sh), or pass --launcher \"srun ...\""
np_flag=-np; [[ "$(basename "${launcher[0]}")" == srun ]] && np_flag=-n
if [[ $DRY_RUN -eq 0 && ! -f "$DATA/val_000000.bin" ]]; then
  [[ "$DATA" == data/kjv || "$DATA" == "$ROOT/data/kjv" ]] || die "$DATA holds no token shards" \
    "scripts/prepare_corpus.sh --text FILE... --out $DATA"
  scripts/prepare_corpus.sh --build-dir "$BUILD"
fi
[[ $EUID -ne 0 ]] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---- the virtual environment: the same one, made the same way, as scripts/notebooks.sh (scripts/lib/venv.sh) ----
source "$ROOT/scripts/lib/venv.sh"
(( DRY_RUN )) || sl_notebooks_venv "$VENV" scale_demo

[[ -n "$OUT" ]] || OUT="runs/scale_demo/$(date -u +%Y%m%dT%H%M%SZ)"
(( DRY_RUN )) || mkdir -p "$OUT"
OUT="$(realpath -m "$OUT")"
LOGS="$OUT/logs"
manifest="$OUT/manifest.tsv"  # one line per run, for scripts/scale_demo_table.py
(( DRY_RUN )) || printf 'lab\tranks\tthreads\toversubscribed\tstatus\trun_dir\toutput\n' > "$manifest"

shown_device="$DEVICE"
[[ "$DEVICE" == cpu ]] && shown_device="cpu, $THREADS thread(s) per rank, $cores cores"
[[ "$DEVICE" == sim ]] && shown_device="simulated $SIM_GPU, virtual time"
echo "== scale_demo: labs $LABS | ranks ${ranks[*]} | $shown_device |" \
     "model $MODEL, $PRECISION | global batch $GLOBAL_BATCH x T=$SEQ_LEN | $STEPS steps | link $LINK$([[ $LINK != none ]] && echo "/$LINK_SLOWDOWN")"
load="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "")"
echo "   load average $load on $cores cores before the runs (other work on the machine slows every row)"

# ---- the runs ----
common=(--data "$DATA" --model "$MODEL" --seq-len "$SEQ_LEN" --steps "$STEPS" --device "$DEVICE" --quiet
        --precision "$PRECISION"
        --val-every 0 --val-batches 1 --sample-tokens 0 --log-dir "$LOGS")
(( TIMING_ONLY )) && common+=(--timing-only)
[[ "$DEVICE" == cpu || "$DEVICE" == sim ]] && common+=(--threads "$THREADS")
[[ "$DEVICE" == sim ]] && common+=(--sim-gpu "$SIM_GPU")
failed=0
for lab in $LABS; do
  counts=("${ranks[@]}"); (( SINGLE[$lab] )) && counts=(1)  # a one-process program: lab 01 is one device
  for np in "${counts[@]}"; do
    run_id="scale-lab$lab-np$np"
    # The lab's own arguments at np ranks, or why it skips them: its manifest's "scale_demo" (its "why" says why
    # those arguments), evaluated by scripts/lib/labs.py with this run's numbers.
    read -r grid_tp grid_pp <<< "$(grid_of "$np")"
    row_text=$(labs_py scale-row "$lab" N="$np" B="$MICRO_BATCH" G="$GLOBAL_BATCH" S="$STAGE" \
               heads="${HEADS[$MODEL]}" layers="${LAYERS[$MODEL]}" model="$MODEL" node="$NODE" \
               grid_tp="$grid_tp" grid_pp="$grid_pp" T="$SEQ_LEN" device="$DEVICE") \
      || die "lab $lab's scale-demo row at $np ranks (above)" "python3 scripts/lib/labs.py check"
    mapfile -t row <<< "$row_text"
    args=("${common[@]}" --run-id "$run_id" "${row[@]:1}")
    if (( ! SINGLE[$lab] )); then
      args+=(--link "$LINK" --link-slowdown "$LINK_SLOWDOWN")
      [[ "$DEVICE" == cuda && $np -gt 1 ]] && args+=(--backend nccl)
      [[ "$DEVICE" == sim && $np -gt 1 ]] && args+=(--backend sim)
      [[ "$DEVICE" == sim && $np -gt 1 ]] && (( NODES[$lab] )) && args+=(--ranks-per-node 8)
    fi
    oversub=0
    [[ "$DEVICE" == cpu ]] && (( np * THREADS > cores )) && oversub=1
    output="$OUT/lab${lab}_np$np.out"
    if [[ "${row[0]}" == skip ]]; then  # e.g. lab 06 above the model's layers, lab 07 below 4 ranks
      printf '   lab %s at %d rank%s: skipped (%s)\n' "$lab" "$np" "$([[ $np == 1 ]] || echo s)" "${row[1]}"
      (( DRY_RUN )) && continue
      echo "skipped: ${row[1]}" > "$output"  # the table's note
      printf '%s\t%d\t%s\t%d\t%s\t%s\t%s\n' "$lab" "$np" "${THREADS:-}" "$oversub" skipped \
        "$LOGS/lab$lab/$run_id" "$output" >> "$manifest"
      continue
    fi
    if (( DRY_RUN )); then
      printf '   lab %s at %d rank%s:' "$lab" "$np" "$([[ $np == 1 ]] || echo s)"
      printf ' %q' "${launcher[@]}" "$np_flag" "$np" "${PROG[$lab]}" "${args[@]}"; echo
      continue
    fi
    rm -rf "$LOGS/lab$lab/$run_id"  # a rerun into the same --out replaces, not appends
    wrap=(); (( TIMEOUT_S > 0 )) && wrap=(timeout "$TIMEOUT_S")
    t0=$SECONDS
    status=ok
    "${wrap[@]}" "${launcher[@]}" "$np_flag" "$np" "${PROG[$lab]}" "${args[@]}" > "$output" 2>&1 || status=failed
    # On a simulated GPU, memory is a result: a layout too big for it is a row that says so, not a failure.
    [[ "$status" == failed && "$DEVICE" == sim ]] && grep -q "out of memory on sim" "$output" && status=oom
    printf '   lab %s at %d rank%s: %s in %d s%s\n' "$lab" "$np" "$([[ $np == 1 ]] || echo s)" \
      "$([[ $status == oom ]] && echo "does not fit the simulated GPU's memory" || echo "$status")" \
      $((SECONDS - t0)) "$([[ $oversub == 1 ]] && echo " (oversubscribed)")"
    if [[ "$status" == failed ]]; then
      failed=$((failed + 1))
      tail -n 15 "$output" | sed 's/^/     | /' >&2
    fi
    printf '%s\t%d\t%s\t%d\t%s\t%s\t%s\n' "$lab" "$np" "${THREADS:-}" "$oversub" "$status" \
      "$LOGS/lab$lab/$run_id" "$output" >> "$manifest"
  done
done

(( ! DRY_RUN )) || exit 0

# ---- the table and the plot ----
{ printf 'scripts/scale_demo.sh'; printf ' %q' "${args_given[@]}"; echo; } > "$OUT/command.txt"
"$VENV/bin/python" scripts/scale_demo_table.py --manifest "$manifest" --out "$OUT" --cores "$cores" \
  --device "$DEVICE" --load "$load" --wall-s "$((SECONDS - t_start))" --command "$(cat "$OUT/command.txt")" \
  || die "making the table failed (above)" "the run logs are in $LOGS"
echo "   total $((SECONDS - t_start)) s"
(( failed == 0 )) || die "$failed run(s) failed: their rows say FAILED; outputs in $OUT/lab*_np*.out"
