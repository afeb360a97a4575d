#!/usr/bin/env bash
# prepare_corpus.sh — make the token shards the labs train on (lab 02 format, docs/formats.md).
#   scripts/prepare_corpus.sh                     King James Bible -> data/kjv/kjv.txt -> data/kjv/*.bin
#   scripts/prepare_corpus.sh --text a.txt b.txt --out data/mine     shard any text files instead
# Options: --out DIR (default data/kjv), --build-dir DIR (default build; holds bin/sl_make_shards),
#          --val-fraction F, --shard-tokens N (passed to sl_make_shards), --force (redo even if valid).
# Idempotent: when the shards exist, pass `sl_make_shards --check` and were made from the same text
# with the same options (a stamp file records that), it does nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"  # the repository; defaults are relative to it
OUT="$ROOT/data/kjv"
BUILD="$ROOT/build"
TEXTS=()
MAKE_ARGS=()
FORCE=0

die() { echo "[scalelab] prepare_corpus: $1" >&2; [[ $# -gt 1 ]] && echo "[scalelab]   hint: $2" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --val-fraction|--shard-tokens) MAKE_ARGS+=("$1" "$2"); shift 2 ;;
    --force) FORCE=1; shift ;;
    --text) shift
            while [[ $# -gt 0 && "$1" != --* ]]; do TEXTS+=("$1"); shift; done
            [[ ${#TEXTS[@]} -gt 0 ]] || die "--text needs at least one file" "scripts/prepare_corpus.sh --text FILE... --out DIR" ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" "see scripts/prepare_corpus.sh --help" ;;
  esac
done

# ---- the tool -------------------------------------------------------------------------------
MAKE_SHARDS="$BUILD/bin/sl_make_shards"
if [[ ! -x "$MAKE_SHARDS" ]]; then
  if [[ -f "$BUILD/CMakeCache.txt" ]]; then  # a configured build: build just the tool
    echo "prepare_corpus: building sl_make_shards in $BUILD"
    cmake --build "$BUILD" --target sl_make_shards >/dev/null || die "building sl_make_shards failed" "cmake --build $BUILD --target sl_make_shards"
  else
    die "$MAKE_SHARDS not found" "configure and build first: cmake -S . -B build -G Ninja && cmake --build build --target sl_make_shards (or pass --build-dir DIR)"
  fi
fi

for f in "${TEXTS[@]}"; do  # check the inputs before anything is created
  [[ -f "$f" && -r "$f" ]] || die "text file '$f' does not exist or is not readable" "check the path given to --text"
done
mkdir -p "$OUT" || die "cannot create $OUT" "choose another --out"

# ---- the text -------------------------------------------------------------------------------
if [[ ${#TEXTS[@]} -eq 0 ]]; then
  KJV="$OUT/kjv.txt"
  if [[ ! -s "$KJV" || $FORCE -eq 1 ]]; then
    if ! command -v bible >/dev/null 2>&1; then
      if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "prepare_corpus: installing bible-kjv (apt-get install bible-kjv)"
        apt-get install -y bible-kjv >/dev/null || die "apt-get install bible-kjv failed" "run apt-get update first, or pass --text FILE to shard another text"
      else
        die "the 'bible' program is missing" "sudo apt-get install bible-kjv (Debian/Ubuntu), or pass --text FILE to shard another text"
      fi
    fi
    # `bible -f` prints one verse per line with a reference prefix: "Ge1:1 In the beginning ...",
    # "SSol1:1 ...", "1Jn1:1 ...", "Rev22:21 ...". Strip "<book><chapter>:<verse> " to leave the text.
    bible -f Gen1:1-Rev22:21 | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$KJV.tmp"
    [[ $(wc -l < "$KJV.tmp") -eq 31102 ]] || die "expected 31102 verses from bible -f, got $(wc -l < "$KJV.tmp")" "is bible-kjv complete? apt-get install --reinstall bible-kjv-text"
    if grep -qE '^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ ' "$KJV.tmp"; then
      die "verse prefixes left in $KJV.tmp" "the bible program's output format changed; adjust the sed pattern in this script"
    fi
    mv "$KJV.tmp" "$KJV"
  fi
  TEXTS=("$KJV")
fi

# ---- the shards (skipped when valid and made from the same text and options) ----------------
STAMP="$OUT/.prepare_corpus.stamp"
want_stamp="$(sha256sum "${TEXTS[@]}" | awk '{print $1}') | ${MAKE_ARGS[*]:-defaults}"
if [[ $FORCE -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] &&
   "$MAKE_SHARDS" --check "$OUT" >/dev/null 2>&1; then
  echo "prepare_corpus: $OUT is up to date (shards valid, same text and options; --force to redo)"
  exit 0
fi
rm -f "$STAMP"
"$MAKE_SHARDS" "${TEXTS[@]}" --out-dir "$OUT" "${MAKE_ARGS[@]}"
"$MAKE_SHARDS" --check "$OUT" >/dev/null
echo "$want_stamp" > "$STAMP"
echo "prepare_corpus: shards in $OUT (train_*.bin, val_*.bin)"
