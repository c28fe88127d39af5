#!/usr/bin/python3
"""Compile time against program length: chain models of 1k to 100k ops and a 64-layer model.

    /usr/bin/python3 bench/bench_scale.py [--build build] [--sizes 1000,8000,16000,100000]
                     [--deep MODEL.onnx] [--batch 2] [--seq-len 64] [--repeat 3]

Generates the chain models (bench/gen_chain_model.py: N cheap ops in a row, static dims 2 x 64)
into BUILD/bench/scale/ (generated at bench time, not committed; reused when already there),
runs bench_scale over them and over the 64-layer model when --deep names one (for instance
bench/models/llama_64L.onnx from bench/gen_deep_models.py, which needs torch), and times
`sbpc MODEL -o OUT.c` end to end per model (median of --repeat runs: process start, file read and
write included, which bench_scale's in-process phases leave out). Prints one table: nodes
imported, instructions, workspace buffers, the planned workspace, bench_scale's seconds per phase
(import, canonicalise, build, plan, emit) and sbpc's median seconds. A compile linear (or
n log n) in the program keeps the seconds per thousand nodes (last column) flat down the table.
Needs the `onnx` package (Debian's python3-onnx) and numpy to generate the chains.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd, timeout):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(f"{' '.join(cmd)}: exit status {r.returncode}\n{r.stdout}{r.stderr}")
        return None
    return r.stdout


def chain_model(folder, n):
    """BUILD/bench/scale/chain_N.onnx, generated once (the 100k chain takes a few seconds)."""
    path = os.path.join(folder, f"chain_{n}.onnx")
    if not os.path.exists(path):
        # this script's interpreter (Debian's python3 in the usage line: python3-onnx's)
        gen = os.path.join(HERE, "gen_chain_model.py")
        if run([sys.executable, gen, str(n), path + ".tmp"], 600) is None:
            return None
        os.replace(path + ".tmp", path)
    return path


def phases(a, model, outdir):
    """bench_scale's row for one model, as a dict; None when it failed."""
    cmd = [os.path.join(a.build, "bench", "bench_scale"), "-o", outdir]
    if a.batch:
        cmd += ["--batch", str(a.batch), "--seq-len", str(a.seq_len)]
    out = run(cmd + [model], a.timeout)
    if out is None:
        return None
    lines = out.strip().splitlines()
    names = lines[0].split()
    vals = lines[-1].split()
    # the header names "canon" twice (nodes after canonicalisation, then its seconds)
    keys = ["model", "nodes", "canon_nodes", "insts", "bufs", "workspace", "import", "canon",
            "build", "plan", "emit", "total"]
    if len(names) != len(keys) or len(vals) != len(keys):
        sys.stderr.write(f"bench_scale: unexpected output\n{out}")
        return None
    return dict(zip(keys, vals))


def sbpc_median(a, model, outdir):
    """Median wall seconds of `sbpc MODEL -o OUT.c` over a.repeat runs; None when it failed."""
    cmd = [os.path.join(a.build, "tools", "sbpc"), model]
    if a.batch:
        cmd += ["--batch", str(a.batch), "--seq-len", str(a.seq_len)]
    base = os.path.splitext(os.path.basename(model))[0]
    cmd += ["-o", os.path.join(outdir, base + "_sbpc.c")]
    times = []
    for _ in range(a.repeat):
        t0 = time.monotonic()
        if run(cmd, a.timeout) is None:
            return None
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build folder (bench/bench_scale and tools/sbpc in it)")
    ap.add_argument("--sizes", default="1000,8000,16000,100000",
                    help="chain lengths, comma-separated")
    ap.add_argument("--deep", help="a 64-layer model (bench/gen_deep_models.py makes one)")
    ap.add_argument("--batch", type=int, default=2, help="bound for symbolic dims (0: none)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="sbpc runs per model (median)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per command")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    for exe in (os.path.join(a.build, "bench", "bench_scale"),
                os.path.join(a.build, "tools", "sbpc")):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench_scale.py: {exe} not found: build first "
                     f"(cmake --build {a.build} --target bench_scale sbpc)")
    folder = os.path.join(a.build, "bench", "scale")
    outdir = os.path.join(folder, "out")
    os.makedirs(outdir, exist_ok=True)

    models = []
    for n in (int(x) for x in a.sizes.split(",") if x):
        path = chain_model(folder, n)
        if path is None:
            sys.exit(f"bench_scale.py: could not generate the {n}-op chain "
                     "(needs python3-onnx and numpy)")
        models.append(path)
    if a.deep:
        models.append(os.path.abspath(a.deep))

    cols = ["model", "nodes", "insts", "bufs", "workspace", "import", "canon", "build", "plan",
            "emit", "total", "sbpc", "sbpc/1k"]
    fmt = "{:<22} {:>7} {:>8} {:>7} {:>11} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8}"
    print(f"bench_scale.py: {a.build}, stream strategy, batch {a.batch or '-'}, "
          f"seq-len {a.seq_len if a.batch else '-'}; seconds (sbpc: median of {a.repeat} "
          "end-to-end runs; sbpc/1k: per thousand nodes)")
    print(fmt.format(*cols))
    failed = False
    for m in models:
        row = phases(a, m, outdir)
        t = sbpc_median(a, m, outdir) if row else None
        name = os.path.splitext(os.path.basename(m))[0]
        if row is None or t is None:
            print(f"{name:<22} failed (see above)")
            failed = True
            continue
        per_k = t / max(int(row["nodes"]), 1) * 1000
        print(fmt.format(name[:22], row["nodes"], row["insts"], row["bufs"], row["workspace"],
                         row["import"], row["canon"], row["build"], row["plan"], row["emit"],
                         row["total"], f"{t:.3f}", f"{per_k:.4f}"), flush=True)
    if not a.deep:
        print("64-layer model: not given (bench/gen_deep_models.py makes one with torch)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
