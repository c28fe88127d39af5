"""make-example-model.py TOKDIR OUT — a model folder as a user has one, small enough for the tests:
a randomly initialised Qwen3 (2 layers, hidden 32, 256 positions, seed 0) with the tokenizer of
TOKDIR, saved by save_pretrained. The README's walkthrough (scripts/walkthrough.sh) and the docs'
recipes (scripts/run-doc-recipes.py) both start from it. Needs torch and transformers (.venv-hf).
"""
import sys

import torch
import transformers as tf


def main(tok_dir, out):
    tok = tf.AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(0)
    cfg = tf.Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=64, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    tf.Qwen3ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    print("model folder:", out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: make-example-model.py TOKDIR OUT")
    main(*sys.argv[1:])
