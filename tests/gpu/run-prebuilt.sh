#!/usr/bin/env bash
# tests/gpu/run-prebuilt.sh — tests/gpu/run.sh on a GPU machine that lacks this project's build
# dependencies, over a build made elsewhere (scripts/gpu-carry.sh): the carried shared
# libraries go to a private folder (and the few files sbpc's CPU link line names, to those very
# paths when they are missing here), the checkout is linked at the path the build was made in,
# and run.sh runs with SBP_GPU_PREBUILT. Arguments go to run.sh, or with --exec a command runs
# in that environment instead (from ORIGINAL_ROOT), e.g. bench/gpu_profile.py.
#
#   tests/gpu/run-prebuilt.sh ORIGINAL_ROOT [run.sh's options]
#   tests/gpu/run-prebuilt.sh ORIGINAL_ROOT --exec COMMAND [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
orig=$1
shift
[ -f "$root/.gpu/libs.tar.xz" ] || { echo "run-prebuilt: no .gpu/libs.tar.xz (scripts/gpu-carry.sh)" >&2; exit 1; }
libs=/tmp/sbp-gpu-libs
rm -rf "$libs"
mkdir -p "$libs"
tar -C "$libs" -xJf "$root/.gpu/libs.tar.xz"
# sbpc's CPU link line names absolute paths: give those that are missing here the carried copy
while read -r p; do
    [ -e "$p" ] || { mkdir -p "$(dirname "$p")"; cp "$libs/root$p" "$p"; }
done <"$libs/link-paths.txt"
if [ "$root" != "$orig" ]; then
    mkdir -p "$(dirname "$orig")"
    [ -e "$orig" ] || ln -s "$root" "$orig"
fi
cp "$root/.gpu/configure.log" "$root/build/configure.log"
# the CUDA toolkit's libraries (cudart, cuBLAS) where the build's link line looks for them
# (lib, as the toolkit it was built with had it), and NCCL from the Python environment's wheel
cuda=/usr/local/cuda
[ -e "$cuda/lib" ] || ln -s lib64 "$cuda/lib" || true
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$libs/lib:$cuda/lib64:$cuda/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$cuda/bin:$PATH"
cd "$orig"
if [ "${1:-}" = --exec ]; then
    shift
    exec "$@"
fi
SBP_GPU_PREBUILT="$orig/build" exec bash "$orig/tests/gpu/run.sh" "$@"
