#!/usr/bin/python3
"""PyTorch side of the training benchmarks: one SFT step (forward + mean cross-entropy +
backward) of the benchmark model (bench_model.py) in float32 on the CPU, with or without
per-layer torch.utils.checkpoint, at a given T. Run once per configuration in a fresh process so
peak RSS is that configuration's own.

    /usr/bin/python3 bench/torch_baseline.py --seq-len 1024 --mode checkpoint --threads 2

Prints one line: mode T step_s_median peak_rss_bytes loss
"""
import argparse
import resource
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt

import bench_model

ap = argparse.ArgumentParser()
ap.add_argument("--seq-len", type=int, required=True)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--mode", choices=["store", "checkpoint"], required=True)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()
torch.set_num_threads(a.threads)
gf = bench_model.configure()
model = bench_model.build()
model.train()  # no dropout in the model; train() only matters for checkpointing semantics

# Per-layer checkpointing: wrap each decoder layer's forward, as HF's gradient_checkpointing does.
if a.mode == "checkpoint":
    for layer in model.model.layers:
        fwd = layer.forward

        def wrapped(*args, _fwd=fwd, **kw):
            return ckpt.checkpoint(_fwd, *args, use_reentrant=False, **kw)

        layer.forward = wrapped

g = torch.Generator().manual_seed(0)
ids = torch.randint(0, gf.VOCAB, (a.batch, a.seq_len), generator=g)
labels = torch.randint(0, gf.VOCAB, (a.batch, a.seq_len), generator=g)
times = []
loss = None
for _ in range(a.steps):
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logits = model(ids)
    loss = F.cross_entropy(logits.view(-1, gf.VOCAB), labels.view(-1), ignore_index=-100)
    loss.backward()
    times.append(time.perf_counter() - t0)
    del logits
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(f"{a.mode} {a.seq_len} {statistics.median(times):.4f} {rss} {loss.item():.6f}")
