"""sbp-export: a transformers model folder -> the ONNX file sbpc compiles.

    sbp-export MODEL_DIR -o model.onnx [--attn sdpa|eager] [--exporter dynamo|torchscript]

The model is loaded with AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True)
in float32, in eval mode, and exported with symbolic batch and sequence dims, input `input_ids`
int64 [batch, sequence] -> `logits` f32 [batch, sequence, vocab]. Eval mode means dropout off,
in the export and in the check against onnxruntime: sbpc trains the graph as exported and has no
dropout of its own (its folding removes an eval-mode Dropout node as the identity), so a model
configured with dropout > 0 is trained without it.

-o must end in .onnx, and follows the output rule of _cli.py: it may not lie in the model folder,
and an existing file is replaced only when sbp-export wrote it (metadata sbp.producer).

The export settings keep every weight its own initializer, because sbpc trains initializers:
  - dynamo: `optimize=False`. The exporter's optimiser (onnxscript) constant-folds Gemma's
    `1 + w` norm scales into stored initializers and merges initializers of equal value (every
    all-ones norm of a freshly initialised model becomes one tensor); without it each parameter
    is the initializer of its torch name. Its CastLike nodes are lowered by sbpc's importer.
  - torchscript: `do_constant_folding=False` (the folding pass also stores `1 + w` and
    transposed weight copies) and `keep_initializers_as_inputs=True`, the only switch of its
    deduplicate-initializers pass, which otherwise merges equal-valued weights even without
    folding (the weights are then taken off the graph inputs again); through a wrapper that
    passes an all-ones attention mask (without one, transformers looks for packed sequences in
    the position ids, which that exporter cannot write), whose `m.` prefix is taken off the
    initializer names.
Mixture-of-Experts models (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, ...: the classes whose experts
transformers dispatches through its ExpertsInterface, `@use_experts_implementation`) are loaded
with `experts_implementation="batched_mm"`; dense models load as before, without the keyword.
transformers' default for them, grouped_mm, sorts the tokens by expert and runs an opaque custom
op (`transformers::grouped_mm_fallback` in float32) that the dynamo exporter cannot convert; its
eager implementation loops over the experts that were hit (nonzero, where, index_add_): a graph
whose shape depends on the routing. batched_mm is the same function written statically: each token
is repeated top_k times, the expert tensors (gate_up_proj [E, 2F, d], down_proj [E, d, F], each
its own initializer) are gathered by the token's expert index and applied by a batched MatMul,
and the top-k weights scale the rows before a sum over the k copies. The router (logits, softmax,
top-k, the optional renormalisation) stays in the graph as transformers writes it; docs/
moe-export.md describes the exported block node by node. It computes per token what the eager loop
computes (tests/frontend/test_moe_export.py compares them), at top_k x [2F, d] weight copies per
token, which sbpc is to recognise as one routed op and lower (DESIGN.md), not run as written.
After the export every parameter of the model is looked for among the initializers (params.py):
as is or transposed, one initializer per parameter (tied parameters share one); anything else
is refused. Then onnxruntime runs a short batch and its logits are compared with PyTorch's
(refused above --tolerance, relative to the largest logit). Weights go to `MODEL.onnx.data`
beside the model with --external-data, or when the model would not fit in protobuf's 2 GB.

The file records the folder's config.json and generation_config.json (when present) verbatim in
the model's metadata_props, under the keys `sbp.config.json` and `sbp.generation_config.json`,
with `sbp.exporter`, `sbp.attn` and `sbp.producer` (so later tools can write a model folder).
An unoptimised dynamo export writes torch.split as SplitToSequence + SequenceAt (GPT-2's qkv):
those become one Split (sequences.py), as the optimiser would have done. The dynamo exporter's
per-node metadata is dropped except `pkg.torch.onnx.name_scopes` (module
paths, which sbpc reads to name weights); its stack traces and fx dumps are most of the file.
"""
import json
import os
import shutil
import sys
import warnings

from . import __version__
from ._cli import Fail, Parser, check_output, commit, die, first_line, onnx_producer, reserve

PROG = "sbp-export"
KEEP_NODE_META = ("pkg.torch.onnx.name_scopes",)


def make_wrapper(model):
    import torch

    class _LogitsOnly(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                          use_cache=False).logits

    # eval mode, like the model: a new Module is in training mode, and torch.onnx.export puts
    # the wrapper back in the mode it found it in, which would switch the model's dropout on
    # for the onnxruntime check that follows
    return _LogitsOnly(model).eval()


def check_folder(model_dir):
    if not os.path.isdir(model_dir):
        raise Fail("%s is not a folder" % model_dir)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise Fail("%s has no config.json (not a transformers model folder)" % model_dir)


# the experts implementation of Mixture-of-Experts models (see the header)
EXPERTS = "batched_mm"


def has_experts(model_cls):
    """Whether transformers dispatches this class's experts through its ExpertsInterface (the
    `@use_experts_implementation` experts classes: Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, ...).
    Dense models answer False and load exactly as before, without the keyword."""
    probe = getattr(model_cls, "_can_set_experts_implementation", None)
    try:
        return bool(probe()) if probe else False
    except Exception:
        return False


def load(model_dir, attn):
    import torch
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        cfg = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:
        raise Fail("cannot read %s/config.json: %s" % (model_dir, e))
    if type(cfg) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise Fail("%s holds a %s, which is not a causal LM (no AutoModelForCausalLM class for "
                   "it)" % (model_dir, type(cfg).__name__))
    extra = {}
    if has_experts(transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]):
        extra["experts_implementation"] = EXPERTS
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=torch.float32, attn_implementation=attn,
            **extra)
    except Exception as e:
        raise Fail("cannot load the model from %s: %s" % (model_dir, str(e).splitlines()[0]
                                                          if str(e) else type(e).__name__))
    model.eval()
    model.config.use_cache = False
    return model


def sample_ids(model, batch, seq):
    import torch
    g = torch.Generator().manual_seed(0)
    v = int(model.config.get_text_config().vocab_size)
    return torch.randint(0, v, (batch, seq), generator=g)


def max_seq_len(model, flag):
    """The sequence dim's upper bound for torch.export: --max-seq-len, else the config's
    max_position_embeddings. A bounded dim matters: with an unbounded one torch.export keeps the
    rotary table's slice to the sequence as a data-dependent Slice that sbpc cannot stream."""
    if flag:
        return flag
    v = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return int(v) if v else 131072


def export_dynamo(model, ids, path, opset, max_seq):
    import torch
    from torch.export import Dim
    out = torch.onnx.export(model, (), None, kwargs={"input_ids": ids, "use_cache": False},
                            input_names=["input_ids"], output_names=["logits"],
                            dynamic_shapes={"input_ids": {0: Dim("batch", min=1),
                                                          1: Dim("sequence", min=2,
                                                                 max=max_seq)},
                                            "use_cache": None},
                            opset_version=opset, optimize=False, verbose=False)
    out.save(path)


def export_torchscript(model, ids, path, opset):
    import torch
    torch.onnx.export(make_wrapper(model), (ids,), path, dynamo=False, opset_version=opset,
                      do_constant_folding=False, keep_initializers_as_inputs=True,
                      input_names=["input_ids"],
                      output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                    "logits": {0: "batch", 1: "sequence"}})


# protobuf cannot hold a message of 2 GB or more: above this the weights go to external data
EXTERNAL_DATA_ABOVE = 2**31 - 2**27


def finish(path, model_dir, exporter, attn):
    """Loads the export at path and returns it with the initializer names, node metadata and
    the model folder's files in metadata_props. path is alone in its temporary folder, so
    whatever else the exporter wrote there (its own external data files) is removed once
    loaded."""
    import onnx
    m = onnx.load(path)
    folder = os.path.dirname(path)
    for f in os.listdir(folder):
        if f != os.path.basename(path):
            os.remove(os.path.join(folder, f))
    ren = {i.name: i.name[2:] for i in m.graph.initializer if i.name.startswith("m.")}
    if ren:
        for init in m.graph.initializer:
            init.name = ren.get(init.name, init.name)
        for node in m.graph.node:
            for i, x in enumerate(node.input):
                if x in ren:
                    node.input[i] = ren[x]
        for vi in list(m.graph.input) + list(m.graph.value_info):
            if vi.name in ren:
                vi.name = ren[vi.name]
    if exporter == "dynamo":
        from .sequences import split_sequences
        split_sequences(m)
    # TorchScript: keep_initializers_as_inputs lists the weights as graph inputs too; they are
    # initializers only (the flag is there to turn off the exporter's merging, see above)
    names = {i.name for i in m.graph.initializer}
    inputs = [vi for vi in m.graph.input if vi.name not in names]
    if len(inputs) != len(m.graph.input):
        del m.graph.input[:]
        m.graph.input.extend(inputs)
    for node in m.graph.node:
        keep = [(p.key, p.value) for p in node.metadata_props if p.key in KEEP_NODE_META]
        del node.metadata_props[:]
        for k, v in keep:
            node.metadata_props.add(key=k, value=v)
    meta = {"sbp.exporter": exporter, "sbp.attn": attn,
            "sbp.producer": "%s %s" % (PROG, __version__)}
    for fn in ("config.json", "generation_config.json"):
        p = os.path.join(model_dir, fn)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                text = f.read()
            json.loads(text)  # a folder transformers just loaded: valid, or the load failed
            meta["sbp." + fn] = text
    old = [p for p in m.metadata_props if p.key not in meta]
    del m.metadata_props[:]
    for p in old:
        m.metadata_props.add(key=p.key, value=p.value)
    for k, v in meta.items():
        m.metadata_props.add(key=k, value=v)
    return m


def save(m, path, external):
    import onnx
    if external or m.ByteSize() > EXTERNAL_DATA_ABOVE:
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    else:
        onnx.save(m, path)


def ort_check(model, path, ids):
    import numpy as np
    import onnxruntime as ort
    import torch
    model.eval()  # the exported graph is the eval one (dropout off): compare like with like
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits.float().numpy()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input_ids": ids.numpy()})[0]
    if got.shape != want.shape:
        raise Fail("onnxruntime's logits are %s, PyTorch's %s" % (got.shape, want.shape))
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    scale = max(1e-30, float(np.max(np.abs(want))))
    return diff, diff / scale


def parse_args(argv):
    ap = Parser(prog=PROG, description="Export a transformers causal LM folder to ONNX for "
                "sbpc, every weight its own initializer. The folder's config.json is recorded "
                "in the model's metadata (sbpc reads max_position_embeddings from it, sbp-train "
                "the token ids and --save-pretrained the whole config), and the export is "
                "checked: onnxruntime's logits against PyTorch's on a random batch.")
    ap.add_argument("model_dir", metavar="MODEL_DIR",
                    help="a transformers model folder (config.json and the weights; "
                    "AutoModelForCausalLM.from_pretrained opens it)")
    ap.add_argument("-o", "--output", required=True, metavar="model.onnx",
                    help="the ONNX file to write (must end in .onnx; outside MODEL_DIR; an "
                    "existing file is replaced only if sbp-export made it)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                    help="transformers' attention implementation (default sdpa)")
    ap.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo",
                    help="torch.onnx's exporter (default dynamo, PyTorch's current one; "
                    "torchscript for the older tracer when dynamo cannot trace a model)")
    ap.add_argument("--opset", type=int, default=None,
                    help="ONNX opset (default 20 for dynamo, 17 for torchscript)")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest accepted max |onnxruntime - PyTorch| over max |logits| "
                    "(default 1e-4)")
    ap.add_argument("--max-seq-len", type=int, default=None, metavar="N",
                    help="dynamo: the sequence dim's upper bound (default: the config's "
                    "max_position_embeddings)")
    ap.add_argument("--external-data", action="store_true",
                    help="write the weights to MODEL.onnx.data beside the model (always done "
                    "when the model would exceed protobuf's 2 GB)")
    ap.add_argument("--check-batch", type=int, default=2, metavar="B",
                    help="the rows of the random batch the onnxruntime-vs-PyTorch check runs "
                    "(default 2)")
    ap.add_argument("--check-seq-len", type=int, default=8, metavar="T",
                    help="that batch's sequence length (default 8)")
    return ap.parse_args(argv)


def quiet():
    """The exporters' chatter (registration warnings about torchvision, progress lines) is not
    this tool's output: stdout carries the two result lines, stderr the error, if any."""
    import logging
    for name in ("torch.onnx", "torch.onnx._internal.exporter._registration", "torch.export",
                 "torch._dynamo", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)


def is_ours(path):
    return (onnx_producer(path) or "").startswith(PROG + " ")


def check_outputs(a):
    """The output rule of _cli.py, before the model is loaded: -o ends in .onnx (the onnx
    package picks the serialisation from the extension: -o m.json would be written as JSON),
    is not in the model folder nor one of its files, and replaces only an ONNX file that
    sbp-export wrote (metadata sbp.producer); MODEL.onnx.data, which --external-data writes,
    only beside such a file."""
    if not a.output.endswith(".onnx"):
        raise Fail("-o %s: the output must end in .onnx (the ONNX file sbpc reads)" % a.output)
    folders = [("model folder", a.model_dir)]
    what = "an ONNX file of sbp-export (metadata sbp.producer)"
    check_output(a.output, folders=folders, ours=(is_ours, what))
    data = a.output + ".data"
    check_output(data, folders=folders, ours=(lambda p: os.path.isfile(a.output) and
                                               is_ours(a.output), "the data of " + what),
                 flag="-o (external data)")


def run(a):
    if a.check_batch < 1 or a.check_seq_len < 2:
        raise Fail("--check-batch must be >= 1 and --check-seq-len >= 2")
    check_folder(a.model_dir)
    check_outputs(a)
    base = os.path.basename(a.output)
    # the export is written into a temporary folder beside -o (the same file system), made
    # before the model is loaded (a folder that cannot be written is found first), checked,
    # and only then renamed into place: the external data first, the model last
    tmpdir = reserve(a.output, folder=True)
    tmp = os.path.join(tmpdir, base)
    try:
        quiet()
        model = load(a.model_dir, a.attn)
        import torch
        from .params import check_params
        torch.manual_seed(0)
        ids = sample_ids(model, a.check_batch, a.check_seq_len)
        opset = a.opset or (20 if a.exporter == "dynamo" else 17)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if a.exporter == "dynamo":
                    export_dynamo(model, ids, tmp, opset, max_seq_len(model, a.max_seq_len))
                else:
                    export_torchscript(model, ids, tmp, opset)
            except Exception as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise Fail("the %s exporter failed: %s: %s" % (a.exporter, type(e).__name__,
                                                               first[:300]))
        m = finish(tmp, a.model_dir, a.exporter, a.attn)
        problems, n = check_params(model, m)
        if problems:
            raise Fail("the export does not keep every parameter as its own initializer: %s%s"
                       % ("; ".join(problems[:3]),
                          " (and %d more)" % (len(problems) - 3) if len(problems) > 3 else ""))
        save(m, tmp, a.external_data)
        del m
        diff, rel = ort_check(model, tmp, ids)
        print("%s: onnxruntime vs PyTorch logits on [%d, %d]: max abs difference %.3g "
              "(%.3g relative to the largest logit; tolerance %g)"
              % (PROG, a.check_batch, a.check_seq_len, diff, rel, a.tolerance))
        if not rel <= a.tolerance:
            raise Fail("onnxruntime's logits differ from PyTorch's by %.3g relative (more than "
                       "--tolerance %g): the %s export with --attn %s is wrong; nothing written"
                       % (rel, a.tolerance, a.exporter, a.attn))
        data_bytes = 0
        if os.path.exists(tmp + ".data"):
            data_bytes = os.path.getsize(tmp + ".data")
            commit(tmp + ".data", a.output + ".data")
        commit(tmp, a.output)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    print("%s: %s: %s exporter, opset %d, attn %s, %d parameters each its own initializer, "
          "%.1f MB" % (PROG, a.output, a.exporter, opset, a.attn, n,
                       (os.path.getsize(a.output) + data_bytes) / 1e6))


def main(argv=None):
    a = parse_args(argv)
    try:
        run(a)
    except Fail as e:
        die(PROG, e)
    except Exception as e:  # a library's failure outside the steps above: still one line
        die(PROG, first_line(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
