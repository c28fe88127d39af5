#!/usr/bin/env python3
"""dataset_grpo_torch.py — sbp-train --dataset on a GRPO step against a PyTorch float64 loop.

    dataset_grpo_torch.py SBP_TRAIN SBPC WORK [sequence|token]   (python with torch and
                                                                  transformers: .venv-hf)

The Llama fixture (tests/fixtures/hf/llama_dynamo_scoped.onnx) compiled with sbpc --objective
grpo --beta 0.04 --epsilon 0.2 --grpo-norm NORM (the last argument, default sequence) at B = 2. A grpo dataset of 6 rollouts (a
prompt, not scored, and a completion) with their advantages is written by dataset_ref.py's
writer; sbp-train computes every scored token's reference log-probability itself before step 1
(the model's initial weights, sbp_step_logps), takes the advantages from the file and the old
log-probs on-policy, and trains 6 AdamW steps, shuffled per pass. The reference is transformers'
own model in float64: per scored token ratio = exp(logp - old) with old = logp detached,
l = -min(ratio A, clip(ratio, 1 - eps, 1 + eps) A) + beta (exp(ref - logp) - (ref - logp) - 1),
the loss (--grpo-norm sequence) the mean over rows of each row's mean over its scored tokens,
or (token) the sum of every token loss of the batch over the batch's scored tokens (its two rows
together: a longer completion weighs more), the rows in the order dataset_ref.py computes, torch.optim.AdamW (lr 1e-2, weight decay 0.01). Every step's loss
within 1e-5 relative, the final weights within 1e-4 per tensor; --compute-logps writes every
token's reference log-prob (within 1e-5 of float64 PyTorch's). Off-policy: that file given as
--old-logps FILE and as --ref-logps FILE to a run from the initial weights (the rollouts'
policy is the initial model, updated 6 times on them), against the same loop with ratio = exp(logp - old)
(the same bounds). SKIPPED (exit 77) without torch.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset_ref as dr  # noqa: E402
from torch_ref import LLAMA as MODEL, run, step_losses, llama_float64, check_losses, \
    check_weights  # noqa: E402

B, T, V = 2, 32, 96
STEPS, LR, WD, SEED, BETA, EPS = 6, 1e-2, 0.01, 5, 0.04, 0.2


def rollouts():
    import random
    rnd = random.Random(20261205)
    exs, adv = [], []
    for _ in range(6):
        prompt = [rnd.randrange(3, V) for _ in range(rnd.randint(3, 9))]
        ans = [rnd.randrange(3, V) for _ in range(rnd.randint(2, 14))]
        exs.append(dr.example(prompt + ans, len(prompt)))
        adv.append(rnd.uniform(-1.5, 1.5))
    return exs, adv



def token_logps(torch, model, ids, labels):
    lab = torch.tensor(labels)
    lp = torch.log_softmax(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0], -1)
    m = (lab != dr.IGNORE).nonzero().squeeze(1)
    return m, lp[m, lab[m]]


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["sequence"], ["token"]):
        sys.exit(__doc__)
    sbp_train, sbpc, work = sys.argv[1:4]
    norm = sys.argv[4] if len(sys.argv) == 5 else "sequence"
    try:
        import copy
        import torch
        import transformers  # noqa: F401
        from safetensors.torch import load_file
    except ImportError as e:
        print("SKIPPED: %s (dataset_grpo_torch.py needs torch, transformers and safetensors); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    os.makedirs(work, exist_ok=True)
    exs, adv = rollouts()
    data = os.path.join(work, "rollouts.safetensors")
    dr.write_dataset(data, exs, task="grpo", vocab=V, max_len=T,
                     tensors={"advantages": ("F32", [len(adv)],
                                             struct.pack("<%df" % len(adv), *adv))})
    step = os.path.join(work, "grpo.so")
    run([sbpc, MODEL, "--batch", str(B), "--seq-len", str(T), "--objective", "grpo", "--beta",
         str(BETA), "--epsilon", str(EPS), "--grpo-norm", norm, "-o", step])
    init = os.path.join(work, "init.safetensors")
    run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", "1", "--lr", "0",
         "--save-safetensors", init])
    final = os.path.join(work, "final.safetensors")
    out = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", str(STEPS),
               "--lr", str(LR), "--weight-decay", str(WD), "--shuffle-seed", str(SEED),
               "--threads", "2", "--save-safetensors", final])
    got = step_losses(out)
    logps_file = os.path.join(work, "ref.safetensors")
    run([sbp_train, step, "--model", MODEL, "--dataset", data, "--compute-logps", logps_file])
    # off-policy, as PPO-style updates on rollouts sampled once: the initial model's token
    # log-probs (the file just written) as the old policy (--old-logps FILE) and as the
    # reference (--ref-logps FILE); the ratio leaves 1 from step 2 on, and clips
    old_file = logps_file
    final2 = os.path.join(work, "final_off_policy.safetensors")
    out2 = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", str(STEPS),
                "--lr", str(LR), "--weight-decay", str(WD), "--shuffle-seed", str(SEED),
                "--threads", "2", "--ref-logps", logps_file, "--old-logps", old_file,
                "--save-safetensors", final2, "--log", os.path.join(work, "off.jsonl")])
    if "note: --old-logps: the token log-probs of %s" % old_file not in out2 or \
            "note: --ref-logps: the reference log-probs of %s" % logps_file not in out2 or \
            "computed in" in out2:
        sys.exit("FAIL: --ref-logps / --old-logps FILE were not read:\n" + out2)
    # from --log, at full precision: the printed line's 6 decimals are 2e-5 of a loss of 0.03
    import json
    got2 = [json.loads(x)["loss"] for x in open(os.path.join(work, "off.jsonl")) if x.strip()]

    model = llama_float64(init)
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        ref = [token_logps(torch, ref_model, *e)[1] for e in exs]
    written = load_file(logps_file)["token_logps"].double()
    worst_ref, at = 0.0, 0
    for e, r in zip(exs, ref):
        m, _ = token_logps(torch, ref_model, *e)
        w = written[at:at + len(e[0])][m]
        worst_ref = max(worst_ref, float((w - r).norm() / r.norm()))
        at += len(e[0])
    if worst_ref > 1e-5:
        sys.exit("FAIL: --compute-logps's tokens are %.3g relative off float64 PyTorch" % worst_ref)
    def grpo_loop(old):
        """STEPS float64 AdamW steps from the initial weights; old: per example the old
        policy's token logps, or None (on-policy: the current ones, detached)."""
        model = llama_float64(init)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=WD)
        order = [i for ep in range(STEPS) for i in dr.order(len(exs), SEED, ep)]
        want = []
        for s in range(STEPS):
            opt.zero_grad()
            total, scored = 0, 0
            for i in order[s * B:(s + 1) * B]:
                _, lp = token_logps(torch, model, *exs[i])
                ratio = torch.exp(lp - (lp.detach() if old is None else old[i]))
                a = adv[i]
                pg = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - EPS, 1 + EPS) * a)
                d = ref[i] - lp
                l_tok = pg + BETA * (torch.exp(d) - d - 1)
                if norm == "sequence":
                    total = total + l_tok.sum() / len(lp)
                else:
                    total = total + l_tok.sum()
                scored += len(lp)
            loss = total / (B if norm == "sequence" else scored)
            loss.backward()
            opt.step()
            want.append(float(loss.detach()))
        return model, want

    model, want = grpo_loop(None)
    model2, want2 = grpo_loop(ref)
    worst2 = check_losses("grpo %s --old-logps FILE" % norm, got2, want2)
    wworst2 = check_weights("grpo %s --old-logps FILE" % norm, final2, model2)
    worst = check_losses("grpo " + norm, got, want)
    wworst = check_weights("grpo " + norm, final, model)
    print("grpo (%s normalisation): %d steps over 6 shuffled rollouts, losses within %.2e of float64 PyTorch, final "
          "weights within %.2e, reference token log-probs within %.2e" % (norm, STEPS, worst,
                                                                          wworst, worst_ref))
    print("grpo (%s) off-policy, --old-logps FILE and --ref-logps FILE (the initial model's): "
          "losses within %.2e, final weights within %.2e" % (norm, worst2, wworst2))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
