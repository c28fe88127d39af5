#!/usr/bin/env bash
# tests/gpu/device-check.sh — the one script for a lent GPU machine (about 12 minutes in all):
# each stage under its own `timeout`, a failed stage does not stop the later ones, everything
# written under $OUT (default ./gpu-out) with a summary in $OUT/summary.txt; exit 0 only when
# every stage passed.
#   1. bench/gpu_profile.py, store and stream, fp32, T=4096, 4 layers (kernel tables; needs ncu)
#   2. tests/gpu/run.sh --quick --no-bench (kernels, fixture steps; SBP_GPU_PREBUILT)
#   3. bench/gpu_bench.py at T=4096 and 16384 (fp32; AdamW on both sides)
# From the CPU machine: scripts/gpu-carry.sh, then the device tool's run with carry
#   .gpu build/tools/sbpc build/tools/sbp-train build/runtime/libsbprt.a
#   build/runtime/cuda/libsbprt_cuda.a build/tests/gpu/test_cuda_kernels
# and the command
#   tests/gpu/run-prebuilt.sh /work/main --exec bash tests/gpu/device-check.sh
# (run-prebuilt.sh sets up the libraries and runs this from /work/main).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-$root/gpu-out}
py=${PYTHON:-python3}
build=${SBP_GPU_PREBUILT:-$root/build}
mkdir -p "$out"
sum=$out/summary.txt
: >"$sum"
status=0
stage() { # NAME SECONDS COMMAND...
    local name=$1 limit=$2 rc=0 t0
    shift 2
    t0=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
    echo "$name: rc $rc in $(( $(date +%s) - t0 )) s (log $name.log)" | tee -a "$sum"
    tail -n 40 "$out/$name.log"
    [ $rc -eq 0 ] || status=1
}
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
for s in store stream; do
    stage "profile_$s" 120 "$py" "$root/bench/gpu_profile.py" --build "$build" --layers 4 \
        --seq-len 4096 --strategy "$s" --python "$py" --out "$out/profile"
    cp "$out/profile/profile.json" "$out/profile_$s.json" 2>/dev/null || true
done
stage run_quick 240 env SBP_GPU_PREBUILT="$build" SBP_GPU_TOTAL=230 PYTHON="$py" \
    bash "$root/tests/gpu/run.sh" --quick --no-bench
stage bench 200 "$py" "$root/bench/gpu_bench.py" --build "$build" --out "$out/bench" \
    --budget 185 --python "$py" --seq-lens 4096 16384
cp "$out/bench/gpu_bench.md" "$out/" 2>/dev/null || true
echo "device-check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$sum"
exit $status
