#!/usr/bin/python3
"""Peak memory of DPO's reference log-probabilities: sbp-train's stream pass against PyTorch's
full-logits pass as TRL computes it, and what the reference pass does to a training run's peak.

    .venv-hf/bin/python bench/gen_bench_model.py     # once: bench/models/llama_bench.onnx
    /usr/bin/python3 bench/bench_ref_logps.py [--build build] [--python .venv-hf/bin/python]
                     [--seq-lens 4096,16384] [--train-seq-lens 4096,16384] [--steps 2,1]
                     [--repeats 3] [--threads 2] [--methods log_softmax,selective] [--work DIR]

The bench model (bench_model.py: Llama-style d=256, 4 layers, V=32000), one chosen/rejected
pair (B = 2 rows, the smallest DPO step), every row T tokens (a prompt of T/4, not scored, and
an answer), in a dataset written by the tests' writer (tests/train/dataset_ref.py). Each figure
comes from a process of its own, its peak RSS taken by os.wait4 (ru_maxrss of that child only):

  (a) sbp-train --compute-logps on the dataset (the step's sbp_step_logps, stream), next to
      sbpc --report's planned log-probs workspace and its peak (parameters + workspace);
  (b) PyTorch as TRL's DPOTrainer computes reference log-probs (concatenated_forward under
      no_grad): transformers' LlamaForCausalLM (sdpa attention, its default) with the bench
      model's weights, float32, full logits [2, T, V], log_softmax, gather at the labels, summed
      over the scored tokens (TRL <= 0.13's get_batch_logps); --methods selective adds TRL's
      newer selective_log_softmax (a logsumexp per row, no log_softmax copy);
  (c) sbp-train's DPO run itself (--steps S) with the reference pass (nothing cached) and
      without it (the same command again: the run reuses the --ref-cache the first one wrote),
      and the first run's RSS during its reference pass.

sbp-train's peak RSS (ru_maxrss) is reached while it reads the ONNX model, before any pass; so
the RSS of the pass itself is given too: VmRSS sampled every 20 ms from /proc, its largest value
within the pass's seconds as sbp-train's note states them, ending when the note appears.

(a) and (b) run --repeats times; their peaks and times are medians (times are wall clock on a
shared machine: indicative only). (c) runs once per T, two steps at T = 4096 and one at 16384
(a step there takes 1.5 to 5 minutes on two cores, with the load of the machine), so that the
whole run stays near 8 minutes on an idle two-core machine (15 on a busy one). The log-probs of
(a) and (b) are compared (float32 both: they agree to ~1e-7 relative).
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(HERE, "models", "llama_bench.onnx")
V = 32000
MiB = 1 << 20

sys.path.insert(0, HERE)
import openblas_env  # noqa: F401,E402  (OPENBLAS_CORETYPE for both sides, as the other benches)


# ---------------------------------------------------------------- processes and their peaks

class Run:
    """One finished process: rc, output, peak (ru_maxrss from wait4, bytes), wall seconds, and
    its VmRSS sampled every SAMPLE_S with the time each output line appeared."""
    def __init__(self, rc, out, peak, wall, samples, lines):
        self.rc, self.out, self.peak, self.wall = rc, out, peak, wall
        self.samples, self.lines = samples, lines

    def pass_rss(self):
        """The largest VmRSS sampled during the reference pass: the window is the pass's own
        seconds, which sbp-train's note gives, ending when the note appears. The process's
        peak (ru_maxrss) comes earlier, while it reads the ONNX model; this is the pass's."""
        for t, line in self.lines:
            m = re.search(r"reference log-probs of \d+ examples computed in ([0-9.]+) s", line)
            if m:
                lo = t - float(m.group(1))
                inside = [r for ts, r in self.samples if lo <= ts <= t]
                return max(inside) if inside else None
        return None


SAMPLE_S = 0.02


def measure(cmd, timeout=3600):
    """Runs cmd to completion. wait4 gives the rusage of this child alone (RUSAGE_CHILDREN would
    be the maximum over every child so far); a thread samples its VmRSS meanwhile."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples, lines, done = [], [], threading.Event()

    def sample():
        while not done.is_set():
            r = vm_rss(p.pid)
            if r is not None:
                samples.append((time.perf_counter(), r))
            done.wait(SAMPLE_S)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    killer = threading.Timer(timeout, p.kill)
    killer.start()
    for line in p.stdout:
        lines.append((time.perf_counter(), line))
    p.stdout.close()
    done.set()          # stop sampling before the pid can be reaped and reused
    th.join()
    _, status, ru = os.wait4(p.pid, 0)
    killer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
    return Run(p.returncode, "".join(l for _, l in lines), ru.ru_maxrss * 1024,
               time.perf_counter() - t0, samples, lines)


def vm_rss(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def quote(cmd):
    return " ".join(c if re.fullmatch(r"[\w./=,:+-]+", c) else "'%s'" % c for c in cmd)


def fail(what, cmd, out):
    sys.stderr.write("%s failed: %s\n%s\n" % (what, quote(cmd), out[-3000:]))


# ---------------------------------------------------------------- the dataset

def write_pair(path, T, seed=1):
    """One DPO pair, both rows exactly T tokens (a prompt of T/4, an answer of the rest), so that
    every figure is at the full T."""
    import random
    sys.path.insert(0, os.path.join(ROOT, "tests", "train"))
    import dataset_ref as dr  # the dataset writer of the tests (docs/dataset-format.md)
    rnd = random.Random(seed)
    prompt = [rnd.randrange(2, V) for _ in range(T // 4)]
    exs = [dr.example(prompt + [rnd.randrange(2, V) for _ in range(T - len(prompt))], len(prompt))
           for _side in range(2)]
    dr.write_dataset(path, exs, task="dpo", vocab=V, max_len=T)


def read_row_logps(path):
    """row_logps of sbp-train's --compute-logps file (safetensors, standard library only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        a, b = head["row_logps"]["data_offsets"]
        f.seek(8 + n + a)
        raw = f.read(b - a)
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


# ---------------------------------------------------------------- sbpc and sbp-train

def report(a, T):
    """sbpc --report's stream column: training peak, log-probs workspace and log-probs peak."""
    cmd = [os.path.join(a.build, "tools", "sbpc"), MODEL, "--batch", "2", "--seq-len", str(T),
           "--objective", "dpo", "--report"]
    run = measure(cmd)
    out = run.out
    if run.rc:
        fail("sbpc --report", cmd, out)
        return None, cmd

    def last(label):
        m = re.search(re.escape(label) + r"\s+(\d+)\s+(\d+)\s+(\d+)", out)
        return int(m.group(3)) if m else None

    m = re.search(r"log-probs: peak \(params\+ws\)\s+(\S+ \S+)\s+(\S+ \S+)\s+(\S+ \S+)", out)
    return {"train_peak": last("peak (params+grads+opt+workspace)"),
            "train_ws": last("workspace, planned"),
            "params": last("parameters"),
            "lp_ws": last("log-probs: workspace, planned"),
            "lp_peak_text": m.group(3) if m else "?"}, cmd


def compile_step(a, T, tmp):
    so = os.path.join(tmp, "dpo_%d.so" % T)
    cmd = [os.path.join(a.build, "tools", "sbpc"), MODEL, "--batch", "2", "--seq-len", str(T),
           "--objective", "dpo", "-o", so]
    run = measure(cmd)
    if run.rc:
        fail("sbpc", cmd, run.out)
        return None, cmd
    return so, cmd


def sbp_logps(a, so, data, out):
    return [os.path.join(a.build, "tools", "sbp-train"), so, "--model", MODEL, "--dataset", data,
            "--compute-logps", out, "--threads", str(a.threads)]


def sbp_train(a, so, data, cache, steps):
    # AdamW (the default optimizer) so that its state is in the run's peak, as in a real run
    return [os.path.join(a.build, "tools", "sbp-train"), so, "--model", MODEL, "--dataset", data,
            "--steps", str(steps), "--optimizer", "adamw", "--lr", "1e-5", "--ref-cache", cache,
            "--threads", str(a.threads)]


# ---------------------------------------------------------------- the PyTorch side (a child)

def torch_child(args):
    """Runs in its own process (--torch-child): TRL's reference log-probs of the dataset's pair.
    Prints one JSON line: the row log-probs, the RSS before the pass and the pass's seconds."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--method", choices=("log_softmax", "selective"), required=True)
    ap.add_argument("--threads", type=int, default=2)
    c = ap.parse_args(args)
    import gc
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file
    torch.set_num_threads(c.threads)
    import bench_model
    gf = bench_model.configure()
    cfg = transformers.LlamaConfig(
        vocab_size=gf.VOCAB, hidden_size=gf.D_MODEL, intermediate_size=gf.LLAMA_FF,
        num_hidden_layers=gf.N_LAYER, num_attention_heads=gf.N_HEAD,
        num_key_value_heads=gf.N_KV_HEAD, max_position_embeddings=bench_model.MAX_POSITIONS,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
        attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg)
    # the bench model's own weights (the ONNX sbpc compiled was exported from the same build)
    src = bench_model.build()
    sd = {k: v for k, v in src.state_dict().items() if "rotary_emb" not in k}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary_emb" in k for k in missing), (missing, unexpected)
    del src, sd  # only the model TRL would hold stays resident
    gc.collect()
    model.eval()
    d = load_file(c.data)
    off = d["offsets"]
    # the pair as TRL's concatenated_forward batches it: chosen and rejected, one row each
    ids = torch.from_numpy(np.stack([d["input_ids"][off[i]:off[i + 1]] for i in range(2)])).long()
    labels = torch.from_numpy(np.stack([d["labels"][off[i]:off[i + 1]] for i in range(2)])).long()
    rss0 = rss_now()
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = model(input_ids=ids).logits          # [2, T, V] float32, every position
        mask = labels != -100
        index = labels.clamp(min=0).unsqueeze(-1)
        if c.method == "log_softmax":                 # TRL <= 0.13 get_batch_logps
            per_token = torch.gather(logits.log_softmax(-1), 2, index).squeeze(-1)
        else:                                         # TRL >= 0.14 selective_log_softmax, fp32
            sel = torch.gather(logits, 2, index).squeeze(-1)
            per_token = sel - torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
        row = (per_token * mask).sum(-1)
    dt = time.perf_counter() - t0
    print(json.dumps({"row_logps": row.tolist(), "rss_before": rss0, "seconds": dt}))


def rss_now():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


def torch_cmd(a, data, method):
    return [a.python, os.path.abspath(__file__), "--torch-child", "--data", data, "--method",
            method, "--threads", str(a.threads)]


# ---------------------------------------------------------------- the tables

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def mib(x):
    return "%.1f" % (x / MiB) if x is not None else "-"


def spread(xs):
    xs = [x for x in xs if x is not None]
    return "%.1f" % ((max(xs) - min(xs)) / MiB) if len(xs) > 1 else "-"


def main():
    if sys.argv[1:2] == ["--torch-child"]:
        return torch_child(sys.argv[2:])
    if sys.argv[1:2] == ["--write-pair"]:   # the dataset alone, for reproducing one figure
        return write_pair(sys.argv[3], int(sys.argv[2]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv-hf", "bin", "python"),
                    help="a Python with torch, transformers and safetensors")
    ap.add_argument("--seq-lens", default="4096,16384")
    ap.add_argument("--train-seq-lens", default="4096,16384",
                    help="T values at which (c) runs sbp-train's DPO steps (minutes each)")
    ap.add_argument("--steps", default="2,1", help="optimizer steps of each run of (c); a list "
                    "gives each of --train-seq-lens its own (a step at T = 16384: minutes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--methods", default="log_softmax",
                    help="PyTorch passes: log_softmax (TRL <= 0.13), selective (TRL >= 0.14)")
    ap.add_argument("--work", help="keep the datasets, steps and outputs here (default: a "
                    "temporary folder, removed)")
    a = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit("no %s: run bench/gen_bench_model.py first" % MODEL)
    Ts = [int(x) for x in a.seq_lens.split(",") if x]
    trainTs = [int(x) for x in a.train_seq_lens.split(",") if x]
    methods = [m for m in a.methods.split(",") if m]
    steps = [int(x) for x in a.steps.split(",")]
    a.steps_at = {T: steps[min(i, len(steps) - 1)] for i, T in enumerate(trainTs)}
    start = time.perf_counter()
    if a.work:
        os.makedirs(a.work, exist_ok=True)
        tmp_ctx, tmp = None, os.path.abspath(a.work)
    else:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="bench_ref_logps.")
        tmp = tmp_ctx.name
    cmds = []        # (command, note): each figure's own, in the order run
    res = {}

    def progress(what):
        print("  %s (%.0f s so far)" % (what, time.perf_counter() - start), file=sys.stderr,
              flush=True)

    for T in sorted(set(Ts) | set(trainTs)):
        data = os.path.join(tmp, "pair_%d.safetensors" % T)
        write_pair(data, T)
        cmds.append(([sys.executable, os.path.abspath(__file__), "--write-pair", str(T), data],
                     "the dataset: one pair of T tokens"))
        r = res[T] = {"report": None, "sbp": [], "torch": {m: [] for m in methods}, "train": {}}
        r["report"], cmd = report(a, T)
        cmds.append((cmd, "the plan"))
        so, cmd = compile_step(a, T, tmp)
        cmds.append((cmd, "the step"))
        if so is None:
            continue
        if T in Ts:
            for i in range(a.repeats):
                out = os.path.join(tmp, "logps_%d.safetensors" % T)
                cmd = sbp_logps(a, so, data, out)
                run = measure(cmd)
                if i == 0:
                    cmds.append((cmd, "(a)"))
                if run.rc:
                    fail("sbp-train --compute-logps", cmd, run.out)
                else:
                    m = re.search(r"computed in ([0-9.]+) s", run.out)
                    r["sbp"].append((run.peak, float(m.group(1)) if m else None,
                                     read_row_logps(out), run.pass_rss()))
                for m_ in methods:
                    cmd = torch_cmd(a, data, m_)
                    run = measure(cmd)
                    if i == 0:
                        cmds.append((cmd, "(b)"))
                    if run.rc:
                        fail("PyTorch (%s)" % m_, cmd, run.out)
                        continue
                    j = json.loads(run.out.strip().splitlines()[-1])
                    r["torch"][m_].append((run.peak, j["seconds"], j["row_logps"],
                                           j["rss_before"]))
                progress("T=%d: (a), (b) round %d of %d" % (T, i + 1, a.repeats))
        if T in trainTs:
            cache = os.path.join(tmp, "ref_cache_%d.safetensors" % T)
            if os.path.exists(cache):
                os.remove(cache)     # the first run must compute the reference log-probs
            for kind in ("with", "without"):  # the first writes the cache, the second reuses it
                cmd = sbp_train(a, so, data, cache, a.steps_at[T])
                run = measure(cmd)
                rc, text = run.rc, run.out
                cmds.append((cmd, "(c) with the reference pass (no cache yet)" if kind == "with"
                             else "(c) the same again: reuses the cache, no reference pass"))
                if rc:
                    fail("sbp-train (%s the reference pass)" % kind, cmd, text)
                    continue
                if kind == "without" and "reusing the reference log-probs" not in text:
                    sys.stderr.write("warning: the second run did not reuse the cache\n")
                r["train"][kind] = (run.peak, run.pass_rss(), run.wall)
            progress("T=%d: (c) done" % T)
    if tmp_ctx:
        tmp_ctx.cleanup()
    elapsed = time.perf_counter() - start
    print_tables(a, Ts, trainTs, methods, res, cmds, elapsed)


def table(head, rows):
    """A Markdown table, columns padded to their widest cell."""
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(n) for c, n in zip(cells, w)) + " |"
    print(line(head))
    print("|" + "|".join("-" * (n + 2) for n in w) + "|")
    for row in rows:
        print(line(row))


def print_tables(a, Ts, trainTs, methods, res, cmds, elapsed):
    print("bench model %s (d 256, 4 layers, V %d), DPO, one pair: B = 2 rows of T tokens; "
          "%d thread(s); MiB; (a) and (b) are medians of %d runs"
          % (os.path.basename(MODEL), V, a.threads, a.repeats))
    done = [(T, res[T]) for T in Ts if T in res and res[T]["sbp"]]
    if done:
        print("\n(a) the reference pass, stream (sbp_step_logps), and (b) PyTorch as TRL "
              "(full logits)")
        head = ["T", "plan: log-probs ws", "plan: params + ws", "(a) peak RSS",
                "(a) RSS in the pass"]
        for m in methods:
            head += ["(b) %s peak RSS" % m, "(b) before the pass"]
        head.append("(b) / (a) peaks")
        rows = []
        for T, r in done:
            rep = r["report"] or {}
            sbp_peak = med([x[0] for x in r["sbp"]])
            row = [T, mib(rep.get("lp_ws")), rep.get("lp_peak_text", "?").replace(" MiB", ""),
                   mib(sbp_peak), mib(med([x[3] for x in r["sbp"]]))]
            ratio = []
            for m in methods:
                tp = med([x[0] for x in r["torch"][m]])
                row += [mib(tp), mib(med([x[3] for x in r["torch"][m]]))]
                ratio.append("%.1fx" % (tp / sbp_peak) if tp and sbp_peak else "-")
            rows.append(row + [" / ".join(ratio)])
        table(head, rows)
        print("spread (max - min) of the peaks over the runs: " + "; ".join(
            "T=%d (a) %s, %s" % (T, spread([x[0] for x in r["sbp"]]), ", ".join(
                "(b) %s %s" % (m, spread([x[0] for x in r["torch"][m]])) for m in methods))
            for T, r in done))
        if len(done) > 1:   # between the smallest and largest T: no fixed costs in it
            (t0, r0), (t1, r1) = done[0], done[-1]

            def per(x0, x1):
                return "%.1f KiB/token" % ((x1 - x0) / (2 * (t1 - t0)) / 1024) \
                    if x0 is not None and x1 is not None else "-"
            print("growth from T=%d to T=%d per token of the pair: (a) in the pass %s, plan %s; "
                  "%s" % (t0, t1, per(med([x[3] for x in r0["sbp"]]), med([x[3] for x in r1["sbp"]])),
                          per((r0["report"] or {}).get("lp_ws"), (r1["report"] or {}).get("lp_ws")),
                          ", ".join("(b) %s %s" % (m, per(med([x[0] for x in r0["torch"][m]]),
                                                           med([x[0] for x in r1["torch"][m]])))
                                    for m in methods)))
        print("full logits [2, T, V] float32 alone: " + "; ".join(
            "T=%d %s" % (T, mib(2 * T * V * 4)) for T, _ in done))
        print("pass time, median s (wall clock, shared machine: indicative): " + "; ".join(
            "T=%d (a) %s, %s" % (T, fmt_s(med([x[1] for x in r["sbp"]])), ", ".join(
                "(b) %s %s" % (m, fmt_s(med([x[1] for x in r["torch"][m]]))) for m in methods))
            for T, r in done))
        for T, r in done:
            worst = None
            for m in methods:
                for s_, t_ in zip(r["sbp"], r["torch"][m]):
                    for x, y in zip(s_[2], t_[2]):
                        e = abs(x - y) / max(abs(y), 1e-30)
                        worst = e if worst is None or e > worst else worst
            if worst is not None:
                print("T=%d row log-probs (a) %s; largest relative difference from (b) %.1e"
                      % (T, ", ".join("%.2f" % v for v in r["sbp"][0][2]), worst))
    trained = [(T, res[T]) for T in trainTs if T in res and res[T]["train"]]
    if trained:
        print("\n(c) sbp-train's DPO run, AdamW, one run each")
        rows = []
        for T, r in trained:
            w, wo = r["train"].get("with"), r["train"].get("without")
            rep = r["report"] or {}
            rows.append([T, a.steps_at[T], mib(rep.get("train_peak")), mib(wo[0]) if wo else "-",
                         mib(w[0]) if w else "-", mib(w[1]) if w else "-",
                         "%+.1f" % ((w[0] - wo[0]) / MiB) if w and wo else "-"])
        table(["T", "steps", "plan: step peak", "peak RSS without the ref. pass",
               "peak RSS with it", "RSS in its ref. pass", "with - without"], rows)
    not_run = [T for T in Ts if T not in trainTs and T in res]
    if not_run:
        print("(c) not run at T = %s (--train-seq-lens); planned there: %s" % (
            ", ".join(map(str, not_run)),
            "; ".join("T=%d step peak %s MiB, log-probs %s" % (
                T, mib((res[T]["report"] or {}).get("train_peak")),
                (res[T]["report"] or {}).get("lp_peak_text", "?")) for T in not_run)))
    print("\nreproduce one figure (paths under --work DIR stay; peak RSS e.g. by "
          "/usr/bin/time -f %M):")
    for c, note in cmds:
        print("  # %s\n  %s" % (note, quote(c)))
    print("\nthis run: %.0f s (%.1f min), command: %s" % (elapsed, elapsed / 60, quote(
        [sys.executable] + sys.argv)))


def fmt_s(x):
    return "%.1f" % x if x is not None else "-"


if __name__ == "__main__":
    main()
