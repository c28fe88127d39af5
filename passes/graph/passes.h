/* passes.h — the canonicalisation pipeline and every pass's entry point.
 *
 * Each pass takes the graph, rewrites it in place, records diagnostics in g->diag and returns
 * IR_OK or IR_ERR. The driver (passes/pipeline.c, the flow of flow.h) runs them in the order
 * below with the verifier between them, and can stop after a named pass for --dump-ir=PASS.
 *
 * Pass order and contracts:
 *   import       (not a pass: ir_import_onnx)  raw ONNX ops, symbolic dims as written
 *   bind-dims    requires: --batch/--seq-len in g->bind_batch/bind_seq (0: leave symbolic).
 *                produces: symbols bound everywhere, shapes re-inferred; a static dim that
 *                disagrees with a binding is an error.
 *   params       produces: only trainable weights are PARAM; buffers (by the dynamo exporter's
 *                graph signature), scalars and initializers that never meet the token data
 *                are CONST (passes/params.c).
 *   fold         produces: every node whose inputs are all constants replaced by a constant
 *                (Shape of a known shape too); Identity/Dropout(eval) removed.
 *   dce          produces: only nodes that reach a graph output remain; unused constants dropped.
 *   retie        detects a parameter equal (bitwise) to the transpose of another (the TorchScript
 *                exporter's folded tied LM head) and re-ties it (skipped with --no-retie).
 *   recognize    produces: semantic ops (Embedding, Linear, LayerNorm, RMSNorm, Gelu, Silu,
 *                SwiGLU, Rope, Attention, CrossEntropy) in place of their ONNX patterns;
 *                anything unrecognised keeps its ONNX semantics.
 *   cleanup      fold + dce again after recognition.
 */
#ifndef SBP_PASSES_H
#define SBP_PASSES_H

#include "ir.h"

typedef struct sbp_pass_options {
    int64_t batch;   /* --batch N, 0 if not given */
    int64_t seq_len; /* --seq-len N, 0 if not given */
    bool no_retie;   /* --no-retie */
    bool verify;     /* run ir_verify after every pass (always on in tests and debug) */
    int64_t fold_max_elems; /* 0: the default, 16 Mi or 1024 per token (B*T) if larger */
    int64_t compile_mem_limit; /* bytes the compilation may use (sbp_compile_mem_limit); 0:
                                * this machine's physical memory */
} sbp_pass_options;

/* bind_dims.c */
int sbp_pass_bind_dims(ir_graph *g, int64_t batch, int64_t seq_len);
/* Refuses, before fold allocates anything, a binding whose compilation cannot fit in
 * mem_limit bytes (0: this machine's physical memory): the constants fold would build at this
 * batch and sequence length (every output of a node fed only by constants, up to fold_cap
 * elements) plus the step's parameters, gradients and token inputs. The error gives the total
 * and its parts, so a huge --seq-len is refused in microseconds, not after gigabytes. */
int sbp_check_compile_size(ir_graph *g, int64_t fold_cap, int64_t mem_limit);
/* The bytes a compilation may use: `given` (sbp_pass_options.compile_mem_limit, sbpc's
 * SBPC_MAX_COMPILE_BYTES) when smaller than this machine's physical memory, else that memory. */
int64_t sbp_compile_mem_limit(int64_t given);
/* params.c */
int sbp_pass_params(ir_graph *g);
/* fold.c */
int sbp_pass_fold(ir_graph *g);
/* The same with a cap on the elements of one folded result (0: the default, 16 Mi); bigger
 * results stay as nodes. The pipeline passes sbp_pass_options.fold_max_elems. */
int sbp_pass_fold_max(ir_graph *g, int64_t max_elems);
/* The same, and a folded result that would grow the compilation's arena past mem_limit bytes
 * (0: no limit) is an error naming the node, before it is allocated. */
int sbp_pass_fold_limited(ir_graph *g, int64_t max_elems, int64_t mem_limit);
/* Evaluates one node whose inputs are all constants into constant outputs (used by fold).
 * Returns IR_OK and sets *folded when it could, IR_OK with *folded = false when the op is not
 * evaluable here (left as is), IR_ERR on an invalid node. */
int sbp_eval_node(ir_graph *g, ir_node *n, bool *folded);
/* dce.c */
int sbp_pass_dce(ir_graph *g);
/* retie.c */
int sbp_pass_retie(ir_graph *g);
/* recognize_*.c: each recogniser is its own file; recognize.c runs them in order. */
int sbp_pass_recognize(ir_graph *g);

/* pipeline.c: the canonicalisation stages of the compile flow (flow.h has the whole list).
 * Runs them up to and including the pass named stop_after (NULL: all, through "cleanup").
 * IR_ERR when a pass fails or the verifier finds a broken invariant; an unknown stop_after (or
 * one past canonicalisation) is an error too. */
int sbp_canonicalize(ir_graph *g, const sbp_pass_options *opt, const char *stop_after);

#endif
