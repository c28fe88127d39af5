#!/usr/bin/env bash
# train-example.sh — the main job on the bundled example: compile examples/tiny_llama.onnx (a
# Llama-style model with a byte vocabulary, exported from PyTorch) into a training step, turn a
# text every Debian machine has into byte tokens, and train on it, printing the loss as it falls
# and, every 50 steps, the loss on held-out text (another license, never trained on).
#   scripts/train-example.sh [BUILD_DIR] [extra sbp-train options, e.g. --steps 500]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
text=/usr/share/common-licenses/GPL-3
held_out=/usr/share/common-licenses/Apache-2.0
out="$build/example"
mkdir -p "$out"
"$build/tools/sbpc" "$root/examples/tiny_llama.onnx" --batch 4 --seq-len 64 -o "$out/train_step.so"
"$build/tools/sbp-shard" "$text" -o "$out/gpl3.bin"
"$build/tools/sbp-shard" "$held_out" -o "$out/apache2.bin"
"$build/tools/sbp-train" "$out/train_step.so" --model "$root/examples/tiny_llama.onnx" \
  --data "$out/gpl3.bin" --eval-data "$out/apache2.bin" --eval-every 50 \
  --steps 300 --lr 3e-3 --save "$out/tiny_llama_trained.onnx" "$@"
