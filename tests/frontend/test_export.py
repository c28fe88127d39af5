#!/usr/bin/env python3
"""sbp-export end to end, for one exporter.

    test_export.py dynamo|torchscript OUTDIR SBPC SBP_TRAIN

The tiny model folders of tests/fixtures/frontend/gen_frontend.py --models (made here, into
OUTDIR) are exported, and:
  - Llama, Qwen3 and GPT-2: exit 0, the onnxruntime comparison printed, config.json and
    generation_config.json verbatim in metadata_props; every torch parameter is the initializer
    of its own name, as is or transposed (checked here by value, independently of the package);
    the dynamo Qwen3 export holds CastLike nodes (lowered by sbpc's importer), no export holds
    sequence ops (GPT-2's SplitToSequence, rewritten to Split by sbp-export); then
    `sbpc --batch 2 --seq-len 16 -o step.so` compiles it and sbp-train runs 2 steps on rows of
    an sbp-prepare dataset (exit 0, two finite losses), as .npy files and, for Qwen3, as the
    dataset file itself (`sbp-train --dataset`);
  - Gemma-3 (norms scale by 1 + w): the same parameter check (no initializer holds 1 + w, none
    is shared by two parameters), and, to show what the settings prevent, the exporter's default
    (optimising / folding) export of the same model does hold 1 + w; sbpc compiles it with
    --strategy stream and checkpoint (test_gemma3_stream.py checks the gradients);
  - Llama with transformers' initial weights (every norm weight ones): exported, each norm is
    still its own initializer and sbpc does not warn of merged weights, where the dynamo
    exporter's default export merges them;
  - --external-data (dynamo run only): MODEL.onnx + MODEL.onnx.data, which sbpc compiles;
  - errors (dynamo run only): a missing folder, a folder without config.json, a model that is
    not a causal LM, a config without weights, and logits outside --tolerance: exit 1, one
    error line, nothing written.
"""
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import DATA, FIX, Checks, error_lines, load_dataset, need, run, tool  # noqa: E402

need("numpy", "torch", "transformers", "onnx", "onnxruntime", "onnxscript", "safetensors")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

EXPORTER, OUT, SBPC, TRAIN = sys.argv[1:5]
OUT = os.path.join(OUT, EXPORTER)
os.makedirs(OUT, exist_ok=True)
C = Checks()
MODELS = os.path.join(OUT, "models")
rc, so, se = run([sys.executable, os.path.join(FIX, "gen_frontend.py"), "--models", MODELS])
if not C.ok(rc == 0, "gen_frontend.py --models: %s" % se[-2000:]):
    C.done()


def own_initializers(model_dir, onnx_path):
    """Problems: a parameter whose own-name initializer is missing or holds other values (as
    is or transposed; a tied parameter may be under any of its names), or an initializer that
    holds 1 + w of a parameter."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True,
                                                 dtype=torch.float32)
    m = onnx.load(onnx_path)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    names = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), (p.detach().numpy(), []))[1].append(n)
    bad = []
    for w, ns in names.values():
        hit = [n for n in ns if n in inits and (
            np.array_equal(inits[n], w) or (w.ndim == 2 and np.array_equal(inits[n], w.T)))]
        if not hit:
            bad.append("no initializer of its own for %s" % ns)
        for k, a in inits.items():
            if a.shape == w.shape and a.dtype == np.float32 and np.array_equal(a, w + 1):
                bad.append("%s holds 1 + %s" % (k, ns[0]))
    return bad, m


def export(name, out, *extra):
    return tool("sbp-export", os.path.join(MODELS, name), "-o", out, "--exporter", EXPORTER,
                *extra)


def train_rows(path, B=2, T=16):
    """The first B examples of a dataset file as [B, T] ids and labels (padded with -100)."""
    t, meta = load_dataset(path)
    o = t["offsets"]
    ids = np.full((B, T), int(meta["pad_id"]), np.int64)
    lab = np.full((B, T), -100, np.int64)
    for b in range(B):
        n = min(T, int(o[b + 1] - o[b]))
        ids[b, :n] = t["input_ids"][o[b]:o[b] + n]
        lab[b, :n] = t["labels"][o[b]:o[b] + n]
    return ids, lab


data = os.path.join(OUT, "sft.safetensors")
rc, so, se = tool("sbp-prepare", "--tokenizer", os.path.join(FIX, "tok_chatml"), "--task", "sft",
                  "--max-len", 16, "--truncate", "keep-end",
                  os.path.join(DATA, "sft_messages.jsonl"), "-o", data)
C.ok(rc == 0, "sbp-prepare for the training rows: %s" % se)
ids, lab = train_rows(data)
np.save(os.path.join(OUT, "ids.npy"), ids)
np.save(os.path.join(OUT, "labels.npy"), lab)

for name in ("llama", "qwen3", "gpt2"):
    path = os.path.join(OUT, name + ".onnx")
    rc, so, se = export(name, path)
    if not C.ok(rc == 0 and os.path.exists(path), "%s: sbp-export exit 0, got %d: %s"
                % (name, rc, se[-3000:])):
        continue
    C.ok(re.search(r"max abs difference [0-9.e+-]+", so) is not None,
         "%s: prints the onnxruntime difference: %s" % (name, so))
    bad, m = own_initializers(os.path.join(MODELS, name), path)
    C.ok(not bad, "%s: every parameter its own initializer: %s" % (name, bad[:5]))
    props = {p.key: p.value for p in m.metadata_props}
    for fn in ("config.json", "generation_config.json"):
        with open(os.path.join(MODELS, name, fn)) as f:
            C.ok(props.get("sbp." + fn) == f.read(), "%s: metadata sbp.%s verbatim" % (name, fn))
    C.ok(props.get("sbp.exporter") == EXPORTER, "%s: sbp.exporter" % name)
    dims = [d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]
    C.ok(len(dims) == 2 and all(dims), "%s: symbolic batch and sequence: %s" % (name, dims))
    if EXPORTER == "dynamo" and name == "qwen3":
        n_cl = sum(1 for n in m.graph.node if n.op_type == "CastLike")
        C.ok(n_cl > 0, "qwen3 dynamo: the export holds CastLike nodes (%d)" % n_cl)
    seq_ops = [n.op_type for n in m.graph.node if n.op_type.startswith("Sequence") or
               n.op_type == "SplitToSequence"]
    C.ok(not seq_ops, "%s: no sequence ops left (%s)" % (name, seq_ops[:3]))
    step = os.path.join(OUT, name + ".so")
    rc, so, se = run([SBPC, path, "--batch", 2, "--seq-len", 16, "-o", step])
    if not C.ok(rc == 0 and os.path.exists(step), "%s: sbpc exit 0, got %d: %s"
                % (name, rc, se[-3000:])):
        continue
    rc, so, se = run([TRAIN, step, "--model", path, "--input-ids", os.path.join(OUT, "ids.npy"),
                      "--labels", os.path.join(OUT, "labels.npy"), "--steps", 2, "--lr", 1e-3])
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)", so, re.M)]
    C.ok(rc == 0 and len(losses) == 2 and all(math.isfinite(x) for x in losses),
         "%s: sbp-train 2 steps, exit %d, losses %s: %s" % (name, rc, losses, se[-2000:]))
    if name == "qwen3":
        # the dataset file itself, through sbp-train's reader (docs/dataset-format.md)
        rc, so, se = run([TRAIN, step, "--model", path, "--dataset", data, "--steps", 2,
                          "--lr", 1e-3])
        losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)", so, re.M)]
        C.ok(rc == 0 and len(losses) == 2 and all(math.isfinite(x) for x in losses),
             "qwen3: sbp-train --dataset (sbp-prepare's file), exit %d, losses %s: %s"
             % (rc, losses, se[-2000:]))

# Gemma-3: the 1 + w norms
path = os.path.join(OUT, "gemma3.onnx")
rc, so, se = export("gemma3", path, "--attn", "eager")
if C.ok(rc == 0, "gemma3: sbp-export exit 0: %s" % se[-3000:]):
    bad, m = own_initializers(os.path.join(MODELS, "gemma3"), path)
    C.ok(not bad, "gemma3: every parameter its own initializer, none 1 + w: %s" % bad[:5])
    for strategy in ("stream", "checkpoint"):
        rc, so, se = run([SBPC, path, "--batch", 2, "--seq-len", 16, "--strategy", strategy,
                          "-o", os.path.join(OUT, "gemma3_%s.so" % strategy)])
        C.ok(rc == 0, "gemma3: sbpc --strategy %s exit 0, got %d: %s"
             % (strategy, rc, se[-2000:]))


def default_export(name, out):
    """The exporter's own defaults (dynamo: optimize=True; TorchScript: constant folding), to
    show what sbp-export's settings prevent."""
    import warnings
    import torch
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    from sbp_tools.export import make_wrapper
    m = AutoModelForCausalLM.from_pretrained(os.path.join(MODELS, name), local_files_only=True,
                                             dtype=torch.float32,
                                             attn_implementation="eager").eval()
    x = torch.randint(0, 300, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if EXPORTER == "dynamo":
            from torch.export import Dim
            torch.onnx.export(m, (), None, kwargs={"input_ids": x, "use_cache": False},
                              dynamic_shapes={"input_ids": {0: Dim("batch"),
                                                            1: Dim("sequence", max=128)},
                                              "use_cache": None}).save(out)
        else:
            torch.onnx.export(make_wrapper(m), (x,), out, dynamo=False, opset_version=17)
    return own_initializers(os.path.join(MODELS, name), out)[0]


bad = default_export("gemma3", os.path.join(OUT, "gemma3_default.onnx"))
C.ok(any("holds 1 +" in b for b in bad),
     "gemma3: the default %s export stores 1 + w (what sbp-export's settings avoid): %s"
     % (EXPORTER, bad[:3]))

# transformers' initial weights (all-ones norms): no two parameters share an initializer
path = os.path.join(OUT, "llama_init.onnx")
rc, so, se = export("llama_init", path)
if C.ok(rc == 0, "llama_init: sbp-export exit 0: %s" % se[-3000:]):
    bad, m = own_initializers(os.path.join(MODELS, "llama_init"), path)
    C.ok(not bad, "llama_init: every all-ones norm its own initializer: %s" % bad[:5])
    rc, so, se = run([SBPC, path, "--batch", 2, "--seq-len", 16, "-o",
                      os.path.join(OUT, "llama_init.so")])
    # sbpc's own check of shared weights (passes/graph/params.c) says "read by copies of one module"
    C.ok(rc == 0 and "copies of one module" not in se, "llama_init: sbpc compiles it without "
         "a shared-weight warning: %d %s" % (rc, se[-2000:]))
if EXPORTER == "dynamo":
    merged = os.path.join(OUT, "llama_init_default.onnx")
    bad = default_export("llama_init", merged)
    C.ok(any("no initializer of its own" in b for b in bad),
         "llama_init: the default dynamo export merges the norms (what optimize=False avoids):"
         " %s" % bad[:3])
    rc, so, se = run([SBPC, merged, "--batch", 2, "--seq-len", 16, "--dump-params"])
    C.ok("copies of one module" in se, "llama_init: sbpc warns about the merged export: %s"
         % se[-1000:])

if EXPORTER == "dynamo":
    # --external-data: the weights in MODEL.onnx.data, which sbpc reads beside the model
    path = os.path.join(OUT, "ext", "llama.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rc, so, se = export("llama", path, "--external-data")
    C.ok(rc == 0 and os.path.getsize(path + ".data") > 0 and
         sorted(os.listdir(os.path.dirname(path))) == ["llama.onnx", "llama.onnx.data"],
         "--external-data: model and data beside it, nothing else: %d %s" % (rc, se[-1000:]))
    rc, so, se = run([SBPC, path, "--batch", 2, "--seq-len", 16, "-o",
                      os.path.join(OUT, "llama_ext.c")])
    C.ok(rc == 0, "--external-data: sbpc reads it: %d %s" % (rc, se[-1000:]))

    out = os.path.join(OUT, "never.onnx")

    def refused(what, args, phrase):
        rc, so, se = tool("sbp-export", *args)
        C.ok(rc == 1 and len(error_lines(se)) == 1 and
             se.strip().splitlines()[-1].startswith("sbp-export: error: ") and phrase in se and
             not os.path.exists(out), "%s: exit 1, one error line with '%s': rc %d %r"
             % (what, phrase, rc, se[-1500:]))
    refused("missing folder", [os.path.join(OUT, "nothing"), "-o", out], "is not a folder")
    os.makedirs(os.path.join(OUT, "empty"), exist_ok=True)
    refused("no config.json", [os.path.join(OUT, "empty"), "-o", out], "has no config.json")
    from transformers import ViTConfig
    ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=16).save_pretrained(os.path.join(OUT, "vit"))
    refused("not a causal LM", [os.path.join(OUT, "vit"), "-o", out], "not a causal LM")
    from transformers import LlamaConfig
    LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=16).save_pretrained(os.path.join(OUT, "noweights"))
    refused("no weights", [os.path.join(OUT, "noweights"), "-o", out], "cannot load the model")
    refused("tolerance", [os.path.join(MODELS, "llama"), "-o", out, "--tolerance", "1e-12"],
            "more than --tolerance")
    C.ok(not [f for f in os.listdir(OUT) if f.endswith(".tmp")], "no temporary left behind")
C.done()
