#!/usr/bin/env python3
"""moe_pretrained_torch.py — a Mixture-of-Experts model trained by sbp-train, saved with
--save-pretrained and opened by transformers, against the float64 transformers model trained
the same way.

    moe_pretrained_torch.py SBP_TRAIN SBPC WORK [FAMILY ...]   (python with torch: .venv-hf)

For each MoE export of tests/fixtures/hf (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, or the FAMILY
names given; sbp-export recorded their config.json as "sbp.config.json"): sbpc compiles a
stream step with chunks that do not divide T = 32 (--chunk 7 --logits-chunk 13), sbp-train runs
STEPS AdamW steps (lr 1e-2, weight decay 0.01, betas and eps the defaults: gen_hf's reference
hyper-parameters) on the family's reference batch (tests/fixtures/hf/ref) and writes the folder.
Then:
  - AutoModelForCausalLM.from_pretrained(DIR) loads every weight (no missing, unexpected or
    mismatched key), and its float32 logits (transformers' default experts implementation) are
    within 1e-4 of the reference's (float32 arithmetic against float64);
  - the same folder loaded in float64 with eager experts and attention and float64 routers
    (gen_moe.float64_routers) gives logits within 1e-5 (relative norm) of the float64 reference:
    gen_moe.ref_model (what the committed gradients were computed from) after the same STEPS
    float64 AdamW steps of gen_moe.reference_loss (CE + router_aux_loss_coef * aux) through
    gen_hf.adamw_steps;
  - sbp-train's step losses are within 1e-5 of the reference's;
  - the comparison sees one AdamW step: the reference one step short is more than 1e-5 off.
The logits are taken on the training batch, whose smallest top-k gap over the reference
trajectory gen_moe.py measured (about 1e-5 at worst), so a near tie cannot flip a choice between
the float32-trained and the float64-trained weights. Without torch or transformers: SKIPPED,
exit 77.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_ref import FIX, check_losses, run, step_losses  # noqa: E402

STEPS = 4
FAMILIES = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe")
TOL = 1e-5       # float64-loaded folder against the float64 reference
TOL_F32 = 1e-4   # the folder as a user opens it: float32, transformers' default experts


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def check_family(fam, sbp_train, sbpc, work, torch, transformers, gen_hf, gen_moe):
    key = fam + "_dynamo_eager"
    model_path = os.path.join(FIX, key + ".onnx")
    step = os.path.join(work, key + ".so")
    run([sbpc, model_path, "--batch", "2", "--seq-len", "32", "--strategy", "stream",
         "--chunk", "7", "--logits-chunk", "13", "-o", step])
    out_dir = os.path.join(work, key + "_out")
    out = run([sbp_train, step, "--model", model_path,
               "--input-ids", os.path.join(FIX, "ref", fam + "_input_ids.npy"),
               "--labels", os.path.join(FIX, "ref", fam + "_labels.npy"),
               "--steps", str(STEPS), "--lr", "0.01", "--weight-decay", "0.01",
               "--threads", "2", "--save-pretrained", out_dir])
    if not re.search(r"saved the trained model \(\d+ files", out):
        sys.exit("FAIL: %s: no 'saved the trained model' line:\n%s" % (key, out))

    # the float64 reference trained as the committed references were (gen_moe.reference), with
    # the logits one step short captured before the last step's forward
    ids, labels = gen_hf.batch()
    short = {}

    def before_step(m):
        with torch.no_grad():
            short["logits"] = m(input_ids=ids, use_cache=False).logits.clone()

    ref, ref_losses = gen_hf.adamw_steps(
        lambda: gen_moe.ref_model(fam),
        lambda m: gen_moe.reference_loss(m, ids, labels, shift=False)[0],
        0.01, steps=STEPS, before_step=before_step)
    worst_loss = check_losses(key, step_losses(out), ref_losses, TOL)
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).logits

    # as a user opens it: every weight loaded, transformers' defaults (float32, grouped experts)
    plain, info = transformers.AutoModelForCausalLM.from_pretrained(out_dir,
                                                                   output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
        sys.exit("FAIL: %s: from_pretrained: %s" % (key, info))
    names = {n for n, _ in ref.named_parameters()}
    if {n for n, _ in plain.named_parameters()} != names:
        sys.exit("FAIL: %s: the loaded model's parameters are not the reference's" % key)

    # the same folder in float64 with everything the reference computes in float64
    m64 = transformers.AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float64, experts_implementation="eager", attn_implementation="eager")
    m64 = gen_moe.float64_routers(m64.eval())
    with torch.no_grad():
        got = m64(input_ids=ids, use_cache=False).logits
    e64 = rel(got, want)
    if not e64 <= TOL:
        sys.exit("FAIL: %s: float64 logits of the saved folder are %.3g relative off the float64 "
                 "reference after %d AdamW steps (> %g)" % (key, e64, STEPS, TOL))
    # and as opened above, in float32
    with torch.no_grad():
        got32 = plain.eval()(input_ids=ids, use_cache=False).logits
    e32 = rel(got32, want)
    if not e32 <= TOL_F32:
        sys.exit("FAIL: %s: float32 logits of the saved folder are %.3g relative off (> %g)"
                 % (key, e32, TOL_F32))
    # the comparison is sharp enough to see a missing step
    e_short = rel(got, short["logits"])
    if not e_short > TOL:
        sys.exit("FAIL: %s: the folder is within %g of the reference one step short (%.3g): the "
                 "logits comparison tells nothing" % (key, TOL, e_short))
    print("%s: from_pretrained loads %d weights; logits after %d AdamW steps within %.2e of "
          "float64 transformers (float32 load %.2e; one step short %.2e); losses within %.2e; "
          "smallest top-k gap %.2g" % (key, len(names), STEPS, e64, e32, e_short, worst_loss,
                                       gen_moe.topk_gap(ref, ids)), flush=True)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sbp_train, sbpc, work = sys.argv[1:4]
    fams = sys.argv[4:] or FAMILIES
    try:
        import torch
        import transformers
        sys.path.insert(0, FIX)
        import gen_hf
        import gen_moe
    except ImportError as e:
        print("SKIPPED: %s (moe_pretrained_torch.py needs torch and transformers); looked in %s "
              "(scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)"
              % (e, sys.executable))
        return 77
    import warnings
    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.makedirs(work, exist_ok=True)
    for fam in fams:
        if fam not in FAMILIES:
            sys.exit("FAIL: unknown family '%s' (%s)" % (fam, ", ".join(FAMILIES)))
        check_family(fam, sbp_train, sbpc, work, torch, transformers, gen_hf, gen_moe)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
