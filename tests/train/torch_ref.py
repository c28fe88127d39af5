"""torch_ref.py — what the float64 PyTorch cross-checks of tests/train share: running a tool,
the Llama fixture as transformers' own model with the weights a step started from, and the
comparisons of losses and final weights (the tolerances are the project's: a loss within 1e-5
relative, a weight tensor within 1e-4 as |delta| / |ref|).

The scripts import torch and transformers themselves and report SKIPPED (exit 77) without
them; this module imports them only inside its functions.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "tests", "fixtures", "hf")
LLAMA = os.path.join(FIX, "llama_dynamo_scoped.onnx")


def run(cmd, expect=0):
    """The tool's stdout and stderr; the exit status must be `expect`."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if p.returncode != expect:
        sys.stdout.write(p.stdout)
        sys.exit("FAIL: exit status %d (expected %d): %s" % (p.returncode, expect, " ".join(cmd)))
    return p.stdout


def step_losses(out):
    return [float(m) for m in re.findall(r"^step \d+ loss ([0-9.eE+-]+)", out, re.M)]


def llama_float64(init):
    """transformers' LlamaForCausalLM of gen_hf.py's config in float64 with the weights of
    `init` (sbp-train --save-safetensors after a --lr 0 step: the ONNX file's own), loaded
    strictly."""
    from safetensors.torch import load_file
    sys.path.insert(0, FIX)
    import gen_hf
    cfg_cls, model_cls, kw = gen_hf.families()["llama"]
    model = model_cls(cfg_cls(**kw, attn_implementation="eager")).double().eval()
    model.load_state_dict({k: v.double() for k, v in load_file(init).items()}, strict=True)
    return model


def check_losses(tag, got, want, tol=1e-5):
    """Every step's loss within tol relative of the reference's; the worst, printed on failure."""
    if len(got) != len(want):
        sys.exit("FAIL: %s: %d step lines, the reference has %d" % (tag, len(got), len(want)))
    worst = max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want))
    if worst > tol:
        for i, (g, w) in enumerate(zip(got, want)):
            print("step %d: sbp-train %.9g reference %.9g" % (i + 1, g, w))
        sys.exit("FAIL: %s: a loss is %.3g relative off the float64 reference" % (tag, worst))
    return worst


def check_weights(tag, trained_path, model, tol=1e-4):
    """Each tensor of trained_path (transformers' names) within tol of the model's."""
    from safetensors.torch import load_file
    sd, worst = model.state_dict(), 0.0
    for k, v in load_file(trained_path).items():
        d = float((v.double() - sd[k]).norm() / sd[k].norm().clamp_min(1e-30))
        worst = max(worst, d)
        if d > tol:
            sys.exit("FAIL: %s: weight %s is %.3g relative off the reference" % (tag, k, d))
    return worst
