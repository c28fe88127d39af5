#!/usr/bin/env python3
"""sbpc --report at long sequence lengths on real-shaped transformers exports.

    .venv-hf/bin/python bench/long_report.py [--build build] [--seq-lens 32768 131072]

Exports (once, into bench/models/) a Gemma-3-shaped and a Qwen3-shaped causal LM from their
`transformers` classes with the real widths of Gemma-3-1B and Qwen3-0.6B (hidden size, heads,
head dim, MLP width, sliding window 512 with 5 local layers per global one, two rotary bases)
but 6 layers and a 32000-token vocabulary, so the files stay under 1 GB; random weights, the
dynamo exporter (torch.onnx.export's default) with external data. Then runs
`sbpc MODEL --batch 1 --seq-len T --report` and prints a table: wall time and peak RSS of the
compiler, the stream plan's peak, and the attention work of a local and of a global layer as
the summary prints it (O(T*w) against O(T^2)). Needs the venv of tests/fixtures/hf.
"""
import argparse
import os
import re
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = os.path.join(HERE, "models")


def configs():
    import transformers as tf
    return {
        "gemma3_shaped": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, dict(
            vocab_size=32000, hidden_size=1152, intermediate_size=6912, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
            query_pre_attn_scalar=256, rope_theta=1000000.0, rope_local_base_freq=10000.0,
            max_position_embeddings=131072, tie_word_embeddings=True,
            layer_types=["sliding_attention"] * 5 + ["full_attention"])),
        "qwen3_shaped": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(
            vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=6,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=131072, tie_word_embeddings=True)),
    }


def export(name):
    path = os.path.join(MODELS, name + ".onnx")
    if os.path.exists(path):
        return path
    import torch
    from torch.export import Dim
    cfg_cls, model_cls, kw = configs()[name]
    torch.manual_seed(0)
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    model = model_cls(cfg).eval()
    ids = torch.randint(0, 32000, (1, 64))
    os.makedirs(MODELS, exist_ok=True)
    t0 = time.time()
    out = torch.onnx.export(model, (), None, kwargs={"input_ids": ids, "use_cache": False},
                            input_names=["input_ids"], output_names=["logits"],
                            dynamic_shapes={"input_ids": {0: Dim("batch", min=1, max=64),
                                                          1: Dim("sequence", min=2, max=131072)},
                                            "use_cache": None})
    out.save(path, external_data=True)
    print("exported %s in %.0f s" % (path, time.time() - t0), flush=True)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seq-lens", nargs="*", type=int, default=[32768, 131072])
    a = ap.parse_args()
    sbpc = os.path.join(a.build, "tools", "sbpc")
    rows = []
    for name in configs():
        path = export(name)
        for T in a.seq_lens:
            cmd = ["/usr/bin/time", "-f", "TIME %e %M", sbpc, path, "--batch", "1", "--seq-len",
                   str(T), "--report"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            tm = re.search(r"TIME ([0-9.]+) ([0-9]+)", r.stderr)
            peak = re.search(r"peak \(params\+grads\+opt\+workspace\)\s+\S+\s+\S+\s+(\d+)", r.stdout)
            att = re.findall(r"attention \d+ \(node '[^']*'\): ([^,]*(?:, O\([^)]*\))?)[^:]*: "
                             r"([0-9.e+]+) GFLOP", r.stdout)
            local = next((g for v, g in att if "window" in v), "-")
            glob = next((g for v, g in att if "window" not in v), "-")
            rows.append((name, T, r.returncode, tm.group(1) if tm else "?",
                         int(tm.group(2)) / 1024 if tm else 0,
                         int(peak.group(1)) / 2**20 if peak else 0, local, glob,
                         sum(1 for v, _ in att if "window" in v), len(att)))
            if r.returncode:
                print(r.stderr[-2000:], file=sys.stderr)
    print("%-14s %7s %3s %8s %9s %12s %16s %16s %s" % (
        "model", "T", "rc", "time s", "RSS MiB", "stream MiB", "local GFLOP/seq",
        "global GFLOP/seq", "local/all layers"))
    for r in rows:
        print("%-14s %7d %3d %8s %9.0f %12.0f %16s %16s %d/%d" % r)


if __name__ == "__main__":
    main()
