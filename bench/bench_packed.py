#!/usr/bin/env python3
"""Packed documents: the training step on rows of 1, 4 and 16 equal documents.

    python3 bench/bench_packed.py [--build build] [--model bench/models/llama_bench.onnx]
                                  [--seq-len 16384] [--docs 1,4,16] [--steps 3] [--threads 2]

The bench model (bench/gen_bench_model.py: Llama-style, d=256, 4 layers, V=32000) compiled by
sbpc --packed at B=1, T=seq-len, stream, and trained by sbp-train with --doc-ids: a row of n
equal documents (labels: the next token within the document; a document's last token is not
scored). The same step on the same tokens each time; only the document ids change. Prints one
table row per n: the median step time of steps 2..S (step 1 warms up), its ratio to one
document, and the ideal ratio of the attention work alone (causal pairs within documents over
the row's: about 1/n). The attention kernels' own times are bench/bench_attention -d N; this
is the whole step, so the ratio is bounded below by the work that does not depend on the
documents (the projections, the MLP and the LM head).

Standard library only (the .npy inputs are written by hand).
"""
import argparse
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def write_npy(path, rows, cols, values):
    """int32 [rows, cols], C order."""
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, cols)
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%di" % len(values), *values))


def pairs(T, n):
    """Causal (query, key) pairs of a row of n equal documents (the last one takes the rest)."""
    L = T // n
    lens = [L] * (n - 1) + [T - L * (n - 1)]
    return sum(l * (l + 1) // 2 for l in lens), lens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(HERE, "models", "llama_bench.onnx"))
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--docs", default="1,4,16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        sys.exit("bench_packed.py: %s is missing: run .venv-hf/bin/python bench/gen_bench_model.py"
                 % a.model)
    sbpc = os.path.join(a.build, "tools", "sbpc")
    train = os.path.join(a.build, "tools", "sbp-train")
    T = a.seq_len
    work = tempfile.mkdtemp(prefix="bench_packed_")
    step = os.path.join(work, "packed.so")
    subprocess.run([sbpc, a.model, "--batch", "1", "--seq-len", str(T), "--packed", "-o", step],
                   check=True, stdout=subprocess.DEVNULL)
    rng = random.Random(1234)
    ids = [rng.randrange(32000) for _ in range(T)]
    write_npy(os.path.join(work, "ids.npy"), 1, T, ids)
    print("packed documents: the bench model, B = 1, T = %d, stream, %d threads, median of steps "
          "2..%d" % (T, a.threads, a.steps))
    print("%6s %10s %12s %14s %18s" % ("docs", "step s", "vs 1 doc", "ideal (attn)", "tokens/s"))
    base = None
    full = T * (T + 1) // 2
    for n in [int(x) for x in a.docs.split(",")]:
        p, lens = pairs(T, n)
        docs, labels, pos = [], [], 0
        for d, l in enumerate(lens):
            docs += [d] * l
            labels += ids[pos + 1:pos + l] + [-100]
            pos += l
        write_npy(os.path.join(work, "labels.npy"), 1, T, labels)
        write_npy(os.path.join(work, "docs.npy"), 1, T, docs)
        out = subprocess.run([train, step, "--model", a.model,
                              "--input-ids", os.path.join(work, "ids.npy"),
                              "--labels", os.path.join(work, "labels.npy"),
                              "--doc-ids", os.path.join(work, "docs.npy"),
                              "--steps", str(a.steps), "--lr", "0", "--threads", str(a.threads)],
                             check=True, capture_output=True, text=True).stdout
        tps = [float(m) for m in re.findall(r"^step \d+ loss \S+ tokens/s (\S+)", out, re.M)]
        times = [T / x for x in tps[1:] or tps]
        t = statistics.median(times)
        base = base or t
        print("%6d %10.2f %12.3f %14.3f %18.1f" % (n, t, t / base, p / full, T / t))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
