#!/usr/bin/env bash
# scripts/pack_gpu_deps.sh — run on a Debian dev machine: fills deps/ with what a GPU machine that has only
# the CUDA toolkit, CMake, ninja, a compiler and Python (no system packages, no network) lacks to build
# and run scalelab, so scripts/gpu_check.sh can run there (docs/cuda_backend.md "Running the GPU check").
#   scripts/pack_gpu_deps.sh [--out DIR] [--build-dir DIR]
#     --out DIR        where to write (default: deps/ in the repository; ignored by git)
#     --build-dir DIR  a configured build with bin/sl_make_shards, only if data/kjv must be made first
#
# deps/ holds (MANIFEST.txt inside lists every file, its Debian package and sha256):
#   include/   CLI/ (CLI11), nlohmann/ (json), gtest/, cblas.h openblas_config.h f77blas.h (the OpenMP
#              build's headers), zlib.h zconf.h
#   lib/       libopenblas.so.0 (OpenMP build) + libopenblas.so -> libopenblas.so.0, and the libraries it
#              needs that are neither glibc nor the compiler's runtime (libgfortran.so.5, libquadmath.so.0);
#              libgtest.a libgtest_main.a; libz.a (static: no libz.so.1 beside the system's)
#   data/kjv/  the prepared token shards (train_*.bin, val_*.bin), so the GPU machine needs no `bible`
# Binaries built against it run with LD_LIBRARY_PATH=deps/lib (gpu_check.sh sets it).
# Not copied: glibc, libstdc++, libgcc_s and libgomp (the GPU machine's compiler brings its own, and two
# OpenMP runtimes in one process are trouble). Idempotent: deps/ is rebuilt from scratch in a temporary
# folder and swapped in, so a second run gives the same deps/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$ROOT/deps"
BUILD_DIR="$ROOT/build"

die() { echo "[scalelab] pack_gpu_deps: $1" >&2; [[ $# -gt 1 ]] && echo "[scalelab]   hint: $2" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT_DIR="$(realpath -m "$2")"; shift 2 ;;
    --build-dir) BUILD_DIR="$(realpath -m "$2")"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument '$1'" "see scripts/pack_gpu_deps.sh --help" ;;
  esac
done

command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script reads Debian packages" \
  "run it on a Debian/Ubuntu dev machine (docs/design.md 'Platform facts'), then carry deps/ to the GPU machine"

# ---- the Debian packages it copies from ------------------------------------------------------
pkgs=(libopenblas-openmp-dev libopenblas0-openmp libgtest-dev libcli11-dev nlohmann-json3-dev zlib1g-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "pack_gpu_deps: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      die "apt-get install ${missing[*]} failed" "apt-get update, then run this script again"
  else
    die "missing Debian packages: ${missing[*]}" "sudo apt-get install -y ${missing[*]}"
  fi
fi

# A file of package $1 whose path ends in $2 (the first, if several).
pkg_file() {
  local f
  f=$(dpkg -L "$1" | grep -E "$2\$" | head -n 1) || true
  [[ -n "$f" && -e "$f" ]] || die "package $1 has no file matching '$2'" "apt-get install --reinstall $1"
  echo "$f"
}

# ---- the corpus shards -----------------------------------------------------------------------
KJV="$ROOT/data/kjv"
if ! compgen -G "$KJV/train_*.bin" >/dev/null || ! compgen -G "$KJV/val_*.bin" >/dev/null; then
  echo "pack_gpu_deps: $KJV has no shards; making them (scripts/prepare_corpus.sh --build-dir $BUILD_DIR)"
  "$ROOT/scripts/prepare_corpus.sh" --build-dir "$BUILD_DIR"
fi

# ---- fill a fresh folder, then swap it in ----------------------------------------------------
TMP="$OUT_DIR.tmp.$$"
rm -rf "$TMP"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/include" "$TMP/lib" "$TMP/data/kjv"
manifest=()  # "path package" lines

add() {  # add <package> <source file> <dest relative to deps/>: copies the file (links followed)
  mkdir -p "$(dirname "$TMP/$3")"
  cp -L "$2" "$TMP/$3"
  manifest+=("$3 $1")
}
add_dir() {  # add_dir <package> <source dir> <dest dir relative to deps/>
  cp -rL "$2" "$TMP/$3"
  manifest+=("$3/ $1")
}

# Headers.
add_dir libcli11-dev "$(dirname "$(pkg_file libcli11-dev /CLI/CLI.hpp)")" include/CLI
add_dir nlohmann-json3-dev "$(dirname "$(pkg_file nlohmann-json3-dev /nlohmann/json.hpp)")" include/nlohmann
add_dir libgtest-dev "$(dirname "$(pkg_file libgtest-dev /gtest/gtest.h)")" include/gtest
blas_inc="$(dirname "$(pkg_file libopenblas-openmp-dev /openblas-openmp/cblas.h)")"
for h in "$blas_inc"/*.h; do add libopenblas-openmp-dev "$h" "include/$(basename "$h")"; done
add zlib1g-dev "$(pkg_file zlib1g-dev /zlib.h)" include/zlib.h
add zlib1g-dev "$(pkg_file zlib1g-dev /zconf.h)" include/zconf.h

# Static libraries (nothing to find at run time).
add libgtest-dev "$(pkg_file libgtest-dev /libgtest.a)" lib/libgtest.a
add libgtest-dev "$(pkg_file libgtest-dev /libgtest_main.a)" lib/libgtest_main.a
add zlib1g-dev "$(pkg_file zlib1g-dev /libz.a)" lib/libz.a

# OpenBLAS (OpenMP build) under its soname, the link-time name beside it, then its runtime needs.
blas_so="$(pkg_file libopenblas0-openmp /openblas-openmp/libopenblas.so.0)"
add libopenblas0-openmp "$blas_so" lib/libopenblas.so.0
ln -s libopenblas.so.0 "$TMP/lib/libopenblas.so"
manifest+=("lib/libopenblas.so -> libopenblas.so.0")
# ldd lists the whole closure. Keep what the GPU machine may lack; leave glibc (libc, libm, libdl,
# libpthread, librt, ld-linux), the compiler runtime (libstdc++, libgcc_s) and libgomp to the system.
skip='^(linux-vdso|ld-linux[^ ]*|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libgomp)\.so'
while read -r name _ path _; do
  [[ -n "$path" && "$path" == /* ]] || continue
  if [[ "$name" =~ $skip ]]; then continue; fi
  owner=$(dpkg -S "$(realpath "$path")" 2>/dev/null | head -n 1 | cut -d: -f1) || owner="?"
  add "${owner:-?}" "$path" "lib/$name"
done < <(ldd "$blas_so" | grep '=>')
[[ -f "$TMP/lib/libgfortran.so.5" ]] || echo "pack_gpu_deps: note: libopenblas.so.0 does not need libgfortran.so.5 here"
if ldd "$blas_so" | grep -q "not found"; then
  die "ldd $blas_so reports a missing library" "apt-get install --reinstall libopenblas0-openmp libgfortran5"
fi

# The shards (not kjv.txt: the program reads only the shards).
for f in "$KJV"/train_*.bin "$KJV"/val_*.bin; do add data "$f" "data/kjv/$(basename "$f")"; done

# The newest glibc symbol version the libraries need: gpu_check.sh compares it with the GPU machine's.
glibc_min=$(for f in "$TMP"/lib/*.so*; do [[ -L "$f" ]] || objdump -T "$f"; done 2>/dev/null |
            grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
gtest_version=$(dpkg-query -W -f='${Version}' libgtest-dev)
{
  echo "# deps/ for scalelab GPU machines: written by scripts/pack_gpu_deps.sh; do not edit."
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
  echo "glibc_min=${glibc_min:-unknown}"
  echo "compiler_of_static_libs=$(gcc -dumpfullversion 2>/dev/null || echo unknown) (libgtest-dev $gtest_version)"
  echo "openblas=$(dpkg-query -W -f='${Version}' libopenblas0-openmp) (OpenMP build)"
  echo "# file  package"
  printf '%s\n' "${manifest[@]}"
  echo "# sha256"
  (cd "$TMP" && find . -type f ! -name MANIFEST.txt | sort | xargs sha256sum)
} > "$TMP/MANIFEST.txt"

rm -rf "$OUT_DIR"
mv "$TMP" "$OUT_DIR"
trap - EXIT

# ---- size --------------------------------------------------------------------------------------
deps_bytes=$(du -sb "$OUT_DIR" | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "pack_gpu_deps: wrote $OUT_DIR: $(mib "$deps_bytes") ($(find "$OUT_DIR" -type f | wc -l) files;" \
     "libopenblas.so.0 alone $(mib "$(stat -c %s "$OUT_DIR/lib/libopenblas.so.0")")); needs glibc >= ${glibc_min:-?}"
echo "next: scripts/gpu_check.sh --prepare (which ran this) checks that the tree plus deps/ fit what the device"
echo "      tool carries, and prints the command to run there"
