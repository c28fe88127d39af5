"""sbp_tools: the Python front end of sbpc.

sbp-export (sbp_tools.export) turns a transformers model folder into the ONNX file sbpc compiles,
with export settings that keep every weight its own; sbp-prepare (sbp_tools.prepare) turns JSONL
rows into the dataset file that sbp-train reads (docs/dataset-format.md).
"""
__version__ = "0.1.0"
