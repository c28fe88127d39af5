/* torch.h — what sbpc knows of PyTorch's conventions, for the code that speaks to PyTorch users:
 * the PyTorch name of an initializer as recovered from an export (sbp-train --save-safetensors,
 * train/train_export.c; sbpc --lora, passes/graph/lora.c), and the LoRA adapters' names and
 * initialisation (PEFT's layout; sbpc --lora and sbp-train, which must agree bit for bit).
 *
 * Names. An initializer's name is PyTorch's when the export says so: the dynamo exporter's
 * graph signature lists every `PARAMETER target='NAME'`; an export without one (TorchScript)
 * names every initializer but the exporter's own `onnx::*` and `val_N` by PyTorch's name. The
 * others are recovered from the module scope of the Linear that reads them: the dynamo
 * exporter's node metadata (ir_node.scope), else a TorchScript node name `/a/b.0/c/MatMul`
 * ("a.b.0.c"), else, for a node made by canonicalisation (a Linear in place of MatMul +
 * Transpose + Add), the scope or the TorchScript name of the ONNX nodes it stands for
 * (ir_node.origin). A wrapper module's prefix on TorchScript scopes is learned from the
 * parameters whose names are known (ir_torch_learn_prefix). train/train_export.c's header has
 * the whole procedure, with the graph signature as a last resort.
 *
 * All strings returned here are malloc'd (the caller frees them): they are used by tools that
 * keep them past the graph's arena as well as by passes.
 */
#ifndef SBP_IR_TORCH_H
#define SBP_IR_TORCH_H

#include "ir.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Is `name` PyTorch's own name for the initializer (see above)? */
bool ir_torch_is_name(const ir_graph *g, const char *name);

/* Calls f(name, len, ctx) for each PARAMETER of the dynamo graph signature sig (NULL: none). */
void ir_torch_signature_params(const char *sig, void (*f)(const char *, size_t, void *),
                               void *ctx);

/* The module path node n was exported from, from its TorchScript-style name (`/a/b.0/c/Op` ->
 * "a.b.0.c") or, for a node without one, from the names of the ONNX nodes it stands for (a
 * MatMul or Gemm among them first). NULL when none says. n->scope is not read here: the
 * dynamo scope is relative to the exported module already, a TorchScript one may carry a
 * wrapper's prefix (ir_torch_node_module handles both). */
char *ir_torch_node_scope(const ir_node *n);

/* Warns (into d) about each parameter read by copies of one module that differ only in an index
 * ("model.layers.0.input_layernorm" and "model.layers.1.input_layernorm"): one initializer the
 * exporter may have merged from equal-valued weights (torch.onnx's default optimisation does),
 * which would then train as one. Returns how many such parameters there are. */
int ir_torch_warn_merged(const ir_graph *g, const ir_uses *u, ir_diag *d);

/* What the consumer (node n, input slot) says of v: the attribute it is ("weight", "bias")
 * and whether its stored layout is PyTorch's transposed. False when the op says nothing (only
 * a Linear's MatMul, Gemm or canonical Linear does). */
bool ir_torch_consumer_role(const ir_node *n, int slot, const ir_value *v, const char **leaf,
                            bool *transposed);

/* The prefix a wrapper module put on every TorchScript scope ("m." for `/m/model/...` with
 * parameters named `model....`), learned from values vals[i] whose PyTorch name names[i] is
 * known (either may be NULL: skipped); "" when none is seen; NULL when out of memory. */
char *ir_torch_learn_prefix(const ir_graph *g, const ir_uses *u, int n,
                            const ir_value *const *vals, const char *const *names);

/* What is known of one parameter's PyTorch name. */
typedef struct ir_torch_name {
    char *name;       /* PyTorch name (malloc'd), or NULL while unknown */
    bool transposed;  /* the ONNX layout is PyTorch's transposed */
    bool recovered;   /* not the initializer's own name */
    const char *via;  /* the node (or "the graph signature") it was recovered from */
    int tr_hint;      /* from the consumer op: 1 transposed, 0 not, -1 unknown */
} ir_torch_name;

/* The name of v from its consumers' scopes (prefix: ir_torch_learn_prefix's). 0 with pn->name
 * set, or left NULL when nothing says; -1 with a message in err when two consumers disagree
 * (pn->name and pn->via then describe the first). */
int ir_torch_name_from_scopes(const ir_graph *g, const ir_uses *u, const ir_value *v,
                              const char *prefix, ir_torch_name *pn, char *err, size_t errlen);

/* ------------------------------------------------------------------ LoRA adapters (PEFT) */

/* Adapter names: `<module path>.lora_A.weight` [rank, in] and `<module path>.lora_B.weight`
 * [out, rank], PEFT's keys and layouts. */
#define IR_LORA_A_SUFFIX ".lora_A.weight"
#define IR_LORA_B_SUFFIX ".lora_B.weight"

/* 'A', 'B' for an adapter's name, 0 for any other. */
int ir_lora_kind(const char *name);

/* The initial values of adapter `name` ([rows, cols] floats into out): B (kind 'B') is zeros;
 * A is PEFT's kaiming_uniform_(a = sqrt(5)), U(-1/sqrt(cols), 1/sqrt(cols)) with cols the
 * layer's in-features, drawn from this generator (not torch's RNG):
 *   state = seed XOR FNV-1a-64(name bytes)      (so each adapter's values depend only on its
 *                                                name and the seed, not on the others)
 *   per element, in row-major order, SplitMix64:
 *     state += 0x9E3779B97F4A7C15; z = state;
 *     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
 *     z ^= z >> 31;
 *     u = (z >> 40) * 2^-24                     (24 bits, in [0, 1))
 *     a = (float)((2u - 1) / sqrt(cols))        (computed in double, rounded once)
 * tests/fixtures/lora/gen_lora.py has the same generator in Python. */
void ir_lora_init(const char *name, uint64_t seed, int64_t rows, int64_t cols, float *out);

#endif
