#!/usr/bin/env python3
"""dataset_ref.py — an independent reference of sbp-train --dataset (train/train_dataset.h).

It writes dataset files in the format of docs/dataset-format.md by hand (standard library only:
the safetensors layout is an 8-byte header length, a JSON header and the data), computes the
rows sbp-train must give the step — each epoch's order (Fisher-Yates driven by splitmix64, as
the header documents), one example a row or next-fit packing, padding — and compares them with
what the fake step (tests/train/test_step.c) traced of every call.

  dataset_ref.py rows SBP_TRAIN PLAIN_STEP PACKED_STEP MODEL WORK
      plain and packed, in file order and shuffled, K = 1 and --grad-accum 2, several passes:
      the traced rows equal the reference's; --epochs E runs the steps the reference counts;
  dataset_ref.py resume SBP_TRAIN PLAIN_STEP PACKED_STEP MODEL WORK
      17 steps, then a resume to 30, against 30 straight (plain shuffled, and packed): the same
      losses and the same final checkpoint, byte for byte; a checkpoint of another dataset or
      order is refused;
  dataset_ref.py hostile SBP_TRAIN PLAIN_STEP PACKED_STEP MODEL WORK
      damaged or lying files and wrong options: exit status 1, one error line, no step run;
  dataset_ref.py eval SBP_TRAIN SBPC MODEL WORK
      --eval-dataset with real steps of MODEL: the held-out loss before any update is the
      training loss on the same rows.
The fake steps are B = 2 rows of T = 8 tokens over a vocabulary of 16.
"""
import json
import os
import re
import struct
import subprocess
import sys

IGNORE = -100
B, T, V = 2, 8, 16
PAD, EOS = 0, 1
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ---------------------------------------------------------------- the file format

def example(ids, scored_from):
    """An example's (ids, shifted labels): positions scored_from-1 .. predict tokens from
    scored_from on, as a prompt (not scored) followed by a completion (scored)."""
    labels = [IGNORE] * len(ids)
    for t in range(len(ids) - 1):
        if t + 1 >= scored_from:
            labels[t] = ids[t + 1]
    return ids, labels


def examples():
    """A fixed list of 11 examples of 2..8 tokens (ids 2..15), some packable together."""
    lens = [5, 3, 8, 2, 6, 4, 7, 3, 5, 2, 6]
    out = []
    for i, n in enumerate(lens):
        ids = [2 + (7 * i + 3 * t) % 14 for t in range(n)]
        out.append(example(ids, 1 + i % 2 if n > 2 else 1))
    return out


def write_dataset(path, exs, task="sft", meta=None, tensors=None, vocab=V, max_len=T):
    """A dataset file; meta / tensors override entries (for the hostile cases)."""
    ids = [t for e in exs for t in e[0]]
    labels = [t for e in exs for t in e[1]]
    offsets = [0]
    for e in exs:
        offsets.append(offsets[-1] + len(e[0]))
    md = {"format": "sbp-dataset", "version": "1", "task": task, "max_len": str(max_len),
          "eos_id": str(EOS), "pad_id": str(PAD), "vocab_size": str(vocab),
          "tokenizer": "dataset_ref", "truncate": "none", "mask": "none",
          "examples": str(len(exs)), "tokens": str(len(ids)),
          "scored_tokens": str(sum(1 for l in labels if l != IGNORE)),
          "truncated": "0", "dropped": "0", "sources": "dataset_ref.py",
          "producer": "dataset_ref.py"}
    md.update(meta or {})
    ts = {"input_ids": ("I32", [len(ids)], struct.pack("<%di" % len(ids), *ids)),
          "labels": ("I32", [len(labels)], struct.pack("<%di" % len(labels), *labels)),
          "offsets": ("I64", [len(offsets)], struct.pack("<%dq" % len(offsets), *offsets))}
    ts.update(tensors or {})
    header, data = {"__metadata__": {k: v for k, v in md.items() if v is not None}}, b""
    for name, (dt, shape, raw) in ts.items():
        header[name] = {"dtype": dt, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


# ---------------------------------------------------------------- the reference rows

def splitmix64(state):
    state = (state + GOLDEN) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def order(n, seed, epoch):
    o = list(range(n))
    if seed is None:
        return o
    x = (seed + (epoch + 1) * GOLDEN) & M64
    for i in range(n - 1, 0, -1):
        x, r = splitmix64(x)
        j = r % (i + 1)
        o[i], o[j] = o[j], o[i]
    return o


def stream(exs, seed):
    """Endless examples in visiting order."""
    epoch = 0
    while True:
        for i in order(len(exs), seed, epoch):
            yield exs[i]
        epoch += 1


def rows(exs, seed, packed, n_rows, T=T):
    """The first n_rows rows (ids, labels, docs) of T tokens: docs -1 for an unpacked step."""
    it = stream(exs, seed)
    nxt = next(it)
    out = []
    for _ in range(n_rows):
        ids, labels, docs, doc = [], [], [], 0
        while True:
            e = nxt
            if ids and (not packed or len(ids) + len(e[0]) > T):
                break
            ids += e[0]
            labels += e[1]
            docs += [doc] * len(e[0])
            doc += 1
            nxt = next(it)
            if len(ids) == T:
                break
        pad = T - len(ids)
        ids += [PAD] * pad
        labels += [IGNORE] * pad
        docs += [doc] * pad
        out.append((ids, labels, docs if packed else [-1] * T))
    return out


def steps_for(exs, seed, packed, epochs, per_step):
    """Optimizer steps until `epochs` passes are done (the examples taken reach epochs * n)."""
    it_rows, taken, steps, n = 0, 0, 0, len(exs)
    # count examples per row along the same stream
    st = stream(exs, seed)
    nxt = next(st)
    while taken < epochs * n:
        for _ in range(per_step):
            used = 0
            while True:
                if used and (not packed or used + len(nxt[0]) > T):
                    break
                used += len(nxt[0])
                taken += 1
                nxt = next(st)
                if used == T:
                    break
        steps += 1
    return steps


# ---------------------------------------------------------------- running sbp-train

def run(cmd, env=None, expect=0):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=120)
    if p.returncode != expect:
        sys.stdout.write(p.stdout + p.stderr)
        sys.exit("FAIL: exit status %d (expected %d): %s" % (p.returncode, expect, " ".join(cmd)))
    return p.stdout, p.stderr


def read_trace(path):
    with open(path) as f:
        lines = [list(map(int, l.split()[1:])) for l in f if l.strip()]
    out = []
    for i in range(0, len(lines), 3):
        ids, labels, docs = lines[i:i + 3]
        for b in range(B):
            out.append((ids[b * T:(b + 1) * T], labels[b * T:(b + 1) * T],
                        docs[b * T:(b + 1) * T]))
    return out


def train(sbp_train, step, model, data, args, trace=None):
    env = dict(os.environ)
    if trace:
        if os.path.exists(trace):
            os.remove(trace)
        env["SBP_TEST_PACK_TRACE"] = trace
    return run([sbp_train, step, "--model", model, "--dataset", data, "--lr", "0.05",
                "--threads", "1"] + args, env)


def rows_mode(sbp_train, plain, packed_step, model, work):
    exs = examples()
    data = os.path.join(work, "data.safetensors")
    write_dataset(data, exs)
    n = 0
    for packed in (False, True):
        step = packed_step if packed else plain
        extra = ["--pack"] if packed else []
        for seed in (None, 7):
            for k in (1, 2):
                steps = 9
                trace = os.path.join(work, "trace.txt")
                sargs = ["--shuffle-seed", str(seed)] if seed is not None else []
                out, _ = train(sbp_train, step, model, data,
                               ["--steps", str(steps), "--grad-accum", str(k)] + sargs + extra,
                               trace)
                if "step %d loss" % steps not in out:
                    sys.exit("FAIL: no 'step %d loss' line:\n%s" % (steps, out))
                got = read_trace(trace)
                want = rows(exs, seed, packed, steps * k * B)
                if got != want:
                    for i, (g, w) in enumerate(zip(got, want)):
                        if g != w:
                            sys.exit("FAIL: packed=%s seed=%s K=%d: row %d differs:\n  got  %s\n"
                                     "  want %s" % (packed, seed, k, i, g, w))
                    sys.exit("FAIL: %d rows traced, %d expected" % (len(got), len(want)))
                n += len(got)
        # --epochs: the steps the reference counts
        for epochs in (1, 3):
            out, _ = train(sbp_train, step, model, data,
                           ["--epochs", str(epochs), "--shuffle-seed", "5"] + extra)
            want = steps_for(exs, 5, packed, epochs, B)
            got = len(re.findall(r"^step \d+ loss", out, re.M))
            if got != want:
                sys.exit("FAIL: packed=%s --epochs %d ran %d steps, the reference %d"
                         % (packed, epochs, got, want))
    print("PASS: %d rows as the reference (plain and packed, file order and shuffled, K 1 and 2); "
          "--epochs counts" % n)


def whole_batches(exs, packed):
    """Batches of B rows that one pass over exs (file order) fills before it ends: a batch that
    ends exactly with the last example counts, one that takes any example of the next pass
    does not."""
    lens = [len(e[0]) for e in exs]
    n, taken, batches = len(lens), 0, 0
    while True:
        for _ in range(B):
            used = 0
            while True:
                ln = lens[taken % n]
                if used and (not packed or used + ln > T):
                    break
                used += ln
                taken += 1
                if used == T:
                    break
        if taken <= n:
            batches += 1
        if taken >= n:
            return batches


def eval_mode(sbp_train, sbpc, model, work):
    """--eval-dataset with steps sbpc compiles (B = 2, T = 8; the fake steps have no
    sbp_step_eval): before any update (--lr 0) the held-out loss of the file's first batch is
    step 1's training loss on the same rows, over the scored tokens the reference counts."""
    exs = examples()
    data = os.path.join(work, "data.safetensors")
    write_dataset(data, exs)
    for packed in (False, True):
        step = os.path.join(work, "packed.so" if packed else "plain.so")
        run([sbpc, model, "--batch", str(B), "--seq-len", str(T), "-o", step]
            + (["--packed"] if packed else []))
        extra = ["--pack"] if packed else []
        out, _ = train(sbp_train, step, model, data, ["--steps", "1", "--lr", "0",
                                                      "--eval-dataset", data, "--eval-batches",
                                                      "1"] + extra)
        tr = re.search(r"^step 1 loss ([0-9.]+)", out, re.M)
        ev = re.search(r"^eval step 1 loss ([0-9.]+) .*\(1 batches, (\d+) scored tokens", out,
                       re.M)
        want = sum(1 for r in rows(exs, None, packed, B) for l in r[1] if l != IGNORE)
        if not tr or not ev or tr.group(1) != ev.group(1) or int(ev.group(2)) != want:
            sys.exit("FAIL: packed=%s: --eval-dataset's loss is not step 1's on the same rows "
                     "(%d scored tokens):\n%s" % (packed, want, out))
        # by default every whole batch before the file's end
        out, _ = train(sbp_train, step, model, data, ["--steps", "1", "--eval-dataset", data]
                       + extra)
        m = re.search(r"^eval step 1 loss [0-9.]+ .*\((\d+) batches", out, re.M)
        if not m or int(m.group(1)) != whole_batches(exs, packed):
            sys.exit("FAIL: packed=%s: expected %d batches per evaluation:\n%s"
                     % (packed, whole_batches(exs, packed), out))
    refused([sbp_train, os.path.join(work, "plain.so"), "--model", model, "--dataset", data,
             "--eval-dataset", data, "--eval-batches", "6"],
            r"--eval-batches 6: --eval-dataset .* holds 5 whole batches of 2 rows")
    refused([sbp_train, os.path.join(work, "plain.so"), "--model", model, "--dataset", data,
             "--eval-dataset", data, "--eval-data", data], r"give --eval-data or --eval-dataset")
    print("PASS: --eval-dataset's loss is the training loss on the same rows (plain, packed)")


def losses(out, first):
    return [l.split()[:4] for l in out.splitlines()
            if l.startswith("step ") and int(l.split()[1]) >= first and " loss " in l]


def resume_mode(sbp_train, plain, packed_step, model, work):
    exs = examples()
    data = os.path.join(work, "data.safetensors")
    write_dataset(data, exs)
    for packed, step in ((False, plain), (True, packed_step)):
        extra = (["--pack"] if packed else []) + ["--shuffle-seed", "11"]
        full, part = os.path.join(work, "full_%d" % packed), os.path.join(work, "part_%d" % packed)
        for d in (full, part):
            subprocess.run(["rm", "-rf", d])
        out_full, _ = train(sbp_train, step, model, data,
                            ["--steps", "30", "--checkpoint-dir", full] + extra)
        train(sbp_train, step, model, data, ["--steps", "17", "--checkpoint-dir", part] + extra)
        out_res, _ = train(sbp_train, step, model, data,
                           ["--steps", "30", "--resume", part] + extra)
        a, b = losses(out_full, 18), losses(out_res, 1)
        if a != b or not b or b[0][1] != "18":
            sys.exit("FAIL: packed=%s: the resumed losses differ:\n%s\n%s" % (packed, a, b))
        f = "step-%08d.safetensors" % 30
        if open(os.path.join(full, f), "rb").read() != open(os.path.join(part, f), "rb").read():
            sys.exit("FAIL: packed=%s: the final checkpoints differ" % packed)
        # another order, or another dataset, is another run
        _, err = run([sbp_train, step, "--model", model, "--dataset", data, "--lr", "0.05",
                      "--threads", "1", "--steps", "31", "--resume", part]
                     + (["--pack"] if packed else []) + ["--shuffle-seed", "12"], expect=1)
        if not re.search(r"error: --resume: .* was written for other training data", err):
            sys.exit("FAIL: another --shuffle-seed was not refused as other data:\n" + err)
    print("PASS: resumed runs equal the uninterrupted ones (losses, checkpoint bytes); another "
          "order is refused")


def refused(cmd, regex):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    errs = [l for l in p.stderr.splitlines() if "error:" in l]
    if p.returncode != 1 or len(errs) != 1 or not re.search(regex, errs[0]):
        sys.exit("FAIL: expected exit 1 and one error line matching %r from %s\n"
                 "got %d:\n%s" % (regex, " ".join(cmd), p.returncode, p.stderr))
    if re.search(r"^step \d+ loss", p.stdout, re.M):
        sys.exit("FAIL: a step ran before the refusal: " + " ".join(cmd))


def hostile_mode(sbp_train, plain, packed_step, model, work):
    exs = examples()
    good = os.path.join(work, "good.safetensors")
    write_dataset(good, exs)
    ids = [t for e in exs for t in e[0]]
    labels = [t for e in exs for t in e[1]]
    n_tok = len(ids)

    def case(name, regex, step=plain, extra=(), **kw):
        path = os.path.join(work, name + ".safetensors")
        write_dataset(path, kw.pop("exs", exs), **kw)
        refused([sbp_train, step, "--model", model, "--dataset", path, "--steps", "2"]
                + list(extra), regex)

    bad_off = list(range(0, 2 * len(exs), 2)) + [n_tok]
    case("lying_offsets", r"example \d+ spans tokens .* the offsets must increase",
         tensors={"offsets": ("I64", [len(exs) + 1],
                              struct.pack("<%dq" % (len(exs) + 1), *([0] + [5, 3] + bad_off[3:])))})
    case("offsets_short", r"the offsets end at token",
         tensors={"offsets": ("I64", [3], struct.pack("<3q", 0, 5, 8))}, meta={"examples": "2"})
    case("id_past_vocab", r"example 0, token 2: id 16 is outside the vocabulary of 16",
         exs=[([2, 3, 16, 4], [3, 16, 4, IGNORE])] + exs[1:])
    case("negative_id", r"id -5 is outside the vocabulary",
         exs=[([2, -5, 4], [-5, 4, IGNORE])] + exs[1:])
    case("unshifted_labels", r"label 2 is neither -100 nor the next token",
         exs=[([2, 3, 4], [2, 3, 4])] + exs[1:])
    case("last_label_scored", r"label 9 is neither -100 nor the next token \(it is the example's last",
         exs=[([2, 3, 4], [3, 4, 9])] + exs[1:])
    case("vocab_too_big", r"tokenised for a vocabulary of 32 ids, the step's holds 16",
         meta={"vocab_size": "32"})
    case("scored_lie", r"the metadata says 99 scored tokens", meta={"scored_tokens": "99"})
    case("junk_count", r"metadata 'examples' is '11junk', not an integer",
         meta={"examples": "11junk"})
    case("no_format", r"not a dataset file of sbp-prepare", meta={"format": "something"})
    case("version_2", r"dataset format version '2'", meta={"version": "2"})
    case("dpo_task", r"is a dpo dataset, and the step.s objective is sft: sbp-train trains sft, dpo "
         r"and grpo "
         r"steps on datasets of their own task", task="dpo",
         exs=exs[:10])
    case("dpo_odd", r"a dpo dataset holds pairs, but it has 11 examples", task="dpo")
    case("ids_f32", r"tensor 'input_ids' is F32 \[%d\], the format has I32" % n_tok,
         tensors={"input_ids": ("F32", [n_tok], struct.pack("<%df" % n_tok, *ids))})
    case("nothing_scored", r"example 0 scores no token",
         exs=[(e[0], [IGNORE] * len(e[0])) for e in exs], meta={"scored_tokens": "0"})
    case("one_unscored", r"example 3 scores no token",
         exs=exs[:3] + [(exs[3][0], [IGNORE] * len(exs[3][0]))] + exs[4:],
         meta={"scored_tokens": str(sum(1 for e in exs for l in e[1] if l != IGNORE)
                                    - sum(1 for l in exs[3][1] if l != IGNORE))})
    case("longer_than_t", r"example 0 has 9 tokens, but the step's rows hold 8: prepare the data "
         r"with sbp-prepare --max-len 8", exs=[example(list(range(2, 11)), 1)] + exs[1:],
         meta={"max_len": "16"})
    case("longer_than_max_len", r"example 0 has 9 tokens, more than the file's max_len 8",
         exs=[example(list(range(2, 11)), 1)] + exs[1:])
    # truncated file: the header's offsets reach past its end
    trunc = os.path.join(work, "truncated.safetensors")
    raw = open(good, "rb").read()
    open(trunc, "wb").write(raw[:len(raw) - 9])
    refused([sbp_train, plain, "--model", model, "--dataset", trunc, "--steps", "2"],
            r"truncated\.safetensors")
    # options
    refused([sbp_train, plain, "--model", model, "--dataset", good, "--steps", "2",
             "--epochs", "2"], r"give --epochs or --steps, not both")
    refused([sbp_train, plain, "--model", model, "--dataset", good, "--input-ids", good],
            r"give one source of training data")
    refused([sbp_train, plain, "--model", model, "--dataset", good, "--pack", "--eos", "1"],
            r"--eos is read with --data or --input-ids")
    refused([sbp_train, plain, "--model", model, "--dataset", good, "--pack"],
            r"--pack: .* is not a packed step")
    refused([sbp_train, packed_step, "--model", model, "--dataset", good],
            r"compiled with sbpc --packed and needs each token's document id")
    print("PASS: hostile datasets and options refused with one line")


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "eval":
        os.makedirs(sys.argv[5], exist_ok=True)
        eval_mode(*sys.argv[2:])
        return
    if len(sys.argv) != 7 or sys.argv[1] not in ("rows", "resume", "hostile"):
        sys.exit(__doc__)
    mode, sbp_train, plain, packed, model, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    {"rows": rows_mode, "resume": resume_mode, "hostile": hostile_mode}[mode](
        sbp_train, plain, packed, model, work)


if __name__ == "__main__":
    main()
