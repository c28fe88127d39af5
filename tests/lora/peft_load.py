#!/usr/bin/env python3
"""The adapter sbp-train --save-adapter wrote loads in PEFT and gives the trained loss.

    peft_load.py ADAPTER_DIR FAMILY

Builds tests/fixtures/hf's model of FAMILY (gen_hf.make_model: the exported weights), loads the
adapter with peft.PeftModel.from_pretrained(model, ADAPTER_DIR), checks that every adapter was
loaded (no missing or unexpected LoRA keys) and that the loss on gen_hf's batch, in float64,
equals PEFT's own loss after the same 10 AdamW steps (tests/fixtures/lora/ref/FAMILY.safetensors,
metadata loss10) within 1e-4 — the step's training, read back by PEFT. Exit 77 (ctest's
SKIP_RETURN_CODE) when torch, transformers or peft cannot be imported: CI has no torch.
"""
import json
import os
import struct
import sys

try:
    import torch
    import transformers  # noqa: F401
    import peft
except Exception as e:  # any import failure: not this machine's check
    print("SKIPPED: torch / transformers / peft not importable (%s); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
sys.path.insert(0, os.path.join(FIX, "hf"))
import gen_hf  # noqa: E402


def meta(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def main():
    adir, fam = sys.argv[1], sys.argv[2]
    model = gen_hf.make_model(fam, "eager")
    pm = peft.PeftModel.from_pretrained(model, adir)
    pm = pm.double()
    pm.eval()
    cfg = pm.peft_config["default"]
    assert cfg.peft_type == peft.PeftType.LORA and cfg.r == 4 and cfg.lora_alpha == 8, cfg
    from safetensors.torch import load_file
    saved = load_file(os.path.join(adir, "adapter_model.safetensors"))
    loaded = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
    assert set(saved) == set(loaded), (sorted(set(saved) ^ set(loaded)))[:4]
    for n, w in saved.items():
        assert torch.equal(loaded[n].detach().float(), w), n
    ids, labels = gen_hf.batch()
    with torch.no_grad():
        loss = float(gen_hf.sft_loss(pm(input_ids=ids, use_cache=False).logits, labels))
    want = float(meta(os.path.join(FIX, "lora", "ref", fam + ".safetensors"))["loss10"])
    e = abs(loss - want) / abs(want)
    print("peft_load: %d adapter tensors loaded; PEFT loss %.9f, PEFT float64 after the same 10 "
          "steps %.9f (relative %.2g)" % (len(saved), loss, want, e))
    if not e <= 1e-4:
        print("peft_load: FAIL: the loaded adapter's loss differs")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
