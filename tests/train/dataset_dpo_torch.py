#!/usr/bin/env python3
"""dataset_dpo_torch.py — sbp-train --dataset on a DPO step against a PyTorch float64 DPO loop.

    dataset_dpo_torch.py SBP_TRAIN SBPC WORK     (python with torch and transformers: .venv-hf)

The Llama fixture (tests/fixtures/hf/llama_dynamo_scoped.onnx) compiled with sbpc --objective
dpo --beta 0.1 at B = 4 (two pairs a step). A dpo dataset of 5 pairs (a shared prompt, not
scored, and two different answers) is written by dataset_ref.py's writer; sbp-train computes
the reference log-probs itself before step 1 (the model's initial weights, sbp_step_logps) and
trains 8 AdamW steps over the pairs, shuffled per pass (--shuffle-seed). The reference is
transformers' own model in float64: a frozen copy of the initial model gives the reference
log-probs, and each step takes the pairs in the order dataset_ref.py computes independently
(the same Fisher-Yates shuffle over pairs), loss = mean over pairs of
-log sigmoid(beta ((logp_c - ref_c) - (logp_r - ref_r))), torch.optim.AdamW (lr 1e-2, weight
decay 0.01). Every step's loss must be within 1e-5 relative, the final weights within 1e-4 per
tensor. Every step's rewards as TRL's DPOTrainer logs them (the mean over the step's pairs of
beta (logp - ref) of the chosen and of the rejected rows, their mean margin, the fraction of
pairs whose chosen reward is the larger), from --log and from the printed step line (which must
agree with the log to its 9 digits), against the same loop's float64 rewards of each step's
forward: chosen, rejected and margin each within 1e-5 relative, with an absolute floor of
1e-5 * REWARD_FLOOR (REWARD_FLOOR = 0.1: step 1's rewards are 0, the policy being the reference,
and the step's float32 log-probs differ from float64 by ~1e-6 nats, so a reward near zero is
compared to 1e-6 absolute); the accuracy exactly, except that a pair whose float64 margin is
within AMBIGUOUS (1e-5) of 0 may count either way. The same 8 steps with --grad-accum 2 on a
step of B = 2 (one pair per micro-batch) must log the same rewards (the means are over every
micro-batch's pairs), against the same reference. --compute-logps must write the reference log-probs (equal to float64 PyTorch's within
1e-5) and train nothing; the log-probs kept beside the checkpoints are reused by a resumed run
(whose losses equal the uninterrupted run's) and recomputed for another dataset. A reference
that is not the starting point: --compute-logps of the trained model (--save), given back as
--ref-logps FILE to a run from the initial weights, against the same float64 loop with that
model's log-probs (losses 1e-5, weights 1e-4); --ref-logps of another dataset, a .npy and a
file that is not of --compute-logps are refused in one line. Without torch or transformers:
SKIPPED, exit 77.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset_ref as dr  # noqa: E402
from torch_ref import LLAMA as MODEL, run, step_losses, llama_float64, check_losses, \
    check_weights  # noqa: E402

B, T, V = 4, 32, 96
STEPS, LR, WD, SEED, BETA = 8, 1e-2, 0.01, 9, 0.1
REWARD_TOL, REWARD_FLOOR, AMBIGUOUS = 1e-5, 0.1, 1e-5
REWARD_KEYS = ("rewards_chosen", "rewards_rejected", "rewards_margin", "rewards_accuracy")


def pairs():
    import random
    rnd = random.Random(20261204)
    out = []
    for _ in range(5):
        prompt = [rnd.randrange(3, V) for _ in range(rnd.randint(3, 10))]
        for _side in range(2):
            ans = [rnd.randrange(3, V) for _ in range(rnd.randint(2, 12))]
            out.append(dr.example(prompt + ans, len(prompt)))
    return out



def logp(torch, model, ids, labels):
    x = torch.tensor([ids])
    lab = torch.tensor(labels)
    lp = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0], dim=-1)
    m = lab != dr.IGNORE
    return lp[m.nonzero().squeeze(1), lab[m]].sum()


def logged_rewards(out, log_path):
    """Each step's rewards from the --log file, checked against the printed step lines."""
    import json
    logged = [json.loads(x) for x in open(log_path) if x.strip()]
    printed = re.findall(r"^step (\d+) loss .* rewards_chosen (\S+) rewards_rejected (\S+) "
                         r"rewards_margin (\S+) rewards_accuracy (\S+)$", out, re.M)
    if len(printed) != len(logged) or len(logged) != STEPS:
        sys.exit("FAIL: %d logged and %d printed steps with rewards, %d wanted:\n%s"
                 % (len(logged), len(printed), STEPS, out))
    for rec, pr in zip(logged, printed):
        if int(pr[0]) != rec["step"] or any(k not in rec for k in REWARD_KEYS):
            sys.exit("FAIL: a log line without the rewards, or of another step: %r" % rec)
        for k, v in zip(REWARD_KEYS, pr[1:]):
            if abs(float(v) - rec[k]) > 1e-8 * max(abs(rec[k]), 1e-3):
                sys.exit("FAIL: step %d: printed %s %s, logged %r" % (rec["step"], k, v, rec[k]))
    return logged


def check_rewards(tag, logged, want):
    """The logged rewards against the float64 reference's (per step: the pairs' chosen and
    rejected rewards); returns the worst relative difference (of chosen, rejected, margin)."""
    worst = 0.0
    for rec, (cs, rs) in zip(logged, want):
        n = len(cs)
        ref = {"rewards_chosen": sum(cs) / n, "rewards_rejected": sum(rs) / n,
               "rewards_margin": sum(c - r for c, r in zip(cs, rs)) / n}
        for k, w in ref.items():
            d = abs(rec[k] - w) / max(abs(w), REWARD_FLOOR)
            worst = max(worst, d)
            if not d <= REWARD_TOL:
                for r2, (c2, x2) in zip(logged, want):
                    print("step %d: sbp-train %r reference chosen %r rejected %r"
                          % (r2["step"], {q: r2[q] for q in REWARD_KEYS}, c2, x2))
                sys.exit("FAIL: %s: step %d: %s %.9g, float64 PyTorch %.9g (%.3g relative)"
                         % (tag, rec["step"], k, rec[k], w, d))
        sure = sum(1 for c, r in zip(cs, rs) if c - r > AMBIGUOUS)
        maybe = sum(1 for c, r in zip(cs, rs) if abs(c - r) <= AMBIGUOUS)
        got = rec["rewards_accuracy"] * n
        if not (sure - 1e-9 <= got <= sure + maybe + 1e-9):
            sys.exit("FAIL: %s: step %d: rewards_accuracy %r, float64 PyTorch %d of %d pairs "
                     "(%d within %g of a tie)" % (tag, rec["step"], rec["rewards_accuracy"],
                                                 sure, n, maybe, AMBIGUOUS))
    return worst


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sbp_train, sbpc, work = sys.argv[1:]
    try:
        import torch
        import transformers  # noqa: F401
        from safetensors.torch import load_file
    except ImportError as e:
        print("SKIPPED: %s (dataset_dpo_torch.py needs torch, transformers and safetensors); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    os.makedirs(work, exist_ok=True)
    exs = pairs()
    data = os.path.join(work, "pairs.safetensors")
    dr.write_dataset(data, exs, task="dpo", vocab=V, max_len=T)
    step = os.path.join(work, "dpo.so")
    run([sbpc, MODEL, "--batch", str(B), "--seq-len", str(T), "--objective", "dpo", "--beta",
         str(BETA), "-o", step])
    init = os.path.join(work, "init.safetensors")
    run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", "1", "--lr", "0",
         "--save-safetensors", init])
    final = os.path.join(work, "final.safetensors")
    log = os.path.join(work, "train.jsonl")
    trained = os.path.join(work, "trained.onnx")  # another reference model, below
    out = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", str(STEPS),
               "--lr", str(LR), "--weight-decay", str(WD), "--shuffle-seed", str(SEED),
               "--threads", "2", "--save-safetensors", final, "--log", log, "--save", trained])
    logged = logged_rewards(out, log)
    # the same steps as two micro-batches of one pair each
    step2 = os.path.join(work, "dpo_b2.so")
    run([sbpc, MODEL, "--batch", "2", "--seq-len", str(T), "--objective", "dpo", "--beta",
         str(BETA), "-o", step2])
    log2 = os.path.join(work, "accum.jsonl")
    out_accum = run([sbp_train, step2, "--model", MODEL, "--dataset", data, "--steps",
                     str(STEPS), "--grad-accum", "2", "--lr", str(LR), "--weight-decay", str(WD),
                     "--shuffle-seed", str(SEED), "--threads", "2", "--log", log2])
    logged_accum = logged_rewards(out_accum, log2)
    if not re.search(r"note: reference log-probs of 10 examples computed in", out):
        sys.exit("FAIL: no note of the reference pass:\n" + out)
    got = step_losses(out)
    logps_file = os.path.join(work, "ref.safetensors")
    out2 = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--compute-logps",
                logps_file])
    if "step 1 loss" in out2:
        sys.exit("FAIL: --compute-logps trained:\n" + out2)

    # the reference log-probs kept beside the checkpoints: a resumed run reuses them (and
    # trains the same steps), a run of another dataset computes its own
    ck = os.path.join(work, "ck")
    subprocess.run(["rm", "-rf", ck])
    common = ["--model", MODEL, "--dataset", data, "--lr", str(LR), "--weight-decay", str(WD),
              "--shuffle-seed", str(SEED), "--threads", "2"]
    run([sbp_train, step] + common + ["--steps", "4", "--checkpoint-dir", ck])
    if not os.path.exists(os.path.join(ck, "ref-logps.safetensors")):
        sys.exit("FAIL: no ref-logps.safetensors beside the checkpoints")
    out3 = run([sbp_train, step] + common + ["--steps", str(STEPS), "--resume", ck])
    if "note: reusing the reference log-probs of" not in out3:
        sys.exit("FAIL: the resumed run did not reuse the reference log-probs:\n" + out3)
    resumed = step_losses(out3)
    if resumed != got[4:]:
        sys.exit("FAIL: the resumed losses %s differ from the run's %s" % (resumed, got[4:]))
    other = os.path.join(work, "other.safetensors")
    dr.write_dataset(other, exs[2:] + exs[:2], task="dpo", vocab=V, max_len=T)
    out4 = run([sbp_train, step, "--model", MODEL, "--dataset", other, "--steps", "1",
                "--ref-cache", os.path.join(ck, "ref-logps.safetensors")])
    if "holds reference log-probs of another model, step or dataset" not in out4:
        sys.exit("FAIL: a cache of another dataset was not recomputed:\n" + out4)

    # a reference model that is not the starting point: the trained model's log-probs
    # (--compute-logps with --model trained.onnx), read back with --ref-logps FILE, on a run
    # from the initial weights, single-process and over 2 ranks (batches dealt to the ranks)
    other_ref = os.path.join(work, "trained_ref.safetensors")
    run([sbp_train, step, "--model", trained, "--dataset", data, "--compute-logps", other_ref])
    final2 = os.path.join(work, "final_other_ref.safetensors")
    out5 = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", str(STEPS),
                "--lr", str(LR), "--weight-decay", str(WD), "--shuffle-seed", str(SEED),
                "--threads", "2", "--ref-logps", other_ref, "--save-safetensors", final2])
    if "note: --ref-logps: the reference log-probs of %s (10 examples)" % other_ref not in out5 \
            or "computed in" in out5:
        sys.exit("FAIL: --ref-logps FILE was not the reference:\n" + out5)
    got_other = step_losses(out5)
    # hostile: another dataset's file, a batch's .npy, a file that is not of --compute-logps
    bad = run([sbp_train, step, "--model", MODEL, "--dataset", other, "--steps", "1",
               "--ref-logps", other_ref], expect=1)
    if "holds the log-probs of another dataset" not in bad or bad.count("error:") != 1:
        sys.exit("FAIL: another dataset's log-probs were not refused in one line:\n" + bad)
    bad = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", "1",
               "--ref-logps", os.path.join(work, "x.npy")], expect=1)
    if "not an array of one batch's rows" not in bad:
        sys.exit("FAIL: a .npy --ref-logps with --dataset was not refused:\n" + bad)
    bad = run([sbp_train, step, "--model", MODEL, "--dataset", data, "--steps", "1",
               "--ref-logps", init], expect=1)
    if "is not a file of sbp-train --compute-logps" not in bad:
        sys.exit("FAIL: a safetensors file of weights as --ref-logps was not refused:\n" + bad)

    def dpo_loop(ref):
        """STEPS float64 AdamW steps from the initial weights against the row logps ref."""
        model = llama_float64(init)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=WD)
        order = [p for ep in range(STEPS) for p in dr.order(len(exs) // 2, SEED, ep)]
        want, want_rewards = [], []
        for s in range(STEPS):
            opt.zero_grad()
            total = 0
            chosen, rejected = [], []  # this step's rewards, of the forward before its update
            for pr in order[s * (B // 2):(s + 1) * (B // 2)]:
                c, r_ = exs[2 * pr], exs[2 * pr + 1]
                rc = BETA * (logp(torch, model, *c) - ref[2 * pr])
                rr = BETA * (logp(torch, model, *r_) - ref[2 * pr + 1])
                chosen.append(float(rc.detach()))
                rejected.append(float(rr.detach()))
                z = rc - rr
                total = total - torch.nn.functional.logsigmoid(z)
            loss = total / (B // 2)
            loss.backward()
            opt.step()
            want.append(float(loss.detach()))
            want_rewards.append((chosen, rejected))
        return model, want, want_rewards

    def ref_of(path):
        m = llama_float64(path)
        with torch.no_grad():
            return [float(logp(torch, m, e[0], e[1])) for e in exs]

    ref = ref_of(init)
    written = load_file(logps_file)["row_logps"].double().tolist()
    worst_ref = max(abs(a - b) / abs(b) for a, b in zip(written, ref))
    if worst_ref > 1e-5:
        sys.exit("FAIL: --compute-logps is %.3g relative off float64 PyTorch" % worst_ref)
    model, want, want_rewards = dpo_loop(ref)
    worst = check_losses("dpo", got, want)
    wworst = check_weights("dpo", final, model)
    rworst = check_rewards("dpo", logged, want_rewards)
    aworst = check_rewards("dpo --grad-accum 2", logged_accum, want_rewards)
    # the trained model as the reference
    ref2 = ref_of(final)
    written2 = load_file(other_ref)["row_logps"].double().tolist()
    worst_ref2 = max(abs(a - b) / abs(b) for a, b in zip(written2, ref2))
    if worst_ref2 > 1e-5:
        sys.exit("FAIL: --compute-logps of the trained model is %.3g relative off float64 "
                 "PyTorch" % worst_ref2)
    model2, want2, _ = dpo_loop(ref2)
    worst2 = check_losses("dpo --ref-logps FILE", got_other, want2)
    wworst2 = check_weights("dpo --ref-logps FILE", final2, model2)
    print("dpo: %d steps over 5 shuffled pairs, losses within %.2e of float64 PyTorch, final "
          "weights within %.2e, reference log-probs within %.2e, rewards within %.2e (with "
          "--grad-accum 2: %.2e)" % (STEPS, worst, wworst, worst_ref, rworst, aworst))
    print("dpo --ref-logps FILE (the trained model's, from --compute-logps): losses within "
          "%.2e, final weights within %.2e, its log-probs within %.2e" % (worst2, wworst2,
                                                                          worst_ref2))
    print("rewards_margin per step: %s" % " ".join("%.4g" % x["rewards_margin"] for x in logged))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
