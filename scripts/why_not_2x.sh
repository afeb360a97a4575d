#!/usr/bin/env bash
# why_not_2x.sh — the lesson's lab in one command: the same model on 1 device and on N with FSDP (lab 04,
# ZeRO-3), a short per-device batch sweep, then bin/sl_scaling_report: tokens/s, MFU, peak memory per
# rank, data-wait and exposed-communication shares, per-rank step and compute times, the scaling
# efficiency and the verdict (bottleneck.h: loader, communication, batch, straggler, in that order).
# Lesson: labs/04_fsdp/WHY_NOT_2X.md. Checks: tests/lab04_scaling/ (one ctest per provocation).
#
#   scripts/why_not_2x.sh                          # 1 rank vs 2 ranks, 1 thread each (on CPU a core is a device)
#   scripts/why_not_2x.sh --provoke straggler      # make one cause happen, on purpose, much larger than noise
#   scripts/why_not_2x.sh --sim                    # on simulated H100s in virtual time (docs/simulation.md)
#   scripts/why_not_2x.sh --sim --blind 1          # part 2's exercise: one cause provoked, which one is not
#                                                  # shown, the table without the verdict: find it yourself
#
# Options: --build-dir DIR (default build)  --np N (default 2)  --provoke none|loader|comm|batch|straggler
#   --steps S (default 10; step 0 is warm-up)  --sweep "1 2 4 8 16" (micro-batches of the 1-device sweep)
#   --sweep-steps S (default 6)  --model NAME (default demo)  --micro-batch B (default 8)  --seq-len T
#   (default 128)  --data DIR (default data/kjv)  --out DIR (default runs/why_not_2x/<utc time>-<provoke>)
#   --track reference|learner (default reference)  --check (exit 1 unless the verdict marks the provoked
#   cause CULPRIT)  --loader-delay-ms X (loader, default 400; --sim 1; --timing-only 40)  --link PRESET, --link-slowdown F
#   (comm, default ethernet100 x 300; with --sim x 1)  --slow-ms X (straggler, default 400; --sim 0.7; --timing-only 30)  --sim (every rank a simulated GPU: --device sim,
#   --backend sim; the delays and the slow rank then take virtual time, nothing sleeps)  --sim-gpu NAME (h100)
#   --timing-only (with --sim: ops charge their time and compute nothing, so the lesson's sizes run here, e.g.
#   --model gpt2-124m --seq-len 1024 --micro-batch 4 --precision bf16)  --precision P (the runs' precision)
# Exit status: the report's (0; 1 with --check when the provoked cause is not marked CULPRIT), 1 when a run
# fails, 2 for a usage or build problem, 77 when the corpus or mpirun is missing (ctest: Skipped).
# What each provocation does to the N-device run (the 1-device run stays the healthy baseline):
#   loader     every batch fetch of every rank sleeps --loader-delay-ms (a loader far slower than the model)
#   comm       --overlap off --prefetch 0 over a simulated link --link-slowdown times slower than the preset
#   batch      --micro-batch 1 --seq-len 16 per device; the 1-device run keeps the global batch (B = N) and
#              the sweep runs at T=16 too: per-step fixed costs dominate tiny steps
#   straggler  rank 1 (the last rank) sleeps --slow-ms per micro-step inside its compute (--slow-rank)
# Runs go to --out: lab04/<run id>/rank<k>.jsonl, <run id>.out (each run's output), report.txt, report.json
# (the figures and the verdict: bin/sl_scaling_report --json) and run.json (what this script provoked).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
np=2
provoke=none
steps=10
sweep="1 2 4 8 16"
sweep_steps=6
model=demo
micro_batch=8
seq_len=128
data=data/kjv
out=""
track=reference
check=0
loader_delay_ms=""  # the provocations' defaults below: on the CPU several times the noise of a busy
link=ethernet100     # machine; on simulated GPUs (no noise, steps of a few ms) about the lesson's
link_slowdown=""     # 1.4x-instead-of-2x
slow_ms=""
sim=0
sim_gpu=h100
blind=""
timing_only=0
precision=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --np) np="$2"; shift 2 ;;
    --provoke) provoke="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --sweep) sweep="$2"; shift 2 ;;
    --sweep-steps) sweep_steps="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --micro-batch) micro_batch="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --track) track="$2"; shift 2 ;;
    --check) check=1; shift ;;
    --loader-delay-ms) loader_delay_ms="$2"; shift 2 ;;
    --link) link="$2"; shift 2 ;;
    --link-slowdown) link_slowdown="$2"; shift 2 ;;
    --slow-ms) slow_ms="$2"; shift 2 ;;
    --sim) sim=1; shift ;;
    --sim-gpu) sim=1; sim_gpu="$2"; shift 2 ;;
    --timing-only) timing_only=1; shift ;;
    --precision) precision="$2"; shift 2 ;;
    --blind) blind="$2"; shift 2 ;;
    *) sed -n '2,33p' "$0" >&2; exit 2 ;;
  esac
done

if (( timing_only && ! sim )); then
  echo "--timing-only needs --sim: only a simulated GPU can charge an op's time without computing it" >&2; exit 2
fi
case "$provoke" in none|loader|comm|batch|straggler) ;; *)
  echo "--provoke $provoke: use none, loader, comm, batch or straggler" >&2; exit 2 ;;
esac
if (( timing_only )); then  # sized for GPT-2 124M's ~90 ms step (T 1024, B 4): each cause about 1.4-1.5x
  : "${loader_delay_ms:=40}" "${slow_ms:=30}" "${link_slowdown:=1}"
elif (( sim )); then
  : "${loader_delay_ms:=1}" "${slow_ms:=0.7}" "${link_slowdown:=1}"
else
  : "${loader_delay_ms:=400}" "${slow_ms:=400}" "${link_slowdown:=300}"
fi
if [[ -n "$blind" ]]; then  # the exercise: a cause fixed per K (a table, not a secret: reading it spoils it)
  [[ "$blind" =~ ^[1-4]$ ]] || { echo "--blind $blind: use 1, 2, 3 or 4 (one exercise each)" >&2; exit 2; }
  [[ "$provoke" == none && $check == 0 ]] || { echo "--blind chooses the cause itself: drop --provoke and --check" >&2; exit 2; }
  blind_causes=(batch comm straggler loader)
  provoke=${blind_causes[$(( (blind * 3 + 1) % 4 ))]}
  steps=$(( steps > 20 ? steps : 20 ))  # the batch provocation's step counts for every K: the "timed steps"
  sweep_steps=$(( sweep_steps > 20 ? sweep_steps : 20 ))  # row would name it otherwise
fi
exe="$build_dir/bin/$track/lab04_fsdp"
report="$build_dir/bin/sl_scaling_report"
[[ -x "$exe" ]] || { echo "no $exe: cmake --build $build_dir --target lab04_fsdp_ref (learner: lab04_fsdp_learner)" >&2; exit 2; }
[[ -x "$report" ]] || { echo "no $report: cmake --build $build_dir --target sl_scaling_report" >&2; exit 2; }
(( np >= 2 )) || { echo "--np $np: compare 1 device with 2 or more" >&2; exit 2; }
# What this machine lacks (not a fault of the build): exit 77, which ctest reports as Skipped.
[[ -d "$data" ]] || { echo "SKIPPED: no $data: run scripts/prepare_corpus.sh first" >&2; exit 77; }
command -v mpirun > /dev/null || { echo "SKIPPED: no mpirun: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 77; }
cores=$(nproc)  # before OMP_NUM_THREADS is set: nproc honours it
if (( np > cores && ! sim )); then  # virtual time does not depend on the cores
  echo "WARNING: $np ranks on $cores cores: ranks share cores, so their timings say little (never trust a verdict from it)" >&2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # harmless when not root
export OMP_NUM_THREADS=1
if [[ -z "$out" && -n "$blind" ]]; then
  out="runs/why_not_2x/blind-$blind"
  rm -rf "$out"  # an exercise run again replaces its earlier run
fi
[[ -n "$out" ]] || out="runs/why_not_2x/$(date -u +%Y%m%dT%H%M%SZ)-$provoke"
mkdir -p "$out"

# --- what the provocation changes -----------------------------------------------------------------
single_b=$micro_batch
multi_extra=()
sweep_t=$seq_len
case "$provoke" in
  loader)    multi_extra=(--loader-delay-ms "$loader_delay_ms") ;;
  comm)      multi_extra=(--overlap off --prefetch 0 --link "$link" --link-slowdown "$link_slowdown") ;;
  batch)     micro_batch=1; seq_len=16; sweep_t=16; single_b=$np; sweep_steps=$(( sweep_steps > 20 ? sweep_steps : 20 ))
             steps=$(( steps > 20 ? steps : 20 )) ;;
  straggler) multi_extra=(--slow-rank $(( np - 1 )) --slow-ms "$slow_ms") ;;
esac

# One thread per rank: on a CPU one core is "one device". No sampling, one validation batch: only the
# training steps matter here. The loader is timed alone for 5 batches before training (cause 1).
common=(--model "$model" --stage 3 --threads 1 --data "$data" --log-dir "$out" --val-every 0 --val-batches 1
        --sample-tokens 0 --timeline-steps 0 --loader-alone-batches 5 --quiet)
(( sim )) && common+=(--device sim --sim-gpu "$sim_gpu")
(( timing_only )) && common+=(--timing-only)  # the lesson's sizes: nothing computed, every time and byte exact
[[ -n "$precision" ]] && common+=(--precision "$precision")

run() {  # run <run id> <ranks> <args...>: one lab04_fsdp run, its output in <out>/<run id>.out
  local id="$1" ranks="$2"; shift 2
  local launcher=()
  (( ranks > 1 )) && launcher=(mpirun --oversubscribe --bind-to none -np "$ranks")
  local backend=()
  (( sim && ranks > 1 )) && backend=(--backend sim)
  if [[ -n "$blind" ]]; then  # every run's options, not only the provoked one's: B and T would name cause 3
    echo "== ${id%%-b*}: $ranks rank(s) (blind run: its options are not shown)"  # sweep-b8 -> sweep
  else
    echo "== $id: ${launcher[*]} $exe ${*}" | sed "s|$out|<out>|g"
  fi
  if ! timeout 600 "${launcher[@]}" "$exe" "${common[@]}" "${backend[@]}" "${cal[@]}" --run-id "$id" "$@" \
      > "$out/$id.out" 2>&1; then
    echo "run $id failed; its output ($out/$id.out) ends:" >&2
    tail -20 "$out/$id.out" >&2
    exit 1
  fi
  grep -E "tokens/s \|" "$out/$id.out" | sed 's/^/   /' || true
}

t_start=$(date +%s)
cal=()  # the first run checks (or measures) the 1-thread peak; the others divide by the same file, unchecked
run single 1 --micro-batch "$single_b" --seq-len "$seq_len" --steps "$steps"
[[ -f runs/calibration/cpu_1t.json ]] && (( ! sim )) && cal=(--calibration runs/calibration/cpu_1t.json)
run multi "$np" --micro-batch "$micro_batch" --seq-len "$seq_len" --steps "$steps" "${multi_extra[@]}"
sweep_dirs=()
for b in $sweep; do
  [[ "$b" == "$single_b" ]] && continue  # the 1-device run is this sweep point
  run "sweep-b$b" 1 --micro-batch "$b" --seq-len "$sweep_t" --steps "$sweep_steps"
  sweep_dirs+=("$out/lab04/sweep-b$b")
done
echo "== runs took $(( $(date +%s) - t_start )) s; logs in $out/lab04/"
echo

expect=()
(( check == 1 )) && [[ "$provoke" != none ]] && expect=(--expect-culprit "$provoke")
if [[ -n "$blind" ]]; then
  echo "provocation: not shown (blind run $blind)" > "$out/report.txt"
else
  echo "provocation: $provoke ${multi_extra[*]}" > "$out/report.txt"
fi
printf '{"provoke": "%s", "blind": %s, "sim": %s, "timing_only": %s, "np": %s, "model": "%s", "track": "%s"}\n' \
  "$provoke" "${blind:-null}" "$( (( sim )) && echo true || echo false)" "$( (( timing_only )) && echo true || echo false)" \
  "$np" "$model" "$track" > "$out/run.json"
if (( sim )); then  # the report's every time, tokens/s and MFU are the simulated GPU's
  grep -ho "(simulated [^)]*virtual time[^)]*)" "$out/single.out" | head -1 | sed 's/^(\(.*\))$/on \1: every figure below/' \
    | tee -a "$out/report.txt"
fi
set +e
sweep_args=()
(( ${#sweep_dirs[@]} > 0 )) && sweep_args=(--sweep "${sweep_dirs[@]}")
hide=()
[[ -n "$blind" ]] && hide=(--blind)  # no verdict, and a header that reads the same for every K
"$report" --single "$out/lab04/single" --multi "$out/lab04/multi" "${sweep_args[@]}" "${expect[@]}" "${hide[@]}" \
  --json "$out/report.json" | tee -a "$out/report.txt"
rc=${PIPESTATUS[0]}
set -e
if [[ -n "$blind" ]]; then
  echo
  echo "Blind run $blind: one of the four causes was provoked in the $np-device run. Read the table in the lesson's"
  echo "order (labs/04_fsdp/WHY_NOT_2X.md \"Reading it\"), compare it with a healthy run, and answer in"
  echo "scripts/quiz 04 --part 2. ($out/run.json holds the answer: reading it first spoils the exercise.)"
fi
exit "$rc"
