#!/usr/bin/env python3
"""sbp-prepare and sbp-export used the wrong way: each refusal exits 1 with exactly one line on
stderr that names the cause, comes before the work, and leaves every input byte-identical and
no temporary file behind.

    test_hostile.py OUTDIR

A model folder M (a tiny Llama with attention dropout 0.3, beside the ChatML fixture tokenizer)
is made in OUTDIR, with JSONL inputs, links to them and foreign files. Checked:
  - outputs (python/README.md, "Outputs"): -o inside the model or tokenizer folder (a file of it
    or a new one, directly or through a linked folder), an input, a symbolic or hard link to an
    input or to a file of the folder, a folder, an existing file the tool did not write; an
    earlier output of the tool is replaced;
  - sbp-export -o must end in .onnx (-o m.json);
  - a missing or unwritable output folder is refused before the tokenizer or the model is
    loaded (counted in-process);
  - sbp-train's limits: --max-len above INT32_MAX, rewards beyond float32 (+-1.7e308, 1e39) and
    non-finite ones, refused with the row, before the tokenizer is loaded; --max-len INT32_MAX
    accepted; a grpo file whose every advantage is 0 written, with a note in the summary;
  - --truncate keep-start / keep-end / drop give the texts to the tokenizer only as far as
    --max-len needs (the longest text it is given, counted in-process), a 50 MB row takes
    seconds, and the examples equal tokenising the whole text and cutting it, on every fixture
    row and both tokenizers (windows forced small, so that they cut those short rows);
  - sbp-export --exporter torchscript of the model with dropout: exported (the check compares
    against the eval-mode model), and the file is recognised as sbp-export's own;
  - a usage error (argparse) is one line and exit 1 too.
"""
import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DATA, FIX, ROOT, Checks, env, need  # noqa: E402

need("numpy", "tokenizers", "transformers", "safetensors", "jinja2", "torch", "onnx",
     "onnxruntime")
sys.path.insert(0, os.path.join(ROOT, "python"))
import transformers  # noqa: E402
from sbp_tools import _cli, export, prepare  # noqa: E402

T0 = time.time()
OUT = os.path.join(sys.argv[1], "hostile")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
C = Checks()
CHATML = os.path.join(FIX, "tok_chatml")
LLAMA3 = os.path.join(FIX, "tok_llama3")
M = os.path.join(OUT, "model")
W = os.path.join(OUT, "work")
os.makedirs(W)


LAST = [T0]


def section(name):
    """Prints the seconds the part just done took (the test is meant to stay fast)."""
    print("  %-10s %5.1f s" % (name, time.time() - LAST[0]), flush=True)
    LAST[0] = time.time()


def make_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attention_dropout=0.3)
    LlamaForCausalLM(cfg).save_pretrained(M)
    for f in os.listdir(CHATML):
        shutil.copy(os.path.join(CHATML, f), M)


make_model()
SFT = os.path.join(W, "sft.jsonl")
shutil.copy(os.path.join(DATA, "sft_messages.jsonl"), SFT)


def jsonl(name, rows):
    p = os.path.join(W, name)
    with open(p, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return p


def grpo_rows(*rewards):
    return [{"prompt": "Say hi.", "completion": "hi %d" % i, "reward": r}
            for i, r in enumerate(rewards)]


GRPO_HUGE = jsonl("grpo_huge.jsonl", grpo_rows(1.7e308, -1.7e308))
GRPO_1E39 = jsonl("grpo_1e39.jsonl", grpo_rows(1.0, 1e39))
GRPO_INF = jsonl("grpo_inf.jsonl", ['{"prompt": "a", "completion": "b", "reward": 1}',
                                    '{"prompt": "a", "completion": "c", "reward": 1e400}'])
BIG = jsonl("rows30k.jsonl", [{"text": "row %d of many" % i} for i in range(30000)])
# links and a foreign file
os.symlink(os.path.join(M, "model.safetensors"), os.path.join(W, "weights_link.safetensors"))
os.link(os.path.join(M, "tokenizer.json"), os.path.join(W, "tok_hard.safetensors"))
os.symlink(SFT, os.path.join(W, "sft_link.safetensors"))
os.link(SFT, os.path.join(W, "sft_hard.safetensors"))
os.symlink(M, os.path.join(W, "model_link"))
shutil.copy(os.path.join(M, "model.safetensors"), os.path.join(W, "foreign.safetensors"))
with open(os.path.join(W, "notes.onnx"), "wb") as f:
    f.write(b"not made by sbp-export")
os.symlink(os.path.join(M, "config.json"), os.path.join(W, "config_link.onnx"))


def snapshot():
    """Every file of the model folder and of the scratch folder (inputs, links, foreign files),
    by content, and the temporaries (dot-named .tmp) anywhere under OUT."""
    files, temps = {}, []
    for d in (M, W):
        for n in os.listdir(d):
            p = os.path.join(d, n)
            if os.path.isfile(p):
                with open(p, "rb") as f:
                    files[p] = f.read()
    for dp, dn, fn in os.walk(OUT):
        temps += [os.path.join(dp, n) for n in fn + dn if n.endswith(".tmp")]
    return files, temps


BEFORE, _ = snapshot()


def untouched(what):
    files, temps = snapshot()
    changed = [p for p in BEFORE if files.get(p) != BEFORE[p]]
    C.ok(not changed, "%s: inputs byte-identical afterwards, changed: %s" % (what, changed))
    C.ok(not temps, "%s: no temporary left: %s" % (what, temps))
    for p in changed:  # put back what a failure overwrote, so that the next checks stand alone
        if not os.path.islink(p):
            if os.path.lexists(p) and not os.path.isfile(p):
                shutil.rmtree(p)
            with open(p, "wb") as f:
                f.write(BEFORE[p])


def tool(name, *args):
    mod = {"sbp-prepare": "sbp_tools.prepare", "sbp-export": "sbp_tools.export"}[name]
    p = subprocess.run([sys.executable, "-m", mod] + [str(a) for a in args], env=env(),
                       capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def refused(what, name, args, phrase):
    """A subprocess run: exit 1, stderr exactly one line `NAME: error: ...` holding phrase."""
    rc, so, se = tool(name, *args)
    lines = se.splitlines()
    C.ok(rc == 1 and len(lines) == 1 and lines[0].startswith(name + ": error: ") and
         phrase in lines[0], "%s: exit 1 and one line with %r; got %d %r" % (what, phrase, rc, se))
    untouched(what)
    return lines[0] if lines else ""


# ------------------------------------------------------------------ in-process runs
STATS = {"tokenizer_loads": 0, "model_loads": 0, "longest_text": 0}
_tok_load = transformers.AutoTokenizer.from_pretrained
_model_load = transformers.AutoModelForCausalLM.from_pretrained
_tok_call = transformers.PreTrainedTokenizerBase.__call__


def _count_tok(*a, **k):
    STATS["tokenizer_loads"] += 1
    return _tok_load(*a, **k)


def _count_model(*a, **k):
    STATS["model_loads"] += 1
    return _model_load(*a, **k)


def _count_call(self, text=None, *a, **k):
    if isinstance(text, str):
        STATS["longest_text"] = max(STATS["longest_text"], len(text))
    return _tok_call(self, text, *a, **k)


transformers.AutoTokenizer.from_pretrained = _count_tok
transformers.AutoModelForCausalLM.from_pretrained = _count_model
transformers.PreTrainedTokenizerBase.__call__ = _count_call


def inproc(mod, args):
    """mod.main(args) in this process (no import per run): (rc, stderr, STATS of the run)."""
    for k in STATS:
        STATS[k] = 0
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = mod.main([str(a) for a in args]) or 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue(), dict(STATS, stdout=out.getvalue())


def refused_early(what, mod, args, phrase):
    """In-process: exit 1, one error line with phrase, neither tokenizer nor model loaded."""
    rc, se, st = inproc(mod, args)
    lines = se.splitlines()
    C.ok(rc == 1 and len(lines) == 1 and phrase in lines[0],
         "%s: exit 1 and one line with %r; got %d %r" % (what, phrase, rc, se))
    C.ok(st["tokenizer_loads"] == 0 and st["model_loads"] == 0,
         "%s: refused before loading anything: %s" % (what, st))
    untouched(what)


PREP = ["--tokenizer", M, "--task", "sft", "--max-len", 128, SFT]

# ------------------------------------------------------------------ outputs: sbp-prepare
section("setup")
for f in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json",
          "chat_template.jinja", "new.safetensors"):
    refused("sbp-prepare -o M/" + f, "sbp-prepare", PREP + ["-o", os.path.join(M, f)],
            "is in the tokenizer folder %s, which this run reads" % M)
refused("sbp-prepare -o through a link to M", "sbp-prepare",
        PREP + ["-o", os.path.join(W, "model_link", "model.safetensors")],
        "is in the tokenizer folder")
for f, phrase in (("weights_link.safetensors", "model.safetensors of the tokenizer folder"),
                  ("tok_hard.safetensors", "tokenizer.json of the tokenizer folder"),
                  ("sft.jsonl", "is the input " + SFT),
                  ("sft_link.safetensors", "is the input " + SFT),
                  ("sft_hard.safetensors", "is the input " + SFT),
                  ("foreign.safetensors", "exists and is not a dataset file of sbp-prepare")):
    refused("sbp-prepare -o " + f, "sbp-prepare", PREP + ["-o", os.path.join(W, f)], phrase)
refused("sbp-prepare -o a folder", "sbp-prepare", PREP + ["-o", W], "is a folder")
refused("sbp-prepare usage error", "sbp-prepare", PREP[:3] + ["nope", SFT, "-o", "x"],
        "invalid choice")
# an earlier output is replaced (the one kind of existing file the tool writes over)
ok = os.path.join(W, "ok.safetensors")
for i in range(2):
    rc, se, st = inproc(prepare, PREP + ["-o", ok])
    C.ok(rc == 0 and se == "" and _cli.is_sbp_dataset(ok), "sbp-prepare -o ok (run %d): exit 0, "
         "a dataset file: %d %r" % (i, rc, se))
untouched("sbp-prepare -o an earlier output")

# before the work: a missing or unwritable folder, 30k rows not tokenised
refused_early("sbp-prepare -o missing folder", prepare,
              ["--tokenizer", M, "--task", "sft", "--max-len", 64, BIG, "-o",
               os.path.join(W, "missing", "x.safetensors")], "does not exist")
RO = os.path.join(OUT, "readonly")
os.makedirs(RO)
os.chmod(RO, 0o555)
# root writes into a read-only folder anyway; /sys refuses even root
RO_DIR = "/sys" if os.geteuid() == 0 else RO
refused_early("sbp-prepare -o read-only folder", prepare,
              ["--tokenizer", M, "--task", "sft", "--max-len", 64, BIG, "-o",
               os.path.join(RO_DIR, "x.safetensors")], "cannot write in the output folder")
t = time.time()
refused("sbp-prepare -o missing folder (30k rows, subprocess)", "sbp-prepare",
        ["--tokenizer", M, "--task", "sft", "--max-len", 64, BIG, "-o",
         os.path.join(W, "missing", "x.safetensors")], "does not exist")
C.ok(time.time() - t < 5, "the refusal takes no tokenising: %.1f s" % (time.time() - t))

# ------------------------------------------------------------------ sbp-train's limits
section("outputs")
refused("sbp-prepare --max-len 99999999999999", "sbp-prepare",
        ["--tokenizer", M, "--task", "sft", "--max-len", 99999999999999, SFT, "-o",
         os.path.join(W, "x.safetensors")], "--max-len 99999999999999: it must be from 2")
refused_early("sbp-prepare --max-len 2**31", prepare,
              ["--tokenizer", M, "--task", "sft", "--max-len", 2**31, SFT, "-o",
               os.path.join(W, "x.safetensors")], "to 2147483647 (the largest max_len")
rc, se, st = inproc(prepare, ["--tokenizer", M, "--task", "sft", "--max-len", 2**31 - 1, SFT,
                              "-o", ok])
C.ok(rc == 0, "--max-len 2147483647 (sbp-train's largest) accepted: %d %r" % (rc, se))
for path, line, phrase in ((GRPO_HUGE, 1, '"reward" 1.7e+308 is outside float32\'s range'),
                           (GRPO_1E39, 2, '"reward" 1e+39 is outside float32\'s range'),
                           (GRPO_INF, 2, '"reward" must be a finite number, not Infinity')):
    args = ["--tokenizer", M, "--task", "grpo", "--max-len", 64, path, "-o",
            os.path.join(W, "g.safetensors")]
    refused("grpo " + os.path.basename(path), "sbp-prepare", args,
            "%s:%d: %s" % (path, line, phrase))
    refused_early("grpo %s (before the tokenizer)" % os.path.basename(path), prepare, args,
                  phrase)

# every advantage 0 (groups of one row): a valid file that sbp-train will not train GRPO on
rc, se, st = inproc(prepare, ["--tokenizer", M, "--task", "grpo", "--max-len", 64,
                              jsonl("grpo_ones.jsonl", [{"prompt": "p%d" % i, "completion": "c",
                                                         "reward": i} for i in range(3)]),
                              "-o", os.path.join(W, "g.safetensors")])
C.ok(rc == 0 and "every advantage is 0" in st["stdout"], "grpo, groups of one: written, and "
     "the summary says that every advantage is 0: %d %r %r" % (rc, se, st["stdout"]))
os.remove(os.path.join(W, "g.safetensors"))
BEFORE, _ = snapshot()

# ------------------------------------------------------------------ bounded truncation
section("limits")
# 2 MB rows whose kept window scores something at either end (the prompt is short)
for name, tok, row in (("text", M, {"text": "the sea is wide " * 131072}),
                       ("prompt/completion", M, {"prompt": "Tell me.",
                                                 "completion": "It is so. " * 200000}),
                       ("messages marked", M, {"messages": [
                           {"role": "user", "content": "Hello"},
                           {"role": "assistant", "content": "Fine. " * 350000}]}),
                       ("messages prefix", LLAMA3, {"messages": [
                           {"role": "user", "content": "Hello"},
                           {"role": "assistant", "content": "Fine. " * 350000}]})):
    p = jsonl("long_row.jsonl", [row])
    for mode in ("keep-start", "keep-end", "drop"):
        rc, se, st = inproc(prepare, ["--tokenizer", tok, "--task", "sft", "--max-len", 64,
                                      "--truncate", mode, p, "-o", ok])
        C.ok(rc == (1 if mode == "drop" else 0) and st["longest_text"] <= 65536,
             "%s row of %d MB, --truncate %s: the tokenizer is given %d characters at most, "
             "want <= 65536: %d %r" % (name, len(json.dumps(row)) >> 20, mode,
                                       st["longest_text"], rc, se))
    os.remove(p)
BEFORE, _ = snapshot()
p = jsonl("huge_row.jsonl", [{"text": "the quick brown fox " * ((50 << 20) // 20)}])
t = time.time()
rc, so, se = tool("sbp-prepare", "--tokenizer", M, "--task", "sft", "--max-len", 64,
                  "--truncate", "keep-start", p, "-o", os.path.join(W, "huge.safetensors"))
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10
C.ok(rc == 0 and time.time() - t < 30 and rss < 2048, "a 50 MB row, --max-len 64 keep-start: "
     "exit %d in %.1f s, %d MB (the whole row tokenised: 95 s, 13.6 GB) %r"
     % (rc, time.time() - t, rss, se))
os.remove(p)


def equal_to_whole(tokdir, files, small):
    """Tokenising.encode's windows against the whole text cut by Builder.fit, on every row of
    files, for several --max-len; small: windows of a few characters (every row is cut)."""
    tk = transformers.AutoTokenizer.from_pretrained(tokdir)
    bad = n = 0
    for L in (3, 8, 20, 64):
        for side in ("start", "end"):
            whole = prepare.Tokenising(tk, "auto")
            part = prepare.Tokenising(tk, "auto", (side, L))
            if small:
                part.MIN_WINDOW, part.CHARS_PER_TOKEN, part.MARGIN = 8, 1, 2
            Bw = prepare.Builder(L, "keep-" + side)
            Bp = prepare.Builder(L, "keep-" + side)
            for f in files:
                for row, where in prepare.read_rows([os.path.join(DATA, f)] if small else [f]):
                    rows = []
                    for T, B in ((whole, Bw), (part, Bp)):
                        if "chosen" in row:  # dpo: both answers
                            ex = [T.prompt_completion(prepare.side(row, "prompt", where),
                                                      prepare.side(row, k, where), k, where)
                                  for k in ("chosen", "rejected")]
                        else:
                            ex = [prepare.sft_example(T, row, where)]
                        rows.append([B.fit(e, where) for e in ex])
                    n += 1
                    if rows[0] != rows[1]:
                        bad += 1
                        print("differs: %s %s L=%d %s" % (tokdir, where, L, side))
    return bad, n


FILES = ["sft_messages.jsonl", "sft_prompt_completion.jsonl", "sft_text.jsonl", "long.jsonl",
         "dpo.jsonl"]
for tokdir in (CHATML, LLAMA3):
    bad, n = equal_to_whole(tokdir, FILES, True)
    C.ok(n > 50 and bad == 0, "%s: windowed = whole then cut, %d of %d examples differ"
         % (os.path.basename(tokdir), bad, n))
# rows long enough for the default windows: the fixture rows repeated
LONG = jsonl("long_normal.jsonl", [
    {"text": " ".join(json.dumps(r) for r in map(json.loads, open(os.path.join(DATA, f))))
     * 12} for f in FILES] + [
    {"messages": [{"role": "user", "content": "Why? " * 800},
                  {"role": "assistant", "content": "Because it is so, friend. " * 300}]},
    {"prompt": "Write a poem. " * 500, "completion": "The sea is wide, the sea is deep. " * 300}])
for tokdir in (CHATML, LLAMA3):
    bad, n = equal_to_whole(tokdir, [LONG], False)
    C.ok(n >= 7 * 8 and bad == 0, "%s, long rows, default windows: windowed = whole then cut, "
         "%d of %d differ" % (os.path.basename(tokdir), bad, n))
os.remove(LONG)
BEFORE, _ = snapshot()

# ------------------------------------------------------------------ sbp-export
section("truncation")
refused("sbp-export -o M/model.safetensors", "sbp-export", [M, "-o",
        os.path.join(M, "model.safetensors")], "must end in .onnx")
refused("sbp-export -o m.json", "sbp-export", [M, "-o", os.path.join(W, "m.json")],
        "-o %s: the output must end in .onnx" % os.path.join(W, "m.json"))
refused("sbp-export -o M/model.onnx", "sbp-export", [M, "-o", os.path.join(M, "model.onnx")],
        "is in the model folder %s, which this run reads" % M)
refused("sbp-export -o link into M", "sbp-export", [M, "-o",
        os.path.join(W, "config_link.onnx")], "config.json of the model folder")
refused("sbp-export -o foreign .onnx", "sbp-export", [M, "-o", os.path.join(W, "notes.onnx")],
        "exists and is not an ONNX file of sbp-export")
with open(os.path.join(W, "alone.onnx.data"), "wb") as f:
    f.write(b"someone's data")
BEFORE, _ = snapshot()
refused("sbp-export -o X.onnx beside a foreign X.onnx.data", "sbp-export",
        [M, "-o", os.path.join(W, "alone.onnx")], "-o (external data)")
refused_early("sbp-export -o missing folder", export,
              [M, "-o", os.path.join(W, "missing", "m.onnx")], "does not exist")
refused_early("sbp-export -o read-only folder", export,
              [M, "-o", os.path.join(RO_DIR, "m.onnx")], "cannot write in the output folder")

# dropout > 0: the TorchScript export is right and is checked against the eval-mode model
DROP = os.path.join(W, "drop.onnx")
rc, so, se = tool("sbp-export", M, "-o", DROP, "--exporter", "torchscript")
C.ok(rc == 0 and "max abs difference" in so, "torchscript export of a model with dropout 0.3: "
     "exit 0, got %d %r" % (rc, se[-1500:]))
untouched("torchscript export with dropout")
C.ok(export.is_ours(DROP) and not export.is_ours(os.path.join(W, "notes.onnx")) and
     not export.is_ours(os.path.join(M, "model.safetensors")),
     "sbp-export's output is recognised as its own (sbp.producer), others are not")

os.chmod(RO, 0o755)
section("export")
print("test_hostile: %.1f s" % (time.time() - T0))
C.done()
