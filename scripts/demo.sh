#!/usr/bin/env bash
# scripts/demo.sh — the one-command demo: a GPT-2-style model (about 1.9M parameters) learns the King
# James Bible on the CPU, with loss, tokens/s and MFU reported and a text sample at the end.
#   1. installs the Debian packages it needs (as root; otherwise prints the apt command)
#   2. configures and builds a CPU-only build of just lab 01's reference program (build-demo/)
#   3. fetches and prepares the corpus (scripts/prepare_corpus.sh -> data/kjv/)
#   4. trains lab 01's reference track and prints a summary; logs in runs/lab01/<run id>/
# Takes about 5 minutes on 2 cores (1 to build, 4 to train). Extra arguments go to the training program, e.g. --steps 100.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh --demo

build_dir=build-demo
echo "== build (CPU only, reference track, $build_dir/)"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSL_WITH_CUDA=OFF -DSL_BUILD_TESTS=OFF \
  -DSL_BUILD_LEARNER=OFF -DSL_WITH_MPI=OFF >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target lab01_single_device_ref sl_make_shards

echo "== corpus"
scripts/prepare_corpus.sh --build-dir "$build_dir" --out data/kjv

echo "== train (lab 01, reference track)"
# The demo's choices, each dropped when you give that option yourself (CLI11 takes an option once).
defaults=()
for opt_value in "--steps 600" "--val-every 100" "--run-id demo-$(date -u +%Y%m%d-%H%M%S)"; do
  opt=${opt_value%% *}
  [[ " $* " == *" $opt "* || " $* " == *" $opt="* ]] || defaults+=($opt_value)
done
"$build_dir/bin/reference/lab01_single_device" --data data/kjv --model demo --batch 16 --seq-len 256 \
  "${defaults[@]}" "$@"
