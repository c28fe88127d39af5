#!/usr/bin/env bash
# tests/gpu/device-check.sh — the one script for a lent GPU machine, at most 680 s in all (one
# deadline: each stage runs under `timeout` with the smaller of its own limit and what is left,
# and the benchmark gets whatever the earlier stages left unused); a failed stage does not stop
# the later ones; exit 0 only when every stage passed.
#   1. bench/gpu_profile.py, store and stream, fp32, T=4096, 4 layers, AdamW (kernel tables;
#      needs ncu), at most 120 s each
#   2. tests/gpu/run.sh --quick --no-bench (kernels, fixture steps; SBP_GPU_PREBUILT), at most
#      240 s
#   3. bench/gpu_bench.py, the rest (about 185 s when stages 1 and 2 use all of theirs): the
#      cells fp32:4096 bf16:4096 bf16:16384 fp32:16384 in that order (each cell's target pairs
#      first: stream, torch+ckpt, then checkpoint, store, torch), 4 steps a run (the median of
#      the 2 after 2 warm-up ones), at most 150 s a run. Left out for the budget: T = 32768,
#      the largest-T search (--max-t 0), the bf16 profiles; whatever the time does not reach is
#      a "not run (out of time)" row of the table, so the JSON says what was left out.
# Everything is written under $WORK (default /tmp/sbp-device-check: the 3 GB export stays off
# $OUT), and at the end these 8 files go to $OUT (default ./gpu-out): summary.txt (stages,
# times, nvidia-smi), profile_store.log, profile_stream.log, run_quick.log, bench.log,
# gpu_bench.md, gpu_bench.json, profile.json (both profiles' kernel lists).
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
work=${WORK:-/tmp/sbp-device-check}
py=${PYTHON:-python3}
build=${SBP_GPU_PREBUILT:-$root/build}
total=${SBP_DEVICE_CHECK_TOTAL:-680}
deadline=$(( $(date +%s) + total ))
mkdir -p "$out" "$work"
sum=$work/summary.txt
: >"$sum"
status=0
left() { echo $(( deadline - $(date +%s) )); }
stage() { # NAME SECONDS COMMAND...: SECONDS or what is left before the deadline, less 15 s
    local name=$1 limit=$2 rc=0 t0 l
    shift 2
    l=$(( $(left) - 15 ))
    [ "$limit" -gt "$l" ] && limit=$l
    if [ "$limit" -lt 20 ]; then
        echo "$name: SKIPPED, out of time ($(left) s left)" | tee -a "$sum"
        status=1
        return
    fi
    t0=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$work/$name.log" 2>&1 || rc=$?
    echo "$name: rc $rc in $(( $(date +%s) - t0 )) s (log $name.log)" | tee -a "$sum"
    tail -n 40 "$work/$name.log"
    [ $rc -eq 0 ] || status=1
}
for s in store stream; do
    stage "profile_$s" 120 "$py" "$root/bench/gpu_profile.py" --build "$build" --layers 4 \
        --seq-len 4096 --strategy "$s" --precision fp32 --python "$py" \
        --out "$work/profile_$s" --work "$work/profile_model"
done
stage run_quick 240 env SBP_GPU_PREBUILT="$build" SBP_GPU_TOTAL=230 PYTHON="$py" \
    bash "$root/tests/gpu/run.sh" --quick --no-bench
b=$(( $(left) - 15 ))
stage bench "$b" "$py" "$root/bench/gpu_bench.py" --build "$build" --out "$work/bench" \
    --model-dir "$work/bench_model" --budget $(( b - 15 )) --python "$py" \
    --cells fp32:4096 bf16:4096 bf16:16384 fp32:16384 --steps 4 --run-limit 150 --max-t 0
# the 8 files for $OUT
"$py" - "$work" <<'EOF' || true
import json, os, sys
w = sys.argv[1]
doc = {}
for s in ("store", "stream"):
    try:
        doc[s] = json.load(open(os.path.join(w, "profile_" + s, "profile.json")))
    except (OSError, ValueError):
        doc[s] = None
json.dump(doc, open(os.path.join(w, "profile.json"), "w"))
EOF
echo "device-check: $([ $status -eq 0 ] && echo PASSED || echo FAILED) ($(( total - $(left) )) s of $total)" | tee -a "$sum"
{ echo; nvidia-smi 2>&1 || true; } >>"$sum"
for f in summary.txt profile_store.log profile_stream.log run_quick.log bench.log profile.json; do
    cp "$work/$f" "$out/" 2>/dev/null || true
done
cp "$work/bench/gpu_bench.md" "$work/bench/gpu_bench.json" "$out/" 2>/dev/null || true
exit $status
