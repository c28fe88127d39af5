"""Whether an ONNX export keeps every parameter of the torch model as its own initializer.

sbpc trains initializers, so each torch parameter must be exactly one initializer: its values as
is, or transposed (an exporter may store a Linear's weight as W^T); parameters tied in torch
(one tensor under two names) share one. What an optimising exporter does instead, and what this
reports: a norm weight stored as 1 + w (Gemma; folded constants), two untied parameters of equal
values merged into one initializer, or a parameter whose values are nowhere (folded into
something else). Matching is by value, as tests/fixtures/hf/gen_hf.py's param_map does, with the
initializer of the parameter's own name preferred, so parameters of equal values (all-ones
norms) are told apart by name where the exporter kept the names.
"""
import numpy as np


def float_initializers(onnx_model):
    from onnx import numpy_helper
    out = {}
    for init in onnx_model.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.size > 1:
            out[init.name] = a
    return out


def _same(w, a):
    return (w.shape == a.shape and np.array_equal(w, a)) or \
        (w.ndim == 2 and w.T.shape == a.shape and np.array_equal(w.T, a))


def check_params(model, onnx_model):
    """Returns (problems, n): a list of one-line problems (empty when every parameter has an
    initializer of its own) and the number of distinct parameters."""
    inits = float_initializers(onnx_model)
    aliases = {}  # id(parameter) -> every name it has (tied parameters have several)
    tensors = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
        tensors[id(p)] = p.detach().float().cpu().numpy()
    params = [(names, tensors[k]) for k, names in aliases.items() if tensors[k].size > 1]
    owner = {}    # initializer name -> the parameter (first alias) it was given to
    assigned = {}
    # first the initializer of the parameter's own name, then any unused one of equal values
    for names, w in params:
        for n in names:
            if n in inits and n not in owner and _same(w, inits[n]):
                owner[n] = names[0]
                assigned[names[0]] = n
                break
    for names, w in params:
        if names[0] in assigned:
            continue
        for iname, a in inits.items():
            if iname not in owner and _same(w, a):
                owner[iname] = names[0]
                assigned[names[0]] = iname
                break
    problems = []
    for names, w in params:
        if names[0] in assigned:
            continue
        plus1 = [i for i, a in inits.items() if a.shape == w.shape and
                 np.array_equal(a, w + np.float32(1))]
        shared = [i for i, a in inits.items() if _same(w, a)]
        if plus1:
            problems.append("'%s' is stored as 1 + w (initializer '%s')" % (names[0], plus1[0]))
        elif shared:
            problems.append("'%s' shares initializer '%s' with '%s', which torch does not tie "
                            "to it (equal values merged)" % (names[0], shared[0], owner[shared[0]]))
        else:
            problems.append("'%s' %s is in no initializer" % (names[0], list(w.shape)))
    return problems, len(params)
