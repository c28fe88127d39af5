#!/usr/bin/env python3
"""Data parallel: per-rank optimizer bytes under ZeRO 0/1/2, and the CPU step time.

    python3 bench/bench_dist.py [--build build] [--model examples/tiny_llama.onnx]
                                [--rows 4] [--seq-len 128] [--steps 6] [--ranks 1,2]
                                [--repeat 1]

Two tables. (1) Planned: the AdamW moments each rank holds, 2 x 4 bytes per element of its part
of the gradient block (grad_elems, read from sbp-train's own end report): the whole block for
ZeRO 0, ceil(grad_elems / N) for ZeRO 1 and 2 (ZeRO 2 reduce-scatters the gradients too, but
the step still writes a whole gradient block, so its bytes are ZeRO 1's), at N = 1, 2, 4, 8.
(2) Measured: the model compiled by sbpc for rows / N rows per rank, trained on the same
global batch (--data, a shard of the GPL-3's bytes) under mpirun -np N; the median step time
of steps 2..S (step 1 warms up) and the global tokens/s sbp-train prints; with --repeat R each
run is made R times (interleaved: every configuration once, then again) and the median is over
all their steps, so that a burst of other load on a shared machine hits every configuration
alike; the last column is each time over the one-rank time. On a machine with
fewer cores than N x threads the ranks share cores, so the times say what the collectives cost
more than what N machines would gain. The tables go, by hand, between the <!-- dist-bench -->
markers of docs/data-parallel.md.

Standard library only. As root, mpirun needs --allow-run-as-root (passed here).
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


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_dist: {' '.join(cmd)} failed:\n{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "tiny_llama.onnx"))
    ap.add_argument("--rows", type=int, default=4, help="global rows per step")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    sbpc = os.path.join(a.build, "tools", "sbpc")
    train = os.path.join(a.build, "tools", "sbp-train")
    shard_tool = os.path.join(a.build, "tools", "sbp-shard")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    tmp = tempfile.mkdtemp(prefix="bench_dist.")
    # Any text does: the step time does not depend on the tokens. The GPL-3 is the example's
    # text, never changes under the benchmark, and at 35 KB holds a global batch of 4 x 8192.
    if not os.path.exists(TEXT):
        sys.exit(f"bench_dist: {TEXT} is missing (Debian's base-files has it)")
    shard = os.path.join(tmp, "gpl3.bin")
    run([shard_tool, TEXT, "-o", shard])
    rows = []
    grad_elems = None
    ranks = [int(x) for x in a.ranks.split(",")]
    # every step first: the compiles (and the headers they read) are done before any timing
    for n in ranks:
        if a.rows % n:
            sys.exit(f"bench_dist: {a.rows} rows do not split over {n} ranks")
        step = os.path.join(tmp, f"step_b{a.rows // n}.so")
        if not os.path.exists(step):
            run([sbpc, a.model, "--batch", str(a.rows // n), "--seq-len", str(a.seq_len), "-o",
                 step])
    configs = [(n, zero) for n in ranks for zero in ((0,) if n == 1 else (0, 1, 2))]
    tps_of = {c: [] for c in configs}  # ZeRO changes nothing with one rank: N = 1 runs ZeRO 0
    mem_of = {}
    for _ in range(a.repeat):
        for n, zero in configs:
            step = os.path.join(tmp, f"step_b{a.rows // n}.so")
            cmd = [train, step, "--model", a.model, "--data", shard, "--steps", str(a.steps),
                   "--threads", "1", "--zero", str(zero)]
            if n > 1:
                cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + cmd
            out = run(cmd, env)
            tps_of[(n, zero)] += [float(m.group(1)) for m in
                                  re.finditer(r"^step \d+ loss \S+ tokens/s (\S+)", out, re.M)][1:]
            m = re.search(r"optimizer state (\d+) bytes per rank \((\d+) without ZeRO\)", out)
            mem = re.search(r"optimizer state ([0-9.]+ [KMG]i?B)", out)
            if m:
                grad_elems = int(m.group(2)) // 8
            mem_of[(n, zero)] = int(m.group(1)) if m else (mem.group(1) if mem else "?")
    for n, zero in configs:
        tps = tps_of[(n, zero)]
        med = statistics.median(tps) if tps else float("nan")
        rows.append((n, zero, a.rows // n, med, a.rows * a.seq_len / med if med else float("nan"),
                     mem_of[(n, zero)], len(tps)))
    if grad_elems is None:  # only N = 1 was run: the single-process report gives 2*grad bytes
        out = run([train, step, "--model", a.model, "--data", shard, "--steps", "1"])
        m = re.search(r"optimizer state ([0-9.]+) (KiB|MiB|GiB)", out)
        unit = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
        grad_elems = int(float(m.group(1)) * unit) // 8
    print(f"planned AdamW state per rank ({grad_elems} trained elements, 8 bytes each):")
    print("| ranks | ZeRO 0 | ZeRO 1 | ZeRO 2 |")
    print("|------:|-------:|-------:|-------:|")
    for n in (1, 2, 4, 8):
        z0 = 8 * grad_elems
        z1 = 8 * -(-grad_elems // n)
        print(f"| {n} | {z0:,} | {z1:,} | {z1:,} |")
    print()
    print(f"measured: {a.model}, {a.rows} global rows x {a.seq_len} tokens, "
          f"{a.steps} steps x {a.repeat} runs, 1 thread per rank ({os.cpu_count()} cores):")
    print("| ranks | ZeRO | rows/rank | steps | global tokens/s (median) | s/step | vs 1 rank "
          "| optimizer bytes/rank |")
    print("|------:|-----:|----------:|------:|-------------------------:|-------:|----------:"
          "|---------------------:|")
    base = next((r[4] for r in rows if r[0] == 1), float("nan"))
    for n, zero, b, tps, sec, mem, k in rows:
        if n == 1:
            mem = 8 * grad_elems  # one process: the whole state (its report rounds to KiB)
        print(f"| {n} | {zero} | {b} | {k} | {tps:,.0f} | {sec:.3f} | {sec / base:.3f} "
              f"| {mem:,} |")


if __name__ == "__main__":
    main()
