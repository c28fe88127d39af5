/* passes.h — the graph -> graph half of passes/ (passes/graph/): the canonicalisation pipeline
 * and every pass's entry point, and the rewrites after it (packed, objective, freeze; --lora's
 * are in lora.h). Each pass is its own file, named after its stage of the flow (flow.h).
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
 *                are CONST (params.c).
 *   fold         produces: every node whose inputs are all constants replaced by a constant
 *                (Shape of a known shape too); Identity/Dropout(eval) removed.
 *   dce          produces: only nodes that reach a graph output remain; unused constants dropped.
 *   retie        detects a parameter equal (bitwise) to the transpose of another (the TorchScript
 *                exporter's folded tied LM head) and re-ties it (skipped with --no-retie).
 *   recognize    produces: semantic ops (Embedding, Linear, LayerNorm, RMSNorm, Gelu, Silu,
 *                SwiGLU, Rope, Attention, CrossEntropy) in place of their ONNX patterns;
 *                anything unrecognised keeps its ONNX semantics.
 *   cleanup      fold + dce again after recognition (cleanup.c).
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

/* cleanup.c: fold (capped at max_elems, as sbp_pass_fold_max) and dce again after
 * recognition, which leaves the replaced patterns' constant chains and nodes behind. */
int sbp_pass_cleanup(ir_graph *g, int64_t max_elems);

/* ---------------------------------------------------------------- after canonicalisation
 *
 * The graph rewrites that prepare a canonical graph for training (flow.h: lora, packed,
 * objective, freeze; --lora's are in lora.h). */

typedef enum {
    SBP_OBJECTIVE_SFT,        /* mean token cross-entropy over labels != -100 (appended) */
    SBP_OBJECTIVE_GRAPH_LOSS, /* the graph's own scalar loss */
    SBP_OBJECTIVE_DPO,        /* DPO over pairs (row i, row B/2 + i) (train/objective_pref.c) */
    SBP_OBJECTIVE_GRPO,       /* GRPO, clipped ratio + KL per token (train/objective_pref.c) */
} sbp_objective;

const char *sbp_objective_name(sbp_objective o); /* "sft" | "graph-loss" | "dpo" | "grpo" */
/* The objectives' default β (DPO 0.1, GRPO 0.04; 0 for the others). */
double sbp_objective_default_beta(sbp_objective o);

/* objective.c
 * requires: a canonical graph (sbp_canonicalize).
 * produces: exactly one graph output, a scalar float loss made by a CrossEntropy node; *chosen
 *           says whether it was appended (SFT) or already there (GRAPH_LOSS). Asking for
 *           GRAPH_LOSS on a graph without a loss is an error; asking for SFT on a graph that
 *           ends in a loss uses that loss. Other graph outputs are dropped (and dce'd).
 *           DPO and GRPO need the logits: they append the same CrossEntropy node (logits,
 *           labels), which then stands for the objective at the LM head and is lowered by
 *           train/objective_pref.c; a graph that already ends in a loss is an error. */
int sbp_pass_objective(ir_graph *g, sbp_objective requested, sbp_objective *chosen);

/* freeze.c: marks every used parameter whose ONNX name matches `regex` (POSIX extended,
 * unanchored, as grep -E) frozen. A re-tied copy matching freezes its owner too (they are one
 * tensor). Returns IR_ERR with a diagnostic for a bad regex, or when nothing is left to train;
 * *n_frozen (may be NULL) gets the count. */
int sbp_freeze_params(ir_graph *g, const char *regex, int *n_frozen);

/* Packed steps: the graph input through which a learned position embedding reads each token's
 * position in its document (made by sbp_pass_packed, bound to the doc_pos buffer). */
#define SBP_DOC_POSITIONS_INPUT "sbp_doc_positions"

/* packed.c
 * requires: a canonical graph with bound dims. For packed steps (sbpc --packed): every
 * Embedding that gathers a learned position table by constant positions 0..T-1 (GPT-2's wpe:
 * [1,T] or [T] indices) reads instead the new int32 graph input SBP_DOC_POSITIONS_INPUT [B,T],
 * each token's position within its document, and its output becomes [B,T,D]. RoPE needs no
 * rewrite (its positions are an operand of the kernel: tx_positions). *n_rewritten (may be
 * NULL) gets the count. */
int sbp_pass_packed(ir_graph *g, int *n_rewritten);

/* pipeline.c: the canonicalisation stages of the compile flow (flow.h has the whole list).
 * Runs them up to and including the pass named stop_after (NULL: all, through "cleanup").
 * IR_ERR when a pass fails or the verifier finds a broken invariant; an unknown stop_after (or
 * one past canonicalisation) is an error too. */
int sbp_canonicalize(ir_graph *g, const sbp_pass_options *opt, const char *stop_after);

#endif
