#!/usr/bin/env bash
# ckpt_case.sh — one checkpoint / resume case, run by ctest as train.ckpt_CASE.
#
#   ckpt_case.sh CASE   (environment: SBP_TRAIN, STEP (step_bigram), TIED (step_tied),
#                        FIXTURE (train_fixture), WORK (a scratch folder for this build))
#
# The claim under test is that a stopped and resumed run is the uninterrupted run, bit for bit:
# each case trains the bigram step on the fixture's data, stops (--steps k, SIGTERM, kill -9, a
# full disk), resumes with --resume, and compares what the two runs printed for the later steps
# and their final checkpoints (cmp: the checkpoint holds the weights, AdamW's m and v, the step
# and the data position, and nothing that depends on time or process). The refusal cases expect
# exit status 1, one "error:" line, and no step run.
set -uo pipefail

case_name=${1:?usage: ckpt_case.sh CASE}
dir="$WORK/ckpt_$case_name"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

fail() {
  echo "FAIL [ckpt_$case_name]: $*" >&2
  exit 1
}

"$FIXTURE" all data >/dev/null || fail "train_fixture failed"
DATA=(--model data/bigram.onnx --data data/stream.bin --lr 0.05 --threads 2)
NPY=(--model data/bigram.onnx --input-ids data/i32_ids.npy --labels data/i32_labels.npy)

# train OUT ARGS...: sbp-train on the bigram step, stdout+stderr to OUT; exit status 0 required.
train() {
  local out=$1
  shift
  timeout 120 "$SBP_TRAIN" "$STEP" "$@" >"$out" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || { cat "$out" >&2; fail "expected exit status 0, got $rc: $*"; }
}

# The "step N loss X" lines of a run's output, for steps FROM and later.
losses_from() { grep -oE '^step [0-9]+ loss [0-9.]+' "$1" | awk -v f="$2" '$2 >= f'; }

# same_run FULL_OUT FULL_DIR PART_OUT PART_DIR STEPS FROM: the resumed run printed steps FROM..STEPS
# exactly as the uninterrupted one did, and the final checkpoints are the same bytes.
same_run() {
  local a b
  a=$(losses_from "$1" "$6")
  b=$(losses_from "$3" 1)
  [ -n "$b" ] || fail "the resumed run printed no step"
  [ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b") >&2; fail "the resumed losses differ"; }
  [ "$(echo "$b" | head -1 | cut -d' ' -f2)" = "$6" ] || fail "the resumed run did not start at step $6"
  local f
  f=$(printf 'step-%08d.safetensors' "$5")
  cmp "$2/$f" "$4/$f" || fail "the final checkpoints $2/$f and $4/$f differ"
}

no_temps() {
  local left
  left=$(find "$dir" -name '*.tmp.*')
  [ -z "$left" ] || fail "temporaries left behind: $left"
}

# expect_refused REGEX ARGS...: exit 1, one error line matching REGEX, no step run.
expect_refused() {
  local regex=$1
  shift
  timeout 60 "$SBP_TRAIN" "$@" >out.txt 2>err.txt
  local rc=$?
  cat err.txt >&2
  [ "$rc" = 1 ] || fail "expected exit status 1, got $rc: $*"
  [ "$(grep -c 'error:' err.txt)" = 1 ] || fail "expected one 'error:' line"
  grep -Eq -- "$regex" err.txt || fail "stderr does not match '$regex'"
  ! grep -q '^step ' out.txt || fail "a step ran before the refusal"
}

# Waits (up to 60 s) until DIR holds a checkpoint, so a slow machine still has one to resume.
wait_for_checkpoint() {
  local i
  for ((i = 0; i < 600; i++)); do
    [ -n "$(newest "$1")" ] && return 0
    sleep 0.1
  done
  fail "no checkpoint appeared in $1"
}

# Waits (up to 60 s) until the run PID has printed its first step to OUT: its SIGINT/SIGTERM
# handlers are installed before step 1 (train_ckpt_prepare), so a signal sent after that tests them;
# one sent at a fixed delay from the start can land before them on a slow machine (under ASan
# with the other cores busy) and kill the run by the default action (exit 143).
wait_for_step() {
  local i
  for ((i = 0; i < 600; i++)); do
    grep -q '^step ' "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  cat err.txt >&2
  fail "the run printed no step"
}

# The step of DIR's newest checkpoint file, or "" when there is none.
newest() {
  find "$1" -maxdepth 1 -name 'step-*.safetensors' -printf '%f\n' | sort | tail -1 |
    sed 's/step-0*//; s/\..*//'
}

case "$case_name" in
resume_adamw_data)
  # AdamW on a token shard (the cursor is the shard position): 6 steps vs 3 + 3
  train full.txt "${DATA[@]}" --steps 6 --checkpoint-dir full --save full.onnx
  train p1.txt "${DATA[@]}" --steps 3 --checkpoint-dir part --checkpoint-every 1
  [ "$(ls part)" = "$(printf 'step-00000002.safetensors\nstep-00000003.safetensors')" ] ||
    fail "--keep-checkpoints 2 (the default) should keep steps 2 and 3, found: $(ls part)"
  train p2.txt "${DATA[@]}" --steps 6 --resume part --save part.onnx
  grep -q 'resuming from part/step-00000003.safetensors' p2.txt || fail "no resume note"
  same_run full.txt full p2.txt part 6 4
  cmp full.onnx part.onnx || fail "the saved models differ"
  ;;
resume_sgd_arrays)
  # SGD (no optimizer state) on --input-ids (the step is the cursor), keeping 1
  train full.txt "${NPY[@]}" --optimizer sgd --lr 0.5 --steps 5 --checkpoint-dir full
  train p1.txt "${NPY[@]}" --optimizer sgd --lr 0.5 --steps 2 --checkpoint-dir part \
    --checkpoint-every 1 --keep-checkpoints 1
  [ "$(ls part)" = "step-00000002.safetensors" ] || fail "--keep-checkpoints 1 kept: $(ls part)"
  train p2.txt "${NPY[@]}" --optimizer sgd --lr 0.5 --steps 5 --resume part
  same_run full.txt full p2.txt part 5 3
  ;;
resume_log)
  # --log on a resume: the lines of the steps the checkpoint covers are kept, a line the
  # interrupted run wrote past its checkpoint is dropped (the resumed run redoes that step), and
  # the resumed steps are appended: steps 1..6 once each, the same losses as one whole run's log
  train full.txt "${DATA[@]}" --steps 6 --log full.jsonl
  train p1.txt "${DATA[@]}" --steps 4 --checkpoint-dir part --checkpoint-every 3 --log part.jsonl
  rm part/step-00000004.safetensors # as if killed after logging step 4, before its checkpoint
  train p2.txt "${DATA[@]}" --steps 6 --resume part --log part.jsonl
  steps=$(grep -oE '"step":[0-9]+' part.jsonl | cut -d: -f2 | tr '\n' ' ')
  [ "$steps" = "1 2 3 4 5 6 " ] || fail "the resumed log holds steps '$steps', not 1..6 once each"
  a=$(grep -oE '"loss":[^,]+' full.jsonl)
  b=$(grep -oE '"loss":[^,]+' part.jsonl)
  [ "$a" = "$b" ] || { diff <(echo "$a") <(echo "$b") >&2; fail "the resumed log's losses differ"; }
  ;;
resume_threads)
  # the thread count is recorded (CPU reductions are split over threads, so only the same count
  # repeats a run bit for bit): a resume with the same count says nothing, another count is told
  train p1.txt "${DATA[@]}" --steps 3 --checkpoint-dir part
  head -c 4096 part/step-00000003.safetensors | grep -aq '"threads":"2"' ||
    fail "the checkpoint does not record --threads 2"
  cp -r part same
  train p2.txt "${DATA[@]}" --steps 5 --resume same
  ! grep -q 'threads' p2.txt || { cat p2.txt >&2; fail "a resume with the same --threads got a note"; }
  train p3.txt --model data/bigram.onnx --data data/stream.bin --lr 0.05 --threads 1 --steps 5 \
    --resume part
  grep -q "note: the checkpoint's run used 2 CPU threads, this one 1" p3.txt ||
    { cat p3.txt >&2; fail "no note on a resume with --threads 1"; }
  [ "$(losses_from p3.txt 1 | wc -l)" = 2 ] || fail "the --threads 1 resume did not run steps 4-5"
  ;;
sigterm)
  # SIGTERM in a long run: a checkpoint at the end of the current step, exit 0, no temporary
  "$SBP_TRAIN" "$STEP" "${DATA[@]}" --steps 1000000000 --checkpoint-dir part \
    >out.txt 2>err.txt &
  pid=$!
  # a run that ignores SIGTERM fails instead of hanging (the watchdog holds none of ctest's pipes)
  (sleep 60 && kill -KILL "$pid") >/dev/null 2>&1 &
  watchdog=$!
  wait_for_step out.txt "$pid"
  sleep 0.5
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  kill "$watchdog" 2>/dev/null
  [ "$rc" = 0 ] || { cat err.txt >&2; fail "expected exit status 0 after SIGTERM, got $rc"; }
  grep -q 'stopped by SIGTERM after step' err.txt || fail "no 'stopped by SIGTERM' note"
  no_temps
  k=$(newest part)
  [ -n "$k" ] || fail "no checkpoint after SIGTERM"
  n=$((k + 3))
  train full.txt "${DATA[@]}" --steps $n --checkpoint-dir full
  train p2.txt "${DATA[@]}" --steps $n --resume part
  same_run full.txt full p2.txt part $n $((k + 1))
  ;;
sigterm_twice)
  # SIGTERMs until it is gone, while checkpointing every step: the first asks for a stop at the
  # end of the step, a later one (files.c's handler, kept as the previous one) kills the run at
  # once, removing the temporary being written (exit 143); either way no temporary is left and
  # the newest checkpoint resumes as the uninterrupted run
  "$SBP_TRAIN" "$STEP" "${DATA[@]}" --steps 1000000000 --checkpoint-dir part \
    --checkpoint-every 1 >/dev/null 2>err.txt &
  pid=$!
  (sleep 60 && kill -KILL "$pid") >/dev/null 2>&1 &
  watchdog=$!
  wait_for_checkpoint part
  sleep 0.2
  while kill -TERM "$pid" 2>/dev/null; do :; done # a second one lands while it writes, often
  wait "$pid"
  rc=$?
  kill "$watchdog" 2>/dev/null
  echo "exit status after the SIGTERMs: $rc"
  [ "$rc" = 0 ] || [ "$rc" = 143 ] || fail "expected exit 0 or death by SIGTERM, got $rc"
  no_temps
  k=$(newest part)
  [ -n "$k" ] || fail "no checkpoint"
  train full.txt "${DATA[@]}" --steps $((k + 2)) --checkpoint-dir full
  train p2.txt "${DATA[@]}" --steps $((k + 2)) --resume part
  same_run full.txt full p2.txt part $((k + 2)) $((k + 1))
  ;;
kill9)
  # kill -9 while checkpointing every step (each write fsyncs, so the kill most often lands
  # while a temporary exists): the newest complete checkpoint is used, the dead temporary removed
  # (no `timeout` in between: the kill must reach sbp-train itself)
  "$SBP_TRAIN" "$STEP" "${DATA[@]}" --steps 1000000000 --checkpoint-dir part \
    --checkpoint-every 1 >/dev/null 2>&1 &
  pid=$!
  wait_for_checkpoint part
  sleep 0.2
  kill -KILL "$pid"
  wait "$pid"
  if [ -n "$(find part -name '*.tmp.*')" ]; then echo "killed in the middle of a write"; fi
  k=$(newest part)
  [ -n "$k" ] || fail "no checkpoint before kill -9"
  n=$((k + 2))
  train full.txt "${DATA[@]}" --steps $n --checkpoint-dir full
  train p2.txt "${DATA[@]}" --steps $n --resume part
  same_run full.txt full p2.txt part $n $((k + 1))
  no_temps
  ;;
killed_mid_write)
  # the state kill -9 leaves in the middle of a write, made exactly: a half-written temporary of
  # step 4 by a process that is gone; and a damaged step-9 file (a disk that lost its tail)
  train full.txt "${DATA[@]}" --steps 6 --checkpoint-dir full
  train p1.txt "${DATA[@]}" --steps 3 --checkpoint-dir part
  sh -c 'exit 0' &
  dead=$!
  wait "$dead"
  head -c 1000 part/step-00000003.safetensors >"part/.step-00000004.safetensors.tmp.$dead.1"
  head -c 1000 part/step-00000003.safetensors >part/step-00000009.safetensors
  train p2.txt "${DATA[@]}" --steps 6 --resume part
  grep -q 'skipping a damaged checkpoint: .*step-00000009' p2.txt || fail "no note on step 9"
  grep -q 'resuming from part/step-00000003' p2.txt || fail "did not resume from step 3"
  same_run full.txt full p2.txt part 6 4
  no_temps
  ;;
full_disk)
  # a file size limit stands for a full disk: with SIGXFSZ ignored the write fails (EFBIG), with
  # its default action it kills the run (files.c's handler removes the temporary); either way
  # the previous checkpoint is intact, and a later resume still is the uninterrupted run
  train full.txt "${DATA[@]}" --steps 6 --checkpoint-dir full
  train p1.txt "${DATA[@]}" --steps 3 --checkpoint-dir part
  before=$(sha256sum part/*)
  (trap '' XFSZ && ulimit -f 2 && exec "$SBP_TRAIN" "$STEP" "${DATA[@]}" --steps 6 \
    --resume part --checkpoint-every 1) >out.txt 2>err.txt
  rc=$?
  cat err.txt >&2
  [ "$rc" = 1 ] || fail "expected exit status 1 on a full disk, got $rc"
  grep -q 'checkpoint of step 4 not written .*the previous one, of step 3, is intact' err.txt ||
    fail "no message naming the intact checkpoint"
  (ulimit -f 2 && exec "$SBP_TRAIN" "$STEP" "${DATA[@]}" --steps 6 --resume part \
    --checkpoint-every 1) >/dev/null 2>&1
  rc=$?
  [ "$rc" -gt 128 ] || fail "expected death by SIGXFSZ, got exit status $rc"
  [ "$before" = "$(sha256sum part/*)" ] || fail "the previous checkpoint changed"
  no_temps
  train p2.txt "${DATA[@]}" --steps 6 --resume part
  same_run full.txt full p2.txt part 6 4
  ;;
refusals)
  train p1.txt "${DATA[@]}" --steps 2 --checkpoint-dir part
  expect_refused "part/step-00000002.safetensors was written for another model or step: parameter 0 is 'W\\[16,16\\]@0' in the checkpoint but 'E\\[16,4\\]@0' in the step" \
    "$TIED" --model data/tied.onnx --data data/stream.bin --steps 4 --resume part
  expect_refused "was written for another model's initial weights \\(--model\\): model_hash" \
    "$STEP" --model data/nan.onnx --data data/stream.bin --steps 4 --resume part
  expect_refused "was written for another optimizer: optimizer is adamw there but sgd here" \
    "$STEP" "${DATA[@]}" --steps 4 --resume part --optimizer sgd
  expect_refused "was written for another --grad-accum" \
    "$STEP" "${DATA[@]}" --steps 4 --resume part --grad-accum 2
  expect_refused "was written for other training data" \
    "$STEP" "${NPY[@]}" --steps 4 --resume part
  expect_refused "is at step 2 and --steps is 2: nothing left to run" \
    "$STEP" "${DATA[@]}" --steps 2 --resume part
  expect_refused "--dump-grads writes step 1's gradients, but this run resumes after step 2" \
    "$STEP" "${DATA[@]}" --steps 4 --resume part --dump-grads g.safetensors
  # another objective: the same checkpoint with its metadata changed in place (same length)
  mkdir other && sed 's/"objective":"sft"/"objective":"dpo"/' part/step-00000002.safetensors \
    >other/step-00000002.safetensors
  grep -q '"objective":"dpo"' other/step-00000002.safetensors || fail "the sed found no objective"
  expect_refused "was written for another objective: objective is dpo there but sft here" \
    "$STEP" "${DATA[@]}" --steps 4 --resume other
  expect_refused "--resume: nowhere: No such file or directory" \
    "$STEP" "${DATA[@]}" --steps 4 --resume nowhere
  mkdir empty
  expect_refused "--resume: empty holds no complete checkpoint" \
    "$STEP" "${DATA[@]}" --steps 4 --resume empty
  expect_refused "--checkpoint-every needs --checkpoint-dir" \
    "$STEP" "${DATA[@]}" --checkpoint-every 2
  ;;
unwritable)
  # found before step 1 (before the model is even read), not at the first checkpoint
  printf 'x' >afile
  expect_refused "--checkpoint-dir: afile is a regular file, not a directory" \
    "$STEP" "${DATA[@]}" --steps 2 --checkpoint-dir afile
  expect_refused "--checkpoint-dir: cannot create no/such/dir: No such file or directory" \
    "$STEP" "${DATA[@]}" --steps 2 --checkpoint-dir no/such/dir
  expect_refused "--checkpoint-dir: cannot (create|write into) /proc/self/sbp-ckpt" \
    "$STEP" "${DATA[@]}" --steps 2 --checkpoint-dir /proc/self/sbp-ckpt
  ;;
*)
  fail "unknown case"
  ;;
esac
exit 0
