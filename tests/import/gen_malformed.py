#!/usr/bin/python3
"""Regenerate tests/import/corpus/: tiny ONNX models, most of them malformed on purpose.

    /usr/bin/python3 tests/import/gen_malformed.py

Needs Debian's python3-onnx (1.12) and numpy. Deterministic: rerunning gives the same bytes.
Each malformed model exercises one importer error path; tests/import/test_import.c pairs every
file with the diagnostic it must produce. The onnx helpers do not validate, so broken graphs are
built with them directly; models that protobuf itself would refuse are written as raw bytes.

Valid models (the importer must accept them):
  valid_symbolic.onnx    ids i64[batch,sequence] -> Gather/MatMul/Mul; Constant nodes; the
                         initializers are also listed as graph inputs (old exporters do that)
  valid_unordered.onnx   the same graph with its nodes in reverse order
  valid_typed.onnx       initializers stored in the typed fields (float_data, int32_data for
                         f16/bool/u8/i16, int64_data, double_data, uint64_data for u32)
  ext_valid.onnx + ext_valid.bin   external data: w1 f32[2,3] at offset 16, w2 i64[3] at
                         offset 40 (numbers: EXT_W1, EXT_W2 below, mirrored in test_import.c)
Files that the test builds at run time instead: a nonexistent path, and a symlink (ext_symlink.onnx
refers to 'link.bin', which the test points outside a scratch model directory).
"""
import os
import random
import struct

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")

EXT_PAD = b"SBPC-EXT-PADDING"                                 # 16 bytes before w1
EXT_W1 = (np.arange(6, dtype=np.float32) / 4 - 0.5).reshape(2, 3)  # offset 16, 24 bytes
EXT_W2 = np.array([7, -1, 1 << 40], dtype=np.int64)             # offset 40, 24 bytes


def opset(v=17):
    return [helper.make_opsetid("", v)]


def model(graph, ops=None, **kw):
    m = helper.make_model(graph, opset_imports=ops if ops is not None else opset(), **kw)
    m.ir_version = 8
    m.producer_name = "sbpc-gen-malformed"
    return m


def write(name, m):
    data = m if isinstance(m, (bytes, bytearray)) else m.SerializeToString()
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def vi(name, dt, shape):
    return helper.make_tensor_value_info(name, dt, shape)


def f32(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)


def tiny_graph(nodes, inits=(), inputs=None, outputs=None, name="g"):
    """x f32[2,3] -> nodes -> y f32[2,3]"""
    inputs = inputs if inputs is not None else [vi("x", TensorProto.FLOAT, [2, 3])]
    outputs = outputs if outputs is not None else [vi("y", TensorProto.FLOAT, [2, 3])]
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))


def relu_graph():
    return tiny_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")])


def raw_tensor(name, dt, dims, raw):
    t = TensorProto()
    t.name = name
    t.data_type = dt
    t.dims.extend(dims)
    t.raw_data = raw
    return t


def ext_tensor(name, dt, dims, location, offset=None, length=None):
    t = TensorProto()
    t.name = name
    t.data_type = dt
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = t.external_data.add()
            e.key = k
            e.value = str(v)
    return t


def ext_model(tensor):
    """y = x @ w1 with w1 given by `tensor` (external)."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["y"], name="mm")], "ext",
                          [vi("x", TensorProto.FLOAT, ["batch", 2])],
                          [vi("y", TensorProto.FLOAT, ["batch", 3])], initializer=[tensor])
    return model(g)


def pb_varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field(num, payload):
    return pb_varint((num << 3) | 2) + pb_varint(len(payload)) + payload


def symbolic_graph(reverse=False):
    V, D = 16, 8
    rng = np.random.RandomState(7)
    wte = f32("wte", rng.randn(V, D) * 0.1)
    w = f32("W", rng.randn(D, V) * 0.1)
    nodes = [
        helper.make_node("Gather", ["wte", "ids"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "W"], ["logits"], name="head"),
        helper.make_node("Constant", [], ["two"], name="c_two", value_float=2.0),
        helper.make_node("Constant", [], ["axes"], name="c_axes", value_ints=[0, 1]),
        helper.make_node("Mul", ["logits", "two"], ["out"], name="scale"),
    ]
    if reverse:
        nodes.reverse()
    g = helper.make_graph(
        nodes, "tiny_lm",
        [vi("ids", TensorProto.INT64, ["batch", "sequence"]),
         vi("wte", TensorProto.FLOAT, [V, D]), vi("W", TensorProto.FLOAT, [D, V])],
        [vi("out", TensorProto.FLOAT, ["batch", "sequence", V])],
        initializer=[wte, w],
        value_info=[vi("h", TensorProto.FLOAT, ["batch", "sequence", D])])
    return model(g)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.unlink(os.path.join(OUT, f))

    # ------------------------------------------------------------ valid models
    valid = symbolic_graph()
    write("valid_symbolic.onnx", valid)
    write("valid_unordered.onnx", symbolic_graph(reverse=True))

    typed = [
        helper.make_tensor("t_f32", TensorProto.FLOAT, [3], [1.5, -2.0, 0.25]),
        # f16 bit patterns in int32_data: 1.0 = 0x3c00, -2.0 = 0xc000
        helper.make_tensor("t_f16", TensorProto.FLOAT16, [2], [1.0, -2.0]),
        helper.make_tensor("t_bool", TensorProto.BOOL, [3], [True, False, True]),
        helper.make_tensor("t_u8", TensorProto.UINT8, [2], [255, 7]),
        helper.make_tensor("t_i16", TensorProto.INT16, [2], [-300, 300]),
        helper.make_tensor("t_i64", TensorProto.INT64, [2], [-5, 1 << 40]),
        helper.make_tensor("t_f64", TensorProto.DOUBLE, [2], [0.125, -1e300]),
        helper.make_tensor("t_u32", TensorProto.UINT32, [2], [4000000000, 1]),
        helper.make_tensor("t_empty", TensorProto.FLOAT, [0, 4], []),
    ]
    write("valid_typed.onnx", model(tiny_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], inits=typed)))

    with open(os.path.join(OUT, "ext_valid.bin"), "wb") as f:
        f.write(EXT_PAD + EXT_W1.tobytes() + EXT_W2.tobytes())
    ok = ext_model(ext_tensor("w1", TensorProto.FLOAT, [2, 3], "ext_valid.bin", 16, 24))
    ok.graph.initializer.append(ext_tensor("w2", TensorProto.INT64, [3], "ext_valid.bin", 40, 24))
    write("ext_valid.onnx", ok)

    # ------------------------------------------------------------ not a model
    write("empty.onnx", b"")
    full = valid.SerializeToString()
    write("truncated.onnx", full[: len(full) // 2])
    rnd = random.Random(1234)
    # Wire type 7 does not exist: the first byte alone makes the rest undecodable.
    write("random.onnx", bytes([0x0F]) + bytes(rnd.randrange(256) for _ in range(255)))
    # 200 nested TypeProto.sequence_type levels inside a graph input: protobuf-c would recurse
    # once per level; the importer refuses before decoding.
    tp = pb_field(1, b"")                              # TypeProto{tensor_type{}}
    for _ in range(200):
        tp = pb_field(4, pb_field(1, tp))              # TypeProto{sequence_type{elem_type}}
    write("deep_nesting.onnx", pb_field(7, pb_field(11, pb_field(1, b"x") + pb_field(2, tp))))

    # ------------------------------------------------------------ model structure
    write("no_graph.onnx", onnx.ModelProto(ir_version=8, opset_import=opset()))
    write("no_outputs.onnx", model(tiny_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], outputs=[])))
    write("opset99.onnx", model(relu_graph(), ops=opset(99)))
    write("missing_opset.onnx", model(relu_graph(),
                                      ops=[helper.make_opsetid("com.microsoft", 1)]))
    # two unknown default-domain ops, one of them twice, and one of an unknown domain
    g = tiny_graph([
        helper.make_node("FancyOp", ["x"], ["a"], name="fancy1"),
        helper.make_node("FancyOp", ["a"], ["b"], name="fancy2"),
        helper.make_node("Relu", ["b"], ["c"], name="relu"),
        helper.make_node("WeirdOp", ["c"], ["d"], name="weird", domain="com.example"),
        helper.make_node("FrobOp", ["d"], ["y"], name="frob"),
    ])
    write("unknown_ops.onnx", model(g, ops=opset() + [helper.make_opsetid("com.example", 1)]))
    write("arity.onnx", model(tiny_graph(
        [helper.make_node("Add", ["x", "x", "x"], ["y"], name="add3")])))
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                               [vi("t", TensorProto.FLOAT, [2, 3])])
    write("subgraph.onnx", model(tiny_graph([
        helper.make_node("Constant", [], ["cond"], name="c",
                         value=helper.make_tensor("cv", TensorProto.BOOL, [], [True])),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g,
                         else_branch=then_g)])))
    write("undefined_input.onnx", model(tiny_graph(
        [helper.make_node("Add", ["x", "nope"], ["y"], name="add")])))
    write("cycle.onnx", model(tiny_graph([
        helper.make_node("Add", ["x", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Identity", ["a"], ["y"], name="id")])))
    write("duplicate_output.onnx", model(tiny_graph([
        helper.make_node("Relu", ["x"], ["y"], name="first"),
        helper.make_node("Neg", ["x"], ["y"], name="second")])))
    write("const_string.onnx", model(tiny_graph([
        helper.make_node("Constant", [], ["s"], name="cs", value_string="hello"),
        helper.make_node("Relu", ["x"], ["y"], name="relu")])))

    # ------------------------------------------------------------ shapes and types
    write("negative_dim.onnx", model(tiny_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        inputs=[vi("x", TensorProto.FLOAT, [2, -3])])))
    write("rank_too_big.onnx", model(tiny_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        inputs=[vi("x", TensorProto.FLOAT, [1] * 9)])))

    def init_model(t):
        return model(tiny_graph([helper.make_node("Add", ["x", t.name], ["y"], name="add")],
                                inits=[t]))

    write("negative_dim_init.onnx", init_model(raw_tensor("w", TensorProto.FLOAT, [-1, 3], b"")))
    # 2^40 * 2^40 elements: 2^80 (times 4 bytes), with no data behind it
    write("overflow_dims.onnx", init_model(raw_tensor("w", TensorProto.FLOAT,
                                                      [1 << 40, 1 << 40], b"")))
    write("huge_tensor.onnx", init_model(raw_tensor("w", TensorProto.FLOAT, [1 << 40], b"")))
    write("huge_dim.onnx", init_model(raw_tensor("w", TensorProto.FLOAT, [1 << 41], b"")))
    write("zero_dim_data.onnx", init_model(raw_tensor("w", TensorProto.FLOAT, [0, 4],
                                                      b"\0" * 16)))
    write("init_short.onnx", init_model(raw_tensor("w", TensorProto.FLOAT, [2, 3], b"\0" * 20)))
    write("init_long.onnx", init_model(raw_tensor("w", TensorProto.FLOAT, [2, 3], b"\0" * 28)))
    short_typed = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3],
                              float_data=[1, 2, 3, 4, 5])
    write("init_short_typed.onnx", init_model(short_typed))
    write("init_no_data.onnx", init_model(TensorProto(name="w", data_type=TensorProto.FLOAT,
                                                      dims=[2, 3])))
    write("string_tensor.onnx", init_model(helper.make_tensor("w", TensorProto.STRING, [2],
                                                              [b"a", b"b"])))
    write("bad_dtype.onnx", init_model(raw_tensor("w", 99, [2, 3], b"\0" * 24)))
    dup = init_model(raw_tensor("w", TensorProto.FLOAT, [2, 3], b"\0" * 24))
    dup.graph.initializer.append(raw_tensor("w", TensorProto.FLOAT, [2, 3], b"\0" * 24))
    write("duplicate_init.onnx", dup)

    # ------------------------------------------------------------ external data
    F = TensorProto.FLOAT
    write("ext_absolute.onnx", ext_model(ext_tensor("w1", F, [2, 3], "/etc/passwd", 0, 24)))
    write("ext_dotdot.onnx", ext_model(ext_tensor("w1", F, [2, 3], "../corpus/ext_valid.bin",
                                                  16, 24)))
    write("ext_dotdot_inner.onnx", ext_model(ext_tensor("w1", F, [2, 3],
                                                        "sub/../../ext_valid.bin", 16, 24)))
    write("ext_symlink.onnx", ext_model(ext_tensor("w1", F, [2, 3], "link.bin", 0, 24)))
    write("ext_missing.onnx", ext_model(ext_tensor("w1", F, [2, 3], "does_not_exist.bin",
                                                   0, 24)))
    write("ext_offset_range.onnx", ext_model(ext_tensor("w1", F, [2, 3], "ext_valid.bin",
                                                        100000, 24)))
    write("ext_length_range.onnx", ext_model(ext_tensor("w1", F, [2, 3], "ext_valid.bin",
                                                        40, 100000)))
    write("ext_length_mismatch.onnx", ext_model(ext_tensor("w1", F, [2, 3], "ext_valid.bin",
                                                           16, 8)))
    write("ext_bad_offset.onnx", ext_model(ext_tensor("w1", F, [2, 3], "ext_valid.bin",
                                                      "-16", 24)))
    write("ext_no_location.onnx", ext_model(ext_tensor("w1", F, [2, 3], None, 16, 24)))


if __name__ == "__main__":
    main()
