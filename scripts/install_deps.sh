#!/usr/bin/env bash
# scripts/install_deps.sh — installs the Debian/Ubuntu packages scalelab needs (as root), or prints the
# apt command to run (as a normal user). Used by scripts/demo.sh and scripts/test.sh.
#   scripts/install_deps.sh            build + test dependencies
#   scripts/install_deps.sh --demo     only what the demo needs (no GoogleTest, no MPI, no oneDNN)
#   scripts/install_deps.sh --list     print the build + test package list, one per line, and exit
#                                      (scripts/check_deps.py reads it: is the list complete?)
# Everything the default build and the tests use must be on this list: packages are installed with
# --no-install-recommends, so a package that another one only Recommends is listed here itself.
# scripts/check_deps.py (ctest build.deps_complete, run by CI) maps every file the build found to its
# package and fails when one is neither listed here nor pulled in by a listed package's Depends.
set -euo pipefail

pkgs=(cmake ninja-build g++ make libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev zlib1g-dev bible-kjv python3)
if [[ "${1:-}" != "--demo" ]]; then
  # pkgconf: CMake's find modules (FindMPI, FindOpenCL) ask pkg-config first when it is there; listed so
  # that a fresh machine configures the way a used one does.
  pkgs+=(libgtest-dev libopenmpi-dev openmpi-bin python3-venv pkgconf)
  # ccache: the planted mistakes' second build takes the main build's objects from it (CMake SL_CCACHE).
  pkgs+=(ccache)
  # oneDNN: the CPU bf16-compute matmuls on its native bf16 GEMM (CMake SL_WITH_DNNL, AUTO by default;
  # README "Dependencies" says why it is in the default set). Debian's dnnl-config.cmake requires OpenCL
  # (its GPU runtime), whose development files are only a Recommends of libdnnl-dev: ocl-icd-opencl-dev.
  pkgs+=(libdnnl-dev ocl-icd-opencl-dev)
  # iproute2: ip and tc for the two-node cluster on one machine (scripts/netns_cluster.sh, ctest netns.*;
  # its unshare comes from util-linux, which Debian installs everywhere).
  pkgs+=(iproute2)
fi
if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
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
  echo "[scalelab]   hint: sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "[scalelab] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
