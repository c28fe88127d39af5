#!/usr/bin/env bash
# compiler_case.sh — one case of a model hostile to sbpc itself, run by ctest as hardening.CASE.
#
#   compiler_case.sh CASE   (environment: SBPC, SBP_TRAIN, PY (a python3 with Debian's onnx and
#                            numpy), WORK (a scratch folder for this build))
#
# The model is written at test time by compiler_models.py (which says what each one holds) into
# a fresh folder WORK/CASE; an exit status of 77 from it (no onnx or numpy) skips the case. Then
# one sbpc run under `timeout`, and the assertions:
#   a refusal: exit status 1 and exactly one "error:" line on stderr, matching the case's pattern;
#   a success: exit status 0, and what the case names (the folded constant; no warning line at
#   all in sbpc's output, and a step that sbp-train loads and runs).
# Under the sanitizer build (UBSAN_OPTIONS=halt_on_error=1) an overflow on the way is a report
# and a non-zero exit, so a success case also fails on undefined behaviour that leaves the
# result right, and no case passes on a "runtime error:" line.
set -uo pipefail

case_name=${1:?usage: compiler_case.sh CASE}
dir="$WORK/$case_name"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

fail() {
  echo "FAIL [$case_name]: $*" >&2
  exit 1
}

model() {
  "$PY" "$(dirname "$0")/compiler_models.py" "$case_name" m.onnx
  local rc=$?
  [ "$rc" = 77 ] && exit 77
  [ "$rc" = 0 ] || fail "compiler_models.py failed ($rc)"
}

# run LIMIT ARGS...: sbpc ARGS under timeout LIMIT; stdout in out.txt, stderr in err.txt, exit
# status in $rc. The output is echoed for ctest's log.
run() {
  local limit=$1
  shift
  timeout "$limit" "$SBPC" "$@" >out.txt 2>err.txt
  rc=$?
  cat err.txt >&2
  [ "$rc" = 124 ] && fail "timed out (hung): sbpc $*"
  ! grep -q 'runtime error:' err.txt || fail "a sanitizer report: sbpc $*"
}

# expect_refusal REGEX ARGS...: exit status 1 and one error line, matching REGEX.
expect_refusal() {
  local regex=$1
  shift
  run 120 "$@"
  [ "$rc" = 1 ] || fail "expected exit status 1, got $rc: sbpc $*"
  local n
  n=$(grep -c 'error:' err.txt)
  [ "$n" = 1 ] || fail "expected 1 'error:' line on stderr, got $n"
  grep -Eq "$regex" err.txt || fail "stderr does not match: $regex"
}

expect_ok() {
  run "$@"
  [ "$rc" = 0 ] || fail "expected exit status 0, got $rc: sbpc ${*:2}"
}

model
case "$case_name" in
slice_step_int64_max)
  # One row of a [2, 16] constant: the step is never taken, and the Slice folds.
  expect_ok 120 m.onnx --dump-ir=fold
  grep -q '^const  %row: f32\[1,16\]' out.txt || fail "the Slice was not folded: $(cat out.txt)"
  ! grep -q 'Slice' out.txt || fail "a Slice is left: $(cat out.txt)"
  ;;
concat_extent_wrap)
  expect_refusal "node 'concat_hostile' \(Concat\): error: the extents along axis 1 add up to more than 64 bits" m.onnx --report
  ;;
split_sizes_wrap)
  expect_refusal "node 'split_hostile' \(Split\): error: split sizes add up to more than 64 bits" m.onnx --report
  ;;
split_even_wrap)
  expect_refusal "node 'split_hostile' \(Split\): error: input 0 \('a'\): dim 1 \(9223372036854775807\) does not split into 2 equal parts" m.onnx --report
  ;;
range_nan)
  expect_refusal "node 'range_hostile' \(Range\): error: start, limit and delta give no length \(NaN\)" m.onnx --report
  ;;
gather_float_index)
  expect_refusal "node 'gather_hostile' \(Gather\): error: input 1 \('k'\): indices must be integers, not f32" m.onnx --report
  ;;
comment_names)
  # The names reach the comments of the generated C and header; the C compiler sbpc runs
  # must have nothing to say about them (it would print a -Wcomment warning per name).
  expect_ok 300 m.onnx --keep-c -o x.so
  ! grep -qi 'warning' out.txt err.txt || fail "warnings while compiling the step"
  # (stderr holds only the line that says what was written)
  grep -qv '^sbpc: wrote x.so' err.txt && fail "sbpc printed on stderr: $(cat err.txt)"
  # Whatever the C compiler warns about: no comment of x.c or x.h holds an opener (one that held
  # a closer would end early, and the file would not have compiled). String literals (the
  # parameter table's names) may hold both, and are skipped.
  "$PY" - x.c x.h <<'EOF' || fail "a comment opener inside a comment"
import re, sys
token = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*(.*?)\*/', re.S)
for path in sys.argv[1:]:
    for m in token.finditer(open(path).read()):
        if m.group(1) is not None and "/*" in m.group(1):
            sys.exit("%s: /* inside the comment /*%s*/" % (path, m.group(1)))
EOF
  # and the step trains: one AdamW step on a batch of ids
  "$PY" -c 'import numpy as np
ids = (np.arange(8, dtype=np.int32) * 5 % 16).reshape(1, 8)
np.save("ids.npy", ids)
np.save("labels.npy", np.roll(ids, -1, axis=1))' || fail "cannot write the token arrays"
  timeout 120 "$SBP_TRAIN" ./x.so --model m.onnx --input-ids ids.npy --labels labels.npy \
    --steps 1 --threads 1 >train.txt 2>&1
  rc=$?
  cat train.txt >&2
  [ "$rc" = 0 ] || fail "sbp-train on x.so: exit status $rc"
  expect_ok 120 m.onnx --report
  grep -q 'memory plan' out.txt || fail "--report printed no memory plan"
  ;;
chain_20k)
  # A long program: every stage (and, in builds without NDEBUG, the memory plan's verifier) must
  # stay near-linear in its length. ctest's TIMEOUT on this case is only a hang guard.
  expect_ok 290 m.onnx -o chain.c
  [ -s chain.c ] || fail "chain.c is empty"
  ! grep -q 'error:' err.txt || fail "an error line"
  ;;
*)
  fail "unknown case"
  ;;
esac
exit 0
