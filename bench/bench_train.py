#!/usr/bin/python3
"""Training-step benchmark: sbpc's strategies next to PyTorch (+ per-layer checkpointing) on the
same machine, same threads, same model (bench_model.py: Llama-style d=256, 4 layers, 8 heads,
4 KV heads, d_ff 688, V=32000), batch 1, SFT loss.

    /usr/bin/python3 bench/gen_bench_model.py          # once: bench/models/llama_bench.onnx
    /usr/bin/python3 bench/bench_train.py [--build build] [--seq-lens 1024 4096]
                     [--strategies store checkpoint stream] [--threads 2] [--steps 3]
                     [--rounds N] [--no-torch]

Every configuration runs in its own process (peak RSS is its own). Step time is the median over
the steps after the first; GFLOP/s counts the step's model FLOPs (forward GEMMs + causal
attention, ×3 for forward+backward, +1 forward of the layers for recomputing strategies) and is
compared with OpenBLAS's sgemm rate measured in the same run (bench/sgemm_rate).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

import openblas_env  # noqa: F401  (OPENBLAS_CORETYPE for both sides)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
D, L, H, KV, FF, V = 256, 4, 8, 4, 688, 32000
HD = D // H


def step_flops(T, recompute_layers):
    lin = 2 * T * (D * D + 2 * D * KV * HD + HD * H * D + 3 * D * FF)  # per layer
    att = 2 * 2 * (T * T / 2) * D                                     # QK^T and PV, causal
    head = 2 * T * D * V
    fwd_layers = L * (lin + att)
    total = 3 * (fwd_layers + head)
    if recompute_layers:
        total += fwd_layers
    return total


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(f"command failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}\n")
        return None
    return r.stdout + r.stderr


def sbpc_compile(a, model, T, strategy, tmp):
    """Compiles the step and writes its inputs; returns the sbp-train command, or None."""
    so = os.path.join(tmp, f"step_{strategy}_{T}.so")
    if run([os.path.join(a.build, "tools", "sbpc"), model, "--batch", "1", "--seq-len", str(T),
            "--strategy", strategy, "-o", so]) is None:
        return None
    rng = np.random.default_rng(0)
    ids = os.path.join(tmp, f"ids_{T}.npy")
    lab = os.path.join(tmp, f"labels_{T}.npy")
    np.save(ids, rng.integers(0, V, (1, T), dtype=np.int64))
    np.save(lab, rng.integers(0, V, (1, T), dtype=np.int64))
    return [os.path.join(a.build, "tools", "sbp-train"), so, "--model", model,
            "--input-ids", ids, "--labels", lab, "--steps", str(a.steps), "--lr", "0",
            "--optimizer", "sgd", "--threads", str(a.threads)]


def sbpc_run(cmd, T):
    out = run(cmd)
    if out is None:
        return None
    tps = [float(x) for x in re.findall(r"tokens/s ([0-9.]+)", out)]
    rss = re.search(r"actual ([0-9.]+) (KiB|MiB|GiB)", out)
    planned = re.search(r"planned ([0-9.]+) (KiB|MiB|GiB)", out)
    unit = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    times = [T / x for x in tps[1:] or tps]
    return (statistics.median(times), float(rss.group(1)) * unit[rss.group(2)],
            float(planned.group(1)) * unit[planned.group(2)] if planned else float("nan"))


def torch_config(a, T, mode):
    out = run([sys.executable, os.path.join(HERE, "torch_baseline.py"), "--seq-len", str(T),
               "--mode", mode, "--threads", str(a.threads), "--steps", str(a.steps)])
    if out is None:
        return None
    f = out.strip().split("\n")[-1].split()
    return float(f[2]), float(f[3]), float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--strategies", nargs="+", default=["store", "checkpoint"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration this many times, interleaved; medians")
    a = ap.parse_args()
    model = os.path.join(HERE, "models", "llama_bench.onnx")
    if not os.path.exists(model):
        sys.exit("bench_train: run /usr/bin/python3 bench/gen_bench_model.py first")
    rate_out = run([os.path.join(a.build, "bench", "sgemm_rate"), str(a.threads)])
    peak = float(re.search(r"peak ([0-9.]+)", rate_out).group(1)) if rate_out else float("nan")
    print(f"OpenBLAS sgemm peak on this machine: {peak:.1f} GFLOP/s ({a.threads} threads)")
    # Every configuration runs once per round, the rounds interleaved, so that a burst of
    # load from other jobs on this shared machine falls on all of them; a configuration's
    # figures are its medians over the rounds, and the stream/checkpoint ratio is the median
    # of the ratios measured within each round.
    configs = []  # (T, name, recompute, run function)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for T in a.seq_lens:
            for s in a.strategies:
                cmd = sbpc_compile(a, model, T, s, tmp)
                configs.append((T, f"sbpc {s}", s != "store",
                                (lambda c=cmd, t=T: sbpc_run(c, t)) if cmd else (lambda: None)))
            if not a.no_torch:
                for m in ("store", "checkpoint"):
                    configs.append((T, f"torch {m}", m == "checkpoint",
                                    lambda t=T, mm=m: torch_config(a, t, mm)))
        for rnd in range(a.rounds):
            for T, name, _, fn in configs:
                results.setdefault((T, name), []).append(fn())
    rows = []
    for T, name, recompute, _ in configs:
        runs = [r for r in results[(T, name)] if r is not None]
        r = None
        if runs:
            r = tuple(statistics.median(x[i] for x in runs) for i in range(3))
        rows.append((T, name, r, recompute))
    print(f"{'T':>6} {'config':<18} {'step_s':>8} {'peak_RSS_MiB':>13} {'planned_MiB':>12} "
          f"{'GFLOP/s':>8} {'%sgemm':>7}")
    for T, name, r, recompute in rows:
        if r is None:
            print(f"{T:>6} {name:<18} {'failed':>8}")
            continue
        t, rss, planned = r
        gf = step_flops(T, recompute) / t / 1e9
        print(f"{T:>6} {name:<18} {t:8.3f} {rss / 2**20:13.1f} {planned / 2**20:12.1f} "
              f"{gf:8.1f} {100 * gf / peak:6.1f}%")
    # stream against checkpoint, per round (both ran within minutes of each other)
    for T in a.seq_lens:
        st, ck = results.get((T, "sbpc stream")), results.get((T, "sbpc checkpoint"))
        if st and ck:
            ratios = [x[0] / y[0] for x, y in zip(st, ck) if x and y]
            if ratios:
                print(f"T={T}: sbpc stream / sbpc checkpoint step time, median of "
                      f"{len(ratios)} rounds: {statistics.median(ratios):.3f} "
                      f"(each round: {' '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
