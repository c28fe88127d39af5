#!/usr/bin/env bash
# resume_case.sh — one case of what sbp-train's --resume lets in, run by ctest as
# hardening.resume_CASE.
#
#   resume_case.sh CASE   (environment: SBP_TRAIN, STEP (step_bigram), FIXTURE (train_fixture),
#                          PY (python3), FUZZ (ckpt_fuzz.py), WORK (a scratch folder))
#
# Each case trains the bigram step for 3 steps on the fixture's token shard with a checkpoint
# after every step, then damages a copy of the checkpoint folder and resumes it:
#   bad_metadata  every integer of the metadata is parsed whole and range-checked (data_pos
#                 "abc" is no position 0, step "3junk" is no 3, data_epoch INT64_MIN / INT64_MAX
#                 are no pass counts); a bad value is one error line naming the file and the
#                 key, exit 1, before step 1, and the folder exactly as it was;
#   names         only ckpt_path's names are checkpoints: step-5, step-+3, "step- 4", a 9-digit
#                 name with a leading zero are someone else's files, never read, never pruned;
#                 a step past 99999999 (9 digits) is written and read back under one name;
#   nonfinite     a NaN in adamw.m, a negative adamw.v, an infinite weight: refused on resume,
#                 naming the tensor, with nothing written;
#   huge_lr       --lr 1e300 --checkpoint-dir: no checkpoint holds a NaN or an infinity.
set -uo pipefail

case_name=${1:?usage: resume_case.sh CASE}
dir="$WORK/resume_$case_name"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

fail() {
  echo "FAIL [resume_$case_name]: $*" >&2
  exit 1
}

"$FIXTURE" all data >/dev/null || fail "train_fixture failed"
DATA=(--model data/bigram.onnx --data data/stream.bin --lr 0.05 --threads 2)
timeout 120 "$SBP_TRAIN" "$STEP" "${DATA[@]}" --steps 4 --checkpoint-dir base \
  --checkpoint-every 1 --keep-checkpoints 3 >base.txt 2>&1 || { cat base.txt >&2; fail "training failed"; }
CK=step-00000003.safetensors

# The state of folder $1: one line per file, "name sha256".
snapshot() {
  (cd "$1" && find . -mindepth 1 -maxdepth 1 -printf '%f\n' | LC_ALL=C sort |
    while IFS= read -r f; do printf '%s %s\n' "$f" "$(sha256sum <"$f" | cut -c1-64)"; done)
}

# expect_refused DIR REGEX ARGS...: resuming DIR exits 1 with one error line matching REGEX,
# before step 1, and leaves DIR as it was.
expect_refused() {
  local d=$1 regex=$2
  shift 2
  local before rc
  before=$(snapshot "$d")
  timeout 60 "$SBP_TRAIN" "$STEP" "${DATA[@]}" --resume "$d" "$@" >out.txt 2>err.txt
  rc=$?
  cat err.txt >&2
  [ "$rc" = 1 ] || fail "expected exit status 1, got $rc: --resume $d $*"
  [ "$(grep -c 'error:' err.txt)" = 1 ] || fail "expected one 'error:' line"
  grep -Eq -- "$regex" err.txt || fail "stderr does not match '$regex'"
  ! grep -q '^step ' out.txt || fail "a step ran before the refusal"
  [ "$before" = "$(snapshot "$d")" ] || fail "the folder $d changed"
}

# damaged NAME EDIT...: a folder NAME holding only step 3, its checkpoint edited (ckpt_fuzz.py edit)
damaged() {
  local name=$1
  shift
  rm -rf "$name" && mkdir "$name" && "$PY" "$FUZZ" edit "base/$CK" "$name/$CK" "$@" ||
    fail "editing the checkpoint failed"
}

case "$case_name" in
bad_metadata)
  # key=value, then what the message must say
  while IFS='|' read -r edit regex; do
    damaged m "$edit"
    expect_refused m "m/$CK: metadata \"$regex" --steps 5
  done <<'EOF'
data_pos=abc|data_pos" is 'abc', not an integer from 0 to 4095 \(a position in --data's 4096 tokens\)
data_pos=-16|data_pos" is '-16', not an integer
data_pos=4096|data_pos" is '4096', not an integer from 0 to 4095
data_pos=48 |data_pos" is '48 ', not an integer
step=3junk|step" is '3junk', not an integer
step=+3|step" is '\+3', not an integer
step=03|step" is '03', not an integer
data_epoch=-9223372036854775808|data_epoch" is '-9223372036854775808', not an integer from 0 to
data_epoch=9223372036854775807|data_epoch" is '9223372036854775807', not an integer from 0 to 4611686018427387903
data_epoch=99999999999999999999|data_epoch" is '99999999999999999999', not an integer
data_epoch=|data_epoch" is '', not an integer
adamw_step=2|adamw_step" is '2', not 3 \(AdamW's bias correction counts the steps\)
adamw_step=-3|adamw_step" is '-3', not 3
threads=abc|threads" is 'abc', not an integer from 1 to 2147483647
threads=0|threads" is '0', not an integer from 1 to 2147483647
total_steps=x|total_steps" is 'x', not an integer
warmup_steps=-1|warmup_steps" is '-1', not an integer
lr=nan|lr" is 'nan', not a finite number >= 0
weight_decay=1e999|weight_decay" is '1e999', not a finite number >= 0
lr=0x1p3|lr" is '0x1p3', not a finite number >= 0
min_lr= 0|min_lr" is ' 0', not a finite number >= 0
EOF
  # a key every checkpoint has, missing
  damaged m -data_pos
  expect_refused m "m/$CK has no \"data_pos\" in its metadata" --steps 5
  # a value with a line break is shown on one line
  damaged m "data_pos=4
sbp-train: error: forged"
  expect_refused m "data_pos\" is '4\\\\x0asbp-train: error: forged'" --steps 5
  # --input-ids runs: the cursor is the step, and there are no passes
  timeout 60 "$SBP_TRAIN" "$STEP" --model data/bigram.onnx --input-ids data/i32_ids.npy \
    --labels data/i32_labels.npy --steps 3 --checkpoint-dir arrays >/dev/null 2>&1 ||
    fail "training on --input-ids failed"
  rm -rf a && mkdir a && "$PY" "$FUZZ" edit "arrays/$CK" "a/$CK" data_pos=0
  DATA=(--model data/bigram.onnx --input-ids data/i32_ids.npy --labels data/i32_labels.npy)
  expect_refused a "data_pos\" is '0', not 3 \\(without --data the step is the cursor\\)" \
    --steps 5
  # an epoch near the limit still trains on, through a wrap (256 steps a pass: the shard's pass
  # counter counts on from it)
  DATA=(--model data/bigram.onnx --data data/stream.bin --lr 0.05 --threads 2)
  damaged m data_epoch=4611686018427387903
  timeout 60 "$SBP_TRAIN" "$STEP" "${DATA[@]}" --resume m --steps 300 >out.txt 2>&1 ||
    { cat out.txt >&2; fail "a resume at data_epoch 2^62-1 failed"; }
  ;;
names)
  # the real checkpoints 2, 3, 4 and files that only look like checkpoints
  cp -r base n
  for junk in step-5.safetensors step-+3.safetensors 'step- 4.safetensors' \
    step-000000007.safetensors step-00000006.safetensors.bak step-0000000x.safetensors; do
    cp "base/$CK" "n/$junk"
  done
  before=$(snapshot n | grep -v '^step-0000000[234]\.safetensors ')
  timeout 60 "$SBP_TRAIN" "$STEP" "${DATA[@]}" --resume n --steps 6 --checkpoint-every 1 \
    --keep-checkpoints 2 >out.txt 2>err.txt
  rc=$?
  cat err.txt >&2
  [ "$rc" = 0 ] || fail "the resume exited $rc"
  grep -q "resuming from n/step-00000004.safetensors (step 4)" err.txt || fail "did not resume from step 4"
  ! grep -q 'skipping' err.txt || fail "a file that is not a checkpoint was tried"
  # steps 5 and 6 written, 2 to 4 pruned (--keep-checkpoints 2), the look-alikes untouched
  want='step-000000007.safetensors step-00000005.safetensors step-00000006.safetensors '
  want+='step-00000006.safetensors.bak step-0000000x.safetensors'
  held=$(find n -maxdepth 1 -name 'step-0*' -printf '%f\n' | LC_ALL=C sort | tr '\n' ' ')
  [ "$held" = "$want " ] || fail "the folder holds: $held"
  [ "$before" = "$(snapshot n | grep -v '^step-0000000[56]\.safetensors ')" ] || fail "a junk file changed or went"
  # a folder holding only a name ckpt_path never writes holds no checkpoint
  mkdir only && cp "base/$CK" only/step-3.safetensors
  expect_refused only "--resume: only holds no complete checkpoint" --steps 5
  ! grep -q 'skipping' err.txt || fail "a note on a file that is not a checkpoint"
  # past 99999999 the name has 9 digits: written and read back as one name
  damaged big step=100000003 adamw_step=100000003 total_steps=100000003
  mv "big/$CK" big/step-100000003.safetensors
  cp big/step-100000003.safetensors big/step-0100000009.safetensors # not ckpt_path's: ignored
  timeout 60 "$SBP_TRAIN" "$STEP" "${DATA[@]}" --resume big --steps 100000004 >out.txt 2>err.txt ||
    { cat err.txt >&2; fail "resuming step 100000003 failed"; }
  grep -q "resuming from big/step-100000003.safetensors (step 100000003)" err.txt || fail "no resume note"
  [ -f big/step-100000004.safetensors ] || fail "no step-100000004.safetensors: $(ls big)"
  ;;
nonfinite)
  damaged m '@adamw.m=5:nan'
  expect_refused m "m/$CK: adamw.m: tensor 'W' holds nan at element 5 \\(of 256\\)" --steps 5
  damaged m '@adamw.v=7:-1e-3'
  expect_refused m "m/$CK: adamw.v: tensor 'W' holds -0.001 at element 7 \\(of 256\\), and it cannot be negative" --steps 5
  damaged m '@adamw.v=0:inf'
  expect_refused m "adamw.v: tensor 'W' holds inf at element 0" --steps 5
  damaged m '@params=255:-inf'
  expect_refused m "m/$CK: params: tensor 'W' holds -inf at element 255 \\(of 256\\)" --steps 5
  # -0 is no negative v: it resumes
  damaged m '@adamw.v=3:-0.0'
  timeout 60 "$SBP_TRAIN" "$STEP" "${DATA[@]}" --resume m --steps 5 >out.txt 2>&1 ||
    { cat out.txt >&2; fail "a v of -0 was refused"; }
  "$PY" "$FUZZ" check m/step-00000005.safetensors || fail "the resumed checkpoint is not finite"
  ;;
huge_lr)
  for lr in 1e300 1e38; do
    rm -rf d
    timeout 60 "$SBP_TRAIN" "$STEP" --model data/bigram.onnx --data data/stream.bin --lr $lr \
      --steps 1 --checkpoint-dir d >out.txt 2>err.txt
    rc=$?
    cat err.txt >&2
    [ "$rc" = 0 ] || [ "$rc" = 1 ] || fail "--lr $lr: exit status $rc"
    [ "$rc" = 0 ] || [ "$(grep -c 'error:' err.txt)" = 1 ] || fail "--lr $lr: not one error line"
    for f in d/*; do
      [ -e "$f" ] || continue
      "$PY" "$FUZZ" check "$f" || fail "--lr $lr wrote a non-finite checkpoint $f"
    done
    [ -z "$(find d -name '*.tmp.*')" ] || fail "temporaries left"
  done
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS [resume_$case_name]"
