/* recognize.h — shared helpers of the recognisers (recognize_*.c), internal to passes/graph/.
 *
 * A recogniser matches an ONNX op pattern backwards from its last node, checks that the
 * intermediate values are not used outside the pattern (else the pattern's pieces must stay and
 * nothing is gained), builds the semantic node, and redirects the uses of the pattern's result.
 * The replaced nodes are left for dce to remove. Each recogniser records the ONNX nodes it
 * replaced as the new node's origin, for codegen's comments.
 */
#ifndef SBP_RECOGNIZE_H
#define SBP_RECOGNIZE_H

#include "passes.h"

/* The live producer of v if it has op `op`, else NULL. */
ir_node *rz_producer(const ir_value *v, ir_op op);
/* v is a constant (or a constant-filled value) whose elements all equal one number: *out. */
bool rz_const_scalar(const ir_value *v, double *out);
/* v is read by exactly `n` live node inputs and is not a graph output. */
bool rz_uses_exactly(const ir_uses *u, const ir_value *v, int n);
/* For a commutative binary node, the operand that is not `one` (NULL if neither is). */
ir_value *rz_other(const ir_node *bin, const ir_value *one);
/* Creates semantic node `op` with inputs in[0..n_in) that takes over `result` as its output
 * (keeping its name and uses), placed where result's producer was; the replaced nodes (and
 * result's old producer) are marked dead and become the new node's origin. The caller sets
 * attributes, then the type is inferred (sbp_pass_recognize re-infers after every recogniser;
 * call ir_infer_node for it at once). Returns the new node or NULL (diagnostic recorded). */
ir_node *rz_replace(ir_graph *g, ir_op op, ir_value *const *in, int n_in, ir_value *result,
                    ir_node *const *replaced, int n_replaced);

/* The recognisers, run in this order by sbp_pass_recognize (recognize.c). Each returns IR_OK or
 * IR_ERR and rewrites every occurrence it finds. */
int sbp_recognize_moe(ir_graph *g);         /* MoE (router, top-k, routed SwiGLU experts) */
int sbp_recognize_norms(ir_graph *g);       /* LayerNorm, RMSNorm (all forms) */
int sbp_recognize_activations(ir_graph *g); /* Gelu (tanh, erf), Silu, SwiGLU */
int sbp_recognize_rope(ir_graph *g);        /* Rope (rotate-half with cos/sin tables) */
int sbp_recognize_attention(ir_graph *g);   /* causal self-attention, GQA */
int sbp_recognize_linear(ir_graph *g);      /* Linear (MatMul/Gemm with a parameter + bias) */
int sbp_recognize_embedding(ir_graph *g);   /* Embedding (Gather on a parameter) */
int sbp_recognize_loss(ir_graph *g);        /* CrossEntropy from SoftmaxCrossEntropyLoss etc. */

#endif
