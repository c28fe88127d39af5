#!/usr/bin/env bash
# report_case.sh — `sbpc --report --ranks N --zero Z`, registered as dist.report by
# tests/dist/CMakeLists.txt. The per-rank figures sbpc prints are checked against arithmetic
# on the compiled step's own sbp_step_get_info() (tests/dist/step_info.c), not on sbpc's:
#   parameters = 4 x param_elems, gradient block = 4 x grad_elems (whole on every rank, ZeRO 2
#   too), AdamW moments = 8 x grad_elems (ZeRO 0) or 8 x ceil(grad_elems / N) (ZeRO 1, 2),
#   workspace = workspace_bytes, total = their sum (and parameters + gradients + workspace =
#   planned_peak_bytes, the step's own figure);
# for N = 1, 2, 3 (3: grad_elems not a multiple of it, so ceil differs from floor) and ZeRO 0,
# 1, 2. With MPIRUN set, sbp-train's own end report under mpirun -np 3 --zero 1 agrees: the same
# moments without ZeRO, and rank 0's share (floor) no more than the planned largest share, at
# most one element (8 bytes) below it. Bad command lines exit 1 with "sbpc: error: ...": --ranks 0,
# --zero 3, --zero without --ranks, --ranks without --report.
# Environment: SBPC, STEP_INFO, FX (tests/fixtures), WORK (scratch); optional SBP_TRAIN, MPIRUN.
set -euo pipefail
fail() { echo "report_case: $*" >&2; exit 1; }
work="$WORK/report"
rm -rf "$work"
mkdir -p "$work"
LDYN="$FX/llama_op17_dyn.onnx"
step="$work/sft_b2.so"
flags=(--batch 2 --seq-len 64 --chunk 17 --logits-chunk 13)

"$SBPC" "$LDYN" "${flags[@]}" -o "$step" > /dev/null
read -r P E W PEAK B < <("$STEP_INFO" "$step")
[ "$((4 * P + 4 * E + W))" = "$PEAK" ] || fail "step_info: params + grads + workspace != peak"
echo "report_case: param_elems $P grad_elems $E workspace $W batch $B"

field() { # FILE LABEL -> the number after "per rank: LABEL"
  sed -n "s/^  per rank: $2  *\([0-9][0-9]*\).*/\1/p" "$1"
}
for n in 1 2 3; do
  for z in 0 1 2; do
    out="$work/report-n$n-z$z.txt"
    "$SBPC" "$LDYN" "${flags[@]}" --report --ranks "$n" --zero "$z" > "$out"
    if [ "$z" = 0 ]; then mom=$((8 * E)); else mom=$((8 * ((E + n - 1) / n))); fi
    want_total=$((4 * P + 4 * E + mom + W))
    got="$(field "$out" parameters) $(field "$out" "gradient block") $(field "$out" "AdamW moments m, v") $(field "$out" workspace) $(field "$out" total)"
    want="$((4 * P)) $((4 * E)) $mom $W $want_total"
    [ "$got" = "$want" ] || { cat "$out" >&2; fail "--ranks $n --zero $z: got '$got', want '$want'"; }
    grep -q "global batch of $((n * B)) rows" "$out" || fail "--ranks $n: no global batch"
    if [ "$z" = 2 ]; then
      grep -q "saves traffic, not gradient memory" "$out" || fail "--zero 2: no traffic note"
    fi
  done
done
[ $((E % 3)) != 0 ] || echo "report_case: note: grad_elems is a multiple of 3 (ceil = floor)"
echo "report_case: per-rank figures agree with the step's sbp_step_info (N = 1, 2, 3; ZeRO 0-2)"

# sbp-train's own figures under mpirun (rank 0 prints rank 0's slice, the smallest)
if [ -n "${MPIRUN:-}" ] && [ -n "${SBP_TRAIN:-}" ]; then
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
  REF="$FX/ref"
  out="$work/train-n3-z1.txt"
  # 6 global rows over 3 ranks of 2: the first 4 rows of the reference batch and 2 again
  "$PY" "$(dirname "$0")/compare.py" rows "$REF/pref_input_ids.npy" "$work/ids6.npy" 6
  "$PY" "$(dirname "$0")/compare.py" rows "$REF/pref_labels.npy" "$work/labels6.npy" 6
  timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe -np 3 "$SBP_TRAIN" "$step" \
    --model "$LDYN" --input-ids "$work/ids6.npy" --labels "$work/labels6.npy" --steps 1 \
    --zero 1 > "$out"
  line=$(grep "^data parallel: 3 ranks, ZeRO 1" "$out") || { cat "$out" >&2; fail "no sbp-train line"; }
  mine=$(echo "$line" | sed 's/.*optimizer state \([0-9]*\) bytes per rank.*/\1/')
  whole=$(echo "$line" | sed 's/.*(\([0-9]*\) without ZeRO).*/\1/')
  planned=$(field "$work/report-n3-z1.txt" "AdamW moments m, v")
  [ "$whole" = $((8 * E)) ] || fail "sbp-train: $whole bytes without ZeRO, want $((8 * E))"
  [ "$mine" -le "$planned" ] && [ $((planned - mine)) -le 8 ] ||
    fail "sbp-train's rank 0 holds $mine bytes of moments, planned at most $planned"
  echo "report_case: sbp-train under mpirun -np 3 --zero 1: $mine bytes (planned $planned)"
fi

# bad command lines: exit 1 with a compiler-style message, and nothing planned
bad() { # EXPECTED-MESSAGE ARGS...
  local msg=$1 rc=0
  shift
  "$SBPC" "$LDYN" "${flags[@]}" "$@" > "$work/bad.out" 2> "$work/bad.err" || rc=$?
  [ "$rc" = 1 ] || fail "sbpc $* exited $rc, not 1"
  grep -q "^sbpc: error: .*$msg" "$work/bad.err" || { cat "$work/bad.err" >&2; fail "sbpc $*: no message '$msg'"; }
  [ ! -s "$work/bad.out" ] || fail "sbpc $*: printed a report"
}
bad "--ranks" --report --ranks 0
bad "--zero" --report --ranks 2 --zero 3
bad "--zero applies to --ranks" --report --zero 1
bad "add --report" --ranks 2
bad "add --report" --ranks 2 --zero 1
echo "report_case: passed"
