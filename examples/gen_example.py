#!/usr/bin/python3
"""Regenerates examples/tiny_llama.onnx: the bundled example model the README's first command
compiles and trains — the Llama-style fixture family (RMSNorm, SwiGLU, RoPE, grouped-query
attention) with a byte vocabulary (V=256), d_model 32, 2 layers, 4 query heads, 2 KV heads,
d_ff 86, up to 256 positions, symbolic batch/sequence dims, opset 17, random init (std 0.02).

    /usr/bin/python3 examples/gen_example.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures"))
import gen_fixtures as gf  # noqa: E402

gf.D_MODEL, gf.N_LAYER, gf.VOCAB = 32, 2, 256
gf.N_HEAD, gf.N_KV_HEAD, gf.HEAD_DIM, gf.LLAMA_FF = 4, 2, 8, 86
gf.N_POSITIONS = 256
gf.LlamaRotaryEmbedding.__init__.__defaults__ = (256, 10000)
model = gf.build("llama", gf.SEED)
path = os.path.join(HERE, "tiny_llama.onnx")
gf.export(model, path, 17, dynamic=True)
print(path, os.path.getsize(path))
