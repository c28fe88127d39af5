#!/usr/bin/env python3
"""sbp-train --save-safetensors F --merge-lora is the transformers model PEFT's
merge_and_unload() gives.

    export_check.py MERGED.safetensors ADAPTER_DIR FAMILY

MERGED.safetensors and ADAPTER_DIR are one sbp-train run's --save-safetensors --merge-lora and
--save-adapter. Builds tests/fixtures/hf's model of FAMILY (gen_lora.base_model: gen_hf.make_model's, the
exported weights; for a MoE family gen_moe's float64 model with eager experts, whose fused
expert tensors PEFT merges as target_parameters) and loads F with load_state_dict(strict=True) (every key of the model's state_dict,
no other); builds the same model again, loads the adapter with peft.PeftModel.from_pretrained
and merges it (merge_and_unload). Every tensor of the two must agree within 1e-6 of its largest
entry (PEFT merges in float32, sbp-train sums in double and rounds once), and the logits on
gen_hf's batch within 1e-5 relative; so that the check cannot pass with the adapters left out,
the unmerged model's logits must differ by more than 100 times that. Exit 77 (ctest's
SKIP_RETURN_CODE) when torch, transformers, peft or safetensors cannot be imported: CI has none.
"""
import os
import sys

try:
    import torch
    import transformers  # noqa: F401
    import peft
    from safetensors.torch import load_file
except Exception as e:  # any import failure: not this machine's check
    print("SKIPPED: torch / transformers / peft / safetensors not importable (%s); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "hf"))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "lora"))
import gen_lora  # noqa: E402


def main():
    merged_path, adapter_dir, fam = sys.argv[1:4]
    ours = gen_lora.base_model(fam)
    ours.load_state_dict(load_file(merged_path), strict=True)  # raises on a missing/extra key
    peft_model = peft.PeftModel.from_pretrained(gen_lora.base_model(fam), adapter_dir)
    theirs = peft_model.merge_and_unload()
    sd_o, sd_t = ours.state_dict(), theirs.state_dict()
    if set(sd_o) != set(sd_t):
        print("FAIL: key sets differ:", sorted(set(sd_o) ^ set(sd_t)))
        return 1
    worst, changed = 0.0, 0
    base = gen_lora.base_model(fam).state_dict()
    for k in sd_t:
        a, b = sd_o[k].double(), sd_t[k].double()
        e = float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
        worst = max(worst, e)
        changed += not torch.equal(sd_t[k], base[k])
        if e > 1e-6:
            print("FAIL: %s: max |sbp - peft| / max |peft| = %.3g" % (k, e))
            return 1
    ids, _ = gen_lora.batch(fam)
    with torch.no_grad():
        lo = ours.double()(input_ids=ids, use_cache=False).logits
        lt = theirs.double()(input_ids=ids, use_cache=False).logits
        l0 = gen_lora.base_model(fam).double()(input_ids=ids, use_cache=False).logits
    el = float((lo - lt).norm() / lt.norm())
    e0 = float((l0 - lt).norm() / lt.norm())
    print("%s: %d tensors (%d merged), worst tensor %.3g; logits %.3g (unmerged model %.3g)"
          % (fam, len(sd_t), changed, worst, el, e0))
    if changed == 0 or el > 1e-5 or e0 < 100 * 1e-5:
        print("FAIL")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
