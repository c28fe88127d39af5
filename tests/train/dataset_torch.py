#!/usr/bin/env python3
"""dataset_torch.py — sbp-train --dataset against a PyTorch float64 training loop.

    dataset_torch.py SBP_TRAIN SBPC WORK     (python with torch and transformers: .venv-hf)

A real model: the Llama fixture (tests/fixtures/hf/llama_dynamo_scoped.onnx, a dynamo export of
transformers' LlamaForCausalLM from gen_hf.py's config). A dataset of 14 examples of 5 to 32
tokens (prompts not scored) is written by dataset_ref.py's writer; sbp-train trains 16 AdamW
steps of 2 rows over it, shuffled (--shuffle-seed), so two and a half passes in three orders,
once one example a row (a plain step) and once packed next-fit (a step compiled --packed). The
reference is transformers' own model in float64 with torch.optim.AdamW (lr 1e-2, betas
0.9/0.999, eps 1e-8, weight decay 0.01), fed the rows dataset_ref.py computes independently: a
packed row is run document by document (each from position 0, attending within itself), which
is what a packed step computes; the loss is the batch's mean cross-entropy over its scored
labels. Every step's loss must be within 1e-5 relative of the reference's, and the final
weights (sbp-train --save-safetensors, transformers' names) within 1e-4 per tensor
(|Δ| / |ref|). The starting weights come from the ONNX file itself (a --lr 0 step written with
--save-safetensors, loaded strictly). Without torch or transformers: SKIPPED, exit 77.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset_ref as dr  # noqa: E402  (the dataset writer and the reference rows)
from torch_ref import LLAMA as MODEL, run, step_losses, llama_float64, check_losses, \
    check_weights  # noqa: E402

B, T, V = 2, 32, 96
STEPS, LR, WD, SEED = 16, 1e-2, 0.01, 3


def examples():
    import random
    rnd = random.Random(20261203)
    out = []
    for i in range(14):
        n = rnd.randint(5, T)
        ids = [rnd.randrange(3, V) for _ in range(n)]
        out.append(dr.example(ids, rnd.randint(1, n - 1)))
    return out



def reference(torch, model, exs, packed):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=WD)
    rows = dr.rows(exs, SEED, packed, STEPS * B, T=T)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        batch = rows[s * B:(s + 1) * B]
        total, scored = 0, 0
        for ids, labels, docs in batch:
            # the row's documents (an unpacked row: one, its padding never scored)
            spans, start = [], 0
            for t in range(1, T + 1):
                if t == T or (packed and docs[t] != docs[start]):
                    spans.append((start, t))
                    start = t
            for a, b in spans:
                lab = torch.tensor(labels[a:b])
                if not (lab != dr.IGNORE).any():
                    continue
                x = torch.tensor([ids[a:b]])
                logits = model(input_ids=x, use_cache=False).logits[0]
                total = total + torch.nn.functional.cross_entropy(
                    logits, lab, ignore_index=dr.IGNORE, reduction="sum")
                scored += int((lab != dr.IGNORE).sum())
        loss = total / scored
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sbp_train, sbpc, work = sys.argv[1:]
    try:
        import torch
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s (dataset_torch.py needs torch, transformers and safetensors); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    os.makedirs(work, exist_ok=True)
    exs = examples()
    data = os.path.join(work, "data.safetensors")
    dr.write_dataset(data, exs, vocab=V, max_len=T)
    for packed in (False, True):
        tag = "packed" if packed else "plain"
        step = os.path.join(work, tag + ".so")
        run([sbpc, MODEL, "--batch", str(B), "--seq-len", str(T), "-o", step]
            + (["--packed"] if packed else []))
        extra = ["--pack"] if packed else []
        init = os.path.join(work, tag + "_init.safetensors")
        run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", "1", "--lr", "0",
             "--save-safetensors", init] + extra)
        final = os.path.join(work, tag + "_final.safetensors")
        out = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", str(STEPS),
                   "--lr", str(LR), "--weight-decay", str(WD), "--shuffle-seed", str(SEED),
                   "--threads", "2", "--save-safetensors", final] + extra)
        got = step_losses(out)
        model = llama_float64(init)
        want = reference(torch, model, exs, packed)
        worst = check_losses(tag, got, want)
        wworst = check_weights(tag, final, model)
        print("%s: %d steps, losses within %.2e of float64 PyTorch, final weights within %.2e"
              % (tag, STEPS, worst, wworst))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
