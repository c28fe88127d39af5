#!/usr/bin/env python3
"""sbp-train --save OUT.onnx --merge-lora gives PEFT's model: logits of the merged ONNX (in
onnxruntime) against PEFT's, on the same trained adapters.

    merge_check.py ADAPTER_DIR MERGED.onnx ORIGINAL.onnx FAMILY R ALPHA

ADAPTER_DIR and MERGED.onnx are one sbp-train run's --save-adapter and --save --merge-lora.
Builds tests/fixtures/hf's model of FAMILY (gen_hf.make_model: the exported weights), loads the
adapter with peft.PeftModel.from_pretrained (its config must say r R and lora_alpha ALPHA: the
step's own, sbp-train no longer repeats them), and compares PEFT's float64 logits on gen_hf's
batch with onnxruntime's on MERGED.onnx: ||ort - peft|| / ||peft|| and max |ort - peft| /
max |peft| must both be <= 1e-5. So that the check cannot pass with the adapters left out, the
ORIGINAL model's logits must differ from PEFT's by more than 100 times that. Exit 77 (ctest's
SKIP_RETURN_CODE) when torch, transformers, peft or onnxruntime cannot be imported: CI has none.
"""
import os
import sys

try:
    import numpy as np
    import torch
    import transformers  # noqa: F401
    import peft
    import onnxruntime as ort
except Exception as e:  # any import failure: not this machine's check
    print("SKIPPED: torch / transformers / peft / onnxruntime not importable (%s); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "hf"))
import gen_hf  # noqa: E402

TOL = 1e-5


def ort_logits(path, ids):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: ids.numpy()})[0].astype(np.float64)


def errors(got, want):
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    mx = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    return rel, mx


def main():
    adir, merged, original, fam, r, alpha = sys.argv[1:7]
    pm = peft.PeftModel.from_pretrained(gen_hf.make_model(fam, "eager"), adir).double()
    pm.eval()
    cfg = pm.peft_config["default"]
    assert cfg.r == int(r) and float(cfg.lora_alpha) == float(alpha), cfg
    n_lora = sum(1 for n, _ in pm.named_parameters() if "lora_A" in n)
    ids, _ = gen_hf.batch()
    with torch.no_grad():
        want = pm(input_ids=ids, use_cache=False).logits.numpy()
    rel, mx = errors(ort_logits(merged, ids), want)
    base_rel, _ = errors(ort_logits(original, ids), want)
    print("merge_check %s: %d adapted modules (r %s, alpha %s); merged ONNX vs PEFT logits: "
          "relative %.3g, max %.3g (tolerance %g); the original model is %.3g away"
          % (fam, n_lora, r, alpha, rel, mx, TOL, base_rel))
    ok = True
    if not (rel <= TOL and mx <= TOL):
        print("merge_check: FAIL: the merged model's logits differ from PEFT's")
        ok = False
    if not base_rel > 100 * TOL:
        print("merge_check: FAIL: the adapters barely change the logits (%.3g): the check would "
              "not see a merge left out" % base_rel)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
