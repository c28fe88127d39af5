#!/usr/bin/env python3
"""sbp-export of tiny Mixture-of-Experts folders: Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE.

    test_moe_export.py OUTDIR [FAMILY ...]

Each folder is tests/fixtures/hf/gen_moe.py's (write_folder: the family's tiny config, 8 experts,
top-2, seeded weights; its config.json is the committed moe/<family>/config.json), exported by
`sbp-export FOLDER -o OUT.onnx --attn eager` (dynamo), which loads MoE models with transformers'
batched_mm experts. Checks, per family:
  - exit 0, the onnxruntime comparison printed and within the tolerance, the file written;
  - every torch parameter is the initializer of its own name (the fused [E, 2F, d] gate_up_proj
    and [E, d, F] down_proj as is, each layer's router weight as is or transposed);
  - the graph is static: no NonZero, Loop, If, Scan, ScatterND, ScatterElements, Compress, Unique
    nor sequence op; routing stays in it (per layer a Softmax and a TopK of k = 2 over the 8
    experts, and the renormalising Div where the family renormalises: Mixtral, Qwen3-MoE), and
    each layer's expert tensors are read by a GatherND;
  - onnxruntime on a fresh batch [3, 24] against the model as transformers runs it by default
    on the CPU with its eager experts loop (experts_implementation="eager": nonzero, where,
    index_add_), so the switch of implementation changes nothing: relative 1e-5;
  - the committed fixture tests/fixtures/hf/<family>_dynamo_eager.onnx gives the same logits
    (it is this model's export);
  - the training loss docs/moe-export.md writes down (gen_moe.reference_loss, float64) equals
    transformers' model(input_ids, labels, output_router_logits=True).loss (float32), with and
    without an attention mask: relative 2e-6.
SKIP (exit 77) without torch, transformers, onnx, onnxruntime or onnxscript.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, Checks, error_lines, need, tool  # noqa: E402

need("numpy", "torch", "transformers", "onnx", "onnxruntime", "onnxscript", "safetensors")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from onnx import numpy_helper  # noqa: E402

HF = os.path.join(ROOT, "tests", "fixtures", "hf")
sys.path.insert(0, HF)
import gen_moe  # noqa: E402

OUT = sys.argv[1]
FAMS = sys.argv[2:] or list(gen_moe.FAMILIES)
RENORM = {"mixtral": True, "olmoe": False, "qwen2_moe": False, "qwen3_moe": True}
DYNAMIC = {"NonZero", "Loop", "If", "Scan", "ScatterND", "ScatterElements", "Compress", "Unique",
           "SplitToSequence", "SequenceAt", "SequenceConstruct", "ConcatFromSequence"}
os.makedirs(OUT, exist_ok=True)
C = Checks()
torch.manual_seed(0)


def ort_logits(path, ids):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input_ids": ids})[0]


def rel(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want)) /
                 max(1e-30, float(np.max(np.abs(want)))))


for fam in FAMS:
    folder = gen_moe.write_folder(fam, os.path.join(OUT, fam))
    C.ok(gen_moe.same_config(os.path.join(folder, "config.json"), gen_moe.committed_config(fam)),
         "%s: config.json differs from the committed %s" % (fam, gen_moe.committed_config(fam)))
    path = os.path.join(OUT, fam + ".onnx")
    if os.path.exists(path):
        os.remove(path)
    rc, so, se = tool("sbp-export", folder, "-o", path, "--attn", "eager")
    if not C.ok(rc == 0 and os.path.isfile(path), "%s: sbp-export exit %d: %s" % (
            fam, rc, " | ".join(error_lines(se)) or se[-1500:])):
        continue
    m = re.search(r"\(([0-9.e+-]+) relative to the largest logit; tolerance ([0-9.e+-]+)\)", so)
    C.ok(m and float(m.group(1)) <= float(m.group(2)),
         "%s: no onnxruntime comparison within tolerance printed: %r" % (fam, so))
    C.ok("each its own initializer" in so, "%s: no parameter count printed: %r" % (fam, so))

    model = gen_moe.make_model(fam, experts="eager")
    g = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in g.graph.initializer}
    for n, p in model.named_parameters():
        w = p.detach().numpy()
        a = inits.get(n)
        C.ok(a is not None and (np.array_equal(a, w) or (w.ndim == 2 and np.array_equal(a, w.T))),
             "%s: parameter %s %s is not the initializer of its name" % (fam, n, list(w.shape)))
    ops = [nd.op_type for nd in g.graph.node]
    C.ok(not DYNAMIC & set(ops), "%s: data-dependent ops in the graph: %s" % (
        fam, sorted(DYNAMIC & set(ops))))
    layers = model.config.num_hidden_layers
    topk = [nd for nd in g.graph.node if nd.op_type == "TopK"]
    C.ok(len(topk) == layers and ops.count("Softmax") >= 2 * layers,  # + attention's softmax
         "%s: %d TopK, %d Softmax for %d layers" % (fam, len(topk), ops.count("Softmax"), layers))
    consts = {nd.output[0]: numpy_helper.to_array(nd.attribute[0].t) for nd in g.graph.node
              if nd.op_type == "Constant" and nd.attribute and nd.attribute[0].name == "value"}
    C.ok(all(nd.input[1] in consts and int(consts[nd.input[1]].reshape(-1)[0]) == 2
             for nd in topk), "%s: a TopK with k != 2" % fam)
    tk_vals = {nd.output[0] for nd in topk}
    divs = [nd for nd in g.graph.node if nd.op_type == "Div" and nd.input[0] in tk_vals]
    C.ok(len(divs) == (layers if RENORM[fam] else 0),
         "%s: %d renormalising Div nodes of the top-k values (want %d)" % (
             fam, len(divs), layers if RENORM[fam] else 0))
    readers = {}
    prod = {o: nd for nd in g.graph.node for o in nd.output}
    for nd in g.graph.node:
        if nd.op_type == "GatherND":
            src = prod.get(nd.input[0])
            name = src.input[0] if src is not None and src.op_type == "Transpose" else nd.input[0]
            readers[name] = nd
    for i in range(layers):
        for t in ("gate_up_proj", "down_proj"):
            k = "model.layers.%d.mlp.experts.%s" % (i, t)
            C.ok(k in readers, "%s: %s is not read by a GatherND" % (fam, k))

    ids = torch.randint(0, model.config.vocab_size, (3, 24), generator=torch.Generator()
                        .manual_seed(7))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits.numpy().astype(np.float64)
    e = rel(ort_logits(path, ids.numpy()), want)
    C.ok(e <= 1e-5, "%s: onnxruntime vs the eager-experts model: relative %.3g" % (fam, e))
    fix = os.path.join(HF, fam + "_dynamo_eager.onnx")
    e2 = rel(ort_logits(fix, ids.numpy()), want) if os.path.isfile(fix) else float("inf")
    C.ok(e2 <= 1e-5, "%s: the committed %s vs the model: relative %.3g (regenerate it: "
         "gen_moe.py)" % (fam, os.path.relpath(fix, ROOT), e2))
    labels = ids.clone()
    labels[0, :5] = -100
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    for am in (None, mask):
        with torch.no_grad():
            hf = model(input_ids=ids, labels=labels, attention_mask=am, output_router_logits=True,
                       use_cache=False)
            ref, ce, aux = gen_moe.reference_loss(model, ids, labels, am)
        d = abs(float(hf.loss) - float(ref)) / abs(float(ref))
        C.ok(d <= 2e-6 and abs(float(hf.aux_loss) - float(aux)) <= 2e-6 * float(aux),
             "%s: loss%s: transformers %.9g (aux %.9g), the documented formula %.9g (aux %.9g)"
             % (fam, " with a mask" if am is not None else "", hf.loss, hf.aux_loss, ref, aux))
    print("%s: sbp-export ok, %d nodes, %.0f kB; onnxruntime vs eager experts %.2g, committed "
          "fixture %.2g" % (fam, len(ops), os.path.getsize(path) / 1e3, e, e2), flush=True)

C.done()
