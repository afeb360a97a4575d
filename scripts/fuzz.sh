#!/usr/bin/env bash
# scripts/fuzz.sh — runs the libFuzzer targets of tests/fuzz/ (the shard reader, the checkpoint reader) for a
# bounded time each, then the manifests' property test (tests/robustness/test_manifest_fuzz.py).
#   scripts/fuzz.sh [--seconds N] [--build-dir DIR] [--jobs J]
# Configures DIR (default build-fuzz) with clang and -DSL_FUZZ=ON (AddressSanitizer + UBSan + the fuzzer's
# coverage; CPU only, reference track), builds the two targets, and runs each for N seconds (default 20, the CI
# form) from the committed corpus tests/fuzz/corpus/<name>/ plus a scratch corpus in DIR/fuzz-corpus/<name>/.
# A finding (a crash, a sanitizer report, an input slower than 10 s) stops its target with the input saved as
# DIR/fuzz-findings/<name>/crash-* (or timeout-*, oom-*) and fails the run: fix it, then copy the input into
# tests/fuzz/corpus/<name>/ as a regression (ctest fuzz.<name>.corpus replays the corpus) and add a unit test.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=20
build_dir=build-fuzz
jobs=2
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "usage: scripts/fuzz.sh [--seconds N] [--build-dir DIR] [--jobs J]" >&2; exit 2 ;;
  esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "scripts/fuzz.sh: --seconds $seconds is not a whole number >= 1" >&2; exit 2; }
command -v clang++ >/dev/null || { echo "scripts/fuzz.sh: needs clang++ (scripts/install_deps.sh)" >&2; exit 2; }

CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSL_WITH_CUDA=OFF \
  -DSL_WITH_MPI=OFF -DSL_BUILD_TESTS=OFF -DSL_BUILD_LEARNER=OFF -DSL_FUZZ=ON >/dev/null
cmake --build "$build_dir" -j "$jobs" --target fuzz_shard fuzz_checkpoint

status=0
for name in shard checkpoint; do
  scratch=$build_dir/fuzz-corpus/$name findings=$build_dir/fuzz-findings/$name
  mkdir -p "$scratch" "$findings"
  echo "== fuzz_$name: $seconds s from tests/fuzz/corpus/$name"
  if ! "$build_dir/bin/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$findings/" "$scratch" "tests/fuzz/corpus/$name" 2>"$build_dir/fuzz_$name.log"; then
    tail -n 40 "$build_dir/fuzz_$name.log"
    echo "scripts/fuzz.sh: fuzz_$name found an input that fails: $(ls "$findings" | head -n 1) in $findings" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$build_dir/fuzz_$name.log" | tail -n 2
  fi
done
echo "== the manifests' property test"
python3 tests/robustness/test_manifest_fuzz.py || status=1
exit $status
