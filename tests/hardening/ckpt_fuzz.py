#!/usr/bin/env python3
"""ckpt_fuzz.py — what damaged checkpoints and odd command lines do to sbp-train.

    ckpt_fuzz.py checkpoints [--count N] [--seed S]   mutated checkpoints, each resumed
    ckpt_fuzz.py options [--count N] [--seed S]       random option combinations
    ckpt_fuzz.py edit SRC DST EDIT...                 key=value | -key | @tensor=index:float
    ckpt_fuzz.py check FILE...                        every tensor finite, adamw.v >= 0
(environment for the sweeps: SBP_TRAIN, STEP (step_bigram), FIXTURE (train_fixture), WORK)

The checkpoints sweep trains the bigram step on the fixture's token shard (AdamW, 3 steps) and
on its --input-ids (SGD), then writes N mutated copies of those checkpoints, seeded, so a failure
is reproduced by its number: bit flips in the header and in the data, truncations, trailing
bytes, header lengths, JSON edits (dtypes, shapes, offsets, missing and renamed tensors, missing
keys, metadata values replaced by junk / huge / negative / non-numeric ones, values that are
numbers rather than strings, duplicated keys), and NaN / Inf / negative-v values. Each copy is
resumed (--resume DIR --steps 5) alone in its folder. The options sweep picks N random
combinations of sbp-train's options, valid and invalid values, paths that are missing, folders
or unwritable. For every run it asserts:
  - exit status 0 or 1: never a signal, never a hang (a timeout per run), no sanitizer report;
  - exit 1: exactly one "error:" line on stderr, "sbp-train: error: ...";
  - the checkpoint it resumed from is unchanged, and no temporary is left;
  - every file it wrote (checkpoints, --save, --save-safetensors, --dump-grads) is all finite
    and adamw.v >= 0; on exit 1 nothing was added to the resumed folder.
It reports each failure with the command that reproduces it, a summary per mutation kind, and
exits 1 when any run failed. Standard library only: no numpy, no onnx (the saved model's floats
are read with a few lines of protobuf decoding).
"""
import hashlib
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time

TIMEOUT = 60  # seconds per run: far above a resume's (milliseconds) even under ASan

# ---------------------------------------------------------------- safetensors


def read_st(path):
    """(header dict, header bytes, data bytes) of a well-formed safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hb = raw[8:8 + n]
    return json.loads(hb), hb, raw[8 + n:]


def pack_st(header_bytes, data):
    pad = (-len(header_bytes)) % 8
    hb = header_bytes + b" " * pad
    return struct.pack("<Q", len(hb)) + hb + data


def dump_header(h):
    return json.dumps(h, separators=(",", ":")).encode()


def floats_of(dtype, b):
    """The values of a float tensor's bytes (None: not a float dtype)."""
    if dtype == "F32":
        return struct.unpack("<%df" % (len(b) // 4), b[: len(b) // 4 * 4])
    if dtype == "F64":
        return struct.unpack("<%dd" % (len(b) // 8), b[: len(b) // 8 * 8])
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + b[i:i + 2])[0] for i in range(0, len(b) - 1, 2)]
    if dtype == "F16":
        return struct.unpack("<%de" % (len(b) // 2), b[: len(b) // 2 * 2])
    return None


def st_problem(path):
    """None when every float tensor of the file is finite (and adamw.v >= 0), else why."""
    try:
        h, _, data = read_st(path)
    except Exception as e:  # noqa: BLE001 - any damage is the answer
        return "%s: not a readable safetensors file (%s)" % (path, e)
    for name, t in h.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        vals = floats_of(t["dtype"], data[a:b])
        if vals is None:
            continue
        for i, x in enumerate(vals):
            if not math.isfinite(x) or (name == "adamw.v" and x < 0):
                return "%s: tensor %s holds %r at element %d" % (path, name, x, i)
    return None


# ---------------------------------------------------------------- ONNX (protobuf, by hand)


def _varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def _fields(b):
    """(field number, wire type, value) of one protobuf message's fields."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = _varint(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % w)
        yield f, w, v


def onnx_problem(path):
    """None when every FLOAT initializer of the model is finite, else why (external data, not
    used by these tests' small model, is not read)."""
    try:
        with open(path, "rb") as f:
            model = f.read()
        for f, _, graph in (x for x in _fields(model) if x[0] == 7):
            for g, _, tensor in _fields(graph):
                if g != 5:
                    continue
                name, dtype, vals = "?", 1, []
                for k, w, v in _fields(tensor):
                    if k == 8:
                        name = v.decode("utf-8", "replace")
                    elif k == 2:
                        dtype = v
                    elif k == 9:
                        vals = floats_of("F32", v)
                    elif k == 4 and w == 2:
                        vals = floats_of("F32", v)
                    elif k == 4 and w == 5:
                        vals = list(vals) + list(floats_of("F32", v))
                if dtype != 1:
                    continue
                for i, x in enumerate(vals):
                    if not math.isfinite(x):
                        return "%s: initializer %s holds %r at element %d" % (path, name, x, i)
    except Exception as e:  # noqa: BLE001
        return "%s: not a readable ONNX model (%s)" % (path, e)
    return None


# ---------------------------------------------------------------- edit / check


def edit(src, dst, edits):
    h, _, data = read_st(src)
    data = bytearray(data)
    for e in edits:
        if e.startswith("@"):  # @tensor=index:float
            t, rest = e[1:].split("=", 1)
            i, x = rest.split(":", 1)
            struct.pack_into("<f", data, h[t]["data_offsets"][0] + 4 * int(i), float(x))
        elif e.startswith("-"):
            del h["__metadata__"][e[1:]]
        else:
            k, v = e.split("=", 1)
            h["__metadata__"][k] = v
    with open(dst, "wb") as f:
        f.write(pack_st(dump_header(h), bytes(data)))


# ---------------------------------------------------------------- runs and their checks


class Sweep:
    def __init__(self, name):
        self.train = os.environ["SBP_TRAIN"]
        self.step = os.environ["STEP"]
        self.fixture = os.environ["FIXTURE"]
        self.work = os.path.join(os.environ["WORK"], name)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        os.chdir(self.work)
        subprocess.run([self.fixture, "all", "data"], check=True, stdout=subprocess.DEVNULL)
        self.failures = []
        self.outcomes = {}

    def run(self, args, cwd):
        """(exit status or 'timeout', stdout, stderr) of sbp-train STEP ARGS in cwd."""
        cmd = [self.train, self.step] + args
        try:
            p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=TIMEOUT)
            return p.returncode, p.stdout.decode("utf-8", "replace"), \
                p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            return "timeout", (e.stdout or b"").decode("utf-8", "replace"), \
                (e.stderr or b"").decode("utf-8", "replace")

    def fail(self, label, cwd, args, why, err):
        cmd = "cd %s && %s %s %s" % (cwd, self.train, self.step,
                                     " ".join(shlex_quote(a) for a in args))
        self.failures.append("%s: %s\n    %s\n    stderr: %s" % (label, why, cmd,
                                                                  err.strip()[-600:]))

    def status_problem(self, rc, err):
        """Why an exit status and stderr break the rules, or None."""
        if rc == "timeout":
            return "hung (killed after %d s)" % TIMEOUT
        if rc not in (0, 1):
            return "exit status %s (%s)" % (rc, "a signal" if rc < 0 or rc > 128 else "not 0/1")
        if "Sanitizer" in err or "runtime error:" in err:
            return "a sanitizer report"
        lines = [ln for ln in err.splitlines() if "error:" in ln]
        if rc == 1 and (len(lines) != 1 or not lines[0].startswith("sbp-train: error: ")):
            return "exit 1 with %d 'error:' lines, not one 'sbp-train: error: ...'" % len(lines)
        if rc == 0 and lines:
            return "exit 0 with an 'error:' line"
        return None

    def report(self, what, n, t0):
        print("%s: %d runs in %.1f s" % (what, n, time.time() - t0))
        for k in sorted(self.outcomes):
            ok, bad = self.outcomes[k]
            print("  %-24s exit 0: %3d  exit 1: %3d" % (k, ok, bad))
        for f in self.failures:
            print("FAIL " + f)
        print("%d failure(s)" % len(self.failures))
        return 1 if self.failures else 0

    def count(self, kind, rc, label="", err=""):
        if os.environ.get("FUZZ_VERBOSE"):
            last = err.strip().splitlines()[-1:] or [""]
            print("%s: exit %s: %s" % (label, rc, last[0][:160]))
        o = self.outcomes.setdefault(kind, [0, 0])
        o[0 if rc == 0 else 1] += 1


def shlex_quote(s):
    import shlex
    return shlex.quote(s)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def temps(d):
    out = []
    for root, _, files in os.walk(d):
        out += [os.path.join(root, f) for f in files if ".tmp." in f]
    return out


# ---------------------------------------------------------------- mutations

JUNK = ["", "abc", "-1", "0", "-0", "+3", " 3", "3 ", "03", "3junk", "0x10", "1e3", "3.0",
        "nan", "inf", "-inf", "9223372036854775807", "9223372036854775808",
        "-9223372036854775808", "18446744073709551616", "99999999999999999999999",
        "4611686018427387903", "4611686018427387904", "1e999", "-1e-3", "\n", "3\n",
        "error: not me", "\u0663", "x" * 5000, "\x00", "null", "true", "[]"]
DTYPES = ["F16", "BF16", "F64", "I32", "I64", "U8", "BOOL", "F8_E4M3", "XX", "", "f32"]
SHAPES = [[255], [257], [16, 16], [], [0], [-1], [2 ** 62], [2 ** 64], [1, 256], [128, 2],
          [256, 0], "256", None]
BAD_FLOATS = [float("nan"), float("inf"), float("-inf"), -1.0, -1e-30, 3.4e38, -3.4e38,
              1e-45, -0.0, 1e30]


def refused(name, x):
    """Whether value x in tensor `name` must stop a resume before its first step."""
    return not math.isfinite(x) or (name == "adamw.v" and x < 0)


def mutate(kind, rng, raw):
    """A mutated copy of checkpoint bytes raw by mutation `kind`, and whether the values it
    holds must be refused before the first step (a NaN, an infinity, a negative v)."""
    return _mutate(kind, rng, raw)


def _mutate(kind, rng, raw):
    (n,) = struct.unpack("<Q", raw[:8])
    hb, data = raw[8:8 + n], raw[8 + n:]
    h = json.loads(hb)
    meta = h["__metadata__"]
    names = [k for k in h if k != "__metadata__"]
    b = bytearray(raw)
    if kind == "flip_header":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(0, 8 + n)
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), False
    if kind == "flip_data":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(8 + n, len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), False
    if kind == "truncate":
        return raw[: rng.randrange(0, len(raw))], False
    if kind == "trailing":
        return raw + bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 4, 1024]))), False
    if kind == "header_len":
        v = rng.choice([0, 1, n - 1, n + 1, n + 8, len(raw), 2 ** 32, 2 ** 63, 2 ** 64 - 1])
        return struct.pack("<Q", v) + raw[8:], False
    if kind == "meta_value":
        k = rng.choice(list(meta))
        meta[k] = rng.choice(JUNK)
    elif kind == "meta_missing":
        del meta[rng.choice(list(meta))]
    elif kind == "meta_number":  # a JSON number, or another type, where a string belongs
        k = rng.choice(list(meta))
        meta[k] = rng.choice([3, -1, 1.5, None, True, [3], {"a": 1}, 2 ** 70])
    elif kind == "metadata_type":
        h["__metadata__"] = rng.choice([[], "x", 3, None, {}])
    elif kind == "dtype":
        h[rng.choice(names)]["dtype"] = rng.choice(DTYPES)
    elif kind == "shape":
        h[rng.choice(names)]["shape"] = rng.choice(SHAPES)
    elif kind == "offsets":
        t = h[rng.choice(names)]
        a, e = t["data_offsets"]
        t["data_offsets"] = rng.choice([[e, a], [a, e + 4], [a + 4, e + 4], [a - 4, e - 4],
                                        [-4, e], [a, 2 ** 64], [a, a], [0, len(data) + 4],
                                        [a], [a, e, e], "0,4", [a + 1, e + 1], [0, 1024]])
    elif kind == "tensor_missing":
        del h[rng.choice(names)]
    elif kind == "tensor_renamed":
        h[rng.choice(["params.x", "adamw.M", "", "__metadata__x"])] = h.pop(rng.choice(names))
    elif kind == "tensor_extra":
        h["extra"] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    elif kind == "duplicate":
        # the JSON text with one key twice (a JSON parser keeps the last; sbpio must refuse)
        text = hb.decode().rstrip()
        k = rng.choice(names + ["__metadata__", "meta"])
        if k == "meta":
            mk = rng.choice(list(meta))
            text = text.replace('"__metadata__":{', '"__metadata__":{"%s":"%s",' %
                                (mk, rng.choice(["0", "abc", "7"])), 1)
        else:
            text = text[:-1] + ',"%s":%s}' % (k, json.dumps(h[k]))
        return pack_st(text.encode(), data), False
    elif kind == "json_syntax":
        text = hb.decode()
        cut = rng.choice(["drop_brace", "bad_utf8", "nul", "unterminated", "comma"])
        if cut == "drop_brace":
            text = text.rstrip()[:-1]
        elif cut == "unterminated":
            text = text[: rng.randrange(1, len(text))]
        elif cut == "comma":
            text = text.rstrip()[:-1] + ",}"
        elif cut == "nul":
            i = rng.randrange(len(text))
            text = text[:i] + "\x00" + text[i:]
        enc = text.encode()
        if cut == "bad_utf8":
            i = enc.index(b'"format"')
            enc = enc[:i + 2] + b"\xff\xfe" + enc[i + 2:]
        return struct.pack("<Q", len(enc)) + enc + data, False
    elif kind == "values":
        name = rng.choice(names)
        a, e = h[name]["data_offsets"]
        d = bytearray(data)
        put = {}  # offset -> the value written last there
        for _ in range(rng.randint(1, 3)):
            put[rng.randrange(a, e, 4)] = rng.choice(BAD_FLOATS)
        for i, x in put.items():
            struct.pack_into("<f", d, i, x)
        return pack_st(dump_header(h), bytes(d)), any(refused(name, x) for x in put.values())
    elif kind == "negative_v":
        if "adamw.v" not in h:
            return raw, False
        a, e = h["adamw.v"]["data_offsets"]
        d = bytearray(data)
        struct.pack_into("<f", d, rng.randrange(a, e, 4), -rng.choice([1e-8, 1.0, 1e30]))
        return pack_st(dump_header(h), bytes(d)), True
    else:
        raise ValueError(kind)
    return pack_st(dump_header(h), data), False


KINDS = ["flip_header", "flip_data", "truncate", "trailing", "header_len", "meta_value",
         "meta_value", "meta_value", "meta_missing", "meta_number", "metadata_type", "dtype",
         "shape", "offsets", "tensor_missing", "tensor_renamed", "tensor_extra", "duplicate",
         "json_syntax", "values", "values", "negative_v"]


def sweep_checkpoints(count, seed):
    sw = Sweep("fuzz_checkpoints")
    shard = ["--model", "data/bigram.onnx", "--data", "data/stream.bin", "--lr", "0.05",
             "--threads", "2"]
    arrays = ["--model", "data/bigram.onnx", "--input-ids", "data/i32_ids.npy", "--labels",
              "data/i32_labels.npy", "--optimizer", "sgd", "--lr", "0.5", "--threads", "2"]
    bases = []
    for name, args in (("shard", shard), ("arrays", arrays)):
        rc, _, err = sw.run(args + ["--steps", "3", "--checkpoint-dir", "base_" + name], sw.work)
        if rc != 0:
            sys.exit("training the base checkpoint failed: " + err)
        with open("base_%s/step-00000003.safetensors" % name, "rb") as f:
            bases.append((name, args, f.read()))
    rng = random.Random(seed)
    t0 = time.time()
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        base, args, raw = bases[0] if i % 5 else bases[1]  # one in five: the SGD arrays run
        label = "checkpoint %d (%s, %s, seed %d)" % (i, kind, base, seed)
        d = os.path.join(sw.work, "c%03d" % i)
        os.makedirs(d)
        ck = os.path.join(d, "step-00000003.safetensors")
        data, must_refuse = mutate(kind, rng, raw)
        with open(ck, "wb") as f:
            f.write(data)
        before = sha(ck)
        run_args = args + ["--steps", "5", "--resume", d]
        rc, out, err = sw.run(run_args, sw.work)
        sw.count(kind, rc, label, err)
        why = sw.status_problem(rc, err)
        after = sorted(os.listdir(d))
        if not why and (not os.path.exists(ck) or sha(ck) != before):
            why = "the checkpoint resumed from changed"
        if not why and must_refuse and (rc != 1 or "\nstep " in "\n" + out):
            why = "a NaN, an infinity or a negative v was not refused before the first step"
        if not why and temps(d):
            why = "temporaries left: %s" % temps(d)
        if not why and rc == 1 and after != ["step-00000003.safetensors"]:
            why = "exit 1, yet the folder holds %s" % after
        if not why and rc == 0:
            new = os.path.join(d, "step-00000005.safetensors")
            why = st_problem(new) if os.path.exists(new) else "exit 0 but no step-5 checkpoint"
        if why:
            sw.fail(label, sw.work, run_args, why, err)
        elif not os.environ.get("FUZZ_KEEP"):
            shutil.rmtree(d)
    return sw.report("checkpoints", count, t0)


# ---------------------------------------------------------------- option combinations

def option_choices():
    """(option, valid values, invalid values); paths are relative to the run's folder, which
    holds adir/ (a folder), empty/ (a folder), afile (a file) and base/ (a checkpoint)."""
    return [
        ("--lr", ["0", "1e-3", "0.05", "1", "1e30", "1e38", "1e300", "1e-45"],
         ["-1", "nan", "inf", "abc", "1e-400", "", "0x1p3"]),
        ("--weight-decay", ["0", "0.01", "1", "1e30", "1e38", "1e300"],
         ["-1", "nan", "abc"]),
        ("--steps", ["1", "2", "3"], ["0", "-1", "1e3", "1073741825", "x"]),
        ("--grad-accum", ["1", "2", "3"], ["0", "-1", "1048577"]),
        ("--clip-grad-norm", ["1", "1e-30", "1e-45", "1e300", "0.5"], ["0", "-1", "nan"]),
        ("--lr-schedule", ["constant", "linear", "cosine"], ["bogus", ""]),
        ("--warmup-steps", ["0", "1", "5", "1073741824"], ["-1", "abc", "1073741825"]),
        ("--min-lr", ["0", "1e-4", "1e300"], ["-1", "nan"]),
        ("--checkpoint-every", ["1", "2"], ["0", "-1"]),
        ("--keep-checkpoints", ["1", "2", "1048576"], ["0", "x"]),
        ("--threads", ["1", "2", "4096"], ["0", "5000", "abc"]),
        ("--optimizer", ["adamw", "sgd"], ["bogus"]),
        ("--checkpoint-dir", ["ck", "ck2", ".", "adir", "new/"],
         ["no/such/dir", "afile", "/proc/self/sbp-ckpt"]),
        ("--save", ["out.onnx", "o2.onnx"],
         ["adir", "no/such/out.onnx", "/proc/self/out.onnx", "data/bigram.onnx"]),
        ("--save-safetensors", ["out.safetensors"],
         ["adir", "no/such/o.safetensors", "/proc/self/o.safetensors"]),
        ("--log", ["log.jsonl"], ["adir", "no/such/log.jsonl"]),
        ("--dump-grads", ["g.safetensors"], ["adir", "data/stream.bin", "afile/x"]),
        ("--resume", ["base"], ["nowhere", "afile", "empty"]),
        ("--eval-data", [], ["data/stream.bin", "nowhere.bin"]),  # the bigram step has no eval
        ("--bogus-option", [], ["1"]),
    ]


def sweep_options(count, seed):
    sw = Sweep("fuzz_options")
    rc, _, err = sw.run(["--model", "data/bigram.onnx", "--data", "data/stream.bin", "--steps",
                         "2", "--checkpoint-dir", "base"], sw.work)
    if rc != 0:
        sys.exit("training the base checkpoint failed: " + err)
    rng = random.Random(seed)
    t0 = time.time()
    for i in range(count):
        d = os.path.join(sw.work, "o%03d" % i)
        os.makedirs(os.path.join(d, "adir"))
        os.makedirs(os.path.join(d, "empty"))
        shutil.copytree(os.path.join(sw.work, "data"), os.path.join(d, "data"))
        shutil.copytree(os.path.join(sw.work, "base"), os.path.join(d, "base"))
        with open(os.path.join(d, "afile"), "w") as f:
            f.write("x")
        if rng.random() < 0.7:
            args = ["--model", "data/bigram.onnx", "--data", "data/stream.bin"]
        else:
            args = ["--model", "data/bigram.onnx", "--input-ids", "data/i32_ids.npy",
                    "--labels", "data/i32_labels.npy"]
        # most options valid, so that about half of the runs train and write
        for opt, good, bad in rng.sample(option_choices(), rng.randint(1, 7)):
            if good and (not bad or rng.random() < 0.9):
                args += [opt, rng.choice(good)]
            elif rng.random() < (0.5 if good else 0.2):
                args += [opt, rng.choice(bad)]
        if "--min-lr" in args and "--lr-schedule" not in args and rng.random() < 0.8:
            args += ["--lr-schedule", rng.choice(["linear", "cosine"])]
        if "--checkpoint-every" in args and "--checkpoint-dir" not in args and \
                "--resume" not in args and rng.random() < 0.8:
            args += ["--checkpoint-dir", "ck"]
        if "--resume" in args and "--steps" not in args:
            args += ["--steps", str(rng.randint(3, 5))]  # base is at step 2
        if "--steps" not in args:
            args += ["--steps", str(rng.randint(1, 3))]
        label = "options %d (seed %d)" % (i, seed)
        base = os.path.join(d, "base")
        base_before = {f: sha(os.path.join(base, f)) for f in os.listdir(base)}
        rc, out, err = sw.run(args, d)
        sw.count("options", rc, label + " " + " ".join(args[4:]), err)
        why = sw.status_problem(rc, err)
        if not why and temps(d):
            why = "temporaries left: %s" % temps(d)
        if not why:
            # everything written anywhere under the folder is finite
            for root, _, files in os.walk(d):
                if os.path.relpath(root, d).startswith("data"):
                    continue
                for f in files:
                    p = os.path.join(root, f)
                    if f.endswith(".safetensors"):
                        why = st_problem(p)
                    elif f.endswith(".onnx"):
                        why = onnx_problem(p)
                    if why:
                        break
                if why:
                    break
        if not why and "--resume" in args:
            # the checkpoint resumed from is kept (pruning may remove it only once a newer one
            # is written, and the default keeps two)
            for f, h in base_before.items():
                p = os.path.join(d, "base", f)
                if os.path.exists(p) and sha(p) != h:
                    why = "base/%s changed" % f
        if why:
            sw.fail(label, d, args, why, err)
        else:
            shutil.rmtree(d)
    return sw.report("options", count, t0)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd = argv[1]
    if cmd == "edit":
        edit(argv[2], argv[3], argv[4:])
        return 0
    if cmd == "check":
        bad = [p for p in (st_problem(f) if not f.endswith(".onnx") else onnx_problem(f)
                           for f in argv[2:]) if p]
        for p in bad:
            print(p)
        return 1 if bad else 0
    opts = dict(zip(argv[2::2], argv[3::2]))
    count = int(opts.get("--count", 240 if cmd == "checkpoints" else 150))
    seed = int(opts.get("--seed", os.environ.get("FUZZ_SEED", "1")))
    if cmd == "checkpoints":
        return sweep_checkpoints(count, seed)
    if cmd == "options":
        return sweep_options(count, seed)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
