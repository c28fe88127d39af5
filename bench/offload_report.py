#!/usr/bin/env python3
"""Device and host bytes of a bf16 CUDA step with and without sbpc --offload checkpoints, on
Llama-3-shaped exports, and the longest sequence whose planned device peak fits an H200 and an
H100.

    .venv-hf/bin/python bench/offload_report.py [--build build] [--models llama3_8b llama3_1b]
        [--seq-lens 8192 65536] [--depth 4]

The shapes are the real ones (Llama-3-8B: 32 layers, d = 4096, 32/8 heads of 128, MLP 14336,
V = 128256, untied; Llama-3.2-1B: 16 layers, d = 2048, 32/8 heads of 64, MLP 8192, tied), but a
full export of the 8B model (32 GB of fp32 weights) does not fit this machine's 24 GB. So each
is exported twice from its `transformers` class with random weights, with D and D + 1 layers at
full width (--depth D, default 4; bench/models/, dynamo exporter, external data), and planned by
`sbpc --target cuda --precision bf16 --strategy stream --chunk C --logits-chunk R --report`.
Every figure of the plan is then a + b * layers exactly (each layer adds the same parameters,
gradients, optimizer state and, at a given T, the same checkpoint; the workspace's peak is
reached in a backward, with the same buffers live whatever the depth, plus the checkpoints
still waiting), so the full depth's figure is the D-layer one plus (L - D) times the difference
of the two. That needs D of at least 4 once the gradients are streamed (--offload optimizer):
about three layers' gradients are on the device at once (arriving, accumulating, leaving), so a
model of 2 or 3 layers has all of them live and the difference would count a layer's gradients
that the deep model does not keep (measured on the 1B shape: the streamed gradients at the peak
are the same at 4, 5 and 6 layers). The same holds in T at fixed chunks (each buffer is either a
chunk's or every token's), so the longest T that fits a device follows from two lengths; it is
then planned at that length (D and D + 1 layers again) to check.

The figures, for --offload none, checkpoints, optimizer and both: the planned device peak (sbpc's
"peak (params+grads+opt+workspace)": the parameter block (fp32 masters, or with --offload
optimizer the bf16 weights), the gradients, AdamW's two moments unless offloaded, and the
workspace with its bf16 copy of the fp32 weights; with --offload optimizer also the gradients
on their way to the host, a few layers' at a time), the blocks outside the workspace (peak minus
workspace: the parameter block, and without --offload optimizer the gradient block and AdamW's
moments), and the host bytes (the checkpoints; the fp32 masters, AdamW's m and v and the
gradients' copy). A device peak is the plan's; the runtime's own scratch and cuBLAS's workspace
come on top (some hundreds of MiB). Next to them: ALST's 1.2M tokens of Llama-3.1-8B on one
H200.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = os.path.join(HERE, "models")
GIB = 1 << 30
DEVICES = (("H200", 141e9), ("H100", 80e9))


def configs():
    import transformers as tf
    return {
        "llama3_8b": (32, dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               rope_theta=500000.0, max_position_embeddings=1 << 22,
                               tie_word_embeddings=False)),
        "llama3_1b": (16, dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                               rope_theta=500000.0, max_position_embeddings=1 << 22,
                               tie_word_embeddings=True)),
    }, tf.LlamaConfig, tf.LlamaForCausalLM


def export(name, layers):
    path = os.path.join(MODELS, "%s_%dl.onnx" % (name, layers))
    if os.path.exists(path):
        return path
    import torch
    from torch.export import Dim
    cfgs, cfg_cls, model_cls = configs()
    _, kw = cfgs[name]
    torch.manual_seed(0)
    cfg = cfg_cls(**dict(kw, num_hidden_layers=layers))
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    model = model_cls(cfg).eval()
    ids = torch.randint(0, kw["vocab_size"], (1, 64))
    os.makedirs(MODELS, exist_ok=True)
    t0 = time.time()
    out = torch.onnx.export(model, (), None, kwargs={"input_ids": ids, "use_cache": False},
                            input_names=["input_ids"], output_names=["logits"],
                            dynamic_shapes={"input_ids": {0: Dim("batch", min=1, max=64),
                                                          1: Dim("sequence", min=2,
                                                                 max=1 << 22)},
                                            "use_cache": None})
    out.save(path, external_data=True)
    print("exported %s in %.0f s" % (os.path.relpath(path), time.time() - t0), flush=True)
    del model, out
    return path


MODES = (("none", []), ("checkpoints", ["--offload", "checkpoints"]),
         ("optimizer", ["--offload", "optimizer"]),
         ("both", ["--offload", "checkpoints,optimizer"]))
_plans = {}


def plan(sbpc, path, T, mode, chunk, logits_chunk):
    """(device peak, workspace, host bytes) of the stream step at T, in bytes (cached)."""
    key = (path, T, mode, chunk, logits_chunk)
    if key in _plans:
        return _plans[key]
    cmd = [sbpc, path, "--batch", "1", "--seq-len", str(T), "--target", "cuda", "--precision",
           "bf16", "--strategy", "stream", "--chunk", str(chunk), "--logits-chunk",
           str(logits_chunk), "--no-eval", "--report"] + dict(MODES)[mode]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("sbpc failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-2000:]))

    def col(label):  # the stream column (the last) of a row of the table
        m = re.search(r"^  %s\s.*?(\d+)\s*$" % re.escape(label), r.stdout, re.M)
        return int(m.group(1)) if m else 0
    peak = col("peak (params+grads+opt+workspace)")
    ws = col("workspace, planned")
    host = col("host: offloaded checkpoints") + col("host: masters, AdamW m, v, grads")
    _plans[key] = (peak, ws, host)
    return _plans[key]


def figures(sbpc, paths, layers, T, mode, chunk, lc):
    """The full depth's (device peak, workspace, host bytes): a + b * layers through the D- and
    (D + 1)-layer plans (paths: {depth: export})."""
    d0, d1 = sorted(paths)
    p0 = plan(sbpc, paths[d0], T, mode, chunk, lc)
    p1 = plan(sbpc, paths[d1], T, mode, chunk, lc)
    return [a + (layers - d0) * (b - a) for a, b in zip(p0, p1)]


def longest(sbpc, paths, layers, mode, chunk, lc, t_lo, t_hi, budget):
    """The longest T (a multiple of chunk) whose full-depth device peak fits budget, from the
    line through t_lo and t_hi, checked by a plan at it; None when nothing fits."""
    lo = figures(sbpc, paths, layers, t_lo, mode, chunk, lc)[0]
    hi = figures(sbpc, paths, layers, t_hi, mode, chunk, lc)[0]
    per_token = (hi - lo) / (t_hi - t_lo)
    state = lo - per_token * t_lo
    if state + per_token * chunk > budget:
        return None, per_token, state
    # the secant through the last two plans until a multiple of chunk fits and the next does
    # not (the peak is not quite linear in T: the planner's layout changes with the sizes)
    pts = [(t_lo, lo), (t_hi, hi)]
    best = None
    for _ in range(12):
        (t0, p0), (t1, p1) = pts[-2], pts[-1]
        slope = (p1 - p0) / (t1 - t0) if t1 != t0 else per_token
        T = max(chunk, int(t1 + (budget - p1) / slope) // chunk * chunk)
        peak = figures(sbpc, paths, layers, T, mode, chunk, lc)[0]
        if peak <= budget:
            best = T if best is None or T > best else best
            if figures(sbpc, paths, layers, T + chunk, mode, chunk, lc)[0] > budget:
                return T, per_token, state
        pts.append((T, peak))
    return best, per_token, state


def gib(x):
    return "%.1f" % (x / GIB)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", nargs="*", default=["llama3_1b", "llama3_8b"])
    ap.add_argument("--seq-lens", nargs="*", type=int, default=[8192, 65536])
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--logits-chunk", type=int, default=4096)
    a = ap.parse_args()
    sbpc = os.path.join(a.build, "tools", "sbpc")
    cfgs = configs()[0]
    for name in a.models:
        layers = cfgs[name][0]
        paths = {n: export(name, n) for n in (a.depth, a.depth + 1)}
        print("\n%s-shaped, %d layers (planned from %d- and %d-layer exports at full width), "
              "bf16 stream, chunk %d, logits chunk %d; GiB" % (name, layers, a.depth, a.depth + 1,
                                                             a.chunk, a.logits_chunk))
        print("  %9s  %-12s %12s %12s %12s %12s" % ("T", "--offload", "device peak",
                                                   "workspace", "blocks", "host"))
        for T in a.seq_lens:
            for mode, _ in MODES:
                peak, ws, host = figures(sbpc, paths, layers, T, mode, a.chunk, a.logits_chunk)
                print("  %9d  %-12s %12s %12s %12s %12s" % (T, mode, gib(peak), gib(ws),
                                                           gib(peak - ws), gib(host)))
        lo, hi = a.seq_lens[0], a.seq_lens[-1]
        for dev, budget in DEVICES:
            for mode, _ in MODES:
                T, per_token, state = longest(sbpc, paths, layers, mode, a.chunk,
                                              a.logits_chunk, lo, hi, budget)
                if T is None:
                    print("  %s (%.0f GB), --offload %-12s: fits at no T: %s GiB before the "
                          "first token" % (dev, budget / 1e9, mode, gib(state)))
                else:
                    host = figures(sbpc, paths, layers, T, mode, a.chunk, a.logits_chunk)[2]
                    print("  %s (%.0f GB), --offload %-12s: longest T %d (%.2fM tokens), %.1f "
                          "KiB of device memory per token, %s GiB of host memory" %
                          (dev, budget / 1e9, mode, T, T / 1e6, per_token / 1024, gib(host)))
    print("\nALST (DeepSpeed Ulysses + tiling + offload of weights, optimizer state and "
          "checkpoints): 1.2M tokens of Llama-3.1-8B on one H200.")


if __name__ == "__main__":
    main()
