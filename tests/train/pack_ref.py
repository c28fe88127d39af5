#!/usr/bin/env python3
"""pack_ref.py — an independent reference of sbp-train's document packing.

It implements the rule that train/train_pack.h documents, written the other way round from the C
code: the whole stream is first split into documents at EOS, each document into pieces of at
most T tokens with their labels, and the pieces are then laid into rows greedily. Standard
library only (CI has no numpy).

  pack_ref.py cases OUT.txt
      writes the cases that tests/train/test_pack.c (cmocka) packs with train_pack_rows and
      compares row by row, with the cursor after them;
  pack_ref.py e2e SBP_TRAIN STEP MODEL WORK
      trains the packed fake step (tests/train/test_step.c, TEST_STEP_PACKED) on a shard with
      sbp-train --data --pack --eos, the step tracing every micro-batch it is given, and compares
      the trace with this packing of the same shard (K = 1 and --grad-accum 2);
  pack_ref.py resume SBP_TRAIN STEP MODEL WORK
      a packed run of 30 steps against 17 steps + a resume to 30: the same losses printed and the
      same final checkpoint, byte for byte; then the packing as part of the run's identity:
      another --eos is refused, and a version-1 checkpoint (rewritten from a packed one) is
      refused by a packed run and resumed by an unpacked one.
"""
import json
import os
import random
import re
import struct
import subprocess
import sys

IGNORE = -100


def documents(stream, eos):
    """The stream's documents as (start position, tokens): split after each EOS; the stream's
    end ends the last one."""
    docs, start = [], 0
    for i, tok in enumerate(stream):
        if tok == eos:
            docs.append((start, stream[start:i + 1]))
            start = i + 1
    if start < len(stream):
        docs.append((start, stream[start:]))
    return docs


def pieces(stream, eos, T):
    """Endless (tokens, labels, start, epoch): every document cut into pieces of T tokens (the
    last one shorter), pass after pass over the stream."""
    docs = documents(stream, eos)
    epoch = 0
    while True:
        for start, toks in docs:
            labels = toks[1:] + [IGNORE]  # the next token of the same document
            for s in range(0, len(toks), T):
                yield toks[s:s + T], labels[s:s + T], start + s, epoch
        epoch += 1


def pack(stream, eos, T, rows):
    """rows lists of (ids, labels, doc_ids), and the cursor (position, epoch) after them."""
    it = pieces(stream, eos, T)
    pending = next(it)
    out = []
    for _ in range(rows):
        ids, labels, docs = [], [], []
        d = 0
        while len(ids) < T:
            toks, labs, _, _ = pending
            if len(ids) + len(toks) > T:
                break  # it starts the next row; the rest of this one is padding
            ids += toks
            labels += labs
            docs += [d] * len(toks)
            d += 1
            pending = next(it)
        pad = T - len(ids)
        ids += [eos] * pad
        labels += [IGNORE] * pad
        docs += [d] * pad
        out.append((ids, labels, docs))
    return out, (pending[2], pending[3])


# ------------------------------------------------------------------ the unit test's cases

def cases():
    """(name, T, eos, rows, chunk, stream): chunk = rows per train_pack_rows call, so that the
    cursor is carried between calls too."""
    c = []
    # documents of one token (consecutive EOS), EOS at the stream's end
    c.append(("one_token_docs", 4, 3, 5, 1, [3, 3, 1, 3, 3, 2, 2, 3, 3]))
    # a document longer than T (10 tokens, T = 4): pieces 4, 4, 2; EOS at the end
    c.append(("long_doc", 4, 0, 6, 2, [5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 7, 0]))
    # a document of exactly T after a partly filled row, and one exactly T at a row start
    c.append(("exactly_T", 4, 0, 5, 5, [1, 0, 2, 3, 4, 0, 5, 6, 7, 0, 8, 0]))
    # no EOS at the end of the stream: its last document ends there; wraps mid-row
    c.append(("no_final_eos", 5, 9, 6, 1, [1, 2, 9, 3, 4, 5]))
    # no EOS anywhere: rows of T with next-token labels, but the stream's last token
    c.append(("no_eos", 3, 15, 5, 2, [1, 2, 3, 4, 5, 6, 7]))
    # T = 1: every row one token; a single-token document is never scored
    c.append(("t1", 1, 0, 6, 4, [1, 2, 0, 0, 3]))
    # a stream of one token (EOS or not)
    c.append(("single_eos", 3, 0, 2, 1, [0]))
    c.append(("single_tok", 3, 0, 2, 2, [4]))
    rng = random.Random(13)
    for k in range(12):
        T = rng.choice([1, 2, 3, 5, 8, 16])
        eos = 0
        n = rng.randint(1, 60)
        p_eos = rng.choice([0.05, 0.2, 0.5])
        stream = [0 if rng.random() < p_eos else rng.randint(1, 30) for _ in range(n)]
        rows = rng.randint(1, 25)
        chunk = rng.randint(1, rows)
        c.append(("random%d" % k, T, eos, rows, chunk, stream))
    return c


def write_cases(path):
    with open(path, "w") as f:
        for name, T, eos, rows, chunk, stream in cases():
            out, (pos, epoch) = pack(stream, eos, T, rows)
            f.write("case %s %d %d %d %d\n" % (name, T, eos, rows, chunk))
            f.write("stream %d %s\n" % (len(stream), " ".join(map(str, stream))))
            for ids, labels, docs in out:
                f.write("ids %s\n" % " ".join(map(str, ids)))
                f.write("labels %s\n" % " ".join(map(str, labels)))
                f.write("docs %s\n" % " ".join(map(str, docs)))
            f.write("cursor %d %d\n" % (pos, epoch))
    print("wrote %d cases to %s" % (len(cases()), path))


# ------------------------------------------------------------------ end to end through sbp-train

V = 16  # the fake step's vocabulary
EOS = 3


def shard_stream():
    """A stream with documents of 1 token, of exactly T (8), longer than T, and no final EOS."""
    rng = random.Random(7)
    s = []
    for _ in range(60):
        n = rng.choice([1, 2, 5, 7, 8, 8, 9, 13, 20])
        s += [rng.choice([t for t in range(V) if t != EOS]) for _ in range(n - 1)] + [EOS]
    return s + [1, 2, 4]


def write_shard(path, stream):
    header = [20240520, 1, len(stream)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(stream), *stream))


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=120)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        sys.exit("FAIL: exit status %d: %s" % (p.returncode, " ".join(cmd)))
    return p.stdout


def read_trace(path, B, T):
    """The fake step's trace: per call, B rows of ids, labels, doc ids (one line each)."""
    rows = []
    with open(path) as f:
        lines = [list(map(int, l.split()[1:])) for l in f if l.strip()]
    for i in range(0, len(lines), 3):
        ids, labels, docs = lines[i:i + 3]
        for b in range(B):
            rows.append((ids[b * T:(b + 1) * T], labels[b * T:(b + 1) * T],
                         docs[b * T:(b + 1) * T]))
    return rows


def e2e(sbp_train, step, model, work):
    os.makedirs(work, exist_ok=True)
    stream = shard_stream()
    shard = os.path.join(work, "docs.bin")
    write_shard(shard, stream)
    B, T = 2, 8
    for k, steps in ((1, 40), (2, 25)):  # 40 x 2 rows and 25 x 4: past the end of the stream
        trace = os.path.join(work, "trace_k%d.txt" % k)
        if os.path.exists(trace):
            os.remove(trace)
        env = dict(os.environ, SBP_TEST_PACK_TRACE=trace)
        out = run([sbp_train, step, "--model", model, "--data", shard, "--pack", "--eos",
                   str(EOS), "--steps", str(steps), "--grad-accum", str(k), "--lr", "0.05",
                   "--threads", "1"], env)
        if "step %d loss" % steps not in out:
            sys.exit("FAIL: no 'step %d loss' line:\n%s" % (steps, out))
        got = read_trace(trace, B, T)
        want, _ = pack(stream, EOS, T, steps * k * B)
        if len(got) != len(want):
            sys.exit("FAIL: K=%d: the step saw %d rows, expected %d" % (k, len(got), len(want)))
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                sys.exit("FAIL: K=%d: row %d differs:\n  got  %s\n  want %s" % (k, i, g, w))
        print("K=%d: %d packed rows as the reference" % (k, len(got)))


def losses(out, first):
    return [l for l in out.splitlines()
            if l.startswith("step ") and int(l.split()[1]) >= first and " loss " in l]


def resume(sbp_train, step, model, work):
    os.makedirs(work, exist_ok=True)
    stream = shard_stream()
    shard = os.path.join(work, "docs.bin")
    write_shard(shard, stream)
    common = [sbp_train, step, "--model", model, "--data", shard, "--pack", "--eos", str(EOS),
              "--lr", "0.05", "--threads", "1", "--grad-accum", "2"]
    full_dir, part_dir = os.path.join(work, "full"), os.path.join(work, "part")
    for d in (full_dir, part_dir):
        if os.path.isdir(d):
            for f in os.listdir(d):
                os.remove(os.path.join(d, f))
    # 30 steps x 4 rows pass the end of the stream (epoch 1), so the cursor's pass is resumed too
    full = run(common + ["--steps", "30", "--checkpoint-dir", full_dir])
    run(common + ["--steps", "17", "--checkpoint-dir", part_dir])
    part = run(common + ["--steps", "30", "--resume", part_dir])
    a, b = [l.split(" tokens/s")[0] for l in losses(full, 18)], \
        [l.split(" tokens/s")[0] for l in losses(part, 1)]
    if not b or a != b:
        sys.exit("FAIL: the resumed losses differ:\n%s\n--\n%s" % ("\n".join(a), "\n".join(b)))
    f = "step-00000030.safetensors"
    with open(os.path.join(full_dir, f), "rb") as x, open(os.path.join(part_dir, f), "rb") as y:
        if x.read() != y.read():
            sys.exit("FAIL: the final checkpoints differ")
    print("resumed packed run = uninterrupted run (steps 18..30, checkpoint bytes)")

    # the packing is part of the run's identity: another --eos, or no packing, is refused
    ck = os.path.join(part_dir, "step-00000017.safetensors")
    if not os.path.exists(ck):
        os.rename(os.path.join(part_dir, f), ck)  # keep one checkpoint before step 30
    other = common[:]
    other[other.index("--eos") + 1] = "5"
    refused(other + ["--steps", "30", "--resume", part_dir],
            r"packing is eos 3 there but eos 5 here")

    # a version-1 checkpoint (before packing) loads as an unpacked run's, and a packed run
    # refuses it: rewrite a packed checkpoint's metadata as version 1 wrote it
    v1_dir = os.path.join(work, "v1")
    os.makedirs(v1_dir, exist_ok=True)
    for g in os.listdir(v1_dir):
        os.remove(os.path.join(v1_dir, g))
    with open(os.path.join(full_dir, f), "rb") as x:
        data = x.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header["__metadata__"]["version"] = "1"
    del header["__metadata__"]["packing"]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(v1_dir, f), "wb") as y:
        y.write(struct.pack("<Q", len(text)) + text + data[8 + n:])
    refused(common + ["--steps", "31", "--resume", v1_dir],
            r"packing is none there but eos 3 here")
    unpacked = [a for a in common if a not in ("--pack",)]
    unpacked[unpacked.index("--eos"):unpacked.index("--eos") + 2] = []
    unpacked[1] = os.path.join(os.path.dirname(step), "step_bigram.so")
    out = run(unpacked + ["--steps", "31", "--resume", v1_dir])
    if "resuming from" not in out or "step 31 loss" not in out:
        sys.exit("FAIL: an unpacked run did not resume from a version-1 checkpoint:\n" + out)
    print("packing in the identity: refusals, and a version-1 checkpoint resumes unpacked")


def refused(cmd, regex):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    if p.returncode != 1 or not re.search(regex, p.stderr) or p.stderr.count("error:") != 1:
        sys.exit("FAIL: expected exit 1 and one error matching %r, got %d:\n%s" %
                 (regex, p.returncode, p.stderr))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "cases":
        write_cases(sys.argv[2])
    elif len(sys.argv) == 6 and sys.argv[1] in ("e2e", "resume"):
        (e2e if sys.argv[1] == "e2e" else resume)(*sys.argv[2:])
    else:
        sys.exit(__doc__)
