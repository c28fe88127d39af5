#!/usr/bin/env python3
"""Sequence parallelism: per-rank memory at N = 1, 2, 4, the longest T in a budget, the step time.

    /usr/bin/python3 bench/gen_bench_model.py       # once: bench/models/llama_bench.onnx
    /usr/bin/python3 bench/bench_seqpar.py [--build build] [--model bench/models/llama_bench.onnx]
        [--seq-len 8192] [--budget 480MiB] [--time-seq-len 2048] [--steps 6] [--repeat 3]
        [--skip-measured] [--tables 1234]

Four tables, the stream strategy, one row per rank's step (--batch 1):
(1) planned: sbpc --report --seq-parallel N's per-rank figures at the same T (parameters,
    gradients and AdamW's moments are every rank's; the workspace is the rank's tokens'), and
    the bytes each rank sends per step;
(2) measured: the peak RSS of each rank of `mpirun -np N sbp-train` on that step (two steps of
    --data; /usr/bin/time's maximum resident set, the largest rank), next to the planned peak;
(3) the longest T (a multiple of 256 * N) whose planned per-rank peak fits --budget, by
    bisection over sbpc's plan, and its ratio to N = 1's;
(4) the step time at N = 2 (two ranks, one thread each, on this machine's two cores) against
    one process on the whole sequence (one thread, and two threads), medians of steps 2..S of
    --repeat interleaved runs. A shared 2-core machine is noisy: compare the ratios.
The tables go, by hand, between the <!-- seqpar-bench --> markers of docs/data-parallel.md.
Standard library only; mpirun as root needs --allow-run-as-root (passed here).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = "/usr/share/common-licenses/GPL-3"
MPI = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def run(cmd, env=None, ok=(0,)):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode not in ok:
        sys.exit(f"bench_seqpar: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def parse_bytes(s):
    m = re.fullmatch(r"(\d+)([KMG]i?B)?", s.strip())
    if not m:
        sys.exit(f"bench_seqpar: cannot read the size {s!r}")
    return int(m.group(1)) * {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
                              "KB": 10**3, "MB": 10**6, "GB": 10**9}[m.group(2)]


def report(sbpc, model, T, n):
    """The per-rank planned figures of sbpc --report (stream): dict, or None when T does not
    compile (e.g. too large for an int)."""
    cmd = [sbpc, model, "--batch", "1", "--seq-len", str(T), "--report"]
    if n > 1:
        cmd += ["--seq-parallel", str(n)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    out = p.stdout
    if n == 1:
        # the strategies' table: store, checkpoint, stream columns
        m = re.search(r"peak \(params\+grads\+opt\+workspace\)\s+(\d+)\s+(\d+)\s+(\d+)", out)
        w = re.search(r"^\s*workspace, planned\s+(\d+)\s+(\d+)\s+(\d+)", out, re.M)
        return {"total": int(m.group(3)), "workspace": int(w.group(3)) if w else None,
                "exchange": 0, "sent": 0}
    f = {}
    for key, pat in (("params", "parameters"), ("grads", "gradient block"),
                     ("moments", r"AdamW moments m, v"), ("workspace", "workspace"),
                     ("exchange", "of it, exchange buffers"), ("total", "total"),
                     ("sent", "sent per step")):
        m = re.search(r"^\s+(?:per rank: )?" + pat + r"\s+(\d+)", out, re.M)
        f[key] = int(m.group(1)) if m else None
    return f


def longest(sbpc, model, n, budget):
    """The largest T = k * 256 * n whose planned per-rank peak fits budget (bisection on k)."""
    unit = 256 * n
    lo, hi = 0, 1
    while True:
        r = report(sbpc, model, hi * unit, n)
        if r is None or r["total"] > budget:
            break
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = report(sbpc, model, mid * unit, n)
        if r is not None and r["total"] <= budget:
            lo = mid
        else:
            hi = mid
    return lo * unit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(HERE, "models", "llama_bench.onnx"))
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--budget", default="480MiB")
    ap.add_argument("--time-seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-measured", action="store_true")
    ap.add_argument("--tables", default="1234", help="which tables to print, e.g. 12")
    a = ap.parse_args()
    sbpc = os.path.join(a.build, "tools", "sbpc")
    train = os.path.join(a.build, "tools", "sbp-train")
    if not os.path.exists(a.model):
        sys.exit(f"bench_seqpar: {a.model} is missing: run bench/gen_bench_model.py first")
    budget = parse_bytes(a.budget)
    ns = (1, 2, 4)

    print(f"(1) planned per rank, {os.path.basename(a.model)}, stream, 1 row x T = {a.seq_len}:")
    print("| N | tokens/rank | workspace | of it exchange | per-rank peak | vs N=1 "
          "| sent per step |")
    print("|--:|------------:|----------:|---------------:|--------------:|-------:"
          "|--------------:|")
    planned = {}
    for n in ns:
        planned[n] = report(sbpc, a.model, a.seq_len, n)
        r = planned[n]
        print(f"| {n} | {a.seq_len // n:,} | {r['workspace'] or 0:,} | {r['exchange']:,} "
              f"| {r['total']:,} | {r['total'] / planned[1]['total']:.3f} | {r['sent']:,} |")

    tmp = tempfile.mkdtemp(prefix="bench_seqpar.")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1")
    shard = os.path.join(tmp, "gpl3.bin")
    run([os.path.join(a.build, "tools", "sbp-shard"), TEXT, "-o", shard])

    def step(T, n):
        so = os.path.join(tmp, f"step_t{T}_n{n}.so")
        if not os.path.exists(so):
            cmd = [sbpc, a.model, "--batch", "1", "--seq-len", str(T), "-o", so]
            if n > 1:
                cmd += ["--seq-parallel", str(n)]
            run(cmd)
        return so

    def train_cmd(so, n, steps, threads=1):
        cmd = [train, so, "--model", a.model, "--data", shard, "--steps", str(steps),
               "--threads", str(threads)]
        return (MPI + ["-np", str(n)] + cmd) if n > 1 else cmd

    if not a.skip_measured and "2" in a.tables:
        print(f"\n(2) measured peak RSS (the largest rank), 2 steps, T = {a.seq_len}; N = 1 also "
              "as one MPI rank (SBP_TRAIN_DIST_ONE_RANK=1 mpirun -np 1), which carries Open "
              "MPI's own memory as the ranks of N = 2, 4 do:")
        print("| N | launch | planned per-rank peak | measured peak RSS | measured - planned |")
        print("|--:|--------|----------------------:|------------------:|-------------------:|")
        for n, one_rank in ((1, False), (1, True), (2, False), (4, False)):
            so = step(a.seq_len, n)
            cmd = train_cmd(so, n, 2)
            e = dict(env)
            if one_rank:
                cmd = MPI + ["-np", "1"] + cmd
                e["SBP_TRAIN_DIST_ONE_RANK"] = "1"
            # /usr/bin/time around each rank: its maximum resident set on stderr
            i = cmd.index(train)
            cmd = cmd[:i] + ["/usr/bin/time", "-f", "maxrss_kb %M"] + cmd[i:]
            p = run(cmd, e)
            rss = max(int(x) for x in re.findall(r"maxrss_kb (\d+)", p.stderr)) * 1024
            launch = "plain" if n == 1 and not one_rank else f"mpirun -np {n}"
            print(f"| {n} | {launch} | {planned[n]['total']:,} | {rss:,} "
                  f"| {rss - planned[n]['total']:,} |")

    if "3" not in a.tables:
        return
    print(f"\n(3) the longest T whose planned per-rank peak fits {budget:,} bytes ({a.budget}):")
    print("| N | longest T | vs N=1 |")
    print("|--:|----------:|-------:|")
    best = {}
    for n in ns:
        best[n] = longest(sbpc, a.model, n, budget)
        print(f"| {n} | {best[n]:,} | {best[n] / best[1]:.2f} |" if best[1] else
              f"| {n} | {best[n]:,} | - |")

    if a.skip_measured or "4" not in a.tables:
        return
    T = a.time_seq_len
    print(f"\n(4) step time, 1 row x T = {T}, medians of steps 2..{a.steps} of {a.repeat} "
          f"interleaved runs ({os.cpu_count()} cores):")
    configs = [("1 process, 1 thread", 1, 1), ("1 process, 2 threads", 1, 2),
               ("N = 2 ranks, 1 thread each", 2, 1)]
    times = {c[0]: [] for c in configs}
    for _ in range(a.repeat):
        for name, n, th in configs:
            p = run(train_cmd(step(T, n), n, a.steps, th), dict(env, OMP_NUM_THREADS=str(th)))
            tps = [float(m.group(1)) for m in
                   re.finditer(r"^step \d+ loss \S+ tokens/s (\S+)", p.stdout, re.M)][1:]
            times[name] += [T / x for x in tps if x > 0]
    print("| run | s/step (median) | vs 1 process, 1 thread |")
    print("|-----|----------------:|-----------------------:|")
    base = statistics.median(times[configs[0][0]])
    for name, _, _ in configs:
        med = statistics.median(times[name])
        print(f"| {name} | {med:.3f} | {med / base:.3f} |")


if __name__ == "__main__":
    main()
