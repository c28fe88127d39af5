/* intree_fixtures.h — the fixture models committed under tests/fixtures/ (gen_fixtures.py makes
 * them; tests/fixtures/README.md describes them). They are part of the source tree, so a test
 * that walks that folder must find every one of them: a missing or unreadable one is a FAILURE,
 * never a skip. A model added to the folder is picked up by the walk; list it here too so that
 * losing it later fails. */
#ifndef SBP_INTREE_FIXTURES_H
#define SBP_INTREE_FIXTURES_H

static const char *const sbp_intree_fixtures[] = {
    "gpt2_op14_dyn.onnx",   "gpt2_op14_static.onnx", "gpt2_op17_dyn.onnx",
    "gpt2_op17_dyn_nofold.onnx", "gpt2_op17_static.onnx", "llama_op17_dyn.onnx",
    "llama_op17_loss.onnx", "llama_op17_static.onnx", "qwen3_op17_dyn.onnx",
    "qwen3_op17_static.onnx",
};
enum { SBP_N_INTREE_FIXTURES = sizeof sbp_intree_fixtures / sizeof sbp_intree_fixtures[0] };

#endif
