#!/usr/bin/env bash
# dist_case.sh — one case of sbp-train's data parallelism, registered by
# tests/dist/CMakeLists.txt as dist.<case>. A distributed run (mpirun -np N, each rank a step
# compiled for its share of the rows) is compared with one process on the whole batch: the first
# step's gradients (--dump-grads, max |a-b| / max |b|), ten AdamW steps' losses and gradient
# norms (--log) and the final checkpoint (parameters, m, v: ||a-b|| / ||b||, see compare.py),
# each within 1e-6 relative (the ranks' sums are added in another order, so not bit for bit; a
# loss is compared relative to the run's largest |loss|, as GRPO's passes near zero).
# DPO trains at a lower lr: at 0.01 its loss falls to ~6e-4 within ten steps, where 1e-6 of it
# is below float32's rounding of the step's own terms; --data (random tokens) at 0.003.
#
#   dist_case.sh OBJ NP ZERO [ACCUM]  OBJ: sft | dpo | grpo_seq | grpo_token on the 4-row
#                                     batch of tests/fixtures/ref (ACCUM: --grad-accum)
#   dist_case.sh partial NP ZERO      SFT on 5 rows (the 4 and the first again): over 3 ranks
#                                     of 2 rows the last holds one row and one of padding
#   dist_case.sh data NP ZERO         --data: one process with N*B rows per step
#   dist_case.sh dataset NP ZERO      --dataset (shuffled): one process with N*B rows per step
#   dist_case.sh dataset_refs NP ZERO a dpo and a grpo dataset's reference log-probs computed
#                                     over the ranks: one process's bytes; DPO trained on them
#                                     as one process with N*B rows per step (NP = 2; with
#                                     NP = 3, 11 batches over 3 ranks, the bytes only)
#   dist_case.sh dataset_packed NP ZERO  the same datasets packed for per-document dpo and grpo
#                                     steps: the ranks' reference log-probs are one process's
#                                     bytes, and NP ranks train as one process of NP*2 rows
#   dist_case.sh resume NP ZERO       stop after 3 steps, resume to 6: the same checkpoint bytes
#                                     as 6 steps at once; another -np is refused
#   dist_case.sh abort NP             one rank fails at step 2: the job ends, naming the rank
#   dist_case.sh mismatch NP          a step compiled for the wrong rows: refused
#   dist_case.sh one_rank 1 ZERO      SBP_TRAIN_DIST_ONE_RANK=1 mpirun -np 1: the collectives'
#                                     paths with one rank (NCCL's on a GPU, tests/gpu/run.sh)
#                                     agree with the plain run as above
#   dist_case.sh torchrun             WORLD_SIZE=2 with no MPI launcher: refused, naming mpirun;
#                                     WORLD_SIZE=1 trains as a plain run
#   dist_case.sh refuse OPT           one rank started differently (an MPMD launch, rank 1
#                                     with OPT = steps: --steps 5 not 3; zero: --zero 1 not 0;
#                                     data: another --data file of the same size): the job
#                                     aborts at once (mpirun's status 1, MPI_Abort's code) with
#                                     one error line, rank 1's, naming the option; no step runs
#                                     and nothing is written (unchecked, steps and zero would
#                                     hang and data would train on a mixed batch, exit 0)
#   dist_case.sh agree                the same MPMD launch with every option alike and --data
#                                     through another path to the same bytes: it trains as one
#                                     process does (files are compared by content, not by path)
#   dist_case.sh signal NP            SIGTERM to rank 1 only (not rank 0, not mpirun): rank 0
#                                     writes the step's checkpoint and every rank stops, exit 0
# Environment: SBP_TRAIN, MPIRUN, PY (python3), TRAIN_D (tests/train's compiled steps),
# FX (tests/fixtures), WORK (a scratch folder).
set -euo pipefail
case_=$1
np=${2:-2}
zero=${3:-0}
accum=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
work="$WORK/$case_-np$np-z$zero-k$accum"
[ "$case_" = refuse ] && work="$WORK/refuse-$2" # its second argument is an option's name
rm -rf "$work"
mkdir -p "$work"
REF="$FX/ref"
LDYN="$FX/llama_op17_dyn.onnx"
# a container's shared memory often refuses cross-process copies: let Open MPI use plain copies
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# one thread per rank (sbp-train's default is OMP_NUM_THREADS): the ranks already oversubscribe a
# small machine's cores
export OMP_NUM_THREADS=1
mpi() { timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
fail() { echo "dist_case: $*" >&2; exit 1; }

# the step for R rows per rank (tests/train compiles b2 and b4; this folder's CMake b1)
step_for() { # OBJ ROWS
  local f="$TRAIN_D/$1_b$2.so"
  [ -f "$f" ] || f="$WORK/../$1_b$2.so"
  [ -f "$f" ] || fail "no step $1 for $2 rows ($f)"
  echo "$f"
}
ceil() { echo $(( ($1 + $2 - 1) / $2 )); }

inputs_of() { # OBJ
  case $1 in
    sft) ;;
    dpo) echo --ref-logps "$REF/llama_dpo_ref_logps.npy" ;;
    grpo_*) echo --advantages "$REF/llama_grpo_advantages.npy" \
                 --old-logps "$REF/llama_grpo_old_logps.npy" \
                 --ref-logps "$REF/llama_grpo_ref_logps.npy" ;;
  esac
}

write_pref_datasets() { # a dpo and a grpo dataset of 11 pairs / 22 rollouts in $work
  "$PY" - "$here/../train" "$work" <<'PYEOF'
import random, struct, sys
sys.path.insert(0, sys.argv[1])
import dataset_ref as d
r = random.Random(6)
exs = []
for _ in range(11):  # pairs: 22 examples, 11 batches of one pair, dealt to the ranks
    prompt = [r.randrange(64) for _ in range(r.randint(2, 20))]
    for _side in range(2):
        exs.append(d.example(prompt + [r.randrange(64) for _ in range(r.randint(2, 30))],
                             len(prompt)))
d.write_dataset(sys.argv[2] + "/dpo.safetensors", exs, task="dpo", vocab=64, max_len=64)
adv = [r.uniform(-1, 1) for _ in exs]
d.write_dataset(sys.argv[2] + "/grpo.safetensors", exs, task="grpo", vocab=64, max_len=64,
                tensors={"advantages": ("F32", [len(adv)], struct.pack("<%df" % len(adv), *adv))})
PYEOF
}

lr=0.01
[ "$case_" = dpo ] || [ "$case_" = dataset_refs ] || [ "$case_" = dataset_packed ] && lr=0.002
# random tokens leave many gradient elements at rounding-noise level, which AdamW normalises
[ "$case_" = data ] || [ "$case_" = agree ] || [ "$case_" = dataset ] && lr=0.003
TRAIN_FLAGS=(--steps 10 --lr "$lr" --weight-decay 0.01 --clip-grad-norm 0.3)

compare_runs() { # A-dir B-dir (each: grads.st, log.jsonl, ck/step-00000010.safetensors)
  "$PY" "$here/compare.py" st "$1/grads.st" "$2/grads.st" 1e-6
  "$PY" "$here/compare.py" log "$1/log.jsonl" "$2/log.jsonl" 1e-6
  "$PY" "$here/compare.py" st2 "$1/ck/step-00000010.safetensors" \
        "$2/ck/step-00000010.safetensors" 1e-6
}

case $case_ in
  sft|dpo|grpo_seq|grpo_token)
    obj=$case_
    # one process: the 4 rows in one micro-batch
    mkdir -p "$work/one" "$work/dist"
    # shellcheck disable=SC2046
    "$SBP_TRAIN" "$(step_for "$obj" 4)" --model "$LDYN" --input-ids "$REF/pref_input_ids.npy" \
      --labels "$REF/pref_labels.npy" $(inputs_of "$obj") "${TRAIN_FLAGS[@]}" \
      --dump-grads "$work/one/grads.st" --log "$work/one/log.jsonl" \
      --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    g=$((4 / accum))                                  # global rows per micro-batch
    rows=$(ceil "$g" "$np")                           # rows per rank
    [ "$obj" = dpo ] && rows=$((2 * $(ceil $((g / 2)) "$np"))) # DPO: whole pairs
    # shellcheck disable=SC2046
    mpi "$SBP_TRAIN" "$(step_for "$obj" "$rows")" --model "$LDYN" \
      --input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy" $(inputs_of "$obj") \
      "${TRAIN_FLAGS[@]}" --grad-accum "$accum" --zero "$zero" \
      --dump-grads "$work/dist/grads.st" --log "$work/dist/log.jsonl" \
      --checkpoint-dir "$work/dist/ck" > "$work/dist/out.txt" 2> "$work/dist/err.txt" ||
      { cat "$work/dist/err.txt" >&2; fail "the distributed run failed"; }
    # rank 0 alone prints: one line per step, the per-rank memory line
    [ "$(grep -c '^step ' "$work/dist/out.txt")" = 10 ] || fail "expected 10 step lines"
    grep -q "per rank" "$work/dist/out.txt" || fail "no per-rank memory line"
    grep -q "data parallel: $np ranks, ZeRO $zero" "$work/dist/out.txt" || fail "no summary"
    [ ! -s "$work/dist/err.txt" ] || { cat "$work/dist/err.txt" >&2; fail "stderr not empty"; }
    compare_runs "$work/dist" "$work/one"
    ;;
  partial)
    "$PY" "$here/compare.py" rows "$REF/pref_input_ids.npy" "$work/ids5.npy" 5
    "$PY" "$here/compare.py" rows "$REF/pref_labels.npy" "$work/labels5.npy" 5
    mkdir -p "$work/one" "$work/dist"
    "$SBP_TRAIN" "$(step_for sft 5)" --model "$LDYN" --input-ids "$work/ids5.npy" \
      --labels "$work/labels5.npy" "${TRAIN_FLAGS[@]}" --dump-grads "$work/one/grads.st" \
      --log "$work/one/log.jsonl" --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    mpi "$SBP_TRAIN" "$(step_for sft "$(ceil 5 "$np")")" --model "$LDYN" \
      --input-ids "$work/ids5.npy" --labels "$work/labels5.npy" "${TRAIN_FLAGS[@]}" \
      --zero "$zero" --dump-grads "$work/dist/grads.st" --log "$work/dist/log.jsonl" \
      --checkpoint-dir "$work/dist/ck" > "$work/dist/out.txt"
    compare_runs "$work/dist" "$work/one"
    ;;
  data)
    "$PY" "$here/compare.py" shard "$work/tokens.bin" 64 4000 7
    mkdir -p "$work/one" "$work/dist"
    b=2
    "$SBP_TRAIN" "$(step_for sft $((b * np)))" --model "$LDYN" --data "$work/tokens.bin" \
      "${TRAIN_FLAGS[@]}" --dump-grads "$work/one/grads.st" --log "$work/one/log.jsonl" \
      --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    mpi "$SBP_TRAIN" "$(step_for sft $b)" --model "$LDYN" --data "$work/tokens.bin" \
      "${TRAIN_FLAGS[@]}" --zero "$zero" --dump-grads "$work/dist/grads.st" \
      --log "$work/dist/log.jsonl" --checkpoint-dir "$work/dist/ck" > "$work/dist/out.txt"
    compare_runs "$work/dist" "$work/one"
    ;;
  dataset)
    # a dataset of sbp-prepare's format (dataset_ref.py's writer), shuffled over passes: the
    # ranks take disjoint rows of each global batch, as with --data
    "$PY" - "$here/../train" "$work/data.safetensors" <<'PYEOF'
import random, sys
sys.path.insert(0, sys.argv[1])
import dataset_ref as d
r = random.Random(5)
exs = []
for _ in range(13):
    n = r.randint(8, 64)
    exs.append(d.example([r.randrange(64) for _ in range(n)], r.randint(1, n - 1)))
d.write_dataset(sys.argv[2], exs, vocab=64, max_len=64)
PYEOF
    mkdir -p "$work/one" "$work/dist"
    b=2
    "$SBP_TRAIN" "$(step_for sft $((b * np)))" --model "$LDYN" --dataset "$work/data.safetensors" \
      --shuffle-seed 4 "${TRAIN_FLAGS[@]}" --dump-grads "$work/one/grads.st" \
      --log "$work/one/log.jsonl" --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    mpi "$SBP_TRAIN" "$(step_for sft $b)" --model "$LDYN" --dataset "$work/data.safetensors" \
      --shuffle-seed 4 "${TRAIN_FLAGS[@]}" --zero "$zero" --dump-grads "$work/dist/grads.st" \
      --log "$work/dist/log.jsonl" --checkpoint-dir "$work/dist/ck" > "$work/dist/out.txt"
    compare_runs "$work/dist" "$work/one"
    ;;
  dataset_packed)
    # packed per-document DPO and GRPO datasets (sbpc --packed --per-document, --pack): the
    # reference pass, its examples packed into each batch's rows and batch k on rank k mod NP,
    # gives one process's bytes; then NP ranks of 2 rows train as one process of 2*NP rows
    write_pref_datasets
    for t in dpo grpo; do
      s2=$(step_for "${t}_doc" 2)
      s1=$(step_for "${t}_doc" $((2 * np)))
      "$SBP_TRAIN" "$s2" --model "$LDYN" --dataset "$work/$t.safetensors" --pack \
        --compute-logps "$work/$t-one.st" > /dev/null
      mpi "$SBP_TRAIN" "$s2" --model "$LDYN" --dataset "$work/$t.safetensors" --pack \
        --compute-logps "$work/$t-dist.st" > "$work/$t-out.txt" 2>&1
      grep -q "reference log-probs of 22 examples computed in .* over $np ranks" \
        "$work/$t-out.txt" || { cat "$work/$t-out.txt" >&2; fail "$t: no note of the ranks' pass"; }
      cmp "$work/$t-one.st" "$work/$t-dist.st" ||
        fail "$t: the ranks' packed log-probs differ from one process's"
      mkdir -p "$work/$t/one" "$work/$t/dist"
      "$SBP_TRAIN" "$s1" --model "$LDYN" --dataset "$work/$t.safetensors" --pack \
        --shuffle-seed 4 "${TRAIN_FLAGS[@]}" --dump-grads "$work/$t/one/grads.st" \
        --log "$work/$t/one/log.jsonl" --checkpoint-dir "$work/$t/one/ck" > "$work/$t/one/out.txt"
      mpi "$SBP_TRAIN" "$s2" --model "$LDYN" --dataset "$work/$t.safetensors" --pack \
        --shuffle-seed 4 "${TRAIN_FLAGS[@]}" --zero "$zero" --dump-grads "$work/$t/dist/grads.st" \
        --log "$work/$t/dist/log.jsonl" --checkpoint-dir "$work/$t/dist/ck" > "$work/$t/dist/out.txt"
      compare_runs "$work/$t/dist" "$work/$t/one"
    done
    echo "dist_case: dataset_packed: packed per-document dpo and grpo over $np ranks: the reference bytes and the run of one process"
    ;;
  dataset_refs)
    # a dpo and a grpo dataset (dataset_ref.py's writer): the reference log-probs that each
    # rank computes for its share of the batches (batch k on rank k mod NP), shared, are the
    # very file one process writes with the same step (--compute-logps: cmp); DPO then trains
    # on them over the ranks as one process does on the whole batch
    write_pref_datasets
    for t in dpo grpo; do
      obj=$t
      [ "$t" = grpo ] && obj=grpo_seq
      s=$(step_for "$obj" 2)
      "$SBP_TRAIN" "$s" --model "$LDYN" --dataset "$work/$t.safetensors" \
        --compute-logps "$work/$t-one.st" > /dev/null
      mpi "$SBP_TRAIN" "$s" --model "$LDYN" --dataset "$work/$t.safetensors" \
        --compute-logps "$work/$t-dist.st" > "$work/$t-out.txt" 2>&1
      grep -q "reference log-probs of 22 examples computed in .* over $np ranks" \
        "$work/$t-out.txt" || { cat "$work/$t-out.txt" >&2; fail "$t: no note of the ranks' pass"; }
      cmp "$work/$t-one.st" "$work/$t-dist.st" ||
        fail "$t: the ranks' log-probs differ from one process's"
    done
    if [ ! -f "$TRAIN_D/dpo_b$((2 * np)).so" ]; then # (-np 3: the uneven shares only)
      echo "dist_case: dataset_refs: the ranks' dpo and grpo log-probs are one process's bytes"
      exit 0
    fi
    mkdir -p "$work/one" "$work/dist"
    "$SBP_TRAIN" "$(step_for dpo $((2 * np)))" --model "$LDYN" --dataset "$work/dpo.safetensors" \
      --shuffle-seed 4 "${TRAIN_FLAGS[@]}" --dump-grads "$work/one/grads.st" \
      --log "$work/one/log.jsonl" --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    mpi "$SBP_TRAIN" "$(step_for dpo 2)" --model "$LDYN" --dataset "$work/dpo.safetensors" \
      --shuffle-seed 4 "${TRAIN_FLAGS[@]}" --zero "$zero" --dump-grads "$work/dist/grads.st" \
      --log "$work/dist/log.jsonl" --checkpoint-dir "$work/dist/ck" > "$work/dist/out.txt"
    compare_runs "$work/dist" "$work/one"
    echo "dist_case: dataset_refs: the ranks' dpo and grpo log-probs are one process's bytes"
    ;;
  resume)
    s=$(step_for sft 2)
    args=(--model "$LDYN" --input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy"
          --lr 0.01 --zero "$zero")
    mpi "$SBP_TRAIN" "$s" "${args[@]}" --steps 6 --checkpoint-dir "$work/all" > /dev/null
    mpi "$SBP_TRAIN" "$s" "${args[@]}" --steps 3 --checkpoint-dir "$work/part" > /dev/null
    mpi "$SBP_TRAIN" "$s" "${args[@]}" --steps 6 --resume "$work/part" > "$work/resumed.txt"
    grep -q "^step 4 " "$work/resumed.txt" || fail "the resumed run did not start at step 4"
    grep -q "^step 1 " "$work/resumed.txt" && fail "the resumed run ran step 1 again"
    cmp "$work/all/step-00000006.safetensors" "$work/part/step-00000006.safetensors" ||
      fail "the resumed run's checkpoint differs from the uninterrupted run's"
    # another number of ranks is refused, naming the field
    other=$((np == 2 ? 4 : 2))
    if timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$other" "$SBP_TRAIN" \
         "$(step_for sft "$(ceil 4 "$other")")" "${args[@]}" --steps 6 --resume "$work/part" \
         > /dev/null 2> "$work/refused.txt"; then
      fail "resuming with -np $other was accepted"
    fi
    grep -q "another number of ranks" "$work/refused.txt" ||
      { cat "$work/refused.txt" >&2; fail "no refusal message"; }
    echo "dist_case: resume: checkpoints identical; -np $other refused"
    ;;
  abort)
    set +e
    SBP_TEST_FAIL_RANK=1 mpi "$SBP_TRAIN" "$(step_for sft 2)" --model "$LDYN" \
      --input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy" --steps 5 \
      > "$work/out.txt" 2> "$work/err.txt"
    rc=$?
    set -e
    cat "$work/err.txt"
    [ "$rc" != 0 ] || fail "the job succeeded though rank 1 failed"
    [ "$rc" != 124 ] || fail "the job hung (killed by timeout)"
    grep -q "sbp-train: rank 1: error: step 2: a failure injected" "$work/err.txt" ||
      fail "the failing rank is not named"
    ;;
  mismatch)
    set +e
    mpi "$SBP_TRAIN" "$(step_for sft 4)" --model "$LDYN" --input-ids "$REF/pref_input_ids.npy" \
      --labels "$REF/pref_labels.npy" > /dev/null 2> "$work/err.txt"
    rc=$?
    set -e
    cat "$work/err.txt"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "exit status $rc"
    grep -q "recompile it with sbpc --batch $(ceil 4 "$np")" "$work/err.txt" ||
      fail "no advice to recompile"
    ;;
  one_rank)
    mkdir -p "$work/one" "$work/dist"
    args=(--model "$LDYN" --input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy"
          "${TRAIN_FLAGS[@]}")
    "$SBP_TRAIN" "$(step_for sft 4)" "${args[@]}" --dump-grads "$work/one/grads.st" \
      --log "$work/one/log.jsonl" --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    SBP_TRAIN_DIST_ONE_RANK=1 mpi "$SBP_TRAIN" "$(step_for sft 4)" "${args[@]}" --zero "$zero" \
      --dump-grads "$work/dist/grads.st" --log "$work/dist/log.jsonl" \
      --checkpoint-dir "$work/dist/ck" > "$work/dist/out.txt"
    grep -q "data parallel: 1 ranks, ZeRO $zero" "$work/dist/out.txt" ||
      fail "SBP_TRAIN_DIST_ONE_RANK=1 did not run the data-parallel path"
    compare_runs "$work/dist" "$work/one"
    ;;
  torchrun)
    set +e
    WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 "$SBP_TRAIN" "$(step_for sft 4)" --model "$LDYN" \
      --input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy" --steps 1 \
      > "$work/out.txt" 2> "$work/err.txt"
    rc=$?
    set -e
    cat "$work/err.txt"
    [ "$rc" = 1 ] || fail "WORLD_SIZE=2 without mpirun: exit status $rc, not 1"
    grep -q "^sbp-train: error: WORLD_SIZE=2 .*mpirun -np 2" "$work/err.txt" ||
      fail "no refusal naming mpirun"
    grep -q "^step " "$work/out.txt" && fail "WORLD_SIZE=2: it trained anyway"
    WORLD_SIZE=1 RANK=0 "$SBP_TRAIN" "$(step_for sft 4)" --model "$LDYN" \
      --input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy" --steps 1 \
      > "$work/out1.txt" || fail "WORLD_SIZE=1 was refused"
    grep -q "^step 1 " "$work/out1.txt" || fail "WORLD_SIZE=1 did not train"
    ;;
  signal)
    # every rank carries this marker in its environment (mpirun passes it on): rank 1's pid is
    # the sbp-train process with it and OMPI_COMM_WORLD_RANK=1
    export SBP_DIST_CASE_MARK="$work"
    mpi "$SBP_TRAIN" "$(step_for sft 2)" --model "$LDYN" --input-ids "$REF/pref_input_ids.npy" \
      --labels "$REF/pref_labels.npy" --steps 1000000 --lr 0.001 --zero "$zero" \
      --checkpoint-dir "$work/ck" > "$work/out.txt" 2> "$work/err.txt" &
    job=$!
    pid=""
    for _ in $(seq 600); do # until step 1 is printed (every rank's handlers are in place)
      if grep -q "^step 1 " "$work/out.txt" 2> /dev/null; then
        for e in /proc/[0-9]*/environ; do
          env_=$(tr '\0' '\n' 2> /dev/null < "$e") || continue
          if grep -qx "SBP_DIST_CASE_MARK=$work" <<< "$env_" &&
             grep -qx "OMPI_COMM_WORLD_RANK=1" <<< "$env_"; then
            pid=${e#/proc/}; pid=${pid%/environ}
          fi
        done
        [ -n "$pid" ] && break
      fi
      kill -0 "$job" 2> /dev/null || break
      sleep 0.1
    done
    [ -n "$pid" ] || { kill "$job" 2> /dev/null; fail "rank 1 not found"; }
    kill -TERM "$pid"
    set +e
    wait "$job"
    rc=$?
    set -e
    cat "$work/err.txt"
    [ "$rc" = 0 ] || fail "the job ended with status $rc after SIGTERM to rank 1 (124: it went on)"
    grep -q "stopped by SIGTERM after step" "$work/err.txt" ||
      fail "rank 0 did not stop for rank 1's signal"
    last=$(grep -c "^step " "$work/out.txt")
    [ -f "$work/ck/step-$(printf %08d "$last").safetensors" ] ||
      fail "no checkpoint of the last step ($last)"
    # the checkpoint the signal made is whole (under ZeRO: every rank's moment slices, sent to
    # rank 0 for a checkpoint that only the signal made due): one more step resumes from it
    mpi "$SBP_TRAIN" "$(step_for sft 2)" --model "$LDYN" --input-ids "$REF/pref_input_ids.npy" \
      --labels "$REF/pref_labels.npy" --steps $((last + 1)) --lr 0.001 --zero "$zero" \
      --resume "$work/ck" > "$work/resumed.txt" 2> "$work/resumed_err.txt" ||
      { cat "$work/resumed_err.txt" >&2; fail "resuming from the signal's checkpoint failed"; }
    grep -q "^step $((last + 1)) " "$work/resumed.txt" || fail "the resumed run ran no step"
    unset SBP_DIST_CASE_MARK
    echo "dist_case: signal: rank 1's SIGTERM stopped the job after step $last, checkpointed"
    ;;
  refuse)
    what=$np # the second argument: which option rank 1 gets otherwise
    "$PY" "$here/compare.py" shard "$work/tokens.bin" 64 4000 7
    "$PY" "$here/compare.py" shard "$work/other.bin" 64 4000 8 # same size, other tokens
    common=(--model "$LDYN" --lr 0.003 --checkpoint-dir "$work/ck" --dump-grads "$work/grads.st")
    r0=(--data "$work/tokens.bin" --steps 3 --zero 0)
    opts="every rank must be started with the same options"
    case $what in
      steps) r1=(--data "$work/tokens.bin" --steps 5 --zero 0)
             want="--steps is 5 here but 3 on rank 0: $opts" ;;
      zero) r1=(--data "$work/tokens.bin" --steps 3 --zero 1)
            want="--zero is 1 here but 0 on rank 0: $opts" ;;
      data) r1=(--data "$work/other.bin" --steps 3 --zero 0)
            id="\\($(stat -c %s "$work/other.bin") bytes, content [0-9a-f]{16}\\)"
            want="--data is $work/other.bin $id here but $work/tokens.bin $id on rank 0: every"
            want+=" rank must read the same files \\(compared by size and content\\)" ;;
      *) fail "unknown option $what" ;;
    esac
    s=$(step_for sft 2)
    # a log and a saved model: rank 0's files, had it started
    start=$(date +%s%N)
    set +e
    timeout 50 "$MPIRUN" --allow-run-as-root --oversubscribe \
      -np 1 "$SBP_TRAIN" "$s" "${common[@]}" "${r0[@]}" --log "$work/log.jsonl" \
        --save "$work/out.onnx" : \
      -np 1 "$SBP_TRAIN" "$s" "${common[@]}" "${r1[@]}" --log "$work/log1.jsonl" \
        --save "$work/out1.onnx" > "$work/out.txt" 2> "$work/err.txt"
    rc=$?
    set -e
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    cat "$work/err.txt"
    [ "$rc" != 124 ] || fail "the job hung (killed by timeout after 50 s)"
    [ "$rc" = 1 ] || fail "mpirun's exit status is $rc, not 1 (MPI_Abort's code)"
    n=$(cat "$work/out.txt" "$work/err.txt" | grep -c "error:" || true)
    [ "$n" = 1 ] || fail "$n error lines, not one"
    grep -Eq "^sbp-train: rank 1: error: $want\$" "$work/err.txt" ||
      fail "no error line naming the option from rank 1 (expected: $want)"
    grep -q "^step " "$work/out.txt" && fail "a step ran"
    for f in ck grads.st log.jsonl log1.jsonl out.onnx out1.onnx; do
      [ ! -e "$work/$f" ] || fail "$f was written"
    done
    echo "dist_case: refuse $what: refused in $took ms: passed"
    exit 0
    ;;
  agree)
    "$PY" "$here/compare.py" shard "$work/tokens.bin" 64 4000 7
    mkdir -p "$work/one" "$work/dist" "$work/copy"
    cp "$work/tokens.bin" "$work/copy/tokens.bin"
    "$SBP_TRAIN" "$(step_for sft 4)" --model "$LDYN" --data "$work/tokens.bin" \
      "${TRAIN_FLAGS[@]}" --dump-grads "$work/one/grads.st" --log "$work/one/log.jsonl" \
      --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
    both=("${TRAIN_FLAGS[@]}" --dump-grads "$work/dist/grads.st" --log
          "$work/dist/log.jsonl" --checkpoint-dir "$work/dist/ck")
    s=$(step_for sft 2)
    timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe \
      -np 1 "$SBP_TRAIN" "$s" --model "$LDYN" --data "$work/tokens.bin" "${both[@]}" : \
      -np 1 "$SBP_TRAIN" "$s" --model "$LDYN" --data "$work/copy/tokens.bin" "${both[@]}" \
      > "$work/dist/out.txt" 2> "$work/dist/err.txt" ||
      { cat "$work/dist/err.txt" >&2; fail "the distributed run failed"; }
    [ "$(grep -c '^step ' "$work/dist/out.txt")" = 10 ] || fail "expected 10 step lines"
    compare_runs "$work/dist" "$work/one"
    ;;
  *) fail "unknown case $case_" ;;
esac
echo "dist_case: $case_ -np $np --zero $zero --grad-accum $accum: passed"
