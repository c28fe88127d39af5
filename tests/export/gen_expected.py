#!/usr/bin/env python3
"""Writes tests/export/expected.json: for a few tests/fixtures/hf exports, the keys, shapes and
a few values of the exporting module's state_dict(), the reference for sbp-train
--save-safetensors (tests/export/export_check.c compares a file written after an lr-0 step
with it, key for key).

    .venv-hf/bin/python tests/export/gen_expected.py

The module is rebuilt as tests/fixtures/hf/gen_hf.py built it (same config, seed and random
weights), so the reference is PyTorch's own naming and layout, independent of sbpc: an
nn.Linear weight is [out, in] however the exporter stored it, and a tied head is listed under
both of its names, as state_dict() lists it. The values sampled are elements 0, 1, the last,
and for a matrix [1,0] and [0,1] (flat index cols, 1): a transposed square matrix differs
there, so a layout slip cannot pass on shapes alone.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "hf"))

# one TorchScript export with onnx::MatMul_N names (llama), one TorchScript export with a tied
# head folded into a transposed copy (gpt2), one dynamo export (gpt2: the tied head under one
# initializer plus a transposed `val_N` copy), and llama's dynamo export with its node scopes kept
# (llama_dynamo_scoped, written by tests/fixtures/hf/gen_scoped.py from llama's eager model: the
# `val_N` weights named from pkg.torch.onnx.name_scopes)
EXPORTS = ["llama_ts_eager", "gpt2_ts_eager", "gpt2_dynamo_eager", "llama_dynamo_scoped"]
ATTN = {"scoped": "eager"}  # a key's last part that is not an attention implementation


def sample(t):
    flat = t.detach().float().reshape(-1)
    idx = {0, 1, flat.numel() - 1}
    if t.dim() == 2 and t.shape[0] > 1:
        idx.add(t.shape[1])  # [1,0]
    return [[i, float(flat[i])] for i in sorted(i for i in idx if 0 <= i < flat.numel())]


def main():
    import gen_hf
    out = {}
    for key in EXPORTS:
        fam, _exporter, attn = key.rsplit("_", 2)
        attn = ATTN.get(attn, attn)
        model = gen_hf.make_model(fam, attn)
        sd = model.state_dict()
        out[key] = {"family": fam, "attn": attn,
                    "keys": {k: {"shape": list(v.shape), "values": sample(v)}
                             for k, v in sorted(sd.items())}}
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
