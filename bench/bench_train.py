#!/usr/bin/python3
"""Training-step benchmark: sbpc's strategies next to PyTorch (+ per-layer checkpointing) on the
same machine, same threads, same model (bench_model.py: Llama-style d=256, 4 layers, 8 heads,
4 KV heads, d_ff 688, V=32000), batch 1, SFT loss.

    /usr/bin/python3 bench/gen_bench_model.py          # once: bench/models/llama_bench.onnx
    /usr/bin/python3 bench/bench_train.py [--build build] [--seq-lens 1024 4096]
                     [--strategies store checkpoint stream] [--threads 2] [--steps 3]

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

HERE = os.path.dirname(os.path.abspath(__file__))

# Debian's OpenBLAS 0.3.21 does not recognise some virtual CPUs and falls back to its SSE3
# ("Prescott") kernels at a third of the speed. Both sides (sbpc and PyTorch) link OpenBLAS, so
# the benchmark names the kernel for both when the CPU has AVX2 and the caller did not choose.
if "OPENBLAS_CORETYPE" not in os.environ:
    try:
        with open("/proc/cpuinfo") as _f:
            if " avx2" in _f.read():
                os.environ["OPENBLAS_CORETYPE"] = "Haswell"
    except OSError:
        pass
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


def sbpc_config(a, model, T, strategy, tmp):
    so = os.path.join(tmp, f"step_{strategy}_{T}.so")
    if run([os.path.join(a.build, "tools", "sbpc"), model, "--batch", "1", "--seq-len", str(T),
            "--strategy", strategy, "-o", so]) is None:
        return None
    rng = np.random.default_rng(0)
    ids = os.path.join(tmp, f"ids_{T}.npy")
    lab = os.path.join(tmp, f"labels_{T}.npy")
    np.save(ids, rng.integers(0, V, (1, T), dtype=np.int64))
    np.save(lab, rng.integers(0, V, (1, T), dtype=np.int64))
    out = run([os.path.join(a.build, "tools", "sbp-train"), so, "--model", model,
               "--input-ids", ids, "--labels", lab, "--steps", str(a.steps), "--lr", "0",
               "--optimizer", "sgd", "--threads", str(a.threads)])
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
    a = ap.parse_args()
    model = os.path.join(HERE, "models", "llama_bench.onnx")
    if not os.path.exists(model):
        sys.exit("bench_train: run /usr/bin/python3 bench/gen_bench_model.py first")
    rate_out = run([os.path.join(a.build, "bench", "sgemm_rate"), str(a.threads)])
    peak = float(re.search(r"peak ([0-9.]+)", rate_out).group(1)) if rate_out else float("nan")
    print(f"OpenBLAS sgemm peak on this machine: {peak:.1f} GFLOP/s ({a.threads} threads)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for T in a.seq_lens:
            for s in a.strategies:
                r = sbpc_config(a, model, T, s, tmp)
                rows.append((T, f"sbpc {s}", r, s != "store"))
            if not a.no_torch:
                for m in ("store", "checkpoint"):
                    rows.append((T, f"torch {m}", torch_config(a, T, m), m == "checkpoint"))
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


if __name__ == "__main__":
    main()
