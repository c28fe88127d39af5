#!/usr/bin/env python3
"""Checks a step's --dump-grads file against the float64 PyTorch reference, as
tests/train/train_fixture's check-ref does, with numpy only (tests/gpu/run.sh uses it on the GPU
machine, where the project may be built without its tests).

    check_ref.py [--grad-tol G] [--loss-tol L] [--decreasing] GRADS.safetensors REF.safetensors
                 [LOG ADAMW.json]

Passes (exit 0) when the loss in the metadata is within 1e-5 relative of the reference's, every
reference tensor has a float32 gradient of its shape with ||g - ref|| / ||ref|| <= 1e-4, the dump
has no other tensor, and, with LOG and ADAMW.json, every "step N loss X" line of sbp-train's
output is within 1e-4 relative of the reference AdamW loss before step N (at least 2 lines).
--grad-tol G sets the gradients' and the first loss's tolerance, --loss-tol L the AdamW losses'
(a --precision bf16 step: 2e-2 and 1e-2), --decreasing also requires each loss below the one
before. Prints one summary line per check; exit 1 with the failures listed otherwise.

    check_ref.py --lora [--grad-tol G] [--loss-tol L] GRADS.safetensors LORA_REF.safetensors [LOG]

A LoRA step (sbpc --lora) against tests/fixtures/lora/ref/<family>.safetensors
(gen_lora.py, float64 PEFT): the reference tensors are its `grad0/<adapter>` (lora_A's are zero
there: a zero reference is measured against 1e-4 of the largest reference norm), its loss
`loss0`, its AdamW losses the 10 of `adamw` in its metadata; any other tensor of the dump (a
frozen base weight) must be all zero.
"""
import json
import re
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        tensors[name] = (t["dtype"], np.frombuffer(data[b:e], dtype=DTYPES.get(t["dtype"], np.uint8))
                         .reshape(t["shape"]) if t["dtype"] in DTYPES else None)
    return tensors, meta


def main(argv):
    grad_tol, loss_tol, decreasing, lora = 1e-4, 1e-4, False, False
    argv = list(argv)
    while len(argv) > 1 and argv[1].startswith("--"):
        opt = argv.pop(1)
        if opt == "--decreasing":
            decreasing = True
        elif opt == "--lora":
            lora = True
        elif opt in ("--grad-tol", "--loss-tol") and len(argv) > 1:
            v = float(argv.pop(1))
            if opt == "--grad-tol":
                grad_tol = v
            else:
                loss_tol = v
        else:
            sys.stderr.write(__doc__)
            return 2
    if len(argv) not in ((3, 4) if lora else (3, 5)):
        sys.stderr.write(__doc__)
        return 2
    fails = []
    g, gmeta = read_safetensors(argv[1])
    r, rmeta = read_safetensors(argv[2])
    floor = 1e-30
    if lora:  # gen_lora.py's layout: grad0/<adapter>, loss0, adamw
        r = {k[len("grad0/"):]: v for k, v in r.items() if k.startswith("grad0/")}
        rmeta = dict(rmeta, loss=rmeta.get("loss0", "nan"))
        floor = 1e-4 * max(float(np.linalg.norm(v[1].astype(np.float64))) for v in r.values())
        for name in [n for n in g if n not in r]:
            if g[name][1] is None or np.any(g[name][1] != 0):
                fails.append(f"'{name}' is not an adapter but has a non-zero gradient")
            del g[name]
        if len(argv) == 4:
            argv.append(None)
    gl, rl = float(gmeta.get("loss", "nan")), float(rmeta.get("loss", "nan"))
    e = abs(gl - rl) / abs(rl)
    print(f"loss {gl!r}, reference {rl!r}: relative error {e:.3g}")
    first_tol = 1e-5 if grad_tol <= 1e-4 else grad_tol  # fp32: 1e-5; a looser --grad-tol
    if not e <= first_tol:
        fails.append("the loss is off")
    worst, worst_name = 0.0, ""
    for name, (rdt, rv) in r.items():
        if name not in g:
            fails.append(f"no gradient for '{name}'")
            continue
        gdt, gv = g[name]
        if gdt != "F32" or gv is None or gv.shape != rv.shape:
            fails.append(f"'{name}': not F32 of shape {list(rv.shape)}")
            continue
        a, b = gv.astype(np.float64), rv.astype(np.float64)
        err = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), floor))
        if err > worst or err != err:  # NaN sticks
            worst, worst_name = err, name
        if not err <= grad_tol:
            fails.append(f"gradient of '{name}': relative error {err:.3g}")
    for name in g:
        if name not in r:
            fails.append(f"'{name}' is not a float initializer of the reference")
    print(f"{len(r)} gradients against {argv[2]}: worst relative error {worst:.3g} ('{worst_name}')")
    if len(argv) == 5:
        log = open(argv[3]).read()
        ref = json.loads(rmeta["adamw"]) if lora else json.load(open(argv[4]))
        steps = [(int(s), float(x)) for s, x in re.findall(r"^step (\d+) loss ([-0-9.eE+naif]+)", log, re.M)]
        worst_l = 0.0
        for i, (s, x) in enumerate(steps):
            if s != i + 1 or s > len(ref):
                fails.append(f"unexpected line 'step {s}'")
                break
            el = abs(x - ref[s - 1]) / abs(ref[s - 1])
            worst_l = max(worst_l, el) if el == el else float("nan")
            if not el <= loss_tol:
                fails.append(f"step {s}: loss {x}, the reference says {ref[s - 1]!r}")
            if decreasing and i > 0 and not x < steps[i - 1][1]:
                fails.append(f"step {s}: loss {x} is not below step {s - 1}'s")
        print(f"{len(steps)} losses against {argv[4] or argv[2]}: worst relative error {worst_l:.3g}")
        if len(steps) < 2:
            fails.append("fewer than 2 'step N loss X' lines")
    for f in fails:
        print("FAIL: " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
