#!/usr/bin/env bash
# scripts/gpu_check.sh — the one GPU check (docs/cuda_backend.md "Running the GPU check"). On a machine
# with an NVIDIA GPU, the CUDA toolkit, CMake, ninja, a C++ compiler and python3 (PyTorch for the
# comparison columns), and no system packages beyond that when deps/ is there (scripts/pack_gpu_deps.sh
# fills it on a Debian machine), it:
#   1. checks the tools and deps/, and reads the GPU (nvidia-smi) to build for its compute capability;
#   2. builds only what it runs (reference track): the GPU tests, lab 01's program, bench_lab01 and lab 04's
#      program (with MPI where mpirun is on PATH);
#   3. runs `ctest -L gpu`; failures are rerun with SL_SYNC_LAUNCH=1 so an error names its kernel;
#   4-5. the most valuable numbers first: lab 01 for 8 steps on the KJV shards in bf16-compute (the bf16
#      tensor cores), d12 then d24, T = 1024; lab 04 (ZeRO-3, bf16-mixed: the precisions its memory estimator
#      models) on lab 01's d12 case (same global batch, T, steps): 1 rank, and, where Open MPI is installed,
#      2 MPI ranks sharing the GPU (--backend mpi): tokens/s, MFU, memory per rank; ours against PyTorch eager
#      on the same shapes (bench/bench_pytorch.py); then lab 01 in fp32, ours with the flash-style attention
#      (bench_flash), and last, optional, torch.compile (1-2 min per case; never makes the run PARTIAL);
#   6. prints one short table (scripts/gpu_check_summary.py), writes it to --out, and appends a row to
#      docs/gpu_runs.md.
# Each phase runs under a hard timeout inside one budget (default 330 s on an H200, build included: with the
# machine's start that fits the device tool's 15 minutes with a rerun's margin; docs/cuda_backend.md has the
# expected time of each phase); what the budget cuts is listed as skipped, what failed as a problem.
#
#   scripts/gpu_check.sh --prepare      on this machine, before the GPU run: makes deps/ (pack_gpu_deps.sh: the
#                                       libraries and the corpus shards), prints the untracked paths the copy
#                                       of the tree needs (the device tool's carry list) and the size of what
#                                       travels; fails (exit 1) if that is over the tool's 64 MiB
#   scripts/gpu_check.sh [--out DIR] [--budget S] [--arch SM] [--build-dir DIR] [--deps DIR] [--jobs N] [--no-compile]
#   scripts/gpu_check.sh --build-only   phases 1-3 only; on a machine without a GPU this is the rehearsal:
#                                       it proves the build with deps/ and stops with "no GPU visible"
#   scripts/gpu_check.sh --rehearse-on-cpu   all phases, 4-5 on the CPU with tiny sizes: tests this script
#                                       itself on a machine without a GPU (its numbers mean nothing; no row)
#     --configure-only  stop after phase 1 and the configure (the rehearsal's cheap form; exit 0 or 1)
#     --no-compile      leave out the torch.compile phase
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
BUDGET_S=330
BUILD_DIR="$ROOT/build-gpucheck"
DEPS="$ROOT/deps"
ARCH=""
JOBS=$(nproc 2>/dev/null || echo 4)
OUT_DIR=""
BUILD_ONLY=0
REHEARSE=0
PREPARE=0
CONFIGURE_ONLY=0
WITH_COMPILE=1  # --no-compile: leave out the torch.compile phase
LIMIT_MIB=64    # what the device tool carries: the working tree plus the carried paths (docs/cuda_backend.md)
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
    --prepare) PREPARE=1; shift ;;
    --configure-only) CONFIGURE_ONLY=1; shift ;;
    --no-compile) WITH_COMPILE=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

# --prepare: what the copy of the tree on the GPU machine needs that git does not track, made and measured.
if (( PREPARE )); then
  "$ROOT/scripts/pack_gpu_deps.sh" --out "$DEPS" || { echo "gpu_check --prepare: pack_gpu_deps.sh failed" >&2; exit 1; }
  rel=$(realpath -m --relative-to="$ROOT" "$DEPS")
  if [[ "$rel" == ..* || "$rel" == /* ]]; then
    echo "gpu_check --prepare: $DEPS is outside the repository: the device tool carries only paths inside it" >&2
    exit 1
  fi
  # What travels: tracked files, untracked files git does not ignore, and the carried (ignored) paths.
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    tree_bytes=$(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
                 xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  else
    echo "gpu_check --prepare: $ROOT is not a git checkout: cannot tell what travels" >&2
    exit 1
  fi
  carry_bytes=$(du -sb "$DEPS" | cut -f1)
  total=$(( tree_bytes + carry_bytes ))
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
  echo "gpu_check --prepare: untracked paths the copy needs (carry): [\"$rel\"]  ($(mib "$carry_bytes"):" \
       "$(find "$DEPS" -type f | wc -l) files, the corpus shards in $rel/data/kjv)"
  echo "gpu_check --prepare: the working tree $(mib "$tree_bytes") + carried $(mib "$carry_bytes") = $(mib "$total")" \
       "of the device tool's $LIMIT_MIB MiB"
  if (( total > LIMIT_MIB * 1048576 )); then
    echo "gpu_check --prepare: FAILED: over $LIMIT_MIB MiB: drop shards from $rel/data/kjv or untracked files" >&2
    exit 1
  fi
  echo "gpu_check --prepare: ready. The device command (docs/cuda_backend.md \"Running the GPU check\"):"
  echo "  run(command=\"scripts/gpu_check.sh --out \$OUT\", carry=[\"$rel\"], timeout_s=420)"
  exit 0
fi

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
if (( CONFIGURE_ONLY )); then  # the rehearsal's cheap form: the copy has what it needs, and configures with it
  (( rc == 0 )) && grep -h "scalelab:" "$WORK/configure.log" | sed 's/^/    /'
  say "--configure-only: $( (( rc == 0 )) && echo "configured" || echo "configure FAILED (exit $rc)"); stopping"
  exit $(( rc == 0 ? 0 : 1 ))
fi
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
# Most valuable first (a cut run keeps them): lab 01 in bf16-compute (the tensor cores' MFU, d12 then d24),
# lab 04, ours vs PyTorch eager; then lab 01 in fp32, the flash-style attention, and torch.compile last
# (optional: 1-2 min per case, it never makes the run PARTIAL or FAIL).
LAB01_CASES=("d12 bf16-compute 16 1024" "d24 bf16-compute 8 1024")  # model prec B T: before lab 04
LAB01_LATE=("d12 fp32 16 1024" "d24 fp32 8 1024")                     # after the eager bench
BENCH_CONFIGS="d24:8x1024,d12:16x1024"
if (( REHEARSE )); then  # the same phases on the CPU at toy sizes: tests this script, not the GPU
  DEV=cpu STEPS=2
  LAB01_CASES=("tiny bf16-compute 8 16" "demo bf16-compute 2 64")
  LAB01_LATE=("tiny fp32 8 16" "demo fp32 2 64")
  BENCH_CONFIGS="demo:2x64,tiny:4x16"
fi
LAB01_RUNS=()  # "model precision B T status run_id"
LAB04_RUNS=()  # "ranks backend micro_batch status run_id"
read -r L4_MODEL L1_PREC L4_B L4_T <<< "${LAB01_CASES[0]}"  # d12 bf16-compute 16 1024 (rehearsal: tiny ... 8 16)
L4_PREC=bf16  # lab 04: bf16-mixed (its estimator refuses bf16-compute); lab 01's L1_PREC run is the reference line
BENCH_STATUS=not_run COMPILE_STATUS=not_run FLASH_RC=""  # FLASH_RC: bench_flash's exit status ("" when it did not run)
HAVE_TORCH=0
"$PY" -c "import torch" >/dev/null 2>&1 && HAVE_TORCH=1

# lab01 MODEL PREC B T: one lab 01 run of 8 steps; its summary goes to lab01.jsonl.
lab01() {
  local model=$1 prec=$2 B=$3 T=$4 rc f
  local id="$RUN_TAG-$model-$prec"
  phase "lab01_${model}_${prec}" 75 15 "$BUILD_DIR/bin/reference/lab01_single_device" --device "$DEV" \
    --model "$model" --precision "$prec" --batch "$B" --seq-len "$T" --steps 8 --warmup 2 --lr 1e-3 --val-every 0 \
    --val-batches 2 --sample-tokens 0 --data "$DATA" --log-dir "$WORK/runs" --run-id "$id" --quiet
  rc=$?
  LAB01_RUNS+=("$model $prec $B $T $rc $id")
  f="$WORK/runs/lab01/$id/rank0.jsonl"
  [[ -f "$f" ]] && grep '"type":"summary"' "$f" |
    sed "s/^{/{\"model\":\"$model\",\"precision\":\"$prec\",\"B\":$B,\"T\":$T,/" >> "$OUT_DIR/lab01.jsonl"
  return 0
}

if [[ -z "$GPU_NAME" && $REHEARSE -eq 0 ]]; then
  say "no GPU visible ($why_no_gpu): stopping after the build and the GPU tests (which skip without one)"
elif (( BUILD_ONLY )); then
  say "--build-only: stopping after the GPU tests"
elif (( BUILD_OK )); then
  (( REHEARSE )) && say "--rehearse-on-cpu: labs 01, 04 and the bench run on the CPU at toy sizes (numbers mean nothing)"
  for run in "${LAB01_CASES[@]}"; do lab01 $run; done
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
  # Ours (bench_lab01) and PyTorch eager on the same shapes; the bench writes each number as it gets it, so a
  # cut run keeps what it measured. Without PyTorch it measures ours and says so (BENCH_STATUS no_torch).
  phase bench 150 30 env PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/bench_pytorch.py" --build-dir "$BUILD_DIR" \
    --device "$DEV" --dtype bf16-compute,fp32 --configs "$BENCH_CONFIGS" --no-compile --steps "$STEPS" \
    --jsonl "$OUT_DIR/bench.jsonl"
  case $? in 0) BENCH_STATUS=ok ;; 124|125) BENCH_STATUS=cut ;; *) BENCH_STATUS=failed ;; esac
  (( HAVE_TORCH )) || { [[ $BENCH_STATUS == failed ]] && BENCH_STATUS=no_torch; }
  for run in "${LAB01_LATE[@]}"; do lab01 $run; done
  # The flash-style attention in the model (what lab 01's --attention auto picks when the scores do not
  # fit): the bench's first case in bf16-compute, ours only; the table puts it next to the materialized row.
  phase bench_flash 60 15 "$BUILD_DIR/bin/bench_lab01" --device "$DEV" --precision bf16-compute --attention flash \
    --configs "${BENCH_CONFIGS%%,*}" --steps "$STEPS" --jsonl "$OUT_DIR/flash.jsonl"
  FLASH_RC=$?
  # torch.compile, optional and last: whatever budget is left (bench_pytorch.py --compile-only reads ours'
  # peak FLOP/s from bench.jsonl, so the MFU column divides by the same number).
  if (( HAVE_TORCH && WITH_COMPILE )); then
    phase bench_compile 600 60 env PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/bench_pytorch.py" --build-dir "$BUILD_DIR" \
      --device "$DEV" --dtype bf16-compute,fp32 --configs "$BENCH_CONFIGS" --compile-only --steps "$STEPS" \
      --jsonl "$OUT_DIR/bench.jsonl"
    case $? in 0) COMPILE_STATUS=ok ;; 124|125) COMPILE_STATUS=cut ;; *) COMPILE_STATUS=failed ;; esac
  elif (( ! HAVE_TORCH )); then
    COMPILE_STATUS=no_torch
  fi
fi

# =============================================================================================
# 6. The table (and the row for docs/gpu_runs.md).
GIT_SHA=${SL_GIT_SHA:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}
export SLG_GPU_NAME="$GPU_NAME" SLG_GPU_CC="$GPU_CC" SLG_ARCH="$ARCH" SLG_DRIVER="$DRIVER" SLG_DRIVER_CUDA="$DRIVER_CUDA" \
  SLG_NVCC_CUDA="$NVCC_CUDA" SLG_GIT_SHA="$GIT_SHA" SLG_ELAPSED=$(( $(date +%s) - T0 )) SLG_BUDGET="$BUDGET_S" \
  SLG_BUILD_OK="$BUILD_OK" SLG_BUILD_STATUS="$BUILD_STATUS" SLG_BUILD_ONLY="$BUILD_ONLY" SLG_TESTS_STATUS="$TESTS_STATUS" SLG_TESTS_TOTAL="$TESTS_TOTAL" \
  SLG_TESTS_PASSED="$TESTS_PASSED" SLG_TESTS_FAILED="$TESTS_FAILED" SLG_TESTS_SKIPPED="$TESTS_SKIPPED" \
  SLG_SYNC_RERUN="$SYNC_RERUN" SLG_BENCH_STATUS="$BENCH_STATUS" SLG_COMPILE_STATUS="$COMPILE_STATUS" SLG_PY="$PY" SLG_FLASH_RC="$FLASH_RC" SLG_OUT="$OUT_DIR" SLG_WORK="$WORK" \
  SLG_DOCS="$ROOT/docs/gpu_runs.md" SLG_REHEARSE="$REHEARSE" SLG_BENCH_CONFIGS="$BENCH_CONFIGS" SLG_BENCH_TAIL="$(tail -n 1 "$WORK/bench.log" 2>/dev/null | cut -c1-200)" \
  SLG_COMPILE_TAIL="$(tail -n 1 "$WORK/bench_compile.log" 2>/dev/null | cut -c1-200)"
SLG_LAB01=$(printf '%s\n' "${LAB01_RUNS[@]+"${LAB01_RUNS[@]}"}") SLG_SKIPPED=$(printf '%s\n' "${SKIPPED[@]+"${SKIPPED[@]}"}") \
SLG_LAB04=$(printf '%s\n' "${LAB04_RUNS[@]+"${LAB04_RUNS[@]}"}") SLG_NOTES=$(printf '%s\n' "${NOTES[@]+"${NOTES[@]}"}") \
SLG_LAB04_CASE="$L4_MODEL $L4_PREC $L4_B $L4_T $L1_PREC" \
"$PY" "$ROOT/scripts/gpu_check_summary.py" 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
