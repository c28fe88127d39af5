"""sbp-prepare: JSONL rows -> the dataset file sbp-train reads (docs/dataset-format.md).

    sbp-prepare --tokenizer DIR --task sft|dpo|grpo --max-len N IN.jsonl... -o DATA.safetensors
                [--truncate keep-start|keep-end|drop] [--mask auto|assistant-tokens|prefix]

Rows are TRL's dataset formats. Each row becomes one example (two for DPO): token ids and, per
token, whether it is a target ("scored"), decided as follows.
  - {"messages": [...]}: the conversation through the tokenizer's chat template; only the
    assistant turns are scored. When the template marks them ({% generation %}), transformers'
    own mask is used (apply_chat_template(..., return_assistant_tokens_mask=True)); otherwise each
    assistant turn k is the text that rendering messages[:k+1] adds to rendering messages[:k]
    with the generation prompt, and the tokens that start inside that text are scored.
  - {"prompt": ..., "completion": ...}: only the completion is scored. Two strings: the text
    prompt + completion + EOS, tokenised as the tokenizer does by default, tokens that start at
    or after the prompt's end scored. A message list on either side (a string side becomes one
    user, resp. assistant, message): the prompt rendered with the generation prompt, then the
    whole conversation; what follows the prompt's rendering is scored.
  - {"text": ...}: text + EOS, every token scored.
  - dpo rows {"prompt", "chosen", "rejected"} are two prompt/completion examples; grpo rows
    {"prompt", "completion", "reward"[, "group"]} one, with the group's advantage.
EOS is appended to string completions and texts (unless they already end with it) so that the
model learns to stop, as TRL does. The labels written are shifted (labels[t] is the target of
position t): see the doc.

Everything that can be refused without tokenising is refused first, in one line (_cli.py: the
output rule; the limits of sbp-train's reader; grpo's rewards and advantages, read in a pass of
their own before the tokenising one). With --truncate keep-start, keep-end or drop a long text
is tokenised only as far as the examples need (Tokenising.encode), so a huge row costs what
--max-len keeps, not what it holds.
"""
import argparse
import json
import math
import os
import re
import sys

import numpy as np

from . import __version__
from ._cli import (Fail, Parser, check_inputs, check_output, commit, die, discard, first_line,
                   is_sbp_dataset, reserve)

PROG = "sbp-prepare"
GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")

# What sbp-train's reader accepts, so that what this tool writes is what the next one reads:
# sbpio_dataset_open (io/dataset.c) takes max_len and vocab_size through meta_int(..., 1,
# INT32_MAX), eos_id and pad_id from 0 to vocab_size - 1, and refuses non-finite advantages
# (stored as F32, like the rewards). An example needs 2 tokens here (one position, one target).
INT32_MAX = 2**31 - 1
MIN_LEN = 2
FLT_MAX = float(np.finfo(np.float32).max)


class RowError(Fail):
    """A problem with one input row; the message is prefixed with FILE:LINE."""


# ------------------------------------------------------------------ row validation

def need_str(row, key, where):
    v = row[key]
    if not isinstance(v, str):
        raise RowError("%s: \"%s\" must be a string, not %s" % (where, key, type(v).__name__))
    return v


def check_messages(msgs, key, where):
    """A message list: non-empty, each {"role": str, "content": str}; an assistant turn must
    have content."""
    if not isinstance(msgs, list) or not msgs:
        raise RowError("%s: \"%s\" must be a non-empty list of messages" % (where, key))
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RowError("%s: \"%s\"[%d] must be an object with \"role\" and \"content\", not %s"
                           % (where, key, i, type(m).__name__))
        for k in ("role", "content"):
            if k not in m:
                raise RowError("%s: \"%s\"[%d] has no \"%s\"" % (where, key, i, k))
            if not isinstance(m[k], str):
                raise RowError("%s: \"%s\"[%d].%s must be a string, not %s"
                               % (where, key, i, k, type(m[k]).__name__))
        if m["role"] == "assistant" and not m["content"].strip():
            raise RowError("%s: \"%s\"[%d] is an empty assistant turn" % (where, key, i))
    return msgs


def side(row, key, where):
    """A prompt/completion side: ("text", str) or ("messages", list)."""
    if key not in row:
        raise RowError("%s: the row has no \"%s\" (keys: %s)" % (where, key, ", ".join(sorted(row))))
    v = row[key]
    if isinstance(v, str):
        return "text", v
    if isinstance(v, list):
        return "messages", check_messages(v, key, where)
    raise RowError("%s: \"%s\" must be a string or a message list, not %s"
                   % (where, key, type(v).__name__))


# ------------------------------------------------------------------ tokenising

class Tokenising:
    """The tokenizer and how it is used for each kind of row. Every method returns (ids, scored):
    token ids and per token whether it is a target (before the shift)."""

    def __init__(self, tok, mask_mode, keep=None):
        """keep: None (tokenise whole texts) or ("start" | "end", N): only the first (last)
        N + 1 tokens of an example are wanted, N of them kept and one to tell that it was cut
        (Builder.fit cuts it, as it would cut the whole)."""
        self.tok = tok
        self.keep = keep
        # the added tokens (specials such as <|im_end|>): a window must not cut one
        self.added = sorted({t for t in tok.get_added_vocab() if t}, key=len) if keep else []
        self.eos = tok.eos_token
        tmpl = tok.chat_template
        if isinstance(tmpl, dict):
            tmpl = tmpl.get("default") or next(iter(tmpl.values()), None)
        self.template = tmpl
        self.marked = bool(tmpl) and bool(GENERATION_MARK.search(tmpl))
        if mask_mode == "auto":
            mask_mode = "assistant-tokens" if self.marked else "prefix"
        self.mask_mode = mask_mode
        self.used_mask = None  # set once a messages row used it

    def render(self, msgs, where, gen):
        if not self.template:
            raise RowError("%s: the tokenizer has no chat template, so message lists cannot be "
                           "rendered" % where)
        try:
            return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        except Exception as e:  # a template's own raise_exception, or a Jinja error
            raise RowError("%s: the chat template failed: %s" % (where, e))

    def spans_scored(self, text, spans, special):
        """Tokenises text; a token is scored when its first character lies in one of the
        [start, end) spans."""
        return self.encode(text, special,
                           lambda s, e: e > s and any(a <= s < b for a, b in spans))

    def _enc(self, text, special, base, scored):
        """ids and scored flags of text, its offsets moved by base (text is text_full[base:])."""
        enc = self.tok(text, add_special_tokens=special, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        # a token the post-processor adds (BOS, EOS) has the empty offset (0, 0) at any base
        return ids, [scored(s + base, e + base) if e > s else scored(s, e)
                     for (s, e) in enc["offset_mapping"]]

    # The first window is this many characters per token wanted; a window is accepted when it
    # holds MARGIN tokens beyond those wanted and the window twice its size gives the same
    # wanted tokens, so the cut lies far from them (a token near a cut may merge differently).
    CHARS_PER_TOKEN = 8
    MARGIN = 16
    MIN_WINDOW = 1024

    def encode(self, text, special, scored):
        """(ids, scored flags) of text, scored(start, end) deciding each token by its character
        span in text. Without self.keep: the whole text. With it, only growing windows at the
        kept end (a prefix for "start", a suffix for "end"), doubled until two windows agree on
        the N + 1 tokens wanted, which are returned. A window's edge is never inside an added
        token such as <|im_end|> (it would be tokenised as its pieces, alike in both windows).
        The result equals tokenising the whole and cutting it (tests/frontend/test_hostile.py
        compares the two), at a cost bounded by N, not by the text."""
        if self.keep is None:
            return self._enc(text, special, 0, scored)
        side, n = self.keep
        want = n + 1
        k = max(self.MIN_WINDOW, self.CHARS_PER_TOKEN * (want + self.MARGIN))
        prev = None
        while 2 * k < len(text):
            if side == "start":
                base, end = 0, self.uncut(text, k, False)
            else:
                base, end = self.uncut(text, len(text) - k, True), len(text)
            ids, sc = self._enc(text[base:end], special, base, scored)
            if len(ids) > want + self.MARGIN:
                cur = (ids[:want], sc[:want]) if side == "start" else (ids[-want:], sc[-want:])
                if cur == prev:
                    return cur
                prev = cur
            k *= 2
        return self._enc(text, special, 0, scored)

    def uncut(self, text, c, down):
        """c moved off any added token that it would cut: to the token's start (down) or end."""
        for t in self.added:
            i = text.find(t, max(0, c - len(t) + 1), c + len(t) - 1)
            if i != -1 and i < c < i + len(t):
                return self.uncut(text, i if down else i + len(t), down)
        return c

    def messages(self, msgs, where):
        if not any(m["role"] == "assistant" for m in msgs):
            raise RowError("%s: the conversation has no assistant turn (nothing to train on)"
                           % where)
        self.used_mask = self.mask_mode
        if self.mask_mode == "assistant-tokens" and self.keep is not None:
            return self.marked_window(msgs, where)
        if self.mask_mode == "assistant-tokens":
            try:
                enc = self.tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True)
            except Exception as e:
                raise RowError("%s: the chat template failed: %s" % (where, e))
            ids = list(enc["input_ids"])
            return ids, [bool(m) for m in enc["assistant_masks"]]
        full = self.render(msgs, where, False)
        spans = []
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            before = self.render(msgs[:k], where, True) if k else ""
            upto = self.render(msgs[:k + 1], where, False)
            if not upto.startswith(before) or not full.startswith(upto):
                raise RowError("%s: the chat template does not render the conversation's "
                               "beginnings as beginnings of its rendering, so the assistant "
                               "tokens of turn %d cannot be found (use a template with "
                               "{%% generation %%} marks)" % (where, k))
            spans.append((len(before), len(upto)))
        return self.spans_scored(full, spans, False)

    def marked_window(self, msgs, where):
        """The assistant-tokens mask as transformers computes it (apply_chat_template(...,
        return_assistant_tokens_mask=True): the template's rendering with its generation
        spans, tokenised without special tokens, a token scored when it overlaps a span),
        through encode so that only the kept window is tokenised."""
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
            norm = [{k: v for k, v in m.items() if v is not None} for m in msgs]
            texts, spans = render_jinja_template(
                conversations=[norm], chat_template=self.template,
                return_assistant_tokens_mask=True, add_generation_prompt=False,
                **self.tok.special_tokens_map)
        except Exception as e:
            raise RowError("%s: the chat template failed: %s" % (where, e))
        spans = spans[0]
        return self.encode(texts[0], False,
                           lambda s, e: any(s < b and e > a for a, b in spans))

    def with_eos(self, s):
        return s + self.eos if self.eos and not s.endswith(self.eos) else s

    def text(self, s, where):
        if not s:
            raise RowError("%s: \"text\" is empty" % where)
        return self.encode(self.with_eos(s), True, lambda s, e: True)

    def prompt_completion(self, p, c, ckey, where):
        """p, c: side() results; ckey names the completion's key for messages."""
        if p[0] == "text" and c[0] == "text":
            if not c[1]:
                raise RowError("%s: \"%s\" is empty" % (where, ckey))
            return self.spans_scored(p[1] + self.with_eos(c[1]), [(len(p[1]), math.inf)], True)
        pm = p[1] if p[0] == "messages" else [{"role": "user", "content": p[1]}]
        if c[0] == "messages":
            cm = c[1]
        else:
            if not c[1].strip():
                raise RowError("%s: \"%s\" is an empty assistant turn" % (where, ckey))
            cm = [{"role": "assistant", "content": c[1]}]
        if not any(m["role"] == "assistant" for m in cm):
            raise RowError("%s: \"%s\" has no assistant turn" % (where, ckey))
        before = self.render(pm, where, True)
        full = self.render(pm + cm, where, False)
        if not full.startswith(before):
            raise RowError("%s: the chat template renders the prompt (with the generation "
                           "prompt) differently from the start of the whole conversation"
                           % where)
        return self.spans_scored(full, [(len(before), math.inf)], False)


# ------------------------------------------------------------------ examples

class Builder:
    """Collects examples: truncation, the label shift, the counts."""

    def __init__(self, max_len, truncate):
        self.max_len = max_len
        self.truncate = truncate
        self.ids, self.labels, self.offsets = [], [], [0]
        self.truncated = self.dropped = 0
        self.lengths = []

    def fit(self, ex, where):
        """(ids, scored) cut to max_len per --truncate, or None to drop; whether it was cut."""
        ids, scored = ex
        n = len(ids)
        if n <= self.max_len:
            return ex, False
        if self.truncate == "none":
            raise RowError("%s: the example is %d tokens, longer than --max-len %d (use "
                           "--truncate keep-start|keep-end|drop)" % (where, n, self.max_len))
        if self.truncate == "drop":
            return None, False
        if self.truncate == "keep-start":
            return (ids[:self.max_len], scored[:self.max_len]), True
        return (ids[n - self.max_len:], scored[n - self.max_len:]), True

    @staticmethod
    def shifted(ids, scored):
        """labels[t] = ids[t + 1] when token t + 1 is scored, else -100; the last is -100."""
        lab = [ids[t + 1] if scored[t + 1] else -100 for t in range(len(ids) - 1)]
        return lab + [-100]

    def prepare(self, examples, where):
        """Fits and shifts a row's examples (all or none are kept: a DPO pair stays a pair).
        Returns the list of (ids, labels), or None when the row is dropped."""
        out, cut = [], False
        for ex in examples:
            f, c = self.fit(ex, where)
            if f is None:
                self.dropped += 1
                return None
            lab = self.shifted(*f)
            if all(x == -100 for x in lab):
                self.dropped += 1  # nothing scored (e.g. the completion was cut away)
                return None
            cut |= c
            out.append((f[0], lab))
        self.truncated += cut
        return out

    def add(self, prepared):
        for ids, lab in prepared:
            self.ids.extend(ids)
            self.labels.extend(lab)
            self.offsets.append(len(self.ids))
            self.lengths.append(len(ids))


def read_rows(paths):
    """Yields (row, "FILE:LINE") for every non-blank line; invalid JSON and non-objects are
    errors."""
    for path in paths:
        try:
            f = open(path, encoding="utf-8")
        except OSError as e:
            raise Fail("cannot read %s: %s" % (path, e.strerror or e))
        with f:
            lineno = 0
            while True:
                lineno += 1
                where = "%s:%d" % (path, lineno)
                try:
                    line = f.readline()
                except UnicodeDecodeError as e:
                    raise RowError("%s: not UTF-8 text (%s)" % (where, e.reason))
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RowError("%s: invalid JSON: %s (column %d)" % (where, e.msg, e.colno))
                except ValueError as e:  # an integer of more digits than Python converts
                    raise RowError("%s: invalid JSON: %s" % (where, e))
                except RecursionError:
                    raise RowError("%s: invalid JSON: nested too deeply" % where)
                if not isinstance(row, dict):
                    raise RowError("%s: a row must be a JSON object, not %s"
                                   % (where, type(row).__name__))
                yield row, where


def sft_example(T, row, where):
    if "messages" in row:
        return T.messages(check_messages(row["messages"], "messages", where), where)
    if "prompt" in row or "completion" in row:
        return T.prompt_completion(side(row, "prompt", where), side(row, "completion", where),
                                   "completion", where)
    if "text" in row:
        return T.text(need_str(row, "text", where), where)
    raise RowError("%s: an sft row needs \"messages\", \"prompt\" and \"completion\", or "
                   "\"text\" (it has: %s)" % (where, ", ".join(sorted(row)) or "no keys"))


def group_key(row, where):
    """Rows with the same key form a GRPO group: the row's "group", else its prompt."""
    if "group" in row:
        g = row["group"]
        if not isinstance(g, (str, int)) or isinstance(g, bool):
            raise RowError("%s: \"group\" must be a string or an integer, not %s"
                           % (where, type(g).__name__))
        return "group:" + json.dumps(g)
    return "prompt:" + json.dumps(row["prompt"], sort_keys=True)


def reward_of(row, where):
    if "reward" not in row:
        raise RowError("%s: the row has no \"reward\" (keys: %s)" % (where, ", ".join(sorted(row))))
    r = row["reward"]
    try:
        x = float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else None
    except OverflowError:  # an integer beyond any float
        x = math.inf
    if x is None or not math.isfinite(x):
        raise RowError("%s: \"reward\" must be a finite number, not %.40s" % (where, json.dumps(r)))
    # stored as F32: a reward beyond float32 would be written as inf
    if abs(x) > FLT_MAX:
        raise RowError("%s: \"reward\" %.40s is outside float32's range (+-%.7g), in which the "
                       "file stores rewards" % (where, json.dumps(r), FLT_MAX))
    return x


def advantages(rewards, groups):
    """(r - mean) / (std + 1e-4) over each group, std Bessel-corrected (torch.std); a group of
    one has std NaN, taken as 0, so its advantage is 0."""
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    adv = np.zeros_like(rewards)
    for g in np.unique(groups):
        sel = groups == g
        r = rewards[sel]
        std = float(np.std(r, ddof=1)) if r.size > 1 else 0.0
        adv[sel] = (r - r.mean()) / (std + 1e-4)
    return adv


def grpo_rewards(a):
    """grpo, before any tokenising: every row's group and reward, and the advantages, refused
    (with the row) when a reward or an advantage is not a finite float32. Returns (keys,
    rewards, advantages), one each per row in input order."""
    keys, rewards, wheres = [], [], []
    for row, where in read_rows(a.inputs):
        side(row, "prompt", where)  # the group key may be the prompt
        keys.append(group_key(row, where))
        rewards.append(reward_of(row, where))
        wheres.append(where)
    if not keys:
        return keys, rewards, np.zeros(0)
    key_index = {}
    gid = np.array([key_index.setdefault(k, len(key_index)) for k in keys])
    with np.errstate(all="ignore"):
        adv = advantages(rewards, gid)
        bad = ~np.isfinite(adv.astype(np.float32))
    if bad.any():
        i = int(np.argmax(bad))
        raise RowError("%s: the row's advantage is %r, not a finite float32 (its group's rewards "
                       "are too far apart)" % (wheres[i], float(adv[i])))
    return keys, rewards, adv


def build(a, T, grpo=None):
    """grpo: grpo_rewards(a), read before the tokenizer was loaded (the group statistics use
    all of a group's rows, kept or not: a completion dropped for length still is a sample of
    the prompt's rewards)."""
    B = Builder(a.max_len, a.truncate)
    rows = 0
    if a.task == "grpo":
        keys, rewards, adv_all = grpo
    kept_rows = []
    for row, where in read_rows(a.inputs):
        rows += 1
        try:
            prepared = row_examples(a, T, B, row, where)
        except Fail:
            raise
        except Exception as e:  # the tokenizer's own failure on this row's text
            raise RowError("%s: %s" % (where, first_line(e)))
        if a.task == "grpo" and prepared is not None:
            kept_rows.append(rows - 1)
        if prepared is not None:
            B.add(prepared)
    if a.task == "grpo" and rows != len(keys):
        raise Fail("the input changed between grpo's two readings (%d rows, then %d): give "
                   "regular files" % (len(keys), rows))
    if rows == 0:
        raise Fail("no rows in %s" % ", ".join(a.inputs))
    if len(B.lengths) == 0:
        raise Fail("no example left: all %d rows were dropped" % rows)
    extra = {}
    if a.task == "grpo":
        key_index = {}
        gid_all = np.array([key_index.setdefault(k, len(key_index)) for k in keys])
        # groups renumbered over the kept examples, in order of first appearance
        renum = {}
        gid = np.array([renum.setdefault(int(gid_all[i]), len(renum)) for i in kept_rows],
                       dtype=np.int64)
        extra = {"advantages": adv_all[kept_rows].astype(np.float32), "group": gid,
                 "reward": np.asarray(rewards, dtype=np.float64)[kept_rows].astype(np.float32)}
    return B, rows, extra


def row_examples(a, T, B, row, where):
    """One row's examples, fitted (Builder.prepare), or None when it is dropped."""
    if a.task == "sft":
        return B.prepare([sft_example(T, row, where)], where)
    p = side(row, "prompt", where)
    if a.task == "dpo":
        ch = side(row, "chosen", where)
        rj = side(row, "rejected", where)
        return B.prepare([T.prompt_completion(p, ch, "chosen", where),
                          T.prompt_completion(p, rj, "rejected", where)], where)
    c = side(row, "completion", where)
    return B.prepare([T.prompt_completion(p, c, "completion", where)], where)


def write(a, T, B, extra, tmp):
    from safetensors.numpy import save_file
    ids = np.asarray(B.ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= len(T.tok) or ids.max() > 2**31 - 1):
        raise Fail("a token id is outside [0, %d): the tokenizer's vocabulary" % len(T.tok))
    labels = np.asarray(B.labels, dtype=np.int64)
    tensors = {"input_ids": ids.astype(np.int32), "labels": labels.astype(np.int32),
               "offsets": np.asarray(B.offsets, dtype=np.int64)}
    tensors.update(extra)
    eos = T.tok.eos_token_id
    pad = T.tok.pad_token_id if T.tok.pad_token_id is not None else eos
    meta = {
        "format": "sbp-dataset", "version": "1", "task": a.task, "max_len": str(a.max_len),
        "eos_id": str(eos), "pad_id": str(pad), "vocab_size": str(len(T.tok)),
        "tokenizer": str(T.tok.name_or_path), "truncate": a.truncate,
        "mask": {"assistant-tokens": "assistant_tokens_mask", "prefix": "prefix",
                 None: "none"}[T.used_mask],
        "examples": str(len(B.lengths)), "tokens": str(ids.size),
        "scored_tokens": str(int((labels != -100).sum())),
        "truncated": str(B.truncated), "dropped": str(B.dropped),
        "sources": ";".join(a.inputs), "producer": "%s %s" % (PROG, __version__),
    }
    save_file(tensors, tmp, metadata=meta)
    commit(tmp, a.output)
    return meta


ROW_FORMATS = """row formats (one JSON object per line):
  sft   {"messages": [{"role": ..., "content": ...}, ...]}   assistant tokens scored
        {"prompt": ..., "completion": ...}                   the completion scored
        {"text": ...}                                        text + EOS, every token scored
  dpo   {"prompt": ..., "chosen": ..., "rejected": ...}      strings or messages lists
  grpo  {"prompt": ..., "completion": ..., "reward": R [, "group": G]}
        advantage = (R - mean) / (std + 1e-4) over the group (the rows with the same prompt,
        or the same "group"), std as torch.std; a group of one row gets advantage 0"""


def parse_args(argv):
    ap = Parser(prog=PROG, description="Tokenise JSONL rows (TRL's formats) into the dataset "
                "file sbp-train reads (docs/dataset-format.md).", epilog=ROW_FORMATS,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", metavar="IN.jsonl",
                    help="JSONL files, one row per line (the formats below); read in order")
    ap.add_argument("--tokenizer", required=True, metavar="DIR",
                    help="a tokenizer folder (AutoTokenizer.from_pretrained)")
    ap.add_argument("--task", required=True, choices=["sft", "dpo", "grpo"],
                    help="what the rows are for, and so which row formats are accepted")
    ap.add_argument("--max-len", required=True, type=int, metavar="N",
                    help="no example may be longer (see --truncate)")
    ap.add_argument("-o", "--output", required=True, metavar="DATA.safetensors")
    ap.add_argument("--truncate", choices=["keep-start", "keep-end", "drop"], default="none",
                    help="what to do with an example longer than --max-len: keep its first or "
                    "last N tokens, or leave it out (default, when not given: refuse the row)")
    ap.add_argument("--mask", choices=["auto", "assistant-tokens", "prefix"], default="auto",
                    help="how assistant tokens of messages rows are found: the template's "
                    "{%% generation %%} marks or rendering each prefix (default: the marks "
                    "when the template has them)")
    return ap.parse_args(argv)


def check_args(a):
    """What can be refused before anything is loaded: the numbers, the inputs, the output."""
    if a.max_len < MIN_LEN or a.max_len > INT32_MAX:
        raise Fail("--max-len %d: it must be from %d (an example needs two tokens) to %d (the "
                   "largest max_len sbp-train reads)" % (a.max_len, MIN_LEN, INT32_MAX))
    check_inputs(a.inputs)
    if not os.path.isdir(a.tokenizer):
        raise Fail("--tokenizer %s is not a folder" % a.tokenizer)
    check_output(a.output, files=a.inputs, folders=[("tokenizer folder", a.tokenizer)],
                 ours=(is_sbp_dataset, "a dataset file of sbp-prepare (safetensors, metadata "
                       "format sbp-dataset)"))


def check_tokenizer(a, tok):
    """The tokenizer's numbers against sbp-train's reader (see INT32_MAX above)."""
    if tok.eos_token_id is None:
        raise Fail("the tokenizer in %s has no eos token" % a.tokenizer)
    v = len(tok)
    if not 1 <= v <= INT32_MAX:
        raise Fail("the tokenizer in %s has %d ids; sbp-train reads vocabularies of 1 to %d"
                   % (a.tokenizer, v, INT32_MAX))
    for name, i in (("eos", tok.eos_token_id), ("pad", tok.pad_token_id)):
        if i is not None and not 0 <= i < v:
            raise Fail("the tokenizer in %s has %s id %d, outside its %d ids"
                       % (a.tokenizer, name, i, v))


def main(argv=None):
    a = parse_args(argv)
    tmp = None
    try:
        check_args(a)
        tmp = reserve(a.output)
        grpo = grpo_rewards(a) if a.task == "grpo" else None
        import transformers
        transformers.utils.logging.set_verbosity_error()
        try:
            tok = transformers.AutoTokenizer.from_pretrained(a.tokenizer)
        except Exception as e:
            raise Fail("cannot load the tokenizer from %s: %s" % (a.tokenizer, e))
        check_tokenizer(a, tok)
        # what --truncate keeps decides which end of a text is tokenised (drop: a prefix tells
        # whether the example is longer than --max-len); without it, the whole text
        keep = {"keep-start": "start", "keep-end": "end", "drop": "start"}.get(a.truncate)
        T = Tokenising(tok, a.mask, (keep, a.max_len) if keep else None)
        if a.mask == "assistant-tokens" and not T.marked:
            raise Fail("--mask assistant-tokens: the chat template of %s has no "
                       "{%% generation %%} marks (use --mask prefix)" % a.tokenizer)
        B, rows, extra = build(a, T, grpo)
        meta = write(a, T, B, extra, tmp)
        tmp = None
    except Fail as e:
        die(PROG, e)
    except Exception as e:  # a library's failure outside the row checks: still one line
        die(PROG, first_line(e))
    finally:
        discard(tmp)
    L = np.asarray(B.lengths)
    print("%s: %s: %d rows -> %d examples (%s), %s tokens, %s scored" % (
        PROG, a.output, rows, len(L), a.task, meta["tokens"], meta["scored_tokens"]))
    print("%s: lengths min %d median %g max %d (--max-len %d); truncated %d, dropped %d "
          "(--truncate %s); assistant tokens: %s" % (
              PROG, L.min(), float(np.median(L)), L.max(), a.max_len, B.truncated, B.dropped,
              a.truncate, meta["mask"]))
    if a.task == "grpo" and not np.any(extra["advantages"]):
        # a valid file, but sbp-train refuses to train on it (train_run.c): said here, where
        # the rows can still be changed
        print("%s: every advantage is 0 (each group has one row, or equal rewards): sbp-train "
              "will not train GRPO on it (only --compute-logps reads it)" % PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
