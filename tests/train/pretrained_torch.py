#!/usr/bin/env python3
"""pretrained_torch.py — sbp-train --save-pretrained DIR --tokenizer TOKDIR, opened by transformers.

    pretrained_torch.py SBP_TRAIN SBPC WORK     (python with torch and transformers: .venv-hf)

The Llama and GPT-2 fixtures (tests/fixtures/hf: a dynamo and a TorchScript export) get the
model's config.json in their metadata_props, as sbp-export records it ("sbp.config.json"); a
tokenizer folder is made offline with `tokenizers`. sbp-train trains 3 steps and writes the
folder; then `AutoModelForCausalLM.from_pretrained(DIR)` must load every weight (no missing or
unexpected key), hold exactly the weights of --save-safetensors, and give logits within 1e-5 of
transformers' own model built from the fixture's config with those weights (an independent
load_state_dict); `AutoTokenizer.from_pretrained(DIR)` must load and `generate` must run. A LoRA
step writes its merged model with --merge-lora (and is refused without it); a model without the recorded config is refused before step 1.
Without torch or transformers: SKIPPED, exit 77.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_ref import FIX, run  # noqa: E402



def tokenizer_dir(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for i in range(3, 96):
        vocab["t%d" % i] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.save_pretrained(path)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sbp_train, sbpc, work = sys.argv[1:]
    try:
        import onnx
        import torch
        import transformers
        from safetensors.torch import load_file
        sys.path.insert(0, FIX)
        import gen_hf
    except ImportError as e:
        print("SKIPPED: %s (pretrained_torch.py needs torch, transformers, onnx, safetensors); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    os.makedirs(work, exist_ok=True)
    tok = os.path.join(work, "tok")
    tokenizer_dir(tok)
    fams = gen_hf.families()
    for key, fam in (("llama_dynamo_scoped", "llama"), ("gpt2_ts_eager", "gpt2")):
        cfg_cls, model_cls, kw = fams[fam]
        cfg = cfg_cls(**kw)
        cfg.architectures = [model_cls.__name__]
        m = onnx.load(os.path.join(FIX, key + ".onnx"))
        m.metadata_props.add(key="sbp.config.json", value=cfg.to_json_string())
        model_path = os.path.join(work, key + ".onnx")
        onnx.save(m, model_path)
        step = os.path.join(work, key + ".so")
        run([sbpc, model_path, "--batch", "2", "--seq-len", "32", "-o", step])
        out_dir = os.path.join(work, key + "_out")
        weights = os.path.join(work, key + ".safetensors")
        data = ["--input-ids", os.path.join(FIX, "ref", fam + "_input_ids.npy"),
                "--labels", os.path.join(FIX, "ref", fam + "_labels.npy")]
        out = run([sbp_train, step, "--model", model_path] + data +
                  ["--steps", "3", "--lr", "0.01", "--save-pretrained", out_dir, "--tokenizer",
                   tok, "--save-safetensors", weights])
        if not re.search(r"saved the trained model \(\d+ files", out):
            sys.exit("FAIL: %s: no 'saved the trained model' line:\n%s" % (key, out))
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
            out_dir, output_loading_info=True)
        if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
            sys.exit("FAIL: %s: from_pretrained: %s" % (key, info))
        sd = load_file(weights)
        lsd = loaded.state_dict()
        for k, v in sd.items():
            if not torch.equal(lsd[k], v):
                sys.exit("FAIL: %s: %s differs from --save-safetensors" % (key, k))
        ref = model_cls(cfg_cls(**kw)).eval()
        ref.load_state_dict(sd, strict=False)
        ids = torch.randint(3, 96, (2, 20), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            a = loaded.eval()(input_ids=ids).logits
            b = ref(input_ids=ids).logits
        rel = float((a - b).norm() / b.norm())
        if rel > 1e-5:
            sys.exit("FAIL: %s: logits of the saved folder are %.3g relative off" % (key, rel))
        t = transformers.AutoTokenizer.from_pretrained(out_dir)
        prompt = t("t5 t6 t7", return_tensors="pt")
        gen = loaded.generate(**prompt, max_new_tokens=5, do_sample=False,
                              pad_token_id=t.pad_token_id)
        if gen.shape[1] != prompt["input_ids"].shape[1] + 5:
            sys.exit("FAIL: %s: generate gave %s" % (key, tuple(gen.shape)))
        print("%s: from_pretrained loads %d weights, logits within %.2e, tokenizer and generate "
              "work" % (key, len(sd), rel))
    # a LoRA step: --merge-lora writes the merged model (W + (alpha/r) B A under W's names, the
    # writer --save-safetensors --merge-lora uses, which lora.export_peft checks against PEFT's
    # merge_and_unload); without --merge-lora it is refused before step 1
    cfg_cls, model_cls, kw = fams["llama"]
    model_path = os.path.join(work, "llama_dynamo_scoped.onnx")
    lstep = os.path.join(work, "lora.so")
    run([sbpc, model_path, "--batch", "2", "--seq-len", "32", "--lora", "4", "-o", lstep])
    data = ["--input-ids", os.path.join(FIX, "ref", "llama_input_ids.npy"),
            "--labels", os.path.join(FIX, "ref", "llama_labels.npy")]
    merged_dir = os.path.join(work, "lora_out")
    merged = os.path.join(work, "lora_merged.safetensors")
    run([sbp_train, lstep, "--model", model_path] + data +
        ["--steps", "3", "--lr", "0.01", "--merge-lora", "--save-pretrained", merged_dir,
         "--save-safetensors", merged])
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        merged_dir, output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
        sys.exit("FAIL: lora: from_pretrained: %s" % info)
    sd, lsd = load_file(merged), loaded.state_dict()
    if any("lora" in k for k in load_file(os.path.join(merged_dir, "model.safetensors"))):
        sys.exit("FAIL: lora: the folder holds adapter keys")
    base = load_file(os.path.join(work, "llama_dynamo_scoped.safetensors"))
    changed = [k for k in sd if not torch.equal(sd[k], lsd[k])]
    if changed:
        sys.exit("FAIL: lora: %s differ from --save-safetensors --merge-lora" % changed[:3])
    print("lora: the merged model loads (%d weights), as --save-safetensors --merge-lora wrote it"
          % len(sd))
    out = run([sbp_train, lstep, "--model", model_path] + data +
              ["--save-pretrained", os.path.join(work, "never")], expect=1)
    if "--save-pretrained: the step trains LoRA adapters" not in out or "step 1 loss" in out:
        sys.exit("FAIL: a LoRA step without --merge-lora was not refused before step 1:\n" + out)
    # refusals: no recorded config; --tokenizer without --save-pretrained
    bare = os.path.join(FIX, "llama_dynamo_scoped.onnx")
    step = os.path.join(work, "llama_dynamo_scoped.so")
    data = ["--input-ids", os.path.join(FIX, "ref", "llama_input_ids.npy"),
            "--labels", os.path.join(FIX, "ref", "llama_labels.npy")]
    out = run([sbp_train, step, "--model", bare] + data +
              ["--save-pretrained", os.path.join(work, "never")], expect=1)
    if "records no config.json" not in out or "step 1 loss" in out:
        sys.exit("FAIL: a model without the recorded config was not refused before step 1:\n"
                 + out)
    out = run([sbp_train, step, "--model", bare] + data + ["--tokenizer", tok], expect=1)
    if "--tokenizer TOKDIR is read with --save-pretrained" not in out:
        sys.exit("FAIL: --tokenizer alone was not refused:\n" + out)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
