#!/usr/bin/env python3
"""sbp-prepare against transformers itself and against independent computations.

    test_prepare.py OUTDIR

  - sft messages, ChatML-style template with {% generation %}: ids and mask equal
    apply_chat_template(..., return_assistant_tokens_mask=True), labels shifted per
    docs/dataset-format.md; metadata mask = assistant_tokens_mask
  - sft messages, Llama-3-style template without the marks: ids and labels equal a rendering
    written out by hand here (header, content, <|eot_id|>; assistant content + <|eot_id|>
    scored); metadata mask = prefix
  - prompt/completion (strings and message lists) and text rows; dpo pairs; grpo advantages
    against torch.std (Bessel) and the groups
  - --truncate keep-start / keep-end / drop and the default refusal (file:line and the length)
  - every malformed file: exit 1, one error line naming file:line, nothing written (an existing
    output of the tool is left as it was; test_hostile.py has the outputs it refuses)
  - the file format: dtypes, offsets, metadata keys, ids below vocab_size
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (DATA, FIX, Checks, error_lines, examples, load_dataset, need, shift,  # noqa
                    tool)

need("numpy", "tokenizers", "transformers", "safetensors", "jinja2")
import numpy as np  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
C = Checks()
CHATML = os.path.join(FIX, "tok_chatml")
LLAMA3 = os.path.join(FIX, "tok_llama3")
META_KEYS = {"format", "version", "task", "max_len", "eos_id", "pad_id", "vocab_size",
             "tokenizer", "truncate", "mask", "examples", "tokens", "scored_tokens",
             "truncated", "dropped", "sources", "producer"}


def rows(name):
    with open(os.path.join(DATA, name)) as f:
        return [json.loads(l) for l in f if l.strip()]


def prepare(name, tok, task, max_len, files, *extra):
    out = os.path.join(OUT, name + ".safetensors")
    if os.path.exists(out):
        os.remove(out)
    rc, so, se = tool("sbp-prepare", "--tokenizer", tok, "--task", task, "--max-len", max_len,
                      *[os.path.join(DATA, f) for f in files], "-o", out, *extra)
    if not C.ok(rc == 0, "%s: sbp-prepare exit 0, got %d: %s" % (name, rc, se.strip())):
        return None, None, so
    t, meta = load_dataset(out)
    check_format(name, t, meta, task, max_len, tok)
    return t, meta, so


def check_format(name, t, meta, task, max_len, tok):
    C.ok(set(meta) >= META_KEYS, "%s: metadata keys %s" % (name, sorted(META_KEYS - set(meta))))
    C.ok(meta["format"] == "sbp-dataset" and meta["version"] == "1" and meta["task"] == task,
         "%s: format/version/task" % name)
    C.ok(t["input_ids"].dtype == np.int32 and t["labels"].dtype == np.int32 and
         t["offsets"].dtype == np.int64, "%s: dtypes" % name)
    o = t["offsets"]
    C.ok(o[0] == 0 and o[-1] == t["input_ids"].size and np.all(np.diff(o) >= 1) and
         np.all(np.diff(o) <= max_len), "%s: offsets" % name)
    C.ok(t["labels"].shape == t["input_ids"].shape, "%s: labels shape" % name)
    v = int(meta["vocab_size"])
    C.ok(v == len(AutoTokenizer.from_pretrained(tok)), "%s: vocab_size = len(tokenizer)" % name)
    C.ok(t["input_ids"].max() < v and t["input_ids"].min() >= 0, "%s: ids in range" % name)
    lab = t["labels"]
    C.ok(np.all((lab == -100) | ((lab >= 0) & (lab < v))), "%s: labels in range" % name)
    C.ok(int(meta["examples"]) == len(o) - 1 and int(meta["tokens"]) == o[-1] and
         int(meta["scored_tokens"]) == int((lab != -100).sum()), "%s: counts" % name)
    for i, (ids, labels) in enumerate(examples(t)):
        C.ok(labels[-1] == -100, "%s: example %d ends with -100" % (name, i))
        C.ok(any(x != -100 for x in labels), "%s: example %d scores something" % (name, i))
    if task == "dpo":
        C.ok((len(o) - 1) % 2 == 0, "%s: even count" % name)


def chat_ids(tok, msgs, **kw):
    enc = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **kw)
    return list(enc["input_ids"]), enc


# ---- sft messages, ChatML-style template with generation marks: transformers' own mask
tok = AutoTokenizer.from_pretrained(CHATML)
t, meta, so = prepare("chatml_messages", CHATML, "sft", 128, ["sft_messages.jsonl"])
if t is not None:
    C.ok(meta["mask"] == "assistant_tokens_mask", "chatml: mask method %s" % meta["mask"])
    C.ok("assistant tokens: assistant_tokens_mask" in so, "chatml: prints the mask method")
    got = examples(t)
    for i, r in enumerate(rows("sft_messages.jsonl")):
        ids, enc = chat_ids(tok, r["messages"], return_assistant_tokens_mask=True)
        mask = list(enc["assistant_masks"])
        C.ok(sum(mask) > 0, "chatml row %d: transformers finds assistant tokens" % i)
        C.ok(got[i][0] == ids, "chatml row %d: ids = apply_chat_template's" % i)
        C.ok(got[i][1] == shift(ids, mask), "chatml row %d: labels = shifted assistant mask" % i)

# ---- sft messages, Llama-3-style template without marks: a hand rendering
tok3 = AutoTokenizer.from_pretrained(LLAMA3)
t, meta, so = prepare("llama3_messages", LLAMA3, "sft", 128, ["sft_messages.jsonl"])
if t is not None:
    C.ok(meta["mask"] == "prefix", "llama3: mask method %s" % meta["mask"])
    got = examples(t)
    for i, r in enumerate(rows("sft_messages.jsonl")):
        pieces = [("<|begin_of_text|>", False)]
        for m in r["messages"]:
            pieces.append(("<|start_header_id|>%s<|end_header_id|>\n\n" % m["role"], False))
            a = m["role"] == "assistant"
            pieces.append((m["content"].strip() + "<|eot_id|>", a))
        ids, scored = [], []
        for text, s in pieces:
            x = tok3(text, add_special_tokens=False)["input_ids"]
            ids += x
            scored += [s] * len(x)
        C.ok(got[i][0] == ids, "llama3 row %d: ids = the hand rendering's\n  got  %s\n  want %s"
             % (i, got[i][0], ids))
        C.ok(got[i][1] == shift(ids, scored), "llama3 row %d: labels = shifted hand mask\n  got"
             "  %s\n  want %s" % (i, got[i][1], shift(ids, scored)))

# ---- prompt/completion and text rows (ChatML tokenizer; eos appended to string sides)
t, meta, so = prepare("pc_text", CHATML, "sft", 128, ["sft_prompt_completion.jsonl",
                                                      "sft_text.jsonl"])
if t is not None:
    C.ok(meta["mask"] == "none", "pc_text: no messages rows: mask none")
    got = examples(t)
    want = []
    for r in rows("sft_prompt_completion.jsonl"):
        if isinstance(r["prompt"], str):
            p = tok(r["prompt"])["input_ids"]
            full = tok(r["prompt"] + r["completion"] + tok.eos_token)["input_ids"]
        else:
            p, _ = chat_ids(tok, r["prompt"], add_generation_prompt=True)
            full, _ = chat_ids(tok, r["prompt"] + r["completion"])
        C.ok(full[:len(p)] == p, "pc: the prompt's tokens begin the whole's")
        want.append((full, shift(full, [False] * len(p) + [True] * (len(full) - len(p)))))
    for r in rows("sft_text.jsonl"):
        full = tok(r["text"] + tok.eos_token)["input_ids"]
        want.append((full, full[1:] + [-100]))
    C.ok(len(got) == len(want), "pc_text: %d examples, want %d" % (len(got), len(want)))
    for i, (g, w) in enumerate(zip(got, want)):
        C.ok(g == w, "pc_text example %d\n  got  %s\n  want %s" % (i, g, w))

# ---- dpo: pairs, chosen then rejected, prompt not scored
t, meta, so = prepare("dpo", CHATML, "dpo", 128, ["dpo.jsonl"])
if t is not None:
    got = examples(t)
    want = []
    for r in rows("dpo.jsonl"):
        for key in ("chosen", "rejected"):
            if isinstance(r["prompt"], str):
                p = tok(r["prompt"])["input_ids"]
                full = tok(r["prompt"] + r[key] + tok.eos_token)["input_ids"]
            else:
                p, _ = chat_ids(tok, r["prompt"], add_generation_prompt=True)
                full, _ = chat_ids(tok, r["prompt"] + r[key])
            want.append((full, shift(full, [False] * len(p) + [True] * (len(full) - len(p)))))
    C.ok(got == want, "dpo: examples = (prompt+chosen, prompt+rejected) pairs")

# ---- grpo: advantages vs torch.std over each group
t, meta, so = prepare("grpo", CHATML, "grpo", 128, ["grpo.jsonl"])
if t is not None:
    import torch
    rs = rows("grpo.jsonl")
    keys = [("g", json.dumps(r["group"])) if "group" in r else ("p", json.dumps(r["prompt"]))
            for r in rs]
    first = {}
    gid = [first.setdefault(k, len(first)) for k in keys]
    adv = []
    for i, r in enumerate(rs):
        g = torch.tensor([rs[j]["reward"] for j in range(len(rs)) if gid[j] == gid[i]],
                         dtype=torch.float64)
        std = g.std() if g.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        adv.append(float((r["reward"] - g.mean()) / (std + 1e-4)))
    C.ok(t["advantages"].dtype == np.float32 and t["group"].dtype == np.int64 and
         t["reward"].dtype == np.float32, "grpo: dtypes")
    C.ok(np.allclose(t["advantages"], adv, rtol=1e-6, atol=1e-6),
         "grpo: advantages %s, want %s" % (t["advantages"].tolist(), adv))
    C.ok(t["group"].tolist() == gid, "grpo: groups %s, want %s" % (t["group"].tolist(), gid))
    C.ok(t["reward"].tolist() == [r["reward"] for r in rs], "grpo: rewards")
    C.ok(adv[3] == 0.0 and t["advantages"][3] == 0.0, "grpo: a group of one has advantage 0")

# ---- truncation
full = [tok(r["text"] + tok.eos_token)["input_ids"] if "text" in r else None
        for r in rows("long.jsonl")]
L = 20
out = os.path.join(OUT, "long_refused.safetensors")
rc, so, se = tool("sbp-prepare", "--tokenizer", CHATML, "--task", "sft", "--max-len", L,
                  os.path.join(DATA, "long.jsonl"), "-o", out)
C.ok(rc == 1 and len(error_lines(se)) == 1 and
     ("long.jsonl:2: the example is %d tokens, longer than --max-len %d" % (len(full[1]), L))
     in se and not os.path.exists(out), "default truncation: refused with file:line and length:"
     " rc %d %s" % (rc, se.strip()))
for mode in ("keep-start", "keep-end", "drop"):
    t, meta, so = prepare("long_" + mode, CHATML, "sft", L, ["long.jsonl"], "--truncate", mode)
    if t is None:
        continue
    got = examples(t)
    ex = got[1] if mode != "drop" else None
    if mode == "keep-start":
        cut = full[1][:L]
        C.ok(ex == (cut, cut[1:] + [-100]), "keep-start: the first %d tokens" % L)
        # the prompt/completion row's prompt alone fills max_len: nothing scored, dropped
        C.ok(meta["truncated"] == "1" and meta["dropped"] == "1" and len(got) == 3,
             "keep-start: counts %s %s" % (meta["truncated"], meta["dropped"]))
    elif mode == "keep-end":
        cut = full[1][-L:]
        C.ok(ex == (cut, cut[1:] + [-100]), "keep-end: the last %d tokens" % L)
        C.ok(meta["truncated"] == "2" and meta["dropped"] == "0" and len(got) == 4,
             "keep-end: counts")
    else:
        C.ok(len(got) == 2 and got[0][0] == full[0] and got[1][0] == full[3] and
             meta["dropped"] == "2" and meta["truncated"] == "0", "drop: the two short rows")
    C.ok(meta["truncate"] == mode and ("truncated %s, dropped %s" % (meta["truncated"],
                                                                    meta["dropped"])) in so,
         "%s: recorded and printed" % mode)
    C.ok("lengths min %d" % min(len(e[0]) for e in got) in so, "%s: length summary" % mode)

# ---- malformed rows: exit 1, one line FILE:LINE, nothing written, an old output untouched
BAD = [("bad_json.jsonl", "sft", 2, "invalid JSON"),
       ("bad_missing_key.jsonl", "sft", 3, 'no "completion"'),
       ("bad_type.jsonl", "sft", 1, '"messages" must be a non-empty list'),
       ("bad_role_type.jsonl", "sft", 2, "role must be a string"),
       ("bad_empty_assistant.jsonl", "sft", 1, "empty assistant turn"),
       ("bad_no_assistant.jsonl", "sft", 2, "no assistant turn"),
       ("bad_not_object.jsonl", "sft", 1, "must be a JSON object"),
       ("bad_reward.jsonl", "grpo", 2, '"reward" must be a finite number'),
       ("bad_dpo.jsonl", "dpo", 1, 'no "rejected"'),
       ("sft_text.jsonl", "dpo", 1, 'no "prompt"')]
for f, task, line, phrase in BAD:
    out = os.path.join(OUT, "bad.safetensors")
    # an earlier output of the tool (the only kind of existing file it would replace)
    with open(os.path.join(OUT, "dpo.safetensors"), "rb") as g:
        old = g.read()
    with open(out, "wb") as g:
        g.write(old)
    path = os.path.join(DATA, f)
    rc, so, se = tool("sbp-prepare", "--tokenizer", CHATML, "--task", task, "--max-len", 128,
                      path, "-o", out)
    lines = se.strip().splitlines()
    C.ok(rc == 1, "%s: exit 1, got %d" % (f, rc))
    C.ok(len(lines) == 1 and lines[0].startswith("sbp-prepare: error: %s:%d: " % (path, line))
         and phrase in lines[0], "%s: one line naming %s:%d with '%s', got %r"
         % (f, f, line, phrase, se))
    C.ok(open(out, "rb").read() == old, "%s: the existing output is untouched" % f)
    C.ok(not [x for x in os.listdir(OUT) if x.endswith(".tmp")], "%s: no temporary left" % f)
    os.remove(out)
rc, so, se = tool("sbp-prepare", "--tokenizer", os.path.join(OUT, "nope"), "--task", "sft",
                  "--max-len", 8, os.path.join(DATA, "sft_text.jsonl"), "-o",
                  os.path.join(OUT, "x.safetensors"))
C.ok(rc == 1 and len(error_lines(se)) == 1 and "--tokenizer" in se, "missing tokenizer folder")
C.done()
