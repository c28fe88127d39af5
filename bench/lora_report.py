#!/usr/bin/env python3
"""Full fine-tuning against LoRA in planned bytes on a Qwen3-0.6B-shaped model.

    .venv-hf/bin/python bench/lora_report.py [--build build] [--rank 16]
                                             [--seq-lens 8192 32768 131072] [--fit-gib 24 80]
                                             [--bf16]

Exports (once) bench/models/qwen3_06b_shaped.onnx from transformers' Qwen3ForCausalLM with
Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 KV heads of 128, MLP 3072, vocabulary
151936, tied embeddings; random weights; the dynamo exporter, external data, about 2.4 GB). Then
asks `sbpc --report` (batch 1, the stream strategy's column) for the planned bytes of a full
fine-tune and of `--lora RANK` (the default targets: every attention and MLP projection) at each
T: parameters, gradients and AdamW state (only trained parameters have the last two) and the
workspace; and finds by bisection over T (multiples of 1024) the longest sequence whose planned
peak fits each budget. The plan is the compiler's own arithmetic, nothing runs; what a device
also needs (the CUDA context, cuBLAS's workspace, the runtime's scratch: some hundreds of MiB)
is not in it.

--bf16 adds the CUDA mixed-precision plans of the same LoRA step (--target cuda --precision
bf16: activations bf16, the weights fp32 with a bf16 copy for the GEMMs), and the same with
--base-precision bf16 (the frozen projections and the tied embedding / LM head, which the
gather reads as bf16 too, kept as bf16 only: 2 bytes an element instead of 4 + 2; the norms
stay fp32).
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(HERE, "models", "qwen3_06b_shaped.onnx")


def export():
    if os.path.exists(MODEL):
        return MODEL
    import torch
    import transformers as tf
    from torch.export import Dim
    torch.manual_seed(0)
    cfg = tf.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=262144, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    model = tf.Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 151936, (1, 64))
    os.makedirs(os.path.dirname(MODEL), exist_ok=True)
    t0 = time.time()
    out = torch.onnx.export(model, (), None, kwargs={"input_ids": ids, "use_cache": False},
                            input_names=["input_ids"], output_names=["logits"],
                            dynamic_shapes={"input_ids": {0: Dim("batch", min=1, max=64),
                                                          1: Dim("sequence", min=2,
                                                                 max=262144)},
                                            "use_cache": None})
    out.save(MODEL, external_data=True)
    print("exported %s in %.0f s" % (MODEL, time.time() - t0), flush=True)
    return MODEL


ROWS = {"parameters": "params", "gradients": "grads", "optimizer state (AdamW m, v)": "opt",
        "workspace, planned": "ws", "peak (params+grads+opt+workspace)": "peak"}


def report(sbpc, T, rank, extra=()):
    """The stream column of sbpc --report: {params, grads, opt, ws, peak} in bytes."""
    cmd = [sbpc, MODEL, "--batch", "1", "--seq-len", str(T), "--report", "--no-eval"]
    if rank:
        cmd += ["--lora", str(rank)]
    cmd += list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        for label, key in ROWS.items():
            m = re.match(r"\s+%s\s+(\S+)\s+(\S+)\s+(\S+)\s*$" % re.escape(label), line)
            if m:
                got[key] = int(m.group(3))  # store, checkpoint, stream
    if len(got) != len(ROWS):
        sys.exit("lora_report.py: could not read the report:\n" + out)
    return got


def longest(sbpc, rank, budget, lo, hi, extra=()):
    """The largest T = 1024 k in [lo, hi] whose stream plan fits budget bytes (lo's must)."""
    while lo < hi:
        mid = (lo + hi + 1024) // 2048 * 1024
        if mid <= lo:
            mid = lo + 1024
        if report(sbpc, mid, rank, extra)["peak"] <= budget:
            lo = mid
        else:
            hi = mid - 1024
    return lo


def gib(b):
    return "%.2f GiB" % (b / 2**30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--seq-lens", nargs="*", type=int, default=[8192, 32768, 131072])
    ap.add_argument("--fit-gib", nargs="*", type=float, default=[24, 80])
    ap.add_argument("--max-seq", type=int, default=1 << 20)
    ap.add_argument("--bf16", action="store_true",
                    help="also the cuda bf16 LoRA plans, with and without --base-precision bf16")
    a = ap.parse_args()
    export()
    sbpc = os.path.join(a.build, "tools", "sbpc")
    lora = "LoRA r=%d" % a.rank
    cuda = ["--target", "cuda", "--precision", "bf16"]
    variants = [("full", 0, []), (lora, a.rank, [])]
    if a.bf16:
        variants += [(lora + ", cuda bf16", a.rank, cuda),
                     (lora + ", cuda bf16, base bf16", a.rank,
                      cuda + ["--base-precision", "bf16"])]
    print("| T | | parameters | gradients | AdamW m, v | workspace | planned peak |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for T in a.seq_lens:
        for name, rank, extra in variants:
            r = report(sbpc, T, rank, extra)
            print("| %d | %s | %s | %s | %s | %s | %s |" % (
                T, name, gib(r["params"]), gib(r["grads"]), gib(r["opt"]), gib(r["ws"]),
                gib(r["peak"])), flush=True)
    print()
    print("| budget | " + " | ".join("%s: longest T" % v[0] for v in variants) + " |")
    print("|---:|" + "---:|" * len(variants))
    for g in a.fit_gib:
        budget = int(g * 2**30)
        cells = []
        for _, rank, extra in variants:
            if report(sbpc, 1024, rank, extra)["peak"] > budget:
                cells.append("does not fit")
                continue
            cells.append("%d" % longest(sbpc, rank, budget, 1024, a.max_seq, extra))
        print("| %g GiB | %s |" % (g, " | ".join(cells)), flush=True)


if __name__ == "__main__":
    main()
