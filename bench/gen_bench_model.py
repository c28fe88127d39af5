#!/usr/bin/python3
"""Exports the benchmark model (bench_model.py) with symbolic batch/sequence dims, opset 17,
to bench/models/llama_bench.onnx (about 80 MB; not committed).

    /usr/bin/python3 bench/gen_bench_model.py
"""
import os

import bench_model

gf = bench_model.configure()
out = os.path.join(bench_model.HERE, "models")
os.makedirs(out, exist_ok=True)
model = bench_model.build()
gf.T = 64  # export trace length; dims are symbolic
path = os.path.join(out, "llama_bench.onnx")
gf.export(model, path, 17, dynamic=True)
print(path, os.path.getsize(path))
