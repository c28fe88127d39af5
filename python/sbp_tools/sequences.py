"""Rewrites the dynamo exporter's sequence ops into tensor ops, in an unoptimised export.

torch.split / chunk become SplitToSequence followed by SequenceAt with constant indices (GPT-2's
fused qkv projection). The exporter's optimiser would rewrite them into one Split, but sbp-export
runs without the optimiser (it folds and merges weights), and sbpc has no sequence type. Here
a SplitToSequence whose split sizes are constant, and whose every consumer is a SequenceAt with
a constant index, becomes a Split with one output per piece, each SequenceAt an Identity of its
piece. Anything else is left as it is (sbpc then names the operator it does not support).
"""
import numpy as np


def _constants(m):
    """name -> numpy value, for initializers and Constant nodes' outputs."""
    from onnx import numpy_helper
    out = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _static_dims(m):
    dims = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                             for d in t.shape.dim]
    return dims


def split_sequences(m):
    """Rewrites m in place; returns how many SplitToSequence nodes were replaced."""
    from onnx import helper, numpy_helper
    consts = _constants(m)
    dims = _static_dims(m)
    users = {}
    for n in m.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    replaced = 0
    for n in list(m.graph.node):
        if n.op_type != "SplitToSequence" or len(n.input) < 2 or n.input[1] not in consts:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        axis = int(attrs.get("axis", 0))
        split = np.asarray(consts[n.input[1]]).astype(np.int64)
        shape = dims.get(n.input[0])
        if split.ndim == 0:
            if not shape or axis >= len(shape) or axis < -len(shape) or shape[axis] is None:
                continue
            total, s = int(shape[axis]), int(split)
            if s <= 0:
                continue
            sizes = [s] * (total // s) + ([total % s] if total % s else [])
        elif split.ndim == 1:
            sizes = [int(x) for x in split]
        else:
            continue
        uses = users.get(n.output[0], [])
        idx = []
        for u in uses:
            if u.op_type != "SequenceAt" or u.input[1] not in consts:
                break
            i = int(np.asarray(consts[u.input[1]]).reshape(-1)[0])
            if not -len(sizes) <= i < len(sizes):
                break
            idx.append(i % len(sizes))
        if len(idx) != len(uses) or not uses:
            continue
        pieces = ["%s_piece_%d" % (n.output[0], k) for k in range(len(sizes))]
        sizes_name = "%s_sizes" % n.output[0]
        m.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64),
                                                           sizes_name))
        split_node = helper.make_node("Split", [n.input[0], sizes_name], pieces, axis=axis,
                                      name=n.name)
        # before the insert: the graph holds a copy of the node it is given
        for p in n.metadata_props:
            split_node.metadata_props.add(key=p.key, value=p.value)
        at = list(m.graph.node).index(n)
        m.graph.node.remove(n)
        m.graph.node.insert(at, split_node)
        for u, i in zip(uses, idx):
            ident = helper.make_node("Identity", [pieces[i]], list(u.output), name=u.name)
            for p in u.metadata_props:
                ident.metadata_props.add(key=p.key, value=p.value)
            at = list(m.graph.node).index(u)
            m.graph.node.remove(u)
            m.graph.node.insert(at, ident)
        replaced += 1
    # the sequence-typed value_info of the replaced outputs would no longer match anything
    live = {o for nd in m.graph.node for o in nd.output}
    keep = [vi for vi in m.graph.value_info if vi.name in live or
            not vi.type.HasField("sequence_type")]
    del m.graph.value_info[:]
    m.graph.value_info.extend(keep)
    return replaced
