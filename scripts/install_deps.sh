#!/usr/bin/env bash
# scripts/install_deps.sh — installs the Debian/Ubuntu packages scalelab needs (as root), or prints the
# apt command to run (as a normal user). Used by scripts/demo.sh and scripts/test.sh.
#   scripts/install_deps.sh            build + test dependencies
#   scripts/install_deps.sh --demo     only what the demo needs (no GoogleTest, no MPI)
set -euo pipefail

pkgs=(cmake ninja-build g++ make libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev zlib1g-dev bible-kjv python3)
if [[ "${1:-}" != "--demo" ]]; then
  # libdnnl-dev (oneDNN): the CPU bf16-compute matmuls on its native bf16 GEMM (optional, CMake SL_WITH_DNNL)
  pkgs+=(libgtest-dev libopenmpi-dev openmpi-bin python3-venv libdnnl-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "[scalelab] missing packages: ${missing[*]}" >&2
  echo "[scalelab]   hint: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "[scalelab] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
