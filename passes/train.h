/* train.h — from a canonical graph to a training program (objective, autodiff, strategies).
 *
 * After canonicalisation (passes.h) the graph holds semantic ops. Three steps turn it into
 * something codegen can print:
 *
 *   objective    (passes/objective.c) makes the graph end in one scalar loss: a graph that
 *                outputs logits [B,T,V] gets the mean SFT cross-entropy appended (a new
 *                `labels` input, -100 = not scored); a graph that already ends in a loss
 *                (SoftmaxCrossEntropyLoss, canonicalised to CrossEntropy) keeps it.
 *   freeze       (passes/objective.c) marks parameters whose name matches a regex frozen.
 *   train build  (passes/autodiff.c + passes/train_program.c) lowers every node to runtime
 *                calls (forward), derives the backward by reverse mode with one gradient rule
 *                per op (a table in autodiff.c; gradients of a value with several uses are
 *                summed because the runtime's backward kernels accumulate), splits the graph
 *                into segments at the residual-stream values between layers, and lays every
 *                buffer out in one workspace.
 *
 * The training program is a linear schedule of blocks (one C function each) of instructions;
 * an instruction is one runtime call (train_kernels.def) on named buffers with scalar
 * arguments and the IR node it came from. Buffers are the parameter and gradient blocks of
 * codegen/sbp_step.h (element offsets), constants (emitted as static arrays), the step's
 * token-id and label arrays, and workspace buffers (byte offsets).
 *
 * Strategies:
 *   store        every activation is kept from the forward to the backward;
 *   checkpoint   only values that cross a segment boundary (each layer's input) are kept;
 *                the rest of a segment lives in an overlay region that every segment reuses,
 *                and the backward of a segment first recomputes its forward there.
 *
 * Memory layout (a bump layout, not yet liveness-planned): the workspace is
 *   [persistent activations | persistent gradients | overlay]
 * where the overlay holds, for the segment being run, [its activations | its gradients].
 * Gradient buffers are zeroed in bulk: the persistent ones when the backward starts, a
 * segment's own ones when its backward starts. Everything lives in the graph's arena.
 */
#ifndef SBP_TRAIN_H
#define SBP_TRAIN_H

#include "ir.h"

typedef enum {
    SBP_STRATEGY_STORE,
    SBP_STRATEGY_CHECKPOINT,
} sbp_strategy;

typedef enum {
    SBP_OBJECTIVE_SFT,        /* mean token cross-entropy over labels != -100 (appended) */
    SBP_OBJECTIVE_GRAPH_LOSS, /* the graph's own scalar loss */
} sbp_objective;

const char *sbp_strategy_name(sbp_strategy s);  /* "store" | "checkpoint" */
const char *sbp_objective_name(sbp_objective o); /* "sft" | "graph-loss" */

/* ---------------------------------------------------------------- objective.c */

/* requires: a canonical graph (sbp_canonicalize).
 * produces: exactly one graph output, a scalar float loss made by a CrossEntropy node; *chosen
 *           says whether it was appended (SFT) or already there (GRAPH_LOSS). Asking for
 *           GRAPH_LOSS on a graph without a loss is an error; asking for SFT on a graph that
 *           ends in a loss uses that loss. Other graph outputs are dropped (and dce'd). */
int sbp_pass_objective(ir_graph *g, sbp_objective requested, sbp_objective *chosen);

/* Marks every used parameter whose ONNX name matches `regex` (POSIX extended, unanchored, as
 * grep -E) frozen. A re-tied copy matching freezes its owner too (they are one tensor).
 * Returns IR_ERR with a diagnostic for a bad regex; *n_frozen (may be NULL) gets the count. */
int sbp_freeze_params(ir_graph *g, const char *regex, int *n_frozen);

/* ---------------------------------------------------------------- the training program */

typedef enum {
#define K(e, nbuf, narg, call) TP_K_##e,
#include "train_kernels.def"
#undef K
    TP_K_COUNT
} tp_kernel;

typedef struct tp_kernel_info {
    const char *name; /* "GEMM" */
    int n_buf, n_arg;
    const char *call; /* template: @i buffer operand i, #i scalar argument i */
} tp_kernel_info;
extern const tp_kernel_info tp_kernel_table[TP_K_COUNT];

typedef enum {
    TP_BUF_WS,     /* workspace: byte offset `offset` */
    TP_BUF_PARAM,  /* parameter block: element offset `offset` (read-only in the step) */
    TP_BUF_GRAD,   /* gradient block: element offset `offset` */
    TP_BUF_CONST,  /* a static const array in the emitted code (`data`) */
    TP_BUF_IDS,    /* the step's input_ids [B*T] */
    TP_BUF_LABELS, /* the step's labels [B*T] */
} tp_buf_kind;

/* Where a workspace buffer lives. */
#define TP_REGION_PERSIST (-1) /* else: the segment whose overlay holds it */

typedef struct tp_buf {
    int id;                  /* index in program->bufs */
    const char *name;        /* C identifier, unique in the program */
    tp_buf_kind kind;
    bool is_int;             /* int32 elements (ids, labels, positions), else float */
    bool is_grad;            /* holds a gradient */
    int rank;                /* of the shape comment */
    int64_t dims[IR_MAX_RANK];
    bool swapped;            /* stored with axes 1 and 2 swapped ([B,T,H,hd] for [B,H,T,hd]) */
    size_t numel;
    int region;              /* TP_BUF_WS only: TP_REGION_PERSIST or a segment index */
    size_t offset;           /* WS: bytes from the workspace base; PARAM/GRAD: elements */
    const ir_value *value;   /* the value it holds (or whose gradient), NULL for scratch */
    const void *data;        /* CONST: numel float or int32 elements */
    const char *what;        /* one-line description for the emitted comment */
    bool span;               /* WS: covers every gradient buffer of `region` (for zeroing);
                              * overlaps them, owns nothing */
} tp_buf;

typedef enum {
    TP_ARG_INT,    /* i */
    TP_ARG_FLOAT,  /* f (printed as a float literal) */
    TP_ARG_INTS,   /* ints[0..n): an `(const int[]){...}` compound literal */
    TP_ARG_EXPR,   /* expr: a C expression valid in every block (`scale`, SBPRT_BIN_ADD) */
} tp_arg_kind;

typedef struct tp_arg {
    tp_arg_kind kind;
    int64_t i;
    double f;
    const int64_t *ints; /* [n] */
    int n;
    const char *expr;
} tp_arg;

#define TP_MAX_BUFS 9
#define TP_MAX_ARGS 10

typedef struct tp_inst {
    tp_kernel k;
    int buf[TP_MAX_BUFS];    /* buffer ids; -1 prints NULL */
    tp_arg arg[TP_MAX_ARGS];
    const ir_node *node;     /* the IR node it implements (origin for comments), or NULL */
    const char *what;        /* "forward", "gradient", "recompute", "zero gradients", ... */
} tp_inst;

typedef struct tp_block {
    const char *name;        /* C function name, unique: "forward", "backward_layer_1" */
    const char *comment;     /* one paragraph for the function's header comment */
    tp_inst *insts;          /* [n_insts] */
    int n_insts, cap_insts;
} tp_block;

typedef struct tp_param {
    const ir_value *value;   /* the PARAM (name, shape, data) */
    size_t offset, numel;    /* in the parameter/gradient blocks; a tied parameter has no
                              * storage: offset is its owner's, numel its own count */
    bool trainable;          /* false: frozen or no gradient reaches it */
    int tied_to;             /* -1, or the index of the parameter this one transposes */
    int buf, grad;           /* program buffers (-1 when none) */
} tp_param;

typedef struct tp_segment {
    const char *name;        /* "prologue", "layer_0", ..., "head" */
    int first_node, end_node;/* [first, end) in the graph's node order */
    size_t act_bytes, grad_bytes; /* its overlay use (checkpoint) */
} tp_segment;

typedef struct sbp_train_program {
    ir_graph *g;
    sbp_strategy strategy;
    sbp_objective objective;
    int64_t batch, seq_len, vocab;
    bool loss_is_mean;       /* the loss is loss_sum / denominator (else loss_sum) */

    tp_buf **bufs;           /* [n_bufs] */
    int n_bufs, cap_bufs;
    tp_block **blocks;       /* [n_blocks], in execution order */
    int n_blocks, cap_blocks;
    tp_param *params;        /* [n_params], in initializer order */
    int n_params;
    size_t param_elems;
    tp_segment *segments;    /* [n_segments] */
    int n_segments;

    int loss_buf;            /* float [1]: Σ of token losses of the forward */
    int ids_buf, labels_buf; /* TP_BUF_IDS / TP_BUF_LABELS, -1 when the graph has none */

    /* the workspace plan, bytes */
    size_t persist_act_bytes, persist_grad_bytes, overlay_bytes, workspace_bytes;
    size_t grad_zero_begin, grad_zero_end; /* persistent gradients: zeroed at backward start */
} sbp_train_program;

typedef struct sbp_train_options {
    sbp_strategy strategy;
} sbp_train_options;

/* requires: sbp_pass_objective done (one scalar loss output); dims bound.
 * produces: the program, allocated in g's arena; NULL with diagnostics when an op has no
 * forward lowering or no gradient rule ("no gradient rule for op X (node N)"), or a shape is
 * unsupported. */
sbp_train_program *sbp_train_build(ir_graph *g, sbp_objective objective,
                                   const sbp_train_options *opt);

/* Human-readable listing of the program (buffers with offsets, blocks, instructions). */
void sbp_train_print(const sbp_train_program *p, FILE *f);

#endif
