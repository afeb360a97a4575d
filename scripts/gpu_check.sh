#!/usr/bin/env bash
# scripts/gpu_check.sh — the one GPU check (docs/cuda_backend.md "Running the GPU check"). On a machine
# with an NVIDIA GPU, the CUDA toolkit, CMake, ninja, a C++ compiler and python3 (PyTorch for the
# comparison columns), and no system packages beyond that when deps/ is there (scripts/pack_gpu_deps.sh
# fills it on a Debian machine), it:
#   1. checks the tools and deps/, and reads the GPU (nvidia-smi) to build for its compute capability;
#   2. builds only what it runs (reference track): the GPU tests, lab 01's program, bench_lab01 and lab 04's
#      program (with MPI where mpirun is on PATH);
#   3. runs `ctest -L gpu`; failures are rerun with SL_SYNC_LAUNCH=1 so an error names its kernel;
#   4. trains lab 01 for 8 steps on the GPU on the KJV shards: d12 and d24, fp32 and bf16-compute (the bf16
#      tensor cores), T = 1024; then lab 04 (ZeRO-3, bf16-mixed: the precisions its memory estimator models)
#      on lab 01's d12 bf16 case (same global batch, T, steps): 1 rank, and, where
#      Open MPI is installed, 2 MPI ranks sharing the GPU (--backend mpi): tokens/s, MFU, memory per rank;
#   5. times ours with the flash-style attention (bench_flash), then benchmarks ours against PyTorch eager
#      and torch.compile on the same shapes (bench/bench_pytorch.py);
#   6. prints one short table, writes it to --out, and appends a row to docs/gpu_runs.md.
# Each phase runs under a hard timeout inside one budget (default 450 s: under 8 minutes on an H200, build
# included); what the budget cuts is listed as skipped.
#
#   scripts/gpu_check.sh [--out DIR] [--budget S] [--arch SM] [--build-dir DIR] [--deps DIR] [--jobs N]
#   scripts/gpu_check.sh --build-only   phases 1-3 only; on a machine without a GPU this is the rehearsal:
#                                       it proves the build with deps/ and stops with "no GPU visible"
#   scripts/gpu_check.sh --rehearse-on-cpu   all phases, 4-5 on the CPU with tiny sizes: tests this script
#                                       itself on a machine without a GPU (its numbers mean nothing; no row)
#     --out DIR     where the results go (default <build-dir>/gpu_check): summary.txt, gpu_runs_row.md,
#                   bench.jsonl, flash.jsonl, lab01.jsonl, lab04.jsonl (every rank's summary), gpu_check.log (everything
#                   the phases printed)
#     --arch SM     CMAKE_CUDA_ARCHITECTURES (default: the GPU's compute capability; 90 without a GPU)
#     SL_GIT_SHA=<sha>  names the commit in the row when the tree is a copy without .git
#     PYTHON=<python>   the interpreter with PyTorch (default python3)
# Exit status: 0 passed; 1 something failed; 2 a prerequisite is missing (the message says what, and where
# to put it); 3 no GPU visible; 4 nothing failed but the budget cut something short.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUDGET_S=450
BUILD_DIR="$ROOT/build-gpucheck"
DEPS="$ROOT/deps"
ARCH=""
JOBS=$(nproc 2>/dev/null || echo 4)
OUT_DIR=""
BUILD_ONLY=0
REHEARSE=0
PY=${PYTHON:-python3}
RESERVE_S=15  # seconds kept for the summary

usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }  # the head comment
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT_DIR="$2"; shift 2 ;;
    --budget) BUDGET_S="$2"; shift 2 ;;
    --arch) ARCH="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$(realpath -m "$2")"; shift 2 ;;
    --deps) DEPS="$(realpath -m "$2")"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --build-only|--no-gpu-ok) BUILD_ONLY=1; shift ;;
    --rehearse-on-cpu) REHEARSE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
OUT_DIR="$(realpath -m "${OUT_DIR:-$BUILD_DIR/gpu_check}")"
WORK="$BUILD_DIR/gpu_check_work"  # per-phase logs and lab 01 runs (not copied to --out)
mkdir -p "$OUT_DIR" "$WORK" || { echo "gpu_check: cannot create $OUT_DIR or $WORK" >&2; exit 2; }
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"
rm -f "$OUT_DIR/summary.txt" "$OUT_DIR/gpu_runs_row.md" "$OUT_DIR/bench.jsonl" "$OUT_DIR/flash.jsonl" \
  "$OUT_DIR/lab01.jsonl" "$OUT_DIR/lab04.jsonl"

T0=$(date +%s)
RUN_TAG="gpucheck-$(date -u +%Y%m%dT%H%M%SZ)"
say() { echo "[gpu_check] $*" | tee -a "$LOG"; }
left() { echo $(( T0 + BUDGET_S - $(date +%s) )); }
SKIPPED=()  # "what (why)", printed under the table
NOTES=()    # "what (why)": left out by design, not by the budget (printed as [optional]; not PARTIAL)

# phase NAME CAP_S MIN_S CMD...: runs CMD under a hard timeout of min(CAP_S, budget left - reserve), its
# output into $WORK/NAME.log and gpu_check.log, stdin from /dev/null (mpirun reads stdin: under timeout,
# in a background process group, a terminal would stop it). Skipped (status 125) when less than MIN_S is left.
# Status: CMD's, 124 when it was cut by the timeout.
phase() {
  local name=$1 cap=$2 min=$3
  shift 3
  local t=$(( $(left) - RESERVE_S ))
  (( t > cap )) && t=$cap
  if (( t < min )); then
    SKIPPED+=("$name (time budget: ${t} s left, needs ${min} s)")
    say "skip $name: ${t} s of the budget left"
    return 125
  fi
  say "$name (timeout ${t} s)"
  echo "\$ $*" >> "$LOG"
  local t1 rc dt
  t1=$(date +%s)
  timeout -k 10 "$t" "$@" < /dev/null > "$WORK/$name.log" 2>&1
  rc=$?
  dt=$(( $(date +%s) - t1 ))
  cat "$WORK/$name.log" >> "$LOG"
  if (( rc == 124 || rc == 137 )); then
    rc=124
    SKIPPED+=("$name (cut by its ${t} s timeout)")
    say "$name: TIMED OUT after ${dt} s; last lines:"
    tail -n 8 "$WORK/$name.log" | sed 's/^/    /'
  elif (( rc != 0 )); then
    say "$name: FAILED (exit $rc) after ${dt} s; last lines:"
    tail -n 25 "$WORK/$name.log" | sed 's/^/    /'
  else
    say "$name: ok (${dt} s)"
  fi
  return $rc
}

# =============================================================================================
# 1. Prerequisites: say exactly what is missing and where to put it; then the GPU.
MISSING=()
PACK_HINT="run scripts/pack_gpu_deps.sh on a Debian machine and carry deps/ here (device tool: carry [\"deps\"])"

command -v timeout >/dev/null 2>&1 || MISSING+=("timeout (GNU coreutils): needed to bound each phase")
if command -v cmake >/dev/null 2>&1; then
  CMAKE_VER=$(cmake --version | head -n 1 | awk '{print $3}')
  if [[ "$(printf '%s\n' 3.25 "$CMAKE_VER" | sort -V | head -n 1)" != 3.25 ]]; then
    MISSING+=("cmake >= 3.25 (found $CMAKE_VER): put a newer cmake first on PATH (the pip 'cmake' wheel has one)")
  fi
else
  MISSING+=("cmake >= 3.25: put it on PATH (the pip 'cmake' wheel has one)")
fi
if command -v ninja >/dev/null 2>&1; then
  GEN=Ninja
elif command -v make >/dev/null 2>&1; then
  GEN="Unix Makefiles"
  say "note: ninja not found, using make (slower); put ninja on PATH (the pip 'ninja' wheel has one)"
else
  MISSING+=("ninja (or make): put it on PATH (the pip 'ninja' wheel has one)")
fi
CXX_BIN=${CXX:-$(command -v c++ || command -v g++ || command -v clang++ || true)}
[[ -n "$CXX_BIN" ]] || MISSING+=("a C++17 compiler with OpenMP (g++ >= 9): put it on PATH or set CXX")
NVCC=${CUDACXX:-$(command -v nvcc || true)}
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
if [[ -n "$NVCC" && -x "$(command -v "$NVCC" || true)" ]]; then
  NVCC_CUDA=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n 1)
else
  NVCC_CUDA=""
  MISSING+=("nvcc${NVCC:+ ($NVCC is not executable)} (the CUDA toolkit, 12 or newer): put <toolkit>/bin on PATH or set CUDACXX=/usr/local/cuda/bin/nvcc")
fi
command -v "$PY" >/dev/null 2>&1 ||
  MISSING+=("$PY: configure needs python3 (tests/lint) and the benchmark needs it with PyTorch (or set PYTHON)")

# deps/: what the machine lacks, packed on a Debian machine. Without it, the system's packages.
if [[ -d "$DEPS" ]]; then
  # A copy that dropped the link (some transfers do): make it again.
  if [[ ! -e "$DEPS/lib/libopenblas.so" && -e "$DEPS/lib/libopenblas.so.0" ]]; then
    ln -sf libopenblas.so.0 "$DEPS/lib/libopenblas.so" 2>/dev/null || cp "$DEPS/lib/libopenblas.so.0" "$DEPS/lib/libopenblas.so"
  fi
  absent=()
  for f in include/CLI/CLI.hpp include/nlohmann/json.hpp include/gtest/gtest.h include/cblas.h include/zlib.h \
           lib/libopenblas.so lib/libopenblas.so.0 lib/libgtest.a lib/libgtest_main.a lib/libz.a; do
    [[ -e "$DEPS/$f" ]] || absent+=("$f")
  done
  [[ ${#absent[@]} -eq 0 ]] || MISSING+=("in $DEPS: ${absent[*]}: $PACK_HINT")
  DATA="$DEPS/data/kjv"
  need_glibc=$(sed -n 's/^glibc_min=//p' "$DEPS/MANIFEST.txt" 2>/dev/null)
  have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [[ -n "$need_glibc" && -n "$have_glibc" && "$need_glibc" != unknown &&
        "$(printf '%s\n' "$need_glibc" "$have_glibc" | sort -V | head -n 1)" != "$need_glibc" ]]; then
    MISSING+=("glibc >= $need_glibc for deps/lib (this machine has $have_glibc): pack deps/ on an older Debian")
  fi
  # libgtest.a was compiled on the Debian machine; an older compiler's libstdc++ may lack what it uses.
  packed_gcc=$(sed -n 's/^compiler_of_static_libs=\([0-9]*\).*/\1/p' "$DEPS/MANIFEST.txt" 2>/dev/null)
  have_gcc=$("${CXX_BIN:-c++}" -dumpversion 2>/dev/null | cut -d. -f1)
  if [[ -n "$packed_gcc" && -n "$have_gcc" ]] && "${CXX_BIN:-c++}" --version 2>/dev/null | grep -qi gcc &&
     (( have_gcc < packed_gcc )); then
    say "note: deps/lib/libgtest.a was compiled by gcc $packed_gcc, this compiler is gcc $have_gcc: if linking the tests fails on libstdc++ symbols, pack deps/ on an older Debian"
  fi
  DEPS_ARGS=(-DSL_HEADER_LIBS_DIR="$DEPS/include" -DSL_OPENBLAS_DIR="$DEPS" -DGTest_ROOT="$DEPS" -DZLIB_ROOT="$DEPS")
  export LD_LIBRARY_PATH="$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libopenblas and what it needs
else
  say "no $DEPS: using the system's packages (configure names what is missing; without them: $PACK_HINT)"
  DATA="$ROOT/data/kjv"
  DEPS_ARGS=()
fi
if ! compgen -G "$DATA/train_*.bin" >/dev/null || ! compgen -G "$DATA/val_*.bin" >/dev/null; then
  if (( BUILD_ONLY )); then
    say "note: no token shards in $DATA (lab 01 needs them; --build-only does not run it)"
  else
    MISSING+=("token shards $DATA/train_*.bin, val_*.bin: $PACK_HINT (or scripts/prepare_corpus.sh)")
  fi
fi

# The GPU: name, compute capability, driver; the CUDA version the driver supports.
GPU_NAME="" GPU_CC="" DRIVER="" DRIVER_CUDA=""
if command -v nvidia-smi >/dev/null 2>&1; then
  q=$(timeout 30 nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  if [[ -z "$q" || "$q" == *"not a valid field"* ]]; then  # drivers before compute_cap existed
    q=$(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    IFS=',' read -r GPU_NAME DRIVER <<< "$q"
  else
    IFS=',' read -r GPU_NAME GPU_CC DRIVER <<< "$q"
  fi
  GPU_NAME=$(echo "$GPU_NAME" | xargs) GPU_CC=$(echo "$GPU_CC" | xargs) DRIVER=$(echo "$DRIVER" | xargs)
  DRIVER_CUDA=$(timeout 30 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
  why_no_gpu="nvidia-smi lists no GPU"
else
  why_no_gpu="nvidia-smi not found"
fi
if [[ -z "$ARCH" ]]; then
  if [[ -n "$GPU_CC" ]]; then ARCH=${GPU_CC//./}           # 9.0 -> 90
  elif [[ -n "$GPU_NAME" ]]; then ARCH=native              # CMake asks the visible GPU
  else ARCH=90; fi                                         # no GPU: H100/H200
fi
if [[ -n "$GPU_NAME" ]]; then
  say "GPU: $GPU_NAME, compute capability ${GPU_CC:-?}, driver ${DRIVER:-?} (CUDA ${DRIVER_CUDA:-?}); nvcc ${NVCC_CUDA:-?}; building for sm ${ARCH}"
fi

if [[ ${#MISSING[@]} -gt 0 ]]; then
  say "MISSING — nothing was built:"
  for m in "${MISSING[@]}"; do say "  - $m"; done
  exit 2
fi
if [[ -z "$GPU_NAME" && $BUILD_ONLY -eq 0 && $REHEARSE -eq 0 ]]; then
  say "no GPU visible ($why_no_gpu): nothing to check on this machine."
  say "  hint: run this on a machine with an NVIDIA GPU; to rehearse the build here: scripts/gpu_check.sh --build-only"
  exit 3
fi

# =============================================================================================
# 2. Configure and build the reference track's GPU programs only.
# MPI only where Open MPI's mpirun is on PATH (lab 04's 2 ranks sharing the GPU); elsewhere the build is
# the same as without lab 04's second case. Configure says whether it found MPI's headers and library.
MPIRUN="" MPI_OPT=OFF
if command -v mpirun >/dev/null 2>&1; then
  if mpirun --version 2>/dev/null | grep -qi "open mpi"; then
    MPIRUN=$(command -v mpirun) MPI_OPT=ON
  else
    NOTES+=("lab04 2 ranks (mpirun is not Open MPI's: the phase uses Open MPI's --oversubscribe --bind-to none)")
  fi
else
  NOTES+=("lab04 2 ranks (no mpirun: Open MPI is not installed; apt-get install openmpi-bin libopenmpi-dev)")
fi
CFG=(-S "$ROOT" -B "$BUILD_DIR" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DSL_WITH_CUDA=ON
     -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$NVCC" -DSL_WITH_MPI="$MPI_OPT" -DSL_BUILD_LEARNER=OFF
     -DSL_BUILD_TESTS=ON "${DEPS_ARGS[@]}")
TARGETS=(test_ops_cuda test_attention_flash_cuda test_memory_cuda lab01_single_device_ref bench_lab01 lab04_fsdp_ref)  # every program with a `gpu` test, and what 4-5 run
BUILD_MPI=0  # 1: configure found MPI (lab 04 can run 2 ranks with --backend mpi)
BUILD_OK=0 BUILD_STATUS=failed  # ok, failed, or cut (by the budget: not a failure)
phase configure 150 20 cmake "${CFG[@]}"
rc=$?
(( rc == 124 || rc == 125 )) && BUILD_STATUS=cut
if (( rc == 0 )); then
  grep -h "scalelab:" "$WORK/configure.log" | sed 's/^/    /'
  if [[ -n "$MPIRUN" ]]; then
    if grep -q "scalelab: .*| MPI on |" "$WORK/configure.log"; then
      BUILD_MPI=1
    else
      NOTES+=("lab04 2 ranks (mpirun found, but configure found no MPI library: apt-get install libopenmpi-dev)")
    fi
  fi
  phase build 330 30 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
  rc=$?
  (( rc == 124 || rc == 125 )) && BUILD_STATUS=cut
  if (( rc == 0 )); then
    BUILD_OK=1 BUILD_STATUS=ok
    # Where the libraries come from (deps/lib when deps/ is used), and nothing missing at run time.
    libs=$(ldd "$BUILD_DIR/bin/bench_lab01" "$BUILD_DIR/bin/reference/lab04_fsdp" 2>&1)
    echo "$libs" >> "$LOG"
    echo "$libs" | grep -E "openblas|gfortran|quadmath|gomp|cublas|cudart|libmpi" | sed 's/ (0x.*//; s/^\s*/    /' |
      awk '!seen[$0]++'
    if echo "$libs" | grep -q "not found"; then
      say "FAILED: libraries not found at run time:"
      echo "$libs" | grep "not found" | sed 's/^/    /'
      say "  hint: $PACK_HINT"
      BUILD_OK=0 BUILD_STATUS=failed
    fi
  fi
elif [[ $BUILD_STATUS == failed ]]; then
  say "  hint: the lines above name what configure did not find; a machine without system packages needs deps/: $PACK_HINT"
fi

# =============================================================================================
# 3. The GPU tests (each skips visibly without a GPU; on a GPU machine a skip counts against the check).
TESTS_STATUS=not_run TESTS_TOTAL=0 TESTS_FAILED=0 TESTS_SKIPPED=0 TESTS_PASSED=0 SYNC_RERUN=""
if (( BUILD_OK )); then
  ctest_j=$(( JOBS < 8 ? JOBS : 8 ))
  phase tests 150 20 ctest --test-dir "$BUILD_DIR" -L gpu -j "$ctest_j" --output-on-failure --no-tests=error
  rc=$?
  case $rc in 0) TESTS_STATUS=ok ;; 124|125) TESTS_STATUS=cut ;; *) TESTS_STATUS=failed ;; esac
  summary_line=$(grep -E "tests passed, [0-9]+ tests? failed out of [0-9]+" "$WORK/tests.log" | tail -n 1)
  if [[ -n "$summary_line" ]]; then
    TESTS_TOTAL=$(echo "$summary_line" | sed -E 's/.* out of ([0-9]+).*/\1/')
    TESTS_FAILED=$(echo "$summary_line" | sed -E 's/.*, ([0-9]+) tests? failed.*/\1/')
  fi
  TESTS_SKIPPED=$(grep -cE "Test +#[0-9]+: .*Skipped" "$WORK/tests.log")
  TESTS_PASSED=$(grep -cE "Test +#[0-9]+: .* Passed" "$WORK/tests.log")
  say "tests: $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped (of $TESTS_TOTAL)"
  if [[ "$TESTS_STATUS" == failed && $TESTS_FAILED -gt 0 ]]; then
    # Kernel launches are asynchronous: an error surfaces at a later call. Synchronous launches name it.
    phase tests_sync 90 15 env SL_SYNC_LAUNCH=1 ctest --test-dir "$BUILD_DIR" --rerun-failed --output-on-failure
    case $? in 0) SYNC_RERUN="passed with SL_SYNC_LAUNCH=1" ;; 124|125) SYNC_RERUN="rerun cut" ;;
               *) SYNC_RERUN="failed again with SL_SYNC_LAUNCH=1" ;; esac
  fi
fi

# =============================================================================================
# 4-5. Lab 01 on the GPU, lab 04 on lab 01's d12 bf16 case, then ours against PyTorch (skipped by
# --build-only or without a GPU).
# Lab 01: 8 steps each (1 warm-up), enough to see the validation loss fall and the step time settle;
# T = 1024 throughout; lr 1e-3 (not the demo's 2e-3) so that d24's first steps stay stable. Bench: d24 first, since bf16 d24 at T = 1024 is the issue's target.
# bf16 means bf16-compute (bf16 matmul operands on the tensor cores) for lab 01 and the bench; lab 04 runs
# bf16-mixed (--precision bf16), since its memory estimator models fp32 and bf16-mixed only.
# Lab 04: LAB01_CASES[1] (d12, bf16-mixed), ZeRO-3, the same global batch B, T, steps and schedule, so a step is the
# same work on the GPU as lab 01's: 1 rank, then 2 MPI ranks sharing the GPU (micro-batch B/2 each); no
# loader-alone timing, no sample. Timeouts like lab 01's: 75 s for 1 rank, 90 s for 2 (they also start MPI
# and stage every collective through host memory: docs/communicator.md). They run before the bench, so on a
# slow machine the budget cuts the bench first.
DEV=cuda STEPS=5
LAB01_CASES=("d12 fp32 16 1024" "d12 bf16-compute 16 1024" "d24 fp32 8 1024" "d24 bf16-compute 8 1024")  # model prec B T
BENCH_CONFIGS="d24:8x1024,d12:16x1024"
if (( REHEARSE )); then  # the same phases on the CPU at toy sizes: tests this script, not the GPU
  DEV=cpu STEPS=2
  LAB01_CASES=("tiny fp32 8 16" "tiny bf16-compute 8 16" "demo fp32 2 64" "demo bf16-compute 2 64")
  BENCH_CONFIGS="demo:2x64,tiny:4x16"
fi
LAB01_RUNS=()  # "model precision B T status run_id"
LAB04_RUNS=()  # "ranks backend micro_batch status run_id"
read -r L4_MODEL L1_PREC L4_B L4_T <<< "${LAB01_CASES[1]}"  # d12 bf16-compute 16 1024 (rehearsal: tiny ... 8 16)
L4_PREC=bf16  # lab 04: bf16-mixed (its estimator refuses bf16-compute); lab 01's L1_PREC run is the reference line
BENCH_STATUS=not_run FLASH_RC=""  # FLASH_RC: bench_flash's exit status ("" when it did not run)
if [[ -z "$GPU_NAME" && $REHEARSE -eq 0 ]]; then
  say "no GPU visible ($why_no_gpu): stopping after the build and the GPU tests (which skip without one)"
elif (( BUILD_ONLY )); then
  say "--build-only: stopping after the GPU tests"
elif (( BUILD_OK )); then
  (( REHEARSE )) && say "--rehearse-on-cpu: labs 01, 04 and the bench run on the CPU at toy sizes (numbers mean nothing)"
  for run in "${LAB01_CASES[@]}"; do
    read -r model prec B T <<< "$run"
    id="$RUN_TAG-$model-$prec"
    phase "lab01_${model}_${prec}" 75 15 "$BUILD_DIR/bin/reference/lab01_single_device" --device "$DEV" \
      --model "$model" --precision "$prec" --batch "$B" --seq-len "$T" --steps 8 --warmup 2 --lr 1e-3 --val-every 0 \
      --val-batches 2 --sample-tokens 0 --data "$DATA" --log-dir "$WORK/runs" --run-id "$id" --quiet
    rc=$?
    LAB01_RUNS+=("$model $prec $B $T $rc $id")
    f="$WORK/runs/lab01/$id/rank0.jsonl"
    [[ -f "$f" ]] && grep '"type":"summary"' "$f" |
      sed "s/^{/{\"model\":\"$model\",\"precision\":\"$prec\",\"B\":$B,\"T\":$T,/" >> "$OUT_DIR/lab01.jsonl"
  done
  l4_cases=("1 local")
  (( BUILD_MPI )) && l4_cases+=("2 mpi")
  for c in "${l4_cases[@]}"; do
    read -r np backend <<< "$c"
    mb=$(( L4_B / np ))
    id="$RUN_TAG-lab04-$L4_MODEL-$L4_PREC-np$np"
    l4_args=(--device "$DEV" --model "$L4_MODEL" --precision "$L4_PREC" --stage 3 --micro-batch "$mb"
             --global-batch "$L4_B" --seq-len "$L4_T" --steps 8 --warmup 2 --lr 1e-3 --val-every 0 --val-batches 2
             --sample-tokens 0 --loader-alone-batches 0 --backend "$backend" --data "$DATA" --log-dir "$WORK/runs"
             --run-id "$id" --quiet)
    if (( np == 1 )); then
      phase "lab04_${L4_MODEL}_${L4_PREC}_zero3_np1" 75 15 "$BUILD_DIR/bin/reference/lab04_fsdp" "${l4_args[@]}"
    else
      phase "lab04_${L4_MODEL}_${L4_PREC}_zero3_np${np}_mpi" 90 20 env OMPI_ALLOW_RUN_AS_ROOT=1 \
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$MPIRUN" --oversubscribe --bind-to none -np "$np" \
        "$BUILD_DIR/bin/reference/lab04_fsdp" "${l4_args[@]}"
    fi
    rc=$?
    LAB04_RUNS+=("$np $backend $mb $rc $id")
    for f in "$WORK/runs/lab04/$id"/rank*.jsonl; do
      [[ -f "$f" ]] && grep '"type":"summary"' "$f" |
        sed "s/^{/{\"ranks\":$np,\"backend\":\"$backend\",\"micro_batch\":$mb,/" >> "$OUT_DIR/lab04.jsonl"
    done
  done
  # The flash-style attention in the model (what lab 01's --attention auto picks when the scores do not
  # fit): the bench's first case in bf16-compute, ours only; the table puts it next to the materialized row.
  phase bench_flash 60 15 "$BUILD_DIR/bin/bench_lab01" --device "$DEV" --precision bf16-compute --attention flash \
    --configs "${BENCH_CONFIGS%%,*}" --steps "$STEPS" --jsonl "$OUT_DIR/flash.jsonl"
  FLASH_RC=$?
  # Ours (bench_lab01), PyTorch eager, torch.compile; the bench writes each number as it gets it, so a cut
  # run keeps what it measured.
  phase bench 600 30 env PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/bench_pytorch.py" --build-dir "$BUILD_DIR" \
    --device "$DEV" --dtype bf16-compute,fp32 --configs "$BENCH_CONFIGS" --compile --steps "$STEPS" \
    --jsonl "$OUT_DIR/bench.jsonl"
  case $? in 0) BENCH_STATUS=ok ;; 124|125) BENCH_STATUS=cut ;; *) BENCH_STATUS=failed ;; esac
fi

# =============================================================================================
# 6. The table (and the row for docs/gpu_runs.md).
GIT_SHA=${SL_GIT_SHA:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}
export SLG_GPU_NAME="$GPU_NAME" SLG_GPU_CC="$GPU_CC" SLG_ARCH="$ARCH" SLG_DRIVER="$DRIVER" SLG_DRIVER_CUDA="$DRIVER_CUDA" \
  SLG_NVCC_CUDA="$NVCC_CUDA" SLG_GIT_SHA="$GIT_SHA" SLG_ELAPSED=$(( $(date +%s) - T0 )) SLG_BUDGET="$BUDGET_S" \
  SLG_BUILD_OK="$BUILD_OK" SLG_BUILD_STATUS="$BUILD_STATUS" SLG_BUILD_ONLY="$BUILD_ONLY" SLG_TESTS_STATUS="$TESTS_STATUS" SLG_TESTS_TOTAL="$TESTS_TOTAL" \
  SLG_TESTS_PASSED="$TESTS_PASSED" SLG_TESTS_FAILED="$TESTS_FAILED" SLG_TESTS_SKIPPED="$TESTS_SKIPPED" \
  SLG_SYNC_RERUN="$SYNC_RERUN" SLG_BENCH_STATUS="$BENCH_STATUS" SLG_FLASH_RC="$FLASH_RC" SLG_OUT="$OUT_DIR" SLG_WORK="$WORK" \
  SLG_DOCS="$ROOT/docs/gpu_runs.md" SLG_REHEARSE="$REHEARSE" SLG_BENCH_CONFIGS="$BENCH_CONFIGS" SLG_BENCH_TAIL="$(tail -n 1 "$WORK/bench.log" 2>/dev/null | cut -c1-200)"
SLG_LAB01=$(printf '%s\n' "${LAB01_RUNS[@]+"${LAB01_RUNS[@]}"}") SLG_SKIPPED=$(printf '%s\n' "${SKIPPED[@]+"${SKIPPED[@]}"}") \
SLG_LAB04=$(printf '%s\n' "${LAB04_RUNS[@]+"${LAB04_RUNS[@]}"}") SLG_NOTES=$(printf '%s\n' "${NOTES[@]+"${NOTES[@]}"}") \
SLG_LAB04_CASE="$L4_MODEL $L4_PREC $L4_B $L4_T $L1_PREC" \
"$PY" - <<'PY' 2>&1 | tee -a "$LOG"
import datetime, json, math, os, sys

E = os.environ
out, work = E["SLG_OUT"], E["SLG_WORK"]
has_gpu = bool(E["SLG_GPU_NAME"])
build_only = E["SLG_BUILD_ONLY"] == "1"
rehearse = E["SLG_REHEARSE"] == "1"
problems, notes = [], []
# phases the budget skipped or cut; the bench phase is judged by what it measured (below), not by its cut
cut = [s for s in E.get("SLG_SKIPPED", "").splitlines() if s.strip() and not s.startswith("bench ")]

def load(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except OSError:
        return []

# ---- verdict pieces --------------------------------------------------------------------------
if E["SLG_BUILD_STATUS"] == "failed":
    problems.append("configure/build failed (see gpu_check.log)")
tot, passed = int(E["SLG_TESTS_TOTAL"]), int(E["SLG_TESTS_PASSED"])
failed, skipped = int(E["SLG_TESTS_FAILED"]), int(E["SLG_TESTS_SKIPPED"])
tests = f"ctest -L gpu: {passed} passed, {failed} failed, {skipped} skipped"
if E["SLG_SYNC_RERUN"]:
    tests += f" ({E['SLG_SYNC_RERUN']})"
if E["SLG_BUILD_OK"] == "1":
    if E["SLG_TESTS_STATUS"] == "cut":
        tests += " (cut by the budget)"
    elif tot == 0:
        problems.append("ctest -L gpu ran no test")
    elif failed:
        problems.append(f"{failed} GPU test(s) failed")
    elif has_gpu and skipped:
        problems.append(f"{skipped} GPU test(s) skipped on a machine with a GPU")

lab01_cells = []
summaries = {(r["model"], r["precision"]): r for r in load(os.path.join(out, "lab01.jsonl"))}
for line in E.get("SLG_LAB01", "").splitlines():
    if not line.strip():
        continue
    model, prec, B, T, rc, run_id = line.split()
    s = summaries.get((model, prec))
    if rc in ("124", "125"):
        lab01_cells.append(f"{model} {prec} cut")
    elif rc != "0" or not s:
        lab01_cells.append(f"{model} {prec} FAILED")
        problems.append(f"lab01 {model} {prec} exited {rc}")
    else:
        v0, v1 = s.get("val_loss_start"), s.get("val_loss_end")
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (v0, v1, s.get("final_loss"))) and v1 < v0
        lab01_cells.append(f"{model} {prec} {'ok' if ok else 'BAD'} {v0:.2f}->{v1:.2f}")
        if not ok:
            problems.append(f"lab01 {model} {prec}: validation loss did not fall ({v0} -> {v1})")

# Lab 04 on lab 01's d12 bf16 case (ZeRO-3): every rank's summary, keyed by (ranks, rank).
l4_model, l4_prec, l4_B, l4_T, l1_prec = (E.get("SLG_LAB04_CASE", "").split() + ["?"] * 5)[:5]
l4_summaries = {(r["ranks"], r.get("rank", 0)): r for r in load(os.path.join(out, "lab04.jsonl"))}
lab04_runs = []  # (ranks, backend, micro-batch, status, [summary of each rank or None])
for line in E.get("SLG_LAB04", "").splitlines():
    if not line.strip():
        continue
    n, backend, mb, rc, run_id = line.split()
    n = int(n)
    per_rank = [l4_summaries.get((n, k)) for k in range(n)]
    what = f"lab04 {l4_model} {l4_prec} ZeRO-3 on {n} rank{'s' if n > 1 else ''} ({backend})"
    if rc in ("124", "125"):
        status = "cut"
    elif rc != "0" or not all(per_rank):
        status = "FAILED"
        problems.append(f"{what} exited {rc}" + (", with no summary on some rank" if rc == "0" else ""))
    else:
        v0, v1 = per_rank[0].get("val_loss_start"), per_rank[0].get("val_loss_end")
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (v0, v1)) and v1 < v0
        status = f"ok {v0:.2f}->{v1:.2f}" if ok else f"BAD {v0}->{v1}"
        if not ok:
            problems.append(f"{what}: validation loss did not fall ({v0} -> {v1})")
    lab04_runs.append((n, backend, int(mb), status, per_rank))

bench = load(os.path.join(out, "bench.jsonl"))
rows = {}
torch_version = ""
for r in bench:
    key = (r["model"], r["precision"], r["B"], r["T"])
    rows.setdefault(key, {})[r["impl"]] = r
    torch_version = r.get("torch", torch_version)
    if r["impl"] == "ours" and "error" in r:
        problems.append(f"bench_lab01 {r['model']} {r['precision']}: {r['error']}")
if E.get("SLG_FLASH_RC", "") not in ("", "0", "124", "125"):  # 124/125: cut by the budget (listed as skipped)
    problems.append(f"bench_lab01 --attention flash exited {E['SLG_FLASH_RC']} (see bench_flash in gpu_check.log)")
want = []  # (model, precision, B, T) in the bench's order
for p in ("bf16-compute", "fp32"):
    for item in E["SLG_BENCH_CONFIGS"].split(","):
        m, bt = item.split(":")
        want.append((m, p, int(bt.split("x")[0]), int(bt.split("x")[1])))
if (has_gpu or rehearse) and not build_only and E["SLG_BENCH_STATUS"] != "not_run":
    why = {"cut": "the budget", "failed": "the bench failed: " + E.get("SLG_BENCH_TAIL", "")}.get(
        E["SLG_BENCH_STATUS"], E["SLG_BENCH_STATUS"])
    missing, optional = [], []
    for key in want:
        for impl in ("ours", "torch_eager", "torch_compile"):
            if impl not in rows.get(key, {}):
                what = f"{impl.replace('torch_', '')} {key[0]} {key[1]}"
                # torch.compile in fp32 comes last and is a bonus: missing it does not make the run PARTIAL
                (optional if impl == "torch_compile" and key[1] == "fp32" else missing).append(what)
    if missing:
        cut.append(f"not measured ({why}): " + ", ".join(missing))
    if optional:
        notes.append(f"not measured ({why}): " + ", ".join(optional))

# ---- the table -------------------------------------------------------------------------------
if problems:
    verdict = "FAIL"
elif rehearse:
    verdict = "REHEARSAL ON THE CPU (no GPU; toy sizes; the numbers mean nothing)"
elif not has_gpu:
    verdict = "NO GPU (build rehearsal only)"
elif build_only:
    verdict = "BUILD + TESTS ONLY"
elif cut:
    verdict = "PARTIAL (nothing failed; the budget cut some phases)"
else:
    verdict = "PASS"
now = datetime.datetime.now(datetime.timezone.utc)
arch = E["SLG_ARCH"]
lines = [f"== scalelab GPU check: {verdict} ==  {now:%Y-%m-%d %H:%M} UTC | git {E['SLG_GIT_SHA']} | "
         f"{E['SLG_ELAPSED']} s of a {E['SLG_BUDGET']} s budget"]
gpu = (f"{E['SLG_GPU_NAME']} (cc {E['SLG_GPU_CC'] or '?'}) | driver {E['SLG_DRIVER'] or '?'} "
       f"(CUDA {E['SLG_DRIVER_CUDA'] or '?'})") if has_gpu else "none visible"
lines.append(f"GPU      {gpu} | nvcc {E['SLG_NVCC_CUDA'] or '?'}, built for sm {arch}"
             + (f" | torch {torch_version}" if torch_version else ""))
lines.append(f"tests    {tests}")
if lab01_cells:
    lines.append("lab01    " + " | ".join(lab01_cells) + "  (val loss, 8 steps)")

def cell(r, w):
    if not r:
        return f"{'-':>{w}} {'-':>6}"
    if "error" in r:
        return f"{'failed':>{w}} {'':>6}"
    mfu = f"{100 * r['mfu']:5.1f}%" if "mfu" in r else f"{'n/a':>6}"
    return f"{r['tokens_per_s']:{w}.0f} {mfu}"

def ratio(a, b):
    if not a or not b or "error" in a or "error" in b:
        return "-"
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x"

if rows:
    short = {"bf16-compute": "bf16c", "bf16-mixed": "bf16m"}  # the prec column: bf16c = bf16-compute
    lines.append(f"{'model':5} {'prec':5} {'B':>3} {'T':>5} | {'ours tok/s':>10} {'MFU':>6} | {'eager tok/s':>11} {'MFU':>6} |"
                 f" {'compile tok/s':>13} {'MFU':>6} | {'ours/eager':>10} {'ours/compile':>12}")
    for key in want + sorted(k for k in rows if k not in want):
        if key not in rows:
            continue
        r = rows[key]
        o, e, c = r.get("ours"), r.get("torch_eager"), r.get("torch_compile")
        lines.append(f"{key[0]:5} {short.get(key[1], key[1]):5} {key[2]:3d} {key[3]:5d} | {cell(o, 10)} | {cell(e, 11)} | {cell(c, 13)} |"
                     f" {ratio(o, e):>10} {ratio(o, c):>12}")
    peaks = {}  # the peak bench_lab01 divided by, per precision: "989 TFLOP/s (datasheet: NVIDIA H200 SXM dense bf16)"
    for r in bench:
        if r["impl"] == "ours" and r.get("peak_source"):
            f = r.get("peak_flops_per_s", 0)
            v = f"{f / 1e12:.0f} TFLOP/s" if f >= 1e12 else f"{f / 1e9:.0f} GFLOP/s"
            peaks[r["precision"]] = f"{r['precision']} {v} ({r['peak_source'].split(';')[0]})"
    if peaks:
        lines.append("MFU of " + ", ".join(peaks[p] for p in sorted(peaks)) + "; ours/x > 1: ours is faster")
    for r in load(os.path.join(out, "flash.jsonl")):  # bench_flash: ours with --attention flash
        key = (r["model"], r["precision"], r["B"], r["T"])
        mat = rows.get(key, {}).get("ours")
        lines.append(f"{key[0]:5} {short.get(key[1], key[1]):5} {key[2]:3d} {key[3]:5d} | {cell(r, 10)} | flash attention;"
                     f" flash/materialized {ratio(r, mat)}")
    errs = [f"{r['impl']} {r['model']} {r['precision']}: {r['error']}" for r in bench if "error" in r]
    for e in errs:
        lines.append(f"error    {e}")

def mib(b):
    if not isinstance(b, (int, float)):
        return "-"
    x = b / 1048576
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"

def measured_peak(s):  # what the estimator bounds: the four categories' peaks, summed
    parts = [s.get(f"memory_{c}_peak_bytes") for c in ("params", "grads", "optimizer_state", "activations")]
    return sum(parts) if all(isinstance(p, (int, float)) for p in parts) else None

def device_mfu(s, ranks):
    # lab 04's `mfu` divides by world_size devices' peak. On the GPU the ranks share one, so x ranks gives
    # that GPU's; on the CPU (rehearsal) each rank's peak is calibrated on its share of the cores: as is.
    m = s.get("mfu") if s else None
    if not isinstance(m, (int, float)):
        return None
    return m * ranks if has_gpu else m

if lab04_runs:
    lines.append(f"lab04 next to lab01: {l4_model}, lab04 {l4_prec} (bf16-mixed), lab01 {l1_prec}, global batch B={l4_B}, T={l4_T}, 8 steps, lab04 ZeRO-3,"
                 + (" on the same GPU" if has_gpu else " on the CPU"))
    lines.append(f"{'run':30} {'status':14} | {'tok/s':>9} {'MFU':>6} | {'rank':>4} {'peak MiB':>9} {'all MiB':>8} "
                 f"{'est. MiB':>8}")
    def l4_line(name, status, s0, mfu, k, s):
        rate = f"{s0['tokens_per_s']:9.0f}" if s0 and isinstance(s0.get("tokens_per_s"), (int, float)) else f"{'-':>9}"
        m = f"{100 * mfu:5.1f}%" if isinstance(mfu, (int, float)) else f"{'n/a' if s0 else '-':>6}"
        if k > 0:  # the run's numbers are on rank 0's line
            name, status, rate, m = "", "", f"{'':>9}", f"{'':>6}"
        peak = mib(measured_peak(s)) if s else "-"
        return (f"{name:30} {status:14} | {rate} {m} | {k:4d} {peak:>9} {mib(s.get('memory_peak_bytes') if s else None):>8} "
                f"{mib(s.get('memory_estimated_peak_bytes') if s else None):>8}")
    s1 = summaries.get((l4_model, l1_prec))
    st1 = next((c[len(f"{l4_model} {l1_prec} "):] for c in lab01_cells if c.startswith(f"{l4_model} {l1_prec} ")),
               "not run")
    lines.append(l4_line("lab01 1 device", st1, s1, s1.get("mfu") if s1 else None, 0, s1))
    for n, backend, mb, status, per_rank in lab04_runs:
        name = f"lab04 {n} rank{'s' if n > 1 else ''} ({backend}" + (f", B {mb}/rank)" if n > 1 else ")")
        for k, s in enumerate(per_rank):
            lines.append(l4_line(name, status, per_rank[0], device_mfu(per_rank[0], n), k, s))
    lines.append("peak: sum of memory_{params,grads,optimizer_state,activations}_peak_bytes (what the estimator bounds); "
                 "all: the allocator's peak (memory_peak_bytes: + data, comm, workspace); est.: "
                 "memory_estimated_peak_bytes; MFU of " + ("the one GPU the ranks share" if has_gpu else
                 "the CPU (each rank's peak on its share of the cores)"))
    notes.extend(s for s in E.get("SLG_NOTES", "").splitlines() if s.strip())
for p in problems:
    lines.append(f"problem  {p}")
for s in cut:
    lines.append(f"skipped  {s}")
for s in notes:
    lines.append(f"skipped  {s} [optional]")
table = "\n".join(lines)
print("\n" + table)
with open(os.path.join(out, "summary.txt"), "w") as f:
    f.write(table + "\n")

# ---- the row for docs/gpu_runs.md: only runs that used a GPU count ----------------------------
if has_gpu and not build_only and not rehearse:
    nums = []
    for key in want:
        r = rows.get(key, {})
        o = r.get("ours")
        if not o or "error" in o:
            continue
        s = f"{key[0]} {key[1]} {key[2]}x{key[3]}: {o['tokens_per_s'] / 1e3:.1f}k tok/s"
        if "mfu" in o:
            s += f", MFU {100 * o['mfu']:.1f}%"
        for impl, name in (("torch_eager", "eager"), ("torch_compile", "compile")):
            x = ratio(o, r.get(impl))
            if x != "-":
                s += f", {x} {name}"
        nums.append(s)
    for r in load(os.path.join(out, "flash.jsonl")):
        if "error" not in r:
            mat = rows.get((r["model"], r["precision"], r["B"], r["T"]), {}).get("ours")
            nums.append(f"{r['model']} {r['precision']} {r['B']}x{r['T']} flash attention: "
                        f"{r['tokens_per_s'] / 1e3:.1f}k tok/s, {ratio(r, mat)} materialized")
    for n, backend, mb, status, per_rank in lab04_runs:
        s0 = per_rank[0]
        if not status.startswith("ok"):
            continue
        s = f"lab04 ZeRO-3 {l4_model} {l4_prec} {n} rank{'s' if n > 1 else ''}: {s0['tokens_per_s'] / 1e3:.1f}k tok/s"
        m = device_mfu(s0, n)
        if m is not None:
            s += f", MFU {100 * m:.1f}%"
        s += f", peak {'/'.join(mib(measured_peak(r)) for r in per_rank)} MiB per rank (est. " \
             f"{mib(s0.get('memory_estimated_peak_bytes'))})"
        nums.append(s)
    result = f"{verdict.split(' ')[0]}: {passed}/{tot} GPU tests" + (f", {failed} failed" if failed else "") + \
             (f", {skipped} skipped" if skipped else "") + \
             f"; lab01 {sum(1 for c in lab01_cells if ' ok ' in c)}/{len(lab01_cells)} ok" + \
             (f"; lab04 {sum(1 for r in lab04_runs if r[3].startswith('ok'))}/{len(lab04_runs)} ok" if lab04_runs else "") + \
             f"; git {E['SLG_GIT_SHA']}"
    row = (f"| {now:%Y-%m-%d} | {E['SLG_GPU_NAME']} (sm {arch}) | {E['SLG_DRIVER']} | "
           f"{E['SLG_NVCC_CUDA']} (driver {E['SLG_DRIVER_CUDA']}) | {result} | {'; '.join(nums) or '-'} |")
    with open(os.path.join(out, "gpu_runs_row.md"), "w") as f:
        f.write(row + "\n")
    docs = E["SLG_DOCS"]
    try:
        text = open(docs).read() if os.path.exists(docs) else ""
        text = "\n".join(l for l in text.splitlines() if not l.startswith("no verified run yet")) + "\n"
        with open(docs, "w") as f:
            f.write(text + row + "\n")
        print(f"\nrow appended to {docs} (and in {out}/gpu_runs_row.md: copy it into your checkout's "
              "docs/gpu_runs.md if this tree is a copy)")
    except OSError as e:
        print(f"\ncould not append to {docs}: {e}; the row is in {out}/gpu_runs_row.md")

code = 1 if problems else 3 if not has_gpu else 0 if build_only else 4 if cut else 0
sys.exit(code)
PY
exit "${PIPESTATUS[0]}"
