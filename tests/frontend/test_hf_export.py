#!/usr/bin/env python3
"""The tests/hf harness on sbp-export's own exports of the 12 families of tests/fixtures/hf.

    test_hf_export.py dynamo|torchscript OUTDIR SBPC SBP_TRAIN HF_CHECK CMAKE
                      [--attn eager sdpa] [--only FAMILY ...]

For every family of gen_hf.py and every attention implementation asked for that transformers
has for it (Gemma-2 has no sdpa; the cases must be exactly the committed fixtures of this
exporter, so the two test sets cannot drift apart):
  - gen_hf.make_model's model (the tiny config, the seeded weights) is saved with
    save_pretrained, and the folder is shown to be the model the committed float64 references
    were computed from: from_pretrained gives a state dict bit for bit equal to that of
    make_model(family, "eager") (the model gen_hf.reference differentiates), the committed
    batch is gen_hf.batch(), and the folder's float64 loss on it is the reference's `loss`;
  - sbp-export exports the folder (its main(), in this process: a fresh interpreter per
    export would pay torch's import each time, a minute and a half per exporter here);
  - gen_hf.write_param_map writes the initializer -> torch name map; no entry may be a stored
    1 + w (sbp-export keeps Gemma's norm scale a computation), so the harness trains with
    weight decay 0.01 and holds the run to the reference's decay-0.01 AdamW losses (the check
    file must say so);
  - tests/hf/run_hf.cmake runs sbpc (store, and stream with chunk 7, logits chunk 13),
    sbp-train's 10 AdamW steps with --dump-grads and hf_check against tests/fixtures/hf/ref, as
    the hf.* tests do for the committed exports; each step must exit 0.
Prints one row per case and exits 1 if any check of any case failed; 77 (skip) without torch,
transformers, onnx, onnxruntime or onnxscript.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, Checks, need  # noqa: E402

need("numpy", "torch", "transformers", "onnx", "onnxruntime", "onnxscript", "safetensors")
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HF = os.path.join(ROOT, "tests", "fixtures", "hf")
REF = os.path.join(HF, "ref")
RUN_HF = os.path.join(ROOT, "tests", "hf", "run_hf.cmake")
sys.path.insert(0, HF)
sys.path.insert(0, os.path.join(ROOT, "python"))  # this checkout's sbp_tools, not an installed one
import gen_hf  # noqa: E402
from sbp_tools import export as sbp_export  # noqa: E402

STRATEGIES = (("store", ["--strategy", "store"]),
              ("stream", ["--strategy", "stream", "--chunk", "7", "--logits-chunk", "13"]))
FIXTURE_EXPORTER = {"dynamo": "dynamo", "torchscript": "ts"}  # gen_hf.py's file names


def ref_meta(fam):
    """The __metadata__ of the committed ref/<fam>.safetensors."""
    with open(os.path.join(REF, fam + ".safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]


def same_model(C, fam, folder):
    """The saved folder against the model the committed reference was computed from."""
    from transformers import AutoModelForCausalLM
    loaded = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                  dtype=torch.float32,
                                                  attn_implementation="eager")
    want = gen_hf.make_model(fam, "eager").state_dict()
    got = loaded.state_dict()
    diff = sorted(k for k in set(want) | set(got)
                  if k not in want or k not in got or want[k].dtype != got[k].dtype
                  or not torch.equal(want[k], got[k]))
    ok = C.ok(not diff, "%s: the saved folder's state dict is make_model's: %s differ"
              % (fam, diff[:5]))
    ids, labels = gen_hf.batch()
    ok &= C.ok(np.array_equal(np.load(os.path.join(REF, fam + "_input_ids.npy")), ids.numpy())
               and np.array_equal(np.load(os.path.join(REF, fam + "_labels.npy")),
                                  labels.numpy()),
               "%s: the committed batch is gen_hf.batch()" % fam)
    m64 = loaded.double()
    with torch.no_grad():
        loss = float(gen_hf.sft_loss(m64(input_ids=ids, use_cache=False).logits, labels))
    want_loss = float(ref_meta(fam)["loss"])
    # the same float64 computation on the same weights: equal but for summation order
    ok &= C.ok(abs(loss - want_loss) <= 1e-12 * abs(want_loss),
               "%s: the folder's float64 loss %r is the reference's %r" % (fam, loss, want_loss))
    return ok


def export(folder, path, exporter, attn):
    """sbp-export's command line, run by its entry point; its exit status."""
    try:
        return sbp_export.main([folder, "-o", path, "--exporter", exporter, "--attn", attn]) or 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


def harness(a, fam, key, path, params, strategy, opts):
    """tests/hf/run_hf.cmake on one export; (exit status, the hf_check lines)."""
    out = os.path.join(a.out, "%s_%s" % (key, strategy))
    cmd = [a.cmake, "-DSBPC=" + a.sbpc, "-DTRAIN=" + a.train, "-DCHECK=" + a.check,
           "-DMODEL=" + path, "-DREF=" + REF, "-DKEY=" + key, "-DFAM=" + fam, "-DOUT=" + out,
           "-DOPTS=" + ";".join(opts), "-DPARAMS=" + params, "-P", RUN_HF]
    p = subprocess.run(cmd, capture_output=True, text=True)
    check = open(out + ".check").read() if os.path.exists(out + ".check") else ""
    if p.returncode != 0:  # run_hf.cmake prints each command's output (hf_check's failures)
        print(p.stdout[-3000:] + p.stderr[-3000:], flush=True)
    return p.returncode, check


def figures(check):
    """hf_check's worst figures, as tests/fixtures/hf/table.py shows them."""
    g = re.search(r"gradients, worst (\S+)", check)
    l = re.search(r"^hf_check: loss .*\(relative (\S+)\)", check, re.M)
    w = re.search(r"AdamW losses .*worst relative error (\S+)", check)
    return "grad %s, loss %s, adamw %s" % tuple(m.group(1) if m else "?" for m in (g, l, w))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exporter", choices=["dynamo", "torchscript"])
    ap.add_argument("out")
    ap.add_argument("sbpc")
    ap.add_argument("train")
    ap.add_argument("check")
    ap.add_argument("cmake")
    ap.add_argument("--attn", nargs="*", default=["eager", "sdpa"], choices=["eager", "sdpa"])
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    a.out = os.path.join(a.out, a.exporter)
    os.makedirs(a.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    import transformers
    transformers.utils.logging.disable_progress_bar()  # from_pretrained's and save's bars
    C = Checks()
    fams = gen_hf.families()
    cases = [(fam, attn) for fam in (a.only or list(fams)) for attn in a.attn
             if attn == "eager" or getattr(fams[fam][1], "_supports_sdpa", False)]
    fixtures = [(fam, attn) for fam in (a.only or list(fams)) for attn in a.attn
                if os.path.exists(os.path.join(HF, "%s_%s_%s.onnx"
                                               % (fam, FIXTURE_EXPORTER[a.exporter], attn)))]
    C.ok(cases == fixtures, "the cases are the committed fixtures: %s vs %s" % (cases, fixtures))
    rows = []
    t_all = time.time()
    for fam, attn in cases:
        t0 = time.time()
        key = "%s_%s_%s" % (fam, a.exporter, attn)
        folder = os.path.join(a.out, "%s_%s" % (fam, attn))
        model = gen_hf.make_model(fam, attn)
        model.save_pretrained(folder)
        row = [fam, a.exporter, attn]
        if not same_model(C, fam, folder):
            rows.append(row + ["not the reference's model"])
            continue
        path = os.path.join(a.out, key + ".onnx")
        if os.path.exists(path):
            os.remove(path)
        rc = export(folder, path, a.exporter, attn)
        if not C.ok(rc == 0 and os.path.exists(path), "%s: sbp-export exit 0, got %s"
                    % (key, rc)):
            rows.append(row + ["sbp-export failed"])
            continue
        params = os.path.join(a.out, key + ".params.txt")
        pmap = gen_hf.write_param_map(model, path, params)
        C.ok(pmap and not [k for k, (_, kind) in pmap.items() if kind == 2],
             "%s: a map, and no initializer holds 1 + w: %s" % (key, sorted(pmap.items())[:4]))
        for strategy, opts in STRATEGIES:
            rc, check = harness(a, fam, key, path, params, strategy, opts)
            ok = C.ok(rc == 0 and "hf_check: passed" in check,
                      "%s %s: sbpc -> sbp-train -> hf_check exit 0, got %d (output above)"
                      % (key, strategy, rc))
            # the run must have been the decayed one, held to the decay-0.01 losses
            ok &= C.ok("AdamW losses (weight decay 0.01)" in check,
                       "%s %s: trained and checked with weight decay 0.01: %s"
                       % (key, strategy, check.strip()[-400:]))
            row.append(("ok: " if ok else "FAIL: ") + figures(check))
        rows.append(row)
        print("%s: %.1f s" % (key, time.time() - t0), flush=True)
    print("\n| family | exporter | attention | store | stream (chunk 7, logits chunk 13) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("%d cases in %.0f s" % (len(rows), time.time() - t_all))
    C.done()


if __name__ == "__main__":
    main()
