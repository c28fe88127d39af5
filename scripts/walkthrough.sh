#!/usr/bin/env bash
# walkthrough.sh — the README's walkthrough, run end to end: a transformers model folder and a
# JSONL chat dataset in, a trained model folder out that transformers opens and generates with.
#
#   scripts/walkthrough.sh [BUILD_DIR] [WORK_DIR]    (default: build, a fresh temporary folder)
#
# Needs the pinned Python environment with sbp_tools (scripts/install-venv.sh; SBP_PYTHON
# names another python). Nothing is downloaded: the "user's model" is a small Qwen3 made from a
# config with random weights and saved with save_pretrained, next to a ChatML tokenizer with a
# chat template (tests/fixtures/frontend/tok_chatml); the data is
# tests/fixtures/frontend/data/sft_messages.jsonl. The steps are the ones a user types:
#   1. sbp-export MODEL_DIR -o model.onnx
#   2. sbp-prepare --tokenizer MODEL_DIR --task sft --max-len 128 train.jsonl -o train.safetensors
#   3. sbpc model.onnx --batch 2 --seq-len 128 -o step.so
#   4. sbp-train step.so --model model.onnx --dataset train.safetensors --epochs 30
#        --shuffle-seed 1 --lr 3e-3 --save-pretrained trained --tokenizer MODEL_DIR
#   5. AutoModelForCausalLM / AutoTokenizer .from_pretrained(trained), then generate
# It fails (exit 1) when any step fails, when the loss does not fall, or when the trained
# folder does not load or generate; exit 77 (a ctest skip) when the Python environment is
# missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
work=${2:-$(mktemp -d)}
mkdir -p "$work"
py=${SBP_PYTHON:-$root/.venv-hf/bin/python}
bin=$(dirname "$py")
if [ ! -x "$py" ] || ! "$py" -c 'import torch, transformers, sbp_tools' 2>/dev/null ||
  [ ! -x "$bin/sbp-export" ]; then
  echo "SKIPPED: no Python environment with torch, transformers and sbp_tools ($py);" \
    "scripts/install-venv.sh makes one"
  exit 77
fi
say() { printf '\n== %s\n' "$*"; }

say "0. a model folder, as a user has one (here: a small Qwen3 with its tokenizer)"
"$py" "$root/scripts/make-example-model.py" "$root/tests/fixtures/frontend/tok_chatml" "$work/model"

say "1. sbp-export"
"$bin/sbp-export" "$work/model" -o "$work/model.onnx"

say "2. sbp-prepare"
"$bin/sbp-prepare" --tokenizer "$work/model" --task sft --max-len 128 \
  "$root/tests/fixtures/frontend/data/sft_messages.jsonl" -o "$work/train.safetensors"

say "3. sbpc"
"$build/tools/sbpc" "$work/model.onnx" --batch 2 --seq-len 128 -o "$work/step.so"

say "4. sbp-train"
"$build/tools/sbp-train" "$work/step.so" --model "$work/model.onnx" \
  --dataset "$work/train.safetensors" --epochs 30 --shuffle-seed 1 --lr 3e-3 \
  --save-pretrained "$work/trained" --tokenizer "$work/model" | tee "$work/train.log"
awk '/^step [0-9]+ loss / { n++; if (n == 1) first = $4; last = $4 }
     END { if (n < 2 || !(last + 0 < 0.8 * first)) { print "walkthrough: the loss did not fall: " first " -> " last; exit 1 }
           print "walkthrough: loss " first " -> " last " over " n " steps" }' "$work/train.log"

say "5. from_pretrained and generate"
"$py" - "$work/trained" <<'EOF'
import sys
import torch, transformers as tf
d = sys.argv[1]
model = tf.AutoModelForCausalLM.from_pretrained(d)
tok = tf.AutoTokenizer.from_pretrained(d)
msgs = [{"role": "user", "content": "Hello, how are you today?"}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                              return_dict=True)
out = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
print("generated:", repr(tok.decode(out[0, ids["input_ids"].shape[1]:])))
EOF
echo "walkthrough: done ($work)"
