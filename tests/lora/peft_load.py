#!/usr/bin/env python3
"""The adapter sbp-train --save-adapter wrote loads in PEFT and gives the trained loss.

    peft_load.py ADAPTER_DIR FAMILY

Builds the base model of FAMILY as tests/fixtures/lora/gen_lora.py does (gen_lora.base_model:
gen_hf.make_model's dense model, the exported weights, or for qwen3_moe gen_moe.ref_model's
float64 Qwen3-MoE with eager experts and float64 routers), loads the adapter with
peft.PeftModel.from_pretrained(model, ADAPTER_DIR), checks that every saved tensor landed in the
PEFT model (no missing or unexpected LoRA keys, each loaded value the saved one) and that the
training loss on the family's batch (gen_lora.loss_of: CE, for an MoE family CE +
router_aux_loss_coef * aux), in float64, equals PEFT's own loss after the same 10 AdamW steps
(tests/fixtures/lora/ref/FAMILY.safetensors, metadata loss10) within 1e-4 — the step's
training, read back by PEFT. An MoE family's adapter_config.json names the fused expert tensors
in target_parameters (PEFT's lora.ParamWrapper); for it the logits of the loaded model must
also equal, within 1e-4 of their largest magnitude, those of the plain model with the
reference's trained adapters merged by hand under sbpc's names (gen_lora.merged_params), which
ties each saved key to the tensor it adapts. Exit 77 (ctest's SKIP_RETURN_CODE) when torch,
transformers or peft cannot be imported: CI has no torch.
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
sys.path.insert(0, os.path.join(FIX, "lora"))
import gen_lora  # noqa: E402

TOL = 1e-4


def meta(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def logits_check(fam, pm, ids, ref_path):
    """Largest |logits of the loaded PEFT model - logits of the hand-merged reference| over the
    largest |reference logit|. gate_up_proj's lora_B and down_proj's are both [32, 32] in the
    tiny model, so adapters saved under each other's keys would load without complaint: the
    hand merge reads the reference's sbpc-named tensors, independent of PEFT's keys."""
    from safetensors.torch import load_file
    trained = {n[len("trained/"):]: t for n, t in load_file(ref_path).items()
               if n.startswith("trained/")}
    plain = gen_lora.base_model(fam).double()
    with torch.no_grad():
        want = gen_lora.Merged(plain, gen_lora.merged_params(plain, trained))(
            input_ids=ids, use_cache=False).logits
        got = pm(input_ids=ids, use_cache=False).logits
    return float((got - want).abs().max() / want.abs().max())


def main():
    adir, fam = sys.argv[1], sys.argv[2]
    model = gen_lora.base_model(fam)
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
    ids, labels = gen_lora.batch(fam)
    with torch.no_grad():
        loss = float(gen_lora.loss_of(fam, pm, ids, labels))
    ref_path = os.path.join(FIX, "lora", "ref", fam + ".safetensors")
    want = float(meta(ref_path)["loss10"])
    e = abs(loss - want) / abs(want)
    print("peft_load: %d adapter tensors loaded; PEFT loss %.9f, PEFT float64 after the same 10 "
          "steps %.9f (relative %.2g)" % (len(saved), loss, want, e))
    failed = not e <= TOL
    if failed:
        print("peft_load: FAIL: the loaded adapter's loss differs")
    if fam in gen_lora.MOE:
        el = logits_check(fam, pm, ids, ref_path)
        print("peft_load: logits vs the reference's trained adapters merged by hand: %.2g of the "
              "largest" % el)
        if not el <= TOL:
            print("peft_load: FAIL: the loaded adapter's logits differ")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
