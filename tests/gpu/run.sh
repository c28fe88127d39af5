#!/usr/bin/env bash
# tests/gpu/run.sh — build the CUDA backend and run its kernel tests on a machine with an
# NVIDIA GPU: every kernel against its CPU twin on random data, a table of max relative
# errors and timings per kernel, and a summary.  Takes about 2-3 minutes on an H200 with 16
# cores (most of it compiling); everything has a timeout, the whole script stays under 8.
#
# Builds tests/gpu standalone (only the runtime and these tests: needs cmake >= 3.20, a C
# compiler, nvcc (PATH, CUDACXX or /usr/local/cuda), OpenBLAS and OpenMP — not protobuf-c,
# ONNX or cmocka), in Release, for sm_90 unless CMAKE_CUDA_ARCHITECTURES or CUDAARCHS says
# otherwise.
#
#   tests/gpu/run.sh              build, then the full-size test
#   tests/gpu/run.sh --quick      small sizes only (seconds)
#   tests/gpu/run.sh --sanitize   also run the small sizes under compute-sanitizer
#                                 (memcheck, racecheck, synccheck), a few minutes more
# Environment: SBP_GPU_BUILD (build folder, default build-gpu at the repository root).
# Exit status: 0 when everything passed; 1 otherwise (including "no GPU visible").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${SBP_GPU_BUILD:-$root/build-gpu}
quick=0
sanitize=0
for arg in "$@"; do
    case "$arg" in
    --quick) quick=1 ;;
    --sanitize) sanitize=1 ;;
    *) echo "usage: $0 [--quick] [--sanitize]" >&2; exit 2 ;;
    esac
done

t_start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t_start ))s] $*"; }

stamp "tests/gpu/run.sh on $(hostname) ($(nproc) cores)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader || true
else
    echo "nvidia-smi not found"
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -n 2 | head -n 1

stamp "configure ($build)"
mkdir -p "$build"
cfg=(-S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release)
if [ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]; then
    cfg+=("-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES")
fi
if ! timeout 120 cmake "${cfg[@]}" >"$build/configure.log" 2>&1; then
    tail -n 30 "$build/configure.log"
    stamp "FAILED: configure (log: $build/configure.log)"
    exit 1
fi
grep -E "CUDA compiler identification|Found CUDAToolkit" "$build/configure.log" || true

stamp "build"
if ! timeout 300 cmake --build "$build" -j"$(nproc)" --target test_cuda_kernels >"$build/build.log" 2>&1; then
    grep -E "error|Error" "$build/build.log" | head -n 40 || tail -n 40 "$build/build.log"
    stamp "FAILED: build (log: $build/build.log)"
    exit 1
fi
if grep -qi "warning" "$build/build.log"; then
    echo "build warnings:"
    grep -i "warning" "$build/build.log" | head -n 20
fi
test_bin="$build/test_cuda_kernels"

status=0
run_test() { # label, timeout, command...
    local label=$1 limit=$2
    shift 2
    stamp "$label"
    set +e
    timeout "$limit" "$@"
    local rc=$?
    set -e
    case $rc in
    0) ;;
    77) echo "the test saw no CUDA device: is a GPU visible here (CUDA_VISIBLE_DEVICES, driver)?"; status=1 ;;
    124) echo "TIMEOUT after ${limit}s: $label"; status=1 ;;
    *) echo "FAILED ($rc): $label"; status=1 ;;
    esac
}

if [ $quick -eq 1 ]; then
    run_test "kernel tests, small sizes" 120 "$test_bin" --quick
else
    run_test "kernel tests, full sizes" 300 "$test_bin"
fi

if [ $sanitize -eq 1 ]; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
        for tool in memcheck racecheck synccheck; do
            # API errors are expected: the test provokes an out-of-memory on purpose.
            run_test "compute-sanitizer --tool $tool (small sizes)" 240 \
                compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 \
                "$test_bin" --quick
        done
    else
        echo "compute-sanitizer not found; --sanitize skipped"
        status=1
    fi
fi

if [ $status -eq 0 ]; then
    stamp "PASSED: tests/gpu"
else
    stamp "FAILED: tests/gpu"
fi
exit $status
