#!/usr/bin/python3
"""Export Llama-style models of 8, 16, 32 and 64 layers (the fixture family, symbolic dims,
opset 17) into bench/models/ for bench_import. Needs Debian's python3-torch and python3-onnx.

    /usr/bin/python3 bench/gen_deep_models.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures"))
import gen_fixtures as gf  # noqa: E402

out = os.path.join(HERE, "models")
os.makedirs(out, exist_ok=True)
for layers in (8, 16, 32, 64):
    gf.N_LAYER = layers  # the model classes read it at construction
    model = gf.build("llama", gf.SEED)
    path = os.path.join(out, f"llama_{layers}L.onnx")
    gf.export(model, path, 17, dynamic=True)
    print(path, os.path.getsize(path))
