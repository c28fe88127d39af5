#!/usr/bin/python3
"""A chain model for the scale benchmark (bench/bench_scale.py): N cheap ops in a row.

    /usr/bin/python3 bench/gen_chain_model.py N OUT.onnx [--dim D] [--vocab V]

input_ids [batch, sequence] (int64; static dims 2 x 64 by default, so that `sbpc OUT.onnx -o x.c`
compiles it as it is; --symbolic writes symbolic dims) -> Gather from an embedding [V, D] -> N ops on
[batch, sequence, D], cycling through MatMul by a weight [D, D], Tanh, Mul by a scalar constant
and Add of a bias [D] -> MatMul by the LM head [D, V] -> logits [batch, sequence, V]. sbpc's
default objective (SFT) appends the cross-entropy; every op has a gradient rule, so the whole
chain trains. The file is small at D = 8 (N = 100000: about 2 MB of weights); it is generated at
bench time into the build folder, not committed. Needs only the `onnx` package (Debian's
python3-onnx) and numpy.
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(n_ops, dim, vocab, dims, seed=0):
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def param(name, shape, scale):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    param("embed", (vocab, dim), 0.5)
    nodes.append(helper.make_node("Gather", ["embed", "input_ids"], ["x0"], name="embed_lookup"))
    inits.append(numpy_helper.from_array(np.array(0.9, dtype=np.float32), "scale"))
    x = "x0"
    for i in range(n_ops):
        y = f"x{i + 1}"
        kind = i % 4
        if kind == 0:
            w = param(f"w{i}", (dim, dim), 1.0 / np.sqrt(dim))
            nodes.append(helper.make_node("MatMul", [x, w], [y], name=f"matmul{i}"))
        elif kind == 1:
            nodes.append(helper.make_node("Tanh", [x], [y], name=f"tanh{i}"))
        elif kind == 2:
            nodes.append(helper.make_node("Mul", [x, "scale"], [y], name=f"scale{i}"))
        else:
            b = param(f"b{i}", (dim,), 0.1)
            nodes.append(helper.make_node("Add", [x, b], [y], name=f"bias{i}"))
        x = y
    param("lm_head", (dim, vocab), 1.0 / np.sqrt(dim))
    nodes.append(helper.make_node("MatMul", [x, "lm_head"], ["logits"], name="lm_head_matmul"))
    graph = helper.make_graph(
        nodes, f"chain_{n_ops}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, dims + [vocab])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="sbpc-bench")
    model.ir_version = 8
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="number of ops in the chain")
    ap.add_argument("out", help="output .onnx path")
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--symbolic", action="store_true",
                    help="symbolic batch and sequence dims (bind them with sbpc --batch --seq-len)")
    a = ap.parse_args()
    dims = ["batch", "sequence"] if a.symbolic else [a.batch, a.seq_len]
    model = build(a.n, a.dim, a.vocab, dims)
    onnx.save(model, a.out)
    print(a.out, len(model.graph.node), "nodes")


if __name__ == "__main__":
    main()
