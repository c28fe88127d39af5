#!/usr/bin/env python3
"""A seeded fuzzer over sbp-prepare: random JSONL rows, option combinations and output paths,
each run checked against the rules every run must keep, whatever it was given.

    fuzz_frontend.py [--seconds S] [--seed N] OUTDIR

Bounded by time, not by count (the ctest runs --seconds 30 --seed 1): a case is drawn from the
seed and its number, so a failure printed as `case K` is reproduced by the same seed. Each case
makes one to three JSONL files of rows of every kind (valid sft / dpo / grpo rows, malformed
JSON, rows that are not objects, wrong types, huge and non-finite numbers, unicode of every
plane, lone surrogates, bytes that are not UTF-8, now and then a long text), picks --task,
--max-len (including 0, negatives and values beyond what sbp-train reads), --truncate, --mask
and the tokenizer (one of two copies of the fixture tokenizers, a missing folder, a file), and
an output: a new file, an earlier output, an input, a symbolic or hard link to an input or to a
tokenizer file, a file in the tokenizer folder, a missing or read-only folder, a folder, a
foreign file, a dangling link. sbp-prepare runs in this process (its main with argv; the
transformers import is paid once). Every run must:
  - exit 0 or 1; on 1, print exactly one line, `sbp-prepare: error: ...`;
  - leave every input and every file of the tokenizer folders byte-identical;
  - leave no temporary file behind, and on 1 the output as it was (or absent);
  - on 0, have written a file that passes the checks of sbp-train's reader
    (sbpio_dataset_open in io/dataset.c), mirrored here.
"""
import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FIX, ROOT, SKIP  # noqa: E402

try:
    import numpy as np
    import transformers  # noqa: F401  (imported once here, not per run)
    from safetensors import safe_open
except ImportError as e:
    print("SKIP: %s (scripts/install-venv.sh makes .venv-hf with it)" % e)
    sys.exit(SKIP)
sys.path.insert(0, os.path.join(ROOT, "python"))
from sbp_tools import prepare  # noqa: E402

INT32_MAX = 2**31 - 1
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("outdir")
ap.add_argument("--seconds", type=float, default=30)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--case", type=int, default=None, help="run only this case (a reproduction)")
A = ap.parse_args()
OUT = os.path.join(A.outdir, "seed%d" % A.seed)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
TOKS = []
for name in ("tok_chatml", "tok_llama3"):
    d = os.path.join(OUT, name)
    shutil.copytree(os.path.join(FIX, name), d)
    TOKS.append(d)
RO = os.path.join(OUT, "readonly")
os.makedirs(RO)
os.chmod(RO, 0o555)
RO_DIR = "/sys" if os.geteuid() == 0 else RO  # root writes into a 0555 folder; /sys refuses it

# ------------------------------------------------------------------ rows
WORDS = ["hello", "the sea", "Paris", "4", "é", "日本語", "🙂", "\u200f", "a\u0301", "\t", "\n",
         "<|im_end|>", "<|im_start|>", "<|eot_id|>", "<|begin_of_text|>", "\\", "\"", "{%", "}}",
         "\U0010FFFF", "\x00", "  "]


def text(r, long_ok=True):
    if long_ok and r.random() < 0.03:
        return r.choice(WORDS) * r.randint(2000, 60000)
    return "".join(r.choice(WORDS) + r.choice(["", " "]) for _ in range(r.randint(0, 12)))


def number(r):
    return r.choice([0, 1, -1, 0.5, 1e-300, 1.7e308, -1.7e308, 1e39, -1e39, 3.4e38, 3.5e38,
                     10**400, -(10**30), True, None, "1", [1], float("nan"), float("inf"),
                     r.uniform(-10, 10), r.randint(-5, 5)])


def messages(r):
    msgs = []
    for _ in range(r.randint(0, 4)):
        m = {"role": r.choice(["user", "assistant", "system", "tool", 3, ""]),
             "content": r.choice([text(r), text(r), "", None, 7, ["x"]])}
        if r.random() < 0.1:
            del m[r.choice(["role", "content"])]
        msgs.append(m)
    if r.random() < 0.6:
        msgs += [{"role": "user", "content": text(r)}, {"role": "assistant",
                                                         "content": text(r) or "ok"}]
    return msgs


def side(r):
    return r.choice([text(r), text(r), messages(r), None, 5, {}])


def valid(r, task):
    """A row the task takes (texts still random, long ones now and then)."""
    def ans():
        return text(r) or "ok"
    if task == "sft":
        return r.choice([
            {"messages": [{"role": "user", "content": text(r)},
                          {"role": "assistant", "content": ans()}]},
            {"messages": [{"role": "system", "content": text(r)},
                          {"role": "user", "content": text(r)},
                          {"role": "assistant", "content": ans()},
                          {"role": "user", "content": text(r)},
                          {"role": "assistant", "content": ans()}]},
            {"prompt": text(r), "completion": ans()},
            {"prompt": [{"role": "user", "content": text(r)}], "completion": ans()},
            {"text": ans()}])
    if task == "dpo":
        return {"prompt": r.choice([text(r), [{"role": "user", "content": text(r)}]]),
                "chosen": ans(), "rejected": ans()}
    d = {"prompt": r.choice(["Say hi.", "Count."]), "completion": ans(),
         "reward": r.choice([r.uniform(-10, 10), r.randint(-3, 3), 0, 3e38, -3e38, 1e-40] * 4 +
                            [3.5e38, 1e39, -1.7e308, 1.7e308])}  # the last: beyond float32
    if r.random() < 0.3:
        d["group"] = r.choice([1, 2, "g"])
    return d


def row(r):
    kind = r.choice(["messages", "pc", "text", "dpo", "grpo", "grpo", "bad"])
    if kind == "messages":
        return {"messages": r.choice([messages(r), messages(r), [], "x", None])}
    if kind == "pc":
        return {"prompt": side(r), "completion": side(r)}
    if kind == "text":
        return {"text": r.choice([text(r), text(r), "", 1, None])}
    if kind == "dpo":
        d = {"prompt": side(r), "chosen": side(r), "rejected": side(r)}
        if r.random() < 0.1:
            del d[r.choice(list(d))]
        return d
    if kind == "grpo":
        d = {"prompt": r.choice(["Say hi.", "Count.", text(r)]), "completion": side(r),
             "reward": number(r)}
        if r.random() < 0.3:
            d["group"] = r.choice([1, "g", 2.5, None, True, [1]])
        if r.random() < 0.1:
            del d["reward"]
        return d
    return r.choice([[1, 2], "string", 3, None, {}, {"other": 1}])


def line(r, task):
    """One JSONL line: mostly a row the task takes, else anything."""
    if r.random() < 0.85:
        return json.dumps(valid(r, task), ensure_ascii=r.random() < 0.5)
    x = r.random()
    if x < 0.05:
        return r.choice(["{", "{\"text\": ", "nul", "[" * r.randint(1, 5000), "{\"a\":1}}",
                         "\"\\ud800\"", "{\"text\": \"\\udfff\"}", "1e99999", "-"])
    if x < 0.08:
        return ""
    s = json.dumps(row(r), ensure_ascii=r.random() < 0.5, allow_nan=True)
    return s


def write_jsonl(r, path, task):
    with open(path, "wb") as f:
        for _ in range(r.randint(0, 6)):
            b = line(r, task).encode("utf-8", "surrogatepass")
            if r.random() < 0.01:
                b = b[:len(b) // 2] + b"\xff\xfe" + b[len(b) // 2:]  # not UTF-8
            f.write(b + (b"\r\n" if r.random() < 0.1 else b"\n"))


# ------------------------------------------------------------------ the run and its checks
def read(p):
    with open(p, "rb") as f:
        return f.read()


def files_of(paths):
    out = {}
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            for n in os.listdir(p):
                q = os.path.join(p, n)
                if os.path.isfile(q):
                    out[q] = read(q)
        elif os.path.isfile(p):
            out[p] = read(p)
    return out


def temps(dirs):
    found = []
    for d in dirs:
        if os.path.isdir(d):
            found += [os.path.join(d, n) for n in os.listdir(d) if n.endswith(".tmp")]
    return found


def run(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = prepare.main([str(a) for a in argv]) or 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else repr(e.code)
    return rc, err.getvalue()


def meta_int(meta, key, lo, hi):
    v = meta.get(key)
    assert v is not None and v.lstrip("-").isdigit() and lo <= int(v) <= hi, \
        "metadata %s = %r, not an integer from %d to %d" % (key, v, lo, hi)
    return int(v)


def reader_checks(path):
    """sbpio_dataset_open's checks (io/dataset.c), in the same order; raises
    AssertionError naming the first that fails."""
    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
        t = {k: f.get_tensor(k) for k in f.keys()}
    assert meta.get("format") == "sbp-dataset" and meta.get("version") == "1", "format/version"
    task = meta.get("task")
    assert task in ("sft", "dpo", "grpo"), "task %r" % task
    vocab = meta_int(meta, "vocab_size", 1, INT32_MAX)
    max_len = meta_int(meta, "max_len", 1, INT32_MAX)
    meta_int(meta, "eos_id", 0, vocab - 1)
    meta_int(meta, "pad_id", 0, vocab - 1)
    n_ex = meta_int(meta, "examples", 1, 2**63 - 2)
    n_tok = meta_int(meta, "tokens", 1, 2**63 - 1)
    scored = meta_int(meta, "scored_tokens", 0, 2**63 - 1)
    for k, dt, n in (("input_ids", np.int32, n_tok), ("labels", np.int32, n_tok),
                     ("offsets", np.int64, n_ex + 1)):
        assert k in t and t[k].dtype == dt and t[k].shape == (n,), "tensor %s" % k
    assert task != "dpo" or n_ex % 2 == 0, "dpo: odd count"
    if task == "grpo":
        a = t.get("advantages")
        assert a is not None and a.dtype == np.float32 and a.shape == (n_ex,), "advantages"
        assert np.all(np.isfinite(a)), "non-finite advantage"
        # not read by sbp-train, but written as given: a reward beyond float32 would be inf
        assert np.all(np.isfinite(t["reward"])), "non-finite reward"
    o = t["offsets"]
    assert o[0] == 0 and np.all(np.diff(o) >= 1) and o[-1] == n_tok, "offsets"
    assert np.all(np.diff(o) <= max_len), "an example longer than max_len"
    ids, lab = t["input_ids"], t["labels"]
    assert np.all((ids >= 0) & (ids < vocab)), "an id outside the vocabulary"
    for i in range(n_ex):
        x, y = ids[o[i]:o[i + 1]], lab[o[i]:o[i + 1]]
        assert y[-1] == -100, "example %d: the last label is not -100" % i
        assert np.all((y[:-1] == -100) | (y[:-1] == x[1:])), "example %d: label rule" % i
        assert np.any(y != -100), "example %d scores nothing" % i
    assert int((lab != -100).sum()) == scored, "scored_tokens"


def case(k):
    """Case k of the seed: makes its files, runs it, returns a list of broken rules."""
    r = random.Random("%d:%d" % (A.seed, k))
    d = os.path.join(OUT, "case")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    task = r.choice(["sft", "sft", "dpo", "grpo"])
    ins = []
    for i in range(r.choice([1, 1, 2, 3])):
        p = os.path.join(d, "in%d.jsonl" % i)
        write_jsonl(r, p, task if r.random() < 0.9 else r.choice(["sft", "dpo", "grpo"]))
        ins.append(p)
    tok = r.choice(TOKS * 8 + [os.path.join(d, "no_tokenizer"), ins[0]])
    tokfiles = [os.path.join(tok, n) for n in sorted(os.listdir(tok))] if os.path.isdir(tok) else []
    earlier = os.path.join(OUT, "earlier.safetensors")
    kind = r.choice(["new"] * 12 + ["earlier"] * 3 + ["input", "input-symlink", "input-hardlink",
                     "tokfile", "tokfile-symlink", "tokfile-hardlink", "in-tokdir", "missing",
                     "readonly", "folder", "foreign", "dangling"])
    out = os.path.join(d, "out.safetensors")
    if kind == "earlier" and os.path.exists(earlier):
        shutil.copy(earlier, out)
    elif kind == "input":
        out = r.choice(ins)
    elif kind in ("input-symlink", "input-hardlink", "tokfile-symlink", "tokfile-hardlink"):
        src = r.choice(ins if kind.startswith("input") or not tokfiles else tokfiles)
        (os.symlink if kind.endswith("symlink") else os.link)(src, out)
    elif kind == "tokfile" and tokfiles:
        out = r.choice(tokfiles)
    elif kind == "in-tokdir" and os.path.isdir(tok):
        out = os.path.join(tok, "data.safetensors")
    elif kind == "missing":
        out = os.path.join(d, "nowhere", "out.safetensors")
    elif kind == "readonly":
        out = os.path.join(RO_DIR, "out.safetensors")
    elif kind == "folder":
        out = d
    elif kind == "foreign":
        with open(out, "wb") as f:
            f.write(b"someone else's file")
    elif kind == "dangling":
        os.symlink(os.path.join(d, "gone"), out)
    argv = ["--tokenizer", tok, "--task", task,
            "--max-len", r.choice([r.randint(2, 64)] * 8 + [r.randint(2, 400)] * 8 +
                                  [0, 1, -3, 2**31 - 1, 2**31, 99999999999999])]
    t = r.choice([None, "keep-start", "keep-end", "keep-end", "keep-start", "drop"])
    if t:
        argv += ["--truncate", t]
    m = r.choice([None, None, "auto", "assistant-tokens", "prefix"])
    if m:
        argv += ["--mask", m]
    argv += ins + ["-o", out]
    watched = ins + ([tok] if os.path.isdir(tok) else [])
    before = files_of(watched)
    out_before = read(out) if os.path.isfile(out) and not os.path.islink(out) \
        else None
    out_existed = os.path.lexists(out)
    rc, se = run(argv)
    broken = []
    lines = se.splitlines()
    if rc not in (0, 1):
        broken.append("exit status %r" % rc)
    if rc == 1 and (len(lines) != 1 or not lines[0].startswith("sbp-prepare: error: ")):
        broken.append("exit 1 with stderr %r, not one error line" % se[:600])
    if rc == 0 and se:
        broken.append("exit 0 with stderr %r" % se[:600])
    after = files_of(watched)
    changed = [p for p in before if after.get(p) != before[p]]
    if changed:
        broken.append("inputs changed: %s" % changed)
    added = sorted(set(after) - set(before))
    if added:
        broken.append("files added to the tokenizer folder: %s" % added)
    left = temps(sorted({d, os.path.dirname(os.path.abspath(out)), RO} | set(TOKS)))
    if left:
        broken.append("temporaries left: %s" % left)
    if rc == 1:
        if out_before is not None and (not os.path.isfile(out) or
                                       read(out) != out_before):
            broken.append("a refused run changed the existing output")
        if not out_existed and os.path.lexists(out):
            broken.append("a refused run left an output")
    if rc == 0:
        try:
            reader_checks(out)
            shutil.copy(out, earlier)
        except Exception as e:  # the reader's refusal or safetensors' own
            broken.append("the output fails sbp-train's checks: %s" % e)
    return argv, kind, rc, lines, broken, before, [w for w in watched if os.path.isdir(w)]


def restore(before, folders):
    """After a broken case: the watched files as they were, so that the next cases stand
    alone (and the tokenizer folders hold nothing a failure added)."""
    for t in folders:
        for n in os.listdir(t):
            if os.path.join(t, n) not in before:
                os.remove(os.path.join(t, n))
    for p, b in before.items():
        if not os.path.isfile(p) or read(p) != b:
            if os.path.lexists(p) and not os.path.isfile(p):
                shutil.rmtree(p, ignore_errors=True)
            with open(p, "wb") as f:
                f.write(b)


warnings.simplefilter("always")  # a warning printed once per place would hide repeats
t0 = time.time()
n = failed = 0
status = {0: 0, 1: 0}
causes = {}
k = A.case if A.case is not None else 0
while True:
    argv, kind, rc, lines, broken, before, folders = case(k)
    n += 1
    status[rc] = status.get(rc, 0) + 1
    if rc == 1 and lines:
        c = re.sub(r"^\S+?:\d+: ", "", lines[0].split(": error: ", 1)[-1])
        c = re.sub(r"/\S*", "PATH", c)[:60]
        causes[c] = causes.get(c, 0) + 1
    if broken:
        failed += 1
        print("FAIL: seed %d case %d (output: %s): %s\n  argv: %s" % (
            A.seed, k, kind, "; ".join(broken), " ".join(str(a)[:80] for a in argv)), flush=True)
        restore(before, folders)
    k += 1
    if A.case is not None or time.time() - t0 > A.seconds:
        break
os.chmod(RO, 0o755)
print("fuzz_frontend: seed %d, %d cases in %.1f s: %d exit 0, %d exit 1, %d broke a rule"
      % (A.seed, n, time.time() - t0, status.get(0, 0), status.get(1, 0), failed))
for c, m in sorted(causes.items(), key=lambda x: -x[1])[:40]:
    print("  %4d  %s" % (m, c))
sys.exit(1 if failed else 0)
