#!/usr/bin/env bash
# eval_case.sh — sbp-train's held-out evaluation, run by ctest as train.eval_CASE.
#
#   eval_case.sh CASE   (environment: SBPC, SBP_TRAIN, SBP_SHARD, MODEL (examples/
#                        tiny_llama.onnx, V = 256), TEXT (a text file), WORK (scratch folder))
#
# The steps are compiled by sbpc from the example model (B = 2, T = 32), the data is a text's
# bytes as an llm.c shard (sbp-shard). Cases:
#   same       evaluation on the training batch itself, after a step with lr 0 (weights
#              unchanged): its loss equals the step's training loss within 1e-6 relative, for
#              stream and for store;
#   schedule   --eval-every 2 --steps 5 evaluates after steps 2, 4 and 5 (the last), and the
#              --log lines of exactly those steps carry eval_loss, equal to the printed value;
#   neutral    a run with evaluation trains exactly as one without (the step lines are
#              identical): evaluation shares the workspace and the ids buffer, and must not
#              disturb training;
#   packed     a step compiled --packed, the data packed (--pack, EOS = newline): evaluation on
#              the first packed batch after a step with lr 0 equals its training loss, and the
#              run reports the attention work its documents took;
#   refusals   --eval-every without --eval-data; --eval-data with a step compiled --no-eval;
#              --eval-batches beyond what the shard holds: exit status 1, one error line, no
#              step run.
set -uo pipefail

case_name=${1:?usage: eval_case.sh CASE}
dir="$WORK/eval_$case_name"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

fail() {
  echo "FAIL [eval_$case_name]: $*" >&2
  exit 1
}

"$SBP_SHARD" "$TEXT" -o data.bin >/dev/null || fail "sbp-shard failed"

compile() { # compile NAME ARGS...
  local name=$1
  shift
  "$SBPC" "$MODEL" --batch 2 --seq-len 32 "$@" -o "$name.so" >"$name.log" 2>&1 ||
    { cat "$name.log" >&2; fail "sbpc $*"; }
}

train() { # train OUT STEP ARGS...: exit status 0 required
  local out=$1 step=$2
  shift 2
  timeout 120 "$SBP_TRAIN" "$step" --model "$MODEL" --threads 2 "$@" >"$out" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || { cat "$out" >&2; fail "expected exit status 0, got $rc: $*"; }
}

refuse() { # refuse REGEX STEP ARGS...: exit 1, one error line matching REGEX, no step
  local regex=$1 step=$2
  shift 2
  timeout 120 "$SBP_TRAIN" "$step" --model "$MODEL" "$@" >out.txt 2>&1
  local rc=$?
  [ "$rc" = 1 ] || { cat out.txt >&2; fail "expected exit status 1, got $rc: $*"; }
  [ "$(grep -c 'error:' out.txt)" = 1 ] || { cat out.txt >&2; fail "not one error line: $*"; }
  grep -qE "$regex" out.txt || { cat out.txt >&2; fail "no /$regex/ in the error: $*"; }
  if grep -q '^step ' out.txt; then cat out.txt >&2; fail "a step ran: $*"; fi
}

# rel A B: |A - B| / |B|
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; printf "%.3e", d / b }'; }

case "$case_name" in
same)
  for strategy in stream store; do
    compile "$strategy" --strategy "$strategy"
    train out_$strategy.txt "$strategy.so" --data data.bin --eval-data data.bin --eval-batches 1 \
      --steps 1 --lr 0
    t=$(grep -oE '^step 1 loss [0-9.]+' out_$strategy.txt | awk '{print $4}')
    e=$(grep -oE '^eval step 1 loss [0-9.]+' out_$strategy.txt | awk '{print $5}')
    [ -n "$t" ] && [ -n "$e" ] || { cat out_$strategy.txt >&2; fail "$strategy: no loss lines"; }
    r=$(rel "$e" "$t")
    echo "$strategy: training loss $t, evaluation loss $e, relative difference $r"
    awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }' || fail "$strategy: $e vs $t ($r > 1e-6)"
  done
  ;;
packed)
  compile packed --packed --chunk 7 --logits-chunk 11
  train out.txt packed.so --data data.bin --pack --eos 10 --eval-data data.bin --eval-batches 1 \
    --steps 1 --lr 0
  t=$(grep -oE '^step 1 loss [0-9.]+' out.txt | awk '{print $4}')
  e=$(grep -oE '^eval step 1 loss [0-9.]+' out.txt | awk '{print $5}')
  [ -n "$t" ] && [ -n "$e" ] || { cat out.txt >&2; fail "no loss lines"; }
  r=$(rel "$e" "$t")
  echo "packed: training loss $t, evaluation loss $e, relative difference $r"
  awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }' || fail "$e vs $t ($r > 1e-6)"
  grep -qE '^packed documents: [0-9]+ documents .* of the work of unpacked rows' out.txt ||
    { cat out.txt >&2; fail "no packed documents line"; }
  ;;
schedule)
  compile stream
  train out.txt stream.so --data data.bin --eval-data data.bin --eval-every 2 --eval-batches 2 \
    --steps 5 --lr 3e-3 --log run.jsonl
  got=$(grep -oE '^eval step [0-9]+' out.txt | awk '{print $3}' | tr '\n' ' ')
  [ "$got" = "2 4 5 " ] || { cat out.txt >&2; fail "evaluated after steps '$got', not '2 4 5 '"; }
  logged=$(grep -n 'eval_loss' run.jsonl | cut -d: -f1 | tr '\n' ' ')
  [ "$logged" = "2 4 5 " ] || { cat run.jsonl >&2; fail "eval_loss on log lines '$logged'"; }
  for s in 2 4 5; do
    p=$(grep -oE "^eval step $s loss [0-9.]+" out.txt | awk '{print $5}')
    l=$(sed -n "${s}p" run.jsonl | grep -oE '"eval_loss":[0-9.e+-]+' | cut -d: -f2)
    r=$(rel "$p" "$l")
    awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }' || fail "step $s: printed $p, logged $l"
  done
  grep -qE '^eval step 5 loss [0-9.]+ ppl [0-9.]+ \(2 batches, [0-9]+ scored tokens' out.txt ||
    fail "the evaluation line's form"
  ;;
neutral)
  compile stream
  train plain.txt stream.so --data data.bin --steps 6 --lr 3e-3
  train with.txt stream.so --data data.bin --steps 6 --lr 3e-3 --eval-data data.bin --eval-every 1 \
    --eval-batches 3
  diff <(grep -oE '^step [0-9]+ loss [0-9.]+ ' plain.txt) \
       <(grep -oE '^step [0-9]+ loss [0-9.]+ ' with.txt) >&2 ||
    fail "evaluation changed the training losses"
  [ "$(grep -c '^eval step' with.txt)" = 6 ] || fail "not 6 evaluations"
  ;;
refusals)
  compile stream
  compile noeval --no-eval
  refuse 'eval-every needs --eval-data' stream.so --data data.bin --eval-every 2
  refuse 'no evaluation entry point.*--no-eval' noeval.so --data data.bin --eval-data data.bin
  refuse 'eval-batches 100000: --eval-data .* holds [0-9]+ whole batch' stream.so \
    --data data.bin --eval-data data.bin --eval-batches 100000
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "eval_$case_name: ok"
