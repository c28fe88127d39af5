#!/usr/bin/env bash
# install-deps.sh — installs what sbpc needs on a fresh Debian (bookworm or newer) machine.
# Build: cmake, a C compiler, protobuf-c (protoc-c + library), the ONNX schema (libonnx-dev),
# OpenBLAS, cmocka, clang with its libFuzzer/sanitizer runtimes. Runs as root or via sudo.
# Tests: python3 with numpy and onnx (the io cross-checks read what sbpio writes with them), and
# python3-venv, with which scripts/install-venv.sh makes the pinned torch/PEFT environment.
# Data parallel: Open MPI (openmpi-bin, libopenmpi-dev); sbp-train builds without it.
# Optional: SBP_WITH_TORCH=1 also installs Debian's PyTorch (fixture regeneration and references
# only; nothing at build or run time needs Python).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
pkgs=(cmake make gcc clang libclang-rt-14-dev pkg-config
      protobuf-c-compiler libprotobuf-c-dev libonnx-dev
      libopenblas-dev libcmocka-dev python3 python3-numpy python3-onnx python3-venv
      openmpi-bin libopenmpi-dev) # sbp-train under mpirun, and tests/dist
if [ "${SBP_WITH_TORCH:-0}" = 1 ]; then pkgs+=(python3-torch); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: everything is installed"
fi
