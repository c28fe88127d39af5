/* train_internal.h — what the training-program builder (train_program.c) and the gradient
 * rule table (autodiff.c) share; internal to passes/.
 *
 * Layouts. The runtime's attention reads q/k/v as [B,T,H,hd], while the exporters' graphs carry
 * them as [B,H,T,hd] made by a Transpose(perm 0,2,1,3) of the projection's [B,T,H,hd] view. A
 * value may therefore be stored "swapped" (TL_SWAP: rank 4, axes 1 and 2 exchanged in memory).
 * A Transpose(0,2,1,3) of a stored value is then only a change of layout (a view), row-wise ops
 * (norms, linears, activations, RoPE, same-shape elementwise) work in either layout, and an op
 * that needs the other layout gets a "relayout" copy of that input (a node-owned buffer, with
 * its gradient permuted back after the node's backward).
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

#define TN_MAX_AUX 8
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

typedef struct tctx {
    ir_graph *g;
    sbp_train_program *p;
    tv *v;                        /* [g->n_values] */
    tn *n;                        /* [g->n_nodes], by node index */
    int *node_index;              /* node id -> index in g->nodes */
    tp_block *cur;                /* instructions are appended here */
    const ir_node *cur_node;
    const char *cur_what;
    int64_t B, T;
    int rope_pos_cache[8][3];     /* (rows, T) -> const buffer */
    int n_rope_pos;
} tctx;

/* ---- the rule table (autodiff.c) */

typedef struct grad_rule {
    ir_op op;
    unsigned diff;  /* bitmask of input slots a gradient flows to (0: none) */
    /* Layouts: sets t->n[i].view / relayout[] / out_layout; NULL: every float input natural,
     * outputs natural. Returns IR_ERR (diagnostic) for an unsupported form of the op. */
    int (*plan)(tctx *t, const ir_node *n);
    int (*fwd)(tctx *t, const ir_node *n);  /* emits the forward (NULL for views) */
    int (*bwd)(tctx *t, const ir_node *n);  /* emits the gradient; NULL: no rule */
} grad_rule;

/* The rule of op, or NULL when the op cannot be lowered at all. */
const grad_rule *train_rule(ir_op op);

/* Layout planners the rules use. Natural: every input natural (relayout copies where not),
 * outputs natural. View: output 0 joins input 0's alias group when that is stored naturally. */
int plan_natural(tctx *t, const ir_node *n);
int plan_view(tctx *t, const ir_node *n);
/* Row-wise: float inputs of the output's rank share input 0's layout; outputs get it too. */
int plan_rowwise(tctx *t, const ir_node *n);

/* ---- builder helpers (train_program.c) */

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
/* Position table r % T for r in [0, rows) (int32 constant, shared). */
int tx_positions(tctx *t, int64_t rows, int64_t T);
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

#endif
