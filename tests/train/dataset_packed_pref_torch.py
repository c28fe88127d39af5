#!/usr/bin/env python3
"""dataset_packed_pref_torch.py — packed DPO and GRPO datasets (sbpc --packed --per-document,
sbp-train --dataset --pack) against PyTorch float64 loops over the same documents.

    dataset_packed_pref_torch.py SBP_TRAIN SBPC WORK dpo|grpo-sequence|grpo-token
                                 (python with torch and transformers: .venv-hf)

The Llama fixture (tests/fixtures/hf/llama_dynamo_scoped.onnx) at T = 48, compiled with sbpc
--packed --per-document. A per-document step's unit is the document: each example of a packed
row is scored on its own (its own positions and attention, its own reference log-prob or
advantage), exactly as if it were alone in a row.

dpo: 10 pairs (a shared prompt, not scored, two answers) and B = 2: each step packs whole pairs
into its row pair in lockstep (pair m's chosen answer is document m of row 0, its rejected one
document m of row 1; the first pair that does not fit in both rows starts the next row pair),
shuffled per pass (--shuffle-seed). The reference rebuilds that packing independently from the
rule, and trains transformers' model in float64 on the same pairs in the same order: each
document alone through the model, the reference log-probs from a frozen copy of the initial
model, loss = the mean over the step's pairs of -log sigmoid(beta ((logp_c - ref_c) - (logp_r -
ref_r))), torch.optim.AdamW (lr 1e-2, weight decay 0.01). Every step's loss within 1e-5
relative, its rewards (chosen, rejected, margin: means over the pairs) within 1e-5 relative
(absolute floor 1e-6), the final weights within 1e-4 per tensor. The same with --grad-accum 2
(two row pairs a step) against the loop with two row pairs a step. A run stopped at step 3 and
resumed reuses the stored reference log-probs and prints the uninterrupted run's losses.
grpo-sequence / grpo-token: 9 rollouts with advantages, B = 2 rows packed next-fit, beta 0.04,
epsilon 0.2, on-policy: per scored token ratio = exp(logp - logp.detach()), l = -min(ratio A,
clip(ratio) A) + beta (exp(ref - logp) - (ref - logp) - 1) with the document's own A; the loss
is the mean over the step's documents of each one's mean over its tokens (sequence), or the sum
of the step's token losses over its scored tokens (token). Losses 1e-5, weights 1e-4.
Refused in one line: a packed DPO step without --per-document on a dataset, and a per-document
step given --input-ids. Without torch or transformers: SKIPPED, exit 77.
"""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset_ref as dr  # noqa: E402
from torch_ref import LLAMA as MODEL, run, step_losses, llama_float64, check_losses, \
    check_weights  # noqa: E402

T, V = 48, 96
LR, WD, SEED, EPS = 1e-2, 0.01, 11, 0.2
REWARD_KEYS = ("rewards_chosen", "rewards_rejected", "rewards_margin")


def pairs():
    import random
    rnd = random.Random(20261204)
    out = []
    for _ in range(10):
        prompt = [rnd.randrange(3, V) for _ in range(rnd.randint(3, 8))]
        for _side in range(2):
            ans = [rnd.randrange(3, V) for _ in range(rnd.randint(2, 10))]
            out.append(dr.example(prompt + ans, len(prompt)))
    return out


def rollouts():
    import random
    rnd = random.Random(20261206)
    exs, adv = [], []
    for _ in range(9):
        prompt = [rnd.randrange(3, V) for _ in range(rnd.randint(3, 9))]
        ans = [rnd.randrange(3, V) for _ in range(rnd.randint(2, 12))]
        exs.append(dr.example(prompt + ans, len(prompt)))
        adv.append(rnd.uniform(-1.5, 1.5))
    return exs, adv


def units(n, steps):
    """The visiting order of n units over enough passes (sbp-train's, docs/data.md)."""
    return [u for ep in range(steps + 2) for u in dr.order(n, SEED, ep)]


def pack_pairs(exs, n_steps, row_pairs):
    """Each step's pairs: `row_pairs` row pairs a step, pairs taken in lockstep next-fit."""
    order, at, out = units(len(exs) // 2, n_steps * 4), 0, []
    for _ in range(n_steps):
        step = []
        for _ in range(row_pairs):
            used = [0, 0]
            while True:
                p = order[at]
                lc, lr = len(exs[2 * p][0]), len(exs[2 * p + 1][0])
                if used != [0, 0] and (used[0] + lc > T or used[1] + lr > T):
                    break
                step.append(p)
                at += 1
                used = [used[0] + lc, used[1] + lr]
                if T in used:
                    break
        out.append(step)
    return out


def pack_rows(exs, n_steps, rows):
    """Each step's examples: `rows` rows a step, next-fit."""
    order, at, out = units(len(exs), n_steps * 4), 0, []
    for _ in range(n_steps):
        step = []
        for _ in range(rows):
            used = 0
            while True:
                e = order[at]
                if used and used + len(exs[e][0]) > T:
                    break
                step.append(e)
                at += 1
                used += len(exs[e][0])
                if used == T:
                    break
        out.append(step)
    return out


def token_logps(torch, model, ids, labels):
    lab = torch.tensor(labels)
    lp = torch.log_softmax(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0], -1)
    m = (lab != dr.IGNORE).nonzero().squeeze(1)
    return lp[m, lab[m]]


def logged(log_path, n):
    recs = [json.loads(x) for x in open(log_path) if x.strip()]
    if len(recs) != n:
        sys.exit("FAIL: %s has %d records, %d wanted" % (log_path, len(recs), n))
    return recs


def check_rewards(tag, recs, want):
    worst = 0.0
    for rec, w in zip(recs, want):
        for k in REWARD_KEYS:
            if k not in rec:
                sys.exit("FAIL: %s: step %d logged no %s: %r" % (tag, rec["step"], k, rec))
            d = abs(rec[k] - w[k]) / max(abs(w[k]), 0.1)
            worst = max(worst, d)
            if not d <= 1e-5:
                sys.exit("FAIL: %s: step %d: %s %.9g, float64 PyTorch %.9g"
                         % (tag, rec["step"], k, rec[k], w[k]))
    return worst


def refused(cmd, text):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 1 or text not in p.stderr or p.stderr.count("error:") != 1:
        sys.exit("FAIL: not refused in one line (exit %d, wanted 1 and %r):\n%s%s"
                 % (p.returncode, text, p.stdout, p.stderr))


def dpo(torch, sbp_train, sbpc, work):
    BETA, STEPS = 0.1, 6
    exs = pairs()
    data = os.path.join(work, "pairs.safetensors")
    dr.write_dataset(data, exs, task="dpo", vocab=V, max_len=T)
    step = os.path.join(work, "dpo.so")
    run([sbpc, MODEL, "--batch", "2", "--seq-len", str(T), "--objective", "dpo", "--beta",
         str(BETA), "--packed", "--per-document", "-o", step])
    init = os.path.join(work, "init.safetensors")
    run([sbp_train, step, "--model", MODEL, "--dataset", data, "--pack", "--steps", "1",
         "--lr", "0", "--save-safetensors", init])
    common = ["--model", MODEL, "--dataset", data, "--pack", "--lr", str(LR), "--weight-decay",
              str(WD), "--shuffle-seed", str(SEED), "--threads", "2"]
    final, log = os.path.join(work, "final.safetensors"), os.path.join(work, "dpo.jsonl")
    out = run([sbp_train, step] + common + ["--steps", str(STEPS), "--save-safetensors", final,
                                            "--log", log])
    got, recs = step_losses(out), logged(log, STEPS)
    final2, log2 = os.path.join(work, "final_accum.safetensors"), os.path.join(work, "a.jsonl")
    got2 = step_losses(run([sbp_train, step] + common + ["--steps", str(STEPS), "--grad-accum",
                                                         "2", "--save-safetensors", final2,
                                                         "--log", log2]))
    recs2 = logged(log2, STEPS)
    # stopped and resumed: the stored reference log-probs reused, the same losses
    ck = os.path.join(work, "ck")
    subprocess.run(["rm", "-rf", ck])
    run([sbp_train, step] + common + ["--steps", "3", "--checkpoint-dir", ck])
    out3 = run([sbp_train, step] + common + ["--steps", str(STEPS), "--resume", ck])
    if "note: reusing the reference log-probs of" not in out3:
        sys.exit("FAIL: the resumed run did not reuse the reference log-probs:\n" + out3)
    if step_losses(out3) != got[3:]:
        sys.exit("FAIL: resumed losses %s, the run's %s" % (step_losses(out3), got[3:]))

    ref_model = llama_float64(init)
    with torch.no_grad():
        ref = [float(token_logps(torch, ref_model, *e).sum()) for e in exs]

    def loop(row_pairs):
        model = llama_float64(init)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=WD)
        want, rewards = [], []
        for step_pairs in pack_pairs(exs, STEPS, row_pairs):
            opt.zero_grad()
            total, cs, rs = 0, [], []
            for p in step_pairs:
                rc = BETA * (token_logps(torch, model, *exs[2 * p]).sum() - ref[2 * p])
                rr = BETA * (token_logps(torch, model, *exs[2 * p + 1]).sum() - ref[2 * p + 1])
                cs.append(float(rc.detach()))
                rs.append(float(rr.detach()))
                total = total - torch.nn.functional.logsigmoid(rc - rr)
            loss = total / len(step_pairs)
            loss.backward()
            opt.step()
            want.append(float(loss.detach()))
            n = len(cs)
            rewards.append({"rewards_chosen": sum(cs) / n, "rewards_rejected": sum(rs) / n,
                            "rewards_margin": sum(c - r for c, r in zip(cs, rs)) / n})
        return model, want, rewards

    packs = [len(s) for s in pack_pairs(exs, STEPS, 1)]
    if max(packs) < 2:
        sys.exit("FAIL: the test's pairs never pack two to a row pair: %s" % packs)
    model, want, rw = loop(1)
    lw = check_losses("dpo packed", got, want)
    ww = check_weights("dpo packed", final, model)
    rwo = check_rewards("dpo packed", recs, rw)
    model2, want2, rw2 = loop(2)
    lw2 = check_losses("dpo packed --grad-accum 2", got2, want2)
    ww2 = check_weights("dpo packed --grad-accum 2", final2, model2)
    rwo2 = check_rewards("dpo packed --grad-accum 2", recs2, rw2)
    # hostile: a packed DPO step that sums its rows, on a dataset; a per-document step on .npy
    rowstep = os.path.join(work, "dpo_rows.so")
    run([sbpc, MODEL, "--batch", "2", "--seq-len", str(T), "--objective", "dpo", "--packed",
         "-o", rowstep])
    refused([sbp_train, rowstep, "--model", MODEL, "--dataset", data, "--pack", "--steps", "1"],
            "compile the step with sbpc --packed --per-document")
    print("dpo packed per document: %d steps, pairs per row pair %s; losses within %.2e of "
          "float64 PyTorch, final weights within %.2e, rewards within %.2e; --grad-accum 2: "
          "%.2e, %.2e, %.2e; resumed at step 3: the same losses"
          % (STEPS, packs, lw, ww, rwo, lw2, ww2, rwo2))


def grpo(torch, sbp_train, sbpc, work, norm):
    BETA, STEPS, B = 0.04, 5, 2
    exs, adv = rollouts()
    data = os.path.join(work, "rollouts.safetensors")
    dr.write_dataset(data, exs, task="grpo", vocab=V, max_len=T,
                     tensors={"advantages": ("F32", [len(adv)],
                                             struct.pack("<%df" % len(adv), *adv))})
    step = os.path.join(work, "grpo_%s.so" % norm)
    run([sbpc, MODEL, "--batch", str(B), "--seq-len", str(T), "--objective", "grpo", "--beta",
         str(BETA), "--epsilon", str(EPS), "--grpo-norm", norm, "--packed", "--per-document",
         "-o", step])
    init = os.path.join(work, "init_%s.safetensors" % norm)
    run([sbp_train, step, "--model", MODEL, "--dataset", data, "--pack", "--steps", "1",
         "--lr", "0", "--save-safetensors", init])
    final, log = os.path.join(work, "final_%s.safetensors" % norm), os.path.join(work, "g.jsonl")
    run([sbp_train, step, "--model", MODEL, "--dataset", data, "--pack", "--steps", str(STEPS),
         "--lr", str(LR), "--weight-decay", str(WD), "--shuffle-seed", str(SEED), "--threads",
         "2", "--save-safetensors", final, "--log", log])
    got = [r["loss"] for r in logged(log, STEPS)]  # full precision (GRPO losses are small)
    ref_model = llama_float64(init)
    with torch.no_grad():
        ref = [token_logps(torch, ref_model, *e) for e in exs]
    model = llama_float64(init)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=WD)
    want, docs = [], []
    for step_exs in pack_rows(exs, STEPS, B):
        opt.zero_grad()
        total, scored = 0, 0
        for e in step_exs:
            lp = token_logps(torch, model, *exs[e])
            ratio = torch.exp(lp - lp.detach())
            a = adv[e]
            pg = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - EPS, 1 + EPS) * a)
            d = ref[e] - lp
            lt = pg + BETA * (torch.exp(d) - d - 1)
            total = total + (lt.sum() / len(lp) if norm == "sequence" else lt.sum())
            scored += len(lp)
        loss = total / (len(step_exs) if norm == "sequence" else scored)
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
        docs.append(len(step_exs))
    if max(docs) <= B:
        sys.exit("FAIL: the test's rollouts never pack two to a row: %s" % docs)
    lw = check_losses("grpo packed " + norm, got, want)
    ww = check_weights("grpo packed " + norm, final, model)
    import numpy as np
    ids, lab = os.path.join(work, "ids.npy"), os.path.join(work, "labels.npy")
    np.save(ids, np.full((B, T), 5, dtype=np.int32))
    np.save(lab, np.full((B, T), 7, dtype=np.int32))
    docs_npy = os.path.join(work, "docs.npy")
    np.save(docs_npy, np.zeros((B, T), dtype=np.int32))
    refused([sbp_train, step, "--model", MODEL, "--input-ids", ids, "--labels", lab,
             "--doc-ids", docs_npy, "--advantages", ids, "--steps", "1"], "train it with --dataset")
    print("grpo packed per document (%s normalisation): %d steps, documents per step %s; "
          "losses within %.2e of float64 PyTorch, final weights within %.2e"
          % (norm, STEPS, docs, lw, ww))


def main():
    if len(sys.argv) != 5 or sys.argv[4] not in ("dpo", "grpo-sequence", "grpo-token"):
        sys.exit(__doc__)
    sbp_train, sbpc, work, mode = sys.argv[1:]
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s (dataset_packed_pref_torch.py needs torch and transformers); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    os.makedirs(work, exist_ok=True)
    if mode == "dpo":
        dpo(torch, sbp_train, sbpc, work)
    else:
        grpo(torch, sbp_train, sbpc, work, mode.split("-")[1])
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
