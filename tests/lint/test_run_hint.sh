#!/usr/bin/env bash
# test_run_hint.sh — scripts/run and scripts/hint do what their READMEs promise (ctest scripts.run_and_hint).
#   tests/lint/test_run_hint.sh <build dir>
# scripts/hint walks tiers 1, 2, 3 and stays at 3, with its state in a build dir of its own; --tier and
# --reset; --lang hi (the Hindi hints and the list's words, or English with a notice); unknown TODOs are refused. scripts/run refuses bad input with exit 2 and a hint, and runs the
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
# The list and the refusal in the language of the hints shown (scripts/lib/lang.py FRAME); English as before.
has "^lab 03: hints in labs/03_ddp/hints.md (scripts/hint 03-K shows the next tier)$" "$(hint 03)" || fail "English list header"
has "^लैब 03: संकेत labs/03_ddp/hints.hi.md में (\`scripts/hint 03-K --lang hi\` अगला टियर दिखाता है)$" \
  "$(hint 03 --lang hi)" || fail "--lang hi: the list's header is not Hindi: $(hint 03 --lang hi)"
has "lab03-5  टियर 1 देखा" "$(hint 03 --lang hi)" || fail "--lang hi: the list does not show lab03-5's tier in Hindi"
has "^hint: no hints for lab03-99; lab 03 has lab03-1, " "$(hint 03-99 2>&1)" || fail "the English refusal changed"
has "^hint: lab03-99 के कोई संकेत नहीं हैं; लैब 03 के TODO: lab03-1, " "$(hint 03-99 --lang hi 2>&1)" \
  || fail "--lang hi: the refusal of an unknown TODO is not Hindi"
# Every lab has hints.hi.md by now, so the fallback runs on a copy of scripts/hint and what it reads (its
# libraries, the labs' manifests) in a temp tree where lab 05 has only hints.md.
fb="$tmp/fallback"; mkdir -p "$fb/scripts" "$fb/tests/lint"
cp "$ROOT/scripts/hint" "$fb/scripts/" && cp -r "$ROOT/scripts/lib" "$fb/scripts/" && cp "$ROOT/tests/lint/lab_docs.py" "$fb/tests/lint/" \
  || fail "could not copy scripts/hint for the fallback check"
for m in "$ROOT"/labs/*/lab.json; do d=$(basename "$(dirname "$m")"); mkdir -p "$fb/labs/$d" && cp "$m" "$fb/labs/$d/"; done
cp "$ROOT/labs/05_tensor_parallel/hints.md" "$fb/labs/05_tensor_parallel/" || fail "labs/05_tensor_parallel/hints.md is missing"
out=$("$fb/scripts/hint" 05-1 --tier 1 --lang hi --build-dir "$tmp/fallback-build" 2>&1) || fail "scripts/hint 05-1 --lang hi (no hints.hi.md) exited $?: $out"
has "notice: labs/05_tensor_parallel/hints.hi.md has no Hindi version yet; showing the English one" "$out" || fail "no notice: $out"
has "सूचना: labs/05_tensor_parallel/hints.hi.md अभी हिन्दी में नहीं है" "$out" || fail "the notice has no Hindi: $out"
has "== lab05-1, tier 1 of 3" "$out" || fail "no English fallback: $out"
has "A layout is three numbers per rank" "$out" || fail "the fallback did not print the English tier 1: $out"
# and in the repository, lab 05's Hindi hints are read (labs/05_tensor_parallel/hints.hi.md)
has "हर रैंक (rank) के लिए लेआउट (layout)" "$(hint 05-1 --tier 1 --lang hi)" || fail "--lang hi did not print lab 05's Hindi tier 1"
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
