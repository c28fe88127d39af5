#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU checks, as one script for a machine with an NVIDIA GPU, in three
# stages, each with its own timeout, the whole under 8 minutes (SBP_GPU_TOTAL seconds, default
# 470); a stage that cannot run says why and is skipped.
#
#   1. kernels: every CUDA kernel against its CPU twin on random data, a table of max relative
#      errors and timings per kernel, and a summary (tests/gpu/test_cuda_kernels.c): fp32 at
#      1e-5, TF32 GEMM at 1e-3, the bf16 entry points (*_bf16) at 1e-2;
#   2. fixtures: the tiny GPT-2 / Llama / Qwen3 fixture models compiled with
#      `sbpc --target cuda` (store, checkpoint, stream; stream also with chunks that do not
#      divide T), 10 AdamW steps each with sbp-train on the GPU: the first step's gradients and
#      the 10 losses against the float64 PyTorch references (tests/fixtures/ref, via
#      check_ref.py: numpy); and Llama with the DPO and GRPO objectives (gradient accumulation);
#      and --precision bf16 steps (Llama, GPT-2; full: also chunked stream and Qwen3) at bf16
#      tolerances (gradients 2e-2, Qwen3 3e-2; losses 1e-2, falling); packed documents
#      (--packed, the packed batch against PyTorch run document by document; fp32 and bf16);
#      LoRA steps (sbpc --lora 4 on tests/fixtures/hf's Llama; full: also Qwen3, GPT-2): the
#      adapter gradients and 10 AdamW losses against float64 PEFT (tests/fixtures/lora/ref,
#      check_ref.py --lora), fp32 and bf16 (gradients 5e-2, losses 1e-2);
#   2b. data parallel over NCCL (train/train_dist.h): a cuda step under
#      `mpirun -np 1` with SBP_TRAIN_DIST_ONE_RANK=1 (one rank through the collectives: NCCL's
#      ncclAllReduce, and for --zero 1|2 the grouped ncclReduce / ncclBroadcast and the moments
#      gathered through the host for checkpoints), --zero 0, 1, 2: its 10 AdamW losses and
#      gradient norms and its final checkpoint (parameters, m, v) against the plain run's within
#      1e-6 (tests/dist/compare.py); and sequence parallelism's all-to-alls through NCCL's
#      grouped ncclSend / ncclRecv (a stream step of sbpc --seq-parallel 1, the same one-rank
#      launch, its losses against the plain stream step's within 1e-6); the kernels of
#      sequence parallelism are stage 1's (seqpar); skipped when sbp-train was built without NCCL or there is no
#      mpirun; part of stage 2 (--no-fixtures leaves it out);
#   2c. --offload (passes/train/offload.c, train/): the 4-layer Llama and GPT-2 exports, bf16
#      stream and checkpoint, plain, --offload checkpoints and checkpoints,optimizer, 10 AdamW
#      steps: the checkpoints' losses identical, the optimizer's within 1e-6, each run's step
#      time and device peak printed; part of stage 2 (--no-fixtures leaves it out);
#   3. benchmark: bench/gpu_bench.py — step time and peak device memory of store, checkpoint
#      and stream on a Qwen3-0.6B-shaped random model for T = 4096, 8192, ..., next to PyTorch
#      with and without per-layer checkpointing, and the largest T each fits on the card
#      (needs torch with CUDA).
#
# Building: stages 2 and 3 need the whole project (sbpc, sbp-train: protobuf-c, protoc-c and
# Debian's /usr/include/onnx/onnx.proto besides what the runtime needs). When those are there
# it is configured once (SBP_GPU_FULL_BUILD, default build-gpu-full; -DSBP_TESTS=OFF, so
# cmocka is not needed) and stage 1 uses its kernel test; otherwise tests/gpu is built on its
# own as before (cmake >= 3.20, a C compiler, nvcc (PATH, CUDACXX or /usr/local/cuda),
# OpenBLAS, OpenMP; SBP_GPU_BUILD, default build-gpu) and stages 2 and 3 are skipped. Release,
# for sm_90 unless CMAKE_CUDA_ARCHITECTURES or CUDAARCHS says otherwise.
#
#   tests/gpu/run.sh              everything
#   tests/gpu/run.sh --quick      small kernel sizes, one fixture per family, bench at T=4096
#   tests/gpu/run.sh --sanitize   also run the small kernel sizes under compute-sanitizer
#                                 (memcheck, racecheck, synccheck), a few minutes more
#   --no-fixtures, --no-bench     leave out stage 2 / stage 3
# Environment: SBP_GPU_BUILD, SBP_GPU_FULL_BUILD (build folders), SBP_GPU_PREBUILT (a build
# folder made elsewhere: nothing is built, tests/gpu/run-prebuilt.sh), SBP_GPU_TOTAL (seconds),
# PYTHON (the Python with numpy and torch, default python3).
# Exit status: 1 when anything failed (including "no GPU visible"); else 77 when a stage was
# SKIPPED (it could not run: no numpy, no torch, not built, out of time), with a final line
# "SKIPPED: tests/gpu ..." naming what did not run, never "PASSED"; else 0 ("PASSED: tests/gpu",
# a stage left out by --no-fixtures / --no-bench named on that line).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${SBP_GPU_BUILD:-$root/build-gpu}
full=${SBP_GPU_FULL_BUILD:-$root/build-gpu-full}
py=${PYTHON:-python3}
quick=0
sanitize=0
fixtures=1
bench=1
for arg in "$@"; do
    case "$arg" in
    --quick) quick=1 ;;
    --sanitize) sanitize=1 ;;
    --no-fixtures) fixtures=0 ;;
    --no-bench) bench=0 ;;
    *) echo "usage: $0 [--quick] [--sanitize] [--no-fixtures] [--no-bench]" >&2; exit 2 ;;
    esac
done

t_start=$(date +%s)
deadline=$((t_start + ${SBP_GPU_TOTAL:-470}))
stamp() { echo "== [$(( $(date +%s) - t_start ))s] $*"; }
left() { echo $((deadline - $(date +%s))); }
# cap SECONDS: min(SECONDS, the time left before the deadline), at least 1
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }

status=0
summary=()
skipped=() # stages that could not run: the run is then SKIPPED (exit 77), not PASSED
left_out=() # stages left out on request (--no-fixtures, --no-bench)
note() { summary+=("$1"); }
skip_note() { summary+=("$1"); skipped+=("$1"); }

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

# ---------------------------------------------------------------- build
arch=()
if [ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]; then
    arch=("-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES")
fi
missing=()
command -v protoc-c >/dev/null 2>&1 || missing+=("protoc-c (protobuf-c-compiler)")
{ command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libprotobuf-c; } ||
    missing+=("libprotobuf-c (libprotobuf-c-dev, pkg-config)")
[ -f /usr/include/onnx/onnx.proto ] || missing+=("/usr/include/onnx/onnx.proto (libonnx-dev)")
have_full=0
if [ -n "${SBP_GPU_PREBUILT:-}" ]; then
    # a build folder made on another machine with this checkout at the same path (sbpc bakes
    # absolute paths into its link lines): nothing to configure or build here
    # (tests/gpu/run-prebuilt.sh sets this up)
    full=$SBP_GPU_PREBUILT
    build=$full
    have_full=1
    stamp "prebuilt: $full (configured and built elsewhere)"
    touch "$full/configure.log" "$full/build.log"
elif [ ${#missing[@]} -eq 0 ]; then
    stamp "configure the project ($full)"
    mkdir -p "$full"
    if timeout "$(cap 120)" cmake -S "$root" -B "$full" -DCMAKE_BUILD_TYPE=Release \
        -DSBP_TESTS=OFF -DSBP_CUDA_EMU=OFF "${arch[@]}" >"$full/configure.log" 2>&1; then
        grep -E "CUDA compiler identification|Found CUDAToolkit|SBP_CUDA" "$full/configure.log" || true
        stamp "build (kernel test, sbpc, sbp-train, CUDA runtime)"
        if timeout "$(cap 300)" cmake --build "$full" -j"$(nproc)" \
            --target test_cuda_kernels sbpc sbp-train sbprt_cuda >"$full/build.log" 2>&1; then
            have_full=1
            build=$full
        else
            grep -E "error|Error" "$full/build.log" | head -n 40 || tail -n 40 "$full/build.log"
            echo "the project did not build (log: $full/build.log); falling back to tests/gpu alone"
        fi
    else
        tail -n 30 "$full/configure.log"
        echo "the project did not configure (log: $full/configure.log); falling back to tests/gpu alone"
    fi
else
    echo "not building sbpc/sbp-train (stages 2 and 3 need them); missing: ${missing[*]}"
fi
if [ $have_full -eq 0 ]; then
    stamp "configure tests/gpu alone ($build)"
    mkdir -p "$build"
    cfg=(-S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release "${arch[@]}")
    if ! timeout "$(cap 120)" cmake "${cfg[@]}" >"$build/configure.log" 2>&1; then
        tail -n 30 "$build/configure.log"
        stamp "FAILED: configure (log: $build/configure.log)"
        exit 1
    fi
    grep -E "CUDA compiler identification|Found CUDAToolkit" "$build/configure.log" || true
    stamp "build"
    if ! timeout "$(cap 300)" cmake --build "$build" -j"$(nproc)" --target test_cuda_kernels >"$build/build.log" 2>&1; then
        grep -E "error|Error" "$build/build.log" | head -n 40 || tail -n 40 "$build/build.log"
        stamp "FAILED: build (log: $build/build.log)"
        exit 1
    fi
fi
if grep -qi "warning" "$build/build.log"; then
    echo "build warnings:"
    grep -i "warning" "$build/build.log" | head -n 20
fi
test_bin=$(find "$build" -name test_cuda_kernels -type f -perm -u+x | head -n 1)

run_test() { # label, timeout, command...
    local label=$1 limit
    limit=$(cap "$2")
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
    return $rc
}

# ---------------------------------------------------------------- stage 1: kernels
s1=0
if [ $quick -eq 1 ]; then
    run_test "stage 1: kernel tests, small sizes" 120 "$test_bin" --quick || s1=$?
else
    run_test "stage 1: kernel tests, full sizes" 300 "$test_bin" || s1=$?
fi
[ $s1 -eq 0 ] && note "stage 1 (kernels): passed" || note "stage 1 (kernels): FAILED ($s1)"
no_device=0
[ $s1 -eq 77 ] && no_device=1 # the later stages would only repeat it

if [ $sanitize -eq 1 ]; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
        for tool in memcheck racecheck synccheck; do
            # API errors are expected: the test provokes an out-of-memory on purpose.
            run_test "compute-sanitizer --tool $tool (small sizes)" 240 \
                compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 \
                "$test_bin" --quick || true
        done
    else
        echo "compute-sanitizer not found; --sanitize skipped"
        status=1
    fi
fi

# Runs stage function FN under TITLE (stamped), then says "stage LABEL: passed", or FAILED with
# FN's status as the count of failed UNITs (and the script's status 1).
run_stage() {
    local label=$1 unit=$2 fn=$3 title=$4 rc=0
    stamp "$title"
    "$fn" || rc=$?
    if [ $rc -eq 0 ]; then
        note "stage $label: passed"
    else
        note "stage $label: FAILED ($rc $unit)"
        status=1
    fi
}

# ---------------------------------------------------------------- stage 2: fixtures
# one fixture configuration: NAME FAMILY "SBPC ARGS" "SBP-TRAIN ARGS" REF_GRADS [ADAMW_JSON
# ["CHECK_REF OPTIONS"]]
fixture_one() {
    local name=$1 fam=$2 sargs=$3 targs=$4 ref=$5 json=${6:-} copts=${7:-} fx=$root/tests/fixtures
    local gen=$full/gpu_fixtures limit ok=1 trc=0
    rm -f "$gen/$name.log" "$gen/$name.err" "$gen/$name.check" "$gen/$name.safetensors"
    limit=$((stage_end - $(date +%s)))
    if [ $limit -lt 5 ]; then
        echo "  $name: out of time"
        return 1
    fi
    # shellcheck disable=SC2086
    timeout "$limit" "$full/tools/sbpc" "$fx/${fam}_op17_static.onnx" $sargs --target cuda \
        -o "$gen/$name.so" >"$gen/$name.sbpc.log" 2>&1 || ok=0
    if [ $ok -eq 1 ]; then
        limit=$((stage_end - $(date +%s)))
        # shellcheck disable=SC2086
        timeout "$((limit > 1 ? limit : 1))" "$full/tools/sbp-train" "$gen/$name.so" \
            --model "$fx/${fam}_op17_static.onnx" $targs --dump-grads "$gen/$name.safetensors" \
            >"$gen/$name.log" 2>"$gen/$name.err" || trc=$?
        if [ $trc -ne 0 ]; then
            ok=0
            if [ $trc -eq 124 ]; then echo "  $name: TIMEOUT (the stage's time is spent)"; fi
        fi
    else
        tail -n 5 "$gen/$name.sbpc.log"
    fi
    # shellcheck disable=SC2206
    local check=("$py" "$here/check_ref.py" $copts "$gen/$name.safetensors" "$ref")
    [ -n "$json" ] && check+=("$gen/$name.log" "$json")
    if [ $ok -eq 1 ] && "${check[@]}" >"$gen/$name.check" 2>&1; then
        echo "  $name: $(grep -h "gradients against" "$gen/$name.check" | sed 's/ against .*: / /')" \
             "$(grep -h "losses against" "$gen/$name.check" | sed 's/ against .*: /, /')"
        return 0
    fi
    echo "  $name: FAILED"
    cat "$gen/$name.err" "$gen/$name.check" 2>/dev/null | tail -n 12
    return 1
}

# one LoRA configuration (sbpc --lora 4 --lora-alpha 8) of a tests/fixtures/hf export:
# NAME EXPORT FAMILY "SBPC ARGS" ["CHECK_REF OPTIONS"]; 10 AdamW steps at sbp-train's defaults
# (gen_lora.py's trajectory), the adapter gradients and losses against float64 PEFT
# (tests/fixtures/lora/ref, check_ref.py --lora)
lora_one() {
    local name=$1 fam=$3 sargs=$4 copts=${5:-} fx=$root/tests/fixtures
    local gen=$full/gpu_fixtures limit ok=1 trc=0 model=$root/tests/fixtures/hf/$2.onnx
    rm -f "$gen/$name.log" "$gen/$name.err" "$gen/$name.check" "$gen/$name.safetensors"
    limit=$((stage_end - $(date +%s)))
    if [ $limit -lt 5 ]; then
        echo "  $name: out of time"
        return 1
    fi
    # shellcheck disable=SC2086
    timeout "$limit" "$full/tools/sbpc" "$model" --batch 2 --seq-len 32 --lora 4 --lora-alpha 8 \
        $sargs --target cuda -o "$gen/$name.so" >"$gen/$name.sbpc.log" 2>&1 || ok=0
    if [ $ok -eq 1 ]; then
        limit=$((stage_end - $(date +%s)))
        timeout "$((limit > 1 ? limit : 1))" "$full/tools/sbp-train" "$gen/$name.so" \
            --model "$model" --input-ids "$fx/hf/ref/${fam}_input_ids.npy" \
            --labels "$fx/hf/ref/${fam}_labels.npy" --steps 10 \
            --dump-grads "$gen/$name.safetensors" >"$gen/$name.log" 2>"$gen/$name.err" || trc=$?
        if [ $trc -ne 0 ]; then
            ok=0
            if [ $trc -eq 124 ]; then echo "  $name: TIMEOUT (the stage's time is spent)"; fi
        fi
    else
        tail -n 5 "$gen/$name.sbpc.log"
    fi
    # shellcheck disable=SC2086
    if [ $ok -eq 1 ] && "$py" "$here/check_ref.py" --lora $copts "$gen/$name.safetensors" \
        "$fx/lora/ref/$fam.safetensors" "$gen/$name.log" >"$gen/$name.check" 2>&1; then
        echo "  $name: $(grep -h "gradients against" "$gen/$name.check" | sed 's/ against .*: / /')" \
             "$(grep -h "losses against" "$gen/$name.check" | sed 's/ against .*: /, /')"
        return 0
    fi
    echo "  $name: FAILED"
    cat "$gen/$name.err" "$gen/$name.check" 2>/dev/null | tail -n 12
    return 1
}

stage2() {
    local fx=$root/tests/fixtures fails=0
    local ref=$fx/ref
    mkdir -p "$full/gpu_fixtures"
    stage_end=$(( $(date +%s) + $(cap 190) ))
    local -a configs=("llama store" "gpt2 stream" "qwen3 checkpoint")
    if [ $quick -eq 0 ]; then
        configs+=("llama checkpoint" "llama stream --chunk 24 --logits-chunk 40" "gpt2 store"
                  "qwen3 stream --chunk 16 --logits-chunk 48" "qwen3 store")
    fi
    for c in "${configs[@]}"; do
        # shellcheck disable=SC2086
        set -- $c
        local fam=$1 strategy=$2
        shift 2
        fixture_one "${fam}_${strategy}${1:+_chunked}" "$fam" "--strategy $strategy $*" \
            "--input-ids $ref/${fam}_input_ids.npy --labels $ref/${fam}_labels.npy --steps 10 --lr 0.01 --weight-decay 0.01" \
            "$ref/${fam}_grads.safetensors" "$ref/${fam}_adamw.json" || fails=$((fails + 1))
    done
    # --precision bf16 (bf16 activations, fp32 master weights, gradients and statistics): the
    # gradients at 2e-2 per tensor (qwen3: 3e-2), the 10 AdamW losses at 1e-2 and falling
    local -a bf16=("llama store" "gpt2 stream")
    [ $quick -eq 0 ] && bf16+=("llama stream --chunk 24 --logits-chunk 40" "qwen3 checkpoint")
    for c in "${bf16[@]}"; do
        # shellcheck disable=SC2086
        set -- $c
        local fam=$1 strategy=$2 tol=2e-2
        shift 2
        [ "$fam" = qwen3 ] && tol=3e-2
        fixture_one "${fam}_${strategy}${1:+_chunked}_bf16" "$fam" \
            "--strategy $strategy $* --precision bf16" \
            "--input-ids $ref/${fam}_input_ids.npy --labels $ref/${fam}_labels.npy --steps 10 --lr 0.01 --weight-decay 0.01" \
            "$ref/${fam}_grads.safetensors" "$ref/${fam}_adamw.json" \
            "--grad-tol $tol --loss-tol 1e-2 --decreasing" || fails=$((fails + 1))
    done
    # packed documents (sbpc --packed): the packed batch against PyTorch run one document at a
    # time (tests/fixtures/gen_packed.py), chunks that cut documents; and bf16
    local packed="--input-ids $ref/packed_input_ids.npy --labels $ref/packed_labels.npy --doc-ids $ref/packed_doc_ids.npy"
    local -a pk=("gpt2 stream --chunk 17 --logits-chunk 13" "llama store")
    [ $quick -eq 0 ] && pk+=("qwen3 stream --chunk 5 --logits-chunk 7" "llama checkpoint")
    for c in "${pk[@]}"; do
        # shellcheck disable=SC2086
        set -- $c
        local fam=$1 strategy=$2
        shift 2
        fixture_one "${fam}_${strategy}${1:+_chunked}_packed" "$fam" \
            "--strategy $strategy $* --packed" "$packed" \
            "$ref/${fam}_packed_grads.safetensors" || fails=$((fails + 1))
    done
    fixture_one llama_stream_packed_bf16 llama "--strategy stream --chunk 17 --packed --precision bf16" \
        "$packed" "$ref/llama_packed_grads.safetensors" "" "--grad-tol 2e-2" || fails=$((fails + 1))
    # the preference objectives, 4 rows in 2 micro-batches (gradient accumulation)
    local pref="--input-ids $ref/pref_input_ids.npy --labels $ref/pref_labels.npy --grad-accum 2"
    fixture_one llama_dpo llama "--objective dpo" "$pref --ref-logps $ref/llama_dpo_ref_logps.npy" \
        "$ref/llama_dpo_grads.safetensors" || fails=$((fails + 1))
    fixture_one llama_grpo_token llama "--objective grpo --grpo-norm token" \
        "$pref --advantages $ref/llama_grpo_advantages.npy --old-logps $ref/llama_grpo_old_logps.npy --ref-logps $ref/llama_grpo_ref_logps.npy" \
        "$ref/llama_grpo_token_grads.safetensors" || fails=$((fails + 1))
    # LoRA (sbpc --lora): only the adapters train, against PEFT; fp32 at 1e-4, bf16 at
    # the emulator's measured 1.1e-2 (gradients) with room: 5e-2, losses 1e-2
    lora_one llama_lora_stream llama_dynamo_scoped llama \
        "--strategy stream --chunk 7 --logits-chunk 13" || fails=$((fails + 1))
    lora_one llama_lora_stream_bf16 llama_dynamo_scoped llama \
        "--strategy stream --chunk 7 --logits-chunk 13 --precision bf16" \
        "--grad-tol 5e-2 --loss-tol 1e-2" || fails=$((fails + 1))
    # the frozen weights kept as bf16 only (--base-precision bf16) train as their bf16
    # copy does: the same losses (within 1e-3 relative: cuBLAS may pick other algorithms for
    # other alignments, so not bit for bit here as on the emulator)
    lora_one llama_lora_stream_bf16_base llama_dynamo_scoped llama \
        "--strategy stream --chunk 7 --logits-chunk 13 --precision bf16 --base-precision bf16" \
        "--grad-tol 5e-2 --loss-tol 1e-2" || fails=$((fails + 1))
    if ! paste <(grep -o "step [0-9]* loss [^ ]*" "$full/gpu_fixtures/llama_lora_stream_bf16.log") \
               <(grep -o "step [0-9]* loss [^ ]*" "$full/gpu_fixtures/llama_lora_stream_bf16_base.log") |
        awk '{ d = $4 - $8; if (d < 0) d = -d; if (d > 1e-3 * ($4 < 0 ? -$4 : $4)) bad = 1; n++ }
             END { exit (bad || n != 10) }'; then
        echo "  llama_lora_stream_bf16_base: FAILED, its losses are not llama_lora_stream_bf16's"
        fails=$((fails + 1))
    fi
    if [ $quick -eq 0 ]; then
        lora_one qwen3_lora_store qwen3_ts_eager qwen3 "--strategy store" || fails=$((fails + 1))
        lora_one gpt2_lora_stream gpt2_dynamo_eager gpt2 "--strategy stream --chunk 7" ||
            fails=$((fails + 1))
    fi
    grep -h "peak device memory" "$full/gpu_fixtures"/*.log 2>/dev/null | head -n 1 | sed 's/^/  (e.g.) /'
    return $fails
}
if [ $fixtures -eq 0 ]; then
    note "stage 2 (fixtures): left out (--no-fixtures)"
    left_out+=("stage 2 (fixtures)")
elif [ $no_device -eq 1 ]; then
    skip_note "stage 2 (fixtures): SKIPPED, no CUDA device"
elif [ $have_full -eq 0 ]; then
    skip_note "stage 2 (fixtures): SKIPPED, sbpc/sbp-train not built (see above)"
elif ! "$py" -c "import numpy" >/dev/null 2>&1; then
    skip_note "stage 2 (fixtures): SKIPPED, $py has no numpy (check_ref.py needs it; set PYTHON)"
elif [ "$(left)" -lt 20 ]; then
    skip_note "stage 2 (fixtures): SKIPPED, out of time"
else
    run_stage "2 (fixtures)" configurations stage2 \
        "stage 2: fixture gradients on the GPU against PyTorch (sbpc --target cuda, sbp-train)"
fi

# ---------------------------------------------------------------- stage 2b: NCCL
# The NCCL path of data-parallel sbp-train on one GPU (see the header): a plain run of a cuda
# step, then the same run as one MPI rank that still sums, slices and gathers through NCCL.
dist_nccl() {
    local fx=$root/tests/fixtures ref=$root/tests/fixtures/ref gen=$full/gpu_dist fails=0
    local model=$fx/llama_op17_static.onnx mpirun_
    mpirun_=$(command -v mpirun)
    rm -rf "$gen"
    mkdir -p "$gen"
    local -a args=(--model "$model" --input-ids "$ref/llama_input_ids.npy"
                   --labels "$ref/llama_labels.npy" --steps 10 --lr 0.01 --weight-decay 0.01
                   --clip-grad-norm 0.3)
    timeout "$(cap 60)" "$full/tools/sbpc" "$model" --strategy store --target cuda \
        -o "$gen/step.so" >"$gen/sbpc.log" 2>&1 || { tail -n 5 "$gen/sbpc.log"; return 1; }
    timeout "$(cap 60)" "$full/tools/sbp-train" "$gen/step.so" "${args[@]}" \
        --log "$gen/plain.jsonl" --checkpoint-dir "$gen/plain_ck" >"$gen/plain.log" 2>&1 ||
        { echo "  the plain run FAILED"; tail -n 5 "$gen/plain.log"; return 1; }
    for z in 0 1 2; do
        local rc=0
        # NCCL_DEBUG=VERSION: NCCL prints its version when the communicator is made (the proof
        # that the NCCL path ran); plain copies for Open MPI's shared memory (containers)
        SBP_TRAIN_DIST_ONE_RANK=1 NCCL_DEBUG=VERSION \
            OMPI_MCA_btl_vader_single_copy_mechanism=none \
            timeout "$(cap 90)" "$mpirun_" --allow-run-as-root --oversubscribe -np 1 \
            "$full/tools/sbp-train" "$gen/step.so" "${args[@]}" --zero "$z" \
            --log "$gen/z$z.jsonl" --checkpoint-dir "$gen/z${z}_ck" >"$gen/z$z.log" 2>&1 || rc=$?
        if [ $rc -ne 0 ] || ! grep -q "data parallel: 1 ranks, ZeRO $z" "$gen/z$z.log" ||
           ! grep -q "NCCL version" "$gen/z$z.log"; then
            echo "  NCCL --zero $z: FAILED ($rc)"
            tail -n 12 "$gen/z$z.log"
            fails=$((fails + 1))
            continue
        fi
        if "$py" "$root/tests/dist/compare.py" log "$gen/z$z.jsonl" "$gen/plain.jsonl" 1e-6 \
               >"$gen/z$z.check" 2>&1 &&
           "$py" "$root/tests/dist/compare.py" st2 "$gen/z${z}_ck/step-00000010.safetensors" \
               "$gen/plain_ck/step-00000010.safetensors" 1e-6 >>"$gen/z$z.check" 2>&1; then
            echo "  NCCL --zero $z (one rank): losses and checkpoint as the plain run's;" \
                 "$(grep -h "peak device memory" "$gen/z$z.log" | head -n 1)"
        else
            echo "  NCCL --zero $z: FAILED against the plain run"
            tail -n 12 "$gen/z$z.check"
            fails=$((fails + 1))
        fi
    done
    # sequence parallelism's exchanges through NCCL (ncclSend / ncclRecv in a group on the
    # step's stream): a step of one rank per row (sbpc --seq-parallel 1) as one MPI rank,
    # against the plain stream step
    timeout "$(cap 60)" "$full/tools/sbpc" "$model" --strategy stream --target cuda \
        -o "$gen/stream.so" >"$gen/sbpc_sp.log" 2>&1 &&
    timeout "$(cap 60)" "$full/tools/sbpc" "$model" --strategy stream --target cuda \
        --seq-parallel 1 -o "$gen/sp1.so" >>"$gen/sbpc_sp.log" 2>&1 ||
        { tail -n 5 "$gen/sbpc_sp.log"; return $((fails + 1)); }
    local rc=0
    timeout "$(cap 60)" "$full/tools/sbp-train" "$gen/stream.so" "${args[@]}" \
        --log "$gen/stream.jsonl" >"$gen/stream.log" 2>&1 || rc=$?
    SBP_TRAIN_DIST_ONE_RANK=1 NCCL_DEBUG=VERSION OMPI_MCA_btl_vader_single_copy_mechanism=none \
        timeout "$(cap 90)" "$mpirun_" --allow-run-as-root --oversubscribe -np 1 \
        "$full/tools/sbp-train" "$gen/sp1.so" "${args[@]}" --log "$gen/sp1.jsonl" \
        >"$gen/sp1.log" 2>&1 || rc=$?
    if [ $rc -eq 0 ] && grep -q "sequence parallel: 1 data group of 1 ranks" "$gen/sp1.log" &&
       grep -q "NCCL version" "$gen/sp1.log" &&
       "$py" "$root/tests/dist/compare.py" log "$gen/sp1.jsonl" "$gen/stream.jsonl" 1e-6 \
           >"$gen/sp1.check" 2>&1; then
        echo "  NCCL sequence-parallel exchanges (--seq-parallel 1, one rank): losses as the" \
             "plain stream run's"
    else
        echo "  NCCL sequence-parallel exchanges: FAILED ($rc)"
        tail -n 12 "$gen/sp1.log" "$gen/sp1.check" 2>/dev/null
        fails=$((fails + 1))
    fi
    grep -h "^step 10 " "$gen/plain.log" "$gen"/z*.log | sed 's/^/  /'
    return $fails
}
if [ $fixtures -eq 0 ]; then
    note "stage 2b (NCCL): left out (--no-fixtures)"
    left_out+=("stage 2b (NCCL)")
elif [ $no_device -eq 1 ]; then
    skip_note "stage 2b (NCCL): SKIPPED, no CUDA device"
elif [ $have_full -eq 0 ]; then
    skip_note "stage 2b (NCCL): SKIPPED, sbpc/sbp-train not built (see above)"
elif ! grep -q "sum with NCCL" "$full/configure.log"; then
    skip_note "stage 2b (NCCL): SKIPPED, sbp-train was built without NCCL (configure.log)"
elif ! command -v mpirun >/dev/null 2>&1; then
    skip_note "stage 2b (NCCL): SKIPPED, no mpirun (openmpi-bin)"
elif [ "$(left)" -lt 60 ]; then
    skip_note "stage 2b (NCCL): SKIPPED, out of time"
else
    run_stage "2b (NCCL)" runs dist_nccl \
        "stage 2b: data parallel over NCCL, one rank (mpirun -np 1, --zero 0/1/2)"
fi

# ---------------------------------------------------------------- stage 2c: offload
# sbpc --offload on the GPU: the 4-layer Llama and GPT-2 exports (tests/fixtures/deep/
# gen_deep.py), bf16 stream and checkpoint, plain, --offload checkpoints and --offload
# checkpoints,optimizer, 10 AdamW steps each: the checkpoints' losses identical to the plain
# run's (the same kernels on the same values; the copies on the second stream are bit for bit),
# the optimizer's within 1e-6 (tests/dist/compare.py: the host's AdamW against the device's), and
# each run's step time and device peak printed (the overlap measured where it is real).
offload_gpu() {
    local deep=$root/tests/fixtures/deep ref=$root/tests/fixtures/hf/ref gen=$full/gpu_offload
    local fails=0 fam st mode
    rm -rf "$gen"
    mkdir -p "$gen"
    for fam in llama gpt2; do
        for st in stream checkpoint; do
            local ok=1
            for mode in plain checkpoints checkpoints,optimizer; do
                local extra=() n=$gen/${fam}_${st}_${mode/,/_}
                [ $mode = plain ] || extra=(--offload "$mode")
                if ! timeout "$(cap 60)" "$full/tools/sbpc" "$deep/${fam}_4l_dynamo.onnx" \
                         --batch 2 --seq-len 32 --target cuda --precision bf16 --strategy $st \
                         --no-eval "${extra[@]}" -o "$n.so" >"$n.sbpc.log" 2>&1 ||
                   ! timeout "$(cap 60)" "$full/tools/sbp-train" "$n.so" \
                         --model "$deep/${fam}_4l_dynamo.onnx" --input-ids "$ref/${fam}_input_ids.npy" \
                         --labels "$ref/${fam}_labels.npy" --steps 10 --lr 0.01 --weight-decay 0.01 \
                         --log "$n.jsonl" >"$n.log" 2>&1; then
                    echo "  $fam $st --offload $mode: FAILED"
                    tail -n 5 "$n.sbpc.log" "$n.log" 2>/dev/null
                    ok=0
                    continue
                fi
                echo "  $fam $st --offload $mode: step 10 at" \
                     "$(grep -o '^step 10 .*tokens/s [^ ]*' "$n.log" | awk '{print $NF}') tokens/s;" \
                     "$(grep -h "peak device memory" "$n.log" | cut -c1-90)"
            done
            local p=$gen/${fam}_${st}_plain c=$gen/${fam}_${st}_checkpoints
            local b=$gen/${fam}_${st}_checkpoints_optimizer
            if [ $ok -eq 1 ] &&
               diff <(grep -o '^step [0-9]* loss [^ ]*' "$p.log") \
                    <(grep -o '^step [0-9]* loss [^ ]*' "$c.log") >/dev/null &&
               "$py" "$root/tests/dist/compare.py" log "$b.jsonl" "$p.jsonl" 1e-6 >"$b.check" 2>&1; then
                echo "  $fam $st: checkpoints' 10 losses identical, optimizer's within 1e-6"
            else
                echo "  $fam $st: FAILED against the plain run"
                [ -f "$b.check" ] && tail -n 3 "$b.check"
                fails=$((fails + 1))
            fi
        done
    done
    return $fails
}
if [ $fixtures -eq 0 ]; then
    note "stage 2c (offload): left out (--no-fixtures)"
    left_out+=("stage 2c (offload)")
elif [ $no_device -eq 1 ]; then
    skip_note "stage 2c (offload): SKIPPED, no CUDA device"
elif [ $have_full -eq 0 ]; then
    skip_note "stage 2c (offload): SKIPPED, sbpc/sbp-train not built (see above)"
elif [ "$(left)" -lt 40 ]; then
    skip_note "stage 2c (offload): SKIPPED, out of time"
else
    run_stage "2c (offload)" configurations offload_gpu \
        "stage 2c: --offload against the plain step (bf16, 4-layer exports)"
fi

# ---------------------------------------------------------------- stage 3: benchmark
if [ $bench -eq 0 ]; then
    note "stage 3 (benchmark): left out (--no-bench)"
    left_out+=("stage 3 (benchmark)")
elif [ $no_device -eq 1 ]; then
    skip_note "stage 3 (benchmark): SKIPPED, no CUDA device"
elif [ $have_full -eq 0 ]; then
    skip_note "stage 3 (benchmark): SKIPPED, sbpc/sbp-train not built (see above)"
elif ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    skip_note "stage 3 (benchmark): SKIPPED, $py has no torch with CUDA (set PYTHON)"
elif [ "$(left)" -lt 60 ]; then
    skip_note "stage 3 (benchmark): SKIPPED, out of time ($(left) s left)"
else
    b=$(($(left) - 10))
    stamp "stage 3: benchmark, Qwen3-0.6B-shaped model ($b s)"
    seq=()
    [ $quick -eq 1 ] && seq=(--seq-lens 4096)
    set +e
    timeout "$((b + 5))" "$py" "$root/bench/gpu_bench.py" --build "$full" --out "$full/gpu_bench" \
        --budget "$b" --python "$py" "${seq[@]}"
    rc=$?
    set -e
    if [ $rc -eq 0 ]; then
        note "stage 3 (benchmark): done ($full/gpu_bench/gpu_bench.md)"
    else
        note "stage 3 (benchmark): FAILED ($rc)"
        status=1
    fi
fi

stamp "summary"
for s in "${summary[@]}"; do
    echo "  $s"
done
if [ $status -ne 0 ]; then
    stamp "FAILED: tests/gpu"
    exit $status
fi
if [ ${#skipped[@]} -gt 0 ]; then
    # what ran passed, but not everything ran: say what did not, and do not call it a pass
    what=$(printf '%s; ' "${skipped[@]}")
    stamp "SKIPPED: tests/gpu: ${#skipped[@]} stage(s) did not run (${what%; }); the stages that ran passed (exit 77)"
    exit 77
fi
if [ ${#left_out[@]} -gt 0 ]; then
    what=$(printf '%s, ' "${left_out[@]}")
    stamp "PASSED: tests/gpu (left out on request: ${what%, })"
else
    stamp "PASSED: tests/gpu"
fi
exit 0
