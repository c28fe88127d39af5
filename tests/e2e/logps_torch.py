#!/usr/bin/env python3
"""logps_torch.py — sbp_step_logps of packed and LoRA steps against float64 transformers.

    logps_torch.py LOGPS_RUN SBPC SBP_TRAIN WORK     (python with torch and transformers: .venv-hf)

The models are tests/fixtures/hf's Llama (llama_dynamo_scoped.onnx: RoPE, GQA, the dynamo
exporter's scopes, which --lora needs) and GPT-2 (gpt2_dynamo_eager.onnx: learned positions,
where a packed step's restarted positions show), and the reference is transformers' own model
classes in float64 with the exports' weights (gen_hf.make_model, checked against the stored SFT
loss of ref/<family>.safetensors as gen_logps.py does), on gen_logps.py's batch (B = 4, T = 32,
prompts and padding of different lengths). Every case is compiled by LOGPS_RUN (logps_run.c:
the flow sbpc runs) with store, checkpoint and stream at chunks that cut rows and documents
(layers 5, LM head 13; 7 / 9; 1 / 1), as a DPO and as a GRPO step:

  packed       sbpc --packed on the batch cut into documents (a 1-token document, one at a
               row's end, a row that is one document; each document's last token is not
               scored, as sbp-train --pack does). Reference: every document run ALONE (positions
               from 0, attention within it) — a row's logp is the sum of its documents', and
               each document's logp (the step's token logps summed over it) must be the
               document's own;
  lora         sbpc --lora 4 on the unpacked batch: the adapters start with lora_B = 0, so the
               step is the base model and the reference is the base model's log-probs;
  packed_lora  both at once;
  packed_doc, packed_lora_doc
               sbpc --packed --per-document (without and with --lora 4; store, checkpoint,
               stream 5/13 and 1/1, and stream 7/9 with LoRA): row_logps is [B, T], document k
               of row b (the k-th run of equal ids holding a scored label; row 1's first and
               row 2's last 1-token runs are not documents) at [b, k], each within 1e-6
               relative of that document run alone, and exactly 0 beyond the row's documents.
Each row's logp within 1e-6 relative, each document's within 1e-6 relative (of max(1, |ref|)),
each token's within 1e-6 of max(1, |ref|); unscored tokens exactly 0 (logps_run.c). The packed
references must differ from the same tokens run as whole rows (else the test could not tell).

Then sbp-train's own path for LoRA: sbpc --lora 4 -o STEP.so (DPO and GRPO, each strategy) and
sbp-train --dataset --compute-logps on a dataset of dataset_ref.py's format (sbp-train makes
the adapters' initial values itself): every example's logp (and for GRPO every token's) against
the base model's float64 values, the same bounds. Without torch or transformers: SKIPPED, 77.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HF = os.path.join(ROOT, "tests", "fixtures", "hf")
sys.path.insert(0, os.path.join(ROOT, "tests", "train"))
sys.path.insert(0, HF)

TOL = 1e-6
MODELS = {"llama": "llama_dynamo_scoped.onnx", "gpt2": "gpt2_dynamo_eager.onnx"}
STRATS = [("store", 0, 0), ("checkpoint", 0, 0), ("stream", 5, 13)]
HARNESS_STRATS = STRATS + [("stream", 7, 9), ("stream", 1, 1)]
# document starts (besides 0) in each row: a 1-token document first in row 1 and last in
# row 2, row 3 one document (row 2's first document holds the last tokens of its prompt)
CUTS = [[9, 20], [1, 17], [14, 31], []]
VARIANTS = [("packed", 0, True), ("lora", 4, False), ("packed_lora", 4, True)]
# per document (sbpc --per-document): (variant, LoRA rank, strategies)
DOC_VARIANTS = [("packed_doc", 0, [("store", 0, 0), ("checkpoint", 0, 0), ("stream", 5, 13),
                                   ("stream", 1, 1)]),
                ("packed_lora_doc", 4, [("stream", 7, 9)])]


def docs_of(cuts, T):
    starts = [0] + cuts + [T]
    return [(starts[i], starts[i + 1]) for i in range(len(starts) - 1)]


def packed_batch(torch, gen_logps):
    """gen_logps' batch cut into documents: ids, labels (each document's last token not
    scored: it would predict the next document's first), doc ids, [(start, end)] per row."""
    ids, labels = gen_logps.logp_batch()
    labels = labels.clone()
    B, T = ids.shape
    docs = torch.zeros((B, T), dtype=torch.int64)
    spans = []
    for b in range(B):
        spans.append(docs_of(CUTS[b], T))
        for d, (s, e) in enumerate(spans[b]):
            docs[b, s:e] = d
            labels[b, e - 1] = -100
    return ids, labels, docs, spans


def reference_model(torch, gen_hf, gen_logps, fam):
    """transformers' model of the exports in float64 (gen_logps.py's check that it is)."""
    model = gen_hf.make_model(fam, "eager").double()
    sids, slabels = gen_hf.batch()
    with torch.no_grad():
        sft = float(gen_hf.sft_loss(model(input_ids=sids, use_cache=False).logits, slabels))
    want = gen_logps.stored_loss(fam)
    if abs(sft - want) > 1e-12 * abs(want):
        sys.exit("FAIL: %s: the SFT loss %.17g is not ref/%s.safetensors' %.17g: the model is "
                 "not the exports'" % (fam, sft, fam, want))
    return model


def packed_reference(torch, gen_logps, model, ids, labels, spans):
    """[B, T] token logps with every document run alone (a sequence of its own)."""
    out = torch.zeros(ids.shape, dtype=torch.float64)
    for b, row in enumerate(spans):
        for s, e in row:
            out[b, s:e] = gen_logps.token_logps(model, ids[b:b + 1, s:e],
                                                labels[b:b + 1, s:e])[0]
    return out


def write_batch(gen_logps, path, ids, labels, docs=None):
    import numpy as np
    t = {"input/ids": ids.numpy().astype(np.float64),
         "input/labels": labels.numpy().astype(np.float64)}
    if docs is not None:
        t["input/docs"] = docs.numpy().astype(np.float64)
    gen_logps.write_safetensors(path, t, {"producer": "logps_torch.py"})


class Worst:
    """The largest relative differences seen, per kind, with the case that gave each."""

    def __init__(self):
        self.by = {}

    def add(self, kind, tag, err):
        if err > TOL:
            sys.exit("FAIL: %s: a %s log-prob is %.3g relative off float64 transformers (bound "
                     "%g)" % (tag, kind, err, TOL))
        if err >= self.by.get(kind, (-1, ""))[0]:
            self.by[kind] = (err, tag)


def compare(torch, worst, tag, row, tok, ref_tok, labels, spans):
    """The step's row and token logps (and each document's, for a packed batch) against the
    float64 reference ref_tok [B, T]."""
    ref_row = ref_tok.sum(-1)
    for b in range(ref_tok.shape[0]):
        worst.add("row", tag, abs(float(row[b]) - float(ref_row[b])) / abs(float(ref_row[b])))
    scored = labels != -100
    d = (tok.double() - ref_tok).abs() / ref_tok.abs().clamp_min(1.0)
    worst.add("token", tag, float(d[scored].max()))
    if float(tok[~scored].abs().max()) != 0:
        sys.exit("FAIL: %s: an unscored token's log-prob is not 0" % tag)
    for b, row_spans in enumerate(spans or []):
        for s, e in row_spans:
            if not bool(scored[b, s:e].any()):
                continue  # nothing scored: the tokens are 0, checked above
            got = float(tok[b, s:e].double().sum())
            want = float(ref_tok[b, s:e].sum())
            worst.add("document", tag, abs(got - want) / max(1.0, abs(want)))


def documents_of(labels_row, row_spans):
    """The row's documents: its runs (row_spans) that hold a scored label."""
    return [(s, e) for s, e in row_spans if bool((labels_row[s:e] != -100).any())]


def compare_documents(worst, tag, rows, ref_tok, labels, spans):
    """A per-document step's row_logps [B, T]: document k of row b at [b, k], each within TOL
    relative of the document run alone; exactly 0 after the row's documents."""
    for b, row_spans in enumerate(spans):
        docs = documents_of(labels[b], row_spans)
        for k, (s, e) in enumerate(docs):
            want = float(ref_tok[b, s:e].sum())
            worst.add("per-document", tag, abs(float(rows[b, k]) - want) / abs(want))
        if float(rows[b, len(docs):].abs().max()) != 0:
            sys.exit("FAIL: %s: row %d's row_logps is not 0 after its %d documents" %
                     (tag, b, len(docs)))


def harness_cases(torch, tools, work, gen_hf, gen_logps, worst):
    from safetensors.torch import load_file
    logps_run = tools[0]
    ids, plain_labels = gen_logps.logp_batch()
    pids, plabels, pdocs, spans = packed_batch(torch, gen_logps)
    plain_in, packed_in = os.path.join(work, "batch.safetensors"), \
        os.path.join(work, "packed.safetensors")
    write_batch(gen_logps, plain_in, ids, plain_labels)
    write_batch(gen_logps, packed_in, pids, plabels, pdocs)
    n = 0
    for fam, onnx in MODELS.items():
        model = reference_model(torch, gen_hf, gen_logps, fam)
        ref_plain = gen_logps.token_logps(model, ids, plain_labels)
        ref_packed = packed_reference(torch, gen_logps, model, pids, plabels, spans)
        # packing must matter on this batch: the documents' values are not the whole rows'
        whole = gen_logps.token_logps(model, pids, plabels)
        for b in range(len(CUTS)):
            if CUTS[b] and abs(float(whole[b].sum() - ref_packed[b].sum())) < 1e-3:
                sys.exit("FAIL: %s: row %d's documents give the whole row's logp: the packed "
                         "check would be vacuous" % (fam, b))
        for variant, rank, packed in VARIANTS:
            for obj in ("dpo", "grpo"):
                for st, chunk, lchunk in HARNESS_STRATS:
                    tag = "logps_torch_%s_%s_%s_%s%s" % (fam, variant, obj, st,
                                                          "_%d_%d" % (chunk, lchunk) if chunk else "")
                    out = os.path.join(work, tag + ".safetensors")
                    run([logps_run, os.path.join(HF, onnx), packed_in if packed else plain_in,
                         out, obj, st, str(chunk), str(lchunk), str(rank), str(int(packed)),
                         tag])
                    got = load_file(out)
                    compare(torch, worst, tag, got["row_logps"], got["token_logps"],
                            ref_packed if packed else ref_plain,
                            plabels if packed else plain_labels, spans if packed else None)
                    n += 1
        for variant, rank, strats in DOC_VARIANTS:
            for obj in ("dpo", "grpo"):
                for st, chunk, lchunk in strats:
                    tag = "logps_torch_%s_%s_%s_%s%s" % (fam, variant, obj, st,
                                                          "_%d_%d" % (chunk, lchunk) if chunk else "")
                    out = os.path.join(work, tag + ".safetensors")
                    run([logps_run, os.path.join(HF, onnx), packed_in, out, obj, st, str(chunk),
                         str(lchunk), str(rank), "1", tag, "1"])
                    got = load_file(out)
                    compare(torch, worst, tag, got["row_logps"].double().sum(-1),
                            got["token_logps"], ref_packed, plabels, spans)
                    compare_documents(worst, tag, got["row_logps"], ref_packed, plabels, spans)
                    n += 1
    return n


def lora_dataset(dr):
    """Ten examples of 3..30 tokens (a prompt of 1..9 tokens, not scored), ids 3..95."""
    import random
    rnd = random.Random(20270107)
    exs = []
    for _ in range(10):
        prompt = [rnd.randrange(3, 96) for _ in range(rnd.randint(1, 9))]
        ans = [rnd.randrange(3, 96) for _ in range(rnd.randint(2, 21))]
        exs.append(dr.example(prompt + ans, len(prompt)))
    return exs


def train_cases(torch, tools, work, gen_hf, gen_logps, worst):
    """sbp-train --compute-logps on LoRA steps: the base model's float64 log-probs."""
    import dataset_ref as dr
    from safetensors.torch import load_file
    _, sbpc, sbp_train = tools
    onnx = os.path.join(HF, MODELS["llama"])
    model = reference_model(torch, gen_hf, gen_logps, "llama")
    exs = lora_dataset(dr)
    ref = [gen_logps.token_logps(model, torch.tensor([e[0]]), torch.tensor([e[1]]))[0]
           for e in exs]
    data = {}
    for obj in ("dpo", "grpo"):
        data[obj] = os.path.join(work, "lora_%s.safetensors" % obj)
        tensors = None
        if obj == "grpo":
            import struct
            adv = [0.5 - 0.1 * i for i in range(len(exs))]
            tensors = {"advantages": ("F32", [len(adv)], struct.pack("<%df" % len(adv), *adv))}
        dr.write_dataset(data[obj], exs, task=obj, vocab=96, max_len=32, tensors=tensors)
    n = 0
    for obj in ("dpo", "grpo"):
        for st, chunk, lchunk in STRATS:
            tag = "compute_logps_llama_lora_%s_%s" % (obj, st)
            step = os.path.join(work, tag + ".so")
            cmd = [sbpc, onnx, "--batch", "4", "--seq-len", "32", "--objective", obj,
                   "--lora", "4", "--strategy", st, "-o", step]
            if chunk:
                cmd += ["--chunk", str(chunk), "--logits-chunk", str(lchunk)]
            run(cmd)
            out = os.path.join(work, tag + ".safetensors")
            text = run([sbp_train, step, "--model", onnx, "--dataset", data[obj],
                        "--compute-logps", out])
            if "step 1 loss" in text or "wrote the log-probs of 10 examples" not in text:
                sys.exit("FAIL: %s: sbp-train --compute-logps said:\n%s" % (tag, text))
            got = load_file(out)
            rows = got["row_logps"].double()
            for i, r in enumerate(ref):
                worst.add("row", tag, abs(float(rows[i]) - float(r.sum())) / abs(float(r.sum())))
            if obj == "grpo":  # the dataset's tokens, flat
                flat = torch.cat(ref)
                toks = got["token_logps"].double()
                worst.add("token", tag, float(((toks - flat).abs() / flat.abs().clamp_min(1.0))
                                              .max()))
            n += 1
    return n


def run(cmd):
    from torch_ref import run as run_tool
    return run_tool(cmd)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    tools, work = sys.argv[1:4], sys.argv[4]
    try:
        import torch
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s (logps_torch.py needs torch, transformers and safetensors); looked in %s (scripts/install-venv.sh makes .venv-hf, taken by the next cmake configure)" % (e, sys.executable))
        return 77
    import gen_hf
    import gen_logps
    torch.set_grad_enabled(False)
    os.makedirs(work, exist_ok=True)
    worst = Worst()
    n = harness_cases(torch, tools, work, gen_hf, gen_logps, worst)
    m = train_cases(torch, tools, work, gen_hf, gen_logps, worst)
    print("%d sbp_step_logps cases (packed, LoRA, packed LoRA, per document; DPO and GRPO; "
          "store, checkpoint, stream 5/13, 7/9, 1/1; Llama and GPT-2) and %d sbp-train --compute-logps LoRA "
          "cases against float64 transformers:" % (n, m))
    for kind, (err, tag) in sorted(worst.by.items()):
        print("  worst %-8s relative difference %.2e (%s)" % (kind, err, tag))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
