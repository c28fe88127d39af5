#!/usr/bin/env bash
# run_case.sh — one file-safety case, run by ctest as hardening.CASE.
#
#   run_case.sh CASE        (environment: SBPC, SBP_TRAIN, SBP_SHARD, STEP, FIXTURE, MAKE_EXT,
#                            FX (tests/fixtures), WORK (a scratch folder for this build))
#
# Every case works in its own fresh folder WORK/CASE with copies of its inputs, records the
# content, size, type and permissions of every file there before the run, runs one tool under
# `timeout` (a FIFO that hangs the tool is a failed test, not a hung ctest), and then asserts:
#   expect_fail: exit status 1, exactly one "error:" line on stderr, matching a pattern;
#   the folder afterwards: every file as it was (checksums, types, modes), no file added, and
#   no temporary ("*.tmp.*") left behind.
# The success cases (a sink written in place, a replaced file's mode kept, stale temporaries
# removed) check the same things for what must not change, plus what must.
set -uo pipefail

case_name=${1:?usage: run_case.sh CASE}
dir="$WORK/$case_name"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1

fail() {
  echo "FAIL [$case_name]: $*" >&2
  exit 1
}

# The state of the folder, its subfolders included: one line per entry, "path type mode size
# sha256" (FIFOs and links are not read: reading a FIFO would block).
snapshot() {
  local f
  for f in $(find . -mindepth 1 | sort); do
    if [ -L "$f" ]; then
      printf '%s link %s\n' "$f" "$(readlink "$f")"
    elif [ -p "$f" ]; then
      printf '%s fifo %s\n' "$f" "$(stat -c %a "$f")"
    elif [ -d "$f" ]; then
      printf '%s dir %s\n' "$f" "$(stat -c %a "$f")"
    else
      printf '%s file %s %s %s\n' "$f" "$(stat -c '%a %s' "$f")" "$(sha256sum <"$f" | cut -c1-64)"
    fi
  done
}

# expect_fail REGEX CMD...: exit status 1 (not a signal, not a hang), one error line matching
# REGEX (ERRLINES=2: sbp-train's model import, which prints the importer's line and its own
# "cannot read the model" after it), and the folder exactly as before.
expect_fail() {
  local regex=$1
  shift
  local before after rc
  before=$(snapshot)
  timeout 60 "$@" >"$dir.out" 2>"$dir.err"
  rc=$?
  cat "$dir.err" >&2
  [ "$rc" = 124 ] && fail "timed out (hung): $*"
  [ "$rc" = 1 ] || fail "expected exit status 1, got $rc: $*"
  local n
  n=$(grep -c 'error:' "$dir.err")
  [ "$n" = "${ERRLINES:-1}" ] || fail "expected ${ERRLINES:-1} 'error:' line(s) on stderr, got $n"
  grep -Eq -- "$regex" "$dir.err" || fail "stderr does not match '$regex'"
  # NO_STEP=1: the refusal must come before training (a step's line would be on stdout)
  if [ "${NO_STEP:-0}" = 1 ] && grep -q '^step [0-9]' "$dir.out"; then
    fail "a step ran before the refusal"
  fi
  after=$(snapshot)
  if [ "$before" != "$after" ]; then
    diff <(echo "$before") <(echo "$after") >&2
    fail "the folder changed"
  fi
}

# expect_ok CMD...: exit status 0.
expect_ok() {
  timeout 120 "$@" >"$dir.out" 2>"$dir.err"
  local rc=$?
  cat "$dir.err" >&2
  [ "$rc" = 0 ] || fail "expected exit status 0, got $rc: $*"
}

no_temps() {
  local left
  left=$(find "$dir" -name '*.tmp.*')
  [ -z "$left" ] || fail "temporaries left behind: $left"
}

# A process id that is certainly not running any more (a finished child of this shell).
dead_pid() {
  local p
  sh -c 'exit 0' &
  p=$!
  wait "$p"
  echo "$p"
}

model() { "$FIXTURE" all data >/dev/null && mv data/bigram.onnx m.onnx && mv data/i32_ids.npy ids.npy &&
  mv data/i32_labels.npy labels.npy && mv data/stream.bin stream.bin && rm -rf data; }
NPY=(--input-ids ids.npy --labels labels.npy)
HF="$FX/hf"
LORA_ARGS=(--model "$HF/llama_dynamo_scoped.onnx" --input-ids "$HF/ref/llama_input_ids.npy"
           --labels "$HF/ref/llama_labels.npy")
# lora: a LoRA step (rank 4) of the Llama fixture as ./lora.so, outside the folder's snapshot
# only in that it is made before it
lora() { "$SBPC" "$HF/llama_dynamo_scoped.onnx" --batch 2 --seq-len 32 --lora 4 -o lora.so >/dev/null 2>&1 ||
  fail "sbpc --lora failed"; rm -f lora.c lora.h lora.consts.bin; }
LLAMA="$FX/llama_op17_static.onnx"
LDYN="$FX/llama_op17_dyn.onnx" # vocabulary 64
TINY="$FX/../../examples/tiny_llama.onnx" # vocabulary 256, with sbp_step_eval
# step OBJ B T NAME [sbpc options]: a step of the dynamic Llama fixture, compiled into ./NAME
step() { local obj=$1 b=$2 t=$3 name=$4; shift 4
  "$SBPC" "$LDYN" --objective "$obj" --batch "$b" --seq-len "$t" "$@" -o "$name" >/dev/null 2>&1 ||
    fail "sbpc --objective $obj failed"; }
# dataset FILE TASK N [EOS [ADV]]: a dataset of sbp-prepare's format (tests/train/dataset_ref.py
# writes it: N of its examples, ids 2..15, at most 8 tokens), eos_id EOS (default 1), and for
# grpo every advantage ADV (default: a spread of them)
dataset() { python3 - "$FX/../train" "$@" <<'PYEOF' || fail "cannot write the dataset $2"
import struct, sys
sys.path.insert(0, sys.argv[1])
import dataset_ref as d
path, task, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
eos = sys.argv[5] if len(sys.argv) > 5 else "1"
exs = (d.examples() * 4)[:n]
kw = {}
if task == "grpo":
    adv = [float(sys.argv[6])] * n if len(sys.argv) > 6 else [(i % 5 - 2) / 2 for i in range(n)]
    kw["tensors"] = {"advantages": ("F32", [n], struct.pack("<%df" % n, *adv))}
d.write_dataset(path, exs, task=task, meta={"eos_id": eos}, vocab=16, max_len=8, **kw)
PYEOF
}
# with_config IN OUT JSON: IN with sbp-export's record of config.json (metadata_props
# "sbp.config.json" = JSON), appended as one more ModelProto field 14, which protobuf merges
with_config() { python3 - "$@" <<'PYEOF' || fail "cannot add the config to $1"
import sys
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out
def field(tag, data):
    return bytes([tag]) + varint(len(data)) + data
entry = field(0x0A, b"sbp.config.json") + field(0x12, sys.argv[3].encode())
open(sys.argv[2], "wb").write(open(sys.argv[1], "rb").read() + field(0x72, entry))
PYEOF
}

case "$case_name" in
# ---------------------------------------------------------------- sbp-train: outputs vs inputs
train_dump_grads_over_model)
  model && cp "$STEP" step.so
  expect_fail "--dump-grads: m.onnx would overwrite the model" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --dump-grads m.onnx
  ;;
train_save_over_model_0600)
  model && cp "$STEP" step.so && chmod 600 m.onnx
  expect_fail "--save: m.onnx would overwrite the model" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save m.onnx
  ;;
train_save_over_external_data)
  model && cp "$STEP" step.so && "$MAKE_EXT" m.onnx ext.onnx && rm m.onnx
  [ -f ext.onnx.data ] || fail "make_external wrote no ext.onnx.data"
  expect_fail "--save: ext.onnx.data would overwrite the model's external data" \
    "$SBP_TRAIN" ./step.so --model ext.onnx "${NPY[@]}" --save ext.onnx.data
  ;;
train_save_over_input_ids)
  model && cp "$STEP" step.so
  expect_fail "--save: ids.npy would overwrite --input-ids" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save ids.npy
  ;;
train_dump_grads_over_shard)
  model && cp "$STEP" step.so
  expect_fail "--dump-grads: stream.bin would overwrite --data" \
    "$SBP_TRAIN" ./step.so --model m.onnx --data stream.bin --dump-grads stream.bin
  ;;
train_dump_grads_over_step)
  model && cp "$STEP" step.so
  expect_fail "--dump-grads: step.so would overwrite the step library" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --dump-grads step.so
  ;;
train_hard_link_to_model)
  model && cp "$STEP" step.so && ln m.onnx alias.onnx
  expect_fail "--save: alias.onnx would overwrite the model" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save alias.onnx
  ;;
train_outputs_collide)
  model && cp "$STEP" step.so
  expect_fail "--save: ./out.bin is also the output of --dump-grads" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --dump-grads out.bin --save ./out.bin
  ;;
train_dump_grads_fifo)
  model && cp "$STEP" step.so && mkfifo g.safetensors
  expect_fail "--dump-grads: g.safetensors is a FIFO" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --dump-grads g.safetensors
  ;;
train_save_directory)
  model && cp "$STEP" step.so && mkdir out.onnx
  expect_fail "--save: out.onnx is a directory" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save out.onnx
  ;;
# ---------------------------------------------------------------- sbp-train: FIFOs as inputs
train_fifo_model)
  model && cp "$STEP" step.so && rm m.onnx && mkfifo m.onnx
  ERRLINES=2 expect_fail "m.onnx' is a FIFO, not a regular file" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}"
  ;;
train_fifo_external_data)
  model && cp "$STEP" step.so && "$MAKE_EXT" m.onnx ext.onnx && rm m.onnx ext.onnx.data &&
    mkfifo ext.onnx.data
  ERRLINES=2 expect_fail "external data file 'ext.onnx.data' is a FIFO, not a regular file" \
    "$SBP_TRAIN" ./step.so --model ext.onnx "${NPY[@]}"
  ;;
train_fifo_input_ids)
  model && cp "$STEP" step.so && rm ids.npy && mkfifo ids.npy
  expect_fail "ids.npy: is a FIFO, not a regular file" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}"
  ;;
train_fifo_data)
  model && cp "$STEP" step.so && mkfifo s.bin
  expect_fail "s.bin: is a FIFO, not a regular file" \
    "$SBP_TRAIN" ./step.so --model m.onnx --data s.bin
  ;;
train_fifo_step)
  model && mkfifo step.so
  expect_fail "cannot load the step library ./step.so: is a FIFO, not a regular file" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}"
  ;;
# ---------------------------------------------------------------- sbp-train: a damaged step
train_truncated_step)
  model && head -c $(($(stat -c %s "$STEP") / 2)) "$STEP" >step.so
  expect_fail "cannot load the step library ./step.so: truncated: .* reaches past the end of the [0-9]+-byte file" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}"
  ;;
train_step_not_elf)
  model && printf 'not a shared object at all, just text that is long enough.......\n' >step.so
  expect_fail "cannot load the step library ./step.so: not an ELF file" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}"
  ;;
# ---------------------------------------------------------------- sbp-train: writing
train_save_keeps_mode)
  model && cp "$STEP" step.so && printf 'old' >out.onnx && chmod 600 out.onnx
  expect_ok "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save out.onnx
  [ "$(stat -c %a out.onnx)" = 600 ] || fail "out.onnx is $(stat -c %a out.onnx) now, not 600"
  [ "$(cat out.onnx)" != old ] || fail "out.onnx was not replaced"
  no_temps
  ;;
train_dump_grads_to_dev_null)
  # through a link, so that a regression replaces the link, never the system's /dev/null
  model && cp "$STEP" step.so && ln -s /dev/null sink
  expect_ok "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --dump-grads sink
  [ -L sink ] && [ -c sink ] || fail "the sink was replaced: $(ls -l sink)"
  no_temps
  ;;
train_killed_save_cleans_up)
  # SIGXFSZ (its default action kills) in the middle of writing the saved model: the signal
  # handler removes the temporary; out.onnx stays as it was
  model && cp "$STEP" step.so && printf 'previous' >out.onnx
  before=$(snapshot)
  (ulimit -f 1 && exec "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save out.onnx) \
    >/dev/null 2>"$dir.err"
  rc=$?
  [ "$rc" -gt 128 ] || fail "expected death by SIGXFSZ, got exit status $rc"
  [ "$before" = "$(snapshot)" ] || fail "the folder changed"
  no_temps
  ;;
train_stale_temp_removed)
  model && cp "$STEP" step.so
  stale=".out.onnx.tmp.$(dead_pid).17" live=".out.onnx.tmp.$$.18"
  printf 'left by a killed run' >"$stale"
  printf 'a run still writing' >"$live"
  expect_ok "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --save out.onnx
  [ ! -e "$stale" ] || fail "the stale temporary $stale was not removed"
  [ -e "$live" ] || fail "the temporary of a live process was removed"
  rm -f "$live"
  no_temps
  ;;
# ---------------------------------------------------------------- sbp-train: every output
# The LoRA cases compile a LoRA step of the Llama fixture (--save-adapter needs one).
train_adapter_over_input)
  # the adapter folder's weights file is the run's --input-ids
  lora && mkdir AD && cp "$HF/ref/llama_input_ids.npy" AD/adapter_model.safetensors
  NO_STEP=1 expect_fail "--save-adapter: AD/adapter_model.safetensors would overwrite --input-ids" \
    "$SBP_TRAIN" ./lora.so --model "$HF/llama_dynamo_scoped.onnx" \
    --input-ids AD/adapter_model.safetensors --labels "$HF/ref/llama_labels.npy" --steps 1 \
    --save-adapter AD
  ;;
train_adapter_over_outputs)
  # the adapter folder's two files are also --save-safetensors and --log
  lora && mkdir AD && printf 'weights' >AD/adapter_model.safetensors && printf '{}' >AD/adapter_config.json
  NO_STEP=1 expect_fail "--save-adapter: AD/adapter_(model.safetensors|config.json) is also the output of --(save-safetensors|log)" \
    "$SBP_TRAIN" ./lora.so "${LORA_ARGS[@]}" --steps 1 \
    --save-safetensors AD/adapter_model.safetensors --log AD/adapter_config.json --save-adapter AD
  ;;
train_adapter_is_a_file)
  lora && printf 'not a folder' >AD
  NO_STEP=1 expect_fail "--save-adapter: AD is a regular file, not a directory" \
    "$SBP_TRAIN" ./lora.so "${LORA_ARGS[@]}" --steps 2 --save-adapter AD
  ;;
train_adapter_missing_parent)
  lora
  NO_STEP=1 expect_fail "--save-adapter: cannot write nowhere/AD: the directory nowhere does not exist" \
    "$SBP_TRAIN" ./lora.so "${LORA_ARGS[@]}" --steps 2 --save-adapter nowhere/AD
  ;;
train_save_missing_dir)
  model && cp "$STEP" step.so
  NO_STEP=1 expect_fail "--save: cannot write nowhere/x.onnx: the directory nowhere does not exist" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 2 --save nowhere/x.onnx
  ;;
train_safetensors_missing_dir)
  model && cp "$STEP" step.so
  NO_STEP=1 expect_fail "--save-safetensors: cannot write nowhere/x.safetensors: the directory nowhere does not exist" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 2 --save-safetensors nowhere/x.safetensors
  ;;
train_log_parent_is_file)
  model && cp "$STEP" step.so && printf 'a file' >f
  NO_STEP=1 expect_fail "--log: cannot write f/log.jsonl: f is a regular file, not a directory" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 2 --log f/log.jsonl
  ;;
train_ckpt_dir_holds_input)
  # pruning deletes old step-*.safetensors files of the checkpoint folder: none may be an input
  model && cp "$STEP" step.so && mkdir CK && mv stream.bin CK/step-00000001.safetensors
  NO_STEP=1 expect_fail "--checkpoint-dir: CK/step-00000001.safetensors \(--data\) is named like a checkpoint of CK" \
    "$SBP_TRAIN" ./step.so --model m.onnx --data CK/step-00000001.safetensors --steps 3 \
    --checkpoint-dir CK --checkpoint-every 1 --keep-checkpoints 1
  ;;
train_ckpt_dir_holds_output)
  model && cp "$STEP" step.so && mkdir CK
  NO_STEP=1 expect_fail "--checkpoint-dir: CK/step-00000002.safetensors \(--save-safetensors\) is named like a checkpoint of CK" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 3 \
    --checkpoint-dir CK --save-safetensors CK/step-00000002.safetensors
  ;;
# ---------------------------------------------------------------- sbp-train: non-finite weights
train_nonfinite_lr)
  # the last step's update overflows: there is no next loss to be NaN, so the weights are checked
  model && cp "$STEP" step.so && mkdir CK
  expect_fail "step 1: the update made a weight non-finite: tensor 'W' holds -?inf" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 1 --lr 1e300 --save out.onnx \
    --save-safetensors out.safetensors --checkpoint-dir CK
  ;;
train_nonfinite_weight_decay)
  model && cp "$STEP" step.so
  expect_fail "step 1: the update made a weight non-finite: tensor 'W' holds -?inf" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 1 --weight-decay 1e308 --save out.onnx
  ;;
train_nonfinite_sgd)
  model && cp "$STEP" step.so
  expect_fail "step 1: the update made a weight non-finite: tensor 'W' holds" \
    "$SBP_TRAIN" ./step.so --model m.onnx "${NPY[@]}" --steps 1 --optimizer sgd --lr 1e300 \
    --save out.onnx
  ;;
# ---------------------------------------------------------------- sbp-train: packing
train_pack_only_eos)
  # every document is one EOS token: packed, no label is ever scored
  model && python3 -c '
import struct, sys
n = 200
hdr = struct.pack("<3i", 20240520, 1, n) + bytes(4 * 253)
sys.stdout.buffer.write(hdr + struct.pack("<%dH" % n, *([3] * n)))' >eos.bin || fail "no shard"
  NO_STEP=1 expect_fail "eos.bin: every document is one token long .*nothing to train" \
    "$SBP_TRAIN" "$PACKED" --model m.onnx --data eos.bin --pack --eos 3 --steps 2 --save out.onnx
  ;;
# ---------------------------------------------------------------- sbp-train: files it did not make
# A tool writes over no file it did not make for that purpose, and refuses before any work, in
# one line naming the cause.
train_ref_cache_is_weights)
  # --ref-cache naming a file that is not a cache (a weights file, notes): kept, refused early
  step dpo 2 8 dpo.so && rm -f dpo.c dpo.h dpo.consts.bin && dataset p.safetensors dpo 6 &&
    cp "$FX/ref/llama_grads.safetensors" w.safetensors && printf 'notes\n' >notes.txt
  NO_STEP=1 expect_fail "--ref-cache: w.safetensors is not a reference log-probs cache of sbp-train \(its __metadata__ has no \"format\": \"sbp-logps\"\)" \
    "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --ref-cache w.safetensors
  NO_STEP=1 expect_fail "--ref-cache: notes.txt is not a reference log-probs cache of sbp-train \(not a safetensors file\)" \
    "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --ref-cache notes.txt
  NO_STEP=1 expect_fail "--ref-cache: p.safetensors would overwrite --dataset" \
    "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --ref-cache p.safetensors
  ;;
train_ref_cache_in_ckpt_dir)
  # the checkpoint folder's ref-logps.safetensors is someone's weights file; and a
  # --compute-logps output (another dataset's, or model's, reference) is no cache either
  step dpo 2 8 dpo.so && rm -f dpo.c dpo.h dpo.consts.bin && dataset p.safetensors dpo 6 &&
    mkdir CK && cp "$FX/ref/llama_grads.safetensors" CK/ref-logps.safetensors &&
    dataset q.safetensors dpo 8 &&
    "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset q.safetensors --compute-logps ref.st \
      >/dev/null 2>&1 || fail "--compute-logps failed"
  NO_STEP=1 expect_fail "--checkpoint-dir: CK/ref-logps.safetensors is not a reference log-probs cache of sbp-train \(its __metadata__ has no \"purpose\": \"ref-cache\"\)" \
    "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --checkpoint-dir CK
  NO_STEP=1 expect_fail "--ref-cache: ref.st is not a reference log-probs cache of sbp-train" \
    "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --ref-cache ref.st
  # a cache the run made is kept by the next run and replaced for another dataset
  expect_ok "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --ref-cache c.st
  expect_ok "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --steps 1 --ref-cache c.st
  grep -q "reusing the reference log-probs of c.st" "$dir.err" || fail "the cache was not reused"
  expect_ok "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset q.safetensors --steps 1 --ref-cache c.st
  grep -q "c.st holds reference log-probs of another" "$dir.err" || fail "the cache was not replaced"
  ;;
train_pretrained_stale_adapter)
  # an earlier --save-adapter's files in the --save-pretrained folder would be applied on top
  model && cp "$STEP" step.so && with_config m.onnx mc.onnx '{"model_type": "x"}' && mkdir D &&
    printf '{}' >D/adapter_config.json && printf 'w' >D/adapter_model.safetensors
  NO_STEP=1 expect_fail "--save-pretrained: D holds adapter_(config.json|model.safetensors), which this run does not write" \
    "$SBP_TRAIN" ./step.so --model mc.onnx "${NPY[@]}" --steps 1 --save-pretrained D
  ;;
train_pretrained_stale_template)
  # a chat_template.jinja the new tokenizer does not have would win over its own template
  model && cp "$STEP" step.so && with_config m.onnx mc.onnx '{"model_type": "x"}' && mkdir D TOK &&
    printf '{}' >TOK/tokenizer.json && printf '{}' >TOK/tokenizer_config.json &&
    printf '{{ old }}' >D/chat_template.jinja && printf '{}' >D/config.json
  NO_STEP=1 expect_fail "--save-pretrained: D holds chat_template.jinja, which this run does not write" \
    "$SBP_TRAIN" ./step.so --model mc.onnx "${NPY[@]}" --steps 1 --save-pretrained D --tokenizer TOK
  ;;
train_pretrained_and_adapter_one_dir)
  lora && with_config "$HF/llama_dynamo_scoped.onnx" mc.onnx '{"model_type": "llama"}'
  NO_STEP=1 expect_fail "--save-(adapter|pretrained): (./)?D/? is also the folder of --save-(pretrained|adapter)" \
    "$SBP_TRAIN" ./lora.so --model mc.onnx --input-ids "$HF/ref/llama_input_ids.npy" \
    --labels "$HF/ref/llama_labels.npy" --steps 1 --merge-lora --save-pretrained D --save-adapter ./D
  mkdir E && printf 'x' >E/notes.txt
  NO_STEP=1 expect_fail "--save-adapter: E holds notes.txt, which this run does not write" \
    "$SBP_TRAIN" ./lora.so "${LORA_ARGS[@]}" --steps 1 --save-adapter E
  # the same outputs again into the folder they made: the files are the run's own (a new
  # folder spelled with a trailing slash is made as the folder itself)
  expect_ok "$SBP_TRAIN" ./lora.so "${LORA_ARGS[@]}" --steps 1 --save-adapter F/
  expect_ok "$SBP_TRAIN" ./lora.so "${LORA_ARGS[@]}" --steps 1 --save-adapter F
  [ "$(ls F | tr '\n' ' ')" = "adapter_config.json adapter_model.safetensors " ] || fail "F holds $(ls F)"
  ;;
train_ckpt_dir_other_run)
  # a fresh run into a folder of another run's checkpoints would replace steps 1-2 and keep 3
  model && cp "$STEP" step.so &&
    "$SBP_TRAIN" ./step.so --model m.onnx --data stream.bin --steps 3 --checkpoint-dir CK \
      --checkpoint-every 1 --keep-checkpoints 3 >/dev/null 2>&1 || fail "the first run failed"
  NO_STEP=1 expect_fail "--checkpoint-dir: CK holds the checkpoints of another run \(the newest: step-00000003.safetensors, 3 in all\).*--resume CK" \
    "$SBP_TRAIN" ./step.so --model m.onnx --data stream.bin --steps 2 --checkpoint-dir CK --lr 0.1
  ;;
train_compute_logps_ignores)
  # --compute-logps trains nothing: whatever only training reads is refused, before any
  # folder is made
  step dpo 2 8 dpo.so && rm -f dpo.c dpo.h dpo.consts.bin && dataset p.safetensors dpo 6
  for opt in "--steps 3" "--save o.onnx" "--save-pretrained D" "--log l.jsonl" \
             "--checkpoint-dir CK" "--lr 1e-3" "--save-safetensors o.st" "--clip-grad-norm 1"; do
    NO_STEP=1 expect_fail "error: ${opt%% *} is read by training, and --compute-logps OUT only scores the examples" \
      "$SBP_TRAIN" ./dpo.so --model "$LDYN" --dataset p.safetensors --compute-logps r.st $opt
  done
  ;;
train_grpo_no_advantage)
  # every group one row: every advantage 0, a run that would train nothing
  step grpo 2 8 grpo.so && rm -f grpo.c grpo.h grpo.consts.bin && dataset g.safetensors grpo 6 1 0
  NO_STEP=1 expect_fail "--dataset: g.safetensors: every advantage is 0 .*GRPO would train nothing" \
    "$SBP_TRAIN" ./grpo.so --model "$LDYN" --dataset g.safetensors --steps 2 --save o.onnx
  ;;
train_dataset_other_eos)
  # a dataset of another tokenizer (EOS 1) for a model whose recorded eos_token_id is 3
  model && cp "$STEP" step.so && dataset d.safetensors sft 6 1 &&
    with_config m.onnx m3.onnx '{"eos_token_id": 3, "pad_token_id": 0}' &&
    with_config m.onnx mlist.onnx '{"eos_token_id": [5, 1]}'
  NO_STEP=1 expect_fail "--dataset: d.safetensors was tokenised with eos_id 1, and the model's eos_token_id is 3 \(m3.onnx" \
    "$SBP_TRAIN" ./step.so --model m3.onnx --dataset d.safetensors --steps 1
  "$SBPC" "$TINY" --batch 2 --seq-len 8 -o tiny.so >/dev/null 2>&1 || fail "sbpc failed"
  rm -f tiny.c tiny.h tiny.consts.bin && with_config "$TINY" t3.onnx '{"eos_token_id": 3}'
  NO_STEP=1 expect_fail "--eval-dataset: d.safetensors was tokenised with eos_id 1, and the model's eos_token_id is 3" \
    "$SBP_TRAIN" ./tiny.so --model t3.onnx --dataset d.safetensors --eval-dataset d.safetensors --steps 1
  # one of the model's eos ids, or a model that records none: trained
  expect_ok "$SBP_TRAIN" ./step.so --model mlist.onnx --dataset d.safetensors --steps 1
  expect_ok "$SBP_TRAIN" ./step.so --model m.onnx --dataset d.safetensors --steps 1
  ;;
train_eval_dataset_too_few)
  # 2 or 3 examples for 4 rows: one answer (neither scores an example twice)
  "$SBPC" "$TINY" --batch 4 --seq-len 8 -o tiny.so >/dev/null 2>&1 || fail "sbpc failed"
  rm -f tiny.c tiny.h tiny.consts.bin
  dataset e2.safetensors sft 2 && dataset e3.safetensors sft 3 && dataset e4.safetensors sft 4 &&
    dataset tr.safetensors sft 8
  for n in 2 3; do
    NO_STEP=1 expect_fail "--eval-dataset e$n.safetensors holds $n examples, too few for one batch of 4 rows" \
      "$SBP_TRAIN" ./tiny.so --model "$TINY" --dataset tr.safetensors --eval-dataset e$n.safetensors --steps 1
  done
  expect_ok "$SBP_TRAIN" ./tiny.so --model "$TINY" --dataset tr.safetensors --eval-dataset e4.safetensors --steps 1
  grep -Eq "eval step 1 loss .*\\(1 batch(es)?, 13 scored tokens" "$dir.out" || fail "4 examples are not one batch: $(cat "$dir.out")"
  ;;
# ---------------------------------------------------------------- sbp-shard
shard_output_is_input)
  printf 'some text to shard' >x
  expect_fail "-o: x would overwrite the input" "$SBP_SHARD" x -o x
  ;;
shard_output_links_to_input)
  printf 'some text to shard' >x && ln -s x y.bin
  expect_fail "-o: y.bin would overwrite the input" "$SBP_SHARD" x -o y.bin
  ;;
shard_fifo_input)
  mkfifo x
  expect_fail "x: is a FIFO, not a regular file" "$SBP_SHARD" x -o x.bin
  ;;
shard_fifo_output)
  printf 'some text to shard' >x && mkfifo x.bin
  expect_fail "-o: x.bin is a FIFO, not a regular file" "$SBP_SHARD" x -o x.bin
  ;;
shard_sigterm_cleans_up)
  # a large input keeps the write going long enough to be interrupted once the temporary exists
  truncate -s 48M big && printf 'previous' >big.bin
  before=$(snapshot)
  "$SBP_SHARD" big -o big.bin >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 2000); do
    compgen -G '.big.bin.tmp.*' >/dev/null && break
    sleep 0.01
  done
  compgen -G '.big.bin.tmp.*' >/dev/null || fail "the temporary never appeared"
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" = $((128 + 15)) ] || fail "expected death by SIGTERM (143), got $rc"
  after=$(snapshot)
  if [ "$before" != "$after" ]; then
    # On a loaded machine the signal can land after the commit's rename (the tool still dies
    # by it): the output must then be the whole new file, never part of it, and nothing else
    # may have changed. The usual case, the signal during the write, keeps the folder as it was.
    [ "$(grep -v '^big\.bin ' <<<"$before")" = "$(grep -v '^big\.bin ' <<<"$after")" ] ||
      fail "the folder changed beyond big.bin"
    "$SBP_SHARD" big -o "$WORK/$case_name.whole.bin" >/dev/null 2>&1 || fail "the uninterrupted shard failed"
    cmp -s big.bin "$WORK/$case_name.whole.bin" || fail "big.bin is neither the previous file nor the whole output"
    rm -f "$WORK/$case_name.whole.bin"
  fi
  no_temps
  ;;
shard_to_dev_null)
  printf 'some text to shard' >x && ln -s /dev/null sink
  expect_ok "$SBP_SHARD" x -o sink
  [ -L sink ] && [ -c sink ] || fail "the sink was replaced: $(ls -l sink)"
  no_temps
  ;;
# ---------------------------------------------------------------- sbpc
sbpc_fifo_model)
  mkfifo m.onnx
  expect_fail "model file 'm.onnx' is a FIFO, not a regular file" "$SBPC" m.onnx
  ;;
sbpc_fifo_external_data)
  "$MAKE_EXT" "$LLAMA" m.onnx && rm m.onnx.data && mkfifo m.onnx.data
  expect_fail "external data file 'm.onnx.data' is a FIFO, not a regular file" "$SBPC" m.onnx
  ;;
sbpc_fifo_output)
  mkfifo x.c
  expect_fail "-o: x.c is a FIFO, not a regular file" "$SBPC" "$LLAMA" -o x.c
  ;;
sbpc_fifo_memory_plot)
  mkfifo plot.svg
  expect_fail "--memory-plot: plot.svg is a FIFO, not a regular file" \
    "$SBPC" "$LLAMA" --memory-plot plot.svg
  ;;
sbpc_output_is_model)
  cp "$LLAMA" m.onnx && ln -s m.onnx x.c
  expect_fail "-o: x.c would overwrite the model" "$SBPC" m.onnx -o x.c
  ;;
sbpc_output_is_external_data)
  "$MAKE_EXT" "$LLAMA" m.onnx && ln m.onnx.data x.consts.bin
  expect_fail "-o: x.consts.bin would overwrite the model's external data" \
    "$SBPC" m.onnx -o x.c
  ;;
sbpc_header_unwritable)
  # the previous step.c must survive a step.h that cannot be written (here: a directory)
  printf 'previous c' >x.c && mkdir x.h
  expect_fail "-o: x.h is a directory, not a regular file" "$SBPC" "$LLAMA" -o x.c
  ;;
sbpc_full_disk)
  # a file size limit stands for a full disk; SIGXFSZ ignored, so writes fail with EFBIG
  printf 'previous c' >x.c && printf 'previous h' >x.h && printf 'previous blob' >x.consts.bin
  trap '' XFSZ
  ulimit -f 8
  expect_fail "cannot write .*x\.(c|h)|writing the generated code failed" "$SBPC" "$LLAMA" -o x.c
  no_temps
  ;;
sbpc_compiler_fails)
  # all or none: the C compiler failing leaves the previous .c, .h, .consts.bin and .so
  printf 'previous c' >x.c && printf 'previous h' >x.h && printf 'previous so' >x.so
  printf 'previous blob' >x.consts.bin
  export CC=false
  expect_fail "the C compiler failed" "$SBPC" "$LLAMA" -o x.so
  no_temps
  ;;
sbpc_keeps_mode)
  printf 'previous c' >x.c && chmod 600 x.c
  expect_ok "$SBPC" "$LLAMA" -o x.c
  [ "$(stat -c %a x.c)" = 600 ] || fail "x.c is $(stat -c %a x.c) now, not 600"
  grep -q sbp_step_run x.c || fail "x.c was not written"
  [ -s x.h ] || fail "x.h was not written"
  no_temps
  ;;
sbpc_stale_temp_removed)
  stale=".x.c.tmp.$(dead_pid).5"
  mkdir "$stale" && printf 'half' >"$stale/x.c"
  expect_ok "$SBPC" "$LLAMA" -o x.c
  [ ! -e "$stale" ] || fail "the stale temporary folder $stale was not removed"
  no_temps
  ;;
*)
  fail "unknown case"
  ;;
esac
rm -rf "$dir" "$dir.out" "$dir.err"
echo "PASS [$case_name]"
