#!/usr/bin/env python3
"""Loads a file written by sbp-train --save-safetensors into the module that was exported, and
checks that it is that module trained.

    load_check.py EXPORT FILE.safetensors LR

EXPORT is a tests/fixtures/hf export (e.g. llama_ts_eager); the module is rebuilt from
tests/fixtures/hf/gen_hf.py (config, seed, random weights). FILE comes from one SGD step at
learning rate LR on the reference batch. Checks:
  - model.load_state_dict(load_file(FILE), strict=True) succeeds: every key of the module's
    state_dict, nothing else, each in PyTorch's shape;
  - two keys of one tied parameter (gpt2's transformer.wte.weight and lm_head.weight) hold the
    same values;
  - every parameter equals w0 - LR * g, g being the float64 PyTorch gradient of
    tests/fixtures/hf/ref/<family>.safetensors (1e-4 of LR * max|g|, as the step computes in
    float32), and the logits of the loaded module those of the module so updated by PyTorch
    (1e-4 relative).
Without torch, transformers or safetensors it prints SKIPPED and exits 77 (a ctest skip).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(HERE, "..", "fixtures", "hf")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    key, path, lr = sys.argv[1], sys.argv[2], float(sys.argv[3])
    try:
        import torch
        import transformers  # noqa: F401
        from safetensors.torch import load_file
    except ImportError as e:
        print("SKIPPED: %s (load_check needs torch, transformers and safetensors); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    sys.path.insert(0, HF)
    import gen_hf
    fam, _exporter, attn = key.rsplit("_", 2)
    attn = {"scoped": "eager"}.get(attn, attn)  # llama_dynamo_scoped: llama's eager model
    sd = load_file(path)
    model = gen_hf.make_model(fam, attn)
    ref = gen_hf.make_model(fam, attn)
    grads = load_file(os.path.join(HF, "ref", fam + ".safetensors"))
    problems = []
    # tied names: every state_dict key of one parameter must hold the same values
    by_param = {}
    for name, p in model.state_dict(keep_vars=True).items():
        by_param.setdefault(id(p), []).append(name)
    for names in by_param.values():
        for other in names[1:]:
            if names[0] in sd and other in sd and not torch.equal(sd[names[0]], sd[other]):
                problems.append("tied keys %s and %s differ" % (names[0], other))
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        print("FAILED: load_state_dict(strict=True): %s" % e)
        return 1
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name not in grads:
                problems.append("no reference gradient for %s" % name)
                continue
            g = grads[name].to(p.dtype)
            p.sub_(lr * g)
            got = dict(model.named_parameters())[name]
            tol = 1e-4 * lr * float(g.abs().max()) + 1e-7
            err = float((got - p).abs().max())
            if err > tol:
                problems.append("%s: max |saved - (w0 - lr g)| = %.3g > %.3g" % (name, err, tol))
        ids, _ = gen_hf.batch()
        want = ref(input_ids=ids, use_cache=False).logits
        have = model(input_ids=ids, use_cache=False).logits
        rel = float((have - want).abs().max() / want.abs().max())
        if rel > 1e-4:
            problems.append("logits differ from PyTorch's updated module by %.3g (relative)" % rel)
    for p in problems:
        print("FAILED: " + p)
    print("load_check %s: %d keys loaded strictly, %d parameters, logits rel. error %.3g: %s"
          % (key, len(sd), len(dict(model.named_parameters())), rel,
             "FAILED" if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
