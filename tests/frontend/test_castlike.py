#!/usr/bin/env python3
"""sbpc's importer lowers CastLike(x, like) to Cast(x, to = like's element type).

    test_castlike.py SBPC OUTDIR

Small graphs written with onnx.helper, imported with `sbpc --dump-ir=import`: like's type comes
from a node inferred before it (Shape: i64), an initializer (i32) and a graph input (bool); the
dump must show a one-input Cast with that `to` and no CastLike. A CastLike with three inputs,
or with a `to` attribute of its own, is refused with one error naming the node. (The dynamo
exporter's unoptimised Qwen3 export, which holds ten CastLike nodes, is compiled in
test_export.py.)
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checks, error_lines, need, run  # noqa: E402

need("onnx", "numpy")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper  # noqa: E402

SBPC, OUT = sys.argv[1:3]
os.makedirs(OUT, exist_ok=True)
C = Checks()


def model(name, nodes, inputs, inits=()):
    x = h.make_tensor_value_info("x", TP.FLOAT, [2, 3])
    y = h.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    tail = h.make_node("Cast", ["c"], ["d"], to=TP.FLOAT, name="back")
    add = h.make_node("Add", ["d", "x"], ["y"], name="add")
    g = h.make_graph(list(nodes) + [tail, add], name, [x] + list(inputs), [y],
                     initializer=list(inits))
    path = os.path.join(OUT, name + ".onnx")
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 20)]), path)
    return path


cases = [
    ("like_node", [h.make_node("Shape", ["x"], ["s"], name="shape"),
                   h.make_node("CastLike", ["x", "s"], ["c"], name="cl")], [], [], 7, "i64"),
    ("like_init", [h.make_node("CastLike", ["x", "k"], ["c"], name="cl")], [],
     [numpy_helper.from_array(np.array([1], np.int32), "k")], 6, "i32"),
    ("like_input", [h.make_node("CastLike", ["x", "b"], ["c"], name="cl")],
     [h.make_tensor_value_info("b", TP.BOOL, [1])], [], 9, "bool"),
]
for name, nodes, inputs, inits, to, dt in cases:
    path = model(name, nodes, inputs, inits)
    rc, so, se = run([SBPC, path, "--dump-ir=import"])
    C.ok(rc == 0, "%s: sbpc exit 0, got %d: %s" % (name, rc, se))
    C.ok(re.search(r"%%c = Cast\(%%x\) \{to=%d\} : %s\[2,3\]  # cl" % (to, re.escape(dt)), so)
         is not None, "%s: a one-input Cast to %s in the dump:\n%s" % (name, dt, so))
    C.ok("CastLike" not in so, "%s: no CastLike left in the IR" % name)

path = model("three_inputs", [h.make_node("CastLike", ["x", "x", "x"], ["c"], name="cl3")], [])
rc, so, se = run([SBPC, path, "--dump-ir=import"])
C.ok(rc == 1 and len(error_lines(se)) == 1 and
     "node 'cl3' (CastLike): error: has 3 inputs; CastLike takes 2" in se,
     "three inputs: refused, got %d %r" % (rc, se))
path = model("with_to", [h.make_node("CastLike", ["x", "x"], ["c"], name="clto", to=TP.INT64)],
             [])
rc, so, se = run([SBPC, path, "--dump-ir=import"])
C.ok(rc == 1 and len(error_lines(se)) == 1 and "node 'clto' (CastLike): error: CastLike has no "
     "'to' attribute" in se, "a 'to' attribute: refused, got %d %r" % (rc, se))
C.done()
