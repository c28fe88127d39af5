/* train_internal.h — what the files of the training half of passes/ share; internal to
 * passes/train/.
 *
 * Layers, bottom up (a file calls only into its own layer's files below it or into lower
 * layers; scripts/check-passes-layers.py checks the objects' call graph has no circle):
 *   toolkit    train_tx.c (containers, buffers, emission, operands, layout planners),
 *              train_verify.c, precision.c, plan.c, sequence.c, offload.c
 *   rules      objective_pref.c (DPO / GRPO at the LM head), grad_rules.c (the gradient rules)
 *   lowering   autodiff.c (the autodiff analysis, per-node lowering, store / checkpoint)
 *   strategy   stream.c (StreamBP's chunk loops)
 *   driver     train_build.c (sbp_train_build: the stages in order, the memory budget)
 *   listing    train_print.c
 *
 * Layouts. The runtime's attention reads q/k/v as [B,T,H,hd], while the exporters' graphs carry
 * them as [B,H,T,hd] made by a Transpose(perm 0,2,1,3) of the projection's [B,T,H,hd] view. A
 * value may therefore be stored "swapped" (TL_SWAP: rank 4, axes 1 and 2 exchanged in memory).
 * A Transpose(0,2,1,3) of a stored value is then only a change of layout (a view), row-wise ops
 * (norms, linears, activations, RoPE, same-shape elementwise, and elementwise with an operand
 * that is constant along axes 1 and 2, such as a per-head norm's [hd] scale) work in either
 * layout, and an op that needs the other layout gets a "relayout" copy of that input (a
 * node-owned buffer, with its gradient permuted back after the node's backward).
 *
 * Views. Reshape, Flatten, Squeeze, Unsqueeze, Identity, float-to-float Cast and layout-only
 * Transposes make no copy: their output joins its input's alias group, whose root owns the
 * buffer and the gradient buffer.
 */
#ifndef SBP_TRAIN_INTERNAL_H
#define SBP_TRAIN_INTERNAL_H

#include "passes.h"
#include "train.h"

enum { TL_NAT = 0, TL_SWAP = 1 };

#define TN_MAX_AUX 16
#define TN_MAX_IN 16

typedef struct tv {
    int group;        /* value id of the alias group's root (itself when not a view) */
    int layout;       /* TL_NAT / TL_SWAP: how this value's data is stored */
    bool needs_grad;  /* depends on a trainable parameter */
    bool grad_live;   /* the loss depends on it through differentiable inputs */
    int buf;          /* root only: the buffer holding the group (-1: none yet) */
    int grad;         /* root only: its gradient buffer (-1: none) */
    int first_node;   /* root only: node index of the group's producer (-1: not produced) */
    int last_use;     /* root only: last node index reading any member */
    int region;       /* root only: TP_REGION_PERSIST or the segment of a segment-local group */
    int64_t chunk_rows; /* root only, stream: rows of the chunk-local buffer (0: every token's) */
    bool grad_in_place; /* root only, stream: the gradient overwrites the value (the logits of
                         * a fused head chunk): grad = buf */
} tv;

typedef struct tn {
    int seg;                      /* segment index */
    bool view;                    /* output 0 is a view of input 0 (no instructions) */
    int relayout[TN_MAX_IN];      /* layout input i is copied to before the node, -1: none */
    int relay_buf[TN_MAX_IN];     /* the relayout copy and its gradient (-1: none) */
    int relay_grad[TN_MAX_IN];
    int aux[TN_MAX_AUX];          /* node-owned buffers (saved statistics, scratch) */
    int out_layout;               /* layout of output 0 */
} tn;

/* A chunk body being lowered (stream.c): every TOKEN value's dims read as one chunk of n rows
 * ([1, n, ...] for [B, T, ...]), so the rules size their calls for the chunk; full-length
 * operands are then sliced at the chunk's rows (tp_inst.off). */
typedef struct tchunk {
    int64_t n;          /* rows of this body */
    bool fused_loss;    /* the head: the loss rule accumulates the loss sum and writes dlogits */
} tchunk;

/* What sp_localize changed in the graph, so that the build can put it back (seqpar.c). */
typedef struct sp_undo {
    int n;
    int *value;       /* [n] value ids */
    int *axis;        /* [n] */
    int64_t *dim;     /* [n] the axis's extent before */
} sp_undo;

typedef struct tctx {
    ir_graph *g;
    sbp_train_program *p;
    tv *v;                        /* [g->n_values] */
    tn *n;                        /* [g->n_nodes], by node index */
    int *node_index;              /* node id -> index in g->nodes */
    tp_block *cur;                /* instructions are appended here */
    const ir_node *cur_node;
    const char *cur_what;
    bool outs_unread;             /* while a node is recomputed only for its node-owned buffers
                                   * (nothing reads its outputs): its rule may skip them */
    int64_t B, T;
    int rope_pos_cache[8][3];     /* (rows, T) -> const buffer */
    int n_rope_pos;
    const tchunk *chunk;          /* non-NULL while a chunk body is lowered (stream) */
    int64_t *saved_dims;          /* [n_values * IR_MAX_RANK]: dims while a chunk body is lowered */
    int n_loop_groups;
    const char **names;           /* [names_cap] hash set of the buffers' names (tx_cname) */
    int names_cap, names_n;
    sp_undo *sp_undo;             /* where sp_localize records what it changes */
} tctx;

/* ---- sequence parallelism (seqpar.c) */

/* One rank's kv heads of Hq query and Hkv kv heads split N ways (runtime/sbprt.h: hkv_r); 0,
 * with *why, when they cannot be. */
int64_t sp_kv_heads(int64_t hq, int64_t hkv, int64_t n, const char **why);
/* After the sequence analysis: every TOKEN value's sequence axis from T to T/N (see seqpar.c). */
int sp_localize(tctx *t, ir_node **nodes, int nn);
/* Puts back the dims sp_localize changed (nothing when it changed none). */
void sp_restore(ir_graph *g, const sp_undo *u);

/* ---- the rule table (grad_rules.c) */

typedef struct grad_rule {
    ir_op op;
    unsigned diff;  /* bitmask of input slots a gradient flows to (0: none) */
    /* Layouts: sets t->n[i].view / relayout[] / out_layout; NULL: every float input natural,
     * outputs natural. Returns IR_ERR (diagnostic) for an unsupported form of the op. */
    int (*plan)(tctx *t, const ir_node *n);
    int (*fwd)(tctx *t, const ir_node *n);  /* emits the forward (NULL for views) */
    int (*bwd)(tctx *t, const ir_node *n);  /* emits the gradient; NULL: no rule */
} grad_rule;

/* Sequence parallelism, stream: an attention's K/V of the rank's heads over the whole sequence
 * before a chunk loop (sp_kv_gather), and their gradients returned to the ranks that own the
 * rows after it (sp_kv_scatter); store and checkpoint emit both around the call themselves. */
int sp_kv_gather(tctx *t, const ir_node *n);
int sp_kv_scatter(tctx *t, const ir_node *n);

/* The rule of op, or NULL when the op cannot be lowered at all. */
const grad_rule *train_rule(ir_op op);

/* Layout planners the rules use. Natural: every input natural (relayout copies where not),
 * outputs natural. View: output 0 joins input 0's alias group when that is stored naturally. */
int plan_natural(tctx *t, const ir_node *n);
int plan_view(tctx *t, const ir_node *n);
/* Row-wise: float inputs of the output's rank share input 0's layout; outputs get it too. */
int plan_rowwise(tctx *t, const ir_node *n);

/* ---- builder helpers (train_tx.c) */

int tx_index(const tctx *t, const ir_node *n);             /* n's index in g->nodes */
tn *tx_node(tctx *t, const ir_node *n);
tv *tx_root(tctx *t, const ir_value *v);                   /* the group root's record */
int tx_layout(tctx *t, const ir_node *n, int slot);        /* layout of input slot as read */
/* Operand buffers as the rule sees them: input slot (its relayout copy when there is one),
 * output slot, and their gradients (-1 when no gradient is wanted). */
int tx_in(tctx *t, const ir_node *n, int slot);
int tx_out(tctx *t, const ir_node *n, int slot);
int tx_gin(tctx *t, const ir_node *n, int slot);
int tx_gout(tctx *t, const ir_node *n, int slot);
/* A node-owned buffer (created once, reused when the node is recomputed). */
int tx_aux(tctx *t, const ir_node *n, int idx, size_t numel, bool is_int, bool is_grad,
           const char *what);
/* Position table r % T for r in [0, rows) (int32 constant, shared); a packed program's
 * positions are its doc_pos buffer (rows must be B*T). */
int tx_positions(tctx *t, int64_t rows, int64_t T);
/* The forward block's first calls, into t->cur: packed programs' document starts and positions
 * from the ids; a MoE program's load-balancing sums zeroed; nothing otherwise. */
void tx_emit_doc_setup(tctx *t);
/* A float constant of n ones (shared per n). */
int tx_ones(tctx *t, int64_t n);
/* A float constant holding one zero. */
int tx_zero(tctx *t);
/* Appends an instruction to the current block: kernel, then its buffers (-1 = NULL), then its
 * arguments built with the A_* helpers. */
tp_inst *tx_emit(tctx *t, tp_kernel k, const int *bufs, const tp_arg *args);
tp_arg A_I(int64_t i);
tp_arg A_F(double f);
tp_arg A_E(const char *expr);
tp_arg A_IS(tctx *t, const int64_t *v, int n);
/* Element count of v as size_t (shapes are known after bind-dims). */
size_t tx_numel(const ir_value *v);
/* A diagnostic naming the node. */
int tx_error(tctx *t, const ir_node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* t0 + i of the enclosing chunk loop (attention's q_start in a chunk body). */
tp_arg A_T0(int64_t i);

/* ---- what the lowering and stream.c use of the toolkit (train_tx.c) */

/* A C identifier from prefix + base, unique in the program. */
const char *tx_cname(tctx *t, const char *prefix, const char *base);
/* The readable stem of a value's buffer name (a semantic op's module path + op). */
const char *tx_value_stem(tctx *t, const ir_value *v);
/* The buffer of a value's alias group (a constant's is made on first use). */
int tx_group_buf(tctx *t, const ir_value *v);
/* A workspace buffer owned by node n, in n's region (chunk-local inside a chunk body). */
int tx_node_buf(tctx *t, const ir_node *n, size_t numel, bool is_int, bool is_grad,
                const char *what);
/* A span buffer: "every gradient buffer of the region" (for tx_zero_span). */
int tx_span_buf(tctx *t, int region);
/* MEMSET_ZERO of a span buffer (the planner turns it into per-buffer zeroing). */
void tx_zero_span(tctx *t, int span);

/* Grows an arena array of elem-sized items to hold `need`. */
int tx_grow(ir_arena *a, void **arr, int *cap, int need, size_t elem);
/* A new buffer (region: TP_REGION_PERSIST or a segment). */
int tx_new_buf(tctx *t, tp_buf_kind kind, const char *name, const ir_value *v, size_t numel,
               bool is_int, bool is_grad, int region, const char *what);
tp_block *tx_new_block(tctx *t, const char *name, const char *comment);
/* Appends src's instructions and loops to dst (loop indices shifted). */
int tx_append(tctx *t, tp_block *dst, const tp_block *src);
/* A node's forward (relayout copies, then its rule) into t->cur; what: "forward" | "recompute". */
int tx_lower_forward(tctx *t, const ir_node *n, const char *what);
/* A node's gradient rule (then the relayout gradients) into t->cur. */
int tx_lower_backward(tctx *t, const ir_node *n);
/* Whether n's gradient rule has work: an output's gradient is wanted and reaches a trained
 * input. */
bool tx_grad_live(tctx *t, const ir_node *n, const ir_value *loss);
/* The gradient rules of the nodes k in [first, end) with sel[k] (sel NULL: all), in reverse,
 * into t->cur; recompute: first the forward of the selected nodes whose non-persistent outputs
 * (or saved statistics) the rules read, transitively. */
int tx_emit_rules(tctx *t, ir_node **nodes, int nn, const bool *sel, int first, int end,
                  const ir_value *loss, bool recompute);
/* MEMSET_ZERO of a whole buffer. */
void tx_zero_buf(tctx *t, int buf);
/* "Every gradient buffer of the region is zero here": a MEMSET_ZERO of a span buffer, which the
 * memory planner turns into per-buffer zeroing before each one's first access. */
void tx_zero_region(tctx *t, int region);

/* ---- DPO and GRPO at the LM head (objective_pref.c) */

/* Whether the program's objective is DPO or GRPO (lowered here rather than as cross-entropy). */
bool pref_objective(const sbp_train_program *p);
/* requires: the inputs bound. Takes the objective's hyper-parameters from opt and checks what
 * it needs of the batch (DPO: an even B); no-op for SFT and the graph's own loss. */
int pref_setup(tctx *t, const sbp_train_options *opt);
/* The loss node's forward (store, checkpoint) and gradient (in a stream head chunk, fused: the
 * loss's forward too), for DPO / GRPO: the rules of grad_rules.c's loss for these objectives. */
int pref_loss_fwd(tctx *t, const ir_node *n);
int pref_loss_bwd(tctx *t, const ir_node *n);
/* Stream, DPO's first pass: each token's log-probability into tok_logp (in a head chunk). */
int pref_loss_logp(tctx *t, const ir_node *n);
/* Host steps: DPO's loss and coefficients after the first pass; GRPO's row weights before the
 * head's chunk loop. */
int pref_emit_coefficients(tctx *t);
int pref_emit_row_weights(tctx *t);

/* ---- the lowering (autodiff.c), run by the driver */

/* The autodiff stage: parameters, inputs (and the objective's setup, pref_setup), the layout
 * plan with needs_grad / grad_live (a node on the loss's path without a rule is an error), the
 * segments and regions. */
int lower_analyze(tctx *t, const ir_value *loss, const sbp_train_options *opt);
/* One buffer and gradient buffer per alias group (stream: after stream_plan sized them). */
int lower_group_buffers(tctx *t);
/* Store and checkpoint: block "forward", then each segment's backward block, last first. */
int lower_emit_blocks(tctx *t, ir_node **nodes, int nn, const ir_value *loss);

/* ---- the sequence analysis (sequence.c) */

/* Fills p->seq_values / seq_class / seq_why (requires the layout plan and the inputs bound). */
int seq_analyze(tctx *t, ir_node **nodes, int nn);
/* Whether v, stored in `layout`, is TOKEN with its token rows first: [1.., B, 1.., T, ...] or
 * [1.., B*T, ...], row b*T + t holding token (b, t). */
bool seq_token_major(const tctx *t, const ir_value *v, int layout);

/* ---- StreamBP (stream.c) */

/* requires: plan_segments and seq_analyze done. Picks the chunk sizes, classifies the segments
 * (whole / layer / head) and their nodes (pre-loop or chunk body), checks that every chunked
 * node is row-wise, causal or the loss and that its values are stored one row per token (an
 * error naming the node otherwise), and sizes the chunk-local groups (tv.chunk_rows). */
int stream_plan(tctx *t, ir_node **nodes, int nn, const ir_value *loss,
                const sbp_train_options *opt);
/* requires: stream_plan and the group buffers. Emits the blocks: "forward" (the prologue, each
 * layer's pre-loop nodes and forward chunk loop), "head" (the loss chunk loop, forward and
 * backward fused), then each layer's backward (K/V path recomputed once, the chunk loop, the
 * K/V path's gradients) and the prologue's. */
int stream_emit(tctx *t, ir_node **nodes, int nn, const ir_value *loss);

/* ---- precision (precision.c) */

/* bf16 program: marks the float workspace buffers stored as bf16 (before the memory plan);
 * IR_ERR with a diagnostic for a kernel without a bf16 form or an activation operand that
 * must stay fp32. */
int sbp_train_mark_bf16(sbp_train_program *p, ir_diag *d);
/* bf16 program, after the memory plan: the parameters' bf16 copy at the end of the workspace. */
void sbp_train_place_bf16_shadow(sbp_train_program *p);
/* base_bf16: marks the frozen parameters only GEMMs and embedding lookups' tables read as
 * stored_bf16 and lays the parameter block out again (fp32 ones first, then the bf16 ones);
 * sets shadow_elems. trained_too (--offload optimizer): the trained ones that qualify too. */
int sbp_train_place_base_bf16(sbp_train_program *p, bool trained_too, ir_diag *d);

#endif
