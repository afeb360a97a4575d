#!/usr/bin/env bash
# test_blind_runs.sh — the four blind runs of part 2 (why_not_2x.sh --sim --blind K) print the same options
# whichever cause each provokes (ctest lab04_scaling.blind_runs_look_alike).
#   tests/lab04_scaling/test_blind_runs.sh <build dir> [more why_not_2x.sh options, e.g. --timing-only]
# Compares, across K = 1..4, every printed line that names options (the "== run" lines, the table's header,
# the sweep's label, the "timed steps" row) and asserts that no note and no verdict is printed: a header
# with "B=1 each" or "link ethernet100" would be the answer key. Simulated GPUs: about 10 s per K, about 3 s
# with --timing-only (what ctest passes: the header is printed by the same code whether ops compute or not).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "$1" && pwd)"
shift
extra=("$@")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $1"; exit 1; }

cd "$ROOT" || exit 1
for k in 1 2 3 4; do
  bash scripts/why_not_2x.sh --build-dir "$BUILD" --sim "${extra[@]}" --blind "$k" --out "$tmp/blind-$k" > "$tmp/$k.txt" 2>&1
  rc=$?
  (( rc == 77 )) && { cat "$tmp/$k.txt"; exit 77; }  # no corpus or no mpirun: Skipped
  (( rc == 0 )) || { cat "$tmp/$k.txt"; fail "--blind $k exited $rc"; }
  # What names options; numbers of the table and the sweep's rates are the exercise, left out here.
  grep -E '^== (single|multi|sweep)|^Why not|timed steps' "$tmp/$k.txt" > "$tmp/$k.options"
  grep -oE '^  batch sweep[^:]*:' "$tmp/$k.txt" >> "$tmp/$k.options"
  [[ $(wc -l < "$tmp/$k.options") -ge 4 ]] || { cat "$tmp/$k.txt"; fail "--blind $k: its header lines are missing"; }
  if grep -nE 'note:|Verdict|CULPRIT' "$tmp/$k.txt"; then fail "--blind $k prints a note or the verdict"; fi
done
for k in 2 3 4; do
  diff "$tmp/1.options" "$tmp/$k.options" > "$tmp/diff" || { cat "$tmp/diff"; fail "blind 1 and blind $k print different options"; }
done
echo "PASS: the four blind runs print the same options:"
cat "$tmp/1.options"
