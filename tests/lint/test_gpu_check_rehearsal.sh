#!/usr/bin/env bash
# test_gpu_check_rehearsal.sh — scripts/gpu_check.sh from what the device tool carries, on this machine: a
# scratch copy of the tree (tracked files and untracked ones git does not ignore: what travels) plus only
# the carried path deps/ (made by scripts/pack_gpu_deps.sh, as `scripts/gpu_check.sh --prepare` makes it).
# Nothing else of this checkout (no build/, no data/) is there, so a prerequisite the copy lacks fails here
# as it would on the GPU machine (exit 2, "MISSING").
#   tests/lint/test_gpu_check_rehearsal.sh BUILD_DIR [full]     (ctest lint.gpu_check_rehearsal)
#     cheap (CI, about 11 s): --rehearse-on-cpu --configure-only: phase 1 passes and CMake configures the
#       copy with deps/ (CUDA on where nvcc is found, headers and libraries from deps/)
#     full (SL_GPU_REHEARSAL=full in the environment, or "full"; minutes: it builds the GPU programs in the
#       copy): every phase on the CPU at toy sizes; the table must come out with the rehearsal's verdict
# BUILD_DIR: a configured build with bin/sl_make_shards (pack_gpu_deps.sh makes data/kjv with it if absent).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(realpath -m "${1:?usage: test_gpu_check_rehearsal.sh BUILD_DIR [full]}")"
MODE=${2:-${SL_GPU_REHEARSAL:-cheap}}
command -v dpkg-query >/dev/null 2>&1 || { echo "SKIPPED: pack_gpu_deps.sh reads Debian packages (no dpkg-query)"; exit 0; }
command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "SKIPPED: no nvcc: gpu_check.sh builds with the CUDA backend"; exit 0; }

SCRATCH="$BUILD/gpu_check_rehearsal"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH/tree"
# What travels: the files git lists (tracked, and untracked but not ignored), read from the working tree.
(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } | sort -zu |
   while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done |
   tar --null -T - -cf -) | tar -C "$SCRATCH/tree" -xf -
# The carried path, made where the device tool would take it from (its shards from this checkout's data/kjv).
(cd "$ROOT" && scripts/pack_gpu_deps.sh --out "$SCRATCH/tree/deps" --build-dir "$BUILD") > "$SCRATCH/pack.log" 2>&1 ||
  { cat "$SCRATCH/pack.log"; echo "FAIL: pack_gpu_deps.sh"; exit 1; }
for absent in build data .git; do
  [[ ! -e "$SCRATCH/tree/$absent" ]] || { echo "FAIL: the copy has $absent/, which does not travel"; exit 1; }
done

cd "$SCRATCH/tree"
export SL_GIT_SHA=rehearsal
if [[ "$MODE" == full ]]; then
  set +e
  scripts/gpu_check.sh --rehearse-on-cpu --no-compile --jobs 2 --budget 1800 --build-dir "$SCRATCH/build" \
    --out "$SCRATCH/out"
  rc=$?
  set -e
  table="$SCRATCH/out/summary.txt"
  [[ -f "$table" ]] || { echo "FAIL: no summary.txt (exit $rc)"; exit 1; }
  head -n 1 "$table" | grep -q "REHEARSAL ON THE CPU" || { echo "FAIL: verdict is not the rehearsal's (exit $rc)"; exit 1; }
  (( rc == 3 )) || { echo "FAIL: gpu_check.sh exited $rc, not 3 (no GPU, nothing failed)"; exit 1; }
else
  scripts/gpu_check.sh --rehearse-on-cpu --configure-only --jobs 2 --build-dir "$SCRATCH/build" --out "$SCRATCH/out" ||
    { echo "FAIL: gpu_check.sh --configure-only in the copy (exit $?)"; exit 1; }
  grep -q "CUDA on" "$SCRATCH/build/gpu_check_work/configure.log" ||
    { echo "FAIL: the copy configured without the CUDA backend"; exit 1; }
  grep -q "SL_HEADER_LIBS_DIR=$SCRATCH/tree/deps/include" "$SCRATCH/out/gpu_check.log" ||
    { echo "FAIL: configure did not take its headers from the carried deps/"; exit 1; }
fi
echo "PASS: gpu_check.sh ($MODE) from a copy of the tree plus deps/"
rm -rf "$SCRATCH"
