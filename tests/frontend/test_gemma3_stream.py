#!/usr/bin/env python3
"""Gemma-3 as sbp-export writes it, trained by the stream strategy, against float64 PyTorch.

    test_gemma3_stream.py dynamo|torchscript OUTDIR SBPC SBP_TRAIN

sbp-export keeps every weight its own initializer, so Gemma's norm scale stays a computation,
Mul(RMSNorm(x), Add(w, 1)); on q_norm / k_norm it multiplies [B, heads, T, head_dim] values that
the training step stores [B, T, heads, head_dim] (the layout RoPE and attention read token rows
in). The model is gen_hf.py's Gemma-3 test config (3 layers, local and global, sliding window
8, norm weights 0.1 randn so that 1 + w is not 1) saved as a folder and exported with
`--attn eager`; then, on gen_hf.py's batch (B = 2, T = 32, some labels -100):
  - `sbpc --strategy stream --chunk 7 --logits-chunk 13` compiles it (several chunks and a tail)
    and so does `--strategy checkpoint`;
  - `sbp-train --steps 1 --lr 0 --dump-grads` with each: every initializer's gradient agrees
    between the two within 1e-5 (relative to the tensor's largest value), and the losses too;
  - the stream gradients against the float64 transformers model's, mapped to torch names by
    value (gen_hf.param_map; none may be a stored 1 + w: the gradient is w's own): within 1e-4
    per tensor (relative to the tensor's largest value, floored at 1e-4 of the largest
    gradient, as tests/hf/hf_check.c measures), every trainable parameter present.
Exit 77 (skip) without torch / transformers / onnx / onnxruntime.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, Checks, need, run, tool  # noqa: E402

need("numpy", "torch", "transformers", "onnx", "onnxruntime", "onnxscript", "safetensors")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "hf"))
import gen_hf  # noqa: E402

EXPORTER, OUT, SBPC, TRAIN = sys.argv[1:5]
OUT = os.path.join(OUT, EXPORTER)
os.makedirs(OUT, exist_ok=True)
C = Checks()

model = gen_hf.make_model("gemma3", "eager")
folder = os.path.join(OUT, "gemma3")
model.save_pretrained(folder)
ids, labels = gen_hf.batch()
np.save(os.path.join(OUT, "ids.npy"), ids.numpy())
np.save(os.path.join(OUT, "labels.npy"), labels.numpy())
B, T = ids.shape

path = os.path.join(OUT, "gemma3.onnx")
rc, so, se = tool("sbp-export", folder, "-o", path, "--exporter", EXPORTER, "--attn", "eager")
if not C.ok(rc == 0, "sbp-export exit 0, got %d: %s" % (rc, se[-3000:])):
    C.done()
pmap = gen_hf.param_map(model, path)
C.ok(not [k for k, (_, kind) in pmap.items() if kind == 2],
     "no initializer holds 1 + w: %s" % sorted(pmap.items())[:5])

grads, losses = {}, {}
for strategy, extra in (("stream", ["--chunk", 7, "--logits-chunk", 13]), ("checkpoint", [])):
    step = os.path.join(OUT, "gemma3_%s.so" % strategy)
    rc, so, se = run([SBPC, path, "--batch", B, "--seq-len", T, "--strategy", strategy, *extra,
                      "-o", step])
    if not C.ok(rc == 0, "sbpc --strategy %s exit 0, got %d: %s" % (strategy, rc, se[-3000:])):
        continue
    dump = os.path.join(OUT, "grads_%s.safetensors" % strategy)
    rc, so, se = run([TRAIN, step, "--model", path, "--input-ids", os.path.join(OUT, "ids.npy"),
                      "--labels", os.path.join(OUT, "labels.npy"), "--steps", 1, "--lr", 0,
                      "--dump-grads", dump])
    m = re.search(r"^step 1 loss (\S+)", so, re.M)
    if not C.ok(rc == 0 and m and os.path.exists(dump), "sbp-train %s exit 0, got %d: %s"
                % (strategy, rc, se[-2000:])):
        continue
    losses[strategy] = float(m.group(1))
    grads[strategy] = load_file(dump)


def rel(got, want, floor=0.0):
    return float(np.max(np.abs(got.astype(np.float64) - want)) /
                 max(float(np.max(np.abs(want))), floor, 1e-30))


if "stream" in grads and "checkpoint" in grads:
    gs, gc = grads["stream"], grads["checkpoint"]
    C.ok(sorted(gs) == sorted(gc), "the same gradients dumped: %s vs %s" % (sorted(gs), sorted(gc)))
    worst = max((rel(gs[k], gc[k].astype(np.float64)), k) for k in gs if k in gc)
    print("stream vs checkpoint: worst per-tensor relative difference %.3g (%s)" % worst)
    C.ok(worst[0] <= 1e-5, "stream vs checkpoint gradients within 1e-5: %.3g (%s)" % worst)
    C.ok(abs(losses["stream"] - losses["checkpoint"]) <= 1e-5 * abs(losses["checkpoint"]),
         "stream vs checkpoint loss: %r" % losses)

if "stream" in grads:
    m64 = gen_hf.make_model("gemma3", "eager").double()
    loss = gen_hf.sft_loss(m64(input_ids=ids, use_cache=False).logits, labels)
    loss.backward()
    loss = float(loss.detach())
    ref = {n: p.grad.detach().numpy() for n, p in m64.named_parameters() if p.grad is not None}
    gs = grads["stream"]
    floor = 1e-4 * max(float(np.max(np.abs(g))) for g in ref.values())
    errs, seen = [], set()
    for init, (tname, kind) in pmap.items():
        if init not in gs or tname not in ref:
            continue
        want = ref[tname].T if kind == 1 else ref[tname]
        errs.append((rel(gs[init], want, floor), init))
        seen.add(tname)
    C.ok(seen == set(ref), "every torch parameter's gradient dumped: missing %s"
         % sorted(set(ref) - seen))
    C.ok(any("q_norm" in n for n in seen) and any("k_norm" in n for n in seen),
         "the per-head norm weights are among them: %s" % sorted(seen))
    if errs:
        worst = max(errs)
        print("stream vs float64 PyTorch: worst per-tensor relative error %.3g (%s), loss %.3g"
              % (worst[0], worst[1], abs(losses["stream"] - loss) / abs(loss)))
        C.ok(worst[0] <= 1e-4, "stream gradients vs float64 PyTorch within 1e-4: %.3g (%s)"
             % worst)
    C.ok(abs(losses["stream"] - loss) <= 1e-5 * abs(loss),
         "stream loss %r vs float64 %r" % (losses["stream"], loss))
C.done()
