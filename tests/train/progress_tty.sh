#!/usr/bin/env bash
# progress_tty.sh — sbp-train's progress line on a terminal, run by ctest as train.progress_tty.
#
#   progress_tty.sh   (environment: SBP_TRAIN, STEP (step_bigram), FIXTURE (train_fixture),
#                      WORK (a scratch folder))
#
# The line is drawn only when stderr is a terminal, which ctest's pipes never are, so the run
# goes through util-linux `script`, which gives it a pseudo-terminal. Two claims: on the
# terminal the line shows step/total, tokens/s and an ETA; off it (the same run with plain
# pipes) none of that appears and stdout keeps its "step N loss X" lines, which scripts parse.
# Without `script` the test is skipped (ctest's SKIP_RETURN_CODE 77), visibly.
set -uo pipefail
fail() {
  echo "FAIL [progress_tty]: $*" >&2
  exit 1
}
command -v script >/dev/null || { echo "SKIP: no util-linux 'script' for a pseudo-terminal"; exit 77; }
dir="$WORK/progress_tty"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1
"$FIXTURE" all data >/dev/null || fail "train_fixture failed"
cmd="'$SBP_TRAIN' '$STEP' --model data/bigram.onnx --data data/stream.bin --steps 3 --lr 0.05 --threads 2"

# -e: script exits with the command's status; the typescript goes to tty.out
timeout 120 script -qec "$cmd" tty.out </dev/null >/dev/null 2>&1 || { cat tty.out >&2; fail "the run under a terminal failed"; }
grep -qaE '3/3  loss [0-9.]+  [0-9]+ tokens/s  ETA [0-9]' tty.out || { cat -v tty.out >&2; fail "no 'N/total ... tokens/s  ETA' line on the terminal"; }
grep -qaE 'step 3 loss [0-9.]+ tokens/s' tty.out || fail "the plain step lines are missing on the terminal"

timeout 120 bash -c "$cmd" >plain.out 2>plain.err || fail "the run without a terminal failed"
grep -q 'ETA' plain.out plain.err && fail "an ETA was drawn although stderr is not a terminal"
grep -q $'\r' plain.err && fail "a carriage return on a non-terminal stderr"
[ "$(grep -cE '^step [0-9]+ loss [0-9.]+ tokens/s' plain.out)" = 3 ] || fail "expected 3 plain 'step N loss X' lines on stdout"
echo "ok: the terminal shows step/total, tokens/s and ETA; a pipe gets the plain lines"
