"""The benchmark model: Llama-style, d=256, 4 layers, 8 heads, 4 KV heads,
d_ff 688, V=32000 — the fixture family of tests/fixtures/gen_fixtures.py at benchmark size.

Imported by gen_bench_model.py (ONNX export for sbpc) and torch_baseline.py (PyTorch side),
so both sides run the same model code and the same weights.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures"))
import gen_fixtures as gf  # noqa: E402

MAX_POSITIONS = 65536


def configure():
    """Sets the fixture generator's module-level dims to the benchmark's (its classes read them
    at construction)."""
    gf.D_MODEL = 256
    gf.N_LAYER = 4
    gf.VOCAB = 32000
    gf.N_HEAD = 8
    gf.N_KV_HEAD = 4
    gf.HEAD_DIM = 256 // 8
    gf.LLAMA_FF = 688
    gf.N_POSITIONS = MAX_POSITIONS
    # The rotary cache length is a default argument, bound when the class was defined.
    gf.LlamaRotaryEmbedding.__init__.__defaults__ = (MAX_POSITIONS, 10000)
    return gf


def build():
    gf_ = configure()
    return gf_.build("llama", gf_.SEED)
