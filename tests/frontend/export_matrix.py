#!/usr/bin/env python3
"""sbp-export over the 12 families of tests/fixtures/hf/gen_hf.py, then sbpc on each export.

    .venv-hf/bin/python tests/frontend/export_matrix.py SBPC OUTDIR [--only FAMILY...]

Each family's tiny config and seeded random weights (gen_hf.make_model) are saved with
save_pretrained into OUTDIR/<family>_<attn>, exported by sbp-export with both exporters, and
compiled by `sbpc --batch 2 --seq-len 16` (stream, the default; when that fails, checkpoint
too). Prints one markdown row per case and writes OUTDIR/matrix.json. Slow (minutes), so not a
ctest test; nothing it writes is committed.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "hf"))
sys.path.insert(0, HERE)
from common import tool  # noqa: E402


def last_error(text):
    lines = [l for l in text.splitlines() if "error" in l]
    return (lines[0] if lines else text.strip()[-200:])[:220]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sbpc")
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    import warnings
    warnings.filterwarnings("ignore")
    import gen_hf
    os.makedirs(a.out, exist_ok=True)
    results = {}
    print("| family | exporter | attention | sbp-export | sbpc stream | sbpc checkpoint |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    for fam in a.only or list(gen_hf.families()):
        for attn in ("eager", "sdpa"):
            folder = os.path.join(a.out, "%s_%s" % (fam, attn))
            try:
                gen_hf.make_model(fam, attn).save_pretrained(folder)
            except Exception as e:
                results["%s_%s" % (fam, attn)] = "save failed: %s" % e
                continue
            for exporter in ("dynamo", "torchscript"):
                key = "%s_%s_%s" % (fam, exporter, attn)
                path = os.path.join(a.out, key + ".onnx")
                rc, so, se = tool("sbp-export", folder, "-o", path, "--exporter", exporter,
                                  "--attn", attn)
                row = {"export": "ok" if rc == 0 else last_error(se)}
                if rc == 0:
                    row["export"] = "ok (%s)" % so.split("max abs difference ")[1].split(" ")[0]
                    for strategy in ("stream", "checkpoint"):
                        p = subprocess.run([a.sbpc, path, "--batch", "2", "--seq-len", "16",
                                            "--strategy", strategy, "-o",
                                            os.path.join(a.out, key + ".c")],
                                           capture_output=True, text=True)
                        row[strategy] = "ok" if p.returncode == 0 else last_error(p.stderr)
                        if p.returncode == 0:
                            break
                results[key] = row
                print("| %s | %s | %s | %s | %s | %s |" % (
                    fam, exporter, attn, row["export"], row.get("stream", ""),
                    row.get("checkpoint", "")), flush=True)
    with open(os.path.join(a.out, "matrix.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
