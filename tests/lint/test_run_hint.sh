#!/usr/bin/env bash
# test_run_hint.sh — scripts/run and scripts/hint do what their READMEs promise (ctest scripts.run_and_hint).
#   tests/lint/test_run_hint.sh <build dir>
# scripts/hint walks tiers 1, 2, 3 and stays at 3, with its state in a build dir of its own; --tier and
# --reset; --lang hi (the Hindi hints, or English with a notice); unknown TODOs are refused. scripts/run refuses bad input with exit 2 and a hint, and runs the
# reference lab 03 program on 2 ranks (tiny model, 2 steps: a few seconds) without rebuilding it; its own
# options after the program's are refused, naming where they go; the program's --help prints once (one rank).
# scripts/grade refuses a lab without graded checks with the reason.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $1"; exit 1; }

hint() { "$ROOT/scripts/hint" "$@" --build-dir "$tmp"; }
for want in 1 2 3 3; do
  out=$(hint 03-5) || fail "scripts/hint 03-5 exited $?"
  grep -q "^== lab03-5, tier $want of 3" <<<"$out" || fail "the call that should show tier $want printed: $out"
done
has() { grep -q "$1" <<<"$2"; }  # not `hint | grep -q`: grep -q closes the pipe early
has "tier 1 of 3" "$(hint 03-5 --tier 1)" || fail "--tier 1"
has "lab03-5  tiers 1-3 seen" "$(hint 03)" || fail "the lab's list does not show lab03-5's tiers"
hint 03-5 --reset >/dev/null && has "tier 1 of 3" "$(hint 03-5)" || fail "--reset did not start over"
hint 03-99 >/dev/null 2>&1 && fail "an unknown TODO was accepted"
hint 3-5 >/dev/null 2>&1 && fail "a one-digit lab was accepted"
# --lang hi (and SCALELAB_LANG=hi) reads labs/03_ddp/hints.hi.md; a lab without a Hindi hints file falls back
# to English with a one-line notice in both languages.
has "== lab03-1, tier 1 of 3" "$(hint 03-1 --tier 1 --lang hi)" || fail "--lang hi: no tier header"
has "हर रैंक (rank) ने अपना मॉडल" "$(hint 03-1 --tier 1 --lang hi)" || fail "--lang hi did not print the Hindi tier 1"
has "हर रैंक (rank) ने अपना मॉडल" "$(SCALELAB_LANG=hi hint 03-1 --tier 1)" || fail "SCALELAB_LANG=hi: not the Hindi tier"
has "Each rank built its model" "$(SCALELAB_LANG=hi hint 03-1 --tier 1 --lang en)" || fail "--lang en does not win"
SCALELAB_LANG=xx hint 03-1 >/dev/null 2>&1 && fail "SCALELAB_LANG=xx was accepted"
for h in "$ROOT"/labs/*/hints.md; do  # a lab without hints.hi.md (whichever labs have one by now)
  [[ -f "${h%.md}.hi.md" ]] && continue
  d=$(basename "$(dirname "$h")"); n=${d%%_*}
  out=$(hint "$n-1" --tier 1 --lang hi 2>&1) || fail "scripts/hint $n-1 --lang hi exited $?: $out"
  has "notice: labs/$d/hints.hi.md has no Hindi version yet; showing the English one" "$out" || fail "no notice: $out"
  has "सूचना: labs/$d/hints.hi.md अभी हिन्दी में नहीं है" "$out" || fail "the notice has no Hindi: $out"
  has "== lab$n-1, tier 1 of 3" "$out" || fail "no English fallback: $out"
  break
done
echo "scripts/hint: ok"

# scripts/grade on a lab it cannot grade says why (never the build tool's "unknown target"), exit 2.
for case in "99|there is no lab 99" "00|lab 00 has no graded checks"; do
  out=$("$ROOT/scripts/grade" "${case%%|*}" --build-dir "$BUILD" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "scripts/grade ${case%%|*} exited $rc, expected 2: $out"
  grep -q "nothing to grade: ${case#*|}" <<<"$out" || fail "scripts/grade ${case%%|*} did not say why: $out"
  grep -q "unknown target" <<<"$out" && fail "scripts/grade ${case%%|*} printed the build tool's error: $out"
done
echo "scripts/grade: nothing to grade, said so"

run() { "$ROOT/scripts/run" "$@"; }
for bad in "3" "03 --np 0" "01 --np 2" "02 --np 2" "09 --np 2" "99" "03 --track mine"; do
  out=$(run $bad --build-dir "$BUILD" --no-build 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "scripts/run $bad exited $rc, expected 2: $out"
  grep -q "hint:\|run:" <<<"$out" || fail "scripts/run $bad: no message: $out"
done
# Its own options come first, and it says so: in --help, and when one follows the program's options.
has "first this script's own" "$(run --help)" || fail "scripts/run --help does not say its options come first"
for late in "--steps 5 --track reference" "--steps 5 --np 2" "--model tiny --no-build"; do
  out=$(run 03 --build-dir "$BUILD" --no-build $late 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "scripts/run 03 $late exited $rc, expected 2: $out"
  has "is an option of scripts/run, given after the program's options" "$out" || fail "scripts/run 03 $late: $out"
done
echo "scripts/run: its own options first, said so"
if command -v mpirun >/dev/null 2>&1 && [[ -x "$BUILD/bin/reference/lab03_ddp" && -d "$ROOT/data/kjv" ]]; then
  out=$(run 03 --track reference --build-dir "$BUILD" --no-build -- --model tiny --seq-len 16 --micro-batch 2 --steps 2 --quiet \
        --log-dir "$tmp/runs" --val-batches 1 --sample-tokens 0 2>&1) || fail "scripts/run 03 (reference, 2 ranks) failed: $out"
  grep -q "mpirun -np 2 --oversubscribe --bind-to none" <<<"$out" || fail "scripts/run 03 did not launch 2 ranks: $out"
  ls "$tmp"/runs/lab03/*/rank1.jsonl >/dev/null 2>&1 || fail "scripts/run 03: no rank 1 log"
  # The program's --help from one rank, printed once (2 ranks printed it twice).
  out=$(run 03 --track reference --build-dir "$BUILD" --no-build --help 2>&1) || fail "scripts/run 03 --help failed: $out"
  [[ $(grep -c "^Usage:" <<<"$out") -eq 1 ]] || fail "scripts/run 03 --help: the program's usage not printed once: $out"
  echo "scripts/run: ok"
else
  echo "scripts/run: bad input ok; the 2-rank run needs mpirun, $BUILD/bin/reference/lab03_ddp and data/kjv"
fi
