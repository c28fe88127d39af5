#!/usr/bin/python3
"""The models of compiler_case.sh: small ONNX graphs whose numbers or names are hostile to sbpc
itself (its constant folder, its shape inference, its code generator, its memory planner)
rather than to the files around it.

    compiler_models.py CASE OUT.onnx

Written at test time (Debian's python3-onnx and numpy; exit 77, ctest's skip, when they cannot
be imported). Every model is bigram-shaped: ids [1, 8] -> Gather(W) -> [1, 8, 16] logits, with
the hostile part added on the way:
  slice_step_int64_max  a constant [2, 16] sliced on axis 0 with step INT64_MAX (valid ONNX:
                        one row), added to the logits; folded to a constant
  concat_extent_wrap    two [0, 2^62] byte constants (Expand of a [1, 1]: no elements, and
                        2^62 bytes of shape is still a size that fits) concatenated on axis 1:
                        their extents add up past 64 bits
  split_sizes_wrap      the logits split on axis 2 into sizes INT64_MAX and 1
  split_even_wrap       a [0, INT64_MAX] byte constant split in two equal parts on axis 1 (it
                        cannot be: INT64_MAX is odd), where rounding the part up would wrap
  range_nan             a float Range whose start is NaN
  gather_float_index    a Gather whose constant index is a float (NaN)
  comment_names         weights and nodes named with comment openers and closers ("x/*y",
                        "h*/k/*"), which sbpc's generated C carries in its comments
  chain_20k             20,000 elementwise nodes (Add, Mul, Relu in turn) after the Gather
"""
import sys

try:
    import numpy as np
    import onnx
    import onnx.numpy_helper as nh
    from onnx import TensorProto, helper
except ImportError as e:
    print("compiler_models.py: %s: skipped" % e, file=sys.stderr)
    sys.exit(77)

V, T = 16, 8
INT64_MAX = 2**63 - 1


def i64(name, v):
    return nh.from_array(np.array(v, dtype=np.int64), name)


def f32(name, a):
    return nh.from_array(np.asarray(a, dtype=np.float32), name)


def table(name="W"):
    return f32(name, (np.arange(V * V) % 7 / 7.0).reshape(V, V))


def save(path, nodes, inits):
    g = helper.make_graph(
        nodes, "hostile",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    m.producer_name = "sbpc-hardening"
    onnx.save(m, path)


def embed(out="x"):
    return helper.make_node("Gather", ["W", "ids"], [out], name="embed")


def const(out, array):
    return helper.make_node("Constant", [], [out], name=out + "_const",
                            value=nh.from_array(array, ""))


def slice_step_int64_max():
    rows = (np.arange(2 * V) / 8.0).astype(np.float32).reshape(2, V)
    nodes = [embed(), const("rows", rows),
             helper.make_node("Slice", ["rows", "s0", "e2", "a0", "step"], ["row"],
                              name="slice_big_step"),
             helper.make_node("Add", ["x", "row"], ["logits"], name="add")]
    return nodes, [table(), i64("s0", [0]), i64("e2", [2]), i64("a0", [0]),
                   i64("step", [INT64_MAX])]


def concat_extent_wrap():
    half = 2**62
    nodes = [embed("logits"), const("one", np.ones((1, 1), np.uint8)),
             helper.make_node("Expand", ["one", "wide"], ["a"], name="expand_a"),
             helper.make_node("Expand", ["one", "wide"], ["b"], name="expand_b"),
             helper.make_node("Concat", ["a", "b"], ["ab"], name="concat_hostile", axis=1)]
    return nodes, [table(), i64("wide", [0, half])]


def split_sizes_wrap():
    nodes = [embed(),
             helper.make_node("Split", ["x", "sizes"], ["p", "q"], name="split_hostile", axis=2),
             helper.make_node("Add", ["p", "q"], ["logits"], name="add")]
    return nodes, [table(), i64("sizes", [INT64_MAX, 1])]


def split_even_wrap():
    nodes = [embed("logits"), const("one", np.ones((1, 1), np.uint8)),
             helper.make_node("Expand", ["one", "widest"], ["a"], name="expand_a"),
             helper.make_node("Split", ["a"], ["p", "q"], name="split_hostile", axis=1)]
    return nodes, [table(), i64("widest", [0, INT64_MAX])]


def range_nan():
    nodes = [embed("logits"),
             helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range_hostile")]
    return nodes, [table(), f32("start", np.float32("nan")), f32("limit", 4.0),
                   f32("delta", 1.0)]


def gather_float_index():
    nodes = [embed(), const("k", np.array([np.nan], np.float32)),
             helper.make_node("Gather", ["x", "k"], ["g"], name="gather_hostile", axis=2),
             helper.make_node("Add", ["x", "g"], ["logits"], name="add")]
    return nodes, [table()]


def comment_names():
    nodes = [helper.make_node("Gather", ["x/*y", "ids"], ["e/*1*/"], name="embed/*a*/"),
             helper.make_node("MatMul", ["e/*1*/", "h*/k/*"], ["logits"], name="*/head/*")]
    return nodes, [table("x/*y"), f32("h*/k/*", (np.arange(V * V) % 5 / 5.0).reshape(V, V))]


def chain_20k():
    nodes, ops, c = [embed("x0")], ("Add", "Mul", "Relu"), 20000
    for i in range(c):
        op, src = ops[i % 3], "x%d" % i
        dst = "x%d" % (i + 1) if i < c - 1 else "logits"
        nodes.append(helper.make_node(op, [src] if op == "Relu" else [src, "half"], [dst],
                                      name="n%d" % i))
    return nodes, [table(), f32("half", np.float32(0.5))]


CASES = {f.__name__: f for f in (slice_step_int64_max, concat_extent_wrap, split_sizes_wrap,
                                 split_even_wrap, range_nan, gather_float_index, comment_names,
                                 chain_20k)}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in CASES:
        sys.exit("usage: compiler_models.py {%s} OUT.onnx" % ",".join(CASES))
    save(sys.argv[2], *CASES[sys.argv[1]]())
