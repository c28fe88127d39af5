#!/usr/bin/env python3
"""GPU training-step benchmark: sbpc's store, checkpoint and stream steps (--target cuda) against
PyTorch, like for like, on a Qwen3-0.6B-shaped random model: d=1024, 28 layers, 16 query heads
and 8 KV heads of dim 128, d_ff 3072, V=151936, q_norm/k_norm, RoPE theta 1e6 (the qwen3 family
of tests/fixtures/gen_fixtures.py at that size; its LM head is untied, so 0.75B parameters rather
than 0.6B). Batch 1, SFT cross-entropy over every token.

    bench/gpu_bench.py --build BUILD [--out DIR] [--json PATH] [--budget SECONDS]
                       [--seq-lens 4096 16384 32768] [--precisions fp32 bf16]
                       [--cells fp32:4096 bf16:4096 ...] [--max-t T] [--dry-run]

What is compared (each pair on the same batch, from the same weights, with the same optimizer):
  - precision: fp32 against fp32 (no TF32 on either side: torch's allow_tf32 off), and sbpc's
    `--precision bf16` (bf16 activations, fp32 master weights, GEMMs on a bf16 copy, fp32
    accumulation; docs/gpu.md) against torch.autocast(bfloat16) over fp32 parameters;
  - memory strategy: sbpc store against PyTorch eager; sbpc checkpoint and stream against PyTorch
    with per-layer checkpointing (torch.utils.checkpoint, non-reentrant, around each decoder
    layer: Hugging Face's gradient_checkpointing_enable);
  - one step = forward + backward + gradient norm (clipped at 1.0) + AdamW (lr 1e-5, betas
    0.9/0.999, eps 1e-8, weight decay 0.01) on both sides: sbp-train's AdamW; torch.optim.AdamW
    (its default foreach) after clip_grad_norm_; the optimizer state starts empty in each run;
  - PyTorch's model: transformers' Qwen3ForCausalLM with attn_implementation="sdpa" (causal
    F.scaled_dot_product_attention, what Hugging Face runs by default), loaded with the weights
    sbpc's ONNX export holds (--torch-impl own: the fixture's module with SDPA, for a machine
    without transformers); logits upcast to fp32 and cross-entropy as HF does.

Columns (markdown table DIR/gpu_bench.md, every row in the JSON file, --json PATH, default
DIR/gpu_bench.json, both rewritten after each run so that a killed benchmark keeps what it had):
  step s     the median step time of the steps after 2 warm-up ones (--steps, default 5: the
             median of 3); sbp-train: differences of its --log elapsed_s; PyTorch: wall time
             around each step with torch.cuda.synchronize;
  peak GiB   sbpc: planned (parameters + gradients + AdamW m, v + workspace, from --report) /
             measured (what sbp-train's process had in use on the device above the CUDA
             context at its peak: arena, constants, runtime scratch, cuBLAS workspace);
             PyTorch: torch.cuda.max_memory_allocated (max_memory_reserved in the JSON);
  TFLOP/s    useful FLOPs per step (below) / step time;
  MFU        TFLOP/s / the device's dense peak for the row's precision (fp32 rows: the fp32
             peak, neither side being allowed TF32; bf16 rows: the bf16 peak): PEAKS below,
             the device named by torch.cuda.get_device_name (or --device-name / --peaks);
  loss       the loss of step 1 (before any update: both sides should agree, fp32 to about
             1e-5, bf16 to about 1e-2);
  ratios     step time sbpc / PyTorch (lower is better): store / torch eager, checkpoint /
             torch+ckpt, stream / torch+ckpt, and sbpc's own stream / checkpoint; a ratio with
             a target (TARGETS) is marked PASS or FAIL with its limit;
  largest T  the largest T that ran a step, for each method and precision, searched (--max-t):
             from the largest T that ran in the table, doubling until a step runs out of memory
             (or --max-t, default the model's 131072 positions), then bisection between the
             last T that ran and the first that did not, to --max-t-step (1024) tokens; each
             probe one step (sbpc: first its memory plan against the device's free memory with
             `sbpc --memory-budget`, which also lets stream pick the chunks that fit; a plan that
             does not fit counts as out of memory; --max-t-sbpc plan stops there, without the
             step); within --max-t-budget seconds for both sides (half each), a probe that runs
             out of time ends that method's search with "at least".
Out of memory is a row ("OOM", with where it came from), not a crash; a method that ran out of
memory at some T is not run at larger T of that precision ("skipped (OOM at T=...)").

Useful FLOPs per step (MFU's numerator; recompute not counted), B sequences of T tokens:
    F = 6 * N_nonemb * T * B + 6 * L * H * HD * T^2 * B
  - the matrix products: a weight [n_in, n_out] applied to B*T tokens is 2*n_in*n_out*B*T FLOPs
    in the forward (a multiply-add is 2) and twice that in the backward (the input's gradient
    and the weight's), so 6 FLOPs per weight per token; N_nonemb = the weights of matrix
    products = L * (D*H*HD [q] + 2*D*KV*HD [k, v] + H*HD*D [o] + 3*D*FF [gate, up, down]) +
    D*V [the untied LM head, a product like the others]; the embedding table is a lookup (no
    FLOPs) and is not counted, nor are the norms' weights (elementwise);
  - attention, per layer and query head (grouped-query K/V heads are shared, the products are
    per query head): QK^T and PV are 2*T*T*HD FLOPs each over the full square, the causal half
    of it 2*T^2*HD for both together in the forward; the backward is twice the forward (dS->dQ,
    dK; dO->dV, dP): 6*T^2*HD forward and backward, so 6*L*H*HD*T^2*B (T^2/2 pairs, not
    T(T+1)/2: within 1/T);
  - not counted: recomputation (checkpoint's and stream's second forward, flash attention's
    recomputed scores in its backward), the optimizer, the gradient norm, softmax,
    cross-entropy, norms, RoPE, SiLU (elementwise; under 1% here).
  For this model N_nonemb = 28 * 15,728,640 + 155,582,464 = 595,984,384, and at T = 4096, B = 1:
  F = 14.65 + 5.77 = 20.42 TFLOP.

Targets (TARGETS; printed as PASS / FAIL in the ratio table and in a list below it): fp32 store
<= 1.0x PyTorch eager and fp32 stream <= 1.0x PyTorch + checkpointing at T = 4096; bf16 stream
<= 1.0x PyTorch autocast + checkpointing at T = 4096 and <= 0.9x at T = 16384; stream <= 1.15x
checkpoint (every precision and T).

Order, within --budget seconds (it writes what it has when time runs out):
  1. exports the model with torch.onnx (TorchScript exporter; external data, > 2 GB) to
     --model-dir (default DIR/qwen3_bench_L28), in a subprocess; one RoPE cos/sin cache shared
     by the layers; an existing export is reused;
  2. the cells (precision, T) in order (--cells, or T ascending and --precisions within each
     T), each cell's methods in the order stream, torch+ckpt, checkpoint, store, torch (the
     pairs of the targets first): sbpc compiles each (--report gives the three plans; a plan
     that does not fit the device's free memory is an OOM row without a run) and sbp-train
     runs --steps steps; PyTorch runs in one worker process (the model built once, its weights
     reset before each run and moved off the device after it, so that sbpc's runs have the
     card);
  3. the largest-T search (--max-t), PyTorch's first (in the worker), then sbpc's.
--dry-run prints this plan (cells, FLOPs, each run's commands, the search) and writes the JSON
with no GPU, build or model needed. --small uses a tiny model of the same family and --target cpu
runs the sbpc side on the CPU runtime and PyTorch on the CPU: a smoke test of this script where
there is no GPU (sbpc's bf16 rows are then "not run": bf16 needs --target cuda).
"""
import argparse
import inspect
import json
import os
import random
import re
import selectors
import shlex
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = 1 << 30

FULL = dict(D=1024, L=28, H=16, KV=8, HD=128, FF=3072, V=151936, MAX_POS=1 << 17, THETA=1e6)
SMALL = dict(D=64, L=2, H=4, KV=2, HD=16, FF=128, V=1000, MAX_POS=1 << 14, THETA=1e6)
STRATEGIES = ["store", "checkpoint", "stream"]
TORCH_MODES = ["torch", "torch+ckpt"]
METHODS = STRATEGIES + TORCH_MODES
# Within a cell: the target pairs first, so that a budget that runs out leaves complete pairs.
RUN_ORDER = ["stream", "torch+ckpt", "checkpoint", "store", "torch"]
PRECISIONS = ["fp32", "bf16"]
# The same optimizer on both sides: AdamW (betas 0.9/0.999, eps 1e-8) with these, and the
# gradient norm clipped at CLIP (sbp-train computes the norm every step); WARMUP steps untimed.
LR, WD, CLIP, WARMUP = 1e-5, 0.01, 1.0, 2
# Dense peaks, TFLOP/s, per precision; the first pattern that matches the device's name wins.
PEAKS = [
    (r"H100.*PCIe", dict(fp32=51.0, tf32=378.0, bf16=756.0)),
    (r"H100.*NVL", dict(fp32=60.0, tf32=418.0, bf16=835.0)),
    (r"H200|GH200|H100", dict(fp32=67.0, tf32=495.0, bf16=989.0)),
    (r"A100", dict(fp32=19.5, tf32=156.0, bf16=312.0)),
]
# (precision or None for all, T or None for all, numerator, denominator, at most)
TARGETS = [
    ("fp32", 4096, "store", "torch", 1.0),
    ("fp32", 4096, "stream", "torch+ckpt", 1.0),
    ("bf16", 4096, "stream", "torch+ckpt", 1.0),
    ("bf16", 16384, "stream", "torch+ckpt", 0.9),
    (None, None, "stream", "checkpoint", 1.15),
]
RATIOS = [("store", "torch"), ("checkpoint", "torch+ckpt"), ("stream", "torch+ckpt"),
          ("stream", "checkpoint")]
OOM_RE = re.compile(r"out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
                    r"can't allocate memory", re.I)


def log(msg):
    print(msg, flush=True)


def label(prec, method):
    """The method's name in the tables (PyTorch's bf16 is autocast)."""
    if method in TORCH_MODES and prec == "bf16":
        return method.replace("torch", "torch autocast")
    return method


# ------------------------------------------------------------------ FLOPs and peaks

def nonemb_params(cfg):
    """The weights of matrix products: q, k, v, o and the MLP per layer, and the LM head."""
    per_layer = (cfg["D"] * cfg["H"] * cfg["HD"] + 2 * cfg["D"] * cfg["KV"] * cfg["HD"]
                 + cfg["H"] * cfg["HD"] * cfg["D"] + 3 * cfg["D"] * cfg["FF"])
    return cfg["L"] * per_layer + cfg["D"] * cfg["V"]


def all_params(cfg):
    """Every parameter: N_nonemb, the embedding table, the norms (2 per layer, q/k_norm, final)."""
    norms = cfg["L"] * (2 * cfg["D"] + 2 * cfg["HD"]) + cfg["D"]
    return nonemb_params(cfg) + cfg["V"] * cfg["D"] + norms


def useful_flops(cfg, T, B=1):
    """6 N_nonemb T B (matrix products, forward and backward) + 6 L H HD T^2 B (causal
    attention, forward and backward); recompute not counted (the header derives it)."""
    dense = 6 * nonemb_params(cfg) * T * B
    attn = 6 * cfg["L"] * cfg["H"] * cfg["HD"] * T * T * B
    return dense + attn, dense, attn


def peaks_for(name, override):
    """{precision: TFLOP/s} for the device named name; override "fp32=67,bf16=989" wins."""
    got = {}
    for pat, p in PEAKS:
        if name and re.search(pat, name):
            got = dict(p)
            break
    for part in (override or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            got[k.strip()] = float(v)
    return got


# ------------------------------------------------------------------ the model (torch side)

def configure(cfg):
    """gen_fixtures at this size (it imports onnx only where it writes and checks fixtures, so
    its model classes load on machines without the onnx package)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
    import gen_fixtures as gf
    gf.D_MODEL, gf.N_LAYER, gf.VOCAB = cfg["D"], cfg["L"], cfg["V"]
    gf.N_HEAD, gf.N_KV_HEAD, gf.HEAD_DIM = cfg["H"], cfg["KV"], cfg["HD"]
    gf.LLAMA_FF, gf.N_POSITIONS = cfg["FF"], cfg["MAX_POS"]
    # One rotary cache for every layer (each layer would build its own [MAX_POS, HD] pair,
    # 28 copies in the ONNX file); the exporter then writes one initializer pair.
    orig = getattr(gf, "_OrigRotary", gf.LlamaRotaryEmbedding)
    gf._OrigRotary = orig
    shared = {}

    def rotary(dim, max_position_embeddings=cfg["MAX_POS"], base=cfg["THETA"]):
        key = (dim, max_position_embeddings, base)
        if key not in shared:
            shared[key] = orig(dim, max_position_embeddings, base)
        return shared[key]

    gf.LlamaRotaryEmbedding = rotary
    return gf


def build_model(gf):
    """gf.build("qwen3"), without torch's default initialisation of each layer (gf.build
    overwrites every parameter from its own generator, so the weights are the same; at 0.75B
    parameters the default init alone takes tens of seconds)."""
    import torch
    saved = {n: getattr(torch.nn.init, n) for n in ("kaiming_uniform_", "uniform_", "normal_")}
    try:
        for n in saved:
            setattr(torch.nn.init, n, lambda t, *args, **kw: t)
        return gf.build("qwen3", gf.SEED)
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def model_cfg(a):
    """The model's shape: FULL or SMALL, with --layers overriding the layer count."""
    cfg = dict(SMALL if a.small else FULL)
    if getattr(a, "layers", None):
        cfg["L"] = a.layers
    return cfg


def shape_args(a):
    """The options that give a subprocess the same model shape."""
    return (["--small"] if a.small else []) + (["--layers", str(a.layers)] if a.layers else [])


def cmd_export(a):
    import torch
    cfg = model_cfg(a)
    gf = configure(cfg)
    t0 = time.time()
    model = build_model(gf)
    n = sum(p.numel() for p in model.parameters())
    log(f"built the model: {n / 1e9:.3f} B parameters in {time.time() - t0:.1f} s")
    os.makedirs(os.path.dirname(a.export), exist_ok=True)
    ids = torch.randint(0, cfg["V"], (1, 64))
    kw = dict(export_params=True, training=torch.onnx.TrainingMode.EVAL, opset_version=17,
              do_constant_folding=True, input_names=["input_ids"], output_names=["logits"],
              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                            "logits": {0: "batch", 1: "sequence"}})
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = False  # the TorchScript exporter, as the fixtures (sbpc reads both)
    t0 = time.time()
    with torch.no_grad():
        torch.onnx.export(model, (ids,), a.export, **kw)
    size = sum(os.path.getsize(os.path.join(os.path.dirname(a.export), f))
               for f in os.listdir(os.path.dirname(a.export)))
    log(f"exported {a.export} ({size / GIB:.2f} GiB with external data) in "
        f"{time.time() - t0:.1f} s")


def hf_qwen3(cfg, torch, dev):
    """transformers' Qwen3ForCausalLM of this shape, attn_implementation "sdpa", on dev."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    c = Qwen3Config(vocab_size=cfg["V"], hidden_size=cfg["D"], intermediate_size=cfg["FF"],
                    num_hidden_layers=cfg["L"], num_attention_heads=cfg["H"],
                    num_key_value_heads=cfg["KV"], head_dim=cfg["HD"],
                    max_position_embeddings=cfg["MAX_POS"], rms_norm_eps=1e-6,
                    rope_theta=cfg["THETA"], tie_word_embeddings=False, attention_bias=False,
                    use_cache=False)
    rp = getattr(c, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_theta") != cfg["THETA"]:
        rp["rope_theta"] = cfg["THETA"]
    c._attn_implementation = "sdpa"
    with torch.device(dev):
        m = Qwen3ForCausalLM(c)
    if getattr(m.config, "_attn_implementation", "sdpa") != "sdpa":
        raise RuntimeError("transformers did not take attn_implementation sdpa")
    return m


def cmd_torch(a):
    """The PyTorch worker: builds the model once, prints {"ready": ...}, then answers one JSON
    line per request read from stdin: {"cmd": "run", "T", "mode", "prec", "steps", "profile"}
    -> {"ok": true, "time", "times", "peak", "reserved", "loss1", "loss", ...} or {"ok": false,
    "why": "OOM" | "error: ..."}; {"cmd": "quit"} ends it. Everything else it prints goes to
    stderr (the protocol has stdout to itself)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint as ckpt
    cfg = model_cfg(a)
    gf = configure(cfg)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    src = build_model(gf)  # on the host: the weights sbpc's export holds
    impl = a.torch_impl
    if impl == "auto":
        try:
            import transformers  # noqa: F401
            from transformers import Qwen3ForCausalLM  # noqa: F401
            impl = "hf"
        except ImportError:
            impl = "own"
    if impl == "hf":
        model = hf_qwen3(cfg, torch, "meta")
        init_p = {n: t.detach().clone() for n, t in src.state_dict().items()}
        names = {n for n, _ in model.named_parameters()}
        if names != set(init_p):
            raise RuntimeError("HF Qwen3 parameters differ from the fixture's: %s / %s"
                               % (sorted(names - set(init_p))[:5], sorted(set(init_p) - names)[:5]))
        model.to_empty(device="cpu")
        with torch.no_grad():  # the rotary buffers (garbage after to_empty), as HF makes them
            for mod in model.modules():
                if type(mod).__name__.endswith("RotaryEmbedding"):
                    with torch.device("cpu"):
                        fresh = type(mod)(mod.config)
                    for bn, b in fresh.named_buffers():
                        getattr(mod, bn).copy_(b)
        del src
    else:
        model = src
        init_p = {n: t.detach().clone() for n, t in model.named_parameters()}
    init_b = {n: b.detach().clone() for n, b in model.named_buffers()}
    if dev.type == "cuda":
        init_p = {n: t.pin_memory() for n, t in init_p.items()}
    model.to_empty(device="meta")  # parked: nothing on the device between runs
    rot = None if impl == "hf" else model.model.layers[0].self_attn.rotary_emb
    groups = cfg["H"] // cfg["KV"]
    sdpa = F.scaled_dot_product_attention
    try:
        sdpa_scale = "scale" in inspect.signature(sdpa).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        sdpa_scale = False

    def layer_fwd(layer, x, pos):  # --torch-impl own: the fixture's layer with SDPA
        at = layer.self_attn
        B, T, _ = x.shape
        r = x
        x = layer.input_layernorm(x)
        q = at.q_norm(at.q_proj(x).view(B, T, -1, cfg["HD"])).transpose(1, 2)
        k = at.k_norm(at.k_proj(x).view(B, T, -1, cfg["HD"])).transpose(1, 2)
        v = at.v_proj(x).view(B, T, -1, cfg["HD"]).transpose(1, 2)
        cos, sin = rot.cos_cached[:T], rot.sin_cached[:T]
        q, k = gf.apply_rotary_pos_emb(q, k, cos, sin, pos)
        k, v = gf.repeat_kv(k, groups), gf.repeat_kv(v, groups)
        o = sdpa(q, k, v, is_causal=True, scale=at.scaling) if sdpa_scale else \
            sdpa(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(B, T, -1)
        x = r + at.o_proj(o)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def logits_of(ids, use_ckpt):
        if impl == "hf":
            return model(input_ids=ids, use_cache=False).logits
        pos = torch.arange(ids.shape[1], device=dev)[None]
        h = model.model.embed_tokens(ids)
        for layer in model.model.layers:
            h = ckpt.checkpoint(layer_fwd, layer, h, pos, use_reentrant=False) if use_ckpt \
                else layer_fwd(layer, h, pos)
        return model.lm_head(model.model.norm(h))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def unpark(use_ckpt):
        model.to_empty(device=dev)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(init_p[n], non_blocking=True)
            for n, b in model.named_buffers():
                b.copy_(init_b[n])
        model.train()
        if impl == "hf":  # every decoder layer (transformers >= 5.2x: activation_...)
            on = getattr(model, "activation_checkpointing_enable", None)
            if on is not None:
                on(activation_checkpointing_kwargs={"use_reentrant": False}) if use_ckpt \
                    else model.activation_checkpointing_disable()
            elif use_ckpt:
                model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
        sync()

    def park():
        model.zero_grad(set_to_none=True)
        model.to_empty(device="meta")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear:
                clear()

    def run(req):
        T, mode, prec = req["T"], req["mode"], req["prec"]
        steps, use_ckpt = max(1, req.get("steps", 5)), mode == "torch+ckpt"
        cast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16) \
            if prec == "bf16" else None
        ids, labels = (torch.tensor([x], dtype=torch.long, device=dev)
                       for x in batch(T, cfg["V"]))  # the batch sbp-train gets
        opt = None

        def full_step():
            if cast is not None:
                with cast:
                    logits = logits_of(ids, use_ckpt)
                    loss = F.cross_entropy(logits.float().view(-1, cfg["V"]), labels.view(-1))
            else:
                logits = logits_of(ids, use_ckpt)
                loss = F.cross_entropy(logits.float().view(-1, cfg["V"]), labels.view(-1))
            del logits
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            return loss.item()

        try:
            unpark(use_ckpt)
            opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                    weight_decay=WD)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times, losses = [], []
            for _ in range(steps):
                model.zero_grad(set_to_none=True)
                sync()
                t0 = time.perf_counter()
                losses.append(full_step())
                sync()
                times.append(time.perf_counter() - t0)
            cuda = dev.type == "cuda"
            res = dict(ok=True, time=statistics.median(times[WARMUP:] or times), times=times,
                       peak=torch.cuda.max_memory_allocated() if cuda else None,
                       reserved=torch.cuda.max_memory_reserved() if cuda else None,
                       loss1=losses[0], loss=losses[-1], impl=impl)
            if req.get("profile"):
                model.zero_grad(set_to_none=True)
                res["kernels"] = profile_step(torch, full_step, sync)
            return res
        except Exception as e:  # noqa: BLE001 (torch.cuda.OutOfMemoryError is a RuntimeError)
            msg = str(e)
            if isinstance(e, MemoryError) or OOM_RE.search(msg):
                return dict(ok=False, why="OOM", impl=impl)
            return dict(ok=False, why="error: " + msg.strip().splitlines()[0][:200]
                        if msg.strip() else "error: " + type(e).__name__, impl=impl)
        finally:
            opt = ids = labels = None
            park()

    info = dict(ready=True, impl=impl, params=sum(t.numel() for t in init_p.values()),
                build_s=round(time.time() - t0, 1),
                device_name=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu")
    proto.write(json.dumps(info) + "\n")
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if req.get("cmd") == "quit":
            break
        if req.get("cmd") == "run":
            res = run(req)
            res.update(T=req["T"], mode=req["mode"], prec=req["prec"])
            proto.write(json.dumps(res) + "\n")
    return 0


def profile_step(torch, run, sync):
    """[[kernel, launches, total device ns], ...] of one more step, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    act = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    with profile(activities=[act]) as prof:
        run()
        sync()
    out = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) if act == ProfilerActivity.CUDA else \
            getattr(e, "self_cpu_time_total", 0)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us:
            out.append([e.key, e.count, int(us * 1000)])
    return sorted(out, key=lambda r: -r[2])


class TorchWorker:
    """The driver's end of cmd_torch: start (wait for "ready"), request (one JSON line out, one
    back, within a time limit: past it the worker is killed), close."""

    def __init__(self, python, device, shape, impl, err_path):
        self.cmd = [python, os.path.abspath(__file__), "--torch-worker", "--device", device,
                    "--torch-impl", impl] + shape
        self.err_path = err_path
        self.p = None
        self.buf = b""
        self.info = None

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def _line(self, deadline):
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    return json.loads(line)
                except ValueError:
                    continue
            wait = deadline - time.monotonic()
            if wait <= 0:
                return "timeout"
            sel = selectors.DefaultSelector()
            sel.register(self.p.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=min(wait, 5.0))
            sel.close()
            if not ready:
                if self.p.poll() is not None:
                    return None
                continue
            data = os.read(self.p.stdout.fileno(), 1 << 16)
            if not data:
                return None
            self.buf += data

    def err_tail(self, n=1500):
        try:
            return open(self.err_path, errors="replace").read()[-n:]
        except OSError:
            return ""

    def start(self, limit):
        """None when ready, else why not."""
        self.err_f = open(self.err_path, "a" if self.info is not None else "w")
        self.p = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err_f)
        self.buf = b""
        r = self._line(time.monotonic() + limit)
        if isinstance(r, dict) and r.get("ready"):
            self.info = r
            return None
        self.kill()
        if r == "timeout":
            return "timed out building the model"
        tail = [x for x in self.err_tail(3000).splitlines() if x.strip()]
        log("PyTorch worker's stderr:\n" + "\n".join(tail[-20:]))
        return "failed: " + (tail[-1].strip()[:160] if tail else "no output")

    def request(self, req, limit):
        """The answer (a dict), or {"ok": False, "why": ...} when the worker died or timed
        out (it is killed then; the next request needs start() again)."""
        try:
            self.p.stdin.write((json.dumps(req) + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            tail = [x for x in self.err_tail(3000).splitlines() if x.strip()]
            return dict(ok=False, why="worker died: " + (tail[-1].strip()[:160] if tail else "?"))
        r = self._line(time.monotonic() + limit)
        if isinstance(r, dict):
            return r
        self.kill()
        if r == "timeout":
            return dict(ok=False, why=f"timeout (> {limit:.0f} s)")
        tail = [x for x in self.err_tail(3000).splitlines() if x.strip()]
        if tail and OOM_RE.search("\n".join(tail[-5:])):
            return dict(ok=False, why="OOM (worker died)")
        log("PyTorch worker's stderr:\n" + "\n".join(tail[-20:]))
        return dict(ok=False, why="worker died: " + (tail[-1].strip()[:160] if tail else "?"))

    def kill(self):
        if self.p is not None and self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.p = None
        if getattr(self, "err_f", None):
            self.err_f.close()
            self.err_f = None

    def close(self):
        if self.alive():
            try:
                self.p.stdin.write(b'{"cmd": "quit"}\n')
                self.p.stdin.flush()
                self.p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


# ------------------------------------------------------------------ the driver

def batch(T, V):
    """The random ids and labels of the batch at T (both sides use the same)."""
    rng = random.Random(T)
    return [rng.randrange(V) for _ in range(T)], [rng.randrange(V) for _ in range(T)]


def write_npy_i32(path, rows):
    """A [1, T] int32 .npy without numpy."""
    T = len(rows)
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (1, %d), }" % T
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%di" % T, *rows))


def device_memory(target):
    """(total, free) bytes of device 0 (cuda: nvidia-smi), or of the host (cpu)."""
    if target == "cpu":
        info = dict(l.split(":", 1) for l in open("/proc/meminfo"))
        kb = lambda k: int(info[k].split()[0]) * 1024  # noqa: E731
        return kb("MemTotal"), kb("MemAvailable")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.free",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout
        total, free = (int(x) << 20 for x in out.strip().split(","))
        return total, free
    except Exception:  # noqa: BLE001
        return None, None


def device_name(python, target):
    """torch.cuda.get_device_name(0) in a subprocess (the driver holds no CUDA context), or
    nvidia-smi's name."""
    if target == "cpu":
        return "cpu"
    try:
        r = subprocess.run([python, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def parse_cells(a):
    """[(precision, T)] in run order."""
    if a.cells:
        out = []
        for c in a.cells:
            p, _, t = c.partition(":")
            if p not in PRECISIONS or not t.isdigit():
                raise SystemExit(f"gpu_bench: --cells takes PRECISION:T (fp32:4096), not {c!r}")
            out.append((p, int(t)))
        return out
    return [(p, T) for T in sorted(set(a.seq_lens)) for p in a.precisions]


def fmt_gib(b):
    return "-" if b is None else f"{b / GIB:.2f}"


def quote(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


class Bench:
    def __init__(self, a):
        self.a = a
        self.t_start = time.monotonic()
        self.t_end = self.t_start + a.budget
        self.cfg = model_cfg(a)
        self.sbpc = os.path.join(a.build, "tools", "sbpc")
        self.train = os.path.join(a.build, "tools", "sbp-train")
        self.dir = a.model_dir or os.path.join(
            a.out, "qwen3_bench" + ("_small" if a.small else "") + f"_L{self.cfg['L']}")
        self.model = os.path.join(self.dir, "model.onnx")
        self.json_path = a.json or os.path.join(a.out, "gpu_bench.json")
        self.md_path = os.path.join(a.out, "gpu_bench.md")
        self.cells = parse_cells(a)
        self.precs = list(dict.fromkeys(p for p, _ in self.cells))
        self.plans = {}     # (prec, T) -> {strategy: planned peak bytes, AdamW state included}
        self.opt_state = {}  # (prec, T) -> {strategy: AdamW m + v bytes}
        self.consts = {}    # (prec, T) -> bytes of the step's constants
        self.rows = {}      # (prec, T, method) -> result dict
        self.largest = {}   # (prec, method) -> search result dict
        self.worker = None
        self.worker_broken = None
        self.device_name = a.device_name or "?"
        self.peaks = {}
        self.total0 = self.free0 = None
        self.notes = []

    def left(self):
        return self.t_end - time.monotonic()

    def run(self, cmd, limit):
        limit = max(1.0, min(limit, self.left()))
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            return r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired:
            return None, "", f"timed out after {limit:.0f} s"

    # -- commands (shared by the runs and --dry-run)
    def compile_cmd(self, prec, T, s, out, report=False, budget=None):
        cmd = [self.sbpc, self.model, "--batch", "1", "--seq-len", str(T), "--strategy", s,
               "--target", self.a.target, "-o", out]
        if prec == "bf16":
            cmd += ["--precision", "bf16"]
        if report:
            cmd.append("--report")
        if budget is not None:
            cmd += ["--memory-budget", str(int(budget))]
        return cmd

    def train_cmd(self, T, so, steps, log_path):
        cmd = [self.train, so, "--model", self.model,
               "--input-ids", os.path.join(self.dir, f"ids_{T}.npy"),
               "--labels", os.path.join(self.dir, f"labels_{T}.npy"),
               "--steps", str(steps), "--optimizer", "adamw", "--lr", str(LR),
               "--weight-decay", str(WD), "--clip-grad-norm", str(CLIP), "--log", log_path]
        if self.a.target == "cpu":
            cmd += ["--threads", str(os.cpu_count() or 1)]
        return cmd

    def torch_req(self, prec, T, mode, steps):
        return {"cmd": "run", "T": T, "mode": mode, "prec": prec, "steps": steps}

    def worker_cmd(self):
        return [self.a.python, os.path.abspath(__file__), "--torch-worker", "--device",
                "cpu" if self.a.target == "cpu" else "cuda", "--torch-impl",
                self.a.torch_impl] + shape_args(self.a)

    # -- 1. the model
    def export(self):
        if os.path.exists(self.model):
            log(f"model: {self.model} (exists)")
            return True
        log("exporting the model (torch.onnx) ...")
        rc, out, err = self.run([self.a.python, os.path.abspath(__file__), "--export", self.model]
                                + shape_args(self.a), 900)
        sys.stdout.write(out)
        if rc != 0:
            log(f"export failed ({rc}): {err.strip()[-2000:]}")
            return False
        return True

    # -- 2. sbpc
    def step_extra(self, prec, T, s=None):
        """What a step needs beyond --memory-budget's plan (parameters, gradients, workspace):
        the AdamW state, the constants, ids/labels and 1 GiB for the CUDA context, runtime
        scratch and cuBLAS."""
        opt = self.opt_state.get((prec, T), {}).get(s or "stream")
        if opt is None:
            opt = 8 * all_params(self.cfg)
        return opt + self.consts.get((prec, T), 1028 * T) + 8 * T + GIB

    def plan_fits(self, prec, T, s):
        """(fits, planned bytes) from a parsed --report; fits is None when no plan is known."""
        plan = self.plans.get((prec, T), {}).get(s)
        if plan is None:
            return None, None
        c = self.consts.get((prec, T), 1028 * T)
        return plan + c + 8 * T + GIB <= self.free0, plan

    def parse_report(self, prec, T, text):
        def row(key):
            m = re.search(r"^\s+%s\s+(\d+)\s+(\d+)\s+(\d+)\s*$" % re.escape(key), text, re.M)
            return [int(v) for v in m.groups()] if m else None
        peak = row("peak (params+grads+opt+workspace)")
        opt = row("optimizer state (AdamW m, v)")
        if peak is None:  # an older report: parameters + gradients + workspace, and AdamW's 2x
            parts = [row(k) for k in ("parameters", "gradients", "workspace, planned")]
            if None in parts:
                return
            peak = [p + g + w + 2 * p for p, g, w in zip(*parts)]
            opt = [2 * p for p in parts[0]]
        self.plans[(prec, T)] = dict(zip(STRATEGIES, peak))
        if opt:
            self.opt_state[(prec, T)] = dict(zip(STRATEGIES, opt))
        m = re.search(r"constants in the step library: (\d+) and (\d+) bytes", text)
        if m:
            self.consts[(prec, T)] = int(m.group(2))

    def compile(self, prec, T, s, report, budget=None, so=None):
        so = so or os.path.join(self.dir, f"step_{prec}_{s}_{T}.so")
        cmd = self.compile_cmd(prec, T, s, so, report, budget)
        t0 = time.monotonic()
        rc, out, err = self.run(cmd, 900)
        if report:
            self.parse_report(prec, T, out)
        if rc != 0:
            return None, (err.strip().splitlines() or ["?"])[-1], cmd
        return so, time.monotonic() - t0, cmd

    def write_batch(self, T):
        ids = os.path.join(self.dir, f"ids_{T}.npy")
        if not os.path.exists(ids):
            ids_v, labels_v = batch(T, self.cfg["V"])
            write_npy_i32(ids, ids_v)
            write_npy_i32(os.path.join(self.dir, f"labels_{T}.npy"), labels_v)

    def sbp_train(self, prec, T, so, steps, limit=900):
        self.write_batch(T)
        log_path = os.path.join(self.dir, f"train_{prec}_{T}.jsonl")
        if os.path.exists(log_path):
            os.remove(log_path)
        cmd = self.train_cmd(T, so, steps, log_path)
        rc, out, err = self.run(cmd, limit)
        text = out + err
        if rc is None:
            return dict(ok=False, why=f"timeout (> {limit:.0f} s)", cmd=[quote(cmd)])
        if rc != 0:
            why = "OOM" if OOM_RE.search(text) else "failed: " + \
                (err.strip().splitlines() or ["?"])[-1][:200]
            return dict(ok=False, why=why, log=text[-3000:], cmd=[quote(cmd)])
        steps_l = re.findall(r"^step (\d+) loss (\S+) tokens/s (\S+)", out, re.M)
        if not steps_l:
            return dict(ok=False, why="failed: no 'step N loss' line", log=text[-3000:],
                        cmd=[quote(cmd)])
        tps = float(steps_l[-1][2])
        res = dict(ok=True, time=T / tps if tps > 0 else float("nan"),
                   loss1=float(steps_l[0][1]), loss=float(steps_l[-1][1]), cmd=[quote(cmd)])
        try:  # per-step times from the log: differences of elapsed_s, after the warm-up steps
            el = [json.loads(x)["elapsed_s"] for x in open(log_path) if x.strip()]
            dts = [b - c for b, c in zip(el[1:], el[:-1])]
            res["times"] = [el[0]] + dts if el else []
            if dts[max(0, WARMUP - 1):]:
                res["time"] = statistics.median(dts[max(0, WARMUP - 1):])
        except (OSError, ValueError, KeyError, IndexError):
            pass
        m = re.search(r"^device launches: (\d+)", out, re.M)
        if m:
            res["launches"] = int(m.group(1))  # kernels and cuBLAS calls in the last step
        m = re.search(r"actual \S+ \S+ more in use than before the arena \((\d+) bytes", out)
        res["peak"] = int(m.group(1)) if m else None
        if m is None:  # the CPU runtime: peak RSS
            m = re.search(r"actual ([0-9.]+) (KiB|MiB|GiB) \(peak RSS", out)
            if m:
                res["peak"] = int(float(m.group(1)) * {"KiB": 1 << 10, "MiB": 1 << 20,
                                                       "GiB": 1 << 30}[m.group(2)])
        return res

    def run_sbpc(self, prec, T, s):
        if prec == "bf16" and self.a.target != "cuda":
            return dict(ok=False, why="not run: bf16 needs --target cuda")
        fits, plan = self.plan_fits(prec, T, s)
        if fits is False:
            return dict(ok=False, why="OOM (plan)", plan=plan)
        so, info, ccmd = self.compile(prec, T, s, (prec, T) not in self.plans)
        fits, plan = self.plan_fits(prec, T, s)
        if so is None:
            return dict(ok=False, why="sbpc: " + str(info)[:200], plan=plan, cmd=[quote(ccmd)])
        if fits is False:
            os.remove(so)
            return dict(ok=False, why="OOM (plan)", plan=plan, cmd=[quote(ccmd)])
        r = self.sbp_train(prec, T, so, self.a.steps, self.a.run_limit)
        r.update(plan=plan, compile_s=round(info, 1), cmd=[quote(ccmd)] + r.get("cmd", []))
        try:
            os.remove(so)
        except OSError:
            pass
        return r

    # -- PyTorch, through the worker
    def ensure_worker(self):
        """None when the worker is up, else why not."""
        if self.worker is not None and self.worker.alive():
            return None
        if self.a.no_torch:
            return "not run (--no-torch)"
        if self.worker_broken:  # it failed to start once: not again at every row
            return self.worker_broken
        if self.worker is None:
            self.worker = TorchWorker(self.a.python, "cpu" if self.a.target == "cpu" else "cuda",
                                      shape_args(self.a), self.a.torch_impl,
                                      os.path.join(self.dir, "torch_worker.err"))
        t0 = time.monotonic()
        why = self.worker.start(max(30.0, min(900.0, self.left())))
        if why:
            log(f"PyTorch worker: {why}")
            self.worker_broken = why
            return why
        i = self.worker.info
        log(f"PyTorch worker: {i['impl']} model, {i['params'] / 1e9:.3f} B parameters, ready in "
            f"{time.monotonic() - t0:.1f} s ({i['device_name']})")
        if self.device_name in ("?", "") and i.get("device_name"):
            self.device_name = i["device_name"]
            self.peaks = peaks_for(self.device_name, self.a.peaks)
        return None

    def run_torch(self, prec, T, mode, steps=None, limit=None):
        why = self.ensure_worker()
        if why:
            return dict(ok=False, why=why if why.startswith("not run") else "worker: " + why)
        req = self.torch_req(prec, T, mode, steps or self.a.steps)
        r = self.worker.request(req, max(5.0, min(limit or self.a.run_limit, self.left())))
        r["cmd"] = [quote(self.worker_cmd()) + "  <<< " + json.dumps(req)]
        return r

    # -- the cells
    def add_row(self, prec, T, m, r):
        r.update(prec=prec, T=T, method=m, side="torch" if m in TORCH_MODES else "sbpc")
        F, dense, attn = useful_flops(self.cfg, T)
        r.update(flops=F)
        if r.get("ok") and r.get("time"):
            r["tflops"] = F / r["time"] / 1e12
            pk = self.peaks.get(prec)
            r["mfu"] = r["tflops"] / pk if pk else None
        self.rows[(prec, T, m)] = r
        if r.get("ok"):
            if m in STRATEGIES:
                mem = f"planned {fmt_gib(r.get('plan'))} / measured {fmt_gib(r.get('peak'))} GiB"
            else:
                mem = f"peak {fmt_gib(r.get('peak'))} GiB ({fmt_gib(r.get('reserved'))} reserved)"
            mfu = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
            comp = f" (compiled in {r['compile_s']:.1f} s)" if r.get("compile_s") else ""
            log(f"{prec} T={T} {label(prec, m)}: {r['time']:.3f} s/step, {mem}, "
                f"{r['tflops']:.1f} TFLOP/s{mfu}, loss {r['loss1']:.4f}{comp}")
        else:
            log(f"{prec} T={T} {label(prec, m)}: {r.get('why')}")
            if r.get("log") and not str(r.get("why", "")).startswith("OOM"):
                log(r["log"][-1500:])
        self.write()

    def cells_phase(self, t_stop):
        dead = {}  # (prec, method) -> the T where it ran out of memory
        for prec, T in self.cells:
            for m in RUN_ORDER:
                if m in TORCH_MODES and self.a.no_torch:
                    continue
                d = dead.get((prec, m))
                if T > self.cfg["MAX_POS"]:
                    self.add_row(prec, T, m, dict(ok=False, why="not run: beyond the model's "
                                                  f"{self.cfg['MAX_POS']} positions"))
                    continue
                if d is not None and T > d:
                    self.add_row(prec, T, m, dict(ok=False, why=f"skipped (OOM at T={d})"))
                    continue
                if t_stop - time.monotonic() < 20:
                    self.add_row(prec, T, m, dict(ok=False, why="not run (out of time)"))
                    continue
                saved, self.t_end = self.t_end, min(self.t_end, t_stop)
                try:
                    r = self.run_sbpc(prec, T, m) if m in STRATEGIES else \
                        self.run_torch(prec, T, m)
                finally:
                    self.t_end = saved
                if str(r.get("why", "")).startswith("OOM"):
                    dead[(prec, m)] = T if d is None else min(d, T)
                self.add_row(prec, T, m, r)

    # -- 3. the largest T
    def probe_sbpc(self, prec, s, T, limit):
        """'fit', 'oom' or why not, for strategy s at T: the plan with --memory-budget (the
        free memory less what the step needs beyond the plan), then one step (unless
        --max-t-sbpc plan)."""
        if prec == "bf16" and self.a.target != "cuda":
            return "bf16 needs --target cuda"
        t_stop = time.monotonic() + limit
        budget = self.free0 - self.step_extra(prec, T, s)
        if budget <= 0:
            return "oom"
        plan_only = self.a.max_t_sbpc == "plan"
        out = os.path.join(self.dir, "probe.c" if plan_only else f"probe_{prec}_{s}.so")
        saved, self.t_end = self.t_end, min(self.t_end, t_stop)
        try:
            so, info, _ = self.compile(prec, T, s, False, budget, out)
            if so is None:
                return "oom" if re.search(r"memory budget|does not fit|too small", str(info)) \
                    else "sbpc: " + str(info)[:120]
            if plan_only:
                return "fit"
            r = self.sbp_train(prec, T, so, 1, max(1.0, t_stop - time.monotonic()))
        finally:
            self.t_end = saved
            for f in (out,):
                try:
                    os.remove(f)
                except OSError:
                    pass
        if r.get("ok"):
            return "fit"
        return "oom" if str(r.get("why", "")).startswith("OOM") else r.get("why", "failed")

    def probe_torch(self, prec, mode, T, limit):
        r = self.run_torch(prec, T, mode, steps=1, limit=limit)
        if r.get("ok"):
            return "fit"
        return "oom" if str(r.get("why", "")).startswith("OOM") else r.get("why", "failed")

    def search(self, prec, m, t_stop):
        """Doubling from the largest T that ran, then bisection, on out-of-memory."""
        step, cap = self.a.max_t_step, min(self.a.max_t, self.cfg["MAX_POS"])
        rows = [(T, r) for (p, T, mm), r in self.rows.items() if p == prec and mm == m]
        fit = [T for T, r in rows if r.get("ok")]
        oom = [T for T, r in rows if str(r.get("why", "")).startswith("OOM")]
        lo, hi = (max(fit) if fit else None), (min(oom) if oom else None)
        if lo is not None and hi is not None and hi <= lo:
            hi = None
        res = dict(prec=prec, method=m, largest=lo, oom_at=hi, probes=[], note="")
        probe = self.probe_sbpc if m in STRATEGIES else self.probe_torch

        def try_t(T):
            limit = t_stop - time.monotonic()
            if limit < 10:
                res["note"] = "out of time"
                return None
            t0 = time.monotonic()
            out = probe(prec, m, T, limit)
            res["probes"].append([T, out, round(time.monotonic() - t0, 1)])
            log(f"  largest T, {prec} {label(prec, m)}: T={T} {out} "
                f"({time.monotonic() - t0:.1f} s)")
            if out not in ("fit", "oom"):
                res["note"] = f"probe at T={T}: {out}"
                return None
            return out

        while lo is None:  # nothing ran yet: from the first cell's T, halving on OOM
            T = (hi // 2) // step * step if hi else min(cap, self.cells[0][1] // step * step
                                                       or step)
            if T < step:
                res["note"] = f"not even T={step}"
                break
            out = try_t(T)
            if out is None:
                break
            if out == "fit":
                lo = T
            else:
                hi = T
        while lo is not None and hi is None and not res["note"]:  # doubling
            if lo >= cap:
                res["note"] = f"reaches --max-t {cap}" if cap < self.cfg["MAX_POS"] else \
                    f"reaches the model's {cap} positions"
                break
            T = min(2 * lo, cap)
            out = try_t(T)
            if out == "fit":
                lo = T
            elif out == "oom":
                hi = T
        while lo is not None and hi is not None and hi - lo > step and not res["note"]:
            T = (lo + hi) // 2 // step * step
            if T <= lo or T >= hi:
                break
            out = try_t(T)
            if out == "fit":
                lo = T
            elif out == "oom":
                hi = T
        res.update(largest=lo, oom_at=hi)
        self.largest[(prec, m)] = res
        self.write()

    def search_phase(self):
        if self.a.max_t <= 0:
            return
        t_all = time.monotonic() + self.left()
        order = [(p, m) for p in self.precs for m in ("torch+ckpt", "torch")
                 if not self.a.no_torch]
        if order:  # PyTorch's half, in the worker (then closed: sbpc's probes get the card)
            t_half = time.monotonic() + (t_all - time.monotonic()) / 2
            for i, (p, m) in enumerate(order):
                share = (t_half - time.monotonic()) / (len(order) - i)
                self.search(p, m, time.monotonic() + share)
        if self.worker:
            self.worker.close()
        order = [(p, m) for p in self.precs for m in ("stream", "checkpoint", "store")
                 if p == "fp32" or self.a.target == "cuda"]
        for i, (p, m) in enumerate(order):
            share = (t_all - time.monotonic()) / (len(order) - i)
            self.search(p, m, time.monotonic() + share)

    # -- the tables and the JSON
    def cell_keys(self):
        """The (precision, T) of the rows: T ascending, fp32 before bf16."""
        return sorted({(p, T) for p, T, _ in self.rows},
                      key=lambda k: (k[1], PRECISIONS.index(k[0])))

    def sorted_rows(self):
        return sorted(self.rows.items(), key=lambda kv: (kv[0][1], PRECISIONS.index(kv[0][0]),
                                                         METHODS.index(kv[0][2])))

    def ratio(self, prec, T, num, den):
        a, b = self.rows.get((prec, T, num)), self.rows.get((prec, T, den))
        if not (a and b and a.get("ok") and b.get("ok") and b.get("time")):
            return None
        return a["time"] / b["time"]

    def target_of(self, prec, T, num, den):
        for p, t, n, d, lim in TARGETS:
            if (p is None or p == prec) and (t is None or t == T) and (n, d) == (num, den):
                return lim
        return None

    def ratios(self):
        out = []
        for prec, T in self.cell_keys():
            for num, den in RATIOS:
                v, lim = self.ratio(prec, T, num, den), self.target_of(prec, T, num, den)
                if v is None and lim is None:
                    continue
                out.append(dict(prec=prec, T=T, num=num, den=den, ratio=v, target=lim,
                                passed=None if v is None or lim is None else v <= lim))
        return out

    def targets(self):
        """Every target, with its value where it was measured."""
        out = []
        have = self.ratios()
        for p, t, n, d, lim in TARGETS:
            hits = [r for r in have if r["num"] == n and r["den"] == d and r["target"] == lim
                    and (p is None or r["prec"] == p) and (t is None or r["T"] == t)]
            if not hits:
                out.append(dict(prec=p, T=t, num=n, den=d, target=lim, ratio=None, passed=None))
            out += [dict(r) for r in hits]
        return out

    def meta(self):
        c = self.cfg
        F4 = useful_flops(c, 4096)
        if not hasattr(self, "commit"):
            try:
                self.commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                             capture_output=True, text=True,
                                             timeout=10).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                self.commit = ""
        commit = self.commit
        return dict(model=c, params=all_params(c), n_nonemb=nonemb_params(c),
                    flops_formula="6*N_nonemb*T*B + 6*L*H*HD*T^2*B",
                    flops_T4096=F4[0], device_name=self.device_name, peaks_tflops=self.peaks,
                    device_total=self.total0, device_free=self.free0, target=self.a.target,
                    steps=self.a.steps, warmup=WARMUP, lr=LR, weight_decay=WD, clip=CLIP,
                    optimizer="AdamW", batch=1, cells=[f"{p}:{T}" for p, T in self.cells],
                    torch_impl=(self.worker.info or {}).get("impl") if self.worker else
                    self.a.torch_impl, commit=commit, budget_s=self.a.budget,
                    elapsed_s=round(time.monotonic() - self.t_start, 1),
                    dry_run=bool(self.a.dry_run), notes=self.notes)

    def write(self):
        rows = []
        for (p, T, m), r in self.sorted_rows():
            r = {k: v for k, v in r.items() if k not in ("log",)}
            rows.append(r)
        doc = dict(meta=self.meta(), rows=rows, ratios=self.ratios(), targets=self.targets(),
                   largest=[self.largest[k] for k in sorted(self.largest, key=lambda k: (
                       PRECISIONS.index(k[0]), METHODS.index(k[1])))])
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.json_path)
        with open(self.md_path, "w") as f:
            f.write(self.table() + "\n")

    def table(self):
        c = self.cfg
        pk = ", ".join(f"{k} {v:g}" for k, v in self.peaks.items()) or \
            "unknown (MFU not shown; --peaks fp32=..,bf16=..)"
        impl = (self.worker.info or {}).get("impl") if self.worker and self.worker.info else \
            self.a.torch_impl
        lines = [f"Qwen3-0.6B-shaped random model: d={c['D']}, {c['L']} layers, {c['H']} heads, "
                 f"{c['KV']} KV heads, head dim {c['HD']}, d_ff {c['FF']}, V={c['V']} "
                 f"({all_params(c) / 1e9:.3f} B parameters, N_nonemb "
                 f"{nonemb_params(c) / 1e6:.1f} M); "
                 f"batch 1; target {self.a.target}; device {self.device_name}, "
                 f"{(self.total0 or 0) / GIB:.1f} GiB ({(self.free0 or 0) / GIB:.1f} GiB free "
                 f"at start); dense peaks (TFLOP/s): {pk}; PyTorch: "
                 f"{'HF Qwen3ForCausalLM, sdpa' if impl == 'hf' else impl}",
                 "",
                 f"One step: forward, backward, gradient norm (clip {CLIP:g}), AdamW (lr {LR:g}, "
                 f"wd {WD:g}). Step time: median of the {max(1, self.a.steps - WARMUP)} steps "
                 f"after {WARMUP} warm-up ones. Peak memory: sbpc planned / measured above the "
                 "CUDA context; PyTorch max_memory_allocated. TFLOP/s and MFU: useful FLOPs "
                 "6*N_nonemb*T + 6*L*H*HD*T^2 (recompute not counted) per step time; MFU against "
                 "the row precision's dense peak. fp32: no TF32 on either side; bf16: sbpc "
                 "--precision bf16, PyTorch torch.autocast(bfloat16).", "",
                 "| precision | T | method | step s | peak GiB | TFLOP/s | MFU | loss (step 1) |",
                 "|---|---|---|---|---|---|---|---|"]
        for (p, T, m), r in self.sorted_rows():
            if not r.get("ok"):
                mem = f"planned {fmt_gib(r['plan'])}" if r.get("plan") else "-"
                lines.append(f"| {p} | {T} | {label(p, m)} | {r.get('why', 'failed')} | {mem} "
                             "| - | - | - |")
                continue
            mem = f"{fmt_gib(r.get('plan'))} / {fmt_gib(r.get('peak'))}" if m in STRATEGIES \
                else fmt_gib(r.get("peak"))
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            lines.append(f"| {p} | {T} | {label(p, m)} | {r['time']:.3f} | {mem} | "
                         f"{r['tflops']:.1f} | {mfu} | {r['loss1']:.5f} |")
        lines += ["", "Step-time ratios, sbpc / PyTorch of the same precision (lower is better; "
                  "PASS/FAIL against a target's limit):", "",
                  "| precision | T | " + " | ".join(f"{n} / {d}" for n, d in RATIOS) + " |",
                  "|---|---|" + "---|" * len(RATIOS)]
        for p, T in self.cell_keys():
            cells = []
            for n, d in RATIOS:
                v, lim = self.ratio(p, T, n, d), self.target_of(p, T, n, d)
                s = "-" if v is None else f"{v:.2f}x"
                if lim is not None:
                    s += "" if v is None else (" PASS" if v <= lim else " FAIL")
                    s += f" (<= {lim:.2f}x)"
                cells.append(s)
            lines.append(f"| {p} | {T} | " + " | ".join(cells) + " |")
        tg = self.targets()
        npass = sum(1 for t in tg if t["passed"])
        nfail = sum(1 for t in tg if t["passed"] is False)
        lines += ["", f"Targets: {npass} passed, {nfail} failed, "
                  f"{sum(1 for t in tg if t['passed'] is None)} not measured"]
        for t in tg:
            where = f"{t['prec'] or 'every precision'}, " + (f"T = {t['T']}" if t["T"] else
                                                             "every T")
            state = "not measured" if t["passed"] is None else \
                f"{t['ratio']:.2f}x {'PASS' if t['passed'] else 'FAIL'}"
            lines.append(f"  {t['num']} <= {t['target']:.2f}x {t['den']} ({where}): {state}")
        lines += ["", "Largest T that ran a step (--max-t search: doubling, then bisection to "
                  f"{self.a.max_t_step}; sbpc: its plan with --memory-budget"
                  + (", no step" if self.a.max_t_sbpc == "plan" else ", then one step") + "):", "",
                  "| precision | method | largest T | first T out of memory | probes | note |",
                  "|---|---|---|---|---|---|"]
        if not self.largest:
            lines.append("| - | - | not searched | - | - | "
                         + ("--max-t 0" if self.a.max_t <= 0 else "no time left") + " |")
        for (p, m), r in sorted(self.largest.items(), key=lambda kv: (
                PRECISIONS.index(kv[0][0]), METHODS.index(kv[0][1]))):
            big = "-" if r["largest"] is None else str(r["largest"])
            if r["largest"] is not None and r["oom_at"] is None:
                big = ">= " + big
            lines.append(f"| {p} | {label(p, m)} | {big} | {r['oom_at'] or '-'} | "
                         f"{len(r['probes'])} | {r['note'] or '-'} |")
        return "\n".join(lines)

    # -- the plan (--dry-run) and the whole run
    def dry_run(self):
        c = self.cfg
        self.peaks = peaks_for(self.device_name, self.a.peaks)
        log(f"dry run: nothing is exported, compiled or run; model {self.model}")
        log(f"model: d={c['D']}, L={c['L']}, H={c['H']}, KV={c['KV']}, HD={c['HD']}, "
            f"FF={c['FF']}, V={c['V']}: {all_params(c) / 1e9:.3f} B parameters, N_nonemb "
            f"{nonemb_params(c):,}")
        log(f"device: {self.device_name} (not probed); dense peaks TFLOP/s: "
            f"{self.peaks or 'unknown'}")
        log(f"optimizer: AdamW lr {LR:g}, wd {WD:g}, clip {CLIP:g}; {self.a.steps} steps a run, "
            f"the median of those after {WARMUP}; budget {self.a.budget:.0f} s, "
            f"{self.a.run_limit:.0f} s a run")
        log(f"cells, in order: {' '.join(f'{p}:{T}' for p, T in self.cells)} "
            f"(T list: {sorted({T for _, T in self.cells})})")
        log(f"PyTorch worker: {quote(self.worker_cmd())}")
        plan, reported = [], set()
        for prec, T in self.cells:
            F, dense, attn = useful_flops(c, T)
            log(f"\n[{prec} T={T}] useful FLOPs {F / 1e12:.2f} T ({dense / 1e12:.2f} matrix "
                f"products + {attn / 1e12:.2f} attention)")
            for m in RUN_ORDER:
                if m in TORCH_MODES and self.a.no_torch:
                    continue
                if m in STRATEGIES:
                    so = os.path.join(self.dir, f"step_{prec}_{m}_{T}.so")
                    if prec == "bf16" and self.a.target != "cuda":
                        cmds = ["(not run: bf16 needs --target cuda)"]
                    else:
                        first = (prec, T) not in reported
                        reported.add((prec, T))
                        cmds = [quote(self.compile_cmd(prec, T, m, so, first)),
                                quote(self.train_cmd(T, so, self.a.steps, os.path.join(
                                    self.dir, f"train_{prec}_{T}.jsonl")))]
                else:
                    cmds = ["worker <<< " + json.dumps(self.torch_req(prec, T, m,
                                                                      self.a.steps))]
                log(f"  {label(prec, m)}:")
                for x in cmds:
                    log(f"    {x}")
                self.rows[(prec, T, m)] = dict(ok=False, why="planned (dry run)", cmd=cmds)
                plan.append(dict(prec=prec, T=T, method=m, cmd=cmds))
        if self.a.max_t > 0:
            cap = min(self.a.max_t, c["MAX_POS"])
            log(f"\nlargest-T search: for each precision {self.precs}: torch+ckpt, torch (one "
                f"step a probe, in the worker), then stream, checkpoint, store (sbpc "
                f"--memory-budget, then {'no step' if self.a.max_t_sbpc == 'plan' else 'one step'}"
                f"); doubling from the largest T that ran up to {cap}, then bisection to "
                f"{self.a.max_t_step}; within what is left of the budget after the cells (at "
                f"least --max-t-budget {self.a.max_t_budget:.0f} s reserved), half each side")
        else:
            log("\nlargest-T search: off (--max-t 0)")
        self.write()
        log(f"\nwrote {self.json_path} and {self.md_path}")
        return 0

    def main(self):
        os.makedirs(self.dir, exist_ok=True)
        if self.a.dry_run:
            return self.dry_run()
        self.total0, self.free0 = device_memory(self.a.target)
        if not self.a.device_name:
            self.device_name = device_name(self.a.python, self.a.target)
        self.peaks = peaks_for(self.device_name, self.a.peaks)
        if not self.free0:
            log("cannot read the device's memory (nvidia-smi)")
            return 1
        if self.a.device_free:
            self.free0 = self.a.device_free
        elif self.a.small and self.a.target == "cpu":
            self.free0 = min(self.free0, 4 * GIB)
        log(f"device: {self.device_name}, {self.free0 / GIB:.1f} GiB free; peaks "
            f"{self.peaks or 'unknown'}; budget {self.left():.0f} s; cells "
            f"{' '.join(f'{p}:{T}' for p, T in self.cells)}")
        self.write()
        if not self.export():
            return 1
        reserve = min(self.a.max_t_budget, self.left() * 0.5) if self.a.max_t > 0 else 0
        try:
            self.cells_phase(self.t_end - reserve)
            self.search_phase()
        finally:
            if self.worker:
                self.worker.close()
        self.write()
        print("\n" + self.table(), flush=True)
        log(f"\nwrote {self.md_path} and {self.json_path}")
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "gpu_bench"),
                    help="gpu_bench.md and gpu_bench.json go here")
    ap.add_argument("--json", help="the JSON file (default OUT/gpu_bench.json)")
    ap.add_argument("--model-dir", help="the export, steps and batches (default "
                    "OUT/qwen3_bench_L<layers>)")
    ap.add_argument("--budget", type=float, default=1800, help="seconds for everything")
    ap.add_argument("--run-limit", type=float, default=600, help="seconds for one run")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=PRECISIONS)
    ap.add_argument("--cells", nargs="+", metavar="PREC:T",
                    help="(precision, T) to run, in this order (instead of --seq-lens x "
                    "--precisions)")
    ap.add_argument("--steps", type=int, default=5,
                    help="steps per run; the median of those after the %d warm-up ones" % WARMUP)
    ap.add_argument("--max-t", type=int, default=None,
                    help="the largest-T search's cap (default the model's positions; 0: no search)")
    ap.add_argument("--max-t-step", type=int, default=1024, help="the search's resolution")
    ap.add_argument("--max-t-budget", type=float, default=600,
                    help="seconds kept for the search (both sides)")
    ap.add_argument("--max-t-sbpc", choices=["run", "plan"], default="run",
                    help="sbpc's probes: the plan, then one step (run), or the plan alone")
    ap.add_argument("--target", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny model (smoke test)")
    ap.add_argument("--layers", type=int, help="the model's layers (default: Qwen3-0.6B's 28)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-impl", choices=["auto", "hf", "own"], default="auto",
                    help="PyTorch's model: transformers' Qwen3 with sdpa (hf; auto when "
                    "transformers is there) or the fixture's module with SDPA (own)")
    ap.add_argument("--device-free", type=int, default=0,
                    help="bytes to take as the device's free memory (default: measured)")
    ap.add_argument("--device-name", help="the device's name for the peak table (default: "
                    "torch.cuda.get_device_name)")
    ap.add_argument("--peaks", help="dense peaks, TFLOP/s: fp32=67,tf32=495,bf16=989")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan (cells, commands, search) and write the JSON; no GPU")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    # subprocess modes
    ap.add_argument("--export", help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.export:
        return cmd_export(a)
    if a.torch_worker:
        return cmd_torch(a)
    if a.max_t is None:
        a.max_t = model_cfg(a)["MAX_POS"]
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    return Bench(a).main()


if __name__ == "__main__":
    sys.exit(main())
