#!/usr/bin/env python3
"""plot_log_check.py — ctest's train.plot_log: scripts/plot_log.py on two generated --log files.

    plot_log_check.py PLOT_LOG.py WORKDIR

The logs are written here in train/train_log.h's format rather than by a training run, so the
test needs no build and can put in what a real run may leave: a null grad norm (a non-finite
value), a line cut off by a crash, and eval_loss on a few steps. The SVG must parse as XML and
hold exactly the polylines those imply: one per log and panel, a null splitting its line in
two, and a dashed eval_loss line on the loss panel. Also: the panels' axes are labelled and the
legend names both logs.
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def write_log(path, rows, tail=""):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write(tail)


def main():
    script, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    a = [{"step": s, "loss": 5.5 - 0.1 * s, "lr": 3e-3 * min(1, s / 5), "grad_norm": 2.0 / s,
          "tokens_per_s": 1e5, "elapsed_s": 0.01 * s} for s in range(1, 31)]
    b = [dict(r, loss=r["loss"] + 0.2) for r in a]
    b[9]["grad_norm"] = None  # step 10: a non-finite norm, logged as null
    for r in b[::10]:
        r["eval_loss"] = r["loss"] + 0.3  # steps 1, 11, 21
    la, lb = os.path.join(work, "a.jsonl"), os.path.join(work, "b.jsonl")
    write_log(la, a)
    write_log(lb, b, tail='{"step":31,"loss":')  # cut off mid-line
    out = os.path.join(work, "plot.svg")
    subprocess.run([sys.executable, script, la, lb, "-o", out, "--title", "test"], check=True)

    root = ET.parse(out).getroot()  # raises when the SVG is not well-formed XML
    assert root.tag == SVG + "svg", root.tag
    lines = root.iter(SVG + "polyline")
    by_class = {}
    for p in lines:
        by_class[p.get("class")] = by_class.get(p.get("class"), 0) + 1
        assert len(p.get("points").split()) >= 1
    # loss: a and b; eval_loss: b's one run (steps 1, 11, 21); lr: a and b; grad_norm: a, and
    # b split by its null into steps 1-9 and 11-30
    want = {"loss": 2, "eval_loss": 1, "lr": 2, "grad_norm": 3}
    assert by_class == want, f"polylines {by_class}, expected {want}"
    texts = [t.text for t in root.iter(SVG + "text")]
    for label in ("loss", "learning rate", "gradient norm", "step", "a.jsonl", "b.jsonl"):
        assert label in texts, f"no '{label}' text in the SVG"
    print(f"ok: {out}: {sum(want.values())} polylines as expected")


if __name__ == "__main__":
    main()
