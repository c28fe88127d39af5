#!/usr/bin/python3
"""StreamBP memory benchmark (peak-RSS growth per token, largest T in a memory limit).

    /usr/bin/python3 bench/gen_bench_model.py        # once: bench/models/llama_bench.onnx
    /usr/bin/python3 bench/bench_stream.py [--build build] [--limit-gib 2] [--threads 2]
                     [--confirm-max 16384]

Same model, machine and threads for both sides: sbpc's stream (and checkpoint) step run by
sbp-train, and PyTorch with per-layer torch.utils.checkpoint (bench/torch_baseline.py), each in
its own process, batch 1, SFT loss, one AdamW-free step (sgd, lr 0) after a warm-up step.

Table 1: peak RSS at T = 1024, 2048, 4096 and the growth per token between 1024 and 4096.
Table 2: the largest T whose step fits in the limit: sbpc's found from its compile-time plan
(planned peak + optimizer state + the runtime's own footprint measured at small T), then
confirmed by running it; PyTorch's by bisection over real runs.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import openblas_env  # noqa: F401  (OPENBLAS_CORETYPE for both sides)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
V = 32000
UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def run(cmd, timeout=3600):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return r.stdout + r.stderr if r.returncode == 0 else None


class Sbpc:
    def __init__(self, a, tmp):
        self.a, self.tmp = a, tmp
        self.model = os.path.join(HERE, "models", "llama_bench.onnx")

    def compile(self, T, strategy):
        so = os.path.join(self.tmp, f"s_{strategy}_{T}.so")
        out = run([os.path.join(self.a.build, "tools", "sbpc"), self.model, "--batch", "1",
                   "--seq-len", str(T), "--strategy", strategy, "-o", so])
        return so if out is not None else None

    def planned(self, T, strategy):
        out = run([os.path.join(self.a.build, "tools", "sbpc"), self.model, "--batch", "1",
                   "--seq-len", str(T), "--strategy", strategy, "--report"])
        if out is None:
            return None
        # the report's row "peak (params+grads+opt+workspace)": store, checkpoint, stream
        m = re.search(r"peak \(params\+grads\+opt\+workspace\)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)", out)
        return int(m.group(3 if strategy == "stream" else 2)) if m else None

    def rss(self, T, strategy, steps=2):
        so = self.compile(T, strategy)
        if so is None:
            return None
        rng = np.random.default_rng(0)
        ids = os.path.join(self.tmp, "ids.npy")
        lab = os.path.join(self.tmp, "lab.npy")
        np.save(ids, rng.integers(0, V, (1, T), dtype=np.int64))
        np.save(lab, rng.integers(0, V, (1, T), dtype=np.int64))
        out = run([os.path.join(self.a.build, "tools", "sbp-train"), so, "--model", self.model,
                   "--input-ids", ids, "--labels", lab, "--steps", str(steps), "--optimizer", "sgd",
                   "--lr", "0", "--threads", str(self.a.threads)])
        for f in os.listdir(self.tmp):
            if f.startswith(f"s_{strategy}_{T}."):
                os.remove(os.path.join(self.tmp, f))
        if out is None:
            return None
        m = re.search(r"actual ([0-9.]+) (B|KiB|MiB|GiB)", out)
        return float(m.group(1)) * UNIT[m.group(2)]


def torch_rss(a, T):
    out = run([sys.executable, os.path.join(HERE, "torch_baseline.py"), "--seq-len", str(T),
               "--mode", "checkpoint", "--threads", str(a.threads), "--steps", "1"])
    if out is None:
        return None
    return float(out.strip().split("\n")[-1].split()[3])


def bisect(fits, lo, hi):
    """Largest T in [lo, hi) (multiples of 256) with fits(T); lo must fit."""
    while hi - lo > 256:
        mid = (lo + hi) // 2 // 256 * 256
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--limit-gib", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--confirm-max", type=int, default=16384,
                    help="largest T at which sbpc's fit is confirmed by a real step")
    a = ap.parse_args()
    limit = a.limit_gib * (1 << 30)
    with tempfile.TemporaryDirectory() as tmp:
        s = Sbpc(a, tmp)
        print(f"{'T':>6} {'sbpc stream MiB':>16} {'sbpc ckpt MiB':>14} {'torch+ckpt MiB':>15}")
        rows = {}
        for T in (1024, 2048, 4096):
            rows[T] = (s.rss(T, "stream"), s.rss(T, "checkpoint"), torch_rss(a, T))
            print(f"{T:>6} " + " ".join(f"{(x or float('nan')) / 2**20:>15.1f}" for x in rows[T]))
        names = ("sbpc stream", "sbpc checkpoint", "torch+checkpoint")
        growth = [((rows[4096][i] or 0) - (rows[1024][i] or 0)) / 3072 for i in range(3)]
        for n, g in zip(names, growth):
            print(f"peak-RSS growth per token, {n}: {g / 1024:.2f} KiB/token")
        print(f"ratio sbpc stream / torch+checkpoint growth: {growth[0] / growth[2]:.3f}")

        # sbpc: the runtime's own footprint beyond the plan, measured at T=1024
        base_plan = s.planned(1024, "stream")
        overhead = (rows[1024][0] or 0) - (base_plan or 0)
        def sbpc_fits_plan(T):
            p = s.planned(T, "stream")
            return p is not None and p + overhead <= limit
        t_sbpc = bisect(sbpc_fits_plan, 1024, 1 << 20)
        # confirming by a run: one step at t_sbpc, or at --confirm-max when that is smaller
        # (attention grows as T^2: a step at the model's 65536 positions takes most of an
        # hour on 2 cores)
        t_run = min(t_sbpc, a.confirm_max)
        confirmed = s.rss(t_run, "stream", steps=1)
        planned_run = s.planned(t_run, "stream")
        t_torch = bisect(lambda T: (torch_rss(a, T) or 1e30) <= limit, 256, 16384)
        print(f"largest T in {a.limit_gib:g} GiB: sbpc stream {t_sbpc} (plan "
              f"{(s.planned(t_sbpc, 'stream') or float('nan')) / 2**20:.0f} MiB + runtime "
              f"{overhead / 2**20:.0f} MiB), torch+checkpoint {t_torch} (run); "
              f"ratio {t_sbpc / t_torch:.1f}x")
        print(f"sbpc stream run at T={t_run}: peak RSS {(confirmed or float('nan')) / 2**20:.0f} "
              f"MiB, planned {(planned_run or float('nan')) / 2**20:.0f} MiB + runtime "
              f"{overhead / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
