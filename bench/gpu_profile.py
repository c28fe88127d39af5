#!/usr/bin/env python3
"""gpu_profile.py — where one training step's GPU time goes, kernel by kernel, for a cuda step
of sbpc and for PyTorch on the same model and batch (the model of bench/gpu_bench.py, with
fewer layers so that the profile stays short), with the benchmark's step on both sides: forward,
backward, gradient norm clipped at 1.0 and AdamW (lr 1e-5, weight decay 0.01).

    python3 bench/gpu_profile.py [--build build] [--layers 4] [--seq-len 4096]
                                 [--strategy store] [--precision fp32|bf16]
                                 [--torch-mode torch|torch+ckpt] [--out build/gpu_profile]
                                 [--work DIR]

Needs a GPU, Nsight Compute (ncu) and torch with CUDA. sbpc's side: one AdamW step of
sbp-train under `ncu --metrics gpu__time_duration.sum` (each kernel's own duration, so the
launches' gaps are not counted); PyTorch's: torch.profiler over one step after three timed
ones, in gpu_bench.py's PyTorch worker (HF Qwen3 with sdpa; fp32 with TF32 off, or
torch.autocast(bfloat16) for --precision bf16, which compiles sbpc's step with --precision
bf16). PyTorch's mode matches the strategy as the benchmark pairs them (store: eager;
checkpoint, stream: per-layer checkpointing) unless --torch-mode says otherwise. Prints, for
each side, the step's total kernel time and the kernels that take most of it (launches, total
ms, share), grouped by name; OUT/profile.json holds both lists. The export, the step and the
batch go to --work (default OUT/model).
"""
import argparse
import collections
import csv
import io
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gpu_bench as gb  # noqa: E402


def run(cmd, limit):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    if p.returncode != 0:
        sys.exit("gpu_profile: %s failed (%d):\n%s%s" % (cmd[0], p.returncode, p.stdout[-3000:],
                                                      p.stderr[-3000:]))
    return p.stdout, time.monotonic() - t0


def short(name, n=70):
    name = name.split("(")[0] if not name.startswith("void ") else name[5:].split("(")[0]
    return name if len(name) <= n else name[:n - 3] + "..."


def table(title, rows, top=15):
    total = sum(r[2] for r in rows) or 1
    print("\n%s: %d kernels launched, %.1f ms of kernel time" % (title, sum(r[1] for r in rows),
                                                                total / 1e6))
    print("%-72s %8s %10s %6s" % ("kernel", "launches", "total ms", "share"))
    for name, count, ns in rows[:top]:
        print("%-72s %8d %10.2f %5.1f%%" % (short(name), count, ns / 1e6, 100.0 * ns / total))


def ncu_rows(text):
    """Per kernel name: [name, launches, total ns] from ncu --csv's per-launch rows."""
    lines = [x for x in text.splitlines() if x.startswith('"')]
    agg = collections.OrderedDict()
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(rec["Metric Value"].replace(",", ""))
        unit = rec.get("Metric Unit", "nsecond")
        v *= {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        k = rec["Kernel Name"]
        c, t = agg.get(k, (0, 0.0))
        agg[k] = (c + 1, t + v)
    return sorted(([k, c, t] for k, (c, t) in agg.items()), key=lambda r: -r[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "gpu_profile"))
    ap.add_argument("--work", help="the export, step and batch (default OUT/model)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--strategy", default="store", choices=["store", "checkpoint", "stream"])
    ap.add_argument("--precision", default="fp32", choices=gb.PRECISIONS)
    ap.add_argument("--torch-mode", choices=gb.TORCH_MODES,
                    help="PyTorch's mode (default: torch for store, torch+ckpt otherwise)")
    ap.add_argument("--torch-impl", default="auto", choices=["auto", "hf", "own"])
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = a.work or os.path.join(a.out, "model")
    os.makedirs(work, exist_ok=True)
    T, L, prec = a.seq_len, a.layers, a.precision
    mode = a.torch_mode or ("torch" if a.strategy == "store" else "torch+ckpt")
    cfg = dict(gb.FULL, L=L)
    model = os.path.join(work, "model.onnx")
    bench = os.path.join(HERE, "gpu_bench.py")
    if not os.path.exists(model):
        out, dt = run([a.python, bench, "--export", model, "--layers", str(L)], 900)
        print(out.strip(), "(%.1f s)" % dt)
    so = os.path.join(work, "step_%s_%s_%d.so" % (prec, a.strategy, T))
    _, dt = run([os.path.join(a.build, "tools", "sbpc"), model, "--batch", "1", "--seq-len",
                 str(T), "--strategy", a.strategy, "--target", "cuda", "-o", so]
                + (["--precision", "bf16"] if prec == "bf16" else []), 900)
    print("compiled %s in %.1f s" % (so, dt))
    ids, labels = os.path.join(work, "ids.npy"), os.path.join(work, "labels.npy")
    iv, lv = gb.batch(T, cfg["V"])
    gb.write_npy_i32(ids, iv)
    gb.write_npy_i32(labels, lv)
    out, dt = run([a.ncu, "--csv", "--metrics", "gpu__time_duration.sum",
                   os.path.join(a.build, "tools", "sbp-train"), so, "--model", model,
                   "--input-ids", ids, "--labels", labels, "--steps", "1", "--optimizer",
                   "adamw", "--lr", str(gb.LR), "--weight-decay", str(gb.WD),
                   "--clip-grad-norm", str(gb.CLIP)], 900)
    ours = ncu_rows(out)
    print("ncu over one sbp-train step (AdamW): %.1f s" % dt)
    w = gb.TorchWorker(a.python, "cuda", ["--layers", str(L)], a.torch_impl,
                       os.path.join(work, "torch_worker.err"))
    t0 = time.monotonic()
    why = w.start(900)
    if why:
        sys.exit("gpu_profile: PyTorch worker: " + why)
    rec = w.request({"cmd": "run", "T": T, "mode": mode, "prec": prec, "steps": 3,
                     "profile": True}, 900)
    w.close()
    if not rec.get("ok"):
        sys.exit("gpu_profile: PyTorch %s %s at T=%d: %s" % (prec, mode, T, rec.get("why")))
    theirs = rec.get("kernels", [])
    print("PyTorch (%s) step: %.3f s (median of the timed steps; %.1f s with the model's build)"
          % (w.info.get("impl"), rec["time"], time.monotonic() - t0))
    head = "Qwen3-0.6B-shaped, %d layers, T = %d, %s, AdamW" % (L, T, prec)
    table("sbpc %s (%s)" % (a.strategy, head), ours)
    table("PyTorch %s (%s)" % (gb.label(prec, mode), head), theirs)
    with open(os.path.join(a.out, "profile.json"), "w") as f:
        json.dump({"sbpc": ours, "torch": theirs, "layers": L, "T": T, "precision": prec,
                   "strategy": a.strategy, "torch_mode": mode, "torch_impl": w.info.get("impl"),
                   "torch_step_s": rec["time"]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
