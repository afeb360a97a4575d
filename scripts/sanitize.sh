#!/usr/bin/env bash
# scripts/sanitize.sh — a sanitizer run of the kit's threads and raw buffers, as CI runs it (scripts/test.sh).
#   scripts/sanitize.sh asan|tsan [--build-dir DIR] [--jobs N] [--prove]
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer); tsan: ThreadSanitizer. Each configures
# its own CPU-only build (default build-asan / build-tsan: reference track, -O1 -g1), builds only the
# programs it runs, and runs this subset, where the kit runs threads or async communication:
#   the communicator's communication thread (common/src/comm/mpi.cpp)   test_comm_mpi.np2 (2 ranks)
#   lab 02's loader and its prefetch thread                             every lab02.*.reference check
#   lab 03's overlap: all-reduces in flight during backward (2 ranks)   lab03.overlap_*.reference
#   lab 06's pipeline: async send/recv between stages (2 ranks)         lab06.*_gradients_match_dense.reference
# Any report fails the run: -fno-sanitize-recover=all, halt_on_error=1 (the program exits non-zero at the first
# report, so its ctest fails). OpenMP and OpenMPI are not instrumented: every test runs with OMP_NUM_THREADS=1
# (no OpenMP threads at all), the TSan run leaves out OpenMPI's TCP transport, and the suppressions in
# tests/sanitize/ (each line says why) cover what OpenMPI, OpenBLAS and libstdc++ do out of the sanitizers' sight.
# --prove: afterwards, each plant of tests/sanitize/plants/ for this mode (a patch of solutions/: a data race,
# a heap overflow, a signed overflow) is applied to the build's copy of solutions/, its programs rebuilt and its
# checks run; each must FAIL with its sanitizer's report (ThreadSanitizer: data race, ...). The copy is restored
# after each plant and the programs rebuilt from it at the end; solutions/ itself is never touched.
# Docs: docs/grading.md "Warnings, sanitizers, format".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

usage() { echo "usage: scripts/sanitize.sh asan|tsan [--build-dir DIR] [--jobs N] [--prove]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
mode=$1; shift
[[ $mode == asan || $mode == tsan ]] || usage
build_dir=build-$mode
jobs=$(nproc)
prove=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --prove) prove=1; shift ;;
    *) usage ;;
  esac
done
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
supp=$repo/tests/sanitize

# ---- flags and runtime options --------------------------------------------------------------------------
# -g1: line tables only, so a report names file:line at a fraction of -g's compile time.
if [[ $mode == asan ]]; then
  flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
  # fast_unwind_on_malloc=0: full allocation stacks, through the libraries built without frame pointers
  # (OpenMPI, OpenBLAS), so that the leak suppressions of tests/sanitize/lsan.supp can name them.
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:strict_init_order=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  reports="ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"
else
  flags="-fsanitize=thread -fno-omit-frame-pointer -g1"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=0"
  # OpenMPI's TCP transport takes two of its own locks in both orders while it connects and disconnects
  # (mca_btl_tcp_add_procs / mca_btl_tcp_proc_remove): a lock-order inversion inside OpenMPI, reported at
  # every MPI_Init. On one machine the ranks talk through shared memory (vader) anyway, so the TCP transport
  # is left out instead of suppressing its reports.
  export OMPI_MCA_btl=self,vader
  reports="WARNING: ThreadSanitizer"
fi
export OMP_NUM_THREADS=1  # ctest sets it for every test too; here for anything run outside ctest
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The subset: its programs (build targets) and its ctests.
targets=(test_comm_mpi test_lab02_reference test_lab03_np2_reference test_lab06_np2_reference)
subset='^(test_comm_mpi\.np2|lab02\..*\.reference|lab03\.overlap_.*\.reference'
subset+='|lab06\.(gpipe|one_forward_one_backward|interleaved)_gradients_match_dense\.reference)$'

# ---- the copy of solutions/ the reference track compiles from (the plants patch it) ----------------------
copy_root=$build_dir/src
copy=$copy_root/solutions
sync_copy() {  # copy == solutions/, rewriting only the files that differ (a rewritten file is rebuilt)
  local f
  mkdir -p "$copy"
  while IFS= read -r f; do
    if ! cmp -s "solutions/$f" "$copy/$f"; then
      mkdir -p "$(dirname "$copy/$f")"
      cp "solutions/$f" "$copy/$f"
    fi
  done < <(cd solutions && find . -type f)
  while IFS= read -r f; do
    [[ -e "solutions/$f" ]] || rm -f "$copy/$f"
  done < <(cd "$copy" && find . -type f)
}
sync_copy

t_start=$SECONDS
echo "== sanitize $mode: configure $build_dir ($flags)"
# -O1 (the sanitizers' documented minimum for a usable speed) for everything but common/, which keeps its own
# -O3 (common/CMakeLists.txt): at -O3 the tests' and the labs' sources take twice as long to compile here.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DSL_WITH_CUDA=OFF -DSL_BUILD_LEARNER=OFF -DSL_WITH_DNNL=OFF -DSL_SOLUTIONS_DIR="$copy" -DCMAKE_CXX_FLAGS="$flags" \
  >"$build_dir/configure.log" 2>&1 || {
  tail -40 "$build_dir/configure.log"; echo "FAIL: configuring $build_dir (the log is above)"; exit 1; }
echo "== sanitize $mode: build ${targets[*]}"
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"
t_built=$SECONDS

echo "== sanitize $mode: run the subset"
if ! ctest --test-dir "$build_dir" -R "$subset" -j "$jobs" --output-on-failure; then
  echo "FAIL: sanitize $mode: a check failed (a sanitizer report, if any, is above: grep -E '$reports')"
  exit 1
fi
echo "== sanitize $mode: subset clean (build $((t_built - t_start)) s, run $((SECONDS - t_built)) s)"

# ---- --prove: every plant of this mode must be reported ---------------------------------------------------
[[ $prove == 1 ]] || exit 0
trap sync_copy EXIT  # also when interrupted: the next run must start from solutions/
failed=0
for plant in "$supp"/plants/"$mode"-*.patch; do
  id=$(basename "$plant" .patch)
  runs=$(sed -n 's/^Run: //p' "$plant")
  report=$(sed -n 's/^Report: //p' "$plant")
  [[ -n $runs && -n $report ]] || { echo "FAIL: $plant has no 'Run:' or 'Report:' line"; exit 1; }
  t0=$SECONDS
  sync_copy
  patch -p1 --batch --forward --fuzz=0 --no-backup-if-mismatch --reject-file=- -s -d "$copy_root" -i "$plant" || {
    echo "FAIL: plant $id does not apply to solutions/"; failed=1; continue; }
  cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" >"$build_dir/plant.log" 2>&1 || {
    tail -30 "$build_dir/plant.log"; echo "FAIL: plant $id does not build"; failed=1; continue; }
  if ctest --test-dir "$build_dir" -R "^($runs)\$" --output-on-failure >>"$build_dir/plant.log" 2>&1; then
    echo "FAIL: plant $id: $runs passed; $mode reported nothing"; failed=1
  elif ! grep -q -E "$report" "$build_dir/plant.log"; then
    grep -E -m 5 "$reports|Failed|Timeout" "$build_dir/plant.log" || true
    echo "FAIL: plant $id: $runs failed, but without the report '$report' (log: $build_dir/plant.log)"; failed=1
  else
    said=$(grep -E -m 1 "$report" "$build_dir/plant.log" | sed 's/^ *//')
    echo "   plant $id: reported ($said; $((SECONDS - t0)) s)"
  fi
done
sync_copy
# Leave the build as the reference is, so that nothing planted stays in its programs.
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" >"$build_dir/plant.log" 2>&1 || {
  tail -30 "$build_dir/plant.log"; echo "FAIL: rebuilding $build_dir from solutions/ after the plants"; exit 1; }
if [[ $failed != 0 ]]; then
  echo "FAIL: sanitize $mode --prove: a plant was not reported (above)"
  exit 1
fi
echo "== sanitize $mode: every plant reported ($((SECONDS - t_start)) s in all)"
