#!/usr/bin/python3
"""Memory of the DPO and GRPO objectives against SFT, stream next to checkpoint.

    /usr/bin/python3 bench/gen_bench_model.py          # once: bench/models/llama_bench.onnx
    /usr/bin/python3 bench/bench_objectives.py [--build build] [--batch 2]
                     [--seq-lens 1024,2048,4096,8192,16384] [--run 1024,2048] [--threads 2]

Table 1 (compile time, `sbpc --report`): the planned peak (parameters + gradients + AdamW
state + workspace) of each objective with checkpoint and stream at every T, the bytes of logits
live at the workspace's peak, and the growth per token between the smallest and largest T. With
stream the logits never exist whole for any objective (the LM head runs in chunks; DPO runs it
twice: a per-token log-probability pass, then the fused backward), so DPO and GRPO grow with T
like SFT does; checkpoint holds B*T*V logits for all three.

Table 2 (--run): the same steps run by sbp-train (one SGD step, lr 0, after loading), peak RSS
against the plan and the step's speed, on random tokens with prompts/padding masked and the
objectives' inputs.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(HERE, "models", "llama_bench.onnx")
V = 32000
OBJECTIVES = ("sft", "dpo", "grpo")
UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def run(cmd, timeout=3600):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        return None
    return r.stdout + r.stderr


def report(a, obj, T):
    """{strategy: (peak bytes, logits bytes live at the peak)} from sbpc --report."""
    out = run([os.path.join(a.build, "tools", "sbpc"), MODEL, "--batch", str(a.batch),
               "--seq-len", str(T), "--objective", obj, "--report"])
    if out is None:
        return None
    peak = re.search(r"peak \(params\+grads\+opt\+workspace\)\s+(\d+)\s+(\d+)\s+(\d+)", out)
    logits = re.search(r"\n\s+logits\s+(\d+)\s+(\d+)\s+(\d+)", out)
    return {s: (int(peak.group(i + 2)), int(logits.group(i + 2)) if logits else 0)
            for i, s in enumerate(("checkpoint", "stream"))}


def inputs(tmp, B, T, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (B, T), dtype=np.int32)
    labels = rng.integers(0, V, (B, T), dtype=np.int32)
    for b in range(B):
        labels[b, : T // 8 + b] = -100          # a prompt
        labels[b, T - T // 16 - b:] = -100      # padding
    files = {}
    for name, arr in (("ids", ids), ("labels", labels),
                      ("dpo_ref", (-10.0 * T + rng.normal(0, 5, B)).astype(np.float32)),
                      ("adv", rng.normal(0, 1, B).astype(np.float32)),
                      ("old", (-10.0 + rng.normal(0, 0.3, (B, T))).astype(np.float32)),
                      ("ref", (-10.0 + rng.normal(0, 0.3, (B, T))).astype(np.float32))):
        files[name] = os.path.join(tmp, "%s_%d.npy" % (name, T))
        np.save(files[name], arr)
    return files


def measured(a, tmp, obj, strategy, T):
    so = os.path.join(tmp, "%s_%s_%d.so" % (obj, strategy, T))
    if run([os.path.join(a.build, "tools", "sbpc"), MODEL, "--batch", str(a.batch), "--seq-len",
            str(T), "--objective", obj, "--strategy", strategy, "-o", so]) is None:
        return None
    f = inputs(tmp, a.batch, T)
    cmd = [os.path.join(a.build, "tools", "sbp-train"), so, "--model", MODEL, "--input-ids",
           f["ids"], "--labels", f["labels"], "--optimizer", "sgd", "--lr", "0", "--threads",
           str(a.threads)]
    if obj == "dpo":
        cmd += ["--ref-logps", f["dpo_ref"]]
    elif obj == "grpo":
        cmd += ["--advantages", f["adv"], "--old-logps", f["old"], "--ref-logps", f["ref"]]
    out = run(cmd)
    if out is None:
        return None
    m = re.search(r"planned ([0-9.]+) (\w+) .*actual ([0-9.]+) (\w+) \(peak RSS\)", out)
    loss = re.search(r"step 1 loss ([0-9.eE+-]+) tokens/s ([0-9.]+)", out)
    return (float(m.group(1)) * UNIT[m.group(2)], float(m.group(3)) * UNIT[m.group(4)],
            float(loss.group(1)) if loss else float("nan"),
            float(loss.group(2)) if loss else float("nan"))


def mib(x):
    return "%.1f" % (x / (1 << 20))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--run", default="", help="T values to also run with sbp-train")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit("no %s: run bench/gen_bench_model.py first" % MODEL)
    Ts = [int(x) for x in a.seq_lens.split(",")]
    print("model %s, B = %d, V = %d; planned peak in MiB (parameters + gradients + AdamW state "
          "+ workspace); logits = bytes of logits live at the workspace's peak\n"
          % (os.path.basename(MODEL), a.batch, V))
    rows = {}
    for obj in OBJECTIVES:
        for T in Ts:
            rows[obj, T] = report(a, obj, T)
    head = "%-6s %-11s" % ("obj", "strategy") + "".join("%12s" % ("T=%d" % T) for T in Ts)
    print(head + "%16s %14s" % ("growth B/token", "logits @Tmax"))
    for obj in OBJECTIVES:
        for s in ("checkpoint", "stream"):
            vals = [rows[obj, T][s][0] if rows[obj, T] else None for T in Ts]
            line = "%-6s %-11s" % (obj, s) + "".join(
                "%12s" % (mib(v) if v is not None else "-") for v in vals)
            if vals[0] is not None and vals[-1] is not None and len(Ts) > 1:
                growth = (vals[-1] - vals[0]) / (a.batch * (Ts[-1] - Ts[0]))
                line += "%16.0f" % growth
            lt = rows[obj, Ts[-1]][s][1] if rows[obj, Ts[-1]] else 0
            line += "%14s" % mib(lt)
            print(line)
    print("\n(growth per token of the batch: B * T tokens; B*T*V*4 bytes of full logits at "
          "Tmax would be %s MiB)" % mib(a.batch * Ts[-1] * V * 4))
    if a.run:
        print("\nsbp-train, one step: planned (incl. optimizer state) vs peak RSS, MiB")
        with tempfile.TemporaryDirectory() as tmp:
            for T in [int(x) for x in a.run.split(",")]:
                for obj in OBJECTIVES:
                    for s in ("checkpoint", "stream"):
                        r = measured(a, tmp, obj, s, T)
                        if r:
                            print("  T=%-6d %-5s %-11s planned %8s  RSS %8s  loss %.5f  "
                                  "tokens/s %.0f" % (T, obj, s, mib(r[0]), mib(r[1]), r[2], r[3]))
                        else:
                            print("  T=%-6d %-5s %-11s failed" % (T, obj, s))
                        sys.stdout.flush()


if __name__ == "__main__":
    main()
