#!/usr/bin/env bash
# scripts/gpu-carry.sh — what a GPU machine without this project's build dependencies
# (protobuf-c, OpenBLAS, Open MPI) needs to run tests/gpu/run.sh on a build made here: the
# build's tools, runtime libraries and kernel test, and the shared libraries they load, in
# .gpu/ (ignored by git). tests/gpu/run-prebuilt.sh unpacks it there.
#
#   scripts/gpu-carry.sh [BUILD]      BUILD: a configured and built folder (default build)
#
# The machine must hold the checkout at the same absolute path as here (sbpc bakes the runtime
# libraries' paths into the step's link line): run-prebuilt.sh links it there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=$root/.gpu
grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || { mkdir -p "$root/.git/info"; echo '/.gpu/' >>"$root/.git/info/exclude"; }
rm -rf "$out"
mkdir -p "$out/stage/lib"
for f in tools/sbpc tools/sbp-train runtime/libsbprt.a runtime/cuda/libsbprt_cuda.a tests/gpu/test_cuda_kernels; do
    [ -f "$build/$f" ] || { echo "gpu-carry: $build/$f is missing (build it first)" >&2; exit 1; }
done
# the shared libraries the tools and the kernel test load, but not the CUDA toolkit's own
# (cudart, cuBLAS, NCCL: the GPU machine has its own) nor glibc's
for bin in "$build/tools/sbp-train" "$build/tools/sbpc" "$build/tests/gpu/test_cuda_kernels"; do
    ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|/usr/local/' |
    while read -r lib; do cp -L "$lib" "$out/stage/lib/"; done
# the paths the CPU link line of sbpc names (SBP_RT_LINK), kept as they are here
sed -n 's/.*SBP_RT_LINK=\"\\"\([^\\]*\)\\"\".*/\1/p' "$build/codegen/CMakeFiles/sbpcodegen.dir/flags.make" |
    tr ' ' '\n' | grep '^/' | grep -v "^$build" >"$out/stage/link-paths.txt" || true
while read -r p; do
    [ -f "$p" ] && { mkdir -p "$out/stage/root$(dirname "$p")"; cp -L "$p" "$out/stage/root$p"; }
done <"$out/stage/link-paths.txt"
tar -C "$out/stage" -cJf "$out/libs.tar.xz" .
rm -rf "$out/stage"
# what run.sh reads of the configure step (NCCL or not)
cmake -S "$root" -B "$build" >"$out/configure.log" 2>&1
echo "gpu-carry: $out ($(du -sh "$out" | cut -f1)); carry .gpu and the build's files:"
echo "  build/tools/sbpc build/tools/sbp-train build/runtime/libsbprt.a build/runtime/cuda/libsbprt_cuda.a build/tests/gpu/test_cuda_kernels"
