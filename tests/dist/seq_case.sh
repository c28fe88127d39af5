#!/usr/bin/env bash
# seq_case.sh — one case of sbp-train's sequence parallelism, registered by
# tests/dist/CMakeLists.txt as dist.seq_<case>. A step compiled with sbpc --seq-parallel N (each
# rank holds T/N consecutive tokens of every row; attention exchanges heads between the ranks)
# runs as mpirun -np NP (NP / N data groups) and is compared with one process on the whole
# sequence (a plain step of all the rows, the same chunks): the first step's gradients
# (--dump-grads, ||a-b|| / ||b|| per tensor) and ten AdamW steps' losses (--log) within 1e-6
# relative, the gradient norms and the final checkpoint (parameters, m, v) within 1e-5
# (tests/dist/compare.py). Each rank's weight gradients are its tokens' share and the ranks'
# shares are summed, so the additions run in another order than one process's: not bit for
# bit, and AdamW's normalised updates carry those last-bit differences on (measured after ten
# steps: gradient norms up to 3e-6 apart, states up to 2.4e-6).
#
#   seq_case.sh MODEL N NP STRATEGY [SOURCE]   MODEL: a file under FX; 4 rows x 64 tokens of
#                                              tests/fixtures/ref, or SOURCE: packed (--doc-ids
#                                              with documents that cross the ranks'
#                                              boundaries), dataset (--dataset, shuffled),
#                                              dataset_packed (--dataset --pack, a packed step),
#                                              data (--data with --eval-data), pack (--data
#                                              --pack), zero1 / zero2 (--zero, and the moments
#                                              per rank against sbpc --report), lora (sbpc
#                                              --lora 4), resume (3 steps, then resumed to 6:
#                                              the bytes of 6 at once; a step of another N with
#                                              the same ranks, batch and length refused), abort
#                                              (rank 1 fails at step 2). N = 0: a plain step,
#                                              NP data-parallel ranks (packed documents over
#                                              several ranks take the same path as over data
#                                              groups)
#   seq_case.sh refuse                         a step of N = 2 under -np 3, --seq-parallel 4
#                                              against it, and without mpirun: one error line
#                                              each, exit 1
# Environment: SBP_TRAIN, SBPC, MPIRUN, PY (python3), FX (tests/fixtures), WORK (a scratch
# folder).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
REF="$FX/ref"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1
fail() { echo "seq_case: $*" >&2; exit 1; }
mpi() { local np=$1; shift; timeout 240 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
IDS=(--input-ids "$REF/pref_input_ids.npy" --labels "$REF/pref_labels.npy")
TRAIN_FLAGS=(--steps 10 --lr 0.01 --weight-decay 0.01 --clip-grad-norm 0.3)

if [ "$1" = refuse ]; then
  work="$WORK/seq-refuse"
  rm -rf "$work" && mkdir -p "$work"
  "$SBPC" "$FX/llama_op17_dyn.onnx" --batch 4 --seq-len 64 --seq-parallel 2 -o "$work/sp2.so"
  expect_fail() { # REGEX CMD...: exit status 1 and the message on stderr
    local re=$1 rc=0; shift
    "$@" > "$work/out.txt" 2> "$work/err.txt" || rc=$?
    [ "$rc" = 1 ] || { cat "$work/err.txt" >&2; fail "exit $rc, not 1: $*"; }
    grep -Eq "$re" "$work/err.txt" || { cat "$work/err.txt" >&2; fail "no '$re'"; }
  }
  expect_fail "mpirun -np 3: the step was compiled for 2 ranks per row \(sbpc --seq-parallel 2\), and 3 ranks are not whole groups of 2: use -np 2 or 4" \
    mpi 3 "$SBP_TRAIN" "$work/sp2.so" --model "$FX/llama_op17_dyn.onnx" "${IDS[@]}" --steps 1
  expect_fail "error: .*--seq-parallel 4, but the step was compiled for 2 ranks per row" \
    mpi 2 "$SBP_TRAIN" "$work/sp2.so" --seq-parallel 4 --model "$FX/llama_op17_dyn.onnx" \
    "${IDS[@]}" --steps 1
  expect_fail "^sbp-train: error: .*the step was compiled for 2 ranks per row \(sbpc --seq-parallel 2\): run it as mpirun -np 2" \
    "$SBP_TRAIN" "$work/sp2.so" --model "$FX/llama_op17_dyn.onnx" "${IDS[@]}" --steps 1
  [ "$(wc -l < "$work/err.txt")" = 1 ] || { cat "$work/err.txt" >&2; fail "not one error line"; }
  exit 0
fi

model=$1 n=$2 np=$3 strategy=$4 packed=${5:-}
# N = 1 under -np 1: one rank through the collectives' paths (the exchanges through MPI, or
# NCCL for a cuda step: tests/gpu/run.sh), as a data-parallel run of one rank
[ "$np" = 1 ] && export SBP_TRAIN_DIST_ONE_RANK=1
name=$(basename "$model" .onnx)
work="$WORK/seq-$name-n$n-np$np-$strategy${packed:+-$packed}"
rm -rf "$work" && mkdir -p "$work/one" "$work/dist"
groups=$np spflag=()
[ "$n" = 0 ] || { groups=$((np / n)); spflag=(--seq-parallel "$n"); }
rows=$((4 / groups)) # each data group's rows of the 4-row batch
extra=()
step_flags=()
zflag=()
case $packed in
  dataset) # a dataset of sbp-prepare's format (tests/train/dataset_ref.py's writer), shuffled
    "$PY" - "$here/../train" "$work/data.safetensors" <<'EOF'
import random, sys
sys.path.insert(0, sys.argv[1])
import dataset_ref as d
r = random.Random(5)
exs = []
for _ in range(13):
    n = r.randint(8, 64)
    exs.append(d.example([r.randrange(64) for _ in range(n)], r.randint(1, n - 1)))
d.write_dataset(sys.argv[2], exs, vocab=64, max_len=64)
EOF
    IDS=(--dataset "$work/data.safetensors" --shuffle-seed 4) ;;
  dataset_packed) # the same kind of examples packed next-fit into the rows of a packed step
    "$PY" - "$here/../train" "$work/data.safetensors" <<'EOF'
import random, sys
sys.path.insert(0, sys.argv[1])
import dataset_ref as d
r = random.Random(6)
exs = []
for _ in range(40):
    n = r.randint(4, 40)
    exs.append(d.example([r.randrange(64) for _ in range(n)], r.randint(1, n - 1)))
d.write_dataset(sys.argv[2], exs, vocab=64, max_len=64)
EOF
    IDS=(--dataset "$work/data.safetensors" --shuffle-seed 4 --pack)
    step_flags=(--packed) ;;
  data) # --data (each row's labels its next tokens, cut after the rows are whole), with the
        # held-out loss on the same shard every 5 steps (the group's partial sums added)
    "$PY" "$here/compare.py" shard "$work/tokens.bin" 64 4000 7
    IDS=(--data "$work/tokens.bin" --eval-data "$work/tokens.bin" --eval-every 5
         --eval-batches 2) ;;
  pack) # --data packed into rows of whole documents (token 10 ends one)
    "$PY" "$here/compare.py" shard "$work/tokens.bin" 64 4000 7
    IDS=(--data "$work/tokens.bin" --pack --eos 10)
    step_flags=(--packed) ;;
  zero1|zero2) # AdamW's moments divided over all NP ranks (ZeRO 1; ZeRO 2 reduce-scatters too)
    zflag=(--zero "${packed#zero}") ;;
  lora) # LoRA adapters (a graph rewrite before everything else): the same machinery
    step_flags=(--lora 4) ;;
  resume|abort) ;;
esac
if [ "$packed" = packed ]; then
  # documents of 5, 13, 26 and 20 tokens (row 0), 40 and 24 (row 1), ...: several cross a
  # rank's boundary at 64/N
  "$PY" - "$work/docs.npy" <<'EOF'
import struct, sys
lens = [[5, 13, 26, 20], [40, 24], [64], [1, 31, 2, 30]]
vals = []
for row in lens:
    vals += [d for d, n in enumerate(row) for _ in range(n)]
hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (4, 64), }"
hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<%di" % len(vals), *vals))
EOF
  extra=(--doc-ids "$work/docs.npy")
  step_flags=(--packed)
fi
"$SBPC" "$FX/$model" --batch 4 --seq-len 64 --strategy "$strategy" --chunk 8 --logits-chunk 13 \
  "${step_flags[@]}" -o "$work/one.so"
"$SBPC" "$FX/$model" --batch "$rows" --seq-len 64 --strategy "$strategy" --chunk 8 \
  --logits-chunk 13 "${spflag[@]}" "${step_flags[@]}" -o "$work/sp.so"
if [ "$packed" = resume ]; then
  # stop after 3 steps, resume to 6: the checkpoint bytes of 6 steps at once
  args=(--model "$FX/$model" "${IDS[@]}" --lr 0.01)
  mpi "$np" "$SBP_TRAIN" "$work/sp.so" "${args[@]}" --steps 6 --checkpoint-dir "$work/all" > /dev/null
  mpi "$np" "$SBP_TRAIN" "$work/sp.so" "${args[@]}" --steps 3 --checkpoint-dir "$work/part" > /dev/null
  mpi "$np" "$SBP_TRAIN" "$work/sp.so" "${args[@]}" --steps 6 --resume "$work/part" > "$work/resumed.txt"
  grep -q "^step 4 " "$work/resumed.txt" || fail "the resumed run did not start at step 4"
  ! grep -q "^step 1 " "$work/resumed.txt" || fail "the resumed run ran step 1 again"
  cmp "$work/all/step-00000006.safetensors" "$work/part/step-00000006.safetensors" ||
    fail "the resumed run's checkpoint differs from the uninterrupted run's"
  echo "seq_case: resume: checkpoints identical"
  # the same ranks, step batch and row length with N = NP (one group, where the checkpoint's
  # run had NP / N of them): another global batch, refused by the checkpoint's "seq_parallel"
  "$PY" "$here/compare.py" shard "$work/tokens.bin" 64 4000 7
  "$SBPC" "$FX/$model" --batch "$rows" --seq-len 64 --strategy "$strategy" --chunk 8 \
    --logits-chunk 13 --seq-parallel "$np" -o "$work/spnp.so"
  mpi "$np" "$SBP_TRAIN" "$work/sp.so" --model "$FX/$model" --data "$work/tokens.bin" --steps 1 \
    --checkpoint-dir "$work/data1" > /dev/null
  rc=0
  mpi "$np" "$SBP_TRAIN" "$work/spnp.so" --model "$FX/$model" --data "$work/tokens.bin" \
    --steps 2 --resume "$work/data1" > /dev/null 2> "$work/other_n.txt" || rc=$?
  [ "$rc" != 0 ] || fail "a resume with another --seq-parallel ran"
  grep -q "another number of ranks per row .*seq_parallel is $n there but $np here" \
    "$work/other_n.txt" || { cat "$work/other_n.txt" >&2; fail "no seq_parallel refusal"; }
  echo "seq_case: resume: a step of N = $np refused on a checkpoint of N = $n"
  exit 0
fi
if [ "$packed" = abort ]; then
  # rank 1 fails at step 2 (the trainer's test hook): every rank ends, the job's status is not 0
  rc=0
  SBP_TEST_FAIL_RANK=1 mpi "$np" "$SBP_TRAIN" "$work/sp.so" --model "$FX/$model" "${IDS[@]}" \
    --steps 5 > "$work/out.txt" 2> "$work/err.txt" || rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat "$work/err.txt" >&2; fail "exit $rc"; }
  grep -q "rank 1: error" "$work/err.txt" || { cat "$work/err.txt" >&2; fail "no rank 1 error"; }
  ! grep -q "^step 3 " "$work/out.txt" || fail "the job went on after the failure"
  echo "seq_case: abort: the job ended at rank 1's failure (exit $rc)"
  exit 0
fi
"$SBP_TRAIN" "$work/one.so" --model "$FX/$model" "${IDS[@]}" "${extra[@]}" "${TRAIN_FLAGS[@]}" \
  --dump-grads "$work/one/grads.st" --log "$work/one/log.jsonl" \
  --checkpoint-dir "$work/one/ck" > "$work/one/out.txt"
mpi "$np" "$SBP_TRAIN" "$work/sp.so" --model "$FX/$model" "${IDS[@]}" "${extra[@]}" \
  "${TRAIN_FLAGS[@]}" "${zflag[@]}" "${spflag[@]}" --dump-grads "$work/dist/grads.st" \
  --log "$work/dist/log.jsonl" --checkpoint-dir "$work/dist/ck" \
  > "$work/dist/out.txt" 2> "$work/dist/err.txt" ||
  { cat "$work/dist/err.txt" >&2; fail "the sequence-parallel run failed"; }
[ "$(grep -c '^step ' "$work/dist/out.txt")" = 10 ] || fail "expected 10 step lines"
[ "$n" = 0 ] ||
  grep -q "sequence parallel: $groups data groups\? of $n ranks, each rank $((64 / n)) of every row's 64 tokens" \
    "$work/dist/out.txt" || { cat "$work/dist/out.txt" >&2; fail "no sequence-parallel summary"; }
if [ -n "${zflag[*]}" ]; then
  # the moments per rank: sbpc's plan (the largest ZeRO slice) against rank 0's (the smallest,
  # at most one element less)
  "$SBPC" "$FX/$model" --batch "$rows" --seq-len 64 --strategy "$strategy" --chunk 8 \
    --logits-chunk 13 "${spflag[@]}" --report --ranks "$np" "${zflag[@]}" -o "$work/rep.so" \
    > "$work/report.txt"
  planned=$(sed -n "s/^  per rank: AdamW moments m, v  *\([0-9][0-9]*\).*/\1/p" "$work/report.txt" | tail -1)
  mine=$(sed -n "s/^data parallel: $np ranks, ZeRO ${zflag[1]}: optimizer state \([0-9]*\) bytes per rank.*/\1/p" \
    "$work/dist/out.txt")
  [ -n "$planned" ] && [ -n "$mine" ] && [ "$mine" -le "$planned" ] && [ $((planned - mine)) -le 8 ] ||
    { cat "$work/report.txt" "$work/dist/out.txt" >&2; fail "moments per rank: $mine, planned $planned"; }
  echo "seq_case: moments per rank $mine bytes (sbpc --report: $planned)"
fi
# stderr: rank 0's notes only (a dataset's passes)
! grep -v "^sbp-train: rank 0: note: " "$work/dist/err.txt" ||
  { cat "$work/dist/err.txt" >&2; fail "stderr holds more than rank 0's notes"; }
"$PY" "$here/compare.py" st2 "$work/dist/grads.st" "$work/one/grads.st" 1e-6
"$PY" "$here/compare.py" log "$work/dist/log.jsonl" "$work/one/log.jsonl" 1e-6 1e-5
"$PY" "$here/compare.py" st2 "$work/dist/ck/step-00000010.safetensors" \
  "$work/one/ck/step-00000010.safetensors" 1e-5
# the held-out losses: the group's partial sums against one process's (one data group: with
# several, each evaluates its step's rows of a batch, as data-parallel ranks do, which is
# another batch than one process's of all the rows)
if [ "$packed" = data ] && [ "$groups" = 1 ]; then
  "$PY" - "$work/dist/out.txt" "$work/one/out.txt" <<'EOF2'
import re, sys
a, b = ([float(x) for x in re.findall(r"^eval step \d+ loss (\S+)", open(p).read(), re.M)]
        for p in sys.argv[1:])
if len(a) != 2 or len(a) != len(b):
    sys.exit(f"seq_case: eval losses {a} vs {b}: expected 2 each")
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
if not worst <= 1e-6:
    sys.exit(f"seq_case: eval losses {a} vs {b}: {worst:.3g} relative > 1e-6")
print(f"seq_case: {len(a)} evaluations agree, worst {worst:.3g} relative")
EOF2
fi
