#!/usr/bin/env python3
"""compare.py — tests/dist's numerical checks: a distributed sbp-train run against one process on
the whole batch. The sums over ranks are added in another order than one process's, so
the check is a relative tolerance, not bytes.

  compare.py st A.safetensors B.safetensors TOL   every tensor of B in A: max|a-b| <= TOL*max|b|
  compare.py st2 A B TOL [NAME=TOL...]          every tensor: ||a-b|| <= TOL*||b|| (L2). For
                                                   the state after several AdamW steps: a
                                                   gradient element that is rounding noise (a
                                                   sum that cancels) is normalised to +-1 by
                                                   m/sqrt(v), so a few elements may move apart by
                                                   ~lr*1e-4 while the whole agrees to 1e-7
  compare.py log A.jsonl B.jsonl TOL [NTOL]        the same steps, loss and grad_norm within TOL
                                                   (grad_norm within NTOL when given)
                                                   relative (the loss: relative to the largest
                                                   |loss| of the run, as a GRPO loss may pass
                                                   near zero, where its own magnitude means
                                                   nothing)
  compare.py shard OUT.bin V N SEED                 an llm.c token shard of N tokens below V
  compare.py rows SRC.npy OUT.npy N                 an int32 [R,T] array's rows repeated
                                                   cyclically to N rows
"""
import json
import random
import struct
import sys
from array import array

# plain Python (no numpy): the interpreter CMake finds may have nothing but the standard library


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        a, b = t["data_offsets"]
        x = array("f")
        x.frombytes(raw[8 + n + a:8 + n + b])
        if sys.byteorder != "little":
            x.byteswap()
        out[name] = x
    return out


def cmp_st(pa, pb, tol, l2=False, per_name=None):
    a, b = read_st(pa), read_st(pb)
    if set(a) != set(b):
        sys.exit(f"compare: {pa} and {pb} hold other tensors: {sorted(set(a) ^ set(b))}")
    worst = 0.0
    for k in sorted(b):
        if len(a[k]) != len(b[k]):
            sys.exit(f"compare: {k}: {len(a[k])} vs {len(b[k])} elements")
        if l2:
            scale = sum(y * y for y in b[k]) ** 0.5
            err = sum((x - y) ** 2 for x, y in zip(a[k], b[k])) ** 0.5
        else:
            scale = max((abs(y) for y in b[k]), default=0.0)
            err = max((abs(x - y) for x, y in zip(a[k], b[k])), default=0.0)
        rel = err / scale if scale > 0 else err
        worst = max(worst, rel)
        if not rel <= (per_name or {}).get(k, tol):
            sys.exit(f"compare: {k}: {'||a-b||' if l2 else 'max |a-b|'} = {err:.3g}, {rel:.3g} "
                     f"relative > {tol} "
                     f"({pa} vs {pb})")
    print(f"compare: {len(b)} tensors agree{' (L2)' if l2 else ''}, worst {worst:.3g} "
          f"relative (<= {tol})")


def cmp_log(pa, pb, tol, norm_tol=None):
    la = [json.loads(x) for x in open(pa) if x.strip()]
    lb = [json.loads(x) for x in open(pb) if x.strip()]
    if [x["step"] for x in la] != [x["step"] for x in lb]:
        sys.exit(f"compare: {pa} and {pb} log other steps")
    worst = 0.0
    big = max(abs(y["loss"]) for y in lb) if lb else 0.0
    for x, y in zip(la, lb):
        for key in ("loss", "grad_norm"):
            rel = abs(x[key] - y[key]) / max(abs(y[key]) if key == "grad_norm" else big, 1e-30)
            worst = max(worst, rel)
            lim = norm_tol if key == "grad_norm" and norm_tol else tol
            if not rel <= lim:
                sys.exit(f"compare: step {x['step']}: {key} {x[key]!r} vs {y[key]!r}: {rel:.3g} "
                         f"relative > {lim}")
    # DPO's rewards: both logs have them or neither; each relative to the run's largest reward
    # (they pass near zero: step 1's are 0); the accuracy is not compared, as a pair whose
    # margin is a rounding error from 0 (step 1's all are) may count either way
    keys = ("rewards_chosen", "rewards_rejected", "rewards_margin")
    if any((k in x) != (k in y) for x, y in zip(la, lb) for k in keys):
        sys.exit(f"compare: {pa} and {pb}: one logs DPO's rewards and the other does not")
    have = bool(lb) and all(k in lb[0] for k in keys)
    big = max((abs(y[k]) for y in lb for k in keys), default=0.0) if have else 0.0
    for x, y in zip(la, lb) if have else ():
        for k in keys:
            rel = abs(x[k] - y[k]) / max(big, 1e-30)
            worst = max(worst, rel)
            if not rel <= tol:
                sys.exit(f"compare: step {x['step']}: {k} {x[k]!r} vs {y[k]!r}: {rel:.3g} "
                         f"relative > {tol}")
    print(f"compare: {len(lb)} steps agree (loss, grad_norm{', rewards' if have else ''}), "
          f"worst {worst:.3g} relative")


def shard(path, v, n, seed):
    rng = random.Random(seed)
    head = [20240520, 1, n] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *head))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(v) for _ in range(n))))


def rows(src, out, n):
    raw = open(src, "rb").read()
    (hl,) = struct.unpack("<H", raw[8:10])
    head = raw[10:10 + hl].decode("latin1")
    if "'<i4'" not in head or "False" not in head:
        sys.exit(f"compare: {src}: not a C-order int32 array")
    r, t = (int(x) for x in head.split("(")[1].split(")")[0].split(",")[:2])
    body = raw[10 + hl:]
    data = b"".join(body[(i % r) * t * 4:(i % r + 1) * t * 4] for i in range(n))
    h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (n, t)
    h += " " * (64 - (10 + len(h) + 1) % 64) + "\n"
    with open(out, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode("latin1") + data)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "st":
        cmp_st(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif mode == "st2":
        cmp_st(sys.argv[2], sys.argv[3], float(sys.argv[4]), l2=True,
               per_name={a.split("=")[0]: float(a.split("=")[1]) for a in sys.argv[5:]})
    elif mode == "log":
        cmp_log(sys.argv[2], sys.argv[3], float(sys.argv[4]),
                float(sys.argv[5]) if len(sys.argv) > 5 else None)
    elif mode == "rows":
        rows(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "shard":
        shard(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(f"compare: unknown mode {mode}")
