#!/usr/bin/env python3
"""sbp-train --dataset against the same rows as an llm.c token shard (--data), and the peak
memory of a large dataset.

    python3 bench/bench_dataset.py [--build build] [--model examples/tiny_llama.onnx]
                                   [--batch 4] [--seq-len 256] [--steps 40] [--threads 2]
                                   [--big-gb 1.0] [--repeats 3]

Step time. One step compiled by sbpc from the model; two inputs that give it the same tokens:
a shard of steps * B * T + 1 tokens (each row T tokens of the stream, labels the next ones), and
a dataset (docs/dataset-format.md) whose examples are those rows, each T tokens long with every
position scored, read in file order. sbp-train runs each --repeats times, alternating (the
machine is shared: compare the ratio); the table gives the median step time of steps 3..S of
every run (steps 1-2 warm up), as the differences of the --log's elapsed_s (the whole loop body,
the reading of the batch included), and the dataset's time over the shard's.

Memory. A dataset of about --big-gb GB (random examples of 1..T tokens) is opened and trained
for 5 steps; the table gives sbp-train's peak RSS against the shard run's and the file's size:
the dataset is validated in pieces and read an example at a time, so the peak must not grow
with the file (only its offsets, 16 bytes an example, stay in memory).

Needs numpy (Debian's python3-numpy) to write the large file quickly.
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def write_dataset(path, ids, labels, offsets, vocab, max_len):
    meta = {"format": "sbp-dataset", "version": "1", "task": "sft", "max_len": str(max_len),
            "eos_id": "0", "pad_id": "0", "vocab_size": str(vocab), "tokenizer": "bench",
            "truncate": "none", "mask": "none", "examples": str(len(offsets) - 1),
            "tokens": str(len(ids)), "scored_tokens": str(int((labels != -100).sum())),
            "truncated": "0", "dropped": "0", "sources": "bench", "producer": "bench_dataset"}
    parts = [("input_ids", "I32", ids.astype("<i4")), ("labels", "I32", labels.astype("<i4")),
             ("offsets", "I64", offsets.astype("<i8"))]
    header, at = {"__metadata__": meta}, 0
    for name, dt, a in parts:
        header[name] = {"dtype": dt, "shape": [int(a.size)],
                        "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, a in parts:
            a.tofile(f)


def write_shard(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        tokens.astype("<u2").tofile(f)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("bench_dataset: %s failed:\n%s" % (" ".join(cmd), p.stdout))
    return p.stdout


def step_times(log, first):
    """Seconds of each step from `first` on: the differences of the log's elapsed_s, which is
    wall time around the whole loop body (the batch's reading included, unlike tokens/s)."""
    el = {}
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            el[r["step"]] = r["elapsed_s"]
    return [el[s] - el[s - 1] for s in sorted(el) if s >= first and s - 1 in el]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "tiny_llama.onnx"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--big-gb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    sbpc = os.path.join(a.build, "tools", "sbpc")
    train = os.path.join(a.build, "tools", "sbp-train")
    B, T, V = a.batch, a.seq_len, 256
    work = tempfile.mkdtemp(prefix="bench_dataset.")
    step = os.path.join(work, "step.so")
    run([sbpc, a.model, "--batch", str(B), "--seq-len", str(T), "-o", step])
    rng = np.random.default_rng(7)
    n_rows = a.steps * B
    stream = rng.integers(0, V, n_rows * T + 1, dtype=np.int64)
    shard = os.path.join(work, "rows.bin")
    write_shard(shard, stream)
    ids = stream[:-1].copy()
    labels = stream[1:].copy()
    # an example's last position has no next token in the example: the dataset scores T - 1
    # tokens a row where the shard scores T (the step's time does not depend on it)
    labels[T - 1::T] = -100
    offsets = np.arange(0, n_rows * T + 1, T, dtype=np.int64)
    data = os.path.join(work, "rows.safetensors")
    write_dataset(data, ids, labels, offsets, V, T)
    common = ["--model", a.model, "--steps", str(a.steps), "--threads", str(a.threads),
              "--lr", "1e-4"]
    times = {"shard": [], "dataset": []}
    log = os.path.join(work, "log.jsonl")
    for _ in range(a.repeats):
        for k, src in (("shard", ["--data", shard]), ("dataset", ["--dataset", data])):
            if os.path.exists(log):
                os.remove(log)
            run([train, step] + src + common + ["--log", log])
            times[k] += step_times(log, 3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("| input | median step time (ms) | ratio |")
    print("|---|---:|---:|")
    print("| --data shard | %.2f | 1.000 |" % (1e3 * med["shard"]))
    print("| --dataset | %.2f | %.3f |" % (1e3 * med["dataset"], med["dataset"] / med["shard"]))
    print("(B=%d, T=%d, %d steps x %d runs each, alternating; %s)" % (B, T, a.steps, a.repeats,
                                                                     os.path.basename(a.model)))
    # memory: a large dataset of random-length examples
    n_tok = int(a.big_gb * 1e9 / 8)
    lens = rng.integers(1, T + 1, n_tok // ((T + 1) // 2) + 1)
    lens = lens[np.cumsum(lens) <= n_tok]
    lens = lens[lens >= 2]
    total = int(lens.sum())
    big_ids = rng.integers(0, V, total, dtype=np.int64)
    big_labels = np.empty(total, dtype=np.int64)
    big_labels[:-1] = big_ids[1:]
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    big_labels[offs[1:] - 1] = -100
    big = os.path.join(work, "big.safetensors")
    write_dataset(big, big_ids, big_labels, offs, V, T)
    del big_ids, big_labels
    size = os.path.getsize(big)
    # peak RSS through /usr/bin/time: sbp-train's own figure (getrusage) would include this
    # script's, as Linux keeps a process's maximum RSS across the exec that starts it
    t0 = time.time()
    out_big = run(["/usr/bin/time", "-f", "maxrss %M KB", train, step, "--dataset", big,
                   "--model", a.model, "--steps", "5", "--threads", str(a.threads)])
    dt = time.time() - t0
    out_small = run(["/usr/bin/time", "-f", "maxrss %M KB", train, step, "--data", shard,
                     "--model", a.model, "--steps", "5", "--threads", str(a.threads)])
    rss = lambda out: "%.1f MiB" % (int(re.search(r"^maxrss (\d+) KB", out, re.M).group(1))
                                    / 1024)
    print()
    print("| input | file size | examples | peak RSS |")
    print("|---|---:|---:|---:|")
    print("| --data shard (%d rows) | %.1f MB | - | %s |" % (n_rows, os.path.getsize(shard) / 1e6,
                                                          rss(out_small)))
    print("| --dataset | %.2f GB | %d | %s |" % (size / 1e9, len(lens), rss(out_big)))
    print("(the large run: 5 steps, %.1f s including the validation of the whole file)" % dt)
    for f in os.listdir(work):
        os.remove(os.path.join(work, f))
    os.rmdir(work)


if __name__ == "__main__":
    main()
