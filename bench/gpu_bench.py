#!/usr/bin/env python3
"""GPU training-step benchmark: sbpc's store, checkpoint and stream steps (--target cuda) next to
PyTorch with and without per-layer checkpointing, on a Qwen3-0.6B-shaped random model: d=1024,
28 layers, 16 query heads and 8 KV heads of dim 128, d_ff 3072, V=151936, q_norm/k_norm, RoPE
theta 1e6 (the qwen3 family of tests/fixtures/gen_fixtures.py at that size; its LM head is
untied, so 0.75B parameters rather than 0.6B). Batch 1, fp32 (no TF32 on either side), SFT
cross-entropy over every token; one step = forward + backward + gradient norm (clipped at 1) +
AdamW (lr 1e-5, weight decay 0.01) on both sides: sbp-train's AdamW, torch.optim.AdamW (its
default foreach) with clip_grad_norm_. Step time: the median of the steps after 2 warm-up ones
(sbp-train: differences of its --log elapsed_s).

    bench/gpu_bench.py --build BUILD [--out DIR] [--budget SECONDS] [--seq-lens 4096 8192 ...]

Run by tests/gpu/run.sh (stage 3) on the GPU machine. In order, each part within what is left
of --budget (it prints what it has when time runs out):
  1. exports the model with torch.onnx (TorchScript exporter; external data, > 2 GB) to
     DIR/qwen3_bench/model.onnx, in a subprocess; one RoPE cos/sin cache shared by the layers;
  2. for T = 4096, 8192, ...: compiles each strategy that its memory plan says fits (sbpc
     --report gives the three plans) and runs 2 steps with sbp-train: step time (the last
     step) and device memory (planned; and measured: what the process had in use above the
     CUDA context at its peak, arena + constants + runtime scratch + cuBLAS workspace);
  3. PyTorch in one subprocess (the model built once): the same T values, without and with
     torch.utils.checkpoint around each decoder layer, attention through
     F.scaled_dot_product_attention (causal; what Hugging Face runs by default), logits and
     cross-entropy as HF does; torch.cuda.max_memory_allocated as its peak; stops a mode at
     its first out-of-memory;
  4. the largest T that fits on the card: for sbpc from its memory plan, a compile-time answer:
     each strategy's smallest plan (sbpc's refusal of a tiny --memory-budget states it) at two
     T is affine in T; the T where it meets the device's free memory, less the step's constants,
     ids/labels and 1 GiB for the CUDA context, scratch and cuBLAS, is checked with
     `sbpc --memory-budget` (it fits, and T + 1024 does not) when it is within the model's
     131072 positions; for PyTorch by extrapolating its measured peaks (linear in T with SDPA)
     below its first OOM. Runs at such T would take long (attention is quadratic in T).
Prints a table (also written to DIR/gpu_bench.md).

--small uses a tiny model of the same family and --target cpu runs the sbpc side on the CPU
runtime and PyTorch on the CPU: a smoke test of this script where there is no GPU.
"""
import argparse
import inspect
import json
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = 1 << 30

FULL = dict(D=1024, L=28, H=16, KV=8, HD=128, FF=3072, V=151936, MAX_POS=1 << 17, THETA=1e6)
SMALL = dict(D=64, L=2, H=4, KV=2, HD=16, FF=128, V=1000, MAX_POS=1 << 14, THETA=1e6)
STRATEGIES = ["store", "checkpoint", "stream"]
# The same optimizer on both sides: AdamW (betas 0.9/0.999, eps 1e-8) with these, and the
# gradient norm clipped at CLIP (sbp-train computes the norm every step); WARMUP steps untimed.
LR, WD, CLIP, WARMUP = 1e-5, 0.01, 1.0, 2
TORCH_MODES = ["torch", "torch+ckpt"]


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------ the model (torch side)

def configure(cfg):
    """gen_fixtures at this size (it imports onnx only where it writes and checks fixtures, so
    its model classes load on machines without the onnx package)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
    import gen_fixtures as gf
    gf.D_MODEL, gf.N_LAYER, gf.VOCAB = cfg["D"], cfg["L"], cfg["V"]
    gf.N_HEAD, gf.N_KV_HEAD, gf.HEAD_DIM = cfg["H"], cfg["KV"], cfg["HD"]
    gf.LLAMA_FF, gf.N_POSITIONS = cfg["FF"], cfg["MAX_POS"]
    # One rotary cache for every layer (each layer would build its own [MAX_POS, HD] pair,
    # 28 copies in the ONNX file); the exporter then writes one initializer pair.
    orig = getattr(gf, "_OrigRotary", gf.LlamaRotaryEmbedding)
    gf._OrigRotary = orig
    shared = {}

    def rotary(dim, max_position_embeddings=cfg["MAX_POS"], base=cfg["THETA"]):
        key = (dim, max_position_embeddings, base)
        if key not in shared:
            shared[key] = orig(dim, max_position_embeddings, base)
        return shared[key]

    gf.LlamaRotaryEmbedding = rotary
    return gf


def build_model(gf):
    """gf.build("qwen3"), without torch's default initialisation of each layer (gf.build
    overwrites every parameter from its own generator, so the weights are the same; at 0.75B
    parameters the default init alone takes tens of seconds)."""
    import torch
    saved = {n: getattr(torch.nn.init, n) for n in ("kaiming_uniform_", "uniform_", "normal_")}
    try:
        for n in saved:
            setattr(torch.nn.init, n, lambda t, *args, **kw: t)
        return gf.build("qwen3", gf.SEED)
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def model_cfg(a):
    """The model's shape: FULL or SMALL, with --layers overriding the layer count."""
    cfg = dict(SMALL if a.small else FULL)
    if getattr(a, "layers", None):
        cfg["L"] = a.layers
    return cfg


def shape_args(a):
    """The options that give a subprocess the same model shape."""
    return (["--small"] if a.small else []) + (["--layers", str(a.layers)] if a.layers else [])


def cmd_export(a):
    import torch
    cfg = model_cfg(a)
    gf = configure(cfg)
    t0 = time.time()
    model = build_model(gf)
    n = sum(p.numel() for p in model.parameters())
    log(f"built the model: {n / 1e9:.3f} B parameters in {time.time() - t0:.1f} s")
    os.makedirs(os.path.dirname(a.export), exist_ok=True)
    ids = torch.randint(0, cfg["V"], (1, 64))
    kw = dict(export_params=True, training=torch.onnx.TrainingMode.EVAL, opset_version=17,
              do_constant_folding=True, input_names=["input_ids"], output_names=["logits"],
              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                            "logits": {0: "batch", 1: "sequence"}})
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = False  # the TorchScript exporter, as the fixtures (sbpc reads both)
    t0 = time.time()
    with torch.no_grad():
        torch.onnx.export(model, (ids,), a.export, **kw)
    size = sum(os.path.getsize(os.path.join(os.path.dirname(a.export), f))
               for f in os.listdir(os.path.dirname(a.export)))
    log(f"exported {a.export} ({size / GIB:.2f} GiB with external data) in "
        f"{time.time() - t0:.1f} s")


def cmd_torch(a):
    """One JSON line per (T, mode): step time (median of the steps after the first), peak
    memory, loss; {"ok": false, "why": ...} on an out-of-memory, after which that mode stops."""
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint as ckpt
    cfg = model_cfg(a)
    gf = configure(cfg)
    dev = torch.device(a.device)
    model = build_model(gf).to(dev)
    model.train()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rot = model.model.layers[0].self_attn.rotary_emb
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    try:
        sdpa_scale = sdpa is not None and "scale" in inspect.signature(sdpa).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        sdpa_scale = False
    groups = cfg["H"] // cfg["KV"]

    def layer_fwd(layer, x, pos):
        at = layer.self_attn
        B, T, _ = x.shape
        r = x
        x = layer.input_layernorm(x)
        q = at.q_norm(at.q_proj(x).view(B, T, -1, cfg["HD"])).transpose(1, 2)
        k = at.k_norm(at.k_proj(x).view(B, T, -1, cfg["HD"])).transpose(1, 2)
        v = at.v_proj(x).view(B, T, -1, cfg["HD"]).transpose(1, 2)
        cos, sin = rot.cos_cached[:T], rot.sin_cached[:T]
        q, k = gf.apply_rotary_pos_emb(q, k, cos, sin, pos)
        k, v = gf.repeat_kv(k, groups), gf.repeat_kv(v, groups)
        if sdpa is not None:  # torch 2.0 has no scale argument; its default is at.scaling
            o = sdpa(q, k, v, is_causal=True, scale=at.scaling) if sdpa_scale else \
                sdpa(q, k, v, is_causal=True)
        else:  # torch 1.x (smoke test only): explicit causal softmax
            s = (q @ k.transpose(2, 3)) * at.scaling
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1),
                              float("-inf"))
            o = torch.softmax(s, dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, T, -1)
        x = r + at.o_proj(o)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def step(ids, labels, use_ckpt):
        T = ids.shape[1]
        pos = torch.arange(T, device=dev)[None]
        h = model.model.embed_tokens(ids)
        for layer in model.model.layers:
            if use_ckpt:
                h = ckpt.checkpoint(layer_fwd, layer, h, pos, use_reentrant=False)
            else:
                h = layer_fwd(layer, h, pos)
        logits = model.lm_head(model.model.norm(h)).float()
        loss = F.cross_entropy(logits.view(-1, cfg["V"]), labels.view(-1))
        loss.backward()
        return loss.item()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=WD)

    def full_step(ids, labels, use_ckpt):
        loss = step(ids, labels, use_ckpt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        return loss

    dead = set()
    for T in a.seq_lens:
        for mode in TORCH_MODES:
            if mode in dead:
                continue
            ids, labels = (torch.tensor([x], dtype=torch.long, device=dev)
                           for x in batch(T, cfg["V"]))  # the batch sbp-train gets
            times, loss, res = [], None, None
            try:
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                for _ in range(a.steps):
                    model.zero_grad(set_to_none=True)
                    sync()
                    t0 = time.perf_counter()
                    loss = full_step(ids, labels, mode == "torch+ckpt")
                    sync()
                    times.append(time.perf_counter() - t0)
                peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
                reserved = torch.cuda.max_memory_reserved() if dev.type == "cuda" else None
                res = dict(T=T, mode=mode, ok=True, time=statistics.median(times[WARMUP:] or times),
                           peak=peak, reserved=reserved, loss=loss)
                if a.profile_kernels and mode == "torch":
                    res["kernels"] = profile_step(torch, lambda: full_step(ids, labels, False),
                                                  model, sync)
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
                if "out of memory" not in str(e).lower():
                    raise
                dead.add(mode)
                res = dict(T=T, mode=mode, ok=False, why="OOM")
            model.zero_grad(set_to_none=True)
            ids = labels = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            print(json.dumps(res), flush=True)


def profile_step(torch, run, model, sync):
    """[[kernel, launches, total device ns], ...] of one more step, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    model.zero_grad(set_to_none=True)
    sync()
    act = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    with profile(activities=[act]) as prof:
        run()
        sync()
    out = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) if act == ProfilerActivity.CUDA else \
            getattr(e, "self_cpu_time_total", 0)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us:
            out.append([e.key, e.count, int(us * 1000)])
    return sorted(out, key=lambda r: -r[2])


# ------------------------------------------------------------------ the driver

def batch(T, V):
    """The random ids and labels of the batch at T (both sides use the same)."""
    rng = random.Random(T)
    return [rng.randrange(V) for _ in range(T)], [rng.randrange(V) for _ in range(T)]


def write_npy_i32(path, rows):
    """A [1, T] int32 .npy without numpy."""
    T = len(rows)
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (1, %d), }" % T
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%di" % T, *rows))


def device_memory(target):
    """(total, free) bytes of device 0 (cuda: nvidia-smi), or of the host (cpu)."""
    if target == "cpu":
        info = dict(l.split(":", 1) for l in open("/proc/meminfo"))
        kb = lambda k: int(info[k].split()[0]) * 1024  # noqa: E731
        return kb("MemTotal"), kb("MemAvailable")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.free",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout
        total, free = (int(x) << 20 for x in out.strip().split(","))
        return total, free
    except Exception:  # noqa: BLE001
        return None, None


class Bench:
    def __init__(self, a):
        self.a = a
        self.t_end = time.monotonic() + a.budget
        self.cfg = model_cfg(a)
        self.sbpc = os.path.join(a.build, "tools", "sbpc")
        self.train = os.path.join(a.build, "tools", "sbp-train")
        self.dir = os.path.join(a.out, "qwen3_bench" + ("_small" if a.small else ""))
        self.model = os.path.join(self.dir, "model.onnx")
        self.plans = {}     # T -> {strategy: planned peak bytes (params + grads + workspace)}
        self.consts = {}    # T -> bytes of the step's constants
        self.rows = {}      # (T, method) -> result dict
        self.largest = {}   # method -> text
        self.min_plans = {}  # (strategy, T) -> smallest planned peak

    def left(self):
        return self.t_end - time.monotonic()

    def run(self, cmd, limit):
        limit = max(1.0, min(limit, self.left()))
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            return r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired:
            return None, "", f"timed out after {limit:.0f} s"

    # -- 1. the model
    def export(self):
        if os.path.exists(self.model):
            log(f"model: {self.model} (exists)")
            return True
        log("exporting the model (torch.onnx) ...")
        rc, out, err = self.run([self.a.python, os.path.abspath(__file__), "--export", self.model]
                                + shape_args(self.a), 600)
        sys.stdout.write(out)
        if rc != 0:
            log(f"export failed ({rc}): {err.strip()[-2000:]}")
            return False
        return True

    # -- 2. sbpc
    def free_for_step(self, T):
        """What a step may plan at T: free device memory less the constants, ids/labels and
        1 GiB for the CUDA context, runtime scratch and cuBLAS."""
        c = self.consts.get(T, 1028 * T)
        return self.free0 - c - 8 * T - GIB

    def parse_report(self, T, text):
        cols = {}
        for key in ("parameters", "gradients", "workspace, planned"):
            m = re.search(r"^\s+%s\s+(\S+)\s+(\S+)\s+(\S+)\s*$" % re.escape(key), text, re.M)
            if not m:
                return
            for s, v in zip(STRATEGIES, m.groups()):
                cols.setdefault(s, []).append(int(v) if v.isdigit() else None)
        self.plans[T] = {s: (sum(v) if None not in v else None) for s, v in cols.items()}
        m = re.search(r"constants in the step library: (\d+) and (\d+) bytes", text)
        if m:
            self.consts[T] = int(m.group(2))

    def compile(self, T, strategy, report):
        so = os.path.join(self.dir, f"step_{strategy}_{T}.so")
        cmd = [self.sbpc, self.model, "--batch", "1", "--seq-len", str(T), "--strategy", strategy,
               "--target", self.a.target, "-o", so] + (["--report"] if report else [])
        t0 = time.monotonic()
        rc, out, err = self.run(cmd, 600)
        if report:
            self.parse_report(T, out)
        if rc != 0:
            return None, (err.strip().splitlines() or ["?"])[-1]
        return so, time.monotonic() - t0

    def sbp_train(self, T, so):
        ids = os.path.join(self.dir, f"ids_{T}.npy")
        labels = os.path.join(self.dir, f"labels_{T}.npy")
        ids_v, labels_v = batch(T, self.cfg["V"])
        write_npy_i32(ids, ids_v)
        write_npy_i32(labels, labels_v)
        log_path = os.path.join(self.dir, f"train_{T}.jsonl")
        if os.path.exists(log_path):
            os.remove(log_path)
        cmd = [self.train, so, "--model", self.model, "--input-ids", ids, "--labels", labels,
               "--steps", str(self.a.steps), "--optimizer", "adamw", "--lr", str(LR),
               "--weight-decay", str(WD), "--clip-grad-norm", str(CLIP), "--log", log_path]
        if self.a.target == "cpu":
            cmd += ["--threads", str(os.cpu_count() or 1)]
        rc, out, err = self.run(cmd, 900)
        text = out + err
        if rc != 0:
            why = "OOM" if "out of memory" in text else "failed: " + \
                (err.strip().splitlines() or ["?"])[-1][:200]
            return dict(ok=False, why=why, log=text)
        steps = re.findall(r"^step (\d+) loss (\S+) tokens/s (\S+)", out, re.M)
        if not steps:
            return dict(ok=False, why="failed: no 'step N loss' line", log=text)
        tps = float(steps[-1][2])
        res = dict(ok=True, time=T / tps if tps > 0 else float("nan"), loss=float(steps[-1][1]))
        try:  # per-step times from the log: differences of elapsed_s, after the warm-up steps
            el = [json.loads(x)["elapsed_s"] for x in open(log_path) if x.strip()]
            dts = [b - c for b, c in zip(el[1:], el[:-1])][max(0, WARMUP - 1):]
            if dts:
                res["time"] = statistics.median(dts)
        except (OSError, ValueError, KeyError):
            pass
        m = re.search(r"actual \S+ \S+ more in use than before the arena \((\d+) bytes", out)
        res["peak"] = int(m.group(1)) if m else None
        if m is None:  # the CPU runtime: peak RSS
            m = re.search(r"actual ([0-9.]+) (KiB|MiB|GiB) \(peak RSS\)", out)
            if m:
                res["peak"] = int(float(m.group(1)) * {"KiB": 1 << 10, "MiB": 1 << 20,
                                                       "GiB": 1 << 30}[m.group(2)])
        return res

    def sbpc_side(self):
        alive = set(STRATEGIES)
        for T in self.a.seq_lens:
            if not alive or self.left() < 30:
                break
            if T > self.cfg["MAX_POS"]:
                break
            for i, s in enumerate(STRATEGIES):
                if s not in alive:
                    continue
                if self.left() < 20:
                    log("  (out of time)")
                    return
                report = T not in self.plans
                plan = self.plans.get(T, {}).get(s)
                if plan is not None and plan > self.free_for_step(T):
                    self.rows[(T, s)] = dict(ok=False, why="no fit (plan)", plan=plan)
                    alive.discard(s)
                    log(f"T={T} {s}: planned {plan / GIB:.1f} GiB does not fit")
                    continue
                so, info = self.compile(T, s, report)
                plan = self.plans.get(T, {}).get(s)
                if so is None:
                    self.rows[(T, s)] = dict(ok=False, why="sbpc: " + info[:200], plan=plan)
                    alive.discard(s)
                    log(f"T={T} {s}: sbpc failed: {info}")
                    continue
                if plan is not None and plan > self.free_for_step(T):
                    self.rows[(T, s)] = dict(ok=False, why="no fit (plan)", plan=plan)
                    alive.discard(s)
                    log(f"T={T} {s}: planned {plan / GIB:.1f} GiB does not fit")
                    continue
                r = self.sbp_train(T, so)
                r["plan"] = plan
                r["compile"] = info
                self.rows[(T, s)] = r
                try:
                    os.remove(so)
                except OSError:
                    pass
                if r["ok"]:
                    log(f"T={T} {s}: {r['time']:.3f} s/step, planned "
                        f"{(plan or 0) / GIB:.2f} GiB, measured "
                        f"{(r['peak'] or 0) / GIB:.2f} GiB, loss {r['loss']:.4f} "
                        f"(compiled in {info:.1f} s)")
                else:
                    alive.discard(s)
                    log(f"T={T} {s}: {r['why']}")
                    if not r["why"].startswith("OOM"):
                        log(r["log"][-1500:])

    # -- 3. PyTorch
    def torch_side(self, limit):
        cmd = [self.a.python, os.path.abspath(__file__), "--torch-worker", "--device",
               "cpu" if self.a.target == "cpu" else "cuda", "--steps", str(self.a.steps),
               "--seq-lens"] + [str(t) for t in self.a.seq_lens if t <= self.cfg["MAX_POS"]] \
            + shape_args(self.a)
        t_stop = time.monotonic() + max(10.0, min(limit, self.left()))
        err_path = os.path.join(self.dir, "torch_worker.err")
        err_f = open(err_path, "w")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_f, text=True)
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        while True:
            wait = t_stop - time.monotonic()
            if wait <= 0:
                p.kill()
                log("  (PyTorch: out of time)")
                break
            if not sel.select(timeout=min(wait, 5.0)):
                if p.poll() is not None:
                    break
                continue
            line = p.stdout.readline()
            if not line:
                break
            try:
                r = json.loads(line)
            except ValueError:
                continue
            self.rows[(r["T"], r["mode"])] = r
            if r["ok"]:
                log(f"T={r['T']} {r['mode']}: {r['time']:.3f} s/step, peak "
                    f"{(r['peak'] or 0) / GIB:.2f} GiB allocated "
                    f"({(r['reserved'] or 0) / GIB:.2f} GiB reserved), loss {r['loss']:.4f}")
            else:
                log(f"T={r['T']} {r['mode']}: {r['why']}")
        p.wait()
        err_f.close()
        err = open(err_path).read()
        if p.returncode not in (0, -9) and err:
            log("PyTorch worker failed:\n" + err[-2000:])

    # -- 4. the largest T
    def min_plan(self, s, T):
        """The smallest planned peak of strategy s at T (stream: chunk 1, logits chunk 1), from
        sbpc's refusal of a 1 KiB budget (one import and plan, nothing written)."""
        if (s, T) in self.min_plans:
            return self.min_plans[(s, T)]
        rc, _, err = self.run([self.sbpc, self.model, "--batch", "1", "--seq-len", str(T),
                               "--strategy", s, "--memory-budget", "1K", "-o",
                               os.path.join(self.dir, "probe.c")], 300)
        m = re.search(r"smallest \S+ plan.*? needs (\d+) bytes", err)
        v = int(m.group(1)) if m else None
        self.min_plans[(s, T)] = v
        return v

    def fits(self, s, T):
        """sbpc plans strategy s at T within what the device has free (stream chooses the
        largest chunks that fit)."""
        budget = self.free_for_step(T)
        if budget <= 0:
            return False
        rc, _, _ = self.run([self.sbpc, self.model, "--batch", "1", "--seq-len", str(T),
                             "--strategy", s, "--memory-budget", str(budget), "-o",
                             os.path.join(self.dir, "probe.c")], 300)
        return rc == 0

    def largest_sbpc(self):
        """Each strategy's smallest plan is affine in T (sbpc's buffers are rows of tokens; no
        T x T buffer exists): two plans give the largest T whose plan fits in the free memory
        (less the step's constants, ids, labels and 1 GiB); verified with sbpc --memory-budget
        where that T is within the model's positions and the time allows."""
        cap = self.cfg["MAX_POS"]
        runs = sorted(self.plans)
        t1 = runs[0] if runs else 4096
        t2 = runs[-1] if len(runs) > 1 and runs[-1] >= 2 * t1 else 4 * t1
        for T in runs:  # store and checkpoint have one plan: the report's is the smallest
            for s in ("store", "checkpoint"):
                if self.plans[T].get(s) is not None:
                    self.min_plans.setdefault((s, T), self.plans[T][s])
        for s in STRATEGIES:
            if self.left() < 30:
                self.largest[s] = "(out of time)"
                continue
            p1, p2 = self.min_plan(s, t1), self.min_plan(s, t2)
            if p1 is None or p2 is None or p2 <= p1:
                self.largest[s] = "(no plan)"
                log(f"largest T, {s}: no plan at T={t1}/{t2}")
                continue
            slope = (p2 - p1) / (t2 - t1) + 1028 + 8  # + constants, ids and labels per token
            est = int(t1 + (self.free0 - GIB - (p1 + 1036 * t1)) / slope) // 1024 * 1024
            what = f"memory plan, extrapolated from T={t1} and {t2}"
            if est <= 0:
                self.largest[s] = f"< {t1} ({what})"
            elif est <= cap and self.left() > 60:
                ok = self.fits(s, est)
                tight = ok and est + 1024 <= cap and self.left() > 120
                nxt = tight and self.fits(s, est + 1024)
                tag = "NOT confirmed by sbpc --memory-budget" if not ok else \
                    f"sbpc --memory-budget fits {est + 1024} too" if nxt else \
                    f"sbpc --memory-budget: fits, {est + 1024} does not" if tight else \
                    "sbpc --memory-budget: fits"
                self.largest[s] = f"{est} ({what}; {tag})"
            else:
                beyond = f"; beyond the model's {cap} positions" if est > cap else ""
                self.largest[s] = f"{est} ({what}{beyond})"
            log(f"largest T, {s}: {self.largest[s]}")

    def largest_torch(self):
        for mode in TORCH_MODES:
            pts = sorted((T, r["peak"]) for (T, m), r in self.rows.items()
                         if m == mode and r.get("ok") and r.get("peak"))
            ooms = sorted(T for (T, m), r in self.rows.items() if m == mode and not r.get("ok"))
            if len(pts) >= 2 and pts[-1][1] > pts[0][1]:
                (t1, p1), (t2, p2) = pts[0], pts[-1]
                slope = (p2 - p1) / (t2 - t1)
                est = int(t2 + (self.free0 - GIB - p2) / slope) // 1024 * 1024
                if ooms:
                    est = min(est, ooms[0] - 1024)
                self.largest[mode] = f"~{est} (extrapolated from its peaks at T={t1}..{t2})"
            elif pts and ooms:
                self.largest[mode] = f"{pts[-1][0]}..{ooms[0]} (measured; OOM at {ooms[0]})"
            elif ooms:
                self.largest[mode] = f"< {ooms[0]} (OOM)"
            else:
                self.largest[mode] = "(not measured)"
            log(f"largest T, {mode}: {self.largest[mode]}")

    # -- the table
    def table(self):
        methods = STRATEGIES + TORCH_MODES
        c = self.cfg
        lines = [f"Qwen3-0.6B-shaped random model: d={c['D']}, {c['L']} layers, {c['H']} heads, "
                 f"{c['KV']} KV heads, head dim {c['HD']}, d_ff {c['FF']}, V={c['V']}; batch 1, "
                 f"fp32; target {self.a.target}; device {self.device_name}, "
                 f"{(self.total0 or 0) / GIB:.1f} GiB ({self.free0 / GIB:.1f} GiB free at start)",
                 "",
                 "step time (s: forward, backward, gradient norm and AdamW; the median of %d steps "
                 "after %d warm-up ones), peak memory (GiB, AdamW state included): sbpc planned "
                 "step / measured (above the CUDA context), PyTorch max_memory_allocated"
                 % (max(1, self.a.steps - WARMUP), WARMUP), ""]
        head = "| T | " + " | ".join(methods) + " |"
        lines += [head, "|" + "---|" * (len(methods) + 1)]
        for T in sorted({t for t, _ in self.rows}):
            cells = []
            for m in methods:
                r = self.rows.get((T, m))
                if r is None:
                    cells.append("-")
                elif not r.get("ok"):
                    cells.append(r.get("why", "failed"))
                elif m in STRATEGIES:
                    cells.append(f"{r['time']:.3f} s, {(r.get('plan') or 0) / GIB:.2f} / "
                                 f"{(r.get('peak') or 0) / GIB:.2f}")
                else:
                    cells.append(f"{r['time']:.3f} s, "
                                 + (f"{r['peak'] / GIB:.2f}" if r.get("peak") else "-"))
            lines.append(f"| {T} | " + " | ".join(cells) + " |")
        lines += ["", "largest T that fits:"]
        for m in methods:
            lines.append(f"  {m:<11} {self.largest.get(m, '(not determined)')}")
        text = "\n".join(lines)
        print("\n" + text, flush=True)
        with open(os.path.join(self.a.out, "gpu_bench.md"), "w") as f:
            f.write(text + "\n")

    def main(self):
        os.makedirs(self.dir, exist_ok=True)
        self.total0, self.free0 = device_memory(self.a.target)
        self.device_name = "cpu (host memory)" if self.a.target == "cpu" else "?"
        if self.a.target == "cuda":
            r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                                "0"], capture_output=True, text=True)
            self.device_name = r.stdout.strip() or "?"
        if not self.free0:
            log("cannot read the device's memory (nvidia-smi)")
            return 1
        if self.a.device_free:
            self.free0 = self.a.device_free
        elif self.a.small and self.a.target == "cpu":
            self.free0 = min(self.free0, 4 * GIB)
        log(f"device: {self.device_name}, {self.free0 / GIB:.1f} GiB free; budget "
            f"{self.left():.0f} s")
        if not self.export():
            return 1
        t_sbpc = time.monotonic() + self.left() * 0.55
        budget_end = self.t_end
        self.t_end = t_sbpc
        self.sbpc_side()
        self.t_end = budget_end
        if not self.a.no_torch:
            self.torch_side(self.left() * 0.6)
        self.largest_torch()
        self.largest_sbpc()
        self.table()
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "gpu_bench"))
    ap.add_argument("--budget", type=float, default=300, help="seconds for everything")
    ap.add_argument("--seq-lens", type=int, nargs="+",
                    default=[4096, 8192, 16384, 32768])
    ap.add_argument("--steps", type=int, default=5,
                    help="steps per run; the median of those after the %d warm-up ones" % WARMUP)
    ap.add_argument("--target", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny model (smoke test)")
    ap.add_argument("--layers", type=int, help="the model's layers (default: Qwen3-0.6B's 28)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--device-free", type=int, default=0,
                    help="bytes to take as the device's free memory (default: measured)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    # subprocess modes
    ap.add_argument("--export", help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile-kernels", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.export:
        return cmd_export(a)
    if a.torch_worker:
        return cmd_torch(a)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    return Bench(a).main()


if __name__ == "__main__":
    sys.exit(main())
